// Closed forms of DESIGN §4, and the measured live count they are checked against.
#include <algorithm>

#include "shardscope/check.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {

double bubble_theory(const Schedule& s) {
  const double S = s.stages, M = s.microbatches, v = s.chunks;
  if (s.name == "gpipe" || s.name == "1f1b") return (S - 1) / (M + S - 1);
  // Each chunk action is 1/v of the stage's work: the fill and drain shrink v-fold.
  if (s.name == "interleaved-1f1b") return (S - 1) / (v * M + S - 1);
  // F = B = W: a step is 3M units of work plus S-1 units of fill.
  if (s.name == "zb-h1") return (S - 1) / (3 * M + S - 1);
  throw UsageError("--schedule: no bubble formula for '" + s.name + "'");
}

int peak_live_microbatches_theory(const Schedule& s, int stage) {
  const int S = s.stages, M = s.microbatches, v = s.chunks;
  if (s.name == "gpipe") return M;
  if (s.name == "1f1b") return std::min(S - stage, M);
  if (s.name == "interleaved-1f1b") return std::min(2 * (S - stage - 1) + (v - 1) * S + 1, v * M);
  // Counted until W: 1F1B's min(S-s, M) plus the s W's delayed on stage s (zb_h1.cpp).
  if (s.name == "zb-h1") return std::min(S, M);
  throw UsageError("--schedule: no memory formula for '" + s.name + "'");
}

int peak_live_microbatches(const Schedule& s, int stage) {
  // A (micro-batch, chunk) holds its saved tensors from F until its last backward
  // action: B, or W when the backward is split (W still needs the layer inputs).
  const ActionKind last = s.split_backward ? ActionKind::W : ActionKind::B;
  int live = 0, peak = 0;
  for (const Action& a : s.actions.at(stage)) {
    if (a.kind == ActionKind::F) peak = std::max(peak, ++live);
    if (a.kind == last) --live;
  }
  return peak;
}

}  // namespace shardscope
