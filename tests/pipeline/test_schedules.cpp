// Pipeline schedules (docs/design.md §4): generated lists validate, memory and bubbles match the
// closed forms, the lowering is what the executor relies on, and broken schedules or
// programs are rejected with messages that say where.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "shardscope/check.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {
namespace {

struct Shape {
  std::string name;
  int S, M, v;
};

// Every valid (schedule, S, M, v) with S <= 8, M <= 32, v <= 4.
std::vector<Shape> all_shapes() {
  std::vector<Shape> out;
  for (int S = 1; S <= 8; ++S)
    for (int M = 1; M <= 32; ++M) {
      for (const char* name : {"gpipe", "1f1b", "zb-h1"}) out.push_back({name, S, M, 1});
      if (M % S == 0)
        for (int v = 2; v <= 4; ++v) out.push_back({"interleaved-1f1b", S, M, v});
      if (M >= 2 * S - 1) out.push_back({"zbv", S, M, 2});
    }
  return out;
}

std::string label(const Shape& c) {
  return c.name + " S=" + std::to_string(c.S) + " M=" + std::to_string(c.M) + " v=" + std::to_string(c.v);
}

// F = 1; B = 2 when it is the whole backward; B = W = 1 when split (same work per micro-batch).
double unit_time(const Schedule& s, const Action& a) {
  if (a.kind == ActionKind::F || s.split_backward) return 1.0;
  return 2.0;
}

// Live count from F to B only (what B frees), for comparing zb-h1 with 1f1b.
int peak_until_b(const Schedule& s, int stage) {
  int live = 0, peak = 0;
  for (const Action& a : s.actions[stage]) {
    if (a.kind == ActionKind::F) peak = std::max(peak, ++live);
    if (a.kind == ActionKind::B) --live;
  }
  return peak;
}

// The per-action lowering (Megatron's non-interleaved rule: before each action, send the
// previous action's output and receive this one's input), built by hand to feed
// validate_programs.
std::vector<StageProgram> lower_just_in_time(const Schedule& s) {
  const int V = virtual_stages(s);
  std::vector<StageProgram> out(s.stages);
  for (int st = 0; st < s.stages; ++st) {
    const auto& list = s.actions[st];
    out[st].resize(list.size() + 1);
    for (std::size_t i = 0; i <= list.size(); ++i) {
      auto& comm = out[st][i].comm;
      if (i > 0) {
        const Action& a = list[i - 1];
        const int k = vstage_of(s, st, a.chunk);
        if (a.kind == ActionKind::F && k + 1 < V)
          comm.push_back({true, stage_of_vstage(s, k + 1), Payload::activation, a.microbatch, k});
        if (a.kind == ActionKind::B && k > 0)
          comm.push_back({true, stage_of_vstage(s, k - 1), Payload::gradient, a.microbatch, k});
      }
      if (i < list.size()) {
        const Action& a = list[i];
        const int k = vstage_of(s, st, a.chunk);
        if (a.kind == ActionKind::F && k > 0)
          comm.push_back({false, stage_of_vstage(s, k - 1), Payload::activation, a.microbatch, k - 1});
        if (a.kind == ActionKind::B && k + 1 < V)
          comm.push_back({false, stage_of_vstage(s, k + 1), Payload::gradient, a.microbatch, k + 1});
        out[st][i].action = a;
      }
    }
  }
  return out;
}

TEST(Schedules, EveryShapeValidatesAndPeakLiveMatchesTheory) {
  int checked = 0;
  for (const Shape& c : all_shapes()) {
    const Schedule s = make_schedule(parse_schedule(c.name), c.S, c.M, c.v);
    const ValidationResult r = validate(s);
    ASSERT_TRUE(r.ok) << label(c) << ": " << r.message;
    std::size_t actions = 0;
    for (int st = 0; st < c.S; ++st) {
      actions += s.actions[st].size();
      EXPECT_EQ(peak_live_microbatches(s, st), peak_live_microbatches_theory(s, st)) << label(c) << " stage " << st;
      EXPECT_EQ(peak_held_microbatches(s, st), peak_held_microbatches_theory(s, st)) << label(c) << " stage " << st;
    }
    EXPECT_EQ(actions, static_cast<std::size_t>(c.S * c.v * c.M * (s.split_backward ? 3 : 2))) << label(c);
    ++checked;
  }
  EXPECT_GT(checked, 800);
}

TEST(Schedules, ReplayedBubbleMatchesTheory) {
  for (const Shape& c : all_shapes()) {
    const Schedule s = make_schedule(parse_schedule(c.name), c.S, c.M, c.v);
    const ReplayResult r = replay(s, [&](int, const Action& a) { return unit_time(s, a); });
    const double work = 3.0 * c.v * c.M;  // 3 units per (micro-batch, chunk)
    ASSERT_EQ(r.bubble_fraction.size(), static_cast<std::size_t>(c.S));
    double theory = bubble_theory(s);
    if (c.name == "zb-h1" && c.M < c.S)  // the pipeline never fills: docs/design.md's "about" is above
      theory = (2.0 * c.S - 1 - c.M) / (2.0 * c.M + 2 * c.S - 1);
    for (int st = 0; st < c.S; ++st) {
      EXPECT_DOUBLE_EQ(r.busy[st], work) << label(c);
      EXPECT_NEAR(r.bubble_fraction[st], theory, 1e-12) << label(c) << " stage " << st;
      EXPECT_EQ(r.action_spans[st].size(), s.actions[st].size());
    }
    if (c.name == "zbv") {  // no stage waits once started: stage s runs action i at s + i
      for (int st = 0; st < c.S; ++st)
        for (std::size_t i = 0; i < r.action_spans[st].size(); ++i)
          ASSERT_DOUBLE_EQ(r.action_spans[st][i].first, st + static_cast<double>(i)) << label(c) << " stage " << st;
      EXPECT_DOUBLE_EQ(r.makespan, 6.0 * c.M + c.S - 1) << label(c);
    }
    if (c.name == "zb-h1") {  // never worse than 1F1B doing the same work
      const Schedule o = make_schedule(ScheduleKind::one_f_one_b, c.S, c.M, 1);
      const ReplayResult ro = replay(o, [&](int, const Action& a) { return unit_time(o, a); });
      EXPECT_LE(r.makespan, ro.makespan) << label(c);
      if (c.S > 1 && c.M >= c.S) {
        EXPECT_LT(r.makespan, ro.makespan) << label(c);
      }
    }
  }
}

TEST(Schedules, ReplayRespectsDependenciesWithUnevenTimes) {
  // Stage 1 twice as slow: every stage then waits on it, and spans never overlap.
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 3, 6, 1);
  const ReplayResult r = replay(s, [](int stage, const Action& a) {
    return (stage == 1 ? 2.0 : 1.0) * (a.kind == ActionKind::F ? 1.0 : 2.0);
  });
  EXPECT_DOUBLE_EQ(r.busy[1], 36.0);
  EXPECT_NEAR(r.bubble_fraction[1], 1.0 - 36.0 / r.makespan, 1e-12);
  EXPECT_GT(r.makespan, 36.0);
  for (const auto& spans : r.action_spans)
    for (std::size_t i = 1; i < spans.size(); ++i) EXPECT_GE(spans[i].first, spans[i - 1].second);
}

TEST(Schedules, SeedPipelineLastStage) {
  // The seed's table: S = 2, last stage; 1f1b holds one micro-batch, gpipe all M.
  for (int M : {2, 4, 8}) {
    EXPECT_EQ(peak_live_microbatches(make_schedule(ScheduleKind::one_f_one_b, 2, M, 1), 1), 1);
    EXPECT_EQ(peak_live_microbatches(make_schedule(ScheduleKind::gpipe, 2, M, 1), 1), M);
    EXPECT_EQ(peak_live_microbatches(make_schedule(ScheduleKind::one_f_one_b, 2, M, 1), 0), 2);
  }
}

TEST(Schedules, ZeroBubbleH1HoldsWhat1F1BHolds) {
  for (int S = 1; S <= 8; ++S)
    for (int M = 1; M <= 32; ++M) {
      const Schedule z = make_schedule(ScheduleKind::zb_h1, S, M, 1);
      const Schedule o = make_schedule(ScheduleKind::one_f_one_b, S, M, 1);
      int worst_z = 0, worst_o = 0;
      for (int st = 0; st < S; ++st) {
        EXPECT_EQ(peak_until_b(z, st), peak_live_microbatches(o, st)) << "S=" << S << " M=" << M;
        EXPECT_EQ(peak_live_microbatches(z, st), peak_until_b(z, st)) << "S=" << S << " M=" << M;
        worst_z = std::max(worst_z, peak_held_microbatches(z, st));
        worst_o = std::max(worst_o, peak_held_microbatches(o, st));
      }
      EXPECT_EQ(worst_z, worst_o) << "S=" << S << " M=" << M;  // the paper's claim: max over stages
    }
}

TEST(Schedules, ListsHaveTheDocumentedOrder) {
  using K = ActionKind;
  const std::vector<Action> f1b_stage0 = {{K::F, 0, 0}, {K::F, 1, 0}, {K::B, 0, 0}, {K::F, 2, 0},
                                          {K::B, 1, 0}, {K::B, 2, 0}};
  EXPECT_EQ(make_schedule(ScheduleKind::one_f_one_b, 2, 3, 1).actions[0], f1b_stage0);
  // Interleaved, S = 2, v = 2, M = 4: micro-batches in groups of S per chunk.
  const std::vector<Action> il_stage1 = {
      {K::F, 0, 0}, {K::F, 1, 0}, {K::F, 0, 1}, {K::B, 0, 1}, {K::F, 1, 1}, {K::B, 1, 1},
      {K::F, 2, 0}, {K::B, 0, 0}, {K::F, 3, 0}, {K::B, 1, 0}, {K::F, 2, 1}, {K::B, 2, 1},
      {K::F, 3, 1}, {K::B, 3, 1}, {K::B, 2, 0}, {K::B, 3, 0}};
  EXPECT_EQ(make_schedule(ScheduleKind::interleaved_1f1b, 2, 4, 2).actions[1], il_stage1);
  // ZB-H1, S = 3, last stage: W delayed by s = 2.
  const std::vector<Action> zb_stage2 = {{K::F, 0, 0}, {K::B, 0, 0}, {K::F, 1, 0}, {K::B, 1, 0},
                                         {K::F, 2, 0}, {K::B, 2, 0}, {K::W, 0, 0}, {K::W, 1, 0},
                                         {K::W, 2, 0}};
  EXPECT_EQ(make_schedule(ScheduleKind::zb_h1, 3, 3, 1).actions[2], zb_stage2);
}

// zbv is torch's ScheduleZBVZeroBubble op for op: its lists for S = 2, M = 4 (torch
// 2.15's _calculate_single_rank_operations, idle slots dropped), the V's placement, and
// the V's bottom passing to itself without a message.
TEST(Schedules, ZbvIsTorchsOrder) {
  const Schedule z = make_schedule(ScheduleKind::zbv, 2, 4, 2);
  auto F = [](int m, int c) { return Action{ActionKind::F, m, c}; };
  auto B = [](int m, int c) { return Action{ActionKind::B, m, c}; };
  auto W = [](int m, int c) { return Action{ActionKind::W, m, c}; };
  const std::vector<Action> rank0 = {F(0, 0), F(1, 0), F(2, 0), F(0, 1), B(0, 1), W(0, 1), F(1, 1), B(1, 1), W(1, 1),
                                     F(3, 0), B(0, 0), W(0, 0), F(2, 1), B(2, 1), W(2, 1), B(1, 0), W(1, 0), F(3, 1),
                                     B(3, 1), W(3, 1), B(2, 0), W(2, 0), B(3, 0), W(3, 0)};
  const std::vector<Action> rank1 = {F(0, 0), F(0, 1), F(1, 0), F(1, 1), B(0, 1), W(0, 1), F(2, 0), B(0, 0), W(0, 0),
                                     F(2, 1), B(1, 1), W(1, 1), F(3, 0), B(1, 0), W(1, 0), F(3, 1), B(2, 1), W(2, 1),
                                     B(2, 0), B(3, 1), B(3, 0), W(2, 0), W(3, 1), W(3, 0)};
  EXPECT_EQ(z.actions[0], rank0);
  EXPECT_EQ(z.actions[1], rank1);
  EXPECT_EQ(vstage_of(z, 0, 0), 0);
  EXPECT_EQ(vstage_of(z, 0, 1), 3);
  EXPECT_EQ(vstage_of(z, 1, 0), 1);
  EXPECT_EQ(vstage_of(z, 1, 1), 2);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(vstage_of(z, stage_of_vstage(z, k), chunk_of_vstage(z, k)), k);
  const std::vector<StageProgram> programs = lower(z);
  for (const ProgramStep& step : programs[1])
    for (const P2p& op : step.comm) EXPECT_EQ(op.peer, 0);  // nothing between stage 1's own chunks
}

TEST(Schedules, LoweringOf1F1BIsMegatrons) {
  const Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 2, 1);
  const auto p = lower(s);
  ASSERT_EQ(p.size(), 2u);
  ASSERT_EQ(p[0].size(), s.actions[0].size() + 1);
  // Stage 0: F0 | send act0 ; F1 | send act1, recv grad0 ; B0 | recv grad1 ; B1 | end
  EXPECT_TRUE(p[0][0].comm.empty());
  ASSERT_EQ(p[0][2].comm.size(), 2u);
  EXPECT_TRUE(p[0][2].comm[0].is_send);
  EXPECT_EQ(p[0][2].comm[0].payload, Payload::activation);
  EXPECT_EQ(p[0][2].comm[0].microbatch, 1);
  EXPECT_FALSE(p[0][2].comm[1].is_send);
  EXPECT_EQ(p[0][2].comm[1].payload, Payload::gradient);
  EXPECT_EQ(p[0][2].comm[1].vstage, 1);
  EXPECT_EQ(p[0][2].action->kind, ActionKind::B);
  EXPECT_FALSE(p[0].back().action.has_value());
  // Stage 1's last step sends the last gradient.
  ASSERT_EQ(p[1].back().comm.size(), 1u);
  EXPECT_EQ(p[1].back().comm[0].payload, Payload::gradient);
  EXPECT_EQ(p[1].back().comm[0].peer, 0);
  // For GPipe and 1F1B the lowering equals the per-action rule.
  for (const char* name : {"gpipe", "1f1b"})
    for (int S = 2; S <= 5; ++S)
      for (int M = 1; M <= 9; ++M) {
        const Schedule t = make_schedule(parse_schedule(name), S, M, 1);
        const auto a = lower(t), b = lower_just_in_time(t);
        for (int st = 0; st < S; ++st)
          for (std::size_t i = 0; i < a[st].size(); ++i) {
            ASSERT_EQ(a[st][i].comm.size(), b[st][i].comm.size()) << name << " S=" << S << " M=" << M;
            for (std::size_t j = 0; j < a[st][i].comm.size(); ++j)
              EXPECT_EQ(a[st][i].comm[j].microbatch, b[st][i].comm[j].microbatch);
          }
      }
}

TEST(Schedules, OneStageHasNoP2p) {
  for (const Shape& c : {Shape{"gpipe", 1, 4, 1}, Shape{"interleaved-1f1b", 1, 3, 3}, Shape{"zb-h1", 1, 2, 1}}) {
    const Schedule s = make_schedule(parse_schedule(c.name), c.S, c.M, c.v);
    const auto programs = lower(s);
    ASSERT_EQ(programs[0].size(), s.actions[0].size() + 1);
    for (const auto& step : programs[0]) EXPECT_TRUE(step.comm.empty()) << label(c);
  }
}

TEST(Schedules, PerActionLoweringDeadlocksInterleaved) {
  // Why lower() holds sends: with send-right-after-compute, interleaved 1F1B with M > S
  // blocks both stages on sends the neighbour asks for only later.
  const Schedule s = make_schedule(ScheduleKind::interleaved_1f1b, 2, 4, 2);
  const ValidationResult r = validate_programs(s, lower_just_in_time(s));
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.message.find("p2p deadlock"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("stage 0 blocked before"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("stage 1 blocked before"), std::string::npos) << r.message;
  EXPECT_TRUE(validate_programs(s, lower(s)).ok);
}

void expect_rejected(const Schedule& s, const std::string& needle) {
  const ValidationResult r = validate(s);
  EXPECT_FALSE(r.ok) << "accepted; expected: " << needle;
  EXPECT_NE(r.message.find(needle), std::string::npos) << r.message;
}

TEST(Schedules, BrokenSchedulesAreRejected) {
  using K = ActionKind;
  Schedule s = make_schedule(ScheduleKind::one_f_one_b, 2, 4, 1);
  Schedule missing = s;
  missing.actions[1].erase(missing.actions[1].begin() + 2);  // stage 1: F0 B0 [F1] B1 ...
  expect_rejected(missing, "stage 1: F(m=1, chunk 0) is missing");

  Schedule b_first = s;
  std::swap(b_first.actions[1][0], b_first.actions[1][1]);  // B0 before F0
  expect_rejected(b_first, "stage 1: B(m=0, chunk 0) runs before F(m=0, chunk 0)");

  Schedule twice = s;
  twice.actions[0].push_back({K::F, 3, 0});
  expect_rejected(twice, "stage 0: F(m=3, chunk 0) runs twice");

  Schedule z = make_schedule(ScheduleKind::zb_h1, 2, 2, 1);
  auto& l = z.actions[1];  // F0 B0 F1 B1 W0 W1: move W0 first
  l.insert(l.begin(), l[4]);
  l.erase(l.begin() + 5);
  expect_rejected(z, "stage 1: W(m=0, chunk 0) runs before B(m=0, chunk 0)");

  Schedule w_in_1f1b = s;
  w_in_1f1b.actions[0].push_back({K::W, 0, 0});
  expect_rejected(w_in_1f1b, "W(m=0, chunk 0): a W");

  // Stage 0 waits for gradient 0 before sending activation 1; stage 1 needs
  // activation 1 before it computes gradient 0.
  Schedule dead = make_schedule(ScheduleKind::gpipe, 2, 2, 1);
  dead.actions[0] = {{K::F, 0, 0}, {K::B, 0, 0}, {K::F, 1, 0}, {K::B, 1, 0}};
  expect_rejected(dead, "deadlock: stage 0 waits before B(m=0, chunk 0) for gradient(m=0, vstage 1) from stage 1");
  EXPECT_NE(validate(dead).message.find("stage 1 waits before F(m=1, chunk 0) for activation(m=1, vstage 0) from stage 0"),
            std::string::npos)
      << validate(dead).message;
  EXPECT_THROW(lower(dead), RunError);
  EXPECT_THROW(replay(dead, [](int, const Action&) { return 1.0; }), RunError);

  Schedule local = make_schedule(ScheduleKind::interleaved_1f1b, 1, 2, 2);  // S = 1: chunk 1 needs chunk 0 first
  std::swap(local.actions[0][0], local.actions[0][1]);
  expect_rejected(local, "F(m=0, chunk 1) runs before F(m=0, chunk 0), whose output it needs");
}

TEST(Schedules, SwappedReceiveOrder) {
  // Stage 1 takes micro-batch 2 before 1. The lists can run (lower() holds activation 1
  // until stage 1 asks for it), but a program that sends in production order does not
  // match stage 1's receives: the FIFO check names both ends.
  Schedule s = make_schedule(ScheduleKind::gpipe, 2, 4, 1);
  std::swap(s.actions[1][1], s.actions[1][2]);
  EXPECT_TRUE(validate(s).ok) << validate(s).message;
  const ValidationResult r = validate_programs(s, lower_just_in_time(s));
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.message.find("stage 0's message 2 to stage 1 is activation(m=1, vstage 0)"), std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("stage 1's receive 2 from stage 0 expects activation(m=2, vstage 0)"), std::string::npos)
      << r.message;

  // A program that runs an action before receiving its input.
  auto programs = lower(make_schedule(ScheduleKind::one_f_one_b, 2, 2, 1));
  const Schedule o = make_schedule(ScheduleKind::one_f_one_b, 2, 2, 1);
  programs[1][0].comm.clear();
  const ValidationResult r2 = validate_programs(o, programs);
  ASSERT_FALSE(r2.ok);
  EXPECT_NE(r2.message.find("F(m=0, chunk 0) runs before receiving its input from stage 0"), std::string::npos)
      << r2.message;
}

void expect_usage(const std::string& name, int S, int M, int v, const std::string& needle) {
  try {
    make_schedule(parse_schedule(name), S, M, v);
    ADD_FAILURE() << "no error; expected: " << needle;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Schedules, ImpossibleCombinationsAreRefused) {
  expect_usage("x", 2, 4, 1, "--schedule: unknown 'x'; allowed: gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv");
  expect_usage("interleaved-1f1b", 4, 6, 2,
               "--schedule interleaved-1f1b needs --microbatches to be a multiple of the stage count (S=4, M=6)");
  expect_usage("1f1b", 2, 4, 2, "--chunks 2 is only valid with --schedule interleaved-1f1b (and 2 with --schedule zbv)");
  expect_usage("zb-h1", 2, 4, 3, "--chunks 3 is only valid with --schedule interleaved-1f1b");
  expect_usage("zbv", 2, 4, 1, "--schedule zbv holds exactly 2 chunks per stage, in a V (got --chunks 1)");
  expect_usage("zbv", 2, 4, 3, "--schedule zbv holds exactly 2 chunks per stage, in a V (got --chunks 3)");
  expect_usage("zbv", 3, 4, 2, "--schedule zbv needs --microbatches >= 2S-1 to fill its V (S=3, M=4; give --microbatches 5 or more)");
  expect_usage("interleaved-1f1b", 2, 4, 1, "--schedule interleaved-1f1b needs --chunks >= 2 (got 1)");
  expect_usage("gpipe", 2, 0, 1, "--microbatches must be >= 1 (got 0)");
  expect_usage("gpipe", 2, 4, 0, "--chunks must be >= 1 (got 0)");
  expect_usage("1f1b", 0, 4, 1, "at least 1 stage");
  EXPECT_EQ(schedule_names_text(), "gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv");
}

TEST(Schedules, EachKindParsesFromItsName) {
  for (const ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved_1f1b,
                                  ScheduleKind::zb_h1, ScheduleKind::zbv})
    EXPECT_EQ(parse_schedule(std::string(schedule_name(kind))), kind) << schedule_name(kind);
  EXPECT_FALSE(find_schedule("1F1B").has_value());
  EXPECT_FALSE(find_schedule("").has_value());
}

}  // namespace
}  // namespace shardscope
