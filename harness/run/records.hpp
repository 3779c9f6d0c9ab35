// Measurement records rendered as the JSON of DESIGN §7.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "shardscope/backend.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

nlohmann::json category_json(const CategoryBytes& b);       // {"total", "param", ...}
nlohmann::json comm_json(const CommLedger& ledger, int world);  // per kind {calls, bytes, ms, busbw_gbps}
nlohmann::json model_json(const ModelConfig& m);
// {"median", "min"} of the timed steps (all but the first), null when none were timed.
nlohmann::json step_ms_json(const std::vector<double>& step_ms);
int timed_steps(const std::vector<double>& step_ms);
// Adds "rounded" (the tracker's allocator-granular figures), "pool" (the CUDA pool's
// counters, null on cpu) and "outside_pool_bytes" (null when unknown) to a rank record.
void add_allocator_figures(Backend& backend, nlohmann::json& record);

}  // namespace shardscope
