#include "harness/report/timeline_view.hpp"

#include <cctype>

namespace shardscope {
namespace {

// The digits after `key` in `s`, or -1.
int int_after(const std::string& s, const std::string& key) {
  const std::size_t at = s.find(key);
  if (at == std::string::npos) return -1;
  std::size_t i = at + key.size();
  if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) return -1;
  int v = 0;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && v < 100000000; ++i)
    v = v * 10 + (s[i] - '0');
  return v;
}

}  // namespace

std::int64_t row_total(const TimelineRow& row) {
  std::int64_t sum = 0;
  for (std::int64_t b : row.bytes) sum += b;
  return sum;
}

const TimelineSpanRecord* last_step(const TimelineRecord& timeline) {
  const TimelineSpanRecord* step = nullptr;
  for (const TimelineSpanRecord& s : timeline.spans)
    if (s.name == "step" && (!step || s.start_ms >= step->start_ms)) step = &s;
  return step;
}

SpanAction parse_span_action(const std::string& name) {
  SpanAction a;
  if (name.size() < 4 || name[1] != '(' || (name[0] != 'F' && name[0] != 'B' && name[0] != 'W')) return a;
  const int m = int_after(name, "m=");
  if (m < 0) return a;
  a.kind = name[0];
  a.microbatch = m;
  int c = int_after(name, "chunk ");
  if (c < 0) c = int_after(name, "c=");
  a.chunk = c < 0 ? 0 : c;
  return a;
}

}  // namespace shardscope
