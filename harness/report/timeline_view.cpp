#include "harness/report/timeline_view.hpp"

#include <cctype>

namespace shardscope {
namespace {

using nlohmann::json;

double number_or(const json& v, double fallback) { return v.is_number() ? v.get<double>() : fallback; }

std::int64_t bytes_or_zero(const json& v) {
  if (v.is_number_integer()) return v.get<std::int64_t>();
  if (v.is_number_float()) return static_cast<std::int64_t>(v.get<double>());
  return 0;
}

// Column i of a memory row (after t) -> index in kCategoryNames, -1 when unknown.
std::vector<int> column_map(const json& timeline) {
  std::vector<int> map;
  const auto it = timeline.find("categories");
  if (it == timeline.end() || !it->is_array()) {
    for (std::size_t i = 0; i < kCategoryNames.size(); ++i) map.push_back(static_cast<int>(i));
    return map;
  }
  for (const json& name : *it) {
    int found = -1;
    for (std::size_t i = 0; i < kCategoryNames.size(); ++i)
      if (name.is_string() && name.get<std::string>() == kCategoryNames[i]) found = static_cast<int>(i);
    map.push_back(found);
  }
  return map;
}

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

std::int64_t TimelineSample::total() const {
  std::int64_t sum = 0;
  for (std::int64_t b : bytes) sum += b;
  return sum;
}

TimelineView read_timeline(const json& record) {
  TimelineView view;
  if (!record.is_object()) return view;
  const auto tl = record.find("timeline");
  if (tl == record.end() || !tl->is_object()) return view;
  view.present = true;
  view.coalesced = tl->value("coalesced", json(false)) == json(true);
  view.merged_events = static_cast<std::int64_t>(number_or(tl->value("merged_events", json(0)), 0.0));
  view.dropped_spans = static_cast<std::int64_t>(number_or(tl->value("dropped_spans", json(0)), 0.0));
  view.dropped_marks = static_cast<std::int64_t>(number_or(tl->value("dropped_marks", json(0)), 0.0));
  const std::vector<int> map = column_map(*tl);
  if (const auto mem = tl->find("memory"); mem != tl->end() && mem->is_array()) {
    view.memory.reserve(mem->size());
    for (const json& row : *mem) {
      if (!row.is_array() || row.empty() || !row[0].is_number()) continue;
      TimelineSample s;
      s.t_ms = row[0].get<double>();
      for (std::size_t c = 0; c + 1 < row.size() && c < map.size(); ++c)
        if (map[c] >= 0) s.bytes[static_cast<std::size_t>(map[c])] = bytes_or_zero(row[c + 1]);
      view.memory.push_back(s);
    }
  }
  if (const auto marks = tl->find("marks"); marks != tl->end() && marks->is_array()) {
    for (const json& m : *marks) {
      if (!m.is_array() || m.empty() || !m[0].is_number()) continue;
      ViewMark mark;
      mark.t_ms = m[0].get<double>();
      if (m.size() > 1 && m[1].is_string()) mark.phase = m[1].get<std::string>();
      if (m.size() > 2 && m[2].is_string()) mark.place = m[2].get<std::string>();
      view.marks.push_back(std::move(mark));
    }
  }
  if (const auto spans = tl->find("spans"); spans != tl->end() && spans->is_array()) {
    for (const json& s : *spans) {
      if (!s.is_object()) continue;
      const json start = s.value("start_ms", json()), end = s.value("end_ms", json());
      if (!start.is_number() || !end.is_number()) continue;
      TimelineSpan span;
      if (const auto n = s.find("name"); n != s.end() && n->is_string()) span.name = n->get<std::string>();
      span.start_ms = start.get<double>();
      span.end_ms = end.get<double>();
      span.depth = static_cast<int>(number_or(s.value("depth", json(0)), 0.0));
      if (const auto b = s.find("bytes"); b != s.end() && b->is_number()) span.bytes = bytes_or_zero(*b);
      view.spans.push_back(std::move(span));
    }
  }
  return view;
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
