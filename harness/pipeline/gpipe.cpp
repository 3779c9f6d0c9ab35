// GPipe (fill-drain): every forward, then every backward.
//
// Both in micro-batch order 0..M-1, as torch.distributed.pipelining's ScheduleGPipe
// runs them. (torchgpipe ran backward in reverse; with uniform action times the
// makespan, the bubble (S-1)/(M+S-1) and the peak of M live micro-batches are the
// same either way, and forward order keeps every p2p channel in micro-batch order.)
#include "harness/pipeline/generators.hpp"

namespace shardscope::schedules {

StageActions gpipe(int stages, int microbatches, int /*chunks == 1*/) {
  StageActions out(stages);
  for (auto& list : out) {
    for (int m = 0; m < microbatches; ++m) list.push_back({ActionKind::F, m, 0});
    for (int m = 0; m < microbatches; ++m) list.push_back({ActionKind::B, m, 0});
  }
  return out;
}

}  // namespace shardscope::schedules
