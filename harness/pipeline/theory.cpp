// Closed forms of docs/design.md §4, and the measured live count they are checked against.
#include <algorithm>
#include <string>

#include "shardscope/check.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {

double bubble_theory(const Schedule& s) {
  const double S = s.stages, M = s.microbatches, v = s.chunks;
  switch (s.kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: return (S - 1) / (M + S - 1);
    // Each chunk action is 1/v of the stage's work: the fill and drain shrink v-fold.
    case ScheduleKind::interleaved_1f1b: return (S - 1) / (v * M + S - 1);
    // F = B = W: a step is 3M units of work plus S-1 units of fill.
    case ScheduleKind::zb_h1: return (S - 1) / (3 * M + S - 1);
    // Stage s's action i runs at s + i: 6M units of work, S-1 idle (zbv.cpp).
    case ScheduleKind::zbv: return (S - 1) / (6 * M + S - 1);
  }
  throw RunError("bubble_theory: no formula for schedule kind " + std::to_string(static_cast<int>(s.kind)));
}

int peak_live_microbatches_theory(const Schedule& s, int stage) {
  const int S = s.stages, M = s.microbatches, v = s.chunks;
  switch (s.kind) {
    case ScheduleKind::gpipe: return M;
    case ScheduleKind::one_f_one_b: return std::min(S - stage, M);
    case ScheduleKind::interleaved_1f1b: return std::min(2 * (S - stage - 1) + (v - 1) * S + 1, v * M);
    case ScheduleKind::zb_h1: return std::min(S - stage, M);
    // 2S forwards before the first B on every stage, then one F per B (zbv.cpp).
    case ScheduleKind::zbv: return 2 * S;
  }
  throw RunError("peak_live_microbatches_theory: no formula for schedule kind " +
                 std::to_string(static_cast<int>(s.kind)));
}

int peak_held_microbatches_theory(const Schedule& s, int stage) {
  // Until W: 1F1B's min(S-s, M) plus the s W's delayed on stage s (zb_h1.cpp).
  if (s.kind == ScheduleKind::zb_h1) return std::min(s.stages, s.microbatches);
  // zbv: each F is matched by a B and a W from the first B on (zbv.cpp).
  return peak_live_microbatches_theory(s, stage);
}

namespace {

// Peak count of (micro-batch, chunk) pairs between their F and their action `until`.
int peak_between_f_and(const Schedule& s, int stage, ActionKind until) {
  int live = 0, peak = 0;
  for (const Action& a : s.actions.at(stage)) {
    if (a.kind == ActionKind::F) peak = std::max(peak, ++live);
    if (a.kind == until) --live;
  }
  return peak;
}

}  // namespace

int peak_live_microbatches(const Schedule& s, int stage) {
  return peak_between_f_and(s, stage, ActionKind::B);
}

int peak_held_microbatches(const Schedule& s, int stage) {
  // Saved tensors stay until the last backward action: B, or W when the backward is
  // split (W still needs the layer inputs).
  return peak_between_f_and(s, stage, s.split_backward ? ActionKind::W : ActionKind::B);
}

}  // namespace shardscope
