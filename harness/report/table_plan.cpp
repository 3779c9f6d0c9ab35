// `shardscope plan`'s tables: one per model for data parallel (a row per group of ranks
// with the same figures) and for pipelines (a row per stage), with a "fits" column when
// the plan has a memory size; the skipped configurations; with a memory size, which
// worlds each configuration fits at; and what the figures leave out. They render the
// plan's records (PlanDocument), the same the plan's JSON is written from.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "harness/records/result.hpp"
#include "harness/report/table.hpp"
#include "harness/report/table_parts.hpp"
#include "harness/report/text_table.hpp"
#include "shardscope/category.hpp"
#include "shardscope/format.hpp"

namespace shardscope {
namespace {

// A mesh's rank group as runs of consecutive ranks and its size: "0-7,16-23 (16 ranks)";
// past four runs the rest is elided ("0,2,4,6, ... (32 ranks)"), the JSON lists them all.
std::string ranks_text(const std::vector<int>& ranks) {
  std::vector<std::string> runs;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    runs.push_back(i == j ? std::to_string(ranks[i]) : std::to_string(ranks[i]) + "-" + std::to_string(ranks[j]));
    i = j + 1;
  }
  std::string out;
  for (std::size_t k = 0; k < runs.size() && k < 4; ++k) out += (k ? "," : "") + runs[k];
  if (runs.size() > 4) out += ", ...";
  return out + " (" + std::to_string(ranks.size()) + (ranks.size() == 1 ? " rank)" : " ranks)");
}

using tables::multiple;
using tables::percent;
using tables::stage_layers;
using tables::uses_units;

// The transient categories: at rest every one of them is freed.
constexpr Category kAboveRest[] = {Category::param_unsharded, Category::grad_unsharded, Category::activation,
                                   Category::comm, Category::temp, Category::param_cast};

std::int64_t category_bytes(const CategoryFigures& figures, Category c) {
  return figures.bytes[static_cast<std::size_t>(c)];
}

// What the peak holds above the resting bytes: its transient categories, e.g.
// "param_unsharded 2.00 GiB, grad_unsharded 256.00 MiB, activation 2.50 MiB, temp 1.00 MiB".
std::string above_rest(const CategoryFigures& peak) {
  std::string out;
  for (const Category c : kAboveRest) {
    const std::int64_t b = category_bytes(peak, c);
    if (b == 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(category_name(c)) + " " + format_bytes_short(b);
  }
  return out.empty() ? cells::kMissing : out;
}

std::string fits_cell(const std::optional<bool>& fits, std::int64_t peak, const PlanDocument& plan,
                      const TableOptions& options) {
  const std::optional<std::int64_t> budget = allocator_budget(plan);  // --memory less --overhead
  if (!fits || !budget) return cells::kMissing;
  const std::int64_t margin = *fits ? *budget - peak : peak - *budget;
  const std::string size = options.wide ? format_bytes_short(margin) : cells::bytes(margin, options);
  return *fits ? "yes, " + size + " spare" : "no, " + size + " over";
}

std::string fits_header(std::int64_t memory, const TableOptions& options) {
  return "fits in " + (options.wide ? format_bytes_short(memory) : cells::binary_bytes(memory));
}

// "8.00 MiB", or with --overhead "8.00 MiB beside 592 MiB outside the pool".
std::string within_words(const PlanDocument& plan) {
  std::string words = format_bytes_short(*plan.memory_bytes);
  if (plan.overhead) words += " beside " + format_bytes_short(plan.overhead->bytes) + " outside the pool";
  return words;
}

// A row of a plan's table: its leading cells and the predicted figures it shows.
struct PlanRow {
  std::vector<std::string> head;
  const CategoryFigures* peak;  // predicted peak_by_category; null where not predicted (printed "-")
  std::string transfer;         // communication (data parallel) or p2p bytes per step
  std::string fits;             // the --memory verdict, when the compact table has no room for it
};

// Compact plans: what the peak holds above the resting bytes, a column per transient
// category (those at zero on every row left out), then the bytes each step moves.
void print_above_rest(const std::vector<std::string>& head_names, const std::vector<Align>& head_align,
                      const std::vector<PlanRow>& rows, const std::string& transfer_name, const TableOptions& options,
                      std::ostream& os, const std::string& fits_name = "") {
  std::vector<Category> live;
  for (const Category c : kAboveRest)
    if (std::any_of(rows.begin(), rows.end(),
                    [&](const PlanRow& row) { return row.peak && category_bytes(*row.peak, c) != 0; }))
      live.push_back(c);
  std::vector<std::string> cols = head_names;
  for (const Category c : live) cols.emplace_back(category_name(c));
  cols.push_back(transfer_name);
  std::vector<Align> align = head_align;
  align.resize(cols.size(), Align::right);
  if (!fits_name.empty()) {
    cols.push_back(fits_name);
    align.push_back(Align::left);
  }
  TextTable table(cols, align);
  for (const PlanRow& row : rows) {
    std::vector<std::string> line = row.head;
    for (const Category c : live)
      line.push_back(row.peak ? cells::bytes(category_bytes(*row.peak, c), options) : std::string(cells::kMissing));
    line.push_back(row.transfer);
    if (!fits_name.empty()) line.push_back(row.fits);
    table.add_row(std::move(line));
  }
  os << "\n  at the peak, above rest, bytes per category; and the bytes a step moves\n";
  table.print(os);
}

// "zero3 units=1", "zero2 units=all engine=fsdp2"; ddp and zero1 have no units.
std::string data_parallel_name(const DataParallelRun& run) {
  return (uses_units(run) ? run.strategy + " " + tables::units_setting(run) : run.strategy) + tables::setting_label(run);
}

// "gpipe M=4", "interleaved-1f1b M=4 chunks=2".
std::string pipeline_name(const PipelineRun& run) {
  return run.schedule + " M=" + std::to_string(run.microbatches) +
         (run.chunks == 1 ? "" : " chunks=" + std::to_string(run.chunks));
}

// With --memory: per configuration (strategy and units, or schedule, M and chunks),
// the worlds planned at which every rank's peak fits and those at which one does not.
void print_verdicts(const PlanDocument& plan, std::ostream& os) {
  if (!plan.memory_bytes) return;
  struct Family {
    std::string name;
    std::vector<std::string> fit, miss;
  };
  std::vector<Family> families;
  const auto add = [&](const std::string& name, bool fits, const std::string& world) {
    auto f = std::find_if(families.begin(), families.end(), [&](const Family& x) { return x.name == name; });
    if (f == families.end()) f = families.insert(families.end(), Family{name, {}, {}});
    (fits ? f->fit : f->miss).push_back(world);
  };
  for (const PlanRecord& record : plan.plans) {
    if (const auto* dp = std::get_if<DataParallelPlan>(&record); dp && dp->fits_every_rank)
      add(data_parallel_name(dp->run), *dp->fits_every_rank, "W=" + std::to_string(dp->run.world));
    else if (const auto* pp = std::get_if<PipelinePlan>(&record); pp && pp->fits_every_rank)
      add(pipeline_name(pp->run), *pp->fits_every_rank, "S=" + std::to_string(pp->run.world));
  }
  if (families.empty()) return;
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& x : v) out += (out.empty() ? "" : ", ") + x;
    return out;
  };
  os << "every rank's peak within " << within_words(plan) << ", among the worlds planned:\n";
  TextTable table({"configuration", "fits at", "does not fit at"}, {Align::left, Align::left, Align::left});
  for (const Family& f : families)
    table.add_row({f.name, f.fit.empty() ? "none" : join(f.fit), f.miss.empty() ? "-" : join(f.miss)});
  table.print(os);
  os << '\n';
}

// With --fit: per configuration the largest batch (seq) at which every rank's peak fits,
// the peak there and one above, the rank (stage) that decides, and what ends the search;
// every bound other than memory, and a pipeline's steps, said in words below.
void print_fits(const PlanDocument& plan, const TableOptions& options, std::ostream& os) {
  struct Row {
    std::string name, world;
    const FitRecord* fit;
    bool pipeline;
  };
  std::vector<Row> rows;
  for (const PlanRecord& record : plan.plans) {
    if (const auto* dp = std::get_if<DataParallelPlan>(&record); dp && dp->fit)
      rows.push_back({data_parallel_name(dp->run), "W=" + std::to_string(dp->run.world), &*dp->fit, false});
    else if (const auto* pp = std::get_if<PipelinePlan>(&record); pp && pp->fit)
      rows.push_back({pipeline_name(pp->run), "S=" + std::to_string(pp->run.world), &*pp->fit, true});
  }
  if (rows.empty() || !plan.memory_bytes) return;
  const std::string dimension = rows.front().fit->dimension;
  const bool batch = dimension == "batch";
  const bool any_pipeline = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.pipeline; });
  os << (batch ? "largest batch (per rank; per pipeline for a pipeline)"
               : "largest seq (tokens per sequence, at the batch planned)")
     << " at which every rank's peak fits " << within_words(plan) << ":\n";
  const std::string next = batch ? "peak at batch + 1" : "peak at seq + 1";
  TextTable table({"configuration", "world", dimension, "peak at it", next, "limiting", "bound"},
                  {Align::left, Align::left, Align::right, Align::right, Align::right, Align::left, Align::left});
  std::vector<std::string> notes;
  for (const Row& row : rows) {
    const FitRecord& fit = *row.fit;
    const auto bytes = [&](const std::optional<std::int64_t>& b) {
      return b ? cells::bytes(*b, options) : std::string(cells::kMissing);
    };
    const std::string value = fit.value ? cells::group_digits(*fit.value)
                              : fit.bound == "peak_unknown" ? std::string("unknown")
                                                            : std::string("none");
    const std::string limiting =
        fit.limiting ? std::string(row.pipeline ? "stage " : "rank ") + std::to_string(*fit.limiting) : cells::kMissing;
    table.add_row({row.name, row.world, value, bytes(fit.peak_bytes), bytes(fit.peak_bytes_next), limiting,
                   fit.bound == "largest_accepted" ? "largest accepted" : fit.bound == "model_states" ? "model states"
                   : fit.bound == "peak_unknown"   ? "peak unknown"
                                                   : fit.bound});
    if (fit.bound != "memory") notes.push_back(row.name + " " + row.world + ": " + fit.reason);
  }
  table.print(os);
  for (const std::string& note : notes) os << tables::wrap_text("  " + note, " ", 96, "    ") << '\n';
  if (any_pipeline && batch)
    os << tables::wrap_text("  A pipeline's batch is cut into M micro-batches of at least a row each, sizes differing by "
                            "at most one (torch.tensor_split): every batch from M up runs, so its fit steps by one "
                            "row from M.",
                            " ", 96, "  ")
       << '\n';
  os << '\n';
}

void print_data_parallel(const std::vector<const DataParallelPlan*>& plans, const PlanDocument& plan,
                         const TableOptions& options, std::ostream& os) {
  const std::vector<std::string> head = {"strategy", "W", "units", "ranks"};
  std::vector<std::string> headers = head;
  for (const char* c : {"resting B", "× 4P", "peak B", "× 4P", "peak at"}) headers.push_back(c);
  std::vector<Align> align = {Align::left,  Align::right, Align::left,  Align::left, Align::right,
                              Align::right, Align::right, Align::right, Align::left};
  if (options.wide) {
    headers.insert(headers.end(), {"comm B/step", "at the peak, above rest"});
    align.insert(align.end(), {Align::right, Align::left});
  }
  if (plan.memory_bytes) {
    headers.push_back(fits_header(*plan.memory_bytes, options));
    align.push_back(Align::left);
  }
  TextTable table(headers, align);
  std::vector<PlanRow> rows;
  bool peak_unknown = false;
  struct States {
    std::string strategy, world, ranks;
    std::int64_t bytes;
  };
  std::vector<States> states;  // --engine deepspeed's model states (the ZeRO paper's Figure 1)
  for (const DataParallelPlan* dp : plans) {
    const DataParallelRun& run = dp->run;
    const std::int64_t four_p = run.model.param_bytes;
    for (const RankGroupPlan& group : dp->rank_groups) {
      const RankPredicted& p = group.predicted;
      const std::string who = dp->rank_groups.size() == 1 ? "all"
                              : group.ranks               ? ranks_text(*group.ranks)
                              : group.first == group.last ? std::to_string(group.first)
                                                          : std::to_string(group.first) + "-" + std::to_string(group.last);
      const std::string units =
          !uses_units(run) ? cells::kMissing : run.layers_per_unit ? std::to_string(*run.layers_per_unit) : "all";
      // The strategy with its settings where not the default ("zero3 engine=deepspeed").
      const std::string strategy = run.strategy + tables::setting_label(run);
      if (p.model_states) states.push_back({strategy, std::to_string(run.world), who, *p.model_states});
      std::vector<std::string> row = {strategy, std::to_string(run.world), units, who};
      rows.push_back({row, &p.peak_by_category, cells::bytes(p.comm_bytes, options), ""});
      if (p.peak_known) {
        for (std::string cell : {cells::bytes(p.resting_total, options), multiple(p.resting_total, four_p),
                                 cells::bytes(p.peak_total, options), multiple(p.peak_total, four_p),
                                 p.peak_phase + ", " + p.peak_where})
          row.push_back(std::move(cell));
      } else {
        peak_unknown = true;
        for (std::string cell : {cells::bytes(p.resting_total, options), multiple(p.resting_total, four_p),
                                 std::string(cells::kMissing), std::string(cells::kMissing), std::string("(note)")})
          row.push_back(std::move(cell));
      }
      if (options.wide)
        row.insert(row.end(), {rows.back().transfer,
                               p.peak_known ? above_rest(p.peak_by_category) : std::string(cells::kMissing)});
      if (plan.memory_bytes) {
        // Without a peak, only resting bytes above the memory decide (that it does not fit).
        const bool resting_over = !p.peak_known && group.fits == std::optional<bool>(false);
        row.push_back(p.peak_known || resting_over
                          ? fits_cell(group.fits, p.peak_known ? p.peak_total : p.resting_total, plan, options) +
                                (resting_over ? " at rest" : "")
                          : "peak unknown");
      }
      table.add_row(std::move(row));
    }
  }
  table.print(os);
  if (peak_unknown)
    os << tables::wrap_text(
              "  (note) A transformer's peak needs its activation forms (issue 14, docs/formulas.md, \"Transformers\"), "
              "not in this build: the figures above are its model states at rest (parameters, gradients, AdamW), "
              "exact; what a step adds on top (activations, logits, gathered units) is not printed rather than guessed.",
              " ", 96, "  ")
       << '\n';
  if (!states.empty()) {
    os << "\n  model states per rank as the ZeRO paper counts them (its Figure 1): parameters, the gradients the\n"
          "  stage keeps during a step, master weights and AdamW's state; GB = 10^9 B\n";
    TextTable t({"strategy", "W", "ranks", "model states B", "GB"},
                {Align::left, Align::right, Align::left, Align::right, Align::right});
    for (const States& s : states) {
      char gb[32];
      std::snprintf(gb, sizeof(gb), "%.1f", static_cast<double>(s.bytes) / 1e9);
      t.add_row({s.strategy, s.world, s.ranks, cells::bytes(s.bytes, options), gb});
    }
    t.print(os);
  }
  if (!options.wide)
    print_above_rest(head, {Align::left, Align::right, Align::left, Align::left}, rows, "comm B/step", options, os);
}

void print_pipeline(const std::vector<const PipelinePlan*>& plans, const PlanDocument& plan,
                    const TableOptions& options, std::ostream& os) {
  // A compact table names the chunks above it when every run has the same.
  bool chunks_column = options.wide;
  for (const PipelinePlan* pp : plans) chunks_column = chunks_column || pp->run.chunks != plans.front()->run.chunks;
  if (!chunks_column) os << "  chunks " << plans.front()->run.chunks << "\n";
  std::vector<std::string> head = {"schedule", "S", "M"};
  if (chunks_column) head.push_back("chunks");
  head.push_back("stage");
  std::vector<std::string> headers = head;
  for (const char* c : {"layers", "resting B", "peak B", "× 4P"}) headers.push_back(c);
  headers.push_back(options.wide ? "saved: peak live tensors / B" : "peak saved / B");
  headers.push_back("live μbatches");
  std::vector<Align> align(head.size(), Align::right);
  align[0] = Align::left;
  align.insert(align.end(), {Align::left, Align::right, Align::right, Align::right, Align::right, Align::right});
  // Under --mesh a stage's bytes moved are its groups' (p2p, tied, dp and tp all-reduces).
  bool mesh = false;
  for (const PipelinePlan* pp : plans) mesh = mesh || pp->run.mesh.has_value();
  const char* comm_header = mesh ? "comm B/step" : "p2p B/step";
  if (options.wide) {
    headers.push_back(comm_header);
    align.push_back(Align::right);
  }
  headers.push_back("bubble");
  align.push_back(Align::right);
  if (options.wide) {
    headers.push_back("at the peak, above rest");
    align.push_back(Align::left);
  }
  // A compact table has no room for the verdict beside the bubble: it goes with the bytes
  // above rest, below.
  if (plan.memory_bytes && options.wide) {
    headers.push_back(fits_header(*plan.memory_bytes, options));
    align.push_back(Align::left);
  }
  TextTable table(headers, align);
  std::vector<PlanRow> rows;
  for (const PipelinePlan* pp : plans) {
    const PipelineRun& run = pp->run;
    for (const StagePlan& stage : pp->stages) {
      const StagePredicted& p = stage.predicted;
      std::vector<std::string> row = {run.schedule, std::to_string(run.world), std::to_string(run.microbatches)};
      if (chunks_column) row.push_back(std::to_string(run.chunks));
      // Under --mesh a stage is held by its replicas' ranks.
      row.push_back(std::to_string(stage.stage) + (stage.ranks ? ": ranks " + ranks_text(*stage.ranks) : ""));
      rows.push_back({row, &p.peak_by_category, cells::bytes(p.comm_bytes, options),
                      plan.memory_bytes ? fits_cell(stage.fits, p.peak_total, plan, options) : ""});
      for (std::string cell : {stage_layers(stage.layers, stage.chunks_layers), cells::bytes(p.resting_total, options),
                               cells::bytes(p.peak_total, options), multiple(p.peak_total, run.model.param_bytes),
                               std::to_string(p.saved.peak_live_tensors) + " / " +
                                   cells::bytes(p.saved.peak_live_bytes, options),
                               std::to_string(p.peak_held_microbatches)})
        row.push_back(std::move(cell));
      if (options.wide) row.push_back(cells::bytes(p.comm_bytes, options));
      row.push_back(percent(pp->bubble_fraction_theory));
      if (options.wide) row.push_back(above_rest(p.peak_by_category));
      if (plan.memory_bytes && options.wide) row.push_back(fits_cell(stage.fits, p.peak_total, plan, options));
      table.add_row(std::move(row));
    }
  }
  table.print(os);
  if (!options.wide)
    print_above_rest(head, {Align::left}, rows, comm_header, options, os,
                     plan.memory_bytes ? fits_header(*plan.memory_bytes, options) : "");
}

// One table per model (presets bring their own), in order of first appearance.
template <typename Plan>
std::vector<std::vector<const Plan*>> by_model(const std::vector<const Plan*>& plans) {
  std::vector<std::vector<const Plan*>> groups;
  for (const Plan* p : plans) {
    auto g = std::find_if(groups.begin(), groups.end(),
                          [&](const auto& grp) { return tables::same_group(grp[0]->run.model, p->run.model); });
    if (g == groups.end()) groups.push_back({p});
    else g->push_back(p);
  }
  return groups;
}

}  // namespace

void print_plan(const PlanDocument& plan, std::ostream& os, const TableOptions& options) {
  std::vector<const DataParallelPlan*> data_parallel;
  std::vector<const PipelinePlan*> pipeline;
  std::vector<const SkippedRun*> skipped;
  for (const PlanRecord& p : plan.plans) {
    if (const auto* dp = std::get_if<DataParallelPlan>(&p)) data_parallel.push_back(dp);
    else if (const auto* pp = std::get_if<PipelinePlan>(&p)) pipeline.push_back(pp);
    else skipped.push_back(&std::get<SkippedRun>(p));
  }
  const std::string memory = !plan.memory_bytes ? ""
                                                : (options.wide ? "; " : "\n  ") + std::string("fits: peak within ") +
                                                      format_bytes(*plan.memory_bytes) +
                                                      (plan.overhead ? " less " + format_bytes(plan.overhead->bytes) +
                                                                           " outside the pool"
                                                                     : "");
  for (const auto& group : by_model(data_parallel)) {
    os << tables::title_lines("data parallel, predicted per rank" + tables::mesh_title(group[0]->run.mesh) + ": " +
                                  tables::model_line(group[0]->run.model, true, options),
                              options)
       << memory << "\n\n";
    print_data_parallel(group, plan, options, os);
    os << '\n';
  }
  for (const auto& group : by_model(pipeline)) {
    os << tables::title_lines("pipeline, predicted per stage" + tables::mesh_title(group[0]->run.mesh) + ": " +
                                  tables::model_line(group[0]->run.model, false, options),
                              options)
       << memory << "\n\n";
    print_pipeline(group, plan, options, os);
    os << '\n';
  }
  print_skipped(skipped, os);
  print_verdicts(plan, os);
  print_fits(plan, options, os);
  if (!data_parallel.empty() || !pipeline.empty()) os << bytes_footnote(options, false);
  // The note, wrapped at 96 columns.
  if (!plan.not_counted.empty()) os << tables::wrap_text(plan.not_counted, " ", 96, "") << '\n';
  if (plan.overhead) {
    const PlanOverhead& o = *plan.overhead;
    std::string note = "Outside the pool: " + format_bytes(o.bytes) + " per rank, the most any rank of '" + o.file +
                       "' held (" + o.taken_from + ", measured by " + o.source + "), is added to every peak for the "
                       "--memory verdicts.";
    if (o.source == "cuda_mem_get_info_delta")
      note += " That figure is cudaMemGetInfo's growth from just after the CUDA context was made: the context is not in it.";
    note += " It was measured at that run's world and communicators; NCCL's part grows with communicators and channels.";
    os << tables::wrap_text(note, " ", 96, "") << '\n';
  }
}

}  // namespace shardscope
