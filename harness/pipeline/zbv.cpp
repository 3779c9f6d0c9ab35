// ZBV, the zero-bubble V (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §6; the
// order of torch.distributed.pipelining's ScheduleZBVZeroBubble, op for op).
//
// Two chunks per stage in a V: stage s holds virtual stage s (chunk 0) and 2S-1-s
// (chunk 1), so a micro-batch runs down chunk 0 from stage 0 to S-1, turns on stage S-1
// without a message and climbs chunk 1 back to stage 0, which computes the loss; its
// gradient runs the V backwards. The backward is split as in zb-h1: B the input
// gradient, W the weight gradient. Stage s runs, with F, B, W of chunk c written F0 ...:
//   warm-up  2(S-s)-1 × F0; s × (F1, F0); S-s × (F1, B1, W1)
//   steady   while chunk 1 trails chunk 0 or forwards are left: [F0 while any is left],
//            B0, W0, F1, B1, W1
//   cool-down s × (B0, B1); S-s × (B0, W0 of the oldest micro-batch not yet W'd); the
//            W1's left; the W0's left.
// torch pads the lists of a pipeline with fewer than 2S-1 micro-batches with idle slots
// (its n_micro = max(2S-1, M)); here M >= 2S-1 is required (make_schedule), the V filled.
//
// With F = B = W = 1 and messages free, stage s's action i runs at time s + i (no idle
// slot between its first and last action: the lowering's unit-time rounds are exactly
// these, tests/pipeline/test_schedules), so the step takes 6M + S - 1 units and every
// stage idles S - 1 of them: a bubble of (S-1)/(6M+S-1). Memory: the first B on every
// stage follows 2S forwards (2S-s-1 of chunk 0, s+1 of chunk 1), and from then on each F
// is matched by a B and a W, so every stage holds 2S (micro-batch, chunk) pairs at its
// peak, both from F to B and from F to W: each a chunk of half a stage's layers, as much
// as 1F1B's first stage holds, on every stage.
#include <algorithm>

#include "harness/pipeline/generators.hpp"

namespace shardscope::schedules {

StageActions zbv(int stages, int microbatches, int /*chunks == 2*/) {
  const int S = stages, M = microbatches;
  StageActions out(S);
  for (int s = 0; s < S; ++s) {
    auto& list = out[s];
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto push = [&](ActionKind kind, int& count, int chunk) { list.push_back({kind, count++, chunk}); };
    for (int i = 0; i < 2 * (S - s) - 1; ++i) push(ActionKind::F, f0, 0);
    for (int i = 0; i < s; ++i) push(ActionKind::F, f1, 1), push(ActionKind::F, f0, 0);
    for (int i = 0; i < S - s; ++i) {
      push(ActionKind::F, f1, 1);
      list.push_back({ActionKind::B, b1, 1});
      push(ActionKind::W, b1, 1);
    }
    while (f1 < f0 || f0 < M) {
      if (f0 < M) push(ActionKind::F, f0, 0);
      list.push_back({ActionKind::B, b0, 0});
      push(ActionKind::W, b0, 0);
      push(ActionKind::F, f1, 1);
      list.push_back({ActionKind::B, b1, 1});
      push(ActionKind::W, b1, 1);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < s; ++i) push(ActionKind::B, b0, 0), push(ActionKind::B, b1, 1);
    for (int i = 0; i < S - s; ++i) push(ActionKind::B, b0, 0), push(ActionKind::W, w0, 0);
    while (w1 < b1) push(ActionKind::W, w1, 1);
    while (w0 < b0) push(ActionKind::W, w0, 0);
  }
  return out;
}

}  // namespace shardscope::schedules
