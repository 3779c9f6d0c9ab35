// `shardscope sweep` (docs/design.md §6): launches one `shardscope run` job per configuration
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
// Returns 0 (done, skipped configurations included) or 3 (a run failed, or a signal
// stopped the sweep; what completed is written). The jobs' stdout and stderr are never
// shown: a failed job's stderr is kept in DIR/failed-job.log, which the sweep's one
// "shardscope: error:" line names. Throws UsageError, before anything runs
// or is created, for bad sweep flags, for a job's `run` flags that `run` would refuse,
// for an output path that cannot be written, and when another sweep holds --out DIR.
// SIGINT, SIGTERM, SIGHUP and SIGQUIT are caught for the sweep's whole life.
int sweep_main(const std::vector<std::string>& args, const std::string& self_exe);

}  // namespace shardscope
