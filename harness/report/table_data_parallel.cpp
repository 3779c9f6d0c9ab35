// Data-parallel tables: per (world, model, setup) group, a resting table and a
// peak/communication/time table with the same row labels.
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/table.hpp"
#include "harness/report/text_table.hpp"
#include "shardscope/category.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

constexpr std::array<const char*, 6> kCollectives = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv"};

const json kEmpty = json::object();

// One table row: a run, the rank whose bytes it shows (`label` "all ranks" or "rank
// N"), and the rank whose times it shows: itself, or for "all ranks" (equal bytes, not
// equal times) the slowest, whose step the others wait for.
struct Row {
  const json* run;
  const json* rank;
  std::string label;
  const json* timing = nullptr;
};

double median_step_ms(const json& rank) {
  const json* m = cells::at(rank, {"step_ms", "median"});
  return m && m->is_number() ? m->get<double>() : -1.0;
}

const json& ranks_of(const json& run) {
  const json* r = cells::at(run, {"ranks"});
  return r && r->is_array() ? *r : kEmpty;
}

// Every byte figure of a rank: ranks that agree on all of them share a row.
json byte_figures(const json& rank) {
  if (!rank.is_object()) return rank;
  json f = {{"resting", rank.value("resting", json())},
            {"peak_total", json()},
            {"peak_by_category", json()},
            {"predicted", rank.value("predicted", json())},
            {"comm", json::object()}};
  if (const json* p = cells::at(rank, {"peak", "total"})) f["peak_total"] = *p;
  if (const json* p = cells::at(rank, {"peak", "by_category"})) f["peak_by_category"] = *p;
  if (const json* comm = cells::at(rank, {"comm"}); comm && comm->is_object())
    for (const auto& [kind, stats] : comm->items())
      if (const json* b = cells::at(stats, {"bytes"})) f["comm"][kind] = *b;
  return f;
}

std::vector<Row> rows_of(const json& run) {
  const json& ranks = ranks_of(run);
  std::vector<Row> rows;
  if (ranks.empty()) return {{&run, &kEmpty, "-", &kEmpty}};
  bool differ = false;
  const json first = byte_figures(ranks.front());
  for (const json& r : ranks) differ = differ || byte_figures(r) != first;
  std::int64_t world = 0;
  const bool one_of_many = ranks.size() == 1 && cells::as_int(cells::at(run, {"world"}), &world) && world > 1;
  if (!differ && !one_of_many) {
    const json* slowest = &ranks.front();
    for (const json& r : ranks)
      if (median_step_ms(r) > median_step_ms(*slowest)) slowest = &r;
    return {{&run, &ranks.front(), "all ranks", slowest}};
  }
  for (const json& r : ranks) rows.push_back({&run, &r, "rank " + cells::text(cells::at(r, {"rank"})), &r});
  return rows;
}

// Communication bytes per step summed over kinds, and the kind with the most bytes.
struct CommSummary {
  bool any = false;
  std::int64_t bytes = 0;
  std::string main_kind;
  const json* main_busbw = nullptr;
};

CommSummary summarize_comm(const json& rank) {
  CommSummary s;
  const json* comm = cells::at(rank, {"comm"});
  if (!comm || !comm->is_object()) return s;
  std::int64_t best = 0;
  for (const auto& [kind, stats] : comm->items()) {
    std::int64_t b = 0;
    if (!cells::as_int(cells::at(stats, {"bytes"}), &b)) continue;
    s.any = true;
    s.bytes += b;
    if (b > best) {
      best = b;
      s.main_kind = kind;
      s.main_busbw = cells::at(stats, {"busbw_gbps"});
    }
  }
  return s;
}

// Resting categories beyond param/grad/optim that are non-zero somewhere in the group.
std::vector<std::string> extra_categories(const std::vector<Row>& rows) {
  std::vector<std::string> names;
  auto consider = [&](const std::string& name) {
    if (name == "total" || name == "param" || name == "grad" || name == "optim") return;
    if (std::find(names.begin(), names.end(), name) != names.end()) return;
    for (const Row& row : rows) {
      std::int64_t b = 0;
      if (cells::as_int(cells::at(*row.rank, {"resting", name.c_str()}), &b) && b != 0) {
        names.push_back(name);
        return;
      }
    }
  };
  for (const char* c : kCategoryNames) consider(c);
  for (const Row& row : rows)
    if (const json* resting = cells::at(*row.rank, {"resting"}); resting && resting->is_object())
      for (const auto& item : resting->items()) consider(item.key());
  return names;
}

void print_group(const std::vector<const json*>& runs, const json& doc, std::ostream& os) {
  const json& first = *runs.front();
  const json& model = first.contains("model") ? first["model"] : kEmpty;
  const json* param_bytes = cells::at(model, {"param_bytes"});
  const json* emulated_field = cells::at(first, {"emulated"}) ? cells::at(first, {"emulated"}) : cells::at(doc, {"emulated"});
  const bool emulated = emulated_field && emulated_field->is_boolean() && emulated_field->get<bool>();
  os << "data parallel, W = " << cells::text(cells::at(first, {"world"})) << ": "
     << model_line(model, true) << "; " << setup_line(first, doc) << steps_note(runs) << "\n\n";

  std::vector<Row> rows;
  bool any_bucket = false;
  for (const json* run : runs) {
    for (Row& row : rows_of(*run)) rows.push_back(std::move(row));
    any_bucket = any_bucket || cells::at(*run, {"ddp_bucket"}) != nullptr;
  }
  std::vector<std::string> head = {"strategy", "units", "prefetch"};
  if (any_bucket) head.push_back("bucket");
  head.push_back("rank");
  const std::size_t nhead = head.size();
  auto row_head = [&](const Row& row) {
    const bool units = uses_units(*row.run);
    std::vector<std::string> out = {cells::text(cells::at(*row.run, {"strategy"})),
                                    units ? units_setting(*row.run) : cells::kMissing,
                                    units ? cells::text(cells::at(*row.run, {"prefetch"})) : cells::kMissing};
    if (any_bucket) out.push_back(units ? cells::kMissing : cells::text(cells::at(*row.run, {"ddp_bucket"})));
    out.push_back(row.label);
    return out;
  };
  auto aligns = [&](std::size_t ncols) {
    std::vector<Align> a(ncols, Align::right);
    std::fill(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(nhead), Align::left);
    return a;
  };

  const std::vector<std::string> extra = extra_categories(rows);
  std::vector<std::string> rest_cols = head;
  for (const char* c : {"resting B", "× 4P", "param", "grad", "optim"}) rest_cols.push_back(c);
  for (const std::string& c : extra) rest_cols.push_back(c);
  rest_cols.push_back("predicted B");
  TextTable resting(rest_cols, aligns(rest_cols.size()));
  for (const Row& row : rows) {
    const json& r = *row.rank;
    std::vector<std::string> line = row_head(row);
    const json* total = cells::at(r, {"resting", "total"});
    line.push_back(cells::bytes(total));
    line.push_back(cells::multiple(total, param_bytes));
    for (const char* c : {"param", "grad", "optim"}) line.push_back(cells::bytes(cells::at(r, {"resting", c})));
    for (const std::string& c : extra) line.push_back(cells::bytes(cells::at(r, {"resting", c.c_str()})));
    line.push_back(cells::predicted_bytes(cells::at(r, {"predicted", "resting_total"}), total));
    resting.add_row(std::move(line));
  }
  os << "  at rest (after the step), bytes per rank\n";
  resting.print(os, 2);
  os << '\n';

  std::vector<std::string> peak_cols = head;
  for (const char* c : {"peak B", "× 4P", "phase", "where", "predicted B", "comm B/step", "predicted",
                        "main collective", "busbw GB/s", "comm ms", "step ms"})
    peak_cols.push_back(c);
  std::vector<Align> peak_align = aligns(peak_cols.size());
  peak_align[nhead + 2] = peak_align[nhead + 3] = peak_align[nhead + 7] = Align::left;
  TextTable peak(peak_cols, peak_align);
  for (const Row& row : rows) {
    const json& r = *row.rank;
    std::vector<std::string> line = row_head(row);
    const json* total = cells::at(r, {"peak", "total"});
    line.push_back(cells::bytes(total));
    line.push_back(cells::multiple(total, param_bytes));
    line.push_back(cells::text(cells::at(r, {"peak", "phase"})));
    line.push_back(cells::text(cells::at(r, {"peak", "where"})));
    line.push_back(cells::predicted_bytes(cells::at(r, {"predicted", "peak_total"}), total));
    const CommSummary comm = summarize_comm(r);
    const json comm_bytes = comm.bytes;
    const json* measured = comm.any ? &comm_bytes : nullptr;
    line.push_back(cells::bytes(measured));
    line.push_back(cells::predicted_bytes(cells::at(r, {"predicted", "comm_bytes"}), measured));
    line.push_back(comm.main_kind.empty() ? cells::kMissing : comm.main_kind);
    // An emulated collective moves no data: its bandwidth means nothing.
    const CommSummary timed = summarize_comm(*row.timing);
    line.push_back(comm.main_kind.empty() || emulated ? cells::kMissing : cells::fixed(timed.main_busbw, 2));
    // The step's time inside collectives: meaningless too when emulated.
    line.push_back(emulated ? cells::kMissing : cells::fixed(cells::at(*row.timing, {"comm_ms", "median"}), 3));
    line.push_back(cells::fixed(cells::at(*row.timing, {"step_ms", "median"}), 3));
    peak.add_row(std::move(line));
  }
  os << "  peak during the step, communication per step, time (step ms, and comm ms of it inside collectives:\n"
        "  medians; on a row for all ranks, the slowest rank's, with its busbw)\n";
  peak.print(os, 2);
  os << '\n';

  // What was live at the peak, by category: the "why" of the peak figure.
  std::vector<LiveRow> live;
  for (const Row& row : rows) live.push_back({row_head(row), row.rank});
  print_live_at_peak(head, live, os);
}

}  // namespace

void print_data_parallel_tables(const std::vector<const json*>& runs, const json& doc, std::ostream& os) {
  for (const auto& group : group_runs(runs, doc)) print_group(group, doc, os);
}

}  // namespace shardscope
