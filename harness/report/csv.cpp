#include "harness/report/csv.hpp"

#include <cstdio>
#include <filesystem>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/table.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/timeline_view.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kEol = "\r\n";

// Integers as digits, other numbers with 9 significant digits, strings as they are,
// anything missing or null as "".
std::string value(const json* v) {
  if (!v || v->is_null()) return {};
  if (v->is_number_integer()) return json_text(*v);
  if (v->is_number_float()) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.9g", v->get<double>());
    return buf;
  }
  if (v->is_string()) return v->get<std::string>();
  if (v->is_boolean()) return v->get<bool>() ? "true" : "false";
  return json_text(*v);
}

void add_row(std::string& out, const std::vector<std::string>& fields) {
  for (std::size_t i = 0; i < fields.size(); ++i) out += (i ? "," : "") + csv_field(fields[i]);
  out += kEol;
}

// The runs of one kind that completed, in document order.
std::vector<const json*> runs_of(const json& doc, const std::string& kind) {
  std::vector<const json*> out;
  const json* runs = cells::at(doc, {"runs"});
  if (!runs || !runs->is_array()) return out;
  for (const json& run : *runs) {
    if (!run.is_object()) continue;
    const json* s = cells::at(run, {"skipped"});
    if (s && s->is_boolean() && s->get<bool>()) continue;
    const json* k = cells::at(run, {"kind"});
    const std::string run_kind = k && k->is_string() ? k->get<std::string>()
                                 : run.contains("stages") ? "pipeline"
                                                          : "data_parallel";
    if (run_kind == kind) out.push_back(&run);
  }
  return out;
}

// Communication bytes per step: the rank's comm_bytes, else the sum over kinds.
std::string comm_bytes(const json& rank) {
  if (const json* b = cells::at(rank, {"comm_bytes"})) return value(b);
  const json* comm = cells::at(rank, {"comm"});
  if (!comm || !comm->is_object()) return {};
  std::int64_t sum = 0;
  bool any = false;
  for (const auto& item : comm->items()) {
    std::int64_t b = 0;
    if (cells::as_int(cells::at(item.value(), {"bytes"}), &b)) sum += b, any = true;
  }
  return any ? std::to_string(sum) : std::string();
}

}  // namespace

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string out = "\"";
  for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string data_parallel_csv(const json& doc) {
  std::string out;
  add_row(out, {"world", "strategy", "units", "prefetch", "ddp_bucket", "rank", "category", "resting_bytes",
                "peak_bytes_at_peak", "predicted_resting_bytes", "peak_total", "peak_phase", "peak_where",
                "comm_bytes_per_step", "step_ms_median", "predicted_peak_bytes_at_peak", "comm_ms_median"});
  for (const json* run : runs_of(doc, "data_parallel")) {
    const json* ranks = cells::at(*run, {"ranks"});
    if (!ranks || !ranks->is_array()) continue;
    const bool units = uses_units(*run);
    for (const json& rank : *ranks) {
      if (!rank.is_object()) continue;
      for (const char* category : kCategoryNames)
        add_row(out, {value(cells::at(*run, {"world"})), value(cells::at(*run, {"strategy"})),
                      units ? value(cells::at(*run, {"layers_per_unit"})) : "",
                      units ? value(cells::at(*run, {"prefetch"})) : "",
                      units ? "" : value(cells::at(*run, {"ddp_bucket"})), value(cells::at(rank, {"rank"})), category,
                      value(cells::at(rank, {"resting", category})),
                      value(cells::at(rank, {"peak", "by_category", category})),
                      value(cells::at(rank, {"predicted", "resting", category})),
                      value(cells::at(rank, {"peak", "total"})), value(cells::at(rank, {"peak", "phase"})),
                      value(cells::at(rank, {"peak", "where"})), comm_bytes(rank),
                      value(cells::at(rank, {"step_ms", "median"})),
                      value(cells::at(rank, {"predicted", "peak_by_category", category})),
                      value(cells::at(rank, {"comm_ms", "median"}))});
    }
  }
  return out;
}

std::string pipeline_csv(const json& doc) {
  std::string out;
  add_row(out, {"schedule", "stages", "microbatches", "chunks", "stage", "layers", "saved_peak_live_tensors",
                "saved_peak_live_bytes", "saved_total", "saved_before_first_backward", "predicted_peak_live_tensors",
                "predicted_peak_live_bytes", "resting_total", "peak_total", "busy_ms", "step_ms_median",
                "bubble_wall", "bubble_replayed", "bubble_theory", "predicted_resting_total",
                "predicted_peak_total", "p2p_bytes_per_step", "predicted_p2p_bytes_per_step"});
  for (const json* run : runs_of(doc, "pipeline")) {
    const json* stages = cells::at(*run, {"stages"});
    if (!stages || !stages->is_array()) continue;
    for (const json& st : *stages) {
      if (!st.is_object()) continue;
      add_row(out, {value(cells::at(*run, {"schedule"})), value(cells::at(*run, {"world"})),
                    value(cells::at(*run, {"microbatches"})), value(cells::at(*run, {"chunks"})),
                    value(cells::at(st, {"stage"})), stage_layers(st),
                    value(cells::at(st, {"saved", "peak_live_tensors"})),
                    value(cells::at(st, {"saved", "peak_live_bytes"})),
                    value(cells::at(st, {"saved", "total_tensors"})),
                    value(cells::at(st, {"saved", "before_first_backward"})),
                    value(cells::at(st, {"predicted", "peak_live_tensors"})),
                    value(cells::at(st, {"predicted", "peak_live_bytes"})), value(cells::at(st, {"resting", "total"})),
                    value(cells::at(st, {"peak", "total"})), value(cells::at(st, {"busy_ms"})),
                    value(cells::at(st, {"step_ms", "median"})), value(cells::at(st, {"bubble_fraction"})),
                    value(cells::at(st, {"bubble_fraction_replayed"})),
                    value(cells::at(st, {"bubble_fraction_theory"})),
                    value(cells::at(st, {"predicted", "resting_total"})), value(cells::at(st, {"predicted", "peak_total"})),
                    value(cells::at(st, {"comm_bytes"})), value(cells::at(st, {"predicted", "comm_bytes"}))});
    }
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

void write_csv_files(const json& doc, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RunError("cannot create '" + dir + "' for --csv: " + ec.message());
  const std::vector<std::string> paths = csv_paths(dir);
  write_file_atomic(paths[0], data_parallel_csv(doc));
  write_file_atomic(paths[1], pipeline_csv(doc));
}

}  // namespace shardscope
