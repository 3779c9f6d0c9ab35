// zbv's lists and their unit-time rounds, as closed forms (docs/formulas.md, "zbv's
// peak"): which action a list position holds, where each (kind, chunk, micro-batch)
// stands, the round the lowering runs it in and the program step whose group carries a
// send. The pipeline forms read these instead of the lists or the lowered program; the
// tests hold them equal to the generator (harness/pipeline/zbv.cpp) and the lowering.
//
// Stage s's list, 6M positions in phases (torch's ScheduleZBVZeroBubble; X0 chunk 0,
// X1 chunk 1, B the input-gradient half):
//   A  [0, 2(S-s)-1)          F0(p)
//   B  [2(S-s)-1, 2S-1)       F1(j), F0(2(S-s)-1+j)               j < s
//   C  [2S-1, 5S-3s-1)        F1(s+j), B1(j), W1(j)               j < S-s
//   D  [5S-3s-1, E)           iteration t < M-S: F0(2S-s-1+t) while t < T6 = M-2S+s+1,
//                             B0(t), W0(t), F1(S+t), B1(S-s+t), W1(S-s+t)
//   E  [E, E+2s)              B0(M-S+j), B1(M-s+j)                j < s
//   F  [E+2s, E+2S)           B0(M-S+s+j), W0(M-S+j)              j < S-s
//   G  [E+2S, E+2S+s)         W1(M-s+j)
//   H  [E+2S+s, 6M)           W0(M-s+j)
// with M >= 2S-1. The lowering runs position p of stage s in round s + p: no stage ever
// waits once it has started.
#pragma once

#include <algorithm>
#include <cstdint>

namespace shardscope {

class ZbvTiming {
 public:
  using i64 = std::int64_t;
  enum Kind { F = 0, B = 1, W = 2 };
  struct Op {
    Kind kind;
    int chunk;
    i64 microbatch;
  };

  ZbvTiming(i64 stages, i64 microbatches) : S_(stages), M_(microbatches) {}

  i64 steps() const { return 6 * M_; }  // actions per stage
  Op at(i64 s, i64 p) const;                         // the action at position p
  i64 position(i64 s, Kind kind, int chunk, i64 m) const;  // the inverse
  // Actions of (kind, chunk) before position p, 0 <= p <= steps().
  i64 count_before(i64 s, Kind kind, int chunk, i64 p) const;
  i64 round(i64 s, i64 p) const { return s + p; }
  // The step of stage s whose group carries a send its consumer receives in round
  // `consumer_round`: the stage's action in that round, or the final step (steps()).
  i64 send_step(i64 s, i64 consumer_round) const;
  // The stage and position of the action that consumes (kind, chunk, m)'s output when it
  // goes to another stage (F0 down to s+1, F1 up to s-1, B1 down to s+1, B0 up to s-1);
  // stage -1 when it stays here or has no consumer.
  struct Consumer {
    i64 stage = -1, position = 0;
  };
  Consumer consumer(i64 s, Kind kind, int chunk, i64 m) const;

 private:
  struct Phases {
    i64 b, c, d, t6, e, f, g, h;  // phase starts, and T6
  };
  Phases phases(i64 s) const;
  i64 iteration_start(const Phases& ph, i64 t) const { return ph.d + 6 * std::min(t, ph.t6) + 5 * std::max<i64>(0, t - ph.t6); }

  i64 S_, M_;
};

}  // namespace shardscope
