// `shardscope plan`: the closed forms of every rank of every configuration a sweep with
// the same flags would run, without running, allocating or launching anything. For
// models and worlds no machine at hand can hold: what each strategy and schedule would
// hold per rank at rest and at its peak, and whether that fits a given memory.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/cli/plan_fit.hpp"
#include "harness/records/result.hpp"

namespace shardscope {

// "80GiB", "141GB", "512MiB", "1073741824" (bytes; B, KiB..TiB binary, KB..TB decimal,
// case-insensitive, an optional space before the unit, a decimal fraction allowed with
// a unit). Throws UsageError naming --memory: "80G" is ambiguous, and is refused.
std::int64_t parse_memory_size(const std::string& text);

// Everything after `plan`: its own flags, and the sweep's and run's it passes on.
struct PlanRequest {
  std::string json_path;                // --json FILE
  std::optional<std::int64_t> memory;   // --memory SIZE
  std::optional<FitDimension> fit;      // --fit batch|seq (needs --memory)
  std::string overhead_path;            // --overhead RESULT.json (needs --memory)
  std::vector<std::string> sweep_args;  // every other flag
  std::string command;                  // "shardscope plan ..."
};

// Throws UsageError naming the flag: plan's own flags given twice or without a value,
// --fit or --overhead without --memory, and the sweep's flags that need running (--out, --trace, ...).
PlanRequest parse_plan_args(const std::vector<std::string>& args);

// The plan document (schema "shardscope-plan/1"); throws UsageError naming the flag when
// the sweep's or a run's flags are wrong, or --overhead's file cannot give its figure
// (plan_overhead.hpp) or that figure alone fills --memory.
PlanDocument make_plan(const PlanRequest& request);

// `shardscope plan ...`: prints the tables, writes --json FILE; returns the exit code
// (0, or 2 for bad usage).
int plan_main(const std::vector<std::string>& args);

std::string plan_usage();

}  // namespace shardscope
