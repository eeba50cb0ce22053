// Greedy decoding after the step (ops::greedy_next): both kernels at Kimi-Linear's vocabulary. The
// logits are read once from L2-hot memory in the real step (lm_head just wrote them); here they stay
// resident too, so the time is the op's two dependent launches and its reduction.
#include <vector>

#include <benchmark/benchmark.h>

#include <encore/ops/sample.h>

#include "bench_util.h"

namespace encore::bench {
namespace {

void BM_GreedyNext(benchmark::State& state) {
  const int batch = int(state.range(0)), vocab = 163840, pages_per_seq = 1024, capacity = pages_per_seq * 64;
  DeviceMemory logits(std::size_t(batch) * vocab * 4), rows(std::size_t(batch) * 4 * 5), table(std::size_t(batch) * pages_per_seq * 4);
  DeviceMemory tokens(std::size_t(batch) * capacity * 4), workspace(ops::greedy_workspace_bytes(batch, vocab)), flags(4);
  fill_random_floats(logits.as<float>(), std::size_t(batch) * vocab, 11);
  // Rows at position 0 of slot b; every block-table entry page 0 (valid), prompts of one token.
  std::vector<std::int32_t> host(std::size_t(batch) * 5, 0);
  for (int b = 0; b < batch; ++b) host[std::size_t(3) * batch + b] = b, host[std::size_t(2) * batch + b] = 1, host[std::size_t(4) * batch + b] = 1;
  BENCH_CUDA(cudaMemcpy(rows.as(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemset(table.as(), 0, std::size_t(batch) * pages_per_seq * 4));
  BENCH_CUDA(cudaMemset(flags.as(), 0, 4));
  std::int32_t* r = rows.as<std::int32_t>();
  ops::GreedyParams p;
  p.logits = logits.as<float>(), p.logits_stride = vocab, p.vocab = vocab, p.batch = batch;
  p.token_ids = r, p.positions = r + batch, p.seq_lens = r + 2 * batch, p.slot_ids = r + 3 * batch, p.prompt_lens = r + 4 * batch;
  p.block_table = table.as<std::int32_t>(), p.max_pages_per_seq = pages_per_seq, p.max_pages = 1;
  p.tokens = tokens.as<std::int32_t>(), p.capacity = capacity, p.workspace = workspace.as(), p.flags = flags.as<std::int32_t>();
  throw_if_error(ops::validate(p));
  time_graph(state, [&](int, cudaStream_t stream) { throw_if_error(ops::greedy_next(p, stream)); }, 24,
             double(batch) * vocab * 4);
}

BENCHMARK(BM_GreedyNext)->Name("sample/greedy_next")->Arg(1)->Arg(16)->Arg(64)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace encore::bench
