// Pipeline tables: per (stages, model, setup) group one table, one row per stage of
// each (schedule, micro-batches, chunks) run.
#include <string>
#include <utility>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/table.hpp"
#include "harness/report/text_table.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

const json kEmpty = json::object();

// "0-3" for [first, last]; other arrays comma-joined; "-" when absent.
std::string layers_cell(const json* layers) {
  if (!layers) return cells::kMissing;
  if (!layers->is_array()) return cells::text(layers);
  std::vector<std::string> parts;
  for (const json& v : *layers) parts.push_back(cells::text(&v));
  if (parts.size() == 2) return parts[0] + "-" + parts[1];
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? "," : "") + parts[i];
  return out.empty() ? cells::kMissing : out;
}

// "5 / 40 / 5": peak live / total / before the first backward.
std::string saved_cell(const json& stage) {
  return cells::text(cells::at(stage, {"saved", "peak_live_tensors"})) + " / " +
         cells::text(cells::at(stage, {"saved", "total_tensors"})) + " / " +
         cells::text(cells::at(stage, {"saved", "before_first_backward"}));
}

// "5 / 384", marked " !" when either differs from the measured figure; in a compact table
// "=" when both equal it.
std::string predicted_cell(const json& stage, const TableOptions& options) {
  const json* tensors = cells::at(stage, {"predicted", "peak_live_tensors"});
  const json* bytes = cells::at(stage, {"predicted", "peak_live_bytes"});
  if (!tensors && !bytes) return cells::kMissing;
  std::string out = cells::text(tensors) + " / " + cells::bytes(bytes, options);
  std::int64_t p = 0, m = 0;
  bool mismatch = false, compared = true;
  for (const auto& [predicted, measured] : {std::pair{tensors, "peak_live_tensors"}, std::pair{bytes, "peak_live_bytes"}}) {
    if (cells::as_int(predicted, &p) && cells::as_int(cells::at(stage, {"saved", measured}), &m))
      mismatch = mismatch || p != m;
    else
      compared = false;
  }
  if (!options.wide && compared && !mismatch) return cells::kSame;
  return mismatch ? out + " !" : out;
}

// "33.3% / 30.1% / 33.3%": wall-clock / replayed / theory.
std::string bubble_cell(const json& stage) {
  return cells::percent(cells::at(stage, {"bubble_fraction"})) + " / " +
         cells::percent(cells::at(stage, {"bubble_fraction_replayed"})) + " / " +
         cells::percent(cells::at(stage, {"bubble_fraction_theory"}));
}


// Whether every stage of every run sits on the rank of its own number (no column needed).
bool ranks_are_stages(const std::vector<const json*>& runs) {
  for (const json* run : runs)
    if (const json* stages = cells::at(*run, {"stages"}); stages && stages->is_array())
      for (const json& stage : *stages)
        if (stage.is_object() && cells::at(stage, {"rank"}) && cells::at(stage, {"rank"}) != cells::at(stage, {"stage"}) &&
            *cells::at(stage, {"rank"}) != *cells::at(stage, {"stage"}))
          return false;
  return true;
}

void print_group(const std::vector<const json*>& runs, const json& doc, const TableOptions& options,
                 std::ostream& os) {
  const json& first = *runs.front();
  const json& model = first.contains("model") ? first["model"] : kEmpty;
  os << "pipeline, S = " << cells::text(cells::at(first, {"world"})) << " stages: " << model_line(model, false, options)
     << "\n  " << setup_line(first, doc) << steps_note(runs) << "\n";
  // Compact tables state what every row shares once, here, not in a column.
  std::string chunks;
  for (const json* run : runs) {
    const std::string v = cells::text(cells::at(*run, {"chunks"}));
    chunks = chunks.empty() || chunks == v ? v : "*";
  }
  const bool chunks_column = options.wide || chunks == "*";
  const bool rank_column = options.wide || !ranks_are_stages(runs);
  std::string shared;
  if (!chunks_column) shared += "chunks " + chunks + "; ";
  if (!rank_column) shared += "stage s runs on rank s; ";
  os << "  " << shared << "saved tensors: peak live / total / before the first backward\n\n";

  std::vector<std::string> head = {"schedule", "M"};
  if (chunks_column) head.push_back("chunks");
  head.push_back("stage");
  std::vector<std::string> cols = head;
  if (rank_column) cols.push_back("rank");
  for (const char* c : {"layers", "saved tensors", "live act B", "predicted", "resting B", "peak B", "predicted",
                        "p2p B/step"})
    cols.push_back(c);
  std::vector<Align> align(cols.size(), Align::right);
  align[0] = Align::left;
  align[cols.size() - 8] = Align::left;  // layers
  TextTable table(cols, align);
  std::vector<std::string> time_cols = head;
  for (const char* c : {"bubble: wall / replayed / theory", "busy ms", "step ms: min", "median", "max"})
    time_cols.push_back(c);
  std::vector<Align> time_align(time_cols.size(), Align::right);
  time_align[0] = Align::left;
  TextTable times(time_cols, time_align);
  std::vector<LiveRow> live;  // the third table's rows: the same runs and stages
  for (const json* run : runs) {
    std::vector<std::string> run_head = {cells::text(cells::at(*run, {"schedule"})),
                                         cells::text(cells::at(*run, {"microbatches"}))};
    if (chunks_column) run_head.push_back(cells::text(cells::at(*run, {"chunks"})));
    const json* stages = cells::at(*run, {"stages"});
    bool any = false;
    if (stages && stages->is_array()) {
      for (const json& stage : *stages) {
        if (!stage.is_object()) continue;
        any = true;
        std::vector<std::string> row_head = run_head;
        row_head.push_back(cells::text(cells::at(stage, {"stage"})));
        std::vector<std::string> row = row_head;
        if (rank_column) row.push_back(cells::text(cells::at(stage, {"rank"})));
        const json* peak = cells::at(stage, {"peak", "total"});
        for (std::string cell :
             {stage_layers(stage), saved_cell(stage), cells::bytes(cells::at(stage, {"saved", "peak_live_bytes"}), options),
              predicted_cell(stage, options), cells::bytes(cells::at(stage, {"resting", "total"}), options),
              cells::bytes(peak, options),
              cells::predicted_bytes(cells::at(stage, {"predicted", "peak_total"}), peak, options),
              cells::measured_bytes(cells::at(stage, {"comm_bytes"}), cells::at(stage, {"predicted", "comm_bytes"}),
                                    options)})
          row.push_back(std::move(cell));
        table.add_row(std::move(row));
        std::vector<std::string> time_row = row_head;
        time_row.push_back(bubble_cell(stage));
        time_row.push_back(cells::fixed(cells::at(stage, {"busy_ms"}), 3));
        for (std::string cell : step_spread(stage)) time_row.push_back(std::move(cell));
        times.add_row(std::move(time_row));
        live.push_back({row_head, &stage});
      }
    }
    if (!any) {  // a run that reported no stages still shows
      table.add_row(run_head);
      times.add_row(run_head);
    }
  }
  table.print(os, 2);
  os << '\n';
  os << "  time per step in ms" << timed_steps_words(runs)
     << ": the step's min, median and max; busy: the stage's compute in the\n"
        "  median step; bubble: idle share of the step, from the wall clock, replayed from action times, and in theory\n";
  const json* emulated = cells::at(first, {"emulated"}) ? cells::at(first, {"emulated"}) : cells::at(doc, {"emulated"});
  if (!(emulated && emulated->is_boolean() && emulated->get<bool>())) os << cores_note(first, doc);
  times.print(os, 2);
  os << '\n';

  print_live_at_peak(head, live, options, os);
}

}  // namespace

// All chunks' layer ranges when the stage holds several ("0-1,4-5"), else its range.
std::string stage_layers(const json& stage) {
  const json* chunks = cells::at(stage, {"chunks_layers"});
  if (!chunks || !chunks->is_array() || chunks->size() < 2) return layers_cell(cells::at(stage, {"layers"}));
  std::string out;
  for (const json& range : *chunks) out += (out.empty() ? "" : ",") + layers_cell(&range);
  return out;
}

void print_pipeline_tables(const std::vector<const json*>& runs, const json& doc, const TableOptions& options,
                           std::ostream& os) {
  for (const auto& group : group_runs(runs, doc)) print_group(group, doc, options, os);
}

}  // namespace shardscope
