#include "harness/report/table.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <variant>

#include "harness/report/cells.hpp"
#include "harness/report/record_label.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/text_table.hpp"
#include "shardscope/category.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// The run's own field, else the document's.
const json* setup_field(const json& run, const json& doc, const char* key) {
  if (const json* v = cells::at(run, {key})) return v;
  return cells::at(doc, {key});
}

// As `run --units` takes it: "units=1", "units=all" (the trace names processes so too).
std::string units_label(const json* layers_per_unit) {
  if (!layers_per_unit) return {};
  return "units=" + cells::text(layers_per_unit);
}

}  // namespace

std::string model_line(const json& model, bool batch_per_rank, const TableOptions& options) {
  std::string line = cells::text(cells::at(model, {"layers"})) + " x " +
                     cells::text(cells::at(model, {"width"}));
  line += ", activation " + cells::text(cells::at(model, {"activation"}));
  line += ", loss " + cells::text(cells::at(model, {"loss"}));
  line += ", batch " + cells::text(cells::at(model, {"batch"})) + (batch_per_rank ? "/rank" : "");
  line += ", P = " + cells::bytes(cells::at(model, {"params"})) + " params";
  line += ", 4P = " + (options.exact_bytes ? cells::bytes(cells::at(model, {"param_bytes"})) + " B"
                                           : cells::bytes(cells::at(model, {"param_bytes"}), options));
  return line;
}

std::string setup_line(const json& run, const json& doc) {
  std::string line = "backend " + cells::text(setup_field(run, doc, "backend")) + ", comm " +
                     cells::text(setup_field(run, doc, "comm"));
  const json* emulated = setup_field(run, doc, "emulated");
  if (emulated && emulated->is_boolean() && emulated->get<bool>())
    line += ", emulated (times are compute only)";
  return line;
}

bool is_pipeline(const json& run) {
  if (const json* kind = cells::at(run, {"kind"}); kind && kind->is_string())
    return kind->get<std::string>() == "pipeline";
  return run.contains("stages") || run.contains("schedule");
}

bool is_skipped(const json& run) {
  const json* s = cells::at(run, {"skipped"});
  return s && s->is_boolean() && s->get<bool>();
}

bool uses_units(const json& run) {
  const json* s = cells::at(run, {"strategy"});
  const std::optional<StrategyKind> kind = s && s->is_string() ? find_strategy(s->get<std::string>()) : std::nullopt;
  return !kind || shards_by_unit(*kind);
}

std::string run_label(const json& run) {
  std::string label;
  const bool pipeline = is_pipeline(run);
  const json* name = cells::at(run, {pipeline ? "schedule" : "strategy"});
  label += name ? cells::text(name) : (pipeline ? "pipeline" : "data parallel");
  if (const json* w = cells::at(run, {"world"})) label += (pipeline ? " S=" : " W=") + cells::text(w);
  if (!pipeline) {
    if (const json* k = cells::at(run, {"layers_per_unit"}); k && uses_units(run)) label += " " + units_label(k);
  } else {
    if (const json* m = cells::at(run, {"microbatches"})) label += " M=" + cells::text(m);
    if (const json* v = cells::at(run, {"chunks"})) label += " chunks=" + cells::text(v);
  }
  return label;
}

std::string run_label(const RunRecord& run) {
  if (const auto* dp = std::get_if<DataParallelRun>(&run)) {
    std::string label = dp->strategy + " W=" + std::to_string(dp->world);
    const std::optional<StrategyKind> kind = find_strategy(dp->strategy);
    if (!kind || shards_by_unit(*kind))
      label += " units=" + (dp->layers_per_unit ? std::to_string(*dp->layers_per_unit) : std::string("all"));
    return label;
  }
  if (const auto* pp = std::get_if<PipelineRun>(&run))
    return pp->schedule + " S=" + std::to_string(pp->world) + " M=" + std::to_string(pp->microbatches) +
           " chunks=" + std::to_string(pp->chunks);
  return run_label(std::get<SkippedRun>(run).config);
}

std::vector<std::vector<const json*>> group_runs(const std::vector<const json*>& runs, const json& doc) {
  std::vector<std::string> keys;
  std::vector<std::vector<const json*>> groups;
  for (const json* run : runs) {
    json key = json::array();
    key.push_back(run->value("world", json()));
    key.push_back(run->value("model", json()));
    for (const char* field : {"backend", "comm", "emulated"}) {
      const json* v = setup_field(*run, doc, field);
      key.push_back(v ? *v : json());
    }
    const std::string text = json_text(key);
    const auto it = std::find(keys.begin(), keys.end(), text);
    if (it == keys.end()) {
      keys.push_back(text);
      groups.push_back({run});
    } else {
      groups[static_cast<std::size_t>(it - keys.begin())].push_back(run);
    }
  }
  return groups;
}

std::string steps_note(const std::vector<const json*>& runs) {
  if (runs.empty()) return {};
  const json steps = runs.front()->value("steps", json());
  const json timed = runs.front()->value("timed_steps", json());
  for (const json* r : runs)
    if (r->value("steps", json()) != steps || r->value("timed_steps", json()) != timed) return {};
  if (steps.is_null()) return {};
  std::string note = "; steps " + cells::text(&steps);
  if (!timed.is_null()) note += ", " + cells::text(&timed) + " timed";
  return note;
}

std::vector<std::string> step_spread(const json& record) {
  std::string max = cells::fixed(cells::at(record, {"step_ms", "max"}), 3);
  // Files written before step_ms.max: the largest timed step (the first is warm-up).
  const json* all = cells::at(record, {"step_ms_all"});
  if (max == cells::kMissing && all && all->is_array() && all->size() >= 2) {
    const json* largest = nullptr;
    for (std::size_t i = 1; i < all->size(); ++i)
      if ((*all)[i].is_number() && (!largest || (*all)[i].get<double>() > largest->get<double>())) largest = &(*all)[i];
    max = cells::fixed(largest, 3);
  }
  return {cells::fixed(cells::at(record, {"step_ms", "min"}), 3), cells::fixed(cells::at(record, {"step_ms", "median"}), 3),
          max};
}

std::string timed_steps_words(const std::vector<const json*>& runs) {
  if (runs.empty()) return {};
  const json timed = runs.front()->value("timed_steps", json());
  for (const json* r : runs)
    if (r->value("timed_steps", json()) != timed) return {};
  std::int64_t n = 0;
  if (!cells::as_int(&timed, &n)) return {};
  return ", over " + std::to_string(n) + (n == 1 ? " timed step" : " timed steps");
}

std::string cores_note(const json& run, const json& doc) {
  std::int64_t world = 0, cores = 0;
  if (!cells::as_int(cells::at(run, {"world"}), &world) || !cells::as_int(cells::at(doc, {"provenance", "cores"}), &cores) ||
      cores <= 0 || world <= cores)
    return {};
  return "  " + std::to_string(world) + " ranks share " + std::to_string(cores) + (cores == 1 ? " core" : " cores") +
         " here: a rank waits for a core, so these times are longer than with a core per rank\n";
}

void print_live_at_peak(const std::vector<std::string>& head_names, const std::vector<LiveRow>& rows,
                        const TableOptions& options, std::ostream& os) {
  std::vector<std::string> live;
  for (const std::string_view c : kCategoryNames) {
    const std::string name(c);
    for (const LiveRow& row : rows) {
      std::int64_t b = 0;
      if (cells::as_int(cells::at(*row.record, {"peak", "by_category", name.c_str()}), &b) && b != 0) {
        live.push_back(name);
        break;
      }
    }
  }
  if (live.empty()) return;
  std::vector<std::string> cols = head_names;
  cols.insert(cols.end(), live.begin(), live.end());
  std::vector<Align> align(cols.size(), Align::right);
  std::fill(align.begin(), align.begin() + static_cast<std::ptrdiff_t>(head_names.size()), Align::left);
  TextTable table(cols, align);
  for (const LiveRow& row : rows) {
    std::vector<std::string> line = row.head;
    for (const std::string& c : live) {
      line.push_back(cells::measured_bytes(cells::at(*row.record, {"peak", "by_category", c.c_str()}),
                                           cells::at(*row.record, {"predicted", "peak_by_category", c.c_str()}),
                                           options));
    }
    table.add_row(std::move(line));
  }
  os << "  live at the peak, bytes per category (a figure that differs from its prediction is followed by\n"
        "  \"! predicted\")\n";
  // The category names are the table's widest cells: their columns, not the figures, set
  // the width.
  table.print(os, 2);
  os << '\n';
}

void print_skipped(const std::vector<const json*>& skipped, std::ostream& os) {
  if (skipped.empty()) return;
  os << "skipped (the configuration cannot run):\n";
  for (const json* s : skipped) {
    os << "  " << (is_pipeline(*s) ? "pipeline " : "data parallel ") << run_label(*s) << ": "
       << cells::text(cells::at(*s, {"reason"})) << '\n';
  }
  os << '\n';
}

void print_tables(const json& doc, std::ostream& os, const TableOptions& options) {
  const json* runs = cells::at(doc, {"runs"});
  if (!runs || !runs->is_array() || runs->empty()) {
    os << "(no runs)\n";
    return;
  }
  std::vector<const json*> data_parallel, pipeline, skipped;
  for (const json& run : *runs) {
    if (!run.is_object()) continue;
    if (is_skipped(run))
      skipped.push_back(&run);
    else if (is_pipeline(run))
      pipeline.push_back(&run);
    else
      data_parallel.push_back(&run);
  }
  if (!data_parallel.empty()) print_data_parallel_tables(data_parallel, doc, options, os);
  if (!pipeline.empty()) print_pipeline_tables(pipeline, doc, options, os);
  print_skipped(skipped, os);
  if (!data_parallel.empty() || !pipeline.empty()) os << bytes_footnote(options);
}

std::string bytes_footnote(const TableOptions& options, bool predictions) {
  std::string note = options.exact_bytes ? "Bytes: exact (--bytes exact), as the JSON and CSV hold them."
                                         : "Bytes: binary units (1 KiB = 1024 B), three significant figures; --bytes exact "
                                           "prints them\nto the byte, as the JSON and CSV hold them.";
  if (!options.wide)
    note += predictions ? " \"=\": the prediction equals the measured figure. --wide: every column."
                        : " --wide: every column.";
  return note + "\n";
}

std::string units_setting(const json& run) {
  const std::string s = units_label(cells::at(run, {"layers_per_unit"}));
  return s.empty() ? cells::kMissing : s;
}

}  // namespace shardscope
