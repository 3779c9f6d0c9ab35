// 1F1B, non-interleaved (PipeDream-flush; Megatron's
// forward_backward_pipelining_without_interleaving).
//
// Stage s first runs min(S-s-1, M) warm-up forwards: just enough that, from then on,
// the gradient of its oldest micro-batch arrives right when it has finished one more
// forward. Then it alternates F(next), B(oldest) and drains the remaining B's. At most
// min(S-s, M) micro-batches are live on stage s, whatever M is: that is the memory
// advantage over GPipe, at the same bubble (S-1)/(M+S-1).
#include <algorithm>

#include "harness/pipeline/generators.hpp"

namespace shardscope::schedules {

StageActions one_f_one_b(int stages, int microbatches, int /*chunks == 1*/) {
  StageActions out(stages);
  for (int s = 0; s < stages; ++s) {
    const int warmup = std::min(stages - s - 1, microbatches);
    auto& list = out[s];
    int next_f = 0;
    int next_b = 0;
    for (; next_f < warmup; ++next_f) list.push_back({ActionKind::F, next_f, 0});
    for (; next_f < microbatches; ++next_f) {  // steady state
      list.push_back({ActionKind::F, next_f, 0});
      list.push_back({ActionKind::B, next_b++, 0});
    }
    for (; next_b < microbatches; ++next_b) list.push_back({ActionKind::B, next_b, 0});  // cool-down
  }
  return out;
}

}  // namespace shardscope::schedules
