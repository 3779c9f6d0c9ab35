#include "harness/cli/sweep_results.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string_view>

#include "harness/pipeline/run_pipeline.hpp"
#include "harness/records/json_read.hpp"
#include "harness/records/json_write.hpp"
#include "harness/report/cells.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/table.hpp"
#include "harness/run/provenance.hpp"
#include "shardscope/check.hpp"
#include "shardscope/schedule_kind.hpp"

#ifndef SHARDSCOPE_VERSION
#define SHARDSCOPE_VERSION "unknown"
#endif

namespace shardscope {
namespace {

using nlohmann::json;

// The runs' common value of `key`, "mixed" when they differ, `none` when no run has it.
json common_value(const std::vector<json>& runs, const char* key, const json& none) {
  json value;
  bool seen = false;
  for (const json& run : runs) {
    if (is_skipped(run) || !run.contains(key)) continue;
    if (!seen) {
      value = run[key];
      seen = true;
    } else if (run[key] != value) {
      return "mixed";
    }
  }
  return seen ? value : none;
}

// An emulated pipeline's stages, merged: the replayed bubble from every stage's measured
// action times, as a run of all stages in one job computes it (fill_replayed_bubbles).
// Each stage's wall-clock bubble is null: it ran alone, its waits for its neighbours were
// not waits. Without a whole set of action times the replayed figures stay null.
// The stages as records (read_stage_record, the reader every result goes through), the
// replay, and its figures written back into the stages. The merged run is still JSON
// here: the sweep reads its jobs' files as JSON and merges them before anything else
// reads them.
json replay_stages(const RunConfig& cfg, json& stages) {
  std::vector<StageRecord> records;
  for (const json& st : stages) records.push_back(read_stage_record(st, "the emulated stages"));
  const std::optional<double> makespan = fill_replayed_bubbles(cfg, records);
  if (!makespan) return nullptr;
  for (std::size_t i = 0; i < records.size(); ++i) {
    stages[i]["bubble_fraction_replayed"] = *records[i].bubble_fraction_replayed;
    stages[i]["replayed_makespan_ms"] = *makespan;
  }
  return *makespan;
}

void replay_emulated_pipeline(json& run) {
  RunConfig cfg;
  const std::string schedule = run.value("schedule", std::string());
  const json* m = run.contains("microbatches") ? &run["microbatches"] : nullptr;
  const json* v = run.contains("chunks") ? &run["chunks"] : nullptr;
  cfg.microbatches = m && m->is_number_integer() ? m->get<int>() : 0;
  cfg.chunks = v && v->is_number_integer() ? v->get<int>() : 1;
  for (json& stage : run["stages"])
    if (stage.is_object()) stage["bubble_fraction"] = nullptr;
  run["replayed_makespan_ms"] = nullptr;
  if (schedule.empty()) return;
  try {
    cfg.schedule = parse_schedule(schedule);
    run["replayed_makespan_ms"] = replay_stages(cfg, run["stages"]);
  } catch (const std::exception& e) {  // a schedule or stage list the replay refuses
    throw RunError("emulated stages cannot be replayed: " + std::string(e.what()));
  }
}

}  // namespace

std::vector<json> runs_of_document(const json& doc, const std::string& source) {
  if (!doc.is_object() || doc.value("schema", json()) != "shardscope/1")
    throw RunError("'" + source + "' is not a shardscope/1 document");
  const auto it = doc.find("runs");
  if (it == doc.end() || !it->is_array()) throw RunError("'" + source + "' has no \"runs\" list");
  std::vector<json> runs;
  for (const json& run : *it) {
    if (!run.is_object()) throw RunError("'" + source + "' has a run that is not an object");
    json stamped = run;
    for (const char* key : {"backend", "comm", "emulated"})
      if (!stamped.contains(key) && doc.contains(key)) stamped[key] = doc[key];
    runs.push_back(std::move(stamped));
  }
  return runs;
}

std::vector<json> merge_emulated_ranks(const std::vector<json>& docs) {
  if (docs.empty()) return {};
  std::vector<std::vector<json>> per_rank;
  for (std::size_t r = 0; r < docs.size(); ++r)
    per_rank.push_back(runs_of_document(docs[r], "rank " + std::to_string(r) + "'s result"));
  std::vector<json> merged = per_rank[0];
  for (std::size_t i = 0; i < merged.size(); ++i) {
    json& run = merged[i];
    const char* list = run.contains("stages") ? "stages" : "ranks";
    const char* key = run.contains("stages") ? "stage" : "rank";
    json all = json::array();
    for (std::size_t r = 0; r < per_rank.size(); ++r) {
      if (per_rank[r].size() != merged.size())
        throw RunError("emulated ranks disagree: rank 0 wrote " + std::to_string(merged.size()) +
                       " runs, rank " + std::to_string(r) + " wrote " + std::to_string(per_rank[r].size()));
      const json& part = per_rank[r][i];
      if (!part.contains(list) || !part[list].is_array())
        throw RunError("emulated rank " + std::to_string(r) + "'s run " + std::to_string(i) + " has no \"" +
                       list + "\" list");
      for (const json& entry : part[list]) all.push_back(entry);
    }
    std::stable_sort(all.begin(), all.end(), [key](const json& a, const json& b) {
      return a.value(key, json()) < b.value(key, json());
    });
    run[list] = std::move(all);
    run["emulated"] = true;
    run.erase("rank");  // "the one rank played" (run --emulate W:r): the merged run holds them all
    if (run.contains("stages")) replay_emulated_pipeline(run);
  }
  return merged;
}

namespace {

// Reads a result file without keeping it (a sweep's results can be hundreds of MB, a
// parsed copy many times that): whether the root is an object, its "schema" and its
// "sweep"."complete", each when it is a string or a boolean.
class CompletenessProbe {
 public:
  bool null() { return scalar(json()); }
  bool boolean(bool v) { return scalar(v); }
  bool number_integer(json::number_integer_t) { return scalar(json()); }
  bool number_unsigned(json::number_unsigned_t) { return scalar(json()); }
  bool number_float(json::number_float_t, const json::string_t&) { return scalar(json()); }
  bool string(json::string_t& v) { return scalar(v); }
  bool binary(json::binary_t&) { return scalar(json()); }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    keys_.back() = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }

  bool root_object = false;
  json schema, complete;

 private:
  bool scalar(const json& v) {
    if (keys_.size() == 1 && keys_[0] == "schema") schema = v;
    if (keys_.size() == 2 && keys_[0] == "sweep" && keys_[1] == "complete" && in_object_.back()) complete = v;
    return true;
  }
  bool open(bool object) {
    if (keys_.empty()) root_object = object;
    keys_.emplace_back();
    in_object_.push_back(object);
    return true;
  }
  bool close() {
    keys_.pop_back();
    in_object_.pop_back();
    return true;
  }
  std::vector<std::string> keys_;  // per open level: its last key (empty in an array)
  std::vector<bool> in_object_;
};

}  // namespace

bool holds_complete_results(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  CompletenessProbe probe;
  if (!in || !json::sax_parse(in, &probe)) return false;
  return probe.root_object && probe.schema == "shardscope/1" && probe.complete != false;
}

json skipped_record(const SweepJob& job, const std::string& reason) {
  json record = job.config;
  record["skipped"] = true;
  record["reason"] = reason;
  return record;
}

json sweep_document(const std::vector<json>& runs, const json& first_provenance, const std::string& command,
                    bool emulate, std::size_t jobs, const std::string& error) {
  json prov = first_provenance.is_object() ? first_provenance : to_json(provenance(command, "", "", ""));
  prov["command"] = command;
  const auto skipped = static_cast<std::size_t>(std::count_if(runs.begin(), runs.end(), is_skipped));
  json sweep = {{"jobs", jobs}, {"skipped", skipped}, {"complete", error.empty()}};
  if (!error.empty()) sweep["error"] = error;
  return {{"schema", "shardscope/1"},
          {"version", SHARDSCOPE_VERSION},
          {"backend", common_value(runs, "backend", nullptr)},
          {"comm", common_value(runs, "comm", nullptr)},
          {"emulated", common_value(runs, "emulated", emulate)},
          {"provenance", prov},
          {"runs", runs},
          {"sweep", sweep}};
}

namespace {

// `text` with `shift` more spaces after every newline: readable_json's indentation only
// adds, so a value written alone and shifted is the value written in place.
void emit_shifted(std::string_view text, int shift, const TextSink& sink) {
  const std::string pad(static_cast<std::size_t>(shift), ' ');
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (const char c : text) {
    out += c;
    if (c == '\n') out += pad;
  }
  sink(out);
}

// readable_json(obj), shifted, with obj[key] (an array of `count` objects) written item by
// item: emit_item(j, shift) writes item j at the shift it is given.
void emit_with_array(const json& obj, const std::string& key, int shift, std::size_t count,
                     const std::function<void(std::size_t, int)>& emit_item, const TextSink& sink) {
  if (count == 0) {
    emit_shifted(readable_json(obj), shift, sink);
    return;
  }
  json rest = obj;
  rest[key] = json::array();
  const std::string text = readable_json(rest);
  const std::string slot = "\n  \"" + key + "\": []";  // a key of obj's own, indented 2
  const std::size_t at = text.find(slot);
  if (at == std::string::npos) throw RunError("the results have no \"" + key + "\" list to write");
  emit_shifted(std::string_view(text).substr(0, at + slot.size() - 1), shift, sink);  // up to the '['
  const std::string item_pad(static_cast<std::size_t>(shift + 4), ' ');
  for (std::size_t j = 0; j < count; ++j) {
    sink((j == 0 ? "\n" : ",\n") + item_pad);
    emit_item(j, shift + 4);
  }
  sink("\n" + std::string(static_cast<std::size_t>(shift + 2), ' ') + "]");
  emit_shifted(std::string_view(text).substr(at + slot.size()), shift, sink);
}

}  // namespace

void write_results_text(const json& doc, const std::function<json(const json&)>& whole_record, const TextSink& sink) {
  const json* runs = cells::at(doc, {"runs"});
  const std::size_t count = runs && runs->is_array() ? runs->size() : 0;
  emit_with_array(doc, "runs", 0, count, [&](std::size_t i, int shift) {
    const json& run = (*runs)[i];
    const char* key = run.is_object() && run.contains("stages") ? "stages" : "ranks";
    const json* records = run.is_object() ? cells::at(run, {key}) : nullptr;
    const bool objects = records && records->is_array() &&
                         std::all_of(records->begin(), records->end(), [](const json& r) { return r.is_object(); });
    if (!objects) {  // as it is: a list of scalars would go on one line
      emit_shifted(readable_json(run), shift, sink);
      return;
    }
    emit_with_array(run, key, shift, records->size(), [&](std::size_t j, int record_shift) {
      emit_shifted(readable_json(whole_record((*records)[j])), record_shift, sink);
    }, sink);
  }, sink);
  sink("\n");
}

}  // namespace shardscope
