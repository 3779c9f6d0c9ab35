// Placing pipeline actions in time for the report: the replay of action_ms gives the
// schedule's bubble, measured spans keep their times, and a stage whose clock disagrees
// with its messages is shifted back into order.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "harness/report/gantt_layout.hpp"

namespace shardscope {
namespace {

// Stage records with action_ms from "F0 F1 B0 B1" lists, every action `ms` long.
std::vector<StageRecord> stage_records(const std::vector<std::vector<std::string>>& lists, double ms) {
  std::vector<StageRecord> out;
  for (const auto& list : lists) {
    std::vector<ActionTime> actions;
    for (const std::string& a : list)
      actions.push_back({a.substr(0, 1), std::stoi(a.substr(1, a.find('.') - 1)),
                         a.find('.') == std::string::npos ? 0 : std::stoi(a.substr(a.find('.') + 1)), ms});
    StageRecord stage;
    stage.action_ms = std::move(actions);
    out.push_back(std::move(stage));
  }
  return out;
}

GanttLayout replay(const std::vector<StageRecord>& records) {
  std::vector<const StageRecord*> ptrs;
  for (const StageRecord& r : records) ptrs.push_back(&r);
  return replayed_layout(ptrs);
}

std::vector<double> starts(const GanttStage& s) {
  std::vector<double> out;
  for (const GanttAction& a : s.actions) out.push_back(a.start_ms);
  return out;
}

TEST(GanttLayout, ReplayedGpipeWaitsForTheNextStagesBackward) {
  const GanttLayout g = replay(stage_records({{"F0", "F1", "B0", "B1"}, {"F0", "F1", "B0", "B1"}}, 1.0));
  ASSERT_EQ(g.source, GanttLayout::Source::replayed);
  ASSERT_EQ(g.stages.size(), 2u);
  EXPECT_EQ(starts(g.stages[0]), (std::vector<double>{0, 1, 4, 5}));
  EXPECT_EQ(starts(g.stages[1]), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_DOUBLE_EQ(g.to_ms, 6.0);
  EXPECT_DOUBLE_EQ(g.stages[1].to_ms, 6.0);
}

TEST(GanttLayout, Replayed1f1bHasTheTheoreticalBubble) {
  // S = 2, M = 4: makespan 2 (M + S - 1) = 10, busy 8: bubble (S-1)/(M+S-1) = 1/5.
  const GanttLayout g = replay(stage_records(
      {{"F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"}, {"F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"}}, 1.0));
  ASSERT_EQ(g.source, GanttLayout::Source::replayed);
  EXPECT_DOUBLE_EQ(g.to_ms, 10.0);
  EXPECT_EQ(starts(g.stages[1]), (std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(GanttLayout, ReplayedWeightGradientsAndChunks) {
  // W(m) after B(m) on its own stage; interleaved: F(m, chunk 1) on stage 0 after
  // F(m, chunk 0) on stage 1 (virtual stages 0 1 | 2 3).
  const GanttLayout w = replay(stage_records({{"F0", "B0", "W0"}, {"F0", "B0", "W0"}}, 1.0));
  EXPECT_EQ(starts(w.stages[0]), (std::vector<double>{0, 3, 4}));
  const GanttLayout v =
      replay(stage_records({{"F0.0", "F0.1", "B0.1", "B0.0"}, {"F0.0", "F0.1", "B0.1", "B0.0"}}, 1.0));
  EXPECT_EQ(starts(v.stages[0]), (std::vector<double>{0, 2, 5, 7}));
  EXPECT_EQ(starts(v.stages[1]), (std::vector<double>{1, 3, 4, 6}));
}

TEST(GanttLayout, ListsThatCannotRunStillEndAndMissingTimesGiveNone) {
  // Stage 1's B0 comes first and waits for its own F0, which it lists later.
  const GanttLayout g = replay(stage_records({{"F0", "B0"}, {"B0", "F0"}}, 1.0));
  ASSERT_EQ(g.source, GanttLayout::Source::replayed);
  EXPECT_EQ(g.stages[1].actions.size(), 2u);
  EXPECT_EQ(replay({StageRecord{}, StageRecord{}}).source, GanttLayout::Source::none);
  EXPECT_EQ(replay({}).source, GanttLayout::Source::none);
}

// A stage's timeline: its last step from `t0`, the actions at the given starts, 1 ms each.
TimelineRecord view(double t0, const std::vector<std::pair<std::string, double>>& acts) {
  TimelineRecord v;
  v.spans.push_back({"step", t0 - 20.0, t0 - 15.0, 0, std::nullopt, std::nullopt});  // an earlier step, ignored
  v.spans.push_back({"F(m=0)", t0 - 20.0, t0 - 19.0, 1, std::nullopt, std::nullopt});
  v.spans.push_back({"step", t0, t0 + 6.0, 0, std::nullopt, std::nullopt});
  for (const auto& [name, start] : acts) {
    v.spans.push_back({name, t0 + start, t0 + start + 1.0, 1, std::nullopt, std::nullopt});
    v.spans.push_back({"send 512 B", t0 + start + 0.9, t0 + start + 1.0, 2, 512, std::nullopt});
  }
  return v;
}

GanttLayout measure(const std::vector<TimelineRecord>& timelines) {
  std::vector<const TimelineRecord*> ptrs;
  for (const TimelineRecord& t : timelines) ptrs.push_back(&t);
  return measured_layout(ptrs);
}

using Starts = std::vector<std::pair<std::string, double>>;
const Starts kStage0 = {{"F(m=0)", 0}, {"F(m=1)", 1}, {"B(m=0)", 4}, {"B(m=1)", 5}};
const Starts kStage1 = {{"F(m=0)", 1}, {"F(m=1)", 2}, {"B(m=0)", 3}, {"B(m=1)", 4}};

TEST(GanttLayout, MeasuredKeepsTheLastStepAndAgreeingClocks) {
  const GanttLayout g = measure({view(100.0, kStage0), view(100.0, kStage1)});
  ASSERT_EQ(g.source, GanttLayout::Source::measured);
  EXPECT_FALSE(g.shifted);
  EXPECT_EQ(starts(g.stages[0]), (std::vector<double>{100, 101, 104, 105}));
  EXPECT_EQ(starts(g.stages[1]), (std::vector<double>{101, 102, 103, 104}));
  EXPECT_DOUBLE_EQ(g.from_ms, 100.0);
  EXPECT_DOUBLE_EQ(g.to_ms, 106.0);
}

TEST(GanttLayout, MeasuredShiftsAClockThatReceivesBeforeTheSend) {
  // Stage 1's clock runs 1.5 ms behind: its F0 "starts" before stage 0's F0 ends.
  const GanttLayout g = measure({view(100.0, kStage0), view(98.5, kStage1)});
  ASSERT_EQ(g.source, GanttLayout::Source::measured);
  EXPECT_TRUE(g.shifted);
  EXPECT_DOUBLE_EQ(g.stages[0].clock_shift_ms, 0.0);
  EXPECT_DOUBLE_EQ(g.stages[1].clock_shift_ms, 1.5);
  EXPECT_EQ(starts(g.stages[1]), (std::vector<double>{101, 102, 103, 104}));
  EXPECT_DOUBLE_EQ(g.stages[1].from_ms, 100.0);
  // Running ahead instead: shifted back until its B's end before stage 0's B's start.
  const GanttLayout ahead = measure({view(100.0, kStage0), view(102.0, kStage1)});
  EXPECT_DOUBLE_EQ(ahead.stages[1].clock_shift_ms, -2.0);
}

TEST(GanttLayout, MeasuredNeedsActionSpansOnEveryStage) {
  TimelineRecord bare;
  bare.spans.push_back({"step", 0.0, 1.0, 0, std::nullopt, std::nullopt});
  EXPECT_EQ(measure({view(0.0, kStage0), bare}).source, GanttLayout::Source::none);
  const TimelineRecord stage0 = view(0.0, kStage0);
  EXPECT_EQ(measured_layout({&stage0, nullptr}).source, GanttLayout::Source::none);  // no timeline recorded
  EXPECT_EQ(measured_layout({}).source, GanttLayout::Source::none);
}

}  // namespace
}  // namespace shardscope
