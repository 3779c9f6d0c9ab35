// Measurement records rendered as the JSON of DESIGN §7.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardscope/backend.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

nlohmann::json category_json(const CategoryBytes& b);       // {"total", "param", ...}
nlohmann::json comm_json(const CommLedger& ledger, int world, bool emulated);  // per kind {calls, bytes, ms, busbw_gbps}
nlohmann::json model_json(const ModelConfig& m);
// A data-parallel rank's "predicted": {"resting_total", "resting" (per category),
// "peak_total", "peak_by_category", "peak_phase", "peak_where", "comm_bytes"}.
nlohmann::json prediction_json(const Prediction& p);
// {"median", "min", "max"} of the timed steps (all but the first), null when none were timed.
nlohmann::json step_ms_json(const std::vector<double>& step_ms);
// Adds "rounded" (the tracker's allocator-granular figures), "pool" (the CUDA pool's
// counters, null on cpu) and "outside_pool_bytes" (null when unknown) to a rank record.
void add_allocator_figures(Backend& backend, nlohmann::json& record);

// A rank record's "timeline" (times in ms since the run started):
//   {"unit": "ms since the run started", "coalesced", "merged_events", "events",
//    "sample_limit", "categories": [the 8 names],
//    "memory": [[t_ms, bytes per category in that order], ...]  (first row: the state
//              when recording started, at 0; then one row after each kept event),
//    "marks": [[t_ms, phase, place], ...]  (where the marked phase/place changes),
//    "spans": [{"name", "start_ms", "end_ms", "depth", "bytes" (collectives and p2p
//              only)}, ...]  (by start; a parent before its children), "dropped_spans"}
nlohmann::json timeline_json(const Timeline& timeline);

}  // namespace shardscope
