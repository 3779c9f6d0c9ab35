// ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §3.1; the same order as
// torch.distributed.pipelining's zero-bubble 1F1B lists with one chunk).
//
// Backward is split: B computes the input gradient (what stage s-1 waits for), W the
// weight gradient (which nobody waits for). Stage s keeps 1F1B's warm-up of
// min(S-s-1, M) forwards and 1F1B's positions of F and B; only its W's move: W(j) runs
// right after B(j+s), and the last s W's run at the end. While the last gradients
// travel back up, stage s then has s W's to run instead of idling: with F = B = W the
// bubble is (S-1)/(3M+S-1) of the step for M >= S (replay gives it exactly), a third of
// 1F1B's in time; for M < S the pipeline never fills and it is (2S-1-M)/(2M+2S-1).
//
// Memory. Counted from F to B (what B frees), every stage holds 1F1B's min(S-s, M).
// Counted from F to W (W still needs the layer's saved input), stage s holds
// min(S-s, M) + s, so min(S, M) on every stage: never more than 1F1B's worst stage
// (stage 0), which is the paper's "peak memory not above 1F1B's". Keeping F-to-W at
// min(S-s, M) on each stage cannot give this bubble: the last stage would have to run
// F B W F B W ..., its last B would end at 3M+S-2 at best, and stage 0's last W at
// 3M+2S-2, a bubble of (2S-2)/(3M+2S-2) instead.
#include <algorithm>

#include "harness/pipeline/generators.hpp"

namespace shardscope::schedules {

StageActions zb_h1(int stages, int microbatches, int /*chunks == 1*/) {
  StageActions out(stages);
  for (int s = 0; s < stages; ++s) {
    const int warmup = std::min(stages - s - 1, microbatches);
    const int delay = s;  // W(j) follows B(j + delay)
    auto& list = out[s];
    int next_f = 0;
    int next_w = 0;
    for (; next_f < warmup; ++next_f) list.push_back({ActionKind::F, next_f, 0});
    for (int b = 0; b < microbatches; ++b) {
      if (next_f < microbatches) list.push_back({ActionKind::F, next_f++, 0});  // steady state
      list.push_back({ActionKind::B, b, 0});
      if (b >= delay) list.push_back({ActionKind::W, next_w++, 0});
    }
    for (; next_w < microbatches; ++next_w) list.push_back({ActionKind::W, next_w, 0});
  }
  return out;
}

}  // namespace shardscope::schedules
