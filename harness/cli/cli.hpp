#pragma once

#include <string>
#include <vector>

#include "shardscope/config.hpp"

namespace shardscope {
// The largest --batch a run accepts (rows or sequences per rank, or per pipeline).
inline constexpr int kMostBatch = 10'000'000;

// Runs `shardscope run|sweep ...`; returns the process exit code (0, 2 or 3).
int cli_main(int argc, char** argv);

// Checks the flags of one `shardscope run` (without the word "run") as `run` itself
// would parse them, values and combinations alike, without running anything; throws
// UsageError naming the flag. A sweep calls it for every job before launching any, so
// that a bad flag is exit 2, not a job "skipped". What only the run can tell (a split
// that does not fit the world, M above the batch) is left to the run.
// `also_known`: the flags of the command that passes these on (a sweep's, a plan's), so
// that an unknown flag is told the closest of either.
void check_run_args(const std::vector<std::string>& args, const std::vector<std::string>& also_known = {},
                    const std::string& command = "run");

// The same, returning the configuration those flags give.
RunConfig parse_run_args(const std::vector<std::string>& args, const std::vector<std::string>& also_known = {},
                         const std::string& command = "run");

// "; did you mean --worlds?" naming the flag of `known` closest to `given` (a third of
// its letters or fewer changed, or the one flag it begins), or "" when none is close.
std::string did_you_mean(const std::string& given, const std::vector<std::string>& known);

// `--bytes binary|exact` of run, sweep, plan and compare: true for exact; throws
// UsageError naming the flag otherwise.
bool exact_bytes_value(const std::string& v);

// The help texts of the table flags every printing command shares.
inline constexpr const char* kBytesHelp =
    "binary | exact: bytes in tables as 2.01 MiB (three figures) or 2,105,344 (default binary)";
inline constexpr const char* kWideHelp = "tables with every column, each prediction in full (wider than 120)";

// A count flag's value: digits only (no sign, no spaces), 1 to `most`; throws
// UsageError naming the flag, and for a value above `most` the cap and, when given, why
// there is one (`why` follows the cap: " ranks", " (byte counts must fit in 64 bits)").
int parse_positive(const std::string& flag, const std::string& v, int most = 1'000'000'000,
                   const std::string& why = "");
}  // namespace shardscope
