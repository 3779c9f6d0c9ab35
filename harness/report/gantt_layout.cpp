#include "harness/report/gantt_layout.hpp"

#include <algorithm>
#include <map>
#include <tuple>

#include "harness/report/timeline_view.hpp"

namespace shardscope {
namespace {

using Key = std::tuple<char, int, int>;  // kind, micro-batch, chunk

// The span from, to of every stage, and the layout's window.
void close_window(GanttLayout& g) {
  g.from_ms = g.stages.front().from_ms;
  g.to_ms = g.stages.front().to_ms;
  for (const GanttStage& s : g.stages) g.from_ms = std::min(g.from_ms, s.from_ms), g.to_ms = std::max(g.to_ms, s.to_ms);
}

// The shift of stage s's clock against stage s-1 (already placed), from the messages
// between their virtual stages; 0 when the clocks already agree or nothing pairs up.
double clock_shift(const GanttStage& prev, const GanttStage& cur, int stage, int stages) {
  std::map<Key, const GanttAction*> before, here;
  for (const GanttAction& a : prev.actions) before[{a.kind, a.microbatch, a.chunk}] = &a;
  for (const GanttAction& a : cur.actions) here[{a.kind, a.microbatch, a.chunk}] = &a;
  double lo = -1e300, hi = 1e300;
  for (const auto& [key, a] : here) {
    const auto [kind, m, chunk] = key;
    const int k = chunk * stages + stage;  // its producer (F) or consumer (B) is k - 1
    if (k < 1 || (kind != 'F' && kind != 'B')) continue;
    const auto other = before.find({kind, m, (k - 1) / stages});
    if (other == before.end()) continue;
    if (kind == 'F') lo = std::max(lo, other->second->end_ms - a->start_ms);
    else hi = std::min(hi, other->second->start_ms - a->end_ms);
  }
  if (lo <= 0.0 && 0.0 <= hi) return 0.0;
  if (lo <= hi) return lo > 0.0 ? lo : hi;
  if (lo == -1e300 || hi == 1e300) return 0.0;
  return (lo + hi) / 2.0;
}

}  // namespace

GanttLayout measured_layout(const std::vector<const TimelineRecord*>& timelines) {
  GanttLayout g;
  for (const TimelineRecord* v : timelines) {
    if (!v) return {};
    const TimelineSpanRecord* step = last_step(*v);
    GanttStage st;
    double lo = 1e300, hi = -1e300;
    for (const TimelineSpanRecord& s : v->spans) {
      const SpanAction a = parse_span_action(s.name);
      if (!a.kind || (step && (s.end_ms <= step->start_ms || s.start_ms >= step->end_ms))) continue;
      st.actions.push_back({a.kind, a.microbatch, a.chunk, s.start_ms, s.end_ms});
      lo = std::min(lo, s.start_ms);
      hi = std::max(hi, s.end_ms);
    }
    if (st.actions.empty()) return {};
    st.from_ms = step ? step->start_ms : lo;
    st.to_ms = step ? step->end_ms : hi;
    g.stages.push_back(std::move(st));
  }
  if (g.stages.empty()) return {};
  const int S = static_cast<int>(g.stages.size());
  for (int s = 1; s < S; ++s) {
    GanttStage& st = g.stages[static_cast<std::size_t>(s)];
    const double shift = clock_shift(g.stages[static_cast<std::size_t>(s) - 1], st, s, S);
    if (shift == 0.0) continue;
    g.shifted = true;
    st.clock_shift_ms = shift;
    st.from_ms += shift;
    st.to_ms += shift;
    for (GanttAction& a : st.actions) a.start_ms += shift, a.end_ms += shift;
  }
  g.source = GanttLayout::Source::measured;
  close_window(g);
  return g;
}

GanttLayout replayed_layout(const std::vector<const StageRecord*>& stages) {
  GanttLayout g;
  const int S = static_cast<int>(stages.size());
  int chunks = 1;
  std::vector<std::vector<double>> ms(stages.size());
  for (std::size_t s = 0; s < stages.size(); ++s) {
    if (!stages[s] || !stages[s]->action_ms || stages[s]->action_ms->empty()) return {};
    GanttStage st;
    for (const ActionTime& a : *stages[s]->action_ms) {
      if (a.action.empty()) return {};
      chunks = std::max(chunks, a.chunk + 1);
      st.actions.push_back({a.action[0], a.microbatch, a.chunk, 0.0, 0.0});
      ms[s].push_back(std::max(0.0, a.ms));
    }
    g.stages.push_back(std::move(st));
  }
  if (g.stages.empty()) return {};
  const int V = S * chunks;
  std::map<Key, double> end_of;  // (kind, vstage, micro-batch) -> end
  std::vector<std::size_t> next(g.stages.size(), 0);
  std::vector<double> free_at(g.stages.size(), 0.0);
  // Runs stage s's next action if its inputs are done (or regardless, when `force`).
  auto step = [&](std::size_t s, bool force) {
    GanttAction& a = g.stages[s].actions[next[s]];
    const int k = a.chunk * S + static_cast<int>(s);
    std::vector<Key> needs;
    if (a.kind == 'F' && k > 0) needs.emplace_back('F', k - 1, a.microbatch);
    if (a.kind == 'B') needs.emplace_back('F', k, a.microbatch);
    if (a.kind == 'B' && k + 1 < V) needs.emplace_back('B', k + 1, a.microbatch);
    if (a.kind == 'W') needs.emplace_back('B', k, a.microbatch);
    double ready = 0.0;
    for (const Key& need : needs) {
      const auto it = end_of.find(need);
      if (it == end_of.end() && !force) return false;
      if (it != end_of.end()) ready = std::max(ready, it->second);
    }
    a.start_ms = std::max(ready, free_at[s]);
    a.end_ms = a.start_ms + ms[s][next[s]];
    end_of[{a.kind, k, a.microbatch}] = a.end_ms;
    free_at[s] = a.end_ms;
    ++next[s];
    return true;
  };
  for (bool left = true; left;) {
    bool progressed = false;
    for (std::size_t s = 0; s < g.stages.size(); ++s)
      while (next[s] < g.stages[s].actions.size() && step(s, false)) progressed = true;
    left = false;
    for (std::size_t s = 0; s < g.stages.size(); ++s) left = left || next[s] < g.stages[s].actions.size();
    if (left && !progressed)  // lists that do not fit the rules: unblock the first stuck stage
      for (std::size_t s = 0; s < g.stages.size(); ++s)
        if (next[s] < g.stages[s].actions.size()) {
          step(s, true);
          break;
        }
  }
  const double makespan = *std::max_element(free_at.begin(), free_at.end());
  for (GanttStage& st : g.stages) st.from_ms = 0.0, st.to_ms = makespan;
  g.source = GanttLayout::Source::replayed;
  close_window(g);
  return g;
}

}  // namespace shardscope
