// Pipeline tables: per (stages, model, setup) group one table, one row per stage of
// each (schedule, micro-batches, chunks) run.
#include <string>
#include <utility>
#include <vector>

#include "harness/report/table.hpp"
#include "harness/report/table_parts.hpp"
#include "harness/report/text_table.hpp"

namespace shardscope::tables {
namespace {

// "5 / 40 / 5": peak live / total / before the first backward.
std::string saved_cell(const SavedFigures& saved) {
  return std::to_string(saved.peak_live_tensors) + " / " + std::to_string(saved.total_tensors) + " / " +
         std::to_string(saved.before_first_backward);
}

// "5 / 384", marked " !" when either differs from the measured figure; in a compact table
// "=" when both equal it.
std::string predicted_cell(const StageRecord& stage, const TableOptions& options) {
  const SavedFigures& predicted = stage.predicted.saved;
  const bool mismatch = predicted.peak_live_tensors != stage.saved.peak_live_tensors ||
                        predicted.peak_live_bytes != stage.saved.peak_live_bytes;
  if (!options.wide && !mismatch) return cells::kSame;
  const std::string out =
      std::to_string(predicted.peak_live_tensors) + " / " + cells::bytes(predicted.peak_live_bytes, options);
  return mismatch ? out + " !" : out;
}

// "33.3% / 30.1% / 33.3%": wall-clock / replayed / theory.
std::string bubble_cell(const StageRecord& stage) {
  return percent(stage.bubble_fraction) + " / " + percent(stage.bubble_fraction_replayed) + " / " +
         percent(stage.bubble_fraction_theory);
}

// Whether every stage of every run sits on the rank of its own number (no column needed).
bool ranks_are_stages(const std::vector<const PipelineRun*>& runs) {
  for (const PipelineRun* run : runs)
    for (const StageRecord& stage : run->stages)
      if (stage.rank != stage.stage) return false;
  return true;
}

void print_group(const std::vector<const PipelineRun*>& runs, const ResultDocument& doc, const TableOptions& options,
                 std::ostream& os) {
  const PipelineRun& first = *runs.front();
  // Under --mesh each stage is held by a rank of each data-parallel replica.
  os << title_lines("pipeline, S = " + std::to_string(first.world) + " stages" + tables::mesh_title(first.mesh) + ": " +
                        model_line(first.model, false, options),
                    options)
     << "\n  "
     << setup_line(first.place) << steps_note(runs) << "\n";
  // Compact tables state what every row shares once, here, not in a column.
  std::string chunks;
  for (const PipelineRun* run : runs) {
    const std::string v = std::to_string(run->chunks);
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
  // Under --mesh a stage's bytes moved are its groups' (p2p, tied, dp and tp all-reduces).
  bool on_mesh = false;
  for (const PipelineRun* run : runs) on_mesh = on_mesh || run->mesh.has_value();
  for (const char* c : {"layers", "saved tensors", "live act B", "predicted", "resting B", "peak B", "predicted",
                        on_mesh ? "comm B/step" : "p2p B/step"})
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
  std::vector<OutsideRow> outside;  // and the fourth's (cuda)
  for (const PipelineRun* run : runs) {
    std::vector<std::string> run_head = {run->schedule, std::to_string(run->microbatches)};
    if (chunks_column) run_head.push_back(std::to_string(run->chunks));
    for (const StageRecord& stage : run->stages) {
      std::vector<std::string> row_head = run_head;
      row_head.push_back(std::to_string(stage.stage));
      std::vector<std::string> row = row_head;
      if (rank_column) row.push_back(std::to_string(stage.rank));
      for (std::string cell :
           {stage_layers(stage), saved_cell(stage.saved), cells::bytes(stage.saved.peak_live_bytes, options),
            predicted_cell(stage, options), cells::bytes(stage.resting.total, options),
            cells::bytes(stage.peak.total, options),
            predicted_bytes(stage.predicted.peak_total, stage.peak.total, options),
            measured_bytes(stage.comm_bytes, stage.predicted.comm_bytes, options)})
        row.push_back(std::move(cell));
      table.add_row(std::move(row));
      std::vector<std::string> time_row = row_head;
      time_row.push_back(bubble_cell(stage));
      time_row.push_back(fixed(stage.busy_ms, 3));
      for (std::string cell : step_spread(stage.step_ms, stage.step_ms_all)) time_row.push_back(std::move(cell));
      times.add_row(std::move(time_row));
      live.push_back({row_head, &stage.peak.by_category, &stage.predicted.peak_by_category});
      outside.push_back({row_head, &stage.allocator});
    }
    if (run->stages.empty()) {  // a run that reported no stages still shows
      table.add_row(run_head);
      times.add_row(run_head);
    }
  }
  table.print(os, 2);
  os << '\n';
  os << "  time per step in ms" << timed_steps_words(runs)
     << ": the step's min, median and max; busy: the stage's compute in the\n"
        "  last step; bubble: idle share of that step, from the wall clock, replayed from action times, and in theory\n";
  if (!first.place.emulated) os << cores_note(first.world, doc);
  times.print(os, 2);
  os << '\n';

  print_live_at_peak(head, live, options, os);
  print_outside_pool(head, outside, options, os);
}

}  // namespace

void print_pipeline_tables(const std::vector<const PipelineRun*>& runs, const ResultDocument& doc,
                           const TableOptions& options, std::ostream& os) {
  for (const auto& group : group_runs(runs)) print_group(group, doc, options, os);
}

}  // namespace shardscope::tables
