// What `shardscope compare` reads of a shardscope/1 document, checked before anything is
// compared. Unchecked, a field of the wrong type was read as 0 or as absent: a byte count
// "x" showed a difference of minus the other side's bytes, 2^70 (a double to nlohmann)
// printed "--9,223,...", and a run without a kind was listed as only in one file.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace shardscope {

// Throws UsageError naming the file, the run (index and label) and the field's path:
//   'a.json': runs[0] (ddp W=2): ranks[1].peak.total is "x", not a byte count
// Every run that is not skipped must be an object with
//   required: "kind" ("data_parallel" | "pipeline"); "strategy" (data parallel) or
//             "schedule" (pipeline), a string; "world", a positive integer; "model", an
//             object whose "layers", "width" and "batch" are positive integers; "ranks"
//             (data parallel) or "stages" (pipeline), an array of objects, each with its
//             "rank" ("stage") number, a whole number >= 0, no two alike;
//   optional (absent or null: shown as "-", or matched as absent): "layers_per_unit"
//             (a positive integer or "all"), "prefetch" (>= 0), "ddp_bucket" (a string),
//             "bucket_mb" (a number >= 0), "microbatches", "chunks" (positive integers),
//             "split" (whole numbers >= 0); "model.activation" and "model.loss" (strings).
// In a rank or stage every byte figure compare reads, when present: resting.<category>
// and .total, peak.total, peak.by_category.<category> and .total, comm_bytes,
// saved.peak_live_bytes (and the count saved.peak_live_tensors) is a whole number from
// 0 to 2^63 - 1 (an integer in the file: 1.5 and 2^70, doubles to nlohmann, are
// refused); resting, peak, peak.by_category and saved are objects; step_ms is null or
// an object whose median is null or a finite number >= 0. A skipped record (a sweep's
// "skipped": true, which holds a configuration and a reason, no ranks) is passed over;
// "skipped" itself must be true or false.
void check_compare_input(const nlohmann::json& doc, const std::string& path);

}  // namespace shardscope
