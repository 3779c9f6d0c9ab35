// What `shardscope compare` found (compare_documents, harness/cli/compare.cpp), as
// print_comparison (table_compare.cpp) prints it: two result files' runs paired
// configuration by configuration, their ranks (stages) by number.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace shardscope {

// One file: its path and where its results came from (null when the file says none;
// emulated null when its runs are "mixed").
struct ComparedFile {
  std::string path;
  std::optional<std::string> backend, comm;
  std::optional<bool> emulated;
  std::optional<std::string> git, host;
};

// A rank's figures on one side: all null where that side has no such rank.
struct ComparedSide {
  std::optional<std::int64_t> resting;  // resting.total
  std::optional<std::int64_t> peak;     // peak.total
  std::optional<double> step_ms;        // step_ms.median: null when no step was timed
};

// A byte figure (or, with `count`, the saved-tensor count) that differs: "peak temp",
// base and new.
struct FigureDifference {
  std::string what;
  std::int64_t base = 0;
  std::int64_t fresh = 0;
  bool count = false;
};

struct ComparedRank {
  int rank = 0;  // the stage's number in a pipeline run
  ComparedSide base, fresh;
  // What differs in words ("peak temp +32,768 B"; "rank only in base" for a rank the
  // other run's world cannot hold), and the same figures as numbers for printers that
  // write bytes their own way (none for a one-sided rank).
  std::vector<std::string> differs;
  std::vector<FigureDifference> differences;
};

struct ComparedRun {
  std::string label;  // "zero3 W=2 units=1"; across settings "ddp W=4 vs zero3 W=2 units=1"
  bool pipeline = false;
  std::vector<ComparedRank> ranks;
  bool across_settings = false;  // paired by model and kind, not the same configuration
  std::string base_label, new_label;
};

struct Comparison {
  ComparedFile base, fresh;
  std::vector<ComparedRun> runs;
  std::vector<std::string> only_in_base, only_in_new;  // labels of configurations one file holds
};

}  // namespace shardscope
