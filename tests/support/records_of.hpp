// Hand-made shardscope/1 documents (report_doc.hpp) as records: each run, rank, stage and
// timeline laid over a complete one of its kind (every field the writer writes, zero or
// null), then read as a result file is (harness/records/json_read.hpp). A printer that
// takes records gets the hand-made figures, and the reader's checks still apply to them.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "harness/records/json_read.hpp"
#include "harness/records/json_write.hpp"

namespace shardscope::testing {

// `patch` laid over `base`: objects key by key, anything else replaced.
inline void overlay(nlohmann::json& base, const nlohmann::json& patch) {
  if (!base.is_object() || !patch.is_object()) {
    base = patch;
    return;
  }
  for (const auto& [key, value] : patch.items()) {
    if (base.contains(key))
      overlay(base[key], value);
    else
      base[key] = value;
  }
}

// A member (rank or stage) over a complete one, its timeline over a complete timeline.
inline nlohmann::json complete_member(nlohmann::json full, const nlohmann::json& member) {
  nlohmann::json rest = member;
  rest.erase("timeline");
  overlay(full, rest);
  if (member.contains("timeline")) {
    full["timeline"] = to_json(TimelineRecord{});
    overlay(full["timeline"], member["timeline"]);
  }
  return full;
}

inline nlohmann::json complete_document(const nlohmann::json& doc) {
  nlohmann::json full = to_json(ResultDocument{});
  nlohmann::json rest = doc;
  rest.erase("runs");
  overlay(full, rest);
  for (const nlohmann::json& run : doc.value("runs", nlohmann::json::array())) {
    if (run.value("skipped", false) || !run.is_object()) {
      full["runs"].push_back(run);
      continue;
    }
    const bool pipeline = run.value("kind", "") == "pipeline";
    const char* list = pipeline ? "stages" : "ranks";
    nlohmann::json r = pipeline ? to_json(RunRecord(PipelineRun{})) : to_json(RunRecord(DataParallelRun{}));
    nlohmann::json head = run;
    head.erase(list);
    // Where a hand-made run leaves out where it ran, the document's word holds for it.
    for (const char* key : {"backend", "comm", "emulated"})
      if (!head.contains(key) && doc.contains(key) && !doc[key].is_null() && doc[key] != "mixed") r[key] = doc[key];
    overlay(r, head);
    for (const nlohmann::json& member : run.value(list, nlohmann::json::array()))
      r[list].push_back(complete_member(pipeline ? to_json(StageRecord{}) : to_json(RankRecord{}), member));
    full["runs"].push_back(std::move(r));
  }
  return full;
}

inline ResultDocument records_of(const nlohmann::json& doc) {
  return read_result(complete_document(doc), "a hand-made document");
}

}  // namespace shardscope::testing
