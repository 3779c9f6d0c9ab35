// The trace printer (trace.hpp): rank timelines -> Chrome trace events.
#include "harness/report/trace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/table.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// Processes of run i are pid = (i + 1) * kPidStride + rank: above any rank (worlds go
// to 65,536), and never 0, which Perfetto treats as the kernel's idle process.
constexpr std::int64_t kPidStride = 100000;
constexpr std::int64_t kPidLimit = 2147483647;  // pids are read as 32-bit

// Hands out each (run, rank) its pid: the formula's, unless that is taken (a record
// repeating a rank) or out of range (no integer rank, one outside [0, kPidStride), or a
// run past the 21,473rd); then the lowest free pid from 1 up, below every formula pid.
class PidAllocator {
 public:
  std::int64_t take(std::size_t run_index, std::int64_t rank) {
    std::int64_t pid = -1;
    if (rank >= 0 && rank < kPidStride && run_index < static_cast<std::size_t>(kPidLimit / kPidStride - 1))
      pid = (static_cast<std::int64_t>(run_index) + 1) * kPidStride + rank;
    if (pid < 0 || used_.count(pid)) {
      while (used_.count(spare_)) ++spare_;
      pid = spare_;
    }
    used_.insert(pid);
    return pid;
  }

 private:
  std::set<std::int64_t> used_;
  std::int64_t spare_ = 1;
};

// ms (as the timeline writes them, exact to the ns) -> integer ns -> µs with the ns as
// 3 decimals: Perfetto rounds ts * 1000 back to the same ns, so a child slice never
// sticks out of its parent by a rounding step.
std::int64_t ms_to_ns(double ms) { return std::llround(ms * 1e6); }
double ns_to_us(std::int64_t ns) { return static_cast<double>(ns) / 1e3; }

bool number(const json& j, const char* key, double* out) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  *out = it->get<double>();
  return true;
}

std::string field_text(const json& j, const char* key) {
  const json* v = cells::at(j, {key});
  return v ? cells::text(v) : std::string();
}

json metadata(const char* name, std::int64_t pid, const json& args) {
  return {{"name", name}, {"ph", "M"}, {"ts", 0}, {"pid", pid}, {"tid", pid}, {"args", args}};
}

void add_spans(const json& spans, std::int64_t pid, json& events) {
  if (!spans.is_array()) return;
  for (const json& s : spans) {
    double start = 0.0, end = 0.0;
    if (!s.is_object() || !number(s, "start_ms", &start) || !number(s, "end_ms", &end)) continue;
    const std::int64_t t0 = ms_to_ns(start);
    const std::int64_t t1 = std::max(ms_to_ns(end), t0);
    json args = json::object();
    if (s.contains("depth")) args["depth"] = s["depth"];
    if (s.contains("bytes")) args["bytes"] = s["bytes"];
    events.push_back({{"name", s.value("name", std::string("?"))},
                      {"cat", "range"},
                      {"ph", "X"},
                      {"ts", ns_to_us(t0)},
                      {"dur", ns_to_us(t1 - t0)},
                      {"pid", pid},
                      {"tid", pid},
                      {"args", std::move(args)}});
  }
}

// Counter events in row order (the timeline's rows are in time order; a row earlier
// than its predecessor, which a well-formed timeline never has, is clamped so every
// counter track stays monotonic).
// The start of the record's last "step" span, in ns (-1 when it has none).
std::int64_t last_step_start_ns(const json& timeline) {
  std::int64_t start = -1;
  const json* spans = cells::at(timeline, {"spans"});
  if (!spans || !spans->is_array()) return start;
  for (const json& s : *spans) {
    double t = 0.0;
    if (s.is_object() && s.value("name", std::string()) == "step" && number(s, "start_ms", &t))
      start = std::max(start, ms_to_ns(t));
  }
  return start;
}

// The instant `peak N B` marks: the first of the last step at the record's measured peak
// (what the JSON and the report call the peak: each step resets it), else, when the
// record says nothing usable, the first at the highest total of the whole run.
void add_memory(const json& timeline, const json& record, std::int64_t pid, json& events) {
  const json* cats = cells::at(timeline, {"categories"});
  const json* rows = cells::at(timeline, {"memory"});
  if (!cats || !cats->is_array() || !rows || !rows->is_array()) return;
  const std::size_t n = cats->size();
  const json* measured = cells::at(record, {"peak", "total"});
  const std::int64_t step_ns = last_step_start_ns(timeline);
  const bool by_record = measured && measured->is_number_integer() && step_ns >= 0;
  std::int64_t last_ns = 0;
  std::int64_t peak = -1, peak_ns = 0;        // the highest total of the run, first instant
  std::int64_t matched = -1, matched_ns = 0;  // the record's peak in the last step
  for (const json& row : *rows) {
    if (!row.is_array() || row.size() != n + 1 || !row[0].is_number()) continue;
    const std::int64_t t = std::max(ms_to_ns(row[0].get<double>()), last_ns);
    last_ns = t;
    json args = json::object();
    std::int64_t total = 0;
    for (std::size_t c = 0; c < n; ++c) {
      const std::int64_t b = row[c + 1].is_number() ? row[c + 1].get<std::int64_t>() : 0;
      args[(*cats)[c].is_string() ? (*cats)[c].get<std::string>() : std::to_string(c)] = b;
      total += b;
    }
    events.push_back({{"name", "memory"}, {"ph", "C"}, {"ts", ns_to_us(t)}, {"pid", pid}, {"tid", pid},
                      {"args", std::move(args)}});
    events.push_back({{"name", "memory total"}, {"ph", "C"}, {"ts", ns_to_us(t)}, {"pid", pid}, {"tid", pid},
                      {"args", {{"bytes", total}}}});
    if (total > peak) {
      peak = total;
      peak_ns = t;
    }
    if (by_record && matched < 0 && t >= step_ns && total == measured->get<std::int64_t>()) {
      matched = total;
      matched_ns = t;
    }
  }
  if (matched >= 0) {
    peak = matched;
    peak_ns = matched_ns;
  }
  if (peak >= 0)
    events.push_back({{"name", "peak " + cells::group_digits(peak) + " B"},
                      {"ph", "i"},
                      {"s", "p"},
                      {"ts", ns_to_us(peak_ns)},
                      {"pid", pid},
                      {"tid", pid},
                      {"args", {{"bytes", peak}}}});
}

}  // namespace

std::string trace_process_name(const json& run, const json& record) {
  const bool pipeline = is_pipeline(run);
  std::string name;
  if (pipeline) {
    name = field_text(run, "schedule") + " S=" + field_text(run, "world");
    if (const std::string m = field_text(run, "microbatches"); !m.empty()) name += " M=" + m;
    if (run.value("chunks", 1) > 1) name += " chunks=" + field_text(run, "chunks");
    name += " stage " + field_text(record, "stage");
  } else {
    const std::string strategy = field_text(run, "strategy");
    name = strategy + " W=" + field_text(run, "world");
    if (const std::optional<StrategyKind> kind = find_strategy(strategy); kind && shards_by_unit(*kind)) {
      name += " units=" + field_text(run, "layers_per_unit");
      if (run.value("prefetch", 1) == 0) name += " prefetch=0";
    }
    if (run.value("ddp_bucket", std::string("view")) == "copy") name += " bucket=copy";
    name += " rank " + field_text(record, "rank");
  }
  if (run.value("emulated", false) == true) name += " (emulated)";
  return name;
}

namespace {

// The records of a run that go into the trace: its ranks or stages; none when skipped.
const json* traced_records(const json& run) {
  if (!run.is_object() || run.value("skipped", false) == true) return nullptr;
  const json* records = cells::at(run, {run.contains("stages") ? "stages" : "ranks"});
  return records && records->is_array() ? records : nullptr;
}

// The events of one record of run `i` (process name, spans, memory), after those of the
// records before it.
void add_record_events(const json& run, const json& record, std::size_t i, PidAllocator& pids, std::int64_t& order,
                       json& events) {
  const json* timeline = record.is_object() ? cells::at(record, {"timeline"}) : nullptr;
  if (!timeline || !timeline->is_object()) return;
  std::int64_t rank = -1;  // none: the allocator gives a free pid
  for (const char* key : {"rank", "stage"})
    if (const auto it = record.find(key); it != record.end() && it->is_number_integer()) {
      rank = it->get<std::int64_t>();
      break;
    }
  const std::int64_t pid = pids.take(i, rank);
  events.push_back(metadata("process_name", pid, {{"name", trace_process_name(run, record)}}));
  events.push_back(metadata("process_sort_index", pid, {{"sort_index", order++}}));
  events.push_back(metadata("thread_name", pid, {{"name", "ranges"}}));
  if (const json* spans = cells::at(*timeline, {"spans"})) add_spans(*spans, pid, events);
  add_memory(*timeline, record, pid, events);
}

json other_data(const json& doc) {
  json other = {{"generator", "shardscope"}, {"schema", doc.value("schema", json())}};
  if (const json* command = cells::at(doc, {"provenance", "command"})) other["command"] = *command;
  return other;
}

std::size_t run_count(const json& doc) {
  const json* runs = cells::at(doc, {"runs"});
  return runs && runs->is_array() ? runs->size() : 0;
}

}  // namespace

json trace_document(const json& doc) {
  json events = json::array();
  PidAllocator pids;
  std::int64_t order = 0;  // processes listed in the document's order, whatever their pids
  for (std::size_t i = 0; i < run_count(doc); ++i) {
    const json& run = doc["runs"][i];
    if (const json* records = traced_records(run))
      for (const json& record : *records) add_record_events(run, record, i, pids, order, events);
  }
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", other_data(doc)}};
}

void write_trace_text(const json& doc, const std::function<json(const json&)>& whole_record, const TextSink& sink) {
  // As json_text(trace_document(doc)) writes it: keys in order, events one record at a time.
  sink("{\"displayTimeUnit\":\"ms\",\"otherData\":" + json_text(other_data(doc)) + ",\"traceEvents\":[");
  PidAllocator pids;
  std::int64_t order = 0;
  bool first = true;
  for (std::size_t i = 0; i < run_count(doc); ++i) {
    const json& run = doc["runs"][i];
    const json* records = traced_records(run);
    for (std::size_t j = 0; records && j < records->size(); ++j) {
      json events = json::array();
      add_record_events(run, whole_record((*records)[j]), i, pids, order, events);
      for (const json& event : events) {
        sink((first ? "" : ",") + json_text(event));
        first = false;
      }
    }
  }
  sink("]}\n");
}

void write_trace_file(const std::string& path, const json& doc) {
  write_file_atomic_streamed(path, [&](const TextSink& sink) {
    write_trace_text(doc, [](const json& record) { return record; }, sink);
  });
}

}  // namespace shardscope
