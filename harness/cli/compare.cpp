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

// What makes two runs comparable across settings: the same model and kind (and, where
// it can, the same world), so that `compare ddp.json zero3.json` sets them side by side.
json loose_key(const json& run, bool with_world) {
  return json::array({is_pipeline(run), field(run, "model"), with_world ? field(run, "world") : json()});
}

bool comparable(const json& run) { return run.is_object() && !is_skipped(run); }

const json& members(const json& run) {
  static const json kNone = json::array();
  const json* list = cells::at(run, {is_pipeline(run) ? "stages" : "ranks"});
  return list && list->is_array() ? *list : kNone;
}

// Every byte figure of a rank or stage that differs between base and new: in words
// ("peak temp +32,768 B"), and as {"what", "base", "new"} (null where a side lacks it)
// for printers that write bytes their own way.
struct Differences {
  json words = json::array();
  json figures = json::array();
};

Differences differences(const json& base, const json& fresh) {
  Differences d;
  json& out = d.words;
  auto compare = [&](const std::string& what, std::initializer_list<const char*> path) {
    const json* a = cells::at(base, path);
    const json* b = cells::at(fresh, path);
    if (!a && !b) return;
    if (a && b && *a == *b) return;
    d.figures.push_back({{"what", what}, {"base", a ? *a : json()}, {"new", b ? *b : json()}});
    if (!a || !b) {
      out.push_back(what + ": only in " + (a ? "base" : "new"));
      return;
    }
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
      a && b && *a != *b) {
    out.push_back("saved peak live tensors " + json_text(*a) + " -> " + json_text(*b));
    d.figures.push_back({{"what", "saved peak live tensors"}, {"base", *a}, {"new", *b}, {"count", true}});
  }
  compare("saved peak live", {"saved", "peak_live_bytes"});
  return d;
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
  const json& base_runs = base["runs"];
  const json& new_runs = fresh["runs"];
  // Pairs (base run, new run): first the same configuration; then, among what is left,
  // runs of the same model and kind at the same world, then at any world, in order.
  std::vector<std::ptrdiff_t> partner(base_runs.size(), -1);
  std::vector<bool> used(new_runs.size(), false);
  auto pair_by = [&](const auto& key_of) {
    // The new file's keys once (null: taken or not comparable), not once per base run.
    std::vector<json> new_keys;
    for (std::size_t n = 0; n < new_runs.size(); ++n)
      new_keys.push_back(!used[n] && comparable(new_runs[n]) ? key_of(new_runs[n]) : json());
    for (std::size_t b = 0; b < base_runs.size(); ++b) {
      if (partner[b] >= 0 || !comparable(base_runs[b])) continue;
      const json key = key_of(base_runs[b]);
      for (std::size_t n = 0; n < new_runs.size(); ++n)
        if (!used[n] && !new_keys[n].is_null() && new_keys[n] == key) {
          used[n] = true;
          partner[b] = static_cast<std::ptrdiff_t>(n);
          break;
        }
    }
  };
  pair_by(match_key);
  pair_by([](const json& run) { return loose_key(run, true); });
  pair_by([](const json& run) { return loose_key(run, false); });

  json runs = json::array(), only_base = json::array(), only_new = json::array();
  const RunLabels label(base, fresh);
  for (std::size_t i = 0; i < base_runs.size(); ++i) {
    const json& b = base_runs[i];
    if (!comparable(b)) continue;
    if (partner[i] < 0) {
      only_base.push_back(label(b));
      continue;
    }
    const json& f = new_runs[static_cast<std::size_t>(partner[i])];
    const bool across = match_key(b) != match_key(f);
    const char* id = is_pipeline(b) ? "stage" : "rank";
    std::map<json, const json*> new_members;  // by rank or stage number (checked distinct)
    for (const json& candidate : members(f)) new_members[field(candidate, id)] = &candidate;
    // A rank the other run cannot have (its world is smaller) is shown on its side alone;
    // one it has but did not list (an emulated run lists the rank it played) is left out.
    auto beyond = [&](const json& number, const json& run) {
      std::int64_t r = 0, world = 0;
      return cells::as_int(&number, &r) && cells::as_int(cells::at(run, {"world"}), &world) && r >= world;
    };
    json ranks = json::array();
    auto one_sided = [&](const json& number, const json* rb, const json* rf) {
      const char* where = rb ? "only in base" : "only in new";
      ranks.push_back({{"rank", number},
                       {"base", rb ? side(*rb) : side(json::object())},
                       {"new", rf ? side(*rf) : side(json::object())},
                       {"differs", json::array({std::string(id) + " " + where})},
                       {"differences", json::array()}});
    };
    std::set<json> seen;
    for (const json& rb : members(b)) {
      const json number = field(rb, id);
      seen.insert(number);
      const auto rf = new_members.find(number);
      if (rf == new_members.end()) {
        if (beyond(number, f)) one_sided(number, &rb, nullptr);
        continue;
      }
      Differences d = differences(rb, *rf->second);
      ranks.push_back({{"rank", number}, {"base", side(rb)}, {"new", side(*rf->second)},
                       {"differs", std::move(d.words)}, {"differences", std::move(d.figures)}});
    }
    for (const json& rf : members(f))
      if (!seen.count(field(rf, id)) && beyond(field(rf, id), b)) one_sided(field(rf, id), nullptr, &rf);
    json record = {{"label", across ? label(b) + " vs " + label(f) : label(b)},
                   {"kind", field(b, "kind")},
                   {"model", field(b, "model")},
                   {"ranks", std::move(ranks)}};
    if (across) {
      record["across_settings"] = true;
      record["base_label"] = label(b);
      record["new_label"] = label(f);
    }
    runs.push_back(std::move(record));
  }
  for (std::size_t n = 0; n < new_runs.size(); ++n)
    if (!used[n] && comparable(new_runs[n])) only_new.push_back(label(new_runs[n]));
  return {{"base", document_summary(base, base_path)}, {"new", document_summary(fresh, new_path)},
          {"runs", std::move(runs)}, {"only_in_base", std::move(only_base)}, {"only_in_new", std::move(only_new)}};
}

bool comparison_differs(const json& comparison) {
  if (!comparison["only_in_base"].empty() || !comparison["only_in_new"].empty()) return true;
  for (const json& run : comparison["runs"])
    for (const json& rank : run["ranks"])
      if (!rank["differs"].empty()) return true;
  return false;
}

int compare_main(const std::vector<std::string>& args) {
  if (sweep_wants_help(args)) {
    std::cout << "usage: shardscope compare [--fail-on-diff] [--bytes binary|exact] [--wide] BASE.json NEW.json\n"
                 "\n"
                 "Sets two result documents (a run's --json, a sweep's DIR/shardscope.json) side by side:\n"
                 "for every configuration both hold, every rank's resting and peak bytes (base and new),\n"
                 "each byte figure that differs by category, and the step time's ratio new / base. The\n"
                 "same configuration on cpu and cuda, on two machines or at two commits holds the same\n"
                 "bytes; what differs is listed. Runs of the same model left unpaired are then set side by\n"
                 "side across settings (`compare ddp.json zero3.json`): at the same world first, then in\n"
                 "order; ranks by number. Every run is checked first: a field compare reads that is\n"
                 "missing or wrong (a byte count that is not a whole number from 0 to 2^63 - 1, say) is\n"
                 "exit 2, naming the file, the run and the field.\n"
                 "\n"
                 "  --fail-on-diff        exit 1 when any byte figure differs between the runs compared, or a\n"
                 "                        configuration is in one file only (for CI); 0 when none does\n"
                 "  --bytes binary|exact  bytes as 2.01 MiB (default) or 2,105,344\n"
                 "  --wide                every column (the differences beside each row), wider than 120\n";
    return 0;
  }
  bool fail_on_diff = false;
  TableOptions options;
  std::vector<std::string> files;
  std::set<std::string> given;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) {
      files.push_back(a);
      continue;
    }
    const std::string name = a.substr(0, a.find('='));
    if (name != "--fail-on-diff" && name != "--bytes" && name != "--wide")
      throw UsageError("compare: unknown flag '" + a + "'" +
                       did_you_mean(a, {"--help", "--fail-on-diff", "--bytes", "--wide"}) +
                       " (shardscope compare --help)");
    if (!given.insert(name).second) throw UsageError(name + ": given more than once; give it once");
    if (name == "--bytes") {
      std::string value;
      if (a.size() > name.size()) value = a.substr(name.size() + 1);
      else if (i + 1 < args.size()) value = args[++i];
      else throw UsageError("--bytes: needs a value; allowed: binary, exact");
      options.exact_bytes = exact_bytes_value(value);
    } else if (a.size() > name.size()) {
      throw UsageError(name + ": takes no value, got '" + a.substr(name.size() + 1) + "'");
    } else {
      (name == "--wide" ? options.wide : fail_on_diff) = true;
    }
  }
  if (files.size() != 2)
    throw UsageError("compare: expected two result files, BASE.json NEW.json; got " + std::to_string(files.size()) +
                     " argument" + (files.size() == 1 ? "" : "s") + " (shardscope compare --help)");
  const json base = read_document(files[0], "BASE");
  const json fresh = read_document(files[1], "NEW");
  const json comparison = compare_documents(base, files[0], fresh, files[1]);
  print_comparison(comparison, std::cout, options);
  return fail_on_diff && comparison_differs(comparison) ? 1 : 0;
}

}  // namespace shardscope
