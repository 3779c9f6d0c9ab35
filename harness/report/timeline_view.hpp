// What the report's charts and the trace need of a rank's or stage's timeline
// (TimelineRecord, harness/records/result.hpp, read and checked with the rest of the
// result): a memory row's total, its last step, and the action a profiler span's name
// stands for. Pure: nothing here draws.
#pragma once

#include <cstdint>
#include <string>

#include "harness/records/result.hpp"

namespace shardscope {

// The bytes of every category in a row of timeline.memory.
std::int64_t row_total(const TimelineRow& row);

// The timeline's last "step" span (the latest start; of spans starting together, the
// later listed), or null when it has none: the step the record's figures come from.
const TimelineSpanRecord* last_step(const TimelineRecord& timeline);

// A span named like a pipeline action: "F(m=2)", "B(m=0, chunk 1)", "W(m=3,c=1)".
struct SpanAction {
  char kind = 0;  // 'F', 'B' or 'W'; 0 when the name is not an action
  int microbatch = -1;
  int chunk = 0;
};
SpanAction parse_span_action(const std::string& name);

}  // namespace shardscope
