#include "harness/cli/compare.hpp"

#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "harness/cli/cli.hpp"
#include "harness/cli/sweep_plan.hpp"
#include "harness/records/json_read.hpp"
#include "harness/records/json_write.hpp"
#include "harness/report/comparison.hpp"
#include "harness/report/cells.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/json_parse.hpp"
#include "harness/report/record_label.hpp"
#include "harness/report/table.hpp"
#include "shardscope/category.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

const DataParallelRun* data_parallel(const RunRecord& run) { return std::get_if<DataParallelRun>(&run); }
const PipelineRun* pipeline(const RunRecord& run) { return std::get_if<PipelineRun>(&run); }
bool comparable(const RunRecord& run) { return !std::holds_alternative<SkippedRun>(run); }
const ModelRecord& model_of(const RunRecord& run) {
  return data_parallel(run) ? data_parallel(run)->model : pipeline(run)->model;
}
int world_of(const RunRecord& run) { return data_parallel(run) ? data_parallel(run)->world : pipeline(run)->world; }

json model_key(const ModelRecord& m) {
  json key = json::array({m.layers, m.width, m.params, m.param_tensors, m.param_bytes, m.activation, m.loss, m.batch,
                          m.checkpoint.value_or("none")});
  // A transformer's shape (seq, attention, heads, ...) tells apart runs alike in the rest.
  if (m.shape) key.push_back(to_json(m));
  return key;
}

// What makes two runs the same configuration.
json match_key(const RunRecord& run) {
  if (const DataParallelRun* dp = data_parallel(run))
    return json::array({"data_parallel", dp->strategy, dp->world,
                        dp->layers_per_unit ? json(*dp->layers_per_unit) : json("all"), dp->prefetch,
                        dp->ddp_bucket, dp->bucket_mb, model_key(dp->model), dp->engine, dp->precision,
                        dp->accumulate, dp->no_sync});
  const PipelineRun& pp = *pipeline(run);
  // --autocast-region step is another configuration; microbatch is what a record without
  // the field ran.
  return json::array({"pipeline", pp.schedule, pp.world, pp.microbatches, pp.chunks, pp.split, model_key(pp.model),
                      pp.precision, pp.autocast_region == "step" ? "step" : ""});
}

// What makes two runs comparable across settings: the same model and kind (and, where
// it can, the same world), so that `compare ddp.json zero3.json` sets them side by side.
json loose_key(const RunRecord& run, bool with_world) {
  return json::array({pipeline(run) != nullptr, model_key(model_of(run)), with_world ? json(world_of(run)) : json()});
}

// A rank's or stage's figures that compare sets side by side; `saved` for stages only.
struct Member {
  int number = 0;
  const CategoryFigures* resting = nullptr;
  const PeakFigures* peak = nullptr;
  std::int64_t comm_bytes = 0;
  const SavedFigures* saved = nullptr;
  std::optional<double> step_ms;
};

std::vector<Member> members(const RunRecord& run) {
  std::vector<Member> out;
  if (const DataParallelRun* dp = data_parallel(run))
    for (const RankRecord& r : dp->ranks)
      out.push_back({r.rank, &r.resting, &r.peak, r.comm_bytes, nullptr, r.step_ms.median});
  else
    for (const StageRecord& s : pipeline(run)->stages)  // under --mesh a stage is D·T ranks: matched by rank
      out.push_back({pipeline(run)->mesh ? s.rank : s.stage, &s.resting, &s.peak, s.comm_bytes, &s.saved,
                     s.step_ms.median});
  return out;
}

// Every byte figure of a rank or stage that differs between base and new: in words
// ("peak temp +32,768 B") and as numbers.
ComparedRank differences(const Member& base, const Member& fresh) {
  ComparedRank d;
  auto compare = [&](const std::string& what, std::int64_t a, std::int64_t b) {
    if (a == b) return;
    d.differences.push_back({what, a, b, false});
    d.differs.push_back(what + " " + cells::signed_digits(b - a) + " B");
  };
  for (int c = 0; c < kCategoryCount; ++c)
    compare("resting " + std::string(kCategoryNames[c]), base.resting->bytes[c], fresh.resting->bytes[c]);
  compare("resting", base.resting->total, fresh.resting->total);
  for (int c = 0; c < kCategoryCount; ++c)
    compare("peak " + std::string(kCategoryNames[c]), base.peak->by_category.bytes[c], fresh.peak->by_category.bytes[c]);
  compare("peak", base.peak->total, fresh.peak->total);
  compare("comm", base.comm_bytes, fresh.comm_bytes);
  if (base.saved && fresh.saved) {
    // Saved-tensor counts are counts, not bytes.
    const std::int64_t a = base.saved->peak_live_tensors, b = fresh.saved->peak_live_tensors;
    if (a != b) {
      d.differs.push_back("saved peak live tensors " + std::to_string(a) + " -> " + std::to_string(b));
      d.differences.push_back({"saved peak live tensors", a, b, true});
    }
    compare("saved peak live", base.saved->peak_live_bytes, fresh.saved->peak_live_bytes);
  }
  return d;
}

// Null where there is no record on this side: the table shows "-", not 0 and a difference.
ComparedSide side(const Member* m) {
  if (!m) return {};
  return {m->resting->total, m->peak->total, m->step_ms};
}

// "8x256 b32": what tells two models apart at a glance; with `detailed` their
// activation and loss too, for models alike in shape.
std::string model_tag(const ModelRecord& model, bool detailed) {
  std::string tag = std::to_string(model.layers) + "x" + std::to_string(model.width) + " b" + std::to_string(model.batch);
  if (model.shape) {  // "llama 32x4096 b1 seq 8192", and its attention when detailed
    tag = model.family.value_or(model.shape->model_type) + " " + tag + " seq " + std::to_string(model.shape->seq);
    if (detailed) tag += " " + model.shape->attention;
    return tag;
  }
  if (detailed) tag += " " + model.activation + " " + model.loss;
  return tag;
}

// Run labels name no model, as a sweep runs one; files from different models would
// list "zero2 W=2 units=all" as only in base and again as only in new. A label shared by
// runs of different models gets the model (", model 8x256 b32").
class RunLabels {
 public:
  RunLabels(const ResultDocument& base, const ResultDocument& fresh) {
    std::map<std::string, std::set<json>> models_of;  // plain label -> models
    std::map<std::string, std::set<json>> models_by_tag;
    for (const ResultDocument* doc : {&base, &fresh})
      for (const RunRecord& run : doc->runs)
        if (comparable(run)) {
          models_of[run_label(run)].insert(model_key(model_of(run)));
          models_by_tag[model_tag(model_of(run), false)].insert(model_key(model_of(run)));
        }
    for (const auto& [label, models] : models_of)
      if (models.size() > 1) ambiguous_.insert(label);
    for (const auto& entry : models_by_tag) detailed_ = detailed_ || entry.second.size() > 1;
  }

  std::string operator()(const RunRecord& run) const {
    std::string label = run_label(run);
    if (ambiguous_.count(label)) label += ", model " + model_tag(model_of(run), detailed_);
    return label;
  }

 private:
  std::set<std::string> ambiguous_;
  bool detailed_ = false;  // two models differ in activation or loss only
};

ComparedFile document_summary(const ResultDocument& doc, const std::string& path) {
  return {path, doc.backend, doc.comm, doc.emulated, doc.provenance.git, doc.provenance.host};
}

}  // namespace

// The file read and checked once, into the records: a field of the wrong type is exit 2
// naming the file, the run and the field (json_read.hpp).
ResultDocument read_result_file(const std::string& path, const char* which) {
  json doc;
  try {
    doc = read_json_file(path);
  } catch (const RunError& e) {
    throw UsageError(std::string(which) + ": " + e.what());
  }
  if (!doc.is_object() || doc.value("schema", json()) != kResultSchema || !doc.value("runs", json()).is_array())
    throw UsageError(std::string(which) + ": '" + path +
                     "' is not a shardscope/1 result (a run's --json or a sweep's DIR/shardscope.json)");
  // Its strings are only ever shown (and quoted in a refusal): no control character
  // reaches the terminal.
  make_printable(doc);
  return read_result(doc, path);
}

Comparison compare_documents(const ResultDocument& base, const std::string& base_path, const ResultDocument& fresh,
                             const std::string& new_path) {
  const std::vector<RunRecord>& base_runs = base.runs;
  const std::vector<RunRecord>& new_runs = fresh.runs;
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
  pair_by([](const RunRecord& run) { return loose_key(run, true); });
  pair_by([](const RunRecord& run) { return loose_key(run, false); });

  Comparison out{document_summary(base, base_path), document_summary(fresh, new_path), {}, {}, {}};
  const RunLabels label(base, fresh);
  for (std::size_t i = 0; i < base_runs.size(); ++i) {
    const RunRecord& b = base_runs[i];
    if (!comparable(b)) continue;
    if (partner[i] < 0) {
      out.only_in_base.push_back(label(b));
      continue;
    }
    const RunRecord& f = new_runs[static_cast<std::size_t>(partner[i])];
    const bool across = match_key(b) != match_key(f);
    const std::string id = pipeline(b) ? "stage" : "rank";
    const std::vector<Member> base_members = members(b), new_members = members(f);
    // By rank or stage number (the reader checked them distinct).
    std::map<int, const Member*> base_by_number, new_by_number;
    for (const Member& m : base_members) base_by_number[m.number] = &m;
    for (const Member& m : new_members) new_by_number[m.number] = &m;
    auto find = [](const std::map<int, const Member*>& by_number, int number) -> const Member* {
      const auto it = by_number.find(number);
      return it == by_number.end() ? nullptr : it->second;
    };
    // A rank the other run cannot have (its world is smaller) is shown on its side alone;
    // one it has but did not list (an emulated run lists the rank it played) is left out.
    auto beyond = [](int number, const RunRecord& run) { return number >= world_of(run); };
    ComparedRun run;
    auto add = [&](int number, const Member* rb, const Member* rf) {
      ComparedRank rank = rb && rf ? differences(*rb, *rf) : ComparedRank{};
      if (!rb || !rf) rank.differs.push_back(id + (rb ? " only in base" : " only in new"));
      rank.rank = number;
      rank.base = side(rb);
      rank.fresh = side(rf);
      run.ranks.push_back(std::move(rank));
    };
    for (const Member& rb : base_members) {
      const Member* rf = find(new_by_number, rb.number);
      if (rf || beyond(rb.number, f)) add(rb.number, &rb, rf);
    }
    for (const Member& rf : new_members)
      if (!find(base_by_number, rf.number) && beyond(rf.number, b)) add(rf.number, nullptr, &rf);
    run.label = across ? label(b) + " vs " + label(f) : label(b);
    run.pipeline = pipeline(b) != nullptr;
    if (across) {
      run.across_settings = true;
      run.base_label = label(b);
      run.new_label = label(f);
    }
    out.runs.push_back(std::move(run));
  }
  for (std::size_t n = 0; n < new_runs.size(); ++n)
    if (!used[n] && comparable(new_runs[n])) out.only_in_new.push_back(label(new_runs[n]));
  return out;
}

bool comparison_differs(const Comparison& comparison) {
  if (!comparison.only_in_base.empty() || !comparison.only_in_new.empty()) return true;
  for (const ComparedRun& run : comparison.runs)
    for (const ComparedRank& rank : run.ranks)
      if (!rank.differs.empty()) return true;
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
  const ResultDocument base = read_result_file(files[0], "BASE");
  const ResultDocument fresh = read_result_file(files[1], "NEW");
  const Comparison comparison = compare_documents(base, files[0], fresh, files[1]);
  print_comparison(comparison, std::cout, options);
  return fail_on_diff && comparison_differs(comparison) ? 1 : 0;
}

}  // namespace shardscope
