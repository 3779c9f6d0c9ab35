// The records of result.hpp as the shardscope/1 JSON document (docs/json.md): every
// field under its name, nulls where the record holds none. nlohmann's objects keep
// their keys sorted, so a record's file is the same whatever order this writes in.
#pragma once

#include <nlohmann/json.hpp>

#include "harness/records/result.hpp"

namespace shardscope {

nlohmann::json to_json(const ResultDocument& doc);
nlohmann::json to_json(const PlanDocument& plan);
nlohmann::json to_json(const RunRecord& run);
nlohmann::json to_json(const RankRecord& rank);
nlohmann::json to_json(const StageRecord& stage);
nlohmann::json to_json(const StagePredicted& predicted);
nlohmann::json to_json(const RankPredicted& predicted);
nlohmann::json to_json(const TimelineRecord& timeline);
nlohmann::json to_json(const CategoryFigures& figures);
nlohmann::json to_json(const ModelRecord& model);
nlohmann::json to_json(const Provenance& provenance);

}  // namespace shardscope
