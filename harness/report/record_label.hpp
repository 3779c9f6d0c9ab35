// A run's short name from its record: "zero3 W=4 units=1", "1f1b S=2 M=8 chunks=1" (a
// skipped one's from its configuration), as run_label (table.hpp) names it from JSON.
#pragma once

#include <string>

#include "harness/records/result.hpp"

namespace shardscope {

std::string run_label(const RunRecord& run);
std::string run_label(const DataParallelRun& run);
std::string run_label(const PipelineRun& run);

}  // namespace shardscope
