// Data-parallel tables: per (world, model, setup) group, a resting table and a
// peak/communication/time table with the same row labels.
#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "harness/report/table.hpp"
#include "harness/report/table_parts.hpp"
#include "harness/report/text_table.hpp"
#include "shardscope/category.hpp"

namespace shardscope::tables {
namespace {

// One table row: a run, the rank whose bytes it shows (`label` "all ranks" or "rank
// N"), and the rank whose times it shows: itself, or for "all ranks" (equal bytes, not
// equal times) the slowest, whose step the others wait for. `rank` is null for a run
// that reported no rank: every figure "-".
struct Row {
  const DataParallelRun* run;
  const RankRecord* rank;
  std::string label;
  const RankRecord* timing = nullptr;
};

double median_step_ms(const RankRecord& rank) { return rank.step_ms.median ? *rank.step_ms.median : -1.0; }

bool same_figures(const CategoryFigures& a, const CategoryFigures& b) { return a.total == b.total && a.bytes == b.bytes; }

// Every byte figure of a rank: ranks that agree on all of them share a row.
bool same_bytes(const RankRecord& a, const RankRecord& b) {
  const RankPredicted &p = a.predicted, &q = b.predicted;
  if (!same_figures(a.resting, b.resting) || a.peak.total != b.peak.total ||
      !same_figures(a.peak.by_category, b.peak.by_category))
    return false;
  if (p.resting_total != q.resting_total || !same_figures(p.resting, q.resting) || p.peak_total != q.peak_total ||
      !same_figures(p.peak_by_category, q.peak_by_category) || p.peak_phase != q.peak_phase ||
      p.peak_where != q.peak_where || p.comm_bytes != q.comm_bytes)
    return false;
  for (int k = 0; k < kCollKindCount; ++k)
    if (a.comm[k].bytes != b.comm[k].bytes) return false;
  return true;
}

std::vector<Row> rows_of(const DataParallelRun& run) {
  const std::vector<RankRecord>& ranks = run.ranks;
  if (ranks.empty()) return {{&run, nullptr, "-", nullptr}};
  bool differ = false;
  for (const RankRecord& r : ranks) differ = differ || !same_bytes(r, ranks.front());
  const bool one_of_many = ranks.size() == 1 && run.world > 1;
  if (!differ && !one_of_many) {
    const RankRecord* slowest = &ranks.front();
    for (const RankRecord& r : ranks)
      if (median_step_ms(r) > median_step_ms(*slowest)) slowest = &r;
    return {{&run, &ranks.front(), "all ranks", slowest}};
  }
  std::vector<Row> rows;
  for (const RankRecord& r : ranks) rows.push_back({&run, &r, "rank " + std::to_string(r.rank), &r});
  return rows;
}

// The collective kinds in the order of their names (the order the JSON document keeps
// them in): of kinds with equal bytes, the first so named is the main one.
std::array<int, kCollKindCount> kinds_by_name() {
  std::array<int, kCollKindCount> order{};
  for (int k = 0; k < kCollKindCount; ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [](int a, int b) { return kCollKindNames[a] < kCollKindNames[b]; });
  return order;
}

// Communication bytes per step summed over kinds, and the kind with the most bytes.
struct CommSummary {
  std::int64_t bytes = 0;
  std::string main_kind;
  std::optional<double> main_busbw;
};

CommSummary summarize_comm(const RankRecord& rank) {
  static const std::array<int, kCollKindCount> order = kinds_by_name();
  CommSummary s;
  std::int64_t best = 0;
  for (const int k : order) {
    const CollectiveFigures& c = rank.comm[k];
    s.bytes += c.bytes;
    if (c.bytes > best) {
      best = c.bytes;
      s.main_kind = std::string(kCollKindNames[k]);
      s.main_busbw = c.busbw_gbps;
    }
  }
  return s;
}

// Resting categories beyond param/grad/optim that are non-zero somewhere in the group.
std::vector<int> extra_categories(const std::vector<Row>& rows) {
  std::vector<int> out;
  for (int c = 0; c < kCategoryCount; ++c) {
    const std::string_view name = kCategoryNames[c];
    if (name == "param" || name == "grad" || name == "optim") continue;
    for (const Row& row : rows)
      if (row.rank && row.rank->resting.bytes[c] != 0) {
        out.push_back(c);
        break;
      }
  }
  return out;
}

int category_index(std::string_view name) {
  for (int c = 0; c < kCategoryCount; ++c)
    if (kCategoryNames[c] == name) return c;
  return -1;
}

std::string units_cell(const DataParallelRun& run) {
  return run.layers_per_unit ? std::to_string(*run.layers_per_unit) : "all";
}

// The value every run of `runs` for which `applies` holds shares ("1"), or "" when they
// differ or none applies: a setting a compact table states once above it instead of in
// a column.
template <typename Applies, typename Value>
std::string shared_setting(const std::vector<const DataParallelRun*>& runs, Applies applies, Value value) {
  std::string shared;
  for (const DataParallelRun* run : runs) {
    if (!applies(*run)) continue;
    const std::string v = value(*run);
    if (!shared.empty() && v != shared) return {};
    shared = v;
  }
  return shared;
}

void print_group(const std::vector<const DataParallelRun*>& runs, const ResultDocument& doc,
                 const TableOptions& options, std::ostream& os) {
  const DataParallelRun& first = *runs.front();
  const std::int64_t param_bytes = first.model.param_bytes;
  const bool emulated = first.place.emulated;
  // Under --mesh, W is the mesh's and the bytes are a rank's slice of the model.
  os << title_lines("data parallel, W = " + std::to_string(first.world) + mesh_title(first.mesh) + ": " + model_line(first.model, true, options),
                    options)
     << "\n  "
     << setup_line(first.place) << steps_note(runs) << "\n";

  std::vector<Row> rows;
  // DDP's bucket (--ddp-bucket) is torch's ddp's and zero1's: DeepSpeed's engine has its own.
  const auto ddp_bucketed = [](const DataParallelRun& run) { return !uses_units(run) && run.engine != "deepspeed"; };
  bool any_bucket = false, any_units = false;
  for (const DataParallelRun* run : runs) {
    for (Row& row : rows_of(*run)) rows.push_back(std::move(row));
    any_bucket = any_bucket || ddp_bucketed(*run);
    any_units = any_units || uses_units(*run);
  }
  // Compact tables state a setting every row shares once, above them, not in a column.
  const auto units = [](const DataParallelRun& run) { return uses_units(run); };
  const std::string prefetch =
      options.wide ? "" : shared_setting(runs, units, [](const DataParallelRun& r) { return std::to_string(r.prefetch); });
  const std::string bucket =
      options.wide ? "" : shared_setting(runs, ddp_bucketed, [](const DataParallelRun& r) { return r.ddp_bucket; });
  std::vector<std::string> settings;
  if (any_units && !prefetch.empty()) settings.push_back("prefetch " + prefetch + " (zero2, zero3)");
  if (any_bucket && !bucket.empty()) settings.push_back("DDP bucket " + bucket + " (ddp, zero1)");
  if (any_units) settings.push_back("units: layers per unit (--units)");
  // What bf16's GEMMs ran as (OpenBLAS's sbgemm, its fallback, cuBLAS): once per kind.
  std::vector<std::string> gemms;
  for (const DataParallelRun* run : runs)
    if (run->bf16_gemm && std::find(gemms.begin(), gemms.end(), *run->bf16_gemm) == gemms.end())
      gemms.push_back(*run->bf16_gemm);
  for (const std::string& g : gemms) settings.push_back("bf16 GEMMs: " + g);
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
    const bool by_unit = uses_units(*row.run);
    // The settings where not the default: "zero3 engine=fsdp2 checkpoint=full",
    // "ddp accumulate=4 no_sync".
    const std::string strategy = row.run->strategy + setting_label(*row.run);
    std::vector<std::string> out = {strategy, by_unit ? units_cell(*row.run) : cells::kMissing};
    if (prefetch_column) out.push_back(by_unit ? std::to_string(row.run->prefetch) : cells::kMissing);
    if (bucket_column) out.push_back(by_unit ? cells::kMissing : row.run->ddp_bucket);
    out.push_back(row.label);
    return out;
  };
  auto aligns = [&](std::size_t ncols) {
    std::vector<Align> a(ncols, Align::right);
    std::fill(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(nhead), Align::left);
    return a;
  };
  // Each row of `table`: its leading cells, then its rank's figures (`figures`), or "-" in
  // every column of a run that reported no rank.
  const auto add_rows = [&](TextTable& table, std::size_t ncols, const auto& figures) {
    for (const Row& row : rows) {
      std::vector<std::string> line = row_head(row);
      if (row.rank) figures(row, line);
      else line.resize(ncols, cells::kMissing);
      table.add_row(std::move(line));
    }
  };

  const std::vector<int> extra = extra_categories(rows);
  std::vector<std::string> rest_cols = head;
  for (const char* c : {"resting B", "× 4P", "param", "grad", "optim"}) rest_cols.push_back(c);
  for (const int c : extra) rest_cols.emplace_back(kCategoryNames[c]);
  rest_cols.push_back("predicted B");
  TextTable resting(rest_cols, aligns(rest_cols.size()));
  add_rows(resting, rest_cols.size(), [&](const Row& row, std::vector<std::string>& line) {
    const RankRecord& r = *row.rank;
    line.push_back(cells::bytes(r.resting.total, options));
    line.push_back(multiple(r.resting.total, param_bytes));
    for (const char* c : {"param", "grad", "optim"})
      line.push_back(cells::bytes(r.resting.bytes[category_index(c)], options));
    for (const int c : extra) line.push_back(cells::bytes(r.resting.bytes[c], options));
    line.push_back(predicted_bytes(r.predicted.resting_total, r.resting.total, options));
  });
  os << "  at rest (after the step), bytes per rank\n";
  resting.print(os, 2);
  os << '\n';

  std::vector<std::string> peak_cols = head;
  for (const char* c : {"peak B", "× 4P", "phase", "where", "predicted B", "comm B/step", "predicted"})
    peak_cols.push_back(c);
  std::vector<Align> peak_align = aligns(peak_cols.size());
  peak_align[nhead + 2] = peak_align[nhead + 3] = Align::left;
  TextTable peak(peak_cols, peak_align);
  add_rows(peak, peak_cols.size(), [&](const Row& row, std::vector<std::string>& line) {
    const RankRecord& r = *row.rank;
    line.push_back(cells::bytes(r.peak.total, options));
    line.push_back(multiple(r.peak.total, param_bytes));
    line.push_back(r.peak.phase);
    line.push_back(r.peak.where);
    line.push_back(predicted_bytes(r.predicted.peak_total, r.peak.total, options));
    const CommSummary comm = summarize_comm(r);
    line.push_back(cells::bytes(comm.bytes, options));
    line.push_back(predicted_bytes(r.predicted.comm_bytes, comm.bytes, options));
  });
  os << "  peak during the step, and communication per step (bytes sent and received by the rank)\n";
  peak.print(os, 2);
  os << '\n';

  std::vector<std::string> time_cols = head;
  for (const char* c : {"main collective", "busbw GB/s", "comm ms", "exposed ms", "step ms: min", "median", "max"})
    time_cols.push_back(c);
  std::vector<Align> time_align = aligns(time_cols.size());
  time_align[nhead] = Align::left;
  TextTable times(time_cols, time_align);
  add_rows(times, time_cols.size(), [&](const Row& row, std::vector<std::string>& line) {
    const CommSummary comm = summarize_comm(*row.rank);
    line.push_back(comm.main_kind.empty() ? cells::kMissing : comm.main_kind);
    // An emulated collective moves no data: its bandwidth and time mean nothing.
    const CommSummary timed = summarize_comm(*row.timing);
    line.push_back(comm.main_kind.empty() || emulated ? cells::kMissing : fixed(timed.main_busbw, 2));
    line.push_back(emulated ? cells::kMissing : fixed(row.timing->comm_ms.median, 3));
    line.push_back(emulated ? cells::kMissing : fixed(row.timing->comm_exposed_ms.median, 3));
    for (std::string cell : step_spread(row.timing->step_ms, row.timing->step_ms_all)) line.push_back(std::move(cell));
  });
  os << "  time per step in ms" << timed_steps_words(runs)
     << ": the step's min, median and max (comm ms: the median step's\n"
        "  time inside collectives; exposed ms: the part of it the step waited for, less than comm ms\n"
        "  where --overlap hid some; busbw: the main collective's); a row for all ranks shows the slowest rank\n";
  if (!emulated) os << cores_note(first.world, doc);
  times.print(os, 2);
  os << '\n';

  // What was live at the peak, by category: the "why" of the peak figure.
  std::vector<LiveRow> live;
  for (const Row& row : rows)
    live.push_back({row_head(row), row.rank ? &row.rank->peak.by_category : nullptr,
                    row.rank ? &row.rank->predicted.peak_by_category : nullptr});
  print_live_at_peak(head, live, options, os);

  // The device beyond the allocator (cuda): every rank, since no two hold the same.
  std::vector<OutsideRow> outside;
  for (const DataParallelRun* run : runs)
    for (const RankRecord& r : run->ranks)
      outside.push_back({row_head(Row{run, &r, "rank " + std::to_string(r.rank), &r}), &r.allocator});
  print_outside_pool(head, outside, options, os);
}

}  // namespace

void print_data_parallel_tables(const std::vector<const DataParallelRun*>& runs, const ResultDocument& doc,
                                const TableOptions& options, std::ostream& os) {
  for (const auto& group : group_runs(runs)) print_group(group, doc, options, os);
}

}  // namespace shardscope::tables
