// A rank or stage record's "timeline" (per-rank memory over time, phase marks and
// profiler spans), read defensively for the report's charts: a missing or malformed
// timeline reads as absent, a missing field as empty. Pure: nothing here draws.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardscope/category.hpp"

namespace shardscope {

struct TimelineSample {
  double t_ms = 0.0;  // ms since the run started
  std::array<std::int64_t, kCategoryCount> bytes{};  // per category, kCategoryNames order, after the event
  std::int64_t total() const;
};

struct ViewMark {
  double t_ms = 0.0;
  std::string phase;  // "forward", "backward", "optimizer", ...
  std::string place;  // "layer 3", "unit 0", ...
};

struct TimelineSpan {
  std::string name;  // "step", "forward layer 3", "all_reduce 2105344 B", "F(m=2)", ...
  double start_ms = 0.0;
  double end_ms = 0.0;
  int depth = 0;
  std::int64_t bytes = -1;  // -1: none given
};

struct TimelineView {
  bool present = false;          // the record has a "timeline" object
  bool coalesced = false;        // the tracker merged events past its limit
  std::int64_t merged_events = 0;
  std::int64_t dropped_spans = 0;  // the oldest spans and marks the tracker let go past its limit
  std::int64_t dropped_marks = 0;
  std::vector<TimelineSample> memory;  // in the record's order (time order)
  std::vector<ViewMark> marks;
  std::vector<TimelineSpan> spans;
};

// `record`: one element of a run's "ranks" or "stages". Columns of "memory" are mapped
// through "categories" (the default order when it is absent); unknown categories are
// ignored, rows that do not start with a number are skipped.
TimelineView read_timeline(const nlohmann::json& record);

// A span named like a pipeline action: "F(m=2)", "B(m=0, chunk 1)", "W(m=3,c=1)".
struct SpanAction {
  char kind = 0;  // 'F', 'B' or 'W'; 0 when the name is not an action
  int microbatch = -1;
  int chunk = 0;
};
SpanAction parse_span_action(const std::string& name);

}  // namespace shardscope
