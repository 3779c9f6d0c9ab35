// --mesh through the binary: every emulated rank of dp=2,tp=2 and of an 8-rank mesh holds
// its predictions, group by group; the four real ranks under mpirun do too, each group's
// members in Megatron's order and the tensor-parallel pairs computing the same loss; and
// a bad mesh is exit 2 in one line naming --mesh. GPT-2 and Llama split along tp
// (Megatron's tensor parallelism of the transformers): every emulated rank of dp=2,tp=2
// holds its predictions, and shapes tp does not divide are exit 2 naming them.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

constexpr const char* kModel = " --layers 4 --width 32 --batch 6 --activation relu --loss mse --steps 2 ";

class MeshCli : public shardscope::testing::BinaryTest {
 protected:
  json run_record(const std::string& flags, std::string* out = nullptr) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + kModel + flags +
                         " --json r.json > out.txt 2> err.txt");
    EXPECT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
    if (out) {
      std::ifstream o(dir_ + "/out.txt");
      *out = std::string((std::istreambuf_iterator<char>(o)), std::istreambuf_iterator<char>());
    }
    std::ifstream in(dir_ + "/r.json");
    return json::parse(in);
  }
  static void expect_predicted(const json& rank, const std::string& what) {
    const json& p = rank["predicted"];
    EXPECT_EQ(rank["resting"], p["resting"]) << what;
    EXPECT_EQ(rank["peak"]["total"], p["peak_total"]) << what;
    EXPECT_EQ(rank["peak"]["by_category"], p["peak_by_category"]) << what;
    EXPECT_EQ(rank["peak"]["where"], p["peak_where"]) << what;
    EXPECT_EQ(rank["comm_bytes"], p["comm_bytes"]) << what;
    EXPECT_EQ(rank["saved"], p["saved"]) << what;
    ASSERT_TRUE(rank.contains("comm_groups")) << what;
    std::int64_t sum = 0;
    for (const char* axis : {"dp", "tp", "pp"}) {
      const json& g = rank["comm_groups"][axis];
      EXPECT_EQ(g["comm_bytes"], g["predicted_comm_bytes"]) << what << " " << axis;
      sum += g["comm_bytes"].get<std::int64_t>();
    }
    EXPECT_EQ(sum, rank["comm_bytes"].get<std::int64_t>()) << what;
  }
};

TEST_F(MeshCli, EveryEmulatedRankHoldsItsPredictionsGroupByGroup) {
  for (const char* mesh : {"dp=2,tp=2", "tp=4,dp=2"}) {
    const int world = std::string(mesh) == "dp=2,tp=2" ? 4 : 8;
    for (int r = 0; r < world; ++r) {
      std::string out;
      const json doc = run_record(std::string("--strategy zero1 --mesh ") + mesh + " --emulate " +
                                      std::to_string(world) + ":" + std::to_string(r),
                                  &out);
      const json& run = doc["runs"][0];
      EXPECT_EQ(run["world"], world);
      EXPECT_EQ(run["mesh"]["dp"], 2);
      const json& rank = run["ranks"][0];
      expect_predicted(rank, std::string(mesh) + " rank " + std::to_string(r));
      const int tp = world / 2;
      EXPECT_EQ(rank["comm_groups"]["tp"]["world"], tp);
      EXPECT_EQ(rank["comm_groups"]["tp"]["rank"], r % tp);
      EXPECT_EQ(rank["comm_groups"]["dp"]["rank"], r / tp);
      // Forward: two row Linears' outputs; backward: one column Linear's input gradient.
      EXPECT_EQ(rank["comm_groups"]["tp"]["comm"]["all_reduce"]["calls"], 3);
      EXPECT_NE(out.find("(mesh dp=2,tp=" + std::to_string(tp) + ",pp=1)"), std::string::npos) << out;
    }
  }
}

TEST_F(MeshCli, UnderMpirunEveryRankHoldsItsPredictions) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  const int rc = shell("cd '" + dir_ + "' && timeout -k 5 120 mpirun --oversubscribe -np 4 '" + bin_ +
                       "' run --backend cpu --comm mpi" + kModel + "--mesh dp=2,tp=2 --json m.json > out.txt 2> err.txt");
  ASSERT_EQ(rc, 0) << first_line(dir_ + "/err.txt");
  std::ifstream in(dir_ + "/m.json");
  const json run = json::parse(in)["runs"][0];
  ASSERT_EQ(run["ranks"].size(), 4u);
  for (const json& rank : run["ranks"]) {
    const int r = rank["rank"].get<int>();
    expect_predicted(rank, "rank " + std::to_string(r));
    EXPECT_EQ(rank["comm_groups"]["tp"]["members"], json::array({r / 2 * 2, r / 2 * 2 + 1}));
    EXPECT_EQ(rank["comm_groups"]["dp"]["members"], json::array({r % 2, r % 2 + 2}));
    EXPECT_TRUE(rank["comm_groups"]["tp"]["comm"]["all_reduce"]["busbw_gbps"].is_number());
  }
  // A tensor-parallel pair computes one loss; the two data-parallel groups see other rows.
  EXPECT_EQ(run["ranks"][0]["loss"], run["ranks"][1]["loss"]);
  EXPECT_EQ(run["ranks"][2]["loss"], run["ranks"][3]["loss"]);
  EXPECT_NE(run["ranks"][0]["loss"], run["ranks"][2]["loss"]);
#endif
}

TEST_F(MeshCli, BadMeshesAreRefusedNamingThem) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {"--mesh dp=3,tp=2 --emulate 4:0",
       "shardscope: error: --mesh dp=3,tp=2,pp=1: dp·tp·pp = 6 ranks, but the world is 4 (--emulate 4:0); the "
       "product must equal the world"},
      {"--mesh dq=2 --emulate 2:0", "shardscope: error: --mesh: unknown axis 'dq'; allowed: dp, tp, pp"},
      {"--mesh dp=0 --emulate 2:0",
       "shardscope: error: --mesh: dp=0: the size must be a positive integer (at most 999999)"},
      {"--mesh tp=2", "shardscope: error: --mesh dp=1,tp=2,pp=1: dp·tp·pp = 2 ranks, but the world is 1 (one process "
                      "without mpirun); the product must equal the world"},
      {"--mesh tp=3 --emulate 3:0",
       "shardscope: error: --mesh tp=3 and --width 32: the width must divide by tp (each rank holds width/tp of every "
       "parallel Linear's features)"},
      {"--mesh tp=2 --strategy zero3 --emulate 2:0",
       "shardscope: error: --mesh dp=1,tp=2,pp=1 and --strategy zero3: tp > 1 of the MLP runs with ddp or zero1 along "
       "dp (zero2/zero3 with tp > 1 are built for the transformers)"},
  };
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + kModel + c.flags +
                         " > /dev/null 2> err.txt");
    EXPECT_EQ(rc, 2) << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
}

TEST_F(MeshCli, EveryEmulatedRankOfATensorParallelTransformerHoldsItsPredictions) {
  for (const char* model : {" --model gpt2 --layers 2 --hidden 32 --heads 4 --vocab 64 --seq 8 --batch 2 --steps 2 ",
                            " --model llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 48 --vocab 64 --seq 8 "
                            "--batch 2 --steps 2 "})
    for (const char* strategy : {"ddp", "zero1", "zero3 --units 1"})
      for (int r = 0; r < 4; ++r) {
        const std::string flags = std::string(model) + "--strategy " + strategy + " --mesh dp=2,tp=2 --emulate 4:" +
                                  std::to_string(r);
        const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + flags +
                             " --json g.json > out.txt 2> err.txt");
        ASSERT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
        std::ifstream in(dir_ + "/g.json");
        const json doc = json::parse(in);
        const json& rank = doc["runs"][0]["ranks"][0];
        EXPECT_GT(rank["comm_groups"]["tp"]["comm_bytes"].get<std::int64_t>(), 0) << flags;
        expect_predicted(rank, flags);
      }
}

// Llama's kv heads replicated when fewer than tp, through the binary: --kv-heads 2 at tp=4
// and --kv-heads 1 at dp=2,tp=2 (ddp and zero3), every emulated rank holds its predictions
// group by group; the rank's k_proj is one kv head's (h·d = 32·4 elements at --heads 8).
TEST_F(MeshCli, EveryEmulatedRankOfReplicatedKvHeadsHoldsItsPredictions) {
  const struct {
    const char* flags;
    int world;
  } cases[] = {{"--kv-heads 2 --strategy ddp --mesh tp=4", 4},
               {"--kv-heads 1 --strategy ddp --mesh dp=2,tp=2", 4},
               {"--kv-heads 1 --strategy zero3 --units 1 --mesh dp=2,tp=2", 4}};
  for (const auto& c : cases)
    for (int r = 0; r < c.world; ++r) {
      const std::string flags = std::string(" --model llama --layers 2 --hidden 32 --heads 8 --ffn 48 --vocab 64 --seq 8 "
                                            "--batch 2 --steps 2 ") +
                                c.flags + " --emulate " + std::to_string(c.world) + ":" + std::to_string(r);
      const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + flags +
                           " --json g.json > out.txt 2> err.txt");
      ASSERT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
      std::ifstream in(dir_ + "/g.json");
      const json doc = json::parse(in);
      const json& rank = doc["runs"][0]["ranks"][0];
      EXPECT_GT(rank["comm_groups"]["tp"]["comm_bytes"].get<std::int64_t>(), 0) << flags;
      expect_predicted(rank, flags);
    }
}

TEST_F(MeshCli, TransformerShapesTensorParallelismCannotSplitAreRefusedNamingThem) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {" --model gpt2 --layers 1 --hidden 48 --heads 3 --vocab 64 --seq 8 --mesh tp=2 --emulate 2:0",
       "shardscope: error: --mesh tp=2: the heads (3) must divide by tp (each rank holds heads/tp of the attention)"},
      {" --model gpt2 --layers 1 --hidden 32 --heads 4 --vocab 50 --seq 8 --mesh tp=4 --emulate 4:0",
       "shardscope: error: --mesh tp=4: the vocabulary (50) must divide by tp (each rank holds vocab/tp rows of the "
       "embedding and the head; Megatron pads it)"},
      {" --model gpt2 --layers 1 --hidden 32 --heads 4 --ffn 90 --vocab 64 --seq 8 --mesh tp=4 --emulate 4:0",
       "shardscope: error: --mesh tp=4: the ffn (90) must divide by tp (each rank holds ffn/tp of the MLP's inner "
       "features)"},
      {" --model llama --layers 1 --hidden 48 --heads 12 --kv-heads 6 --ffn 48 --vocab 64 --seq 8 --mesh tp=4 "
       "--emulate 4:0",
       "shardscope: error: --mesh tp=4: the kv heads (6) must divide by tp (each rank holds kv_heads/tp of them) or "
       "divide tp (each kv head replicated on tp/kv_heads ranks)"},
  };
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + c.flags +
                         " > /dev/null 2> err.txt");
    EXPECT_EQ(rc, 2) << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
}

// --sp (Megatron's sequence parallelism) through the binary: every emulated rank of
// dp=2,tp=2, GPT-2 and Llama, ddp and zero3, holds its predictions, its record says sp,
// and its tp group all-gathers and reduce-scatters.
TEST_F(MeshCli, EveryEmulatedRankOfASequenceParallelTransformerHoldsItsPredictions) {
  for (const char* model : {" --model gpt2 --layers 2 --hidden 32 --heads 4 --vocab 64 --seq 8 --batch 2 --steps 2 ",
                            " --model llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 48 --vocab 64 --seq 8 "
                            "--batch 2 --steps 2 "})
    for (const char* strategy : {"ddp", "zero3 --units 1"})
      for (int r = 0; r < 4; ++r) {
        const std::string flags = std::string(model) + "--strategy " + strategy +
                                  " --mesh dp=2,tp=2 --sp --emulate 4:" + std::to_string(r);
        const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + flags +
                             " --json g.json > out.txt 2> err.txt");
        ASSERT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
        std::ifstream in(dir_ + "/g.json");
        const json doc = json::parse(in);
        EXPECT_EQ(doc["runs"][0]["mesh"]["sp"], true) << flags;
        const json& rank = doc["runs"][0]["ranks"][0];
        const json& tp = rank["comm_groups"]["tp"];
        EXPECT_GT(tp["comm_bytes"].get<std::int64_t>(), 0) << flags;
        EXPECT_GT(tp["comm"]["all_gather"]["calls"].get<std::int64_t>(), 0) << tp.dump();
        EXPECT_GT(tp["comm"]["reduce_scatter"]["calls"].get<std::int64_t>(), 0) << tp.dump();
        expect_predicted(rank, flags);
      }
}

TEST_F(MeshCli, WhatSequenceParallelismDoesNotRunIsRefusedNamingSp) {
  const std::string gpt2 = " --model gpt2 --layers 1 --hidden 32 --heads 4 --vocab 64 ";
  const struct {
    std::string flags;
    const char* line;
  } cases[] = {
      {gpt2 + "--seq 8 --sp", "shardscope: error: --sp: sequence parallelism splits the sequence over the "
                              "tensor-parallel ranks; give --mesh with tp > 1 (e.g. --mesh dp=2,tp=2)"},
      {gpt2 + "--seq 8 --mesh dp=2 --sp --emulate 2:0",
       "shardscope: error: --sp: sequence parallelism splits the sequence over the tensor-parallel ranks; give --mesh "
       "with tp > 1 (e.g. --mesh dp=2,tp=2)"},
      {gpt2 + "--seq 6 --mesh tp=4 --sp --emulate 4:0",
       "shardscope: error: --sp and --mesh tp=4: --seq 6 does not divide into 4 tensor-parallel ranks' shards; give a "
       "--seq that tp divides"},
      {gpt2 + "--seq 8 --mesh tp=2 --sp --precision bf16 --emulate 2:0",
       "shardscope: error: --sp and --precision bf16: sequence parallelism under autocast is not built yet; give "
       "--precision fp32"},
      {" --model gpt2 --layers 2 --hidden 32 --heads 4 --vocab 64 --seq 8 --batch 3 --mesh tp=2,pp=2 --sp "
       "--schedule zb-h1 --microbatches 3 --emulate 4:0",
       "shardscope: error: --sp and --schedule zb-h1: the zero-bubble split (B and W apart) of a sequence-parallel "
       "stage is not built yet; allowed: gpipe, 1f1b, interleaved-1f1b"},
      {" --layers 2 --width 32 --mesh tp=2 --sp --emulate 2:0",
       "shardscope: error: --sp and --model mlp: sequence parallelism splits a transformer's sequence (the MLP has "
       "none); give --model gpt2|llama or drop --sp"},
  };
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + c.flags +
                         " > /dev/null 2> err.txt");
    EXPECT_EQ(rc, 2) << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
}

}  // namespace
