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

// The value of `key` that every run of `runs` for which `applies` holds shares ("1"), or
// "" when they differ or none applies: a setting a compact table states once above it
// instead of in a column.
template <typename Applies>
std::string shared_setting(const std::vector<const json*>& runs, const char* key, Applies applies) {
  std::string shared;
  for (const json* run : runs) {
    if (!applies(*run)) continue;
    const std::string v = cells::text(cells::at(*run, {key}));
    if (!shared.empty() && v != shared) return {};
    shared = v;
  }
  return shared;
}

void print_group(const std::vector<const json*>& runs, const json& doc, const TableOptions& options,
                 std::ostream& os) {
  const json& first = *runs.front();
  const json& model = first.contains("model") ? first["model"] : kEmpty;
  const json* param_bytes = cells::at(model, {"param_bytes"});
  const json* emulated_field = cells::at(first, {"emulated"}) ? cells::at(first, {"emulated"}) : cells::at(doc, {"emulated"});
  const bool emulated = emulated_field && emulated_field->is_boolean() && emulated_field->get<bool>();
  os << "data parallel, W = " << cells::text(cells::at(first, {"world"})) << ": "
     << model_line(model, true, options) << "\n  " << setup_line(first, doc) << steps_note(runs) << "\n";

  std::vector<Row> rows;
  bool any_bucket = false, any_units = false;
  for (const json* run : runs) {
    for (Row& row : rows_of(*run)) rows.push_back(std::move(row));
    any_bucket = any_bucket || (cells::at(*run, {"ddp_bucket"}) != nullptr && !uses_units(*run));
    any_units = any_units || uses_units(*run);
  }
  // Compact tables state a setting every row shares once, above them, not in a column.
  const auto no_units = [](const json& run) { return !uses_units(run); };
  const std::string prefetch = options.wide ? "" : shared_setting(runs, "prefetch", uses_units);
  const std::string bucket = options.wide ? "" : shared_setting(runs, "ddp_bucket", no_units);
  std::vector<std::string> settings;
  if (any_units && !prefetch.empty()) settings.push_back("prefetch " + prefetch + " (zero2, zero3)");
  if (any_bucket && !bucket.empty()) settings.push_back("DDP bucket " + bucket + " (ddp, zero1)");
  if (any_units) settings.push_back("units: layers per unit (--units)");
  if (!settings.empty()) {
    os << "  ";
    for (std::size_t i = 0; i < settings.size(); ++i) os << (i ? "; " : "") << settings[i];
    os << '\n';
  }
  os << '\n';
  const bool prefetch_column = options.wide || (any_units && prefetch.empty());
  const bool bucket_column = any_bucket && (options.wide || bucket.empty());
  std::vector<std::string> head = {"strategy", "units"};
  if (prefetch_column) head.push_back("prefetch");
  if (bucket_column) head.push_back("bucket");
  head.push_back("rank");
  const std::size_t nhead = head.size();
  auto row_head = [&](const Row& row) {
    const bool units = uses_units(*row.run);
    std::vector<std::string> out = {cells::text(cells::at(*row.run, {"strategy"})),
                                    units ? cells::text(cells::at(*row.run, {"layers_per_unit"})) : cells::kMissing};
    if (prefetch_column) out.push_back(units ? cells::text(cells::at(*row.run, {"prefetch"})) : cells::kMissing);
    if (bucket_column) out.push_back(units ? cells::kMissing : cells::text(cells::at(*row.run, {"ddp_bucket"})));
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
    line.push_back(cells::bytes(total, options));
    line.push_back(cells::multiple(total, param_bytes));
    for (const char* c : {"param", "grad", "optim"}) line.push_back(cells::bytes(cells::at(r, {"resting", c}), options));
    for (const std::string& c : extra) line.push_back(cells::bytes(cells::at(r, {"resting", c.c_str()}), options));
    line.push_back(cells::predicted_bytes(cells::at(r, {"predicted", "resting_total"}), total, options));
    resting.add_row(std::move(line));
  }
  os << "  at rest (after the step), bytes per rank\n";
  resting.print(os, 2);
  os << '\n';

  std::vector<std::string> peak_cols = head;
  for (const char* c : {"peak B", "× 4P", "phase", "where", "predicted B", "comm B/step", "predicted"})
    peak_cols.push_back(c);
  std::vector<Align> peak_align = aligns(peak_cols.size());
  peak_align[nhead + 2] = peak_align[nhead + 3] = Align::left;
  TextTable peak(peak_cols, peak_align);
  for (const Row& row : rows) {
    const json& r = *row.rank;
    std::vector<std::string> line = row_head(row);
    const json* total = cells::at(r, {"peak", "total"});
    line.push_back(cells::bytes(total, options));
    line.push_back(cells::multiple(total, param_bytes));
    line.push_back(cells::text(cells::at(r, {"peak", "phase"})));
    line.push_back(cells::text(cells::at(r, {"peak", "where"})));
    line.push_back(cells::predicted_bytes(cells::at(r, {"predicted", "peak_total"}), total, options));
    const CommSummary comm = summarize_comm(r);
    const json comm_bytes = comm.bytes;
    const json* measured = comm.any ? &comm_bytes : nullptr;
    line.push_back(cells::bytes(measured, options));
    line.push_back(cells::predicted_bytes(cells::at(r, {"predicted", "comm_bytes"}), measured, options));
    peak.add_row(std::move(line));
  }
  os << "  peak during the step, and communication per step (bytes sent and received by the rank)\n";
  peak.print(os, 2);
  os << '\n';

  std::vector<std::string> time_cols = head;
  for (const char* c : {"main collective", "busbw GB/s", "comm ms", "step ms: min", "median", "max"})
    time_cols.push_back(c);
  std::vector<Align> time_align = aligns(time_cols.size());
  time_align[nhead] = Align::left;
  TextTable times(time_cols, time_align);
  for (const Row& row : rows) {
    std::vector<std::string> line = row_head(row);
    const CommSummary comm = summarize_comm(*row.rank);
    line.push_back(comm.main_kind.empty() ? cells::kMissing : comm.main_kind);
    // An emulated collective moves no data: its bandwidth and time mean nothing.
    const CommSummary timed = summarize_comm(*row.timing);
    line.push_back(comm.main_kind.empty() || emulated ? cells::kMissing : cells::fixed(timed.main_busbw, 2));
    line.push_back(emulated ? cells::kMissing : cells::fixed(cells::at(*row.timing, {"comm_ms", "median"}), 3));
    for (std::string cell : step_spread(*row.timing)) line.push_back(std::move(cell));
    times.add_row(std::move(line));
  }
  os << "  time per step in ms" << timed_steps_words(runs)
     << ": the step's min, median and max (comm ms: the median step's\n"
        "  time inside collectives; busbw: the main collective's); a row for all ranks shows the slowest rank\n";
  if (!emulated) os << cores_note(first, doc);
  times.print(os, 2);
  os << '\n';

  // What was live at the peak, by category: the "why" of the peak figure.
  std::vector<LiveRow> live;
  for (const Row& row : rows) live.push_back({row_head(row), row.rank});
  print_live_at_peak(head, live, options, os);
}

}  // namespace

void print_data_parallel_tables(const std::vector<const json*>& runs, const json& doc, const TableOptions& options,
                                std::ostream& os) {
  for (const auto& group : group_runs(runs, doc)) print_group(group, doc, options, os);
}

}  // namespace shardscope
