#include "harness/report/csv.hpp"

#include <cstdio>
#include <filesystem>
#include <vector>

#include "harness/report/json_io.hpp"
#include "harness/report/table_parts.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;

constexpr const char* kEol = "\r\n";

// Integers as digits, other numbers with 9 significant digits, none as "".
std::string value(std::int64_t v) { return std::to_string(v); }
std::string value(double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
template <typename T>
std::string value(const std::optional<T>& v) {
  return v ? value(*v) : std::string();
}

void add_row(std::string& out, const std::vector<std::string>& fields) {
  for (std::size_t i = 0; i < fields.size(); ++i) out += (i ? "," : "") + csv_field(fields[i]);
  out += kEol;
}

}  // namespace

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string data_parallel_csv(const ResultDocument& doc) {
  std::string out;
  add_row(out, {"world", "strategy", "units", "prefetch", "ddp_bucket", "rank", "category", "resting_bytes",
                "peak_bytes_at_peak", "predicted_resting_bytes", "peak_total", "peak_phase", "peak_where",
                "comm_bytes_per_step", "step_ms_median", "predicted_peak_bytes_at_peak", "comm_ms_median", "engine",
                "precision", "checkpoint", "accumulate", "no_sync"});
  for (const RunRecord& record : doc.runs) {
    const auto* run = std::get_if<DataParallelRun>(&record);
    if (!run) continue;
    // --units and --prefetch shape zero2 and zero3, --ddp-bucket the others.
    const bool units = tables::uses_units(*run);
    const std::string layers_per_unit = run->layers_per_unit ? value(std::int64_t{*run->layers_per_unit}) : "all";
    for (const RankRecord& rank : run->ranks)
      for (int c = 0; c < kCategoryCount; ++c)
        add_row(out, {value(std::int64_t{run->world}), run->strategy, units ? layers_per_unit : "",
                      units ? value(std::int64_t{run->prefetch}) : "", units ? "" : run->ddp_bucket,
                      value(std::int64_t{rank.rank}), kCategoryNames[c], value(rank.resting.bytes[c]),
                      value(rank.peak.by_category.bytes[c]), value(rank.predicted.resting.bytes[c]),
                      value(rank.peak.total), rank.peak.phase, rank.peak.where, value(rank.comm_bytes),
                      value(rank.step_ms.median), value(rank.predicted.peak_by_category.bytes[c]),
                      value(rank.comm_ms.median), run->engine, run->precision, run->model.checkpoint.value_or("none"),
                      value(std::int64_t{run->accumulate}), run->no_sync ? "true" : "false"});
  }
  return out;
}

std::string pipeline_csv(const ResultDocument& doc) {
  std::string out;
  add_row(out, {"schedule", "stages", "microbatches", "chunks", "stage", "layers", "saved_peak_live_tensors",
                "saved_peak_live_bytes", "saved_total", "saved_before_first_backward", "predicted_peak_live_tensors",
                "predicted_peak_live_bytes", "resting_total", "peak_total", "busy_ms", "step_ms_median",
                "bubble_wall", "bubble_replayed", "bubble_theory", "predicted_resting_total",
                "predicted_peak_total", "p2p_bytes_per_step", "predicted_p2p_bytes_per_step", "precision"});
  for (const RunRecord& record : doc.runs) {
    const auto* run = std::get_if<PipelineRun>(&record);
    if (!run) continue;
    for (const StageRecord& st : run->stages)
      add_row(out, {run->schedule, value(std::int64_t{run->world}), value(std::int64_t{run->microbatches}),
                    value(std::int64_t{run->chunks}), value(std::int64_t{st.stage}), tables::stage_layers(st),
                    value(st.saved.peak_live_tensors), value(st.saved.peak_live_bytes), value(st.saved.total_tensors),
                    value(st.saved.before_first_backward), value(st.predicted.saved.peak_live_tensors),
                    value(st.predicted.saved.peak_live_bytes), value(st.resting.total), value(st.peak.total),
                    value(st.busy_ms), value(st.step_ms.median), value(st.bubble_fraction),
                    value(st.bubble_fraction_replayed), value(st.bubble_fraction_theory),
                    value(st.predicted.resting_total), value(st.predicted.peak_total), value(st.comm_bytes),
                    value(st.predicted.comm_bytes), run->precision});
  }
  return out;
}

const std::vector<std::string>& csv_file_names() {
  static const std::vector<std::string> names = {"data_parallel.csv", "pipeline.csv"};
  return names;
}

std::vector<std::string> csv_paths(const std::string& dir) {
  std::vector<std::string> paths;
  for (const std::string& name : csv_file_names()) paths.push_back((fs::path(dir) / name).string());
  return paths;
}

std::vector<fs::path> check_csv_dir(const std::string& dir) {
  if (dir.empty()) throw UsageError("--csv DIR: needs a directory");
  return check_dir_usable(dir, "--csv DIR", csv_file_names());
}

void write_csv_files(const ResultDocument& doc, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RunError("cannot create '" + dir + "' for --csv: " + ec.message());
  const std::vector<std::string> paths = csv_paths(dir);
  write_file_atomic(paths[0], data_parallel_csv(doc));
  write_file_atomic(paths[1], pipeline_csv(doc));
}

}  // namespace shardscope
