// Pipeline tables: per (stages, model, setup) group one table, one row per stage of
// each (schedule, micro-batches, chunks) run.
#include <string>
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

// Bytes sent and received in a step; a prediction that differs follows as "! predicted".
std::string p2p_cell(const json& stage) {
  return cells::measured_bytes(cells::at(stage, {"comm_bytes"}), cells::at(stage, {"predicted", "comm_bytes"}));
}

// "5 / 40 / 5": peak live / total / before the first backward.
std::string saved_cell(const json& stage) {
  return cells::text(cells::at(stage, {"saved", "peak_live_tensors"})) + " / " +
         cells::text(cells::at(stage, {"saved", "total_tensors"})) + " / " +
         cells::text(cells::at(stage, {"saved", "before_first_backward"}));
}

// "5 / 384", marked " !" when either differs from the measured figure.
std::string predicted_cell(const json& stage) {
  const json* tensors = cells::at(stage, {"predicted", "peak_live_tensors"});
  const json* bytes = cells::at(stage, {"predicted", "peak_live_bytes"});
  if (!tensors && !bytes) return cells::kMissing;
  std::string out = cells::text(tensors) + " / " + cells::bytes(bytes);
  std::int64_t p = 0, m = 0;
  bool mismatch = false;
  if (cells::as_int(tensors, &p) && cells::as_int(cells::at(stage, {"saved", "peak_live_tensors"}), &m))
    mismatch = mismatch || p != m;
  if (cells::as_int(bytes, &p) && cells::as_int(cells::at(stage, {"saved", "peak_live_bytes"}), &m))
    mismatch = mismatch || p != m;
  return mismatch ? out + " !" : out;
}

// "33.3% / 30.1% / 33.3%": wall-clock / replayed / theory.
std::string bubble_cell(const json& stage) {
  return cells::percent(cells::at(stage, {"bubble_fraction"})) + " / " +
         cells::percent(cells::at(stage, {"bubble_fraction_replayed"})) + " / " +
         cells::percent(cells::at(stage, {"bubble_fraction_theory"}));
}


void print_group(const std::vector<const json*>& runs, const json& doc, std::ostream& os) {
  const json& first = *runs.front();
  const json& model = first.contains("model") ? first["model"] : kEmpty;
  os << "pipeline, S = " << cells::text(cells::at(first, {"world"})) << " stages: " << model_line(model, false)
     << "; " << setup_line(first, doc) << steps_note(runs) << "\n\n";

  TextTable table({"schedule", "M", "chunks", "stage", "rank", "layers", "saved: peak live / total / before 1st B",
                   "live act B", "predicted (tensors / B)", "resting B", "peak B",
                   "predicted peak B", "p2p B/step", "bubble: wall / replayed / theory", "busy ms", "step ms"},
                  {Align::left, Align::right, Align::right, Align::right, Align::right, Align::left, Align::right,
                   Align::right, Align::right, Align::right, Align::right, Align::right, Align::right, Align::right,
                   Align::right, Align::right});
  std::vector<LiveRow> live;  // the second table's rows: the same runs and stages
  for (const json* run : runs) {
    const std::vector<std::string> head = {cells::text(cells::at(*run, {"schedule"})),
                                           cells::text(cells::at(*run, {"microbatches"})),
                                           cells::text(cells::at(*run, {"chunks"}))};
    const json* stages = cells::at(*run, {"stages"});
    bool any = false;
    if (stages && stages->is_array()) {
      for (const json& stage : *stages) {
        if (!stage.is_object()) continue;
        any = true;
        std::vector<std::string> row = head;
        for (std::string cell :
             {cells::text(cells::at(stage, {"stage"})), cells::text(cells::at(stage, {"rank"})), stage_layers(stage),
              saved_cell(stage), cells::bytes(cells::at(stage, {"saved", "peak_live_bytes"})), predicted_cell(stage),
              cells::bytes(cells::at(stage, {"resting", "total"})), cells::bytes(cells::at(stage, {"peak", "total"})),
              cells::predicted_bytes(cells::at(stage, {"predicted", "peak_total"}), cells::at(stage, {"peak", "total"})),
              p2p_cell(stage), bubble_cell(stage), cells::fixed(cells::at(stage, {"busy_ms"}), 3),
              cells::fixed(cells::at(stage, {"step_ms", "median"}), 3)})
          row.push_back(std::move(cell));
        table.add_row(std::move(row));
        live.push_back({{head[0], head[1], head[2], cells::text(cells::at(stage, {"stage"}))}, &stage});
      }
    }
    if (!any) table.add_row(head);  // a run that reported no stages still shows
  }
  table.print(os, 2);
  os << '\n';

  print_live_at_peak({"schedule", "M", "chunks", "stage"}, live, os);
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

void print_pipeline_tables(const std::vector<const json*>& runs, const json& doc, std::ostream& os) {
  for (const auto& group : group_runs(runs, doc)) print_group(group, doc, os);
}

}  // namespace shardscope
