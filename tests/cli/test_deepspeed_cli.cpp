// --engine deepspeed through the binary: a run's record says deepspeed and holds its
// predictions on every rank (emulated at W = 3 and under mpirun at W = 2; the MLP, GPT-2 and
// Llama; --accumulate), the table labels the engine; every combination it does not take is exit 2 with
// one line naming it; plan prints stage 3's model states and its peak (the MLP, GPT-2 and Llama
// in fp32, the MLP and GPT-2 in bf16), and says why Llama's bf16 has none.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

class DeepSpeedCli : public shardscope::testing::BinaryTest {
 protected:
  static constexpr const char* kMlp = "--layers 4 --width 37 --batch 6 --activation relu --loss mse ";
  static constexpr const char* kGpt2 = "--model gpt2 --hidden 16 --heads 2 --vocab 29 --seq 6 --layers 2 --batch 2 ";
  static constexpr const char* kLlama =
      "--model llama --hidden 16 --heads 4 --kv-heads 2 --ffn 24 --vocab 13 --seq 6 --layers 2 --batch 2 ";
  // Stage 3 keeps a tensor of at most 100,000 elements gathered (DeepSpeed's default
  // persistence threshold): these gather the MLP's weights (c_fc's, mlp.c_proj's: 102,400
  // elements; gate's, up's, down's) in each module's hooks.
  static constexpr const char* kGpt2Wide =
      "--model gpt2 --hidden 160 --heads 2 --vocab 29 --seq 4 --layers 1 --batch 1 ";
  static constexpr const char* kLlamaWide =
      "--model llama --hidden 160 --heads 4 --kv-heads 2 --ffn 640 --vocab 13 --seq 4 --layers 1 --batch 1 ";
  static void expect_predicted(const json& rank, const std::string& what) {
    const json& p = rank["predicted"];
    EXPECT_GT(rank["resting"]["total"].get<long long>(), 0) << what;
    EXPECT_EQ(rank["resting"], p["resting"]) << what;
    EXPECT_EQ(rank["peak"]["total"], p["peak_total"]) << what;
    EXPECT_EQ(rank["peak"]["by_category"], p["peak_by_category"]) << what;
    EXPECT_EQ(rank["comm_bytes"], p["comm_bytes"]) << what;
  }
  std::string read(const std::string& file) {
    std::ifstream in(dir_ + "/" + file);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
};

TEST_F(DeepSpeedCli, EveryEmulatedRankRecordsItsEngineAndPrediction) {
  for (const char* model : {kMlp, kGpt2, kLlama, kGpt2Wide, kLlamaWide})
    for (const char* strategy : {"zero1", "zero2", "zero3"})
      for (int r = 0; r < 3; ++r) {
        const std::string flags = std::string(model) + "--steps 2 --engine deepspeed --strategy " + strategy +
                                  " --emulate 3:" + std::to_string(r);
        const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + flags +
                             " --json r.json > out.txt 2> err.txt");
        ASSERT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
        const json run = json::parse(read("r.json"))["runs"][0];
        EXPECT_EQ(run["engine"], "deepspeed") << flags;
        expect_predicted(run["ranks"][0], flags);
        EXPECT_NE(read("out.txt").find(std::string(strategy) + " engine=deepspeed"), std::string::npos) << flags;
      }
}

TEST_F(DeepSpeedCli, UnderMpirunBothRanksHoldTheirPredictions) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  const struct {
    const char* model;
    const char* strategy;
  } cases[] = {{kMlp, "zero1"},  {kMlp, "zero2"},  {kGpt2, "zero2"}, {kLlama, "zero1"},
               {kMlp, "zero2 --accumulate 2"}, {kGpt2, "zero1 --accumulate 3 --no-sync"},
               {kMlp, "zero3"}, {kMlp, "zero3 --accumulate 2"}, {kMlp, "zero2 --precision bf16"},
               {kMlp, "zero3 --precision bf16"}, {kMlp, "zero1 --precision bf16 --accumulate 2 --checkpoint full"},
               {kMlp, "zero1 --checkpoint full"}, {kLlama, "zero2 --checkpoint every:2"},
               {kMlp, "zero3 --checkpoint full"},
               {kGpt2Wide, "zero3"}, {kLlamaWide, "zero3 --accumulate 2"}, {kLlama, "zero3"},
               {kGpt2Wide, "zero3 --precision bf16 --accumulate 2"}, {kLlamaWide, "zero3 --precision bf16"},
               {kMlp, "ddp --precision bf16 --accumulate 2"}, {kGpt2, "ddp --precision bf16 --checkpoint full"},
               {kGpt2, "zero2 --precision bf16 --accumulate 2 --checkpoint every:2"}};
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout -k 5 120 mpirun --oversubscribe -np 2 '" + bin_ +
                         "' run --backend cpu --comm mpi " + c.model + "--steps 2 --engine deepspeed --strategy " +
                         c.strategy + " --json m.json > out.txt 2> err.txt");
    ASSERT_EQ(rc, 0) << first_line(dir_ + "/err.txt");
    const json run = json::parse(read("m.json"))["runs"][0];
    EXPECT_EQ(run["engine"], "deepspeed");
    ASSERT_EQ(run["ranks"].size(), 2u);
    for (const json& rank : run["ranks"])
      expect_predicted(rank, std::string(c.model) + c.strategy + " rank " + rank["rank"].dump());
  }
#endif
}

// --checkpoint full and every:2 under stages 1 and 2, emulated at W = 3 (the MLP, GPT-2
// under attention too, Llama), and stage 3 of the MLP (ReLU and none): every rank holds its
// predictions.
TEST_F(DeepSpeedCli, CheckpointedStagesOnEveryEmulatedRank) {
  const struct {
    const char* model;
    const char* flags;
  } cases[] = {{kMlp, "--strategy zero1 --checkpoint full"},
               {kMlp, "--strategy zero2 --checkpoint every:2 --accumulate 2"},
               {kGpt2, "--strategy zero2 --checkpoint attention"},
               {kMlp, "--strategy zero3 --checkpoint full"},
               {"--layers 3 --width 37 --batch 4 --loss mse ", "--strategy zero3 --checkpoint every:2"},
               {kLlama, "--strategy zero1 --checkpoint full"},
               // Stage 3 of a transformer: the MLP's weights gathered in each module's hooks,
               // a wrapped block's re-run gathering them again.
               {kGpt2Wide, "--strategy zero3 --checkpoint full"},
               {kLlamaWide, "--strategy zero3 --checkpoint full --accumulate 2"},
               {kGpt2Wide, "--strategy zero3 --checkpoint attention"},
               {kLlama, "--strategy zero3 --checkpoint every:2"}};
  for (const auto& c : cases)
    for (int r = 0; r < 3; ++r) {
      const std::string all = std::string(c.model) + "--steps 2 --engine deepspeed " + c.flags + " --emulate 3:" +
                              std::to_string(r);
      const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + all +
                           " --json r.json > out.txt 2> err.txt");
      ASSERT_EQ(rc, 0) << all << ": " << first_line(dir_ + "/err.txt");
      const json run = json::parse(read("r.json"))["runs"][0];
      expect_predicted(run["ranks"][0], all);
    }
}

TEST_F(DeepSpeedCli, CombinationsItDoesNotTakeAreExitTwo) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {"--engine deepspeed --strategy zero2 --units 2",
       "shardscope: error: --units and --engine deepspeed: DeepSpeed's ZeRO has no units (one flat group); drop --units"},
      {"--engine deepspeed --strategy zero2 --accumulate 2 --no-sync",
       "shardscope: error: --no-sync and --engine deepspeed and --strategy zero2: DeepSpeed's no_sync asserts it is "
       "incompatible with ZeRO stage 2/3 (they partition gradients as backward runs); allowed: --strategy zero1, or "
       "--accumulate without --no-sync"},
      {"--engine deepspeed --strategy zero1 --ddp-bucket copy",
       "shardscope: error: --ddp-bucket and --engine deepspeed and --strategy zero1: DeepSpeed's buckets are its own "
       "(--bucket-mb); drop --ddp-bucket"},
      // 37 x 37 = 1,369 elements; 0.001 MiB holds 262.
      {"--engine deepspeed --strategy zero2 --bucket-mb 0.001",
       "shardscope: error: --bucket-mb 0.001 and --engine deepspeed: the bucket must hold the largest tensor, 1369 "
       "elements (5476 B); give 0 or at least that"},
  };
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + kMlp + c.flags +
                         " > /dev/null 2> err.txt");
    EXPECT_EQ(rc, 2) << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
  // ddp under --engine deepspeed is torch's: it takes what torch's does.
  EXPECT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + kMlp +
                  "--steps 1 --engine deepspeed --strategy ddp --ddp-bucket copy > /dev/null 2> err.txt"),
            0)
      << first_line(dir_ + "/err.txt");
}

// --accumulate 3 through the binary, emulated at W = 3: stage 2 all-reduces its buckets every
// micro-step (3 × 4P), stage 1 once at the boundary, with or without --no-sync (the same
// record); every rank holds its predictions. plan skips zero2 under --no-sync with the reason.
TEST_F(DeepSpeedCli, AccumulationOnEveryEmulatedRank) {
  const long long P = 4 * (37 * 37 + 37);  // kMlp: 5,624 parameters, one bucket
  for (const char* flags : {"--strategy zero1 --accumulate 3", "--strategy zero1 --accumulate 3 --no-sync",
                            "--strategy zero2 --accumulate 3"})
    for (int r = 0; r < 3; ++r) {
      const std::string all = std::string(kMlp) + "--steps 2 --engine deepspeed " + flags + " --emulate 3:" +
                              std::to_string(r);
      const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + all +
                           " --json r.json > out.txt 2> err.txt");
      ASSERT_EQ(rc, 0) << all << ": " << first_line(dir_ + "/err.txt");
      const json rank = json::parse(read("r.json"))["runs"][0]["ranks"][0];
      expect_predicted(rank, all);
      const bool stage2 = std::string(flags).find("zero2") != std::string::npos;
      EXPECT_EQ(rank["comm"]["all_reduce"]["bytes"].get<long long>(), 4 * P * (stage2 ? 3 : 1)) << all;
      EXPECT_EQ(rank["comm"]["all_reduce"]["calls"].get<long long>(), stage2 ? 3 : 1) << all;
    }
  const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' plan " + kMlp +
                       "--engine deepspeed --strategies zero1,zero2 --worlds 3 --accumulate 2 --no-sync "
                       "> out.txt 2> err.txt");
  ASSERT_EQ(rc, 0) << first_line(dir_ + "/err.txt");
  EXPECT_NE(read("out.txt").find("DeepSpeed's no_sync asserts it is incompatible with ZeRO stage 2/3"),
            std::string::npos)
      << read("out.txt");
}

// --precision bf16 runs the MLP's and GPT-2's ddp (DeepSpeed's stage 0), zero1, zero2 and
// zero3 (DeepSpeed's bf16 regime), with --accumulate and --checkpoint (attention too):
// every emulated rank at W = 3 holds its predictions, the record says bf16 and deepspeed;
// Llama's (and GPT-2's) ddp, accumulated and checkpointed zero1 and zero2 (--checkpoint
// attention too: the bf16 module's recompute) and zero3 (attention too) run.
TEST_F(DeepSpeedCli, Bf16OnEveryEmulatedRank) {
  const struct {
    const char* model;
    const char* strategy;
  } runs[] = {{kMlp, "zero1"},
              {kMlp, "zero2"},
              {kMlp, "zero3"},
              {kMlp, "zero1 --accumulate 2 --checkpoint full"},
              {kMlp, "zero2 --accumulate 3 --checkpoint every:2"},
              {kMlp, "zero3 --accumulate 2 --checkpoint full"},
              {kGpt2, "zero1"},
              {kGpt2, "zero2"},
              {kGpt2, "zero3"},
              {kGpt2, "zero3 --accumulate 2 --bucket-mb 0.07"},
              {kGpt2, "zero1 --accumulate 2 --no-sync --checkpoint full"},
              {kMlp, "ddp"},
              {kMlp, "ddp --accumulate 2 --checkpoint every:2 --bucket-mb 0.001"},
              {kGpt2, "ddp --checkpoint full"},
              {kGpt2, "ddp --accumulate 3 --no-sync --attention math"},
              {kGpt2, "zero2 --accumulate 3 --checkpoint every:2 --attention math"},
              {kGpt2Wide, "zero3 --checkpoint full"},
              {kGpt2, "zero3 --accumulate 2 --checkpoint every:2 --attention math"},
              {kLlama, "zero1"},
              {kLlama, "zero2 --attention math"},
              {kLlama, "zero3"},
              {kLlama, "zero3 --accumulate 2 --attention math --bucket-mb 0.07"},
              {kLlamaWide, "zero3 --checkpoint full"},
              {kLlama, "zero3 --accumulate 2 --checkpoint every:2 --attention math"},
              {kLlama, "ddp --accumulate 2 --checkpoint full"},
              {kLlama, "zero1 --accumulate 3 --no-sync --checkpoint every:2"},
              {kLlama, "ddp --checkpoint attention --attention math"},
              {kLlama, "zero1 --accumulate 2 --checkpoint attention"},
              {kLlama, "zero2 --accumulate 2 --checkpoint full --attention math"},
              {kGpt2, "ddp --checkpoint attention --attention math"},
              {kGpt2, "zero1 --accumulate 2 --checkpoint attention"},
              {kGpt2, "zero2 --checkpoint attention --attention math"},
              {kGpt2Wide, "zero3 --checkpoint attention --attention math"},
              {kGpt2, "zero3 --accumulate 2 --checkpoint attention"},
              {kLlama, "zero3 --checkpoint attention --attention math"},
              {kLlamaWide, "zero3 --accumulate 2 --checkpoint attention"}};
  for (const auto& [model, strategy] : runs)
    for (int r = 0; r < 3; ++r) {
      const std::string flags = std::string(model) + "--steps 2 --engine deepspeed --precision bf16 --strategy " +
                                strategy + " --emulate 3:" + std::to_string(r);
      const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + flags +
                           " --json r.json > out.txt 2> err.txt");
      ASSERT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
      const json run = json::parse(read("r.json"))["runs"][0];
      EXPECT_EQ(run["precision"], "bf16") << flags;
      EXPECT_EQ(run["engine"], "deepspeed") << flags;
      expect_predicted(run["ranks"][0], flags);
      EXPECT_GT(run["ranks"][0]["resting"]["master"].get<long long>(), 0) << flags;
    }
  const struct {
    std::string flags;
    const char* line;
  } refused[] = {
      {std::string(kGpt2) + "--engine deepspeed --precision bf16 --strategy zero2 --accumulate 2 --no-sync",
       "shardscope: error: --no-sync and --engine deepspeed and --strategy zero2: DeepSpeed's no_sync asserts it is "
       "incompatible with ZeRO stage 2/3 (they partition gradients as backward runs); allowed: --strategy zero1, or "
       "--accumulate without --no-sync"},
  };
  for (const auto& c : refused) {
    EXPECT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + c.flags +
                    " > /dev/null 2> err.txt"),
              2)
        << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
}

TEST_F(DeepSpeedCli, PlanPrintsStageThreesModelStatesAndPeak) {
  const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' plan " + kMlp +
                       "--engine deepspeed --strategies zero2,zero3 --worlds 3 --bytes exact > out.txt 2> err.txt");
  ASSERT_EQ(rc, 0) << first_line(dir_ + "/err.txt");
  const std::string out = read("out.txt");
  // Stage 3 of 4 x 37 over 3 ranks: each weight (1,369) in partitions of 457, each bias (37)
  // of 13: C = 1,880; every tensor persistent (5,624 elements): param 8C + 4·5,624 =
  // 37,536, grad 4C = 7,520, optim 8C + 4 = 15,044: model states 60,100 B; at rest the
  // bucket too (4P = 22,496): 82,596 B, and the MLP's step is predicted.
  EXPECT_NE(out.find("zero3 engine=deepspeed"), std::string::npos) << out;
  EXPECT_NE(out.find("  82,596  "), std::string::npos) << out;
  EXPECT_NE(out.find("  60,100"), std::string::npos) << out;
  EXPECT_EQ(out.find("(note) DeepSpeed's"), std::string::npos) << out;
  // A transformer's stage 3 in fp32 and bf16 is planned with its peak, as an emulated rank
  // measures it (under --checkpoint too, attention included).
  const std::string bf16_gpt2 = std::string(kGpt2Wide) + "--precision bf16 ";
  const std::string bf16_llama = std::string(kLlamaWide) + "--precision bf16 ";
  for (const std::string& model :
       {std::string(kGpt2Wide), std::string(kLlamaWide), bf16_gpt2, bf16_llama,
        std::string(kGpt2Wide) + "--checkpoint full ",
        std::string(kLlamaWide) + "--checkpoint full ", std::string(kGpt2Wide) + "--checkpoint every:2 ",
        std::string(kLlamaWide) + "--checkpoint every:2 ", bf16_gpt2 + "--checkpoint full ",
        bf16_llama + "--checkpoint full ", bf16_gpt2 + "--checkpoint attention --attention math ",
        bf16_llama + "--checkpoint attention "}) {
    ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' plan " + model +
                    "--engine deepspeed --strategies zero3 --worlds 3 --bytes exact --json p.json > out.txt 2> err.txt"),
              0)
        << first_line(dir_ + "/err.txt");
    const std::string text = read("out.txt");
    EXPECT_EQ(text.find("peak unknown"), std::string::npos) << text;
    EXPECT_EQ(text.find("(note) DeepSpeed's"), std::string::npos) << text;
    const json plan = json::parse(read("p.json"));
    json planned;  // rank 1's group
    for (const json& g : plan["plans"][0]["rank_groups"])
      if (g["first"].get<int>() <= 1 && 1 <= g["last"].get<int>()) planned = g["predicted"];
    ASSERT_FALSE(planned.is_null()) << model;
    ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + model +
                    "--engine deepspeed --strategy zero3 --emulate 3:1 --json r.json > /dev/null 2> err.txt"),
              0)
        << first_line(dir_ + "/err.txt");
    const json measured = json::parse(read("r.json"))["runs"][0]["ranks"][0];
    EXPECT_EQ(planned["peak_total"], measured["peak"]["total"]) << model;
    EXPECT_EQ(planned["peak_where"], measured["peak"]["where"]) << model;
    EXPECT_EQ(measured["peak"]["total"], measured["predicted"]["peak_total"]) << model;
  }
}

// plan prints the peak of GPT-2's bf16 ddp, zero1 and zero2 with --accumulate and --checkpoint
// (attention too) as
// an emulated rank measures it (W = 3, rank 1: its group's row), no "peak unknown".
TEST_F(DeepSpeedCli, PlanPrintsBf16Gpt2sPeakAsARunMeasuresIt) {
  for (const char* flags : {"--strategy zero1 --accumulate 2 --checkpoint full",
                            "--strategy zero2 --accumulate 3 --checkpoint every:2",
                            "--strategy ddp --accumulate 2 --checkpoint every:2",
                            "--strategy zero1 --checkpoint attention --attention math",
                            "--strategy zero2 --accumulate 2 --checkpoint attention"}) {
    std::string planned_flags = std::string(flags).replace(0, 10, "--strategies");
    ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' plan " + kGpt2 +
                    "--engine deepspeed --precision bf16 " + planned_flags +
                    " --worlds 3 --bytes exact --json p.json > out.txt 2> err.txt"),
              0)
        << flags << ": " << first_line(dir_ + "/err.txt");
    const std::string text = read("out.txt");
    EXPECT_EQ(text.find("peak unknown"), std::string::npos) << text;
    const json plan = json::parse(read("p.json"));
    json planned;
    for (const json& g : plan["plans"][0]["rank_groups"])
      if (g["first"].get<int>() <= 1 && 1 <= g["last"].get<int>()) planned = g["predicted"];
    ASSERT_FALSE(planned.is_null()) << flags;
    ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + kGpt2 +
                    "--engine deepspeed --precision bf16 " + flags + " --emulate 3:1 --json r.json > /dev/null 2> err.txt"),
              0)
        << first_line(dir_ + "/err.txt");
    const json measured = json::parse(read("r.json"))["runs"][0]["ranks"][0];
    EXPECT_EQ(planned["peak_total"], measured["peak"]["total"]) << flags;
    EXPECT_EQ(planned["peak_where"], measured["peak"]["where"]) << flags;
    EXPECT_EQ(measured["peak"]["total"], measured["predicted"]["peak_total"]) << flags;
  }
}

// plan --engine deepspeed --precision bf16 reproduces the ZeRO paper's Figure 1: Ψ = 7.5B
// (a Llama of exactly 7,500,000,000 parameters: test_deepspeed.cpp's FigureOneModelStatesByHand)
// at N = 64: 120, 31.4, 16.6 and 1.9 GB per rank; the baseline's run (ddp) of the MLP rests at
// what the plan counts, less the gradients the step frees.
TEST_F(DeepSpeedCli, PlanReproducesTheZeroPapersFigureOne) {
  const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ +
                       "' plan --model llama --layers 38 --hidden 3840 --heads 30 --ffn 11452 --vocab 31920 "
                       "--engine deepspeed --precision bf16 --strategies ddp,zero1,zero2,zero3 --worlds 64 "
                       "> out.txt 2> err.txt");
  ASSERT_EQ(rc, 0) << first_line(dir_ + "/err.txt");
  const std::string out = read("out.txt");
  EXPECT_NE(out.find("P = 7,500,000,000 params"), std::string::npos) << out;
  const std::size_t block = out.find("model states per rank as the ZeRO paper counts them");
  ASSERT_NE(block, std::string::npos) << out;
  const struct {
    const char* strategy;
    const char* gb;
  } figure[] = {{"ddp", "120.0"}, {"zero1", "31.4"}, {"zero2", "16.6"}, {"zero3", "1.9"}};
  for (const auto& f : figure) {
    // Its row in the block: "<strategy> engine=deepspeed precision=bf16  64  all  ...  <GB>".
    const std::string label = std::string(f.strategy) + " engine=deepspeed precision=bf16";
    const std::size_t at = out.find("\n  " + label + " ", block);
    ASSERT_NE(at, std::string::npos) << label << "\n" << out;
    const std::string line = out.substr(at + 1, out.find('\n', at + 1) - at - 1);
    const std::string gb = std::string(" ") + f.gb;
    EXPECT_EQ(line.substr(line.size() - gb.size()), gb) << line;
  }
  // The paper's baseline (ddp, DeepSpeed's stage 0: FP16_Optimizer in bf16) runs the MLP,
  // GPT-2 and Llama: an emulated rank of the MLP rests at 14P + 4 and its model states are the
  // plan's 16P + 4 (P = 5,624: 78,740 and 89,988 B); Llama's the same way, its model states
  // its resting bytes plus its bf16 gradients (2P, the bf16 group's bytes).
  ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + kMlp +
                  "--engine deepspeed --precision bf16 --strategy ddp --emulate 64:63 --json r.json > /dev/null "
                  "2> err.txt"),
            0)
      << first_line(dir_ + "/err.txt");
  const json rank = json::parse(read("r.json"))["runs"][0]["ranks"][0];
  EXPECT_EQ(rank["resting"]["total"], 78'740);
  EXPECT_EQ(rank["predicted"]["model_states"], 89'988);
  ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu " + kLlama +
                  "--engine deepspeed --precision bf16 --strategy ddp --emulate 64:0 --json r.json > /dev/null "
                  "2> err.txt"),
            0)
      << first_line(dir_ + "/err.txt");
  const json llama = json::parse(read("r.json"))["runs"][0]["ranks"][0];
  expect_predicted(llama, "llama ddp");
  EXPECT_EQ(llama["predicted"]["model_states"].get<long long>(),
            llama["resting"]["total"].get<long long>() + llama["resting"]["param"].get<long long>());
  EXPECT_EQ(llama["resting"]["master"].get<long long>(), 2 * llama["resting"]["param"].get<long long>());
}

}  // namespace
