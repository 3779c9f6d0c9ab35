// Putting a sweep's results together: emulated ranks merged into one run, and an
// emulated pipeline's bubble replayed from its stages' measured action times.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "harness/cli/sweep_results.hpp"
#include "harness/records/json_write.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// Stage `stage` of an emulated gpipe run at S = 2, M = 1: F takes `f` ms, B `b` ms. The
// stage record as a run writes it.
json stage_document(int stage, double f, double b) {
  StageRecord s;
  s.stage = stage;
  s.rank = stage;
  s.world = 2;
  s.busy_ms = f + b;
  s.bubble_fraction = 0.25;  // wall clock of a process that ran alone
  s.action_ms = std::vector<ActionTime>{{"F", 0, 0, f}, {"B", 0, 0, b}};
  const json st = to_json(s);
  json run = {{"kind", "pipeline"}, {"schedule", "gpipe"}, {"world", 2},         {"microbatches", 1},
              {"chunks", 1},        {"rank", stage},       {"stages", {st}}, {"replayed_makespan_ms", nullptr}};
  return {{"schema", "shardscope/1"}, {"backend", "cpu"}, {"comm", "fake"}, {"emulated", true}, {"runs", {run}}};
}

TEST(SweepResults, AnEmulatedPipelinesBubbleIsReplayedFromItsStagesActionTimes) {
  // Stage 0: F [0, 1], B [8, 10]; stage 1: F [1, 4], B [4, 8]. Makespan 10 ms, busy 3 and 7.
  const std::vector<json> runs = merge_emulated_ranks({stage_document(0, 1.0, 2.0), stage_document(1, 3.0, 4.0)});
  ASSERT_EQ(runs.size(), 1u);
  const json& run = runs[0];
  ASSERT_EQ(run["stages"].size(), 2u);
  EXPECT_EQ(run["stages"][0]["stage"], 0);
  EXPECT_EQ(run["emulated"], true);
  EXPECT_FALSE(run.contains("rank")) << "the merged run plays every stage, not one rank";
  EXPECT_DOUBLE_EQ(run["replayed_makespan_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(run["stages"][0]["bubble_fraction_replayed"].get<double>(), 0.7);
  EXPECT_DOUBLE_EQ(run["stages"][1]["bubble_fraction_replayed"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(run["stages"][0]["replayed_makespan_ms"].get<double>(), 10.0);
  for (const json& st : run["stages"]) EXPECT_TRUE(st["bubble_fraction"].is_null()) << st.dump();
}

TEST(SweepResults, StagesWithoutActionTimesKeepANullReplay) {
  json a = stage_document(0, 1.0, 2.0), b = stage_document(1, 3.0, 4.0);
  b["runs"][0]["stages"][0]["action_ms"] = nullptr;  // as a run without them writes it
  const std::vector<json> runs = merge_emulated_ranks({a, b});
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_TRUE(runs[0]["replayed_makespan_ms"].is_null());
  for (const json& st : runs[0]["stages"]) {
    EXPECT_TRUE(st["bubble_fraction_replayed"].is_null());
    EXPECT_TRUE(st["bubble_fraction"].is_null());
  }
}

TEST(SweepResults, DataParallelRanksAreMergedAsTheyAre) {
  // As `run --emulate 2:r` writes it: the run says which one rank it played.
  auto rank_doc = [](int r) {
    json run = {{"kind", "data_parallel"}, {"strategy", "ddp"}, {"world", 2}, {"emulated", true},
                {"rank", r},           {"ranks", {{{"rank", r}}}}};
    return json{{"schema", "shardscope/1"}, {"runs", {run}}};
  };
  const std::vector<json> runs = merge_emulated_ranks({rank_doc(0), rank_doc(1)});
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0]["ranks"], json::array({{{"rank", 0}}, {{"rank", 1}}}));
  EXPECT_FALSE(runs[0].contains("rank")) << "the merged run holds every rank: no one rank played";
  EXPECT_EQ(runs[0]["emulated"], true);
  EXPECT_FALSE(runs[0].contains("replayed_makespan_ms"));
}

// What an incomplete sweep may not write over: a shardscope/1 document that is not a
// sweep's incomplete one. Read without keeping the document.
TEST(SweepResults, CompleteResultsAreToldFromPartialOrBrokenOnes) {
  char tmpl[] = "/tmp/shardscope-complete-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/shardscope.json";
  auto holds = [&](const std::string& text) {
    std::ofstream(path) << text;
    return holds_complete_results(path);
  };
  EXPECT_TRUE(holds(R"({"schema": "shardscope/1", "runs": [], "sweep": {"jobs": 1, "complete": true}})"));
  EXPECT_TRUE(holds(R"({"runs": [{"sweep": {"complete": false}}], "schema": "shardscope/1"})")) << "a run's own";
  EXPECT_TRUE(holds(R"({"schema": "shardscope/1", "runs": [{"kind": "data_parallel"}]})")) << "a run's --json";
  EXPECT_FALSE(holds(R"({"schema": "shardscope/1", "runs": [], "sweep": {"complete": false, "error": "x"}})"));
  EXPECT_FALSE(holds(R"({"schema": "shardscope-plan/1", "plans": []})"));
  EXPECT_FALSE(holds(R"(["schema", "shardscope/1"])"));
  EXPECT_FALSE(holds("{ an older, broken file"));
  std::filesystem::remove(path);
  EXPECT_FALSE(holds_complete_results(path));
  std::filesystem::remove_all(tmpl);
}

}  // namespace
}  // namespace shardscope
