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
#include "harness/report/table_parts.hpp"
#include "harness/report/timeline_view.hpp"
#include "shardscope/category.hpp"
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

json metadata(const char* name, std::int64_t pid, const json& args) {
  return {{"name", name}, {"ph", "M"}, {"ts", 0}, {"pid", pid}, {"tid", pid}, {"args", args}};
}

// The threads of a track's spans (a non-blocking collective's, --overlap on) are tid
// kTrackTid + lane: spans of one track may overlap one another, and slices of one thread
// must nest, so each span takes the lowest lane whose last span has ended.
constexpr std::int64_t kTrackTid = 50000;

// The ranges on the process's own thread (tid = pid); each track's spans on lanes of
// their own, named "<track>" and "<track> 2", ... (thread_name metadata).
void add_spans(const std::vector<TimelineSpanRecord>& spans, std::int64_t pid, json& events) {
  std::vector<std::int64_t> lane_end;  // per lane, the end of its last span (ns)
  std::vector<std::string> lane_track;
  for (const TimelineSpanRecord& s : spans) {
    const std::int64_t t0 = ms_to_ns(s.start_ms);
    const std::int64_t t1 = std::max(ms_to_ns(s.end_ms), t0);
    json args = {{"depth", s.depth}};
    if (s.bytes) args["bytes"] = *s.bytes;
    std::int64_t tid = pid;
    if (s.track) {
      std::size_t lane = 0;
      while (lane < lane_end.size() && (lane_track[lane] != *s.track || lane_end[lane] > t0)) ++lane;
      if (lane == lane_end.size()) {
        lane_end.push_back(0);
        lane_track.push_back(*s.track);
        const std::string name = lane == 0 || lane_track[lane] != lane_track[0]
                                     ? *s.track
                                     : *s.track + " " + std::to_string(lane + 1);
        json meta = metadata("thread_name", pid, {{"name", name}});
        meta["tid"] = pid + kTrackTid + static_cast<std::int64_t>(lane);
        events.push_back(std::move(meta));
      }
      lane_end[lane] = t1;
      tid = pid + kTrackTid + static_cast<std::int64_t>(lane);
      args["track"] = *s.track;
    }
    events.push_back({{"name", s.name},
                      {"cat", s.track ? "collective" : "range"},
                      {"ph", "X"},
                      {"ts", ns_to_us(t0)},
                      {"dur", ns_to_us(t1 - t0)},
                      {"pid", pid},
                      {"tid", tid},
                      {"args", std::move(args)}});
  }
}

// Counter events in row order (the timeline's rows are in time order; a row earlier
// than its predecessor, which a well-formed timeline never has, is clamped so every
// counter track stays monotonic).
// The instant `peak N B` marks: the first of the last step at the record's measured peak
// (what the JSON and the report call the peak: each step resets it), else, when the
// record has no step or no row at its peak, the first at the highest total of the run.
void add_memory(const TimelineRecord& timeline, std::int64_t measured, std::int64_t pid, json& events) {
  const TimelineSpanRecord* step = last_step(timeline);
  const std::int64_t step_ns = step ? ms_to_ns(step->start_ms) : -1;
  std::int64_t last_ns = 0;
  std::int64_t peak = -1, peak_ns = 0;        // the highest total of the run, first instant
  std::int64_t matched = -1, matched_ns = 0;  // the record's peak in the last step
  for (const TimelineRow& row : timeline.memory) {
    const std::int64_t t = std::max(ms_to_ns(row.t_ms), last_ns);
    last_ns = t;
    json args = json::object();
    std::int64_t total = 0;
    for (int c = 0; c < kCategoryCount; ++c) {
      args[kCategoryNames[c]] = row.bytes[c];
      total += row.bytes[c];
    }
    events.push_back({{"name", "memory"}, {"ph", "C"}, {"ts", ns_to_us(t)}, {"pid", pid}, {"tid", pid},
                      {"args", std::move(args)}});
    events.push_back({{"name", "memory total"}, {"ph", "C"}, {"ts", ns_to_us(t)}, {"pid", pid}, {"tid", pid},
                      {"args", {{"bytes", total}}}});
    if (total > peak) {
      peak = total;
      peak_ns = t;
    }
    if (step_ns >= 0 && matched < 0 && t >= step_ns && total == measured) {
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

std::string emulated(const RunPlace& place) { return place.emulated ? " (emulated)" : ""; }

}  // namespace

std::string trace_process_name(const DataParallelRun& run, const RankRecord& rank) {
  std::string name = run.strategy + " W=" + std::to_string(run.world);
  if (const std::optional<StrategyKind> kind = find_strategy(run.strategy); kind && shards_by_unit(*kind)) {
    name += " " + tables::units_setting(run);
    if (run.prefetch == 0) name += " prefetch=0";
  }
  if (run.ddp_bucket == "copy") name += " bucket=copy";
  return name + " rank " + std::to_string(rank.rank) + emulated(run.place);
}

std::string trace_process_name(const PipelineRun& run, const StageRecord& stage) {
  std::string name = run.schedule + " S=" + std::to_string(run.world) + " M=" + std::to_string(run.microbatches);
  if (run.chunks > 1) name += " chunks=" + std::to_string(run.chunks);
  return name + " stage " + std::to_string(stage.stage) + emulated(run.place);
}

namespace {

// The events of one record of run `i` (process name, spans, memory), after those of the
// records before it.
void add_record_events(const std::string& name, std::int64_t rank, std::int64_t peak_total,
                       const TimelineRecord& timeline, std::size_t i, PidAllocator& pids, std::int64_t& order,
                       json& events) {
  const std::int64_t pid = pids.take(i, rank);
  events.push_back(metadata("process_name", pid, {{"name", name}}));
  events.push_back(metadata("process_sort_index", pid, {{"sort_index", order++}}));
  events.push_back(metadata("thread_name", pid, {{"name", "ranges"}}));
  add_spans(timeline.spans, pid, events);
  add_memory(timeline, peak_total, pid, events);
}

json other_data(const ResultDocument& doc) {
  json other = {{"generator", "shardscope"}, {"schema", kResultSchema}};
  if (doc.provenance.command) other["command"] = *doc.provenance.command;
  return other;
}

// Every rank or stage record of the document, in order, with its timeline from
// `timeline_of` (skipped runs have none): `each(events)` gets each record's events.
void for_each_record(const ResultDocument& doc, const TimelineSource& timeline_of,
                     const std::function<void(const json&)>& each) {
  PidAllocator pids;
  std::int64_t order = 0;  // processes listed in the document's order, whatever their pids
  // Record j of run i (a rank, or a stage numbered `number`) of `run`.
  const auto add = [&](std::size_t i, std::size_t j, const auto& run, const auto& record, std::int64_t number) {
    const std::optional<TimelineRecord> timeline = timeline_of(i, j);
    if (!timeline) return;
    json events = json::array();
    add_record_events(trace_process_name(run, record), number, record.peak.total, *timeline, i, pids, order, events);
    each(events);
  };
  for (std::size_t i = 0; i < doc.runs.size(); ++i) {
    if (const auto* dp = std::get_if<DataParallelRun>(&doc.runs[i])) {
      for (std::size_t j = 0; j < dp->ranks.size(); ++j) add(i, j, *dp, dp->ranks[j], dp->ranks[j].rank);
    } else if (const auto* pp = std::get_if<PipelineRun>(&doc.runs[i])) {
      for (std::size_t j = 0; j < pp->stages.size(); ++j) add(i, j, *pp, pp->stages[j], pp->stages[j].stage);
    }
  }
}

}  // namespace

TimelineSource own_timelines(const ResultDocument& doc) {
  return [&doc](std::size_t run, std::size_t member) -> std::optional<TimelineRecord> {
    if (const auto* dp = std::get_if<DataParallelRun>(&doc.runs[run])) return dp->ranks[member].timeline;
    if (const auto* pp = std::get_if<PipelineRun>(&doc.runs[run])) return pp->stages[member].timeline;
    return std::nullopt;
  };
}

json trace_document(const ResultDocument& doc) {
  json events = json::array();
  for_each_record(doc, own_timelines(doc), [&](const json& record_events) {
    for (const json& e : record_events) events.push_back(e);
  });
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}, {"otherData", other_data(doc)}};
}

void write_trace_text(const ResultDocument& doc, const TimelineSource& timeline_of, const TextSink& sink) {
  // As json_text(trace_document(doc)) writes it: keys in order, events one record at a time.
  sink("{\"displayTimeUnit\":\"ms\",\"otherData\":" + json_text(other_data(doc)) + ",\"traceEvents\":[");
  bool first = true;
  for_each_record(doc, timeline_of, [&](const json& events) {
    for (const json& event : events) {
      sink((first ? "" : ",") + json_text(event));
      first = false;
    }
  });
  sink("]}\n");
}

void write_trace_file(const std::string& path, const ResultDocument& doc) {
  write_file_atomic_streamed(path, [&](const TextSink& sink) { write_trace_text(doc, own_timelines(doc), sink); });
}

}  // namespace shardscope
