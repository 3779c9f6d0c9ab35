#include "harness/cli/compare.hpp"

#include <iostream>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "harness/cli/cli.hpp"
#include "harness/cli/compare_input.hpp"
#include "harness/cli/sweep_plan.hpp"
#include "harness/report/cells.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/json_read.hpp"
#include "harness/report/table.hpp"
#include "shardscope/category.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// A document's field; null when absent (check_compare_input has checked the types of
// what compare reads, so absent is the one surprise left).
json field(const json& j, const char* key) {
  const json* v = cells::at(j, {key});
  return v ? *v : json();
}

// What makes two runs the same configuration.
json match_key(const json& run) {
  json key = json::array();
  for (const char* name : {"kind", "strategy", "schedule", "world", "layers_per_unit", "prefetch", "ddp_bucket",
                           "bucket_mb", "microbatches", "chunks", "split", "model"})
    key.push_back(field(run, name));
  return key;
}

bool comparable(const json& run) { return run.is_object() && !is_skipped(run); }

const json& members(const json& run) {
  static const json kNone = json::array();
  const json* list = cells::at(run, {is_pipeline(run) ? "stages" : "ranks"});
  return list && list->is_array() ? *list : kNone;
}

// Every byte figure of a rank or stage that differs between base and new, in words.
json differences(const json& base, const json& fresh) {
  json out = json::array();
  auto compare = [&](const std::string& what, std::initializer_list<const char*> path) {
    const json* a = cells::at(base, path);
    const json* b = cells::at(fresh, path);
    if (!a && !b) return;
    if (!a || !b) {
      out.push_back(what + ": only in " + (a ? "base" : "new"));
      return;
    }
    if (*a == *b) return;
    std::int64_t x = 0, y = 0;
    if (cells::as_int(a, &x) && cells::as_int(b, &y)) out.push_back(what + " " + cells::signed_digits(y - x) + " B");
    else out.push_back(what + " " + json_text(*a) + " -> " + json_text(*b));
  };
  for (const std::string_view c : kCategoryNames) {
    const std::string name(c);
    compare("resting " + name, {"resting", name.c_str()});
  }
  compare("resting", {"resting", "total"});
  for (const std::string_view c : kCategoryNames) {
    const std::string name(c);
    compare("peak " + name, {"peak", "by_category", name.c_str()});
  }
  compare("peak", {"peak", "total"});
  compare("comm", {"comm_bytes"});
  // Saved-tensor counts are counts, not bytes.
  if (const json* a = cells::at(base, {"saved", "peak_live_tensors"}), *b = cells::at(fresh, {"saved", "peak_live_tensors"});
      a && b && *a != *b)
    out.push_back("saved peak live tensors " + json_text(*a) + " -> " + json_text(*b));
  compare("saved peak live", {"saved", "peak_live_bytes"});
  return out;
}

// Null where the record has no figure: the table shows "-", not 0 and a difference.
json side(const json& record) {
  return {{"resting", field(field(record, "resting"), "total")},
          {"peak", field(field(record, "peak"), "total")},
          {"step_ms", field(field(record, "step_ms"), "median")}};
}

// "8x256 b32": what tells two models apart at a glance; with `detailed` their
// activation and loss too, for models alike in shape.
std::string model_tag(const json& model, bool detailed) {
  std::string tag = cells::text(cells::at(model, {"layers"})) + "x" + cells::text(cells::at(model, {"width"})) +
                    " b" + cells::text(cells::at(model, {"batch"}));
  if (detailed)
    tag += " " + cells::text(cells::at(model, {"activation"})) + " " + cells::text(cells::at(model, {"loss"}));
  return tag;
}

// Run labels name no model, as a sweep runs one; files from different models would
// list "zero2 W=2 units=all" as only in base and again as only in new. A label shared by
// runs of different models gets the model (", model 8x256 b32").
class RunLabels {
 public:
  RunLabels(const json& base, const json& fresh) {
    std::map<std::string, std::set<json>> models_of;  // plain label -> models
    std::map<std::string, std::set<json>> models_by_tag;
    for (const json* doc : {&base, &fresh})
      for (const json& run : (*doc)["runs"])
        if (comparable(run)) {
          models_of[run_label(run)].insert(field(run, "model"));
          models_by_tag[model_tag(field(run, "model"), false)].insert(field(run, "model"));
        }
    for (const auto& [label, models] : models_of)
      if (models.size() > 1) ambiguous_.insert(label);
    for (const auto& entry : models_by_tag) detailed_ = detailed_ || entry.second.size() > 1;
  }

  std::string operator()(const json& run) const {
    std::string label = run_label(run);
    if (ambiguous_.count(label)) label += ", model " + model_tag(field(run, "model"), detailed_);
    return label;
  }

 private:
  std::set<std::string> ambiguous_;
  bool detailed_ = false;  // two models differ in activation or loss only
};

json document_summary(const json& doc, const std::string& path) {
  const json* git = cells::at(doc, {"provenance", "git"});
  const json* host = cells::at(doc, {"provenance", "host"});
  return {{"path", path}, {"backend", field(doc, "backend")}, {"comm", field(doc, "comm")},
          {"emulated", field(doc, "emulated")}, {"git", git ? *git : json()}, {"host", host ? *host : json()}};
}

json read_document(const std::string& path, const char* which) {
  json doc;
  try {
    doc = read_json_file(path);
  } catch (const RunError& e) {
    throw UsageError(std::string(which) + ": " + e.what());
  }
  if (field(doc, "schema") != "shardscope/1" || !field(doc, "runs").is_array())
    throw UsageError(std::string(which) + ": '" + path +
                     "' is not a shardscope/1 result (a run's --json or a sweep's DIR/shardscope.json)");
  make_printable(doc);  // its strings are only ever shown: no control character reaches the terminal
  check_compare_input(doc, path);
  return doc;
}

}  // namespace

json compare_documents(const json& base, const std::string& base_path, const json& fresh,
                       const std::string& new_path) {
  json runs = json::array(), only_base = json::array(), only_new = json::array();
  std::vector<bool> used(fresh["runs"].size(), false);
  // The new file's keys once (null: not comparable), not once per run of the base.
  std::vector<json> new_keys;
  for (const json& f : fresh["runs"]) new_keys.push_back(comparable(f) ? match_key(f) : json());
  const RunLabels label(base, fresh);
  for (const json& b : base["runs"]) {
    if (!comparable(b)) continue;
    const json key = match_key(b);
    std::size_t n = 0;
    while (n < new_keys.size() && (used[n] || new_keys[n].is_null() || new_keys[n] != key)) ++n;
    if (n == fresh["runs"].size()) {
      only_base.push_back(label(b));
      continue;
    }
    used[n] = true;
    const json& f = fresh["runs"][n];
    const char* id = is_pipeline(b) ? "stage" : "rank";
    std::map<json, const json*> new_members;  // by rank or stage number (checked distinct)
    for (const json& candidate : members(f)) new_members[field(candidate, id)] = &candidate;
    json ranks = json::array();
    for (const json& rb : members(b)) {
      const json number = field(rb, id);
      const auto rf = new_members.find(number);
      if (rf == new_members.end()) continue;  // an emulated run lists the one rank it played
      ranks.push_back({{"rank", number}, {"base", side(rb)}, {"new", side(*rf->second)},
                       {"differs", differences(rb, *rf->second)}});
    }
    runs.push_back({{"label", label(b)}, {"kind", field(b, "kind")}, {"model", field(b, "model")},
                    {"ranks", std::move(ranks)}});
  }
  for (std::size_t n = 0; n < fresh["runs"].size(); ++n)
    if (!used[n] && comparable(fresh["runs"][n])) only_new.push_back(label(fresh["runs"][n]));
  return {{"base", document_summary(base, base_path)}, {"new", document_summary(fresh, new_path)},
          {"runs", std::move(runs)}, {"only_in_base", std::move(only_base)}, {"only_in_new", std::move(only_new)}};
}

int compare_main(const std::vector<std::string>& args) {
  if (sweep_wants_help(args)) {
    std::cout << "usage: shardscope compare BASE.json NEW.json\n"
                 "\n"
                 "Sets two result documents (a run's --json, a sweep's DIR/shardscope.json) side by side:\n"
                 "for every configuration both hold, every rank's resting and peak bytes (base, and the\n"
                 "difference), each byte figure that differs by category, and the step time's ratio\n"
                 "new / base. The same configuration on cpu and cuda, on two machines or at two commits\n"
                 "holds the same bytes; what differs is listed. Every run is checked first: a field\n"
                 "compare reads that is missing or wrong (a byte count that is not a whole number from\n"
                 "0 to 2^63 - 1, say) is exit 2, naming the file, the run and the field.\n";
    return 0;
  }
  // compare has no flags but --help: a misspelt one is named, not counted as a file.
  for (const std::string& a : args)
    if (a.rfind("--", 0) == 0)
      throw UsageError("compare: unknown flag '" + a + "'" + did_you_mean(a, {"--help", "--fail-on-diff", "--bytes", "--wide"}) +
                       " (shardscope compare --help)");
  if (args.size() != 2)
    throw UsageError("compare: expected two result files, BASE.json NEW.json; got " + std::to_string(args.size()) +
                     " argument" + (args.size() == 1 ? "" : "s") + " (shardscope compare --help)");
  const json base = read_document(args[0], "BASE");
  const json fresh = read_document(args[1], "NEW");
  print_comparison(compare_documents(base, args[0], fresh, args[1]), std::cout);
  return 0;
}

}  // namespace shardscope
