// Lowering a schedule to per-stage programs with explicit p2p groups.
//
// Sends rendezvous: a send completes only once the receiver has posted its receive
// (NCCL, and MPI beyond the eager limit). Megatron's rule for 1F1B, "before an action,
// send the previous output and receive this action's input in one group", then
// deadlocks interleaved 1F1B as soon as M > S: a stage blocks sending a gradient that
// its neighbour will only ask for several actions later, while the neighbour blocks
// sending it something. So a send waits in its stage's outbox until the receiver asks.
//
// How: run the lists in unit-time rounds. In a round every stage whose inputs were
// produced in an earlier round runs its next action; a cross-stage input is received in
// that round, and the producer sends it in the same round. Pairing each send with its
// receive in one round makes the programs deadlock-free under grouped semantics (by
// induction on rounds), and each channel's FIFO order is the round order. Rounds in
// which a stage only sends are then merged into its next action's group, so step i
// holds action i and one final step holds the sends after the last action. For 1F1B
// and GPipe this gives Megatron's groups; for interleaved 1F1B it delays sends, as
// Megatron's interleaved code does by sending an iteration's outputs together.
#include <algorithm>

#include "harness/pipeline/lower.hpp"
#include "shardscope/check.hpp"

namespace shardscope {

namespace schedules {

namespace {

struct Dep {
  ActionKind kind;
  int vstage;
};

// Actions whose output `a` on virtual stage k needs (same micro-batch).
std::vector<Dep> deps_of(const Schedule& s, const Action& a, int k) {
  switch (a.kind) {
    case ActionKind::F:
      if (k > 0) return {{ActionKind::F, k - 1}};
      return {};
    case ActionKind::B:
      if (k + 1 < virtual_stages(s)) return {{ActionKind::F, k}, {ActionKind::B, k + 1}};
      return {{ActionKind::F, k}};
    case ActionKind::W:
      return {{ActionKind::B, k}};
  }
  return {};
}

std::string describe(Payload p, int m, int vstage) {
  return std::string(payload_name(p)) + "(m=" + std::to_string(m) +
         ", vstage " + std::to_string(vstage) + ")";
}

}  // namespace

std::string lower_or_explain(const Schedule& s, std::vector<StageProgram>& programs) {
  const int S = s.stages, M = s.microbatches, V = virtual_stages(s);
  if (static_cast<int>(s.actions.size()) != S) return "the lists do not have one entry per stage";
  for (int st = 0; st < S; ++st)
    for (const Action& a : s.actions[st])
      if (a.microbatch < 0 || a.microbatch >= M || a.chunk < 0 || a.chunk >= s.chunks)
        return "stage " + std::to_string(st) + " lists " + to_string(a) + ", out of range";
  // done[kind][vstage][m] = round in which that action ran, -1 before
  std::vector<std::vector<std::vector<int>>> done(3, std::vector<std::vector<int>>(V, std::vector<int>(M, -1)));
  std::vector<std::size_t> next(S, 0);
  // Groups of the current merged step, per stage: sends and receives kept apart so that
  // a group lists its sends first.
  std::vector<std::vector<P2p>> sends(S), recvs(S);
  programs.assign(S, {});

  for (int round = 0;; ++round) {
    std::vector<int> ran(S, 0);
    bool all_done = true;
    std::string waits;
    for (int st = 0; st < S; ++st) {
      if (next[st] == s.actions[st].size()) continue;
      all_done = false;
      const Action& a = s.actions[st][next[st]];
      const int k = vstage_of(s, st, a.chunk);
      bool ready = true;
      for (const Dep& d : deps_of(s, a, k)) {
        const int r = done[static_cast<int>(d.kind)][d.vstage][a.microbatch];
        if (r >= 0 && r < round) continue;
        ready = false;
        const int from = stage_of_vstage(s, d.vstage);
        waits += (waits.empty() ? "" : "; ") + std::string("stage ") + std::to_string(st) + " waits before " +
                 to_string(a) + " for " +
                 (from == st ? to_string({d.kind, a.microbatch, chunk_of_vstage(s, d.vstage)}) + " on itself"
                             : describe(d.kind == ActionKind::F ? Payload::activation : Payload::gradient,
                                        a.microbatch, d.vstage) +
                                   " from stage " + std::to_string(from));
      }
      if (!ready) continue;
      ran[st] = 1;
      for (const Dep& d : deps_of(s, a, k)) {
        const int from = stage_of_vstage(s, d.vstage);
        if (from == st) continue;  // local data, no message
        const Payload p = d.kind == ActionKind::F ? Payload::activation : Payload::gradient;
        recvs[st].push_back({false, from, p, a.microbatch, d.vstage});
        sends[from].push_back({true, st, p, a.microbatch, d.vstage});
      }
    }
    if (all_done) break;
    if (std::count(ran.begin(), ran.end(), 1) == 0) return "deadlock: " + waits;
    for (int st = 0; st < S; ++st) {
      if (!ran[st]) continue;
      const Action& a = s.actions[st][next[st]++];
      done[static_cast<int>(a.kind)][vstage_of(s, st, a.chunk)][a.microbatch] = round;
      ProgramStep step;
      step.comm = std::move(sends[st]);
      step.comm.insert(step.comm.end(), recvs[st].begin(), recvs[st].end());
      step.action = a;
      programs[st].push_back(std::move(step));
      sends[st].clear();
      recvs[st].clear();
    }
  }
  // Final step: sends requested after the stage's last action (receives cannot be left).
  for (int st = 0; st < S; ++st) programs[st].push_back({std::move(sends[st]), std::nullopt});
  return "";
}

}  // namespace schedules

std::vector<StageProgram> lower(const Schedule& s) {
  std::vector<StageProgram> programs;
  const std::string why = schedules::lower_or_explain(s, programs);
  SHARDSCOPE_REQUIRE(why.empty(), "schedule '" + std::string(schedule_name(s.kind)) + "' cannot run: " + why);
  return programs;
}

}  // namespace shardscope
