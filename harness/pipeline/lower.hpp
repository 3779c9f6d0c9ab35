// Internal to harness/pipeline: the lowering with its failure explained instead of
// thrown, so that validate() can report a schedule that cannot run as a message.
#pragma once

#include <string>
#include <vector>

#include "shardscope/schedule.hpp"

namespace shardscope::schedules {

// Fills `programs` and returns "" when every action can run; otherwise returns what
// each stage waits for when nothing can progress (a deadlock inherent to the lists).
std::string lower_or_explain(const Schedule& schedule, std::vector<StageProgram>& programs);

}  // namespace shardscope::schedules
