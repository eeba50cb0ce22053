// A greedy_next problem on the host: logits with planted ties and NaNs, and rows in every state
// the op distinguishes (prompt, generating, pad, at the end of room).
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <encore/ops/sample.h>

namespace encore::test {

struct GreedyProblem {
  int batch = 0, vocab = 0, capacity = 0, max_pages_per_seq = 0, max_pages = 0;
  std::int64_t stride = 0;
  std::vector<float> logits;
  std::vector<std::int32_t> token_ids, positions, seq_lens, slot_ids, block_table, tokens, prompt_lens;

  // Params over host arrays (the reference's view); the device test swaps in device pointers.
  ops::GreedyParams host_params(std::int32_t* flags) {
    ops::GreedyParams p;
    p.logits = logits.data(), p.logits_stride = stride, p.vocab = vocab, p.batch = batch;
    p.token_ids = token_ids.data(), p.positions = positions.data(), p.seq_lens = seq_lens.data(), p.slot_ids = slot_ids.data();
    p.block_table = block_table.data(), p.max_pages_per_seq = max_pages_per_seq, p.max_pages = max_pages;
    p.tokens = tokens.data(), p.prompt_lens = prompt_lens.data(), p.capacity = capacity, p.flags = flags;
    return p;
  }
};

// Row kinds cycle through: generating, inside its prompt, pad, at capacity, before a missing page.
inline GreedyProblem make_greedy_problem(int batch, int vocab, std::mt19937_64& rng) {
  GreedyProblem g;
  g.batch = batch, g.vocab = vocab, g.stride = (vocab + 7) / 4 * 4;
  g.max_pages_per_seq = 4, g.max_pages = 4 * batch, g.capacity = 4 * 64 - 7;
  std::normal_distribution<float> normal(0.f, 3.f);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  g.logits.assign(std::size_t(batch) * g.stride, 1e30f);  // the stride's tail must never be read
  for (int b = 0; b < batch; ++b) {
    float* row = g.logits.data() + std::int64_t(b) * g.stride;
    for (int i = 0; i < vocab; ++i) row[i] = normal(rng);
    for (int k = 0; k < 3; ++k) row[id(rng)] = NAN;
    const float top = 40.f + float(b % 3);  // planted maximum at two ids (often in different chunks)
    const int a = id(rng), c = id(rng);
    row[a] = top, row[c] = top;
    if (b % 11 == 5) for (int i = 0; i < vocab; ++i) row[i] = (i % 2) ? NAN : -INFINITY;  // no number wins
  }
  g.token_ids.resize(batch), g.positions.resize(batch), g.seq_lens.resize(batch), g.slot_ids.resize(batch);
  g.prompt_lens.resize(batch);
  g.block_table.resize(std::size_t(batch) * g.max_pages_per_seq);
  g.tokens.resize(std::size_t(batch) * g.capacity);
  std::uniform_int_distribution<int> pos(0, g.capacity - 2);
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < g.max_pages_per_seq; ++i) g.block_table[b * g.max_pages_per_seq + i] = b * g.max_pages_per_seq + i;
    for (int t = 0; t < g.capacity; ++t) g.tokens[std::size_t(b) * g.capacity + t] = id(rng);
    int p = pos(rng);
    g.slot_ids[b] = b, g.prompt_lens[b] = 1;
    switch (b % 5) {
      case 1: g.prompt_lens[b] = p + 2 + int(rng() % 3); break;  // the next token comes from the prompt
      case 2: g.slot_ids[b] = -1; break;                         // pad row
      case 3: p = g.capacity - 1; break;                         // no position left
      case 4: p = 63 + 64 * int(rng() % 3);                      // the next position opens a page...
        g.block_table[b * g.max_pages_per_seq + (p + 1) / 64] = (rng() % 2) ? -1 : g.max_pages;  // ...that is not there
        break;
      default: break;
    }
    g.positions[b] = p, g.seq_lens[b] = g.slot_ids[b] < 0 ? 0 : p + 1, g.token_ids[b] = id(rng);
  }
  return g;
}

}  // namespace encore::test
