#pragma once

#include <string>
#include <vector>

#include "shardscope/config.hpp"

namespace shardscope {
// Runs `shardscope run|sweep ...`; returns the process exit code (0, 2 or 3).
int cli_main(int argc, char** argv);

// Checks the flags of one `shardscope run` (without the word "run") as `run` itself
// would parse them, values and combinations alike, without running anything; throws
// UsageError naming the flag. A sweep calls it for every job before launching any, so
// that a bad flag is exit 2, not a job "skipped". What only the run can tell (a split
// that does not fit the world, M above the batch) is left to the run.
void check_run_args(const std::vector<std::string>& args);

// The same, returning the configuration those flags give.
RunConfig parse_run_args(const std::vector<std::string>& args);

// A count flag's value: digits only (no sign, no spaces), 1 to `most`; throws
// UsageError naming the flag, and for a value above `most` the cap and, when given, why
// there is one (`why` follows the cap: " ranks", " (byte counts must fit in 64 bits)").
int parse_positive(const std::string& flag, const std::string& v, int most = 1'000'000'000,
                   const std::string& why = "");
}  // namespace shardscope
