// The schedule validator: proves a schedule complete and ordered, and proves its
// lowered programs correct and free of deadlock under the grouped point-to-point
// semantics the executor uses (Communicator::p2p). The program checks do not trust
// lower(): they would catch a wrong lowering as well as a wrong schedule.
#include <algorithm>
#include <cstdint>
#include <unordered_set>
#include <string>
#include <vector>

#include "harness/pipeline/lower.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {

namespace {

std::string str(int i) { return std::to_string(i); }

std::string describe(const P2p& op) {
  return std::string(payload_name(op.payload)) +
         "(m=" + str(op.microbatch) + ", vstage " + str(op.vstage) + ")";
}

std::string describe_group(const std::vector<P2p>& group) {
  std::string out = "{";
  for (std::size_t j = 0; j < group.size(); ++j)
    out += (j ? ", " : "") + std::string(group[j].is_send ? "send " : "recv ") + describe(group[j]) +
           (group[j].is_send ? " to stage " : " from stage ") + str(group[j].peer);
  return out + "}";
}

// Every action present once, B after F, W after B, same-stage data (S == 1) in order.
std::string check_lists(const Schedule& s) {
  const int S = s.stages, M = s.microbatches, V = s.chunks;
  if (S < 1 || M < 1 || V < 1) return "no stages, micro-batches or chunks";
  if (static_cast<int>(s.actions.size()) != S)
    return "lists " + str(static_cast<int>(s.actions.size())) + " stages, expected " + str(S);
  for (int stage = 0; stage < S; ++stage) {
    const std::string where = "stage " + str(stage) + ": ";
    const auto& list = s.actions[stage];
    // pos[kind][chunk][m] = index in the list, -1 when absent
    std::vector<std::vector<std::vector<int>>> pos(3, std::vector<std::vector<int>>(V, std::vector<int>(M, -1)));
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      if (a.microbatch < 0 || a.microbatch >= M || a.chunk < 0 || a.chunk >= V)
        return where + to_string(a) + " is out of range (M=" + str(M) + ", chunks=" + str(V) + ")";
      if (a.kind == ActionKind::W && !s.split_backward)
        return where + to_string(a) + ": a W, but this schedule's B does the whole backward";
      int& p = pos[static_cast<int>(a.kind)][a.chunk][a.microbatch];
      if (p >= 0) return where + to_string(a) + " runs twice (positions " + str(p) + " and " + str(i) + ")";
      p = i;
    }
    for (int c = 0; c < V; ++c)
      for (int m = 0; m < M; ++m) {
        for (int kind = 0; kind < (s.split_backward ? 3 : 2); ++kind)
          if (pos[kind][c][m] < 0) return where + to_string({static_cast<ActionKind>(kind), m, c}) + " is missing";
        const int f = pos[0][c][m], b = pos[1][c][m], w = pos[2][c][m];
        if (b < f) return where + to_string({ActionKind::B, m, c}) + " runs before " + to_string({ActionKind::F, m, c});
        if (s.split_backward && w < b)
          return where + to_string({ActionKind::W, m, c}) + " runs before " + to_string({ActionKind::B, m, c});
        // Neighbouring pieces on this same stage (S == 1) pass data locally: in order.
        const int k = vstage_of(s, stage, c);
        if (k > 0 && stage_of_vstage(s, k - 1) == stage && pos[0][chunk_of_vstage(s, k - 1)][m] > f)
          return where + to_string({ActionKind::F, m, c}) + " runs before " +
                 to_string({ActionKind::F, m, chunk_of_vstage(s, k - 1)}) + ", whose output it needs";
        if (k + 1 < virtual_stages(s) && stage_of_vstage(s, k + 1) == stage && pos[1][chunk_of_vstage(s, k + 1)][m] > b)
          return where + to_string({ActionKind::B, m, c}) + " runs before " +
                 to_string({ActionKind::B, m, chunk_of_vstage(s, k + 1)}) + ", whose gradient it needs";
      }
  }
  return "";
}

// Each program runs its stage's list; a send carries an output its stage already
// produced, to the stage that consumes it; an action's cross-stage input was received
// at or before its step.
std::string check_data(const Schedule& s, const std::vector<StageProgram>& programs) {
  const int S = s.stages, V = virtual_stages(s);
  if (static_cast<int>(programs.size()) != S) return "lowered to " + str(static_cast<int>(programs.size())) + " programs";
  // Keys of what ran and what arrived, so each lookup is O(1) (a schedule can hold
  // hundreds of thousands of actions).
  auto action_key = [](const Action& a) {
    return (static_cast<std::uint64_t>(a.kind) << 60) | (static_cast<std::uint64_t>(a.chunk) << 32) |
           static_cast<std::uint64_t>(static_cast<std::uint32_t>(a.microbatch));
  };
  auto input_key = [](Payload p, int microbatch, int vstage) {
    return (static_cast<std::uint64_t>(p) << 60) | (static_cast<std::uint64_t>(vstage) << 32) |
           static_cast<std::uint64_t>(static_cast<std::uint32_t>(microbatch));
  };
  for (int st = 0; st < S; ++st) {
    const auto& prog = programs[st];
    std::vector<Action> ran;  // actions before the current step, in order
    std::unordered_set<std::uint64_t> ran_keys, received;
    for (std::size_t i = 0; i < prog.size(); ++i) {
      auto where = [&] { return "stage " + str(st) + " step " + str(static_cast<int>(i)) + ": "; };
      for (const P2p& op : prog[i].comm) {
        if (op.peer < 0 || op.peer >= S || op.peer == st || op.vstage < 0 || op.vstage >= V)
          return where() + describe_group(prog[i].comm) + " has a bad peer or vstage";
        if (!op.is_send) {
          received.insert(input_key(op.payload, op.microbatch, op.vstage));
          continue;
        }
        const bool act = op.payload == Payload::activation;
        const Action made{act ? ActionKind::F : ActionKind::B, op.microbatch, chunk_of_vstage(s, op.vstage)};
        const int consumer = act ? op.vstage + 1 : op.vstage - 1;
        if (stage_of_vstage(s, op.vstage) != st || consumer < 0 || consumer >= V ||
            stage_of_vstage(s, consumer) != op.peer || ran_keys.count(action_key(made)) == 0)
          return where() + "sends " + describe(op) + " to stage " + str(op.peer) + ", which is not " +
                 to_string(made) + "'s output for that stage, or is sent before it ran";
      }
      if (!prog[i].action) continue;
      const Action& a = *prog[i].action;
      const int k = vstage_of(s, st, a.chunk);
      const int from = a.kind == ActionKind::F ? k - 1 : a.kind == ActionKind::B ? k + 1 : -1;
      if (from >= 0 && from < V && stage_of_vstage(s, from) != st) {
        const Payload p = a.kind == ActionKind::F ? Payload::activation : Payload::gradient;
        if (received.count(input_key(p, a.microbatch, from)) == 0)
          return where() + to_string(a) + " runs before receiving its input from stage " +
                 str(stage_of_vstage(s, from));
      }
      ran.push_back(a);
      ran_keys.insert(action_key(a));
    }
    if (ran != s.actions[st]) return "stage " + str(st) + "'s program does not run its list in order";
  }
  return "";
}

struct OpRef {
  int step;
  int index;
};

// Pair the n-th send from a to b with the n-th receive at b from a (FIFO, as NCCL and
// MPI match them) and record, for every op, the step of its partner.
std::string match_channels(const std::vector<StageProgram>& programs,
                           std::vector<std::vector<std::vector<int>>>& partner_step) {
  const int S = static_cast<int>(programs.size());
  // sends[a][b], recvs[b][a]: ops in program order
  std::vector<std::vector<std::vector<OpRef>>> sends(S, std::vector<std::vector<OpRef>>(S)), recvs = sends;
  partner_step.assign(S, {});
  for (int st = 0; st < S; ++st) {
    partner_step[st].resize(programs[st].size());
    for (int i = 0; i < static_cast<int>(programs[st].size()); ++i) {
      const auto& group = programs[st][i].comm;
      partner_step[st][i].assign(group.size(), -1);
      for (int j = 0; j < static_cast<int>(group.size()); ++j)
        (group[j].is_send ? sends : recvs)[st][group[j].peer].push_back({i, j});
    }
  }
  auto what_for = [&](int st, int step) {
    const auto& a = programs[st][step].action;
    return a ? " (before " + to_string(*a) + ")" : std::string(" (after its last action)");
  };
  for (int a = 0; a < S; ++a)
    for (int b = 0; b < S; ++b) {
      const auto& tx = sends[a][b];
      const auto& rx = recvs[b][a];
      for (std::size_t q = 0; q < std::min(tx.size(), rx.size()); ++q) {
        const P2p& so = programs[a][tx[q].step].comm[tx[q].index];
        const P2p& ro = programs[b][rx[q].step].comm[rx[q].index];
        if (so.payload != ro.payload || so.microbatch != ro.microbatch || so.vstage != ro.vstage)
          return "stage " + str(a) + "'s message " + str(static_cast<int>(q) + 1) + " to stage " + str(b) + " is " +
                 describe(so) + what_for(a, tx[q].step) + ", but stage " + str(b) + "'s receive " +
                 str(static_cast<int>(q) + 1) + " from stage " + str(a) + " expects " + describe(ro) +
                 what_for(b, rx[q].step);
        partner_step[a][tx[q].step][tx[q].index] = rx[q].step;
        partner_step[b][rx[q].step][rx[q].index] = tx[q].step;
      }
      if (tx.size() != rx.size())
        return "stage " + str(a) + " sends " + str(static_cast<int>(tx.size())) + " messages to stage " + str(b) +
               ", which receives " + str(static_cast<int>(rx.size()));
    }
  return "";
}

// Run the programs. A stage's current group is posted; it completes when every op's
// partner is posted (the partner stage is at or past the partner's step).
std::string run_groups(const std::vector<StageProgram>& programs,
                       const std::vector<std::vector<std::vector<int>>>& partner_step) {
  const int S = static_cast<int>(programs.size());
  std::vector<int> at(S, 0);  // current step per stage; == size when finished
  auto finished = [&](int st) { return at[st] == static_cast<int>(programs[st].size()); };
  auto can_complete = [&](int st) {
    const auto& group = programs[st][at[st]].comm;
    for (std::size_t j = 0; j < group.size(); ++j)
      if (at[group[j].peer] < partner_step[st][at[st]][j]) return false;
    return true;
  };
  for (;;) {
    bool progressed = false, done = true;
    for (int st = 0; st < S; ++st) {
      for (; !finished(st) && can_complete(st); ++at[st]) progressed = true;
      done = done && finished(st);
    }
    if (done) return "";
    if (progressed) continue;
    std::string msg = "p2p deadlock:";
    for (int st = 0; st < S; ++st) {
      msg += (st ? "; stage " : " stage ") + str(st);
      if (finished(st)) {
        msg += " finished";
        continue;
      }
      const auto& step = programs[st][at[st]];
      msg += " blocked " + (step.action ? "before " + to_string(*step.action) : std::string("after its last action")) +
             " on " + describe_group(step.comm);
    }
    return msg;
  }
}

}  // namespace

ValidationResult validate_programs(const Schedule& s, const std::vector<StageProgram>& programs) {
  std::string err = check_data(s, programs);
  std::vector<std::vector<std::vector<int>>> partner_step;
  if (err.empty()) err = match_channels(programs, partner_step);
  if (err.empty()) err = run_groups(programs, partner_step);
  if (err.empty()) return {true, ""};
  return {false, "schedule '" + std::string(schedule_name(s.kind)) + "': " + err};
}

ValidationResult validate(const Schedule& s) {
  std::string err = check_lists(s);
  std::vector<StageProgram> programs;
  if (err.empty()) err = schedules::lower_or_explain(s, programs);
  if (!err.empty()) return {false, "schedule '" + std::string(schedule_name(s.kind)) + "': " + err};
  return validate_programs(s, programs);
}

}  // namespace shardscope
