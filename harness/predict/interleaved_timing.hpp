// Interleaved 1F1B's lists and their unit-time rounds, as closed forms (docs/formulas.md,
// "interleaved-1f1b's peak"): where a stage's j-th forward and i-th backward stand in its
// list, which action a list position holds, the round the lowering runs it in, and the
// program step whose group carries a send. The pipeline forms read these instead of the
// lists or the lowered program; the tests hold them equal to the lowering.
#pragma once

#include <cstdint>

namespace shardscope {

class InterleavedTiming {
 public:
  using i64 = std::int64_t;

  // S stages, M micro-batches (a multiple of S), v chunks per stage.
  InterleavedTiming(i64 stages, i64 microbatches, i64 chunks);

  i64 steps() const { return 2 * v_ * M_; }  // actions per stage: v·M forwards, v·M backwards
  // W_s = min(2(S-s-1) + (v-1)·S, v·M): forwards before the stage's first backward.
  i64 warmup(i64 s) const;

  // The j-th forward (i-th backward) a stage runs: micro-batch ⌊j/(S·v)⌋·S + j mod S,
  // chunk ⌊(j mod S·v)/S⌋ (reversed, v-1-..., for a backward).
  i64 microbatch(i64 j) const { return (j / (S_ * v_)) * S_ + j % S_; }
  i64 forward_chunk(i64 j) const { return (j % (S_ * v_)) / S_; }
  i64 backward_chunk(i64 i) const { return v_ - 1 - forward_chunk(i); }
  // The inverse: the index of (micro-batch m, chunk c) among the stage's forwards
  // (backwards).
  i64 forward_index(i64 m, i64 c) const { return (m / S_) * S_ * v_ + c * S_ + m % S_; }
  i64 backward_index(i64 m, i64 c) const { return forward_index(m, v_ - 1 - c); }

  // List positions: W_s forwards, then F, B alternating, then the remaining backwards.
  i64 forward_position(i64 s, i64 j) const;
  i64 backward_position(i64 s, i64 i) const;
  // Position p holds a forward (true) or a backward, and which one (its index).
  bool is_forward(i64 s, i64 p) const;
  i64 index_at(i64 s, i64 p) const;
  // Forwards (backwards) before position p, 0 <= p <= steps().
  i64 forwards_before(i64 s, i64 p) const;
  i64 backwards_before(i64 s, i64 p) const;

  // The round in which the lowering (harness/pipeline/lower.cpp) runs position p of
  // stage s: s + p + Δ_s(p), Δ_s(p) = max(stall, rise):
  //   stall = max(0, S-2-2s) from the stage's forward j* = v·S + S on (when M >= 2S):
  //     stage 0's first forward that waits for stage S-1 in the steady state;
  //   rise = 2(S-1-s) - max(0, E - p) over the cool-down (p >= 2vM - W_s), E = 2vM -
  //     (v-1)·S - 1: one round per backward of the last group's chunk v-1.
  i64 delay(i64 s, i64 p) const;
  i64 round(i64 s, i64 p) const { return s + p + delay(s, p); }
  // The first position q of stage s whose round is >= r (steps() when none: the final
  // step, which holds the sends left after the last action).
  i64 first_step_reaching(i64 s, i64 r) const;
  // The step of stage s whose group carries the send of the action at position p (to
  // the consumer running at round `consumer_round`): the first later step whose round
  // reaches the consumer's, as the lowering pairs every send with its receive.
  i64 send_step(i64 s, i64 p, i64 consumer_round) const;

  // The consumer of position p's output on another stage: stage, and its position there.
  // A forward of chunk c feeds the next virtual stage (stage s+1, or stage 0's chunk
  // c+1 from the last stage); a backward of chunk c feeds the previous one.
  struct Consumer {
    i64 stage = 0, position = 0;
  };
  Consumer consumer(i64 s, i64 p) const;

 private:
  i64 S_, M_, v_;
};

}  // namespace shardscope
