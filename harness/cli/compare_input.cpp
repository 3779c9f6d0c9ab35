#include "harness/cli/compare_input.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <string_view>

#include "harness/report/cells.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/table.hpp"
#include "shardscope/category.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

constexpr const char* kByteCount = "a byte count";

// The value as the file has it, cut short: a whole rank record would drown the line.
std::string shown(const json& v) {
  std::string text = json_text(v);
  if (text.size() <= 60) return text;
  std::size_t cut = 57;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a UTF-8 character
  return text.substr(0, cut) + "...";
}

std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

// `at` is "'a.json': runs[0] (ddp W=2)"; `path` the field inside the run, empty for the
// run itself. `v` null: the field is missing.
[[noreturn]] void refuse(const std::string& at, const std::string& path, const json* v, const std::string& wanted,
                         const std::string& why = {}) {
  const std::string field = path.empty() ? at : at + ": " + path;
  if (!v) throw UsageError(field + " is missing; expected " + wanted);
  throw UsageError(field + " is " + shown(*v) + ", not " + wanted + why);
}

// A whole number from 0 to 2^63 - 1: figures are read into int64 and subtracted. nlohmann
// keeps a number with a fraction or beyond 2^64 as a double, one from 2^63 as unsigned.
bool is_count(const json& v, std::string* why) {
  if (v.is_number_unsigned()) {
    if (v.get<std::uint64_t>() <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return true;
    *why = " (beyond 2^63 - 1)";
  } else if (v.is_number_integer()) {
    if (v.get<std::int64_t>() >= 0) return true;
    *why = " (negative)";
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    *why = d < 0.0 ? " (negative)" : d >= 0x1p63 ? " (beyond 2^63 - 1)" : " (not an integer)";
  }
  return false;
}

bool is_positive(const json& v) {
  std::string why;
  return is_count(v, &why) && v.get<std::int64_t>() > 0;
}

// parent[key] when present: a whole number >= 0 (`wanted` names what it counts).
void check_count(const std::string& at, const json& parent, const std::string& path, const char* key,
                 const char* wanted = kByteCount) {
  const json* v = cells::at(parent, {key});
  std::string why;
  if (v && !is_count(*v, &why)) refuse(at, join(path, key), v, wanted, why);
}

// parent[key] when present, which must be an object; nullptr when absent or null.
const json* check_object(const std::string& at, const json& parent, const std::string& path, const char* key) {
  const json* v = cells::at(parent, {key});
  if (v && !v->is_object()) refuse(at, join(path, key), v, "an object");
  return v;
}

void check_categories(const std::string& at, const json& bytes, const std::string& path) {
  for (const std::string_view c : kCategoryNames) check_count(at, bytes, path, std::string(c).c_str());
  check_count(at, bytes, path, "total");
}

// step_ms: null (no step timed) or {"median", "min"}; compare reads the median.
void check_step_time(const std::string& at, const json& member, const std::string& path) {
  const json* step = check_object(at, member, path, "step_ms");
  const json* median = step ? cells::at(*step, {"median"}) : nullptr;
  if (median && (!median->is_number() || !std::isfinite(median->get<double>()) || median->get<double>() < 0.0))
    refuse(at, join(path, "step_ms.median"), median, "a time in ms (a number >= 0)");
}

// One rank (data parallel) or stage (pipeline) record: `id` is "rank" or "stage".
void check_member(const std::string& at, const json& member, const std::string& path, const char* id) {
  if (!member.is_object()) refuse(at, path, &member, std::string("a ") + id + " record (an object)");
  const json* number = cells::at(member, {id});
  std::string why;
  if (!number || !is_count(*number, &why)) refuse(at, join(path, id), number, std::string("a ") + id + " number", why);
  if (const json* resting = check_object(at, member, path, "resting"))
    check_categories(at, *resting, join(path, "resting"));
  if (const json* peak = check_object(at, member, path, "peak")) {
    check_count(at, *peak, join(path, "peak"), "total");
    if (const json* by = check_object(at, *peak, join(path, "peak"), "by_category"))
      check_categories(at, *by, join(path, "peak.by_category"));
  }
  check_count(at, member, path, "comm_bytes");
  if (const json* saved = check_object(at, member, path, "saved")) {
    check_count(at, *saved, join(path, "saved"), "peak_live_tensors", "a count");
    check_count(at, *saved, join(path, "saved"), "peak_live_bytes");
  }
  check_step_time(at, member, path);
}

// The ranks (stages) are matched by number: a number given twice would match either.
void check_members(const std::string& at, const json& run, bool pipeline) {
  const char* list_key = pipeline ? "stages" : "ranks";
  const char* id = pipeline ? "stage" : "rank";
  const json* list = cells::at(run, {list_key});
  if (!list || !list->is_array()) refuse(at, list_key, list, std::string("an array of ") + id + " records");
  std::set<std::int64_t> seen;
  for (std::size_t i = 0; i < list->size(); ++i) {
    const std::string path = std::string(list_key) + "[" + std::to_string(i) + "]";
    check_member(at, (*list)[i], path, id);
    const json& number = (*list)[i][id];
    if (!seen.insert(number.get<std::int64_t>()).second)
      refuse(at, join(path, id), &number, std::string("a ") + id + " number no other record has");
  }
}

// The model is part of the match and, when runs differ only in it, of the label.
void check_model(const std::string& at, const json& run) {
  const json* model = cells::at(run, {"model"});
  if (!model || !model->is_object()) refuse(at, "model", model, "an object (layers, width, batch, ...)");
  for (const char* key : {"layers", "width", "batch"}) {
    const json* v = cells::at(*model, {key});
    if (!v || !is_positive(*v)) refuse(at, join("model", key), v, "a positive integer");
  }
  for (const char* key : {"activation", "loss"})
    if (const json* v = cells::at(*model, {key}); v && !v->is_string()) refuse(at, join("model", key), v, "a name");
}

// The optional fields runs are matched on: a wrong type would only ever fail to match.
void check_setup(const std::string& at, const json& run) {
  if (const json* v = cells::at(run, {"layers_per_unit"}); v && !is_positive(*v) && *v != "all")
    refuse(at, "layers_per_unit", v, "a positive integer or \"all\"");
  check_count(at, run, "", "prefetch", "a whole number >= 0");
  if (const json* v = cells::at(run, {"ddp_bucket"}); v && !v->is_string()) refuse(at, "ddp_bucket", v, "a name");
  if (const json* v = cells::at(run, {"bucket_mb"});
      v && (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0.0))
    refuse(at, "bucket_mb", v, "a number >= 0");
  for (const char* key : {"microbatches", "chunks"})
    if (const json* v = cells::at(run, {key}); v && !is_positive(*v)) refuse(at, key, v, "a positive integer");
  if (const json* split = cells::at(run, {"split"})) {
    if (!split->is_array()) refuse(at, "split", split, "an array of layer counts");
    std::string why;
    for (std::size_t i = 0; i < split->size(); ++i) {
      const json& layers = (*split)[i];
      if (!is_count(layers, &why)) refuse(at, "split[" + std::to_string(i) + "]", &layers, "a layer count", why);
    }
  }
}

void check_run(const std::string& file_at, const json& run, std::size_t index) {
  const std::string at = file_at + "runs[" + std::to_string(index) + "]";
  if (!run.is_object()) refuse(at, "", &run, "a run (an object)");
  const json* skipped = cells::at(run, {"skipped"});
  if (skipped && !skipped->is_boolean()) refuse(at, "skipped", skipped, "true or false");
  if (skipped && skipped->get<bool>()) return;  // compare passes it over
  const json* kind = cells::at(run, {"kind"});
  if (!kind || (*kind != "data_parallel" && *kind != "pipeline"))
    refuse(at, "kind", kind, "\"data_parallel\" or \"pipeline\"");
  const bool pipeline = *kind == "pipeline";
  const char* name = pipeline ? "schedule" : "strategy";
  if (const json* v = cells::at(run, {name}); !v || !v->is_string() || v->get<std::string>().empty())
    refuse(at, name, v, std::string("a ") + name + " name");
  if (const json* v = cells::at(run, {"world"}); !v || !is_positive(*v)) refuse(at, "world", v, "a positive integer");
  // The label is made of the fields above, so from here on the run is named by it too.
  const std::string named = at + " (" + run_label(run) + ")";
  check_model(named, run);
  check_setup(named, run);
  check_members(named, run, pipeline);
}

}  // namespace

void check_compare_input(const json& doc, const std::string& path) {
  const json& runs = doc.at("runs");
  for (std::size_t i = 0; i < runs.size(); ++i) check_run("'" + path + "': ", runs[i], i);
}

}  // namespace shardscope
