// --mesh dp=D,pp=S --schedule through the binary: every emulated rank of dp=2,pp=2 (every
// schedule) and of dp=2,pp=4 holds its predictions, group by group; the four real ranks
// under mpirun do too, each replica's last stage reporting its own batch's loss; and what
// is not built along dp (zero1/2/3), and a pipeline axis without a schedule, are exit 2 in
// one line naming the flag (tp > 1 with pp: test_pipeline_tp_cli.cpp).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

constexpr const char* kModel = " --layers 8 --width 16 --batch 8 --activation relu --loss mse --steps 3 ";

class PipelineMeshCli : public shardscope::testing::BinaryTest {
 protected:
  json run_doc(const std::string& launch, const std::string& flags) {
    const int rc = shell("cd '" + dir_ + "' && " + launch + " '" + bin_ + "' run --backend cpu" + kModel + flags +
                         " --json r.json > out.txt 2> err.txt");
    EXPECT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
    std::ifstream in(dir_ + "/r.json");
    return json::parse(in);
  }
  static void expect_predicted(const json& stage, const std::string& what) {
    const json& p = stage["predicted"];
    EXPECT_EQ(stage["resting"]["total"], p["resting_total"]) << what;
    EXPECT_EQ(stage["peak"]["total"], p["peak_total"]) << what;
    EXPECT_EQ(stage["peak"]["by_category"], p["peak_by_category"]) << what;
    EXPECT_EQ(stage["comm_bytes"], p["comm_bytes"]) << what;
    EXPECT_EQ(stage["saved"]["peak_live_bytes"], p["peak_live_bytes"]) << what;
    ASSERT_TRUE(stage.contains("comm_groups")) << what;
    std::int64_t sum = 0;
    for (const char* axis : {"dp", "tp", "pp"}) {
      const json& g = stage["comm_groups"][axis];
      EXPECT_EQ(g["comm_bytes"], g["predicted_comm_bytes"]) << what << " " << axis;
      sum += g["comm_bytes"].get<std::int64_t>();
    }
    EXPECT_EQ(sum, stage["comm_bytes"].get<std::int64_t>()) << what;
    EXPECT_GT(stage["comm_groups"]["dp"]["comm_bytes"].get<std::int64_t>(), 0) << what;
  }
};

TEST_F(PipelineMeshCli, EveryEmulatedRankHoldsItsPredictionsGroupByGroup) {
  struct Case {
    const char* mesh;
    int world;
    const char* schedule;
  };
  const Case cases[] = {{"dp=2,pp=2", 4, "gpipe --microbatches 4"},
                        {"dp=2,pp=2", 4, "1f1b --microbatches 4"},
                        {"dp=2,pp=2", 4, "interleaved-1f1b --chunks 2 --microbatches 4"},
                        {"dp=2,pp=2", 4, "zbv --microbatches 3"},
                        {"pp=4,dp=2", 8, "1f1b --microbatches 8"}};
  for (const Case& c : cases)
    for (int r = 0; r < c.world; ++r) {
      const std::string flags = std::string("--mesh ") + c.mesh + " --schedule " + c.schedule + " --emulate " +
                                std::to_string(c.world) + ":" + std::to_string(r);
      const json doc = run_doc("timeout 60", flags);
      const json& run = doc["runs"][0];
      EXPECT_EQ(run["mesh"]["dp"], 2) << flags;
      EXPECT_EQ(run["world"], c.world / 2) << flags;  // the stages
      const json& stage = run["stages"][0];
      expect_predicted(stage, flags);
      EXPECT_EQ(stage["rank"], r);
      EXPECT_EQ(stage["stage"], r / 2) << flags;  // tp = 1: rank = dp + 2·pp
      EXPECT_EQ(stage["comm_groups"]["dp"]["rank"], r % 2) << flags;
    }
}

TEST_F(PipelineMeshCli, UnderMpirunEveryRankHoldsItsPredictions) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  const json doc = run_doc("timeout -k 5 120 mpirun --oversubscribe -np 4",
                           "--comm mpi --mesh dp=2,pp=2 --schedule 1f1b --microbatches 4");
  const json& run = doc["runs"][0];
  ASSERT_EQ(run["stages"].size(), 4u);
  for (const json& stage : run["stages"]) {
    const int r = stage["rank"].get<int>();
    expect_predicted(stage, "rank " + std::to_string(r));
    EXPECT_EQ(stage["comm_groups"]["dp"]["members"], json::array({r / 2 * 2, r / 2 * 2 + 1}));
    EXPECT_EQ(stage["comm_groups"]["pp"]["members"], json::array({r % 2, r % 2 + 2}));
    EXPECT_TRUE(stage["bubble_fraction"].is_number()) << "rank " << r;  // per replica
  }
  // Each replica's last stage (ranks 2 and 3) reports the loss of its own batch.
  EXPECT_TRUE(run["stages"][0]["loss"].is_null());
  ASSERT_TRUE(run["stages"][2]["loss"].is_array());
  EXPECT_NE(run["stages"][2]["loss"], run["stages"][3]["loss"]);
#endif
}

TEST_F(PipelineMeshCli, WhatIsNotBuiltAlongDpIsRefusedNamingIt) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {"--mesh dp=2,pp=2 --emulate 4:0",
       "shardscope: error: --mesh dp=2,tp=1,pp=2: a pipeline axis (pp > 1) runs a schedule; give --schedule "
       "gpipe|1f1b|interleaved-1f1b|zb-h1|zbv, or pp=1 and --strategy"},
      {"--mesh dp=2,pp=2 --schedule 1f1b --strategy zero1 --emulate 4:0",
       "shardscope: error: --strategy zero1 and --schedule with --mesh: along dp a pipeline's stages run ddp (each "
       "stage's gradients all-reduced in place after the schedule); allowed: --strategy ddp (zero1, zero2, zero3 "
       "along dp with pp are not built yet)"},
      {"--schedule 1f1b --strategy ddp",
       "shardscope: error: --strategy and --schedule: a run is either data parallel or a pipeline, not both (with "
       "--mesh dp=D,pp=S both: --strategy ddp along dp)"},
      {"--mesh dp=2,pp=2 --schedule 1f1b --ddp-bucket copy --emulate 4:0",
       "shardscope: error: --ddp-bucket is only valid with --strategy (data parallel)"},
  };
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + kModel + c.flags +
                         " > /dev/null 2> err.txt");
    EXPECT_EQ(rc, 2) << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
  // --strategy ddp is what runs along dp.
  EXPECT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + kModel +
                  "--mesh dp=2,pp=2 --schedule 1f1b --strategy ddp --emulate 4:3 > /dev/null 2> err.txt"),
            0)
      << first_line(dir_ + "/err.txt");
}

}  // namespace
