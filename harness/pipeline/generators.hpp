// Schedule generators, one file each; registry.cpp lists them. Each returns, for every
// stage, its ordered actions. Arguments are already checked by make_schedule.
#pragma once

#include <vector>

#include "shardscope/schedule.hpp"

namespace shardscope::schedules {

using StageActions = std::vector<std::vector<Action>>;

StageActions gpipe(int stages, int microbatches, int chunks);
StageActions one_f_one_b(int stages, int microbatches, int chunks);
StageActions interleaved_1f1b(int stages, int microbatches, int chunks);
StageActions zb_h1(int stages, int microbatches, int chunks);
StageActions zbv(int stages, int microbatches, int chunks);

}  // namespace shardscope::schedules
