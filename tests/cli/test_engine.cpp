// --engine through the binary: fsdp2's record says so and holds its predictions on every
// rank (emulated and under mpirun at W = 2; the MLP, GPT-2 and Llama), the table labels
// the engine, ddp and zero1 stay torch's, and deepspeed's stage 3 and a pipeline's engine
// are refused (exit 2, one line; deepspeed's runs: test_deepspeed_cli.cpp).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

class Engine : public shardscope::testing::BinaryTest {
 protected:
  static constexpr const char* kMlp = "--layers 4 --width 37 --batch 6 --activation relu --loss mse ";
  json run_record(const std::string& flags, const std::string& file, std::string* out = nullptr,
                  const std::string& model = kMlp) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + model + "--steps 2 " +
                         flags + " --json " + file + " > out.txt 2> err.txt");
    EXPECT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
    if (out) {
      std::ifstream o(dir_ + "/out.txt");
      *out = std::string((std::istreambuf_iterator<char>(o)), std::istreambuf_iterator<char>());
    }
    std::ifstream in(dir_ + "/" + file);
    return json::parse(in);
  }
  static void expect_predicted(const json& rank, const std::string& what) {
    const json& p = rank["predicted"];
    EXPECT_EQ(rank["resting"], p["resting"]) << what;
    EXPECT_EQ(rank["peak"]["total"], p["peak_total"]) << what;
    EXPECT_EQ(rank["peak"]["by_category"], p["peak_by_category"]) << what;
    EXPECT_EQ(rank["comm_bytes"], p["comm_bytes"]) << what;
  }
};

TEST_F(Engine, Fsdp2RecordsItsEngineAndEveryRankItsPrediction) {
  for (int r = 0; r < 3; ++r) {
    std::string out;
    const json doc = run_record("--engine fsdp2 --strategy zero3 --units 1 --emulate 3:" + std::to_string(r),
                                "r.json", &out);
    const json& run = doc["runs"][0];
    EXPECT_EQ(run["engine"], "fsdp2");
    expect_predicted(run["ranks"][0], "rank " + std::to_string(r));
    EXPECT_NE(out.find("engine=fsdp2"), std::string::npos) << out;
  }
  // The torch engine's record says torch; ddp under --engine fsdp2 is torch's.
  EXPECT_EQ(run_record("--strategy zero3 --units 1", "t.json")["runs"][0]["engine"], "torch");
  EXPECT_EQ(run_record("--engine fsdp2 --strategy ddp", "d.json")["runs"][0]["engine"], "torch");
}

// A transformer under fsdp2, checkpointed or not: every rank's record holds its step's
// peak as predicted.
TEST_F(Engine, Fsdp2RunsTransformersEveryRankAsPredicted) {
  const char* models[] = {"--model gpt2 --hidden 16 --heads 2 --vocab 29 --seq 6 --layers 2 --batch 2 ",
                          "--model llama --hidden 16 --heads 4 --kv-heads 2 --ffn 24 --vocab 13 --seq 6 --layers 2 "
                          "--batch 2 --attention math "};
  for (const char* model : models)
    for (int r = 0; r < 3; ++r) {
      const json doc =
          run_record("--engine fsdp2 --strategy zero3 --units 1 --emulate 3:" + std::to_string(r), "x.json", nullptr, model);
      const json& run = doc["runs"][0];
      EXPECT_EQ(run["engine"], "fsdp2");
      expect_predicted(run["ranks"][0], std::string(model) + "rank " + std::to_string(r));
      // Checkpointed blocks too.
      const json ck = run_record("--engine fsdp2 --strategy zero3 --units 1 --checkpoint every:2 --emulate 3:" +
                                     std::to_string(r),
                                 "c.json", nullptr, model);
      expect_predicted(ck["runs"][0]["ranks"][0], std::string(model) + "checkpoint every:2 rank " + std::to_string(r));
    }
}

// The MLP under fsdp2 with --checkpoint full and every:2 (zero3, a unit a layer; zero2,
// the root unit): every emulated rank of W = 2, 3, 4 holds its prediction, the peak's place
// among it (a batch wide against the width: zero3's peak falls in the top layer's recompute).
TEST_F(Engine, Fsdp2RunsTheCheckpointedMlpEveryRankAsPredicted) {
  int recompute_places = 0;
  for (const char* flags : {"--strategy zero3 --units 1 --checkpoint full", "--strategy zero2 --checkpoint every:2"})
    for (int world = 2; world <= 4; ++world)
      for (int r = 0; r < world; ++r) {
        const std::string what = std::string(flags) + " W=" + std::to_string(world) + " r=" + std::to_string(r);
        const json doc = run_record(std::string("--engine fsdp2 ") + flags + " --emulate " + std::to_string(world) +
                                        ":" + std::to_string(r),
                                    "k.json", nullptr, "--layers 4 --width 8 --batch 64 --activation none --loss sum ");
        const json& rank = doc["runs"][0]["ranks"][0];
        expect_predicted(rank, what);
        EXPECT_EQ(rank["peak"]["where"], rank["predicted"]["peak_where"]) << what;
        recompute_places += rank["peak"]["where"].get<std::string>().rfind("recompute", 0) == 0 ? 1 : 0;
      }
  EXPECT_GT(recompute_places, 0);
}

TEST_F(Engine, AnUnknownEngineAndAPipelinesEngineAreRefused) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {"--layers 4 --width 16 --engine fsdp3",
       "shardscope: error: --engine: unknown 'fsdp3'; allowed: torch, fsdp2, deepspeed"},
      {"--layers 4 --width 16 --schedule gpipe --engine fsdp2",
       "shardscope: error: --engine is only valid with --strategy (data parallel)"},
  };
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + c.flags + " > /dev/null 2> err.txt");
    EXPECT_EQ(rc, 2) << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
}

TEST_F(Engine, Fsdp2UnderMpirunHoldsItsPredictionsOnBothRanks) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  // The MLP under both strategies, then GPT-2 and Llama once each.
  const struct {
    std::string model;
    const char* strategy;
  } cases[] = {
      {kMlp, "zero2"},
      {kMlp, "zero3"},
      {std::string(kMlp) + "--checkpoint full ", "zero3"},
      {"--model gpt2 --hidden 16 --heads 2 --vocab 29 --seq 6 --layers 2 --batch 2 ", "zero3"},
      {"--model llama --hidden 16 --heads 4 --kv-heads 2 --ffn 24 --vocab 13 --seq 6 --layers 2 --batch 2 ", "zero2"},
  };
  for (const auto& c : cases) {
    const std::string strategy = c.strategy;
    const int rc = shell("cd '" + dir_ + "' && timeout -k 5 120 mpirun --oversubscribe -np 2 '" + bin_ +
                         "' run --backend cpu --comm mpi " + c.model + "--steps 2 --engine fsdp2 --units 1 --strategy " +
                         strategy + " --json m.json > out.txt 2> err.txt");
    ASSERT_EQ(rc, 0) << first_line(dir_ + "/err.txt");
    std::ifstream in(dir_ + "/m.json");
    const json run = json::parse(in)["runs"][0];
    EXPECT_EQ(run["engine"], "fsdp2");
    ASSERT_EQ(run["ranks"].size(), 2u);
    for (const json& rank : run["ranks"])
      expect_predicted(rank, c.model + strategy + " rank " + rank["rank"].dump());
  }
#endif
}

}  // namespace
