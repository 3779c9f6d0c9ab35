// Interleaved 1F1B's list positions and unit-time rounds as closed forms. How the
// rounds come about (docs/formulas.md writes it out): the lowering runs every stage's
// next action as soon as its inputs are a round old, so a stage's position p runs at
// round s + p unless it waits. Two waits exist:
//   - the steady-state ring: stage 0's forward of micro-batch m, chunk c >= 1 needs
//     stage S-1's forward of m, chunk c-1, one group of S forwards earlier in stage 0's
//     list but 3 rounds a hop away (warm-ups differ by 2 per stage, and F, B alternate),
//     so from j* = v·S + S on (the first such forward of the steady state) stage 0 runs
//     S-2 rounds late, stage 1 S-4, ..., stage s max(0, S-2-2s); every other dependency
//     of the steady state then holds with room (backward hops are exactly one round);
//   - the cool-down: a stage runs one backward per round while its producer, the next
//     stage, is itself 2 rounds later per hop, so each backward of the last group's chunk
//     v-1 waits one round more, up to 2(S-1-s) at position E = 2vM - (v-1)·S - 1.
// Checked against the lowering's rounds on every action of S = 1..12, v = 2..6, M = S..7S,
// and in the tests (tests/predict/test_interleaved_timing.cpp) send by send.
#include "harness/predict/interleaved_timing.hpp"

#include <algorithm>

namespace shardscope {

using i64 = InterleavedTiming::i64;

InterleavedTiming::InterleavedTiming(i64 stages, i64 microbatches, i64 chunks)
    : S_(stages), M_(microbatches), v_(chunks) {}

i64 InterleavedTiming::warmup(i64 s) const { return std::min(2 * (S_ - s - 1) + (v_ - 1) * S_, v_ * M_); }

i64 InterleavedTiming::forward_position(i64 s, i64 j) const {
  const i64 w = warmup(s);
  return j < w ? j : 2 * j - w;
}

i64 InterleavedTiming::backward_position(i64 s, i64 i) const {
  const i64 w = warmup(s);
  return i < v_ * M_ - w ? w + 2 * i + 1 : v_ * M_ + i;
}

bool InterleavedTiming::is_forward(i64 s, i64 p) const {
  const i64 w = warmup(s);
  if (p < w) return true;
  if (p < steps() - w) return (p - w) % 2 == 0;
  return false;
}

i64 InterleavedTiming::index_at(i64 s, i64 p) const {
  const i64 w = warmup(s);
  if (p < w) return p;
  if (p < steps() - w) return (p - w) % 2 == 0 ? w + (p - w) / 2 : (p - w) / 2;
  return p - v_ * M_;
}

i64 InterleavedTiming::forwards_before(i64 s, i64 p) const {
  const i64 w = warmup(s);
  if (p <= w) return p;
  if (p <= steps() - w) return w + (p - w + 1) / 2;
  return v_ * M_;
}

i64 InterleavedTiming::backwards_before(i64 s, i64 p) const {
  const i64 w = warmup(s);
  if (p <= w) return 0;
  if (p <= steps() - w) return (p - w) / 2;
  return p - v_ * M_;
}

i64 InterleavedTiming::delay(i64 s, i64 p) const {
  const i64 n = steps(), w = warmup(s);
  i64 d = 0;
  const i64 j_star = v_ * S_ + S_;
  if (j_star < v_ * M_ && p >= forward_position(s, j_star)) d = std::max<i64>(0, S_ - 2 - 2 * s);
  if (p >= n - w) {
    const i64 e = n - (v_ - 1) * S_ - 1;
    d = std::max(d, 2 * (S_ - 1 - s) - std::max<i64>(0, e - p));
  }
  return d;
}

// round(s, q) - s = q + max(stall(q), rise(q)) is increasing in q, and so is each piece:
// the first q reaching r is the smaller of the first q each piece takes there.
i64 InterleavedTiming::first_step_reaching(i64 s, i64 r) const {
  const i64 n = steps(), w = warmup(s), target = r - s;
  // q + stall(q): q before the stall's position, q + D from it on.
  i64 by_stall = std::max<i64>(0, target);
  const i64 j_star = v_ * S_ + S_, stall = std::max<i64>(0, S_ - 2 - 2 * s);
  if (j_star < v_ * M_ && stall > 0) {
    const i64 from = forward_position(s, j_star);
    if (target >= from) by_stall = std::max(from, target - stall);
  }
  // q + rise(q) over the cool-down q >= n - w: 2q - e + K up to e, q + K past it.
  const i64 cool = n - w, e = n - (v_ - 1) * S_ - 1, k = 2 * (S_ - 1 - s);
  i64 by_rise;
  if (cool >= e || target > e + k)
    by_rise = std::max(cool, target - k);
  else
    by_rise = std::max(cool, (target + e - k + 1) / 2);  // target + e - k >= 0 here
  return std::min({by_stall, by_rise, n});
}

i64 InterleavedTiming::send_step(i64 s, i64 p, i64 consumer_round) const {
  return std::min(steps(), std::max(p + 1, first_step_reaching(s, consumer_round)));
}

InterleavedTiming::Consumer InterleavedTiming::consumer(i64 s, i64 p) const {
  const i64 k = index_at(s, p), m = microbatch(k);
  if (is_forward(s, p)) {
    const i64 c = forward_chunk(k) + (s == S_ - 1 ? 1 : 0), to = (s + 1) % S_;
    return {to, forward_position(to, forward_index(m, c))};
  }
  const i64 c = backward_chunk(k) - (s == 0 ? 1 : 0), to = (s + S_ - 1) % S_;
  return {to, backward_position(to, backward_index(m, c))};
}

}  // namespace shardscope
