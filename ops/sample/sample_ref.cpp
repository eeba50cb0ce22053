// CPU reference of greedy decoding (include/encore/ref/sample.h).
#include <cmath>
#include <cstdint>

#include <encore/ref/sample.h>

namespace encore::ref {

std::int32_t greedy_argmax(const float* logits, int n) {
  const auto value = [&](int i) { return std::isnan(logits[i]) ? -INFINITY : logits[i]; };
  std::int32_t best = 0;
  for (int i = 1; i < n; ++i)
    if (value(i) > value(best)) best = i;
  return best;
}

int greedy_next(const ops::GreedyParams& p) {
  int set = 0;
  for (int b = 0; b < p.batch; ++b) {
    if (p.slot_ids[b] < 0 || p.seq_lens[b] <= 0) continue;
    const int next_pos = p.positions[b] + 1;
    bool room = next_pos < p.capacity;
    if (room) {
      const int page = p.block_table[std::int64_t(b) * p.max_pages_per_seq + next_pos / p.page_size];
      room = page >= 0 && page < p.max_pages;
    }
    if (!room) {
      p.slot_ids[b] = -1, p.seq_lens[b] = 0;
      set |= ops::kSampleRowOutOfRoom;
      continue;
    }
    std::int32_t* history = p.tokens + std::int64_t(b) * p.capacity;
    const std::int32_t next =
        next_pos < p.prompt_lens[b] ? history[next_pos] : greedy_argmax(p.logits + std::int64_t(b) * p.logits_stride, p.vocab);
    history[next_pos] = next;
    p.token_ids[b] = next, p.positions[b] = next_pos, p.seq_lens[b] = next_pos + 1;
  }
  if (p.flags) *p.flags |= set;
  return set;
}

}  // namespace encore::ref
