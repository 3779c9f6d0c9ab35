// `shardscope compare BASE.json NEW.json`: two result documents (shardscope/1) side by
// side, run by run and rank by rank: the same configuration on two backends (cpu and
// cuda), two machines or two commits. Bytes must agree to the byte where the code and
// the model agree; what differs is listed per category, and step times are set as
// ratios.
#pragma once

#include <string>
#include <vector>

#include "harness/records/result.hpp"
#include "harness/report/comparison.hpp"

namespace shardscope {

// The comparison (harness/report/comparison.hpp). Runs are matched by kind, strategy or
// schedule, world, units, prefetch, DDP bucket, micro-batches, chunks and model; ranks
// (stages) by number. Backend, communicator and emulation are what a comparison is for,
// so they are not part of the match. Runs left unmatched are then paired across
// settings, by kind and model at the same world, then by kind and model in order; such a
// run is marked across_settings with both labels, its label is "ddp W=2 vs zero3 W=2
// units=1", and a rank the other run's world cannot hold is listed on its side alone
// ("rank only in base"). A label that runs of different models share gets the model
// ("zero2 W=2 units=all, model 8x256 b32"). The documents are records read from the
// files (read_result, which checked every field once).
Comparison compare_documents(const ResultDocument& base, const std::string& base_path, const ResultDocument& fresh,
                             const std::string& new_path);

// Whether a comparison found any byte figure that differs between its paired runs, or a
// configuration in one file only: what `compare --fail-on-diff` exits 1 on.
bool comparison_differs(const Comparison& comparison);

// A result file (a run's --json or a sweep's DIR/shardscope.json) read and checked once into
// the records. UsageError, beginning with `which` (the argument or flag that named it), when
// it cannot be read, is not a shardscope/1 result, or read_result refuses a field (naming
// the run and the field).
ResultDocument read_result_file(const std::string& path, const char* which);

// `shardscope compare ...`: prints the comparison; returns the exit code (0; 1 under
// --fail-on-diff when comparison_differs; 2 when a file is missing, unreadable, not a
// shardscope/1 document or refused by read_result, or an argument is an unknown
// flag).
int compare_main(const std::vector<std::string>& args);

}  // namespace shardscope
