// `shardscope sweep` (DESIGN §6): launches one `shardscope run` job per configuration
// (under mpirun, or as emulated single-rank processes), records the configurations that
// cannot run as skipped, stops on a failed run, merges the results into one
// shardscope/1 document at DIR/shardscope.json and prints the tables.
#pragma once

#include <string>
#include <vector>

#include "harness/cli/sweep_plan.hpp"

namespace shardscope {

// `args`: everything after `sweep`. `self_exe`: the program each job runs as
// `self_exe run ...` (the shardscope binary; tests pass a stand-in script).
// Returns 0 (done, skipped configurations included) or 3 (a run failed; what completed
// is written). Throws UsageError for bad sweep flags, before anything runs.
int sweep_main(const std::vector<std::string>& args, const std::string& self_exe);

}  // namespace shardscope
