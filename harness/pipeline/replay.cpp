// Replay: when would each action run if it took `duration` and messages were free?
// Gives the bubble a schedule implies for given compute times, independent of how
// many cores the ranks really had (docs/design.md §4: "replayed" bubble).
#include <algorithm>
#include <vector>

#include "shardscope/check.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {

ReplayResult replay(const Schedule& s,
                    const std::function<double(int stage, const Action&)>& duration) {
  const int S = s.stages, M = s.microbatches, V = virtual_stages(s);
  // end_time[kind][vstage][m]; negative until the action has run
  std::vector<std::vector<std::vector<double>>> end_time(
      3, std::vector<std::vector<double>>(V, std::vector<double>(M, -1.0)));
  auto end_of = [&](ActionKind kind, int k, int m) { return end_time[static_cast<int>(kind)][k][m]; };

  for (int st = 0; st < S; ++st)
    for (const Action& a : s.actions.at(st))
      SHARDSCOPE_REQUIRE(a.microbatch >= 0 && a.microbatch < M && a.chunk >= 0 && a.chunk < s.chunks,
                         "replay: stage " + std::to_string(st) + " lists " + to_string(a) +
                             ", out of range (run validate() first)");

  ReplayResult r;
  r.busy.assign(S, 0.0);
  r.bubble_fraction.assign(S, 0.0);
  r.action_spans.resize(S);
  std::vector<std::size_t> next(S, 0);
  std::vector<double> free_at(S, 0.0);

  // Inputs of `a` on `stage`: the latest end among them, or -1 if one has not run yet.
  auto inputs_ready = [&](int stage, const Action& a) {
    const int k = vstage_of(s, stage, a.chunk), m = a.microbatch;
    double ready = 0.0;
    auto need = [&](ActionKind kind, int vk) {
      const double t = end_of(kind, vk, m);
      ready = (t < 0 || ready < 0) ? -1.0 : std::max(ready, t);
    };
    if (a.kind == ActionKind::F && k > 0) need(ActionKind::F, k - 1);
    if (a.kind == ActionKind::B) {
      need(ActionKind::F, k);
      if (k + 1 < V) need(ActionKind::B, k + 1);
    }
    if (a.kind == ActionKind::W) need(ActionKind::B, k);
    return ready;
  };

  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int st = 0; st < S; ++st) {
      const auto& list = s.actions[st];
      while (next[st] < list.size()) {
        const Action& a = list[next[st]];
        const double ready = inputs_ready(st, a);
        if (ready < 0) break;
        const double start = std::max(ready, free_at[st]);
        const double end = start + duration(st, a);
        end_time[static_cast<int>(a.kind)][vstage_of(s, st, a.chunk)][a.microbatch] = end;
        r.action_spans[st].push_back({start, end});
        r.busy[st] += end - start;
        free_at[st] = end;
        ++next[st];
        progressed = true;
      }
    }
  }
  for (int st = 0; st < S; ++st) {
    SHARDSCOPE_REQUIRE(next[st] == s.actions[st].size(),
                       "replay: schedule '" + std::string(schedule_name(s.kind)) + "' stage " + std::to_string(st) +
                           " cannot run " + to_string(s.actions[st][next[st]]) +
                           ": its inputs never come (run validate() first)");
    r.makespan = std::max(r.makespan, free_at[st]);
  }
  for (int st = 0; st < S; ++st)
    r.bubble_fraction[st] = r.makespan > 0 ? 1.0 - r.busy[st] / r.makespan : 0.0;
  return r;
}

}  // namespace shardscope
