// --checkpoint with --schedule through the binary: every emulated stage of the MLP's, GPT-2's
// and Llama's gpipe, 1f1b and interleaved-1f1b pipelines runs with every figure of its
// record equal to its prediction (the record saying the checkpoint), GPT-2's and Llama's
// under bf16 too, and also along --mesh dp=2,pp=2; plan prints each stage's peak as the emulated run measures it; what is not
// built is refused by name (exit 2, one line naming the flags).
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

class PipelineCheckpointCli : public shardscope::testing::BinaryTest {
 protected:
  json read(const std::string& file) {
    std::ifstream in(dir_ + "/" + file);
    return json::parse(in);
  }
  int binary(const std::string& args) {
    return shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' " + args + " > out.txt 2> err.txt");
  }
};

const char* const kMlp = "--layers 4 --width 16 --batch 6 --activation relu --loss mse --steps 2 ";
const char* const kGpt2 = "--model gpt2 --layers 4 --hidden 16 --heads 2 --vocab 23 --seq 8 --batch 3 --steps 2 ";
const char* const kLlama =
    "--model llama --layers 4 --hidden 16 --heads 4 --kv-heads 2 --ffn 24 --vocab 23 --seq 8 --batch 3 --steps 2 ";

void expect_stage_as_predicted(const json& stage, const std::string& what) {
  const json& p = stage["predicted"];
  EXPECT_EQ(stage["resting"]["total"], p["resting_total"]) << what;
  EXPECT_EQ(stage["peak"]["total"], p["peak_total"]) << what;
  EXPECT_EQ(stage["peak"]["by_category"], p["peak_by_category"]) << what;
  EXPECT_EQ(stage["saved"]["peak_live_bytes"], p["peak_live_bytes"]) << what;
  EXPECT_EQ(stage["saved"]["peak_live_tensors"], p["peak_live_tensors"]) << what;
  EXPECT_EQ(stage["saved"]["total_tensors"], p["total_tensors"]) << what;
  EXPECT_EQ(stage["comm_bytes"], p["comm_bytes"]) << what;
}

TEST_F(PipelineCheckpointCli, EveryEmulatedStageRunsAsPredictedAndPlanSaysItsPeak) {
  for (const char* model : {kMlp, kGpt2, kLlama})
    for (const char* ck : {"full", "every:2", "attention"})
      for (const char* schedule : {"gpipe", "1f1b", "interleaved-1f1b"}) {
        if (model == kMlp && ck[0] == 'a') continue;  // the MLP has no attention
        const std::string extra = schedule[0] == 'i' ? " --chunks 2 --microbatches 2" : " --microbatches 3";
        const std::string shape = std::string(model) + "--checkpoint " + ck + extra;
        const std::string plan_args = "plan " + shape + " --schedules " + schedule + " --worlds 2 --json p.json";
        ASSERT_EQ(binary(plan_args), 0) << plan_args << ": " << first_line(dir_ + "/err.txt");
        const json plan = read("p.json")["plans"][0];
        EXPECT_EQ(plan["model"]["checkpoint"], ck) << plan_args;
        for (int rank = 0; rank < 2; ++rank) {
          const std::string args =
              "run --backend cpu " + shape + " --schedule " + schedule + " --emulate 2:" + std::to_string(rank);
          ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
          const json run = read("r.json")["runs"][0];
          EXPECT_EQ(run["model"]["checkpoint"], ck) << args;
          const json& stage = run["stages"][0];
          expect_stage_as_predicted(stage, args);
          EXPECT_EQ(plan["stages"][rank]["predicted"]["peak_total"], stage["peak"]["total"]) << args;
          EXPECT_EQ(plan["stages"][rank]["predicted"]["peak_by_category"], stage["peak"]["by_category"]) << args;
        }
      }
  // Under --precision bf16 (autocast, a region per micro-batch or one a step): GPT-2's and
  // Llama's stages.
  for (const char* model : {kGpt2, kLlama})
    for (const char* schedule : {"gpipe --microbatches 3 --autocast-region step",
                                 "interleaved-1f1b --chunks 2 --microbatches 2"})
      for (int rank = 0; rank < 2; ++rank) {
        const std::string args = std::string("run --backend cpu ") + model +
                                 "--precision bf16 --checkpoint every:2 --schedule " + schedule + " --emulate 2:" +
                                 std::to_string(rank);
        ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
        const json run = read("r.json")["runs"][0];
        EXPECT_EQ(run["precision"], "bf16") << args;
        expect_stage_as_predicted(run["stages"][0], args);
      }
  // Along dp: each of the four ranks of dp=2,pp=2 holds its stage's prediction.
  for (int rank = 0; rank < 4; ++rank) {
    const std::string args = std::string("run --backend cpu ") + kGpt2 +
                             "--checkpoint full --mesh dp=2,pp=2 --schedule 1f1b --microbatches 3 --emulate 4:" +
                             std::to_string(rank);
    ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
    expect_stage_as_predicted(read("r.json")["runs"][0]["stages"][0], args);
  }
}

// Under mpirun at W = 2: both stages of a checkpointed 1F1B pipeline as predicted.
TEST_F(PipelineCheckpointCli, UnderMpirunBothStagesHoldTheirPredictions) {
  for (const char* model : {kMlp, kLlama}) {
    const std::string args = std::string("run --backend cpu ") + model +
                             "--checkpoint full --schedule 1f1b --microbatches 3 --json r.json";
    ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 120 mpirun -np 2 --oversubscribe '" + bin_ + "' " + args +
                    " > out.txt 2> err.txt"),
              0)
        << args << ": " << first_line(dir_ + "/err.txt");
    const json run = read("r.json")["runs"][0];
    ASSERT_EQ(run["stages"].size(), 2u) << args;
    for (const json& stage : run["stages"]) expect_stage_as_predicted(stage, args);
  }
}

// What stays unbuilt: exit 2, one line naming the flags (a plan lists such a pipeline as
// skipped with the same reason: RunInputs.APlanUnderCheckpointPlansPipelinesAndSkips...).
TEST_F(PipelineCheckpointCli, WhatIsNotBuiltIsRefusedByName) {
  struct Refusal {
    std::string args, names;
  };
  for (const Refusal& r :
       {Refusal{"run --checkpoint full --schedule zb-h1 --emulate 2:0", "--checkpoint full and --schedule zb-h1"},
        Refusal{"run --checkpoint every:2 --schedule zbv --chunks 2 --microbatches 3 --emulate 2:0",
                "--checkpoint every:2 and --schedule zbv"},
        Refusal{std::string("run ") + kGpt2 + "--checkpoint full --mesh tp=2,pp=2 --schedule 1f1b --emulate 4:0",
                "--mesh tp=2"},
        Refusal{"run --precision bf16 --checkpoint full --schedule 1f1b --emulate 2:0",
                "--checkpoint full and --schedule 1f1b and --precision bf16 and --model mlp"},
        Refusal{std::string("run ") + kGpt2 + "--precision bf16 --checkpoint attention --schedule 1f1b --emulate 2:0",
                "--checkpoint attention and --schedule 1f1b and --precision bf16"}}) {
    EXPECT_EQ(binary(r.args), 2) << r.args;
    const std::string line = first_line(dir_ + "/err.txt");
    EXPECT_EQ(line.rfind("shardscope: error: ", 0), 0u) << line;
    EXPECT_NE(line.find(r.names), std::string::npos) << r.args << ": " << line;
  }
}

}  // namespace
