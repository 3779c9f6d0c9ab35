// `shardscope plan`'s tables: one per model for data parallel (a row per group of ranks
// with the same figures) and for pipelines (a row per stage), with a "fits" column when
// the plan has a memory size; the skipped configurations; with a memory size, which
// worlds each configuration fits at; and what the figures leave out.
#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/table.hpp"
#include "harness/report/text_table.hpp"
#include "shardscope/format.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// What the peak holds above the resting bytes: its transient categories (at rest every
// transient is freed), e.g. "param_unsharded 2.00 GiB, grad_unsharded 256.00 MiB,
// activation 2.50 MiB, temp 1.00 MiB".
std::string above_rest(const json& predicted) {
  std::string out;
  for (const char* c : {"param_unsharded", "grad_unsharded", "activation", "comm", "temp"}) {
    std::int64_t b = 0;
    if (!cells::as_int(cells::at(predicted, {"peak_by_category", c}), &b) || b == 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(c) + " " + format_bytes_short(b);
  }
  return out.empty() ? cells::kMissing : out;
}

std::string bytes_cell(const json& v, const TableOptions& options) { return cells::bytes(&v, options); }

std::string times_4p(const json& v, const json& run) {
  return cells::multiple(&v, cells::at(run, {"model", "param_bytes"}));
}

std::string fits_cell(const json& record, const json& plan, const TableOptions& options) {
  const json* memory = cells::at(plan, {"memory_bytes"});
  const json* fits = cells::at(record, {"fits"});
  std::int64_t mem = 0, peak = 0;
  if (!fits || !fits->is_boolean() || !cells::as_int(memory, &mem) ||
      !cells::as_int(cells::at(record, {"predicted", "peak_total"}), &peak))
    return cells::kMissing;
  const std::int64_t margin = fits->get<bool>() ? mem - peak : peak - mem;
  const std::string size = options.wide ? format_bytes_short(margin) : cells::bytes(margin, options);
  return fits->get<bool>() ? "yes, " + size + " spare" : "no, " + size + " over";
}

std::string fits_header(const json& plan, const TableOptions& options) {
  const std::int64_t memory = plan["memory_bytes"].get<std::int64_t>();
  return "fits in " + (options.wide ? format_bytes_short(memory) : cells::binary_bytes(memory));
}

// A row of a plan's table: its leading cells and the predicted figures it shows.
struct PlanRow {
  std::vector<std::string> head;
  const json* predicted;
  std::string transfer;  // communication (data parallel) or p2p bytes per step
};

// Compact plans: what the peak holds above the resting bytes, a column per transient
// category (those at zero on every row left out), then the bytes each step moves.
void print_above_rest(const std::vector<std::string>& head_names, const std::vector<Align>& head_align,
                      const std::vector<PlanRow>& rows, const std::string& transfer_name, const TableOptions& options,
                      std::ostream& os) {
  std::vector<std::string> live;
  for (const char* c : {"param_unsharded", "grad_unsharded", "activation", "comm", "temp"})
    for (const PlanRow& row : rows) {
      std::int64_t b = 0;
      if (cells::as_int(cells::at(*row.predicted, {"peak_by_category", c}), &b) && b != 0) {
        live.emplace_back(c);
        break;
      }
    }
  std::vector<std::string> cols = head_names;
  cols.insert(cols.end(), live.begin(), live.end());
  cols.push_back(transfer_name);
  std::vector<Align> align = head_align;
  align.resize(cols.size(), Align::right);
  TextTable table(cols, align);
  for (const PlanRow& row : rows) {
    std::vector<std::string> line = row.head;
    for (const std::string& c : live) line.push_back(cells::bytes(cells::at(*row.predicted, {"peak_by_category", c.c_str()}), options));
    line.push_back(row.transfer);
    table.add_row(std::move(line));
  }
  os << "\n  at the peak, above rest, bytes per category; and the bytes a step moves\n";
  table.print(os);
}

// "zero3 units=1", "zero2 units=all"; ddp and zero1 have no units.
std::string data_parallel_name(const json& run) {
  const std::string strategy = cells::text(cells::at(run, {"strategy"}));
  return uses_units(run) ? strategy + " " + units_setting(run) : strategy;
}

// With --memory: per configuration (strategy and units, or schedule, M and chunks),
// the worlds planned at which every rank's peak fits and those at which one does not.
void print_verdicts(const json& plan, std::ostream& os) {
  if (plan["memory_bytes"].is_null()) return;
  struct Family {
    std::string name;
    std::vector<std::string> fit, miss;
  };
  std::vector<Family> families;
  for (const json& run : plan["plans"]) {
    const json* fits = cells::at(run, {"fits_every_rank"});
    if (!fits || !fits->is_boolean()) continue;
    const bool pipeline = is_pipeline(run);
    const std::string name =
        pipeline ? cells::text(cells::at(run, {"schedule"})) + " M=" + cells::text(cells::at(run, {"microbatches"})) +
                       (cells::text(cells::at(run, {"chunks"})) == "1" ? "" : " chunks=" + cells::text(cells::at(run, {"chunks"})))
                 : data_parallel_name(run);
    auto f = std::find_if(families.begin(), families.end(), [&](const Family& x) { return x.name == name; });
    if (f == families.end()) f = families.insert(families.end(), Family{name, {}, {}});
    (fits->get<bool>() ? f->fit : f->miss).push_back((pipeline ? "S=" : "W=") + cells::text(cells::at(run, {"world"})));
  }
  if (families.empty()) return;
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const std::string& x : v) out += (out.empty() ? "" : ", ") + x;
    return out;
  };
  os << "every rank's peak within " << format_bytes_short(plan["memory_bytes"].get<std::int64_t>())
     << ", among the worlds planned:\n";
  TextTable table({"configuration", "fits at", "does not fit at"}, {Align::left, Align::left, Align::left});
  for (const Family& f : families)
    table.add_row({f.name, f.fit.empty() ? "none" : join(f.fit), f.miss.empty() ? "-" : join(f.miss)});
  table.print(os);
  os << '\n';
}

void print_data_parallel(const std::vector<const json*>& runs, const json& plan, const TableOptions& options,
                         std::ostream& os) {
  const bool with_memory = !plan["memory_bytes"].is_null();
  const std::vector<std::string> head = {"strategy", "W", "units", "ranks"};
  std::vector<std::string> headers = head;
  for (const char* c : {"resting B", "× 4P", "peak B", "× 4P", "peak at"}) headers.push_back(c);
  std::vector<Align> align = {Align::left,  Align::right, Align::left,  Align::left, Align::right,
                              Align::right, Align::right, Align::right, Align::left};
  if (options.wide) {
    headers.insert(headers.end(), {"comm B/step", "at the peak, above rest"});
    align.insert(align.end(), {Align::right, Align::left});
  }
  if (with_memory) {
    headers.push_back(fits_header(plan, options));
    align.push_back(Align::left);
  }
  TextTable table(headers, align);
  std::vector<PlanRow> rows;
  for (const json* run : runs) {
    const json& groups = (*run)["rank_groups"];
    for (const json& group : groups) {
      const json& p = group["predicted"];
      const std::int64_t first = group["first"], last = group["last"];
      const std::string who = groups.size() == 1 ? "all"
                              : first == last    ? std::to_string(first)
                                                 : std::to_string(first) + "-" + std::to_string(last);
      std::vector<std::string> row = {cells::text(cells::at(*run, {"strategy"})), cells::text(cells::at(*run, {"world"})),
                                      uses_units(*run) ? cells::text(cells::at(*run, {"layers_per_unit"})) : cells::kMissing,
                                      who};
      rows.push_back({row, &p, bytes_cell(p["comm_bytes"], options)});
      for (std::string cell : {bytes_cell(p["resting_total"], options), times_4p(p["resting_total"], *run),
                               bytes_cell(p["peak_total"], options), times_4p(p["peak_total"], *run),
                               cells::text(&p["peak_phase"]) + ", " + cells::text(&p["peak_where"])})
        row.push_back(std::move(cell));
      if (options.wide) row.insert(row.end(), {bytes_cell(p["comm_bytes"], options), above_rest(p)});
      if (with_memory) row.push_back(fits_cell(group, plan, options));
      table.add_row(std::move(row));
    }
  }
  table.print(os);
  if (!options.wide)
    print_above_rest(head, {Align::left, Align::right, Align::left, Align::left}, rows, "comm B/step", options, os);
}

void print_pipeline(const std::vector<const json*>& runs, const json& plan, const TableOptions& options,
                    std::ostream& os) {
  const bool with_memory = !plan["memory_bytes"].is_null();
  // A compact table names the chunks above it when every run has the same.
  bool chunks_column = options.wide;
  for (const json* run : runs) chunks_column = chunks_column || (*run)["chunks"] != (*runs.front())["chunks"];
  if (!chunks_column) os << "  chunks " << cells::text(cells::at(*runs.front(), {"chunks"})) << "\n";
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
  if (options.wide) {
    headers.push_back("p2p B/step");
    align.push_back(Align::right);
  }
  headers.push_back("bubble");
  align.push_back(Align::right);
  if (options.wide) {
    headers.push_back("at the peak, above rest");
    align.push_back(Align::left);
  }
  if (with_memory) {
    headers.push_back(fits_header(plan, options));
    align.push_back(Align::left);
  }
  TextTable table(headers, align);
  std::vector<PlanRow> rows;
  for (const json* run : runs) {
    for (const json& stage : (*run)["stages"]) {
      const json& p = stage["predicted"];
      std::vector<std::string> row = {cells::text(cells::at(*run, {"schedule"})), cells::text(cells::at(*run, {"world"})),
                                      cells::text(cells::at(*run, {"microbatches"}))};
      if (chunks_column) row.push_back(cells::text(cells::at(*run, {"chunks"})));
      row.push_back(cells::text(&stage["stage"]));
      rows.push_back({row, &p, bytes_cell(p["comm_bytes"], options)});
      for (std::string cell : {stage_layers(stage), bytes_cell(p["resting_total"], options),
                               bytes_cell(p["peak_total"], options), times_4p(p["peak_total"], *run),
                               cells::text(&p["peak_live_tensors"]) + " / " + bytes_cell(p["peak_live_bytes"], options),
                               cells::text(&p["peak_held_microbatches"])})
        row.push_back(std::move(cell));
      if (options.wide) row.push_back(bytes_cell(p["comm_bytes"], options));
      row.push_back(cells::percent(cells::at(*run, {"bubble_fraction_theory"})));
      if (options.wide) row.push_back(above_rest(p));
      if (with_memory) row.push_back(fits_cell(stage, plan, options));
      table.add_row(std::move(row));
    }
  }
  table.print(os);
  if (!options.wide) print_above_rest(head, {Align::left}, rows, "p2p B/step", options, os);
}

}  // namespace

void print_plan(const json& plan, std::ostream& os, const TableOptions& options) {
  std::vector<const json*> data_parallel, pipeline, skipped;
  for (const json& p : plan["plans"]) {
    if (is_skipped(p)) skipped.push_back(&p);
    else if (is_pipeline(p)) pipeline.push_back(&p);
    else data_parallel.push_back(&p);
  }
  const std::string memory = plan["memory_bytes"].is_null()
                                 ? ""
                                 : (options.wide ? "; " : "\n  ") + std::string("fits: peak within ") +
                                       format_bytes(plan["memory_bytes"].get<std::int64_t>());
  // One table per model (presets bring their own).
  auto by_model = [](const std::vector<const json*>& runs) {
    std::vector<std::vector<const json*>> groups;
    for (const json* r : runs) {
      auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& grp) { return (*grp[0])["model"] == (*r)["model"]; });
      if (g == groups.end()) groups.push_back({r});
      else g->push_back(r);
    }
    return groups;
  };
  for (const auto& group : by_model(data_parallel)) {
    os << "data parallel, predicted per rank: " << model_line((*group[0])["model"], true, options) << memory << "\n\n";
    print_data_parallel(group, plan, options, os);
    os << '\n';
  }
  for (const auto& group : by_model(pipeline)) {
    os << "pipeline, predicted per stage: " << model_line((*group[0])["model"], false, options) << memory << "\n\n";
    print_pipeline(group, plan, options, os);
    os << '\n';
  }
  print_skipped(skipped, os);
  print_verdicts(plan, os);
  if (!data_parallel.empty() || !pipeline.empty()) os << bytes_footnote(options, false);
  // The note, wrapped at 96 columns.
  const std::string& note = plan["not_counted"].get_ref<const std::string&>();
  std::string line;
  for (std::size_t at = 0, end = 0; at < note.size(); at = end + 1) {
    end = std::min(note.find(' ', at), note.size());
    const std::string word = note.substr(at, end - at);
    if (!line.empty() && line.size() + 1 + word.size() > 96) {
      os << line << '\n';
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) os << line << '\n';
}

}  // namespace shardscope
