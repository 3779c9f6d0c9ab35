// The parts the text tables of run and sweep are made of (table.cpp,
// table_data_parallel.cpp, table_pipeline.cpp): they render the typed records, read and
// checked once where the result came from, so no cell guesses at a field.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "harness/records/result.hpp"
#include "harness/report/cells.hpp"

namespace shardscope::tables {

// Whether units (and prefetch) shape the run: zero2 and zero3, not ddp and zero1 (which
// run under DDP, and use its bucket instead). True when the strategy is unknown.
bool uses_units(const DataParallelRun& run);
// " accumulate=K" and " no_sync" where not the default (--accumulate 1, syncing), else "".
std::string accumulate_label(const DataParallelRun& run);
// Every setting a data-parallel run's label carries where it is not the default, after
// its strategy: " engine=fsdp2", " precision=bf16", " checkpoint=full" (every:K,
// attention), then accumulate_label's; "" for the seed's settings.
std::string setting_label(const DataParallelRun& run);
// "units=1", "units=all": layers_per_unit as `--units` takes it.
std::string units_setting(const DataParallelRun& run);

// A number with `decimals` places, or "-" when there is none.
std::string fixed(const std::optional<double>& v, int decimals);
// A fraction in [0, 1] as a percentage with one decimal ("33.3%"), or "-".
std::string percent(const std::optional<double>& v);
// bytes / base with 3 decimals ("4.000"), or "-" when base is 0.
std::string multiple(std::int64_t bytes, std::int64_t base);
// The predicted figure beside a measured one: as `options` write bytes, then " !" when
// they differ; in a compact table "=" where they are equal.
std::string predicted_bytes(std::int64_t predicted, std::int64_t measured, const TableOptions& options);
// The measured bytes, followed by " ! <predicted>" when the prediction differs.
std::string measured_bytes(std::int64_t measured, std::int64_t predicted, const TableOptions& options);

// "8 x 256, activation none, loss sum, batch 32/rank, P = 526,336 params,
// 4P = 2,105,344 B" (pipeline runs: "batch 8" without "/rank").
std::string model_line(const ModelRecord& model, bool batch_per_rank, const TableOptions& options);
// `text` cut after each `sep` into lines of at most `width` columns (a part longer than
// that stands alone), the lines after the first begun with `indent`; no trailing spaces.
std::string wrap_text(const std::string& text, const std::string& sep, std::size_t width, const std::string& indent);
// A group's title ("data parallel, W = 4: " + its model line): broken at ", " into lines
// of at most TableOptions::kColumns, the next indented two, unless --wide (one line, as before).
std::string title_lines(const std::string& title, const TableOptions& options);
// " (mesh dp=2,tp=2,pp=1, --sp)" for a record made under --mesh, "" without one.
std::string mesh_title(const std::optional<MeshRecord>& mesh);
// "backend cpu, comm mpi" plus ", emulated (times are compute only)" when emulated.
std::string setup_line(const RunPlace& place);
// "; steps 3, 2 timed" when every run agrees on steps and timed steps, else "".
template <typename Run>
std::string steps_note(const std::vector<const Run*>& runs) {
  for (const Run* r : runs)
    if (r->steps != runs.front()->steps || r->timed_steps != runs.front()->timed_steps) return {};
  return "; steps " + std::to_string(runs.front()->steps) + ", " + std::to_string(runs.front()->timed_steps) + " timed";
}
// ", over 10 timed steps" when every run timed as many steps, else "".
template <typename Run>
std::string timed_steps_words(const std::vector<const Run*>& runs) {
  for (const Run* r : runs)
    if (r->timed_steps != runs.front()->timed_steps) return {};
  const int n = runs.front()->timed_steps;
  return ", over " + std::to_string(n) + (n == 1 ? " timed step" : " timed steps");
}
// A line saying that the run's ranks outnumber the cores of the host that ran it
// (provenance.cores), so its times include waiting for a core; "" otherwise.
std::string cores_note(int world, const ResultDocument& doc);
// A record's step times, ms: {min, median, max} of its timed steps ("-" when untimed).
std::vector<std::string> step_spread(const TimeSummary& step, const std::vector<double>& all);

// Runs grouped by world, model, backend, comm and emulated flag, in order of first
// appearance: the runs one table compares.
bool same_group(const ModelRecord& a, const ModelRecord& b);
template <typename Run>
std::vector<std::vector<const Run*>> group_runs(const std::vector<const Run*>& runs) {
  std::vector<std::vector<const Run*>> groups;
  for (const Run* run : runs) {
    auto alike = [&](const std::vector<const Run*>& g) {
      const Run& f = *g.front();
      return f.world == run->world && same_group(f.model, run->model) && f.place.backend == run->place.backend &&
             f.place.comm == run->place.comm && f.place.emulated == run->place.emulated;
    };
    bool placed = false;
    for (auto& g : groups)
      if (alike(g)) {
        g.push_back(run);
        placed = true;
        break;
      }
    if (!placed) groups.push_back({run});
  }
  return groups;
}

// A row of the "live at the peak" table: its leading cells and the figures it shows
// (null: a run that reported no rank, every cell "-").
struct LiveRow {
  std::vector<std::string> head;
  const CategoryFigures* measured = nullptr;   // peak.by_category
  const CategoryFigures* predicted = nullptr;  // predicted.peak_by_category
};
// Prints what was live at each row's peak, per category (categories at zero on every
// row left out; nothing when no row has a figure); a figure that differs from its
// prediction is followed by "! predicted".
void print_live_at_peak(const std::vector<std::string>& head_names, const std::vector<LiveRow>& rows,
                        const TableOptions& options, std::ostream& os);

// A row of the "outside the pool" table: its leading cells and its rank's figures.
struct OutsideRow {
  std::vector<std::string> head;
  const AllocatorFigures* figures = nullptr;
};
// Prints each row's device memory outside the pool (outside_pool_bytes and its source) and
// its parts (the CUDA context, cuBLAS, each NCCL communicator, the rest); nothing when no
// row has a figure (cpu runs).
void print_outside_pool(const std::vector<std::string>& head_names, const std::vector<OutsideRow>& rows,
                        const TableOptions& options, std::ostream& os);

// A stage's layers: "0-3", or every chunk's when it holds several ("0-1,4-5").
std::string stage_layers(const StageRecord& stage);
std::string stage_layers(const LayerRange& layers, const std::optional<std::vector<LayerRange>>& chunks_layers);

void print_data_parallel_tables(const std::vector<const DataParallelRun*>& runs, const ResultDocument& doc,
                                const TableOptions& options, std::ostream& os);
void print_pipeline_tables(const std::vector<const PipelineRun*>& runs, const ResultDocument& doc,
                           const TableOptions& options, std::ostream& os);

}  // namespace shardscope::tables
