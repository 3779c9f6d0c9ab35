// --precision through the binary: every record (a run's of either kind, a plan's) says its
// precision, fp32 by default; the MLP, GPT-2 and Llama run bf16 under ddp and zero1 (the
// torch engine's autocast, --accumulate too, and for GPT-2 and Llama --checkpoint
// full|every:K) with every figure of the record equal to its prediction, emulated at W = 3
// and under mpirun at W = 2 (the MLP's record naming its bf16 GEMM); bf16 where it is not
// built is refused by name on run, sweep and plan (exit 2, one line), as is a precision
// that does not exist.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

class Precision : public shardscope::testing::BinaryTest {
 protected:
  json read(const std::string& file) {
    std::ifstream in(dir_ + "/" + file);
    return json::parse(in);
  }
  int binary(const std::string& args) {
    return shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' " + args + " > out.txt 2> err.txt");
  }
};

TEST_F(Precision, RecordsSayFp32ByDefaultAndWhenAskedFor) {
  const std::string mlp = "--backend cpu --layers 2 --width 8 --batch 4 --steps 2 ";
  ASSERT_EQ(binary("run " + mlp + "--strategy zero1 --emulate 2:1 --json dp.json"), 0) << first_line(dir_ + "/err.txt");
  EXPECT_EQ(read("dp.json")["runs"][0]["precision"], "fp32");
  ASSERT_EQ(binary("run " + mlp + "--precision fp32 --schedule 1f1b --emulate 2:0 --json pp.json"), 0)
      << first_line(dir_ + "/err.txt");
  EXPECT_EQ(read("pp.json")["runs"][0]["precision"], "fp32");
  ASSERT_EQ(binary("plan --layers 2 --width 8 --worlds 2 --strategies ddp,zero3 --schedules 1f1b --json plan.json"), 0)
      << first_line(dir_ + "/err.txt");
  const json plans = read("plan.json")["plans"];
  ASSERT_EQ(plans.size(), 3u);
  for (const json& p : plans) EXPECT_EQ(p["precision"], "fp32") << p.dump();
}

// A rank's record: saves, peak (total, per category, phase and place) and resting bytes
// equal their predictions, and it says bf16.
void expect_bf16_rank_as_predicted(const json& run, const json& rank, const std::string& what) {
  EXPECT_EQ(run["precision"], "bf16") << what;
  const json& p = rank["predicted"];
  ASSERT_GT(rank["saved"]["after_forward_bytes"].get<std::int64_t>(), 0) << what;
  EXPECT_EQ(rank["saved"], p["saved"]) << what;
  EXPECT_EQ(rank["peak"]["total"], p["peak_total"]) << what;
  EXPECT_EQ(rank["peak"]["by_category"], p["peak_by_category"]) << what;
  EXPECT_EQ(rank["peak"]["phase"], p["peak_phase"]) << what;
  EXPECT_EQ(rank["peak"]["where"], p["peak_where"]) << what;
  EXPECT_EQ(rank["resting"]["total"], p["resting_total"]) << what;
}

const char* const kGpt2 = "--model gpt2 --layers 2 --hidden 32 --heads 2 --vocab 50 --seq 8 --batch 2 --steps 2 ";
const char* const kLlama =
    "--model llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --ffn 48 --vocab 50 --seq 8 --batch 2 --steps 2 ";

TEST_F(Precision, TransformersRunBf16AsPredictedOnEveryRank) {
  for (const char* model : {kGpt2, kLlama})
    for (const char* strategy : {"ddp", "zero1"})
      for (const char* attention : {"flash", "math"})
        for (int rank = 0; rank < 3; ++rank) {
          const std::string args = std::string("run --backend cpu ") + model + "--precision bf16 --strategy " +
                                   strategy + " --attention " + attention + " --emulate 3:" + std::to_string(rank);
          ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
          const json run = read("r.json")["runs"][0];
          expect_bf16_rank_as_predicted(run, run["ranks"][0], args);
        }
  // Accumulation and checkpointing (a wrapped block's casts held in autocast's cache until
  // the loss's end).
  for (const char* acc : {"--strategy ddp --accumulate 2", "--strategy zero1 --accumulate 3 --no-sync",
                          "--strategy zero1 --checkpoint full", "--strategy ddp --checkpoint every:2 --attention math",
                          "--strategy zero1 --checkpoint attention"}) {
    const std::string args = std::string("run --backend cpu ") + kLlama + "--precision bf16 " + acc + " --emulate 3:2";
    ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
    const json run = read("r.json")["runs"][0];
    expect_bf16_rank_as_predicted(run, run["ranks"][0], args);
  }
  // Selective recompute of the attention core under autocast, GPT-2 with both attentions.
  for (const char* attention : {"flash", "math"}) {
    const std::string args = std::string("run --backend cpu ") + kGpt2 +
                             "--precision bf16 --strategy ddp --checkpoint attention --attention " + attention +
                             " --emulate 3:1";
    ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
    const json run = read("r.json")["runs"][0];
    expect_bf16_rank_as_predicted(run, run["ranks"][0], args);
  }
  // The table's label says it.
  std::ifstream out(dir_ + "/out.txt");
  const std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("precision=bf16"), std::string::npos) << text;
}

// A pipeline stage's record under bf16: saves, resting, peak (per category, param_cast among
// them) and communication equal their predictions.
void expect_bf16_stage_as_predicted(const json& run, const json& stage, const std::string& what) {
  EXPECT_EQ(run["precision"], "bf16") << what;
  const json& p = stage["predicted"];
  EXPECT_EQ(stage["resting"]["total"], p["resting_total"]) << what;
  EXPECT_EQ(stage["peak"]["total"], p["peak_total"]) << what;
  EXPECT_EQ(stage["peak"]["by_category"], p["peak_by_category"]) << what;
  EXPECT_GT(stage["peak"]["by_category"]["param_cast"].get<std::int64_t>(), 0) << what;
  EXPECT_EQ(stage["saved"]["peak_live_bytes"], p["peak_live_bytes"]) << what;
  EXPECT_EQ(stage["comm_bytes"], p["comm_bytes"]) << what;
}

// Pipelines under autocast: every stage of gpipe, 1f1b and interleaved-1f1b at S = 2 (and
// 4), GPT-2 and Llama, and every rank of --mesh dp=2,pp=2, emulated.
TEST_F(Precision, TransformerPipelinesRunBf16AsPredictedOnEveryStage) {
  for (const std::string& model : {std::string(kGpt2), std::string(kLlama)})
    for (const char* schedule : {"gpipe --microbatches 2", "1f1b --microbatches 2",
                                 "interleaved-1f1b --chunks 2 --microbatches 2"})
      for (int rank = 0; rank < 2; ++rank) {
        // interleaved: 4 virtual stages, a block each
        const std::string m = schedule[0] == 'i' ? model.substr(0, model.find("--layers")) + "--layers 4" +
                                                       model.substr(model.find("--layers") + 10)
                                                 : model;
        const std::string args = std::string("run --backend cpu ") + m + "--precision bf16 --schedule " +
                                 schedule + " --emulate 2:" + std::to_string(rank);
        ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
        const json run = read("r.json")["runs"][0];
        expect_bf16_stage_as_predicted(run, run["stages"][0], args);
      }
  for (const char* model : {kGpt2, kLlama})
    for (int rank = 0; rank < 4; ++rank) {
      const std::string args = std::string("run --backend cpu ") + model +
                               "--precision bf16 --mesh dp=2,pp=2 --schedule 1f1b --microbatches 2 --emulate 4:" +
                               std::to_string(rank);
      ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
      const json run = read("r.json")["runs"][0];
      expect_bf16_stage_as_predicted(run, run["stages"][0], args);
    }
}

// --autocast-region step through the binary: every emulated stage as predicted, the record
// saying autocast_region step, a transformer's casts below the micro-batch regions' where two
// micro-batches are in flight; the flag refused (exit 2, naming it) outside a bf16 pipeline.
TEST_F(Precision, AutocastRegionStepRunsAsPredictedAndIsRefusedElsewhere) {
  for (const std::string& model : {std::string(kGpt2), std::string(kLlama),
                                   std::string("--layers 3 --width 24 --batch 5 --activation relu --loss mse --steps 2 ")})
    for (int rank = 0; rank < 2; ++rank) {
      std::int64_t casts[2] = {0, 0};
      for (const char* region : {"microbatch", "step"}) {
        const std::string args = "run --backend cpu " + model + "--precision bf16 --schedule gpipe --microbatches 2 " +
                                 "--autocast-region " + region + " --emulate 2:" + std::to_string(rank);
        ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
        const json run = read("r.json")["runs"][0];
        EXPECT_EQ(run["autocast_region"], region) << args;
        expect_bf16_stage_as_predicted(run, run["stages"][0], args);
        casts[region[0] == 's'] = run["stages"][0]["peak"]["by_category"]["param_cast"].get<std::int64_t>();
      }
      // A transformer's casts are all saved: one copy of them, where two micro-batches held
      // two. (The MLP's first stage holds its unsaved casts, the first weight's and the
      // biases', to the step's end: with two layers more than its regions at their peak.)
      if (model.rfind("--model", 0) == 0) {
        EXPECT_LT(casts[1], casts[0]) << model << " stage " << rank;
      }
    }
  for (const std::string& args :
       {std::string("run --model mlp --precision bf16 --autocast-region step --steps 1"),
        std::string("run --schedule 1f1b --microbatches 2 --autocast-region microbatch --steps 1"),
        std::string("run --precision bf16 --schedule 1f1b --microbatches 2 --autocast-region once --steps 1")}) {
    EXPECT_EQ(binary(args), 2) << args;
    EXPECT_NE(first_line(dir_ + "/err.txt").find("--autocast-region"), std::string::npos) << args;
  }
}

// Under mpirun: the two stages of a GPT-2 and a Llama pipeline (W = 2), and the four ranks
// of --mesh dp=2,pp=2 (W = 4), each as predicted; the last stage reports the loss.
TEST_F(Precision, TransformerPipelinesRunBf16UnderMpirunAsPredicted) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  const struct {
    int np;
    std::string run;
  } cases[] = {{2, std::string(kGpt2) + "--schedule 1f1b --microbatches 2"},
               {2, std::string(kLlama) + "--schedule gpipe --microbatches 2 --attention math"},
               {2, "--model gpt2 --layers 4 --hidden 32 --heads 2 --vocab 50 --seq 8 --batch 2 --steps 2 --schedule "
                   "interleaved-1f1b --chunks 2 --microbatches 2"},
               {4, std::string(kLlama) + "--mesh dp=2,pp=2 --schedule 1f1b --microbatches 2"},
               // the MLP's stages exchange bf16 (odd widths: 5·24 = 120 elements a micro-batch)
               {2, "--layers 3 --width 24 --batch 5 --activation relu --loss mse --steps 2 --schedule 1f1b "
                   "--microbatches 2"},
               {4, "--layers 3 --width 24 --batch 5 --activation none --loss sum --steps 2 --mesh dp=2,pp=2 "
                   "--schedule gpipe --microbatches 2"}};
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout -k 5 120 mpirun --oversubscribe -np " + std::to_string(c.np) +
                         " '" + bin_ + "' run --backend cpu --comm mpi " + c.run +
                         " --precision bf16 --json m.json > out.txt 2> err.txt");
    ASSERT_EQ(rc, 0) << c.run << ": " << first_line(dir_ + "/err.txt");
    const json r = read("m.json")["runs"][0];
    ASSERT_EQ(r["stages"].size(), static_cast<std::size_t>(c.np));
    for (const json& stage : r["stages"]) expect_bf16_stage_as_predicted(r, stage, c.run + " rank " + stage["rank"].dump());
    EXPECT_TRUE(r["stages"][c.np - 1]["loss"].is_array()) << c.run;
  }
#endif
}

// The MLP's pipeline under autocast sends bf16: every stage of each built schedule as
// predicted, emulated, its p2p bytes 2 B an element (half fp32's).
TEST_F(Precision, MlpPipelinesRunBf16AsPredictedOnEveryStage) {
  for (const char* schedule : {"gpipe --microbatches 3", "1f1b --microbatches 3", "interleaved-1f1b --chunks 2 "
                               "--microbatches 2 --layers 4"})
    for (int rank = 0; rank < 2; ++rank) {
      const std::string flags = std::string("--width 24 --batch 5 --activation relu --loss mse --steps 2 ") +
                                (schedule[0] == 'i' ? "" : "--layers 3 ") + "--schedule " + schedule +
                                " --emulate 2:" + std::to_string(rank);
      ASSERT_EQ(binary("run --backend cpu --precision bf16 " + flags + " --json b.json"), 0)
          << flags << ": " << first_line(dir_ + "/err.txt");
      ASSERT_EQ(binary("run --backend cpu " + flags + " --json f.json"), 0) << flags << ": " << first_line(dir_ + "/err.txt");
      const json run = read("b.json")["runs"][0];
      const json& stage = run["stages"][0];
      expect_bf16_stage_as_predicted(run, stage, flags);
      const json fp32 = read("f.json")["runs"][0]["stages"][0];
      EXPECT_EQ(stage["p2p"]["dtype"], "bf16") << flags;
      EXPECT_FALSE(fp32["p2p"].contains("dtype")) << flags;
      ASSERT_GT(stage["p2p"]["sent_bytes"].get<std::int64_t>() + stage["p2p"]["recv_bytes"].get<std::int64_t>(), 0);
      EXPECT_EQ(2 * stage["p2p"]["sent_bytes"].get<std::int64_t>(), fp32["p2p"]["sent_bytes"].get<std::int64_t>()) << flags;
      EXPECT_EQ(2 * stage["p2p"]["recv_bytes"].get<std::int64_t>(), fp32["p2p"]["recv_bytes"].get<std::int64_t>()) << flags;
    }
}

TEST_F(Precision, TransformersRunBf16UnderMpirunAsPredicted) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  for (const std::string& run : {std::string(kGpt2) + "--strategy zero1", std::string(kLlama) + "--strategy ddp",
                                 std::string(kGpt2) + "--strategy ddp --accumulate 2 --no-sync --attention math",
                                 std::string(kGpt2) + "--strategy zero1 --checkpoint attention --attention math",
                                 std::string(kLlama) + "--strategy ddp --checkpoint attention"}) {
    const int rc = shell("cd '" + dir_ + "' && timeout -k 5 120 mpirun --oversubscribe -np 2 '" + bin_ +
                         "' run --backend cpu --comm mpi " + run + " --precision bf16 --json m.json > out.txt 2> err.txt");
    ASSERT_EQ(rc, 0) << run << ": " << first_line(dir_ + "/err.txt");
    const json r = read("m.json")["runs"][0];
    ASSERT_EQ(r["ranks"].size(), 2u);
    for (const json& rank : r["ranks"]) expect_bf16_rank_as_predicted(r, rank, run + " rank " + rank["rank"].dump());
  }
#endif
}

const char* const kMlp = "--layers 3 --width 24 --batch 5 --activation relu --loss mse --steps 2 ";

// The MLP under autocast: every emulated rank of W = 3 measures its forms, param_cast
// among the peak's categories; the record and the header name the bf16 GEMM.
TEST_F(Precision, Bf16MlpRunsEveryRankAsPredicted) {
  for (const char* strategy : {"ddp", "zero1", "ddp --accumulate 2 --no-sync"})
    for (int r = 0; r < 3; ++r) {
      const std::string args = std::string("run --backend cpu ") + kMlp + "--precision bf16 --strategy " + strategy +
                               " --emulate 3:" + std::to_string(r);
      ASSERT_EQ(binary(args + " --json b.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
      const json run = read("b.json")["runs"][0];
      EXPECT_FALSE(run["bf16_gemm"].get<std::string>().empty()) << args;
      const json& rank = run["ranks"][0];
      expect_bf16_rank_as_predicted(run, rank, args);
      EXPECT_EQ(rank["resting"], rank["predicted"]["resting"]) << args;
      EXPECT_EQ(rank["comm_bytes"], rank["predicted"]["comm_bytes"]) << args;
      EXPECT_GT(rank["peak"]["by_category"]["param_cast"].get<std::int64_t>(), 0) << args;
      std::ifstream o(dir_ + "/out.txt");
      const std::string out((std::istreambuf_iterator<char>(o)), std::istreambuf_iterator<char>());
      EXPECT_NE(out.find("precision=bf16"), std::string::npos) << out;
      EXPECT_NE(out.find("bf16 GEMMs: "), std::string::npos) << out;
    }
}

// zero2/zero3 under bf16 (FSDP1's MixedPrecision; fully_shard's under --engine fsdp2): every emulated rank of W = 3 measures its
// forms; the all-gathers carry bf16 (half the fp32 run's bytes), the reduce-scatters fp32
// (the fp32 run's); a plan of the same rank is the run's prediction; a sweep runs them.
TEST_F(Precision, Bf16FsdpRunsEveryRankAsPredicted) {
  for (const char* strategy : {"zero2 --units 1", "zero3 --units 1", "zero3 --units 2 --overlap off",
                               "zero3 --units 1 --engine fsdp2", "zero2 --units 2 --engine fsdp2",
                               "hsdp --shard-group 1 --units 1", "hsdp --shard-group 3 --units 1 --engine fsdp2",
                               "zero3 --units 1 --accumulate 2", "zero2 --units 1 --accumulate 3 --engine fsdp2",
                               "zero2 --units 1 --accumulate 2 --no-sync", "zero3 --units 1 --accumulate 3 --no-sync "
                               "--engine fsdp2", "hsdp --shard-group 3 --units 1 --accumulate 2 --no-sync",
                               "zero3 --units 1 --checkpoint full", "zero2 --units 2 --checkpoint every:2 --engine fsdp2",
                               "zero3 --units 1 --checkpoint every:3 --accumulate 2 --no-sync --engine fsdp2"})
    for (int r = 0; r < 3; ++r) {
      const std::string args = std::string("run --backend cpu ") + kMlp + "--strategy " + strategy + " --emulate 3:" +
                               std::to_string(r);
      ASSERT_EQ(binary(args + " --precision bf16 --json b.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
      const json run = read("b.json")["runs"][0];
      EXPECT_FALSE(run["bf16_gemm"].get<std::string>().empty()) << args;
      const json& rank = run["ranks"][0];
      expect_bf16_rank_as_predicted(run, rank, args);
      EXPECT_EQ(rank["comm_bytes"], rank["predicted"]["comm_bytes"]) << args;
      EXPECT_GT(rank["peak"]["by_category"]["param_unsharded"].get<std::int64_t>(), 0) << args;
      ASSERT_EQ(binary(args + " --json f.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
      const json fp32 = read("f.json")["runs"][0]["ranks"][0];
      EXPECT_EQ(rank["resting"], fp32["resting"]) << args;
      EXPECT_EQ(2 * rank["comm"]["all_gather"]["bytes"].get<std::int64_t>(),
                fp32["comm"]["all_gather"]["bytes"].get<std::int64_t>())
          << args;
      EXPECT_EQ(rank["comm"]["reduce_scatter"]["bytes"], fp32["comm"]["reduce_scatter"]["bytes"]) << args;
    }
  ASSERT_EQ(binary(std::string("plan ") + kMlp + "--worlds 3 --strategies zero3 --units 1 --precision bf16 --json p.json"),
            0)
      << first_line(dir_ + "/err.txt");
  ASSERT_EQ(binary(std::string("run --backend cpu ") + kMlp + "--strategy zero3 --units 1 --precision bf16 "
                   "--emulate 3:2 --json r.json"),
            0)
      << first_line(dir_ + "/err.txt");
  const json plan = read("p.json")["plans"][0];
  EXPECT_EQ(plan["precision"], "bf16");
  EXPECT_EQ(plan["rank_groups"].back()["predicted"]["peak_by_category"],
            read("r.json")["runs"][0]["ranks"][0]["peak"]["by_category"]);
  // --no-sync and --checkpoint under both engines: plan's peak is an emulated run's.
  for (const char* engine : {"torch", "fsdp2"}) {
    const std::string step =
        std::string("--units 1 --precision bf16 --accumulate 3 --no-sync --checkpoint every:2 --engine ") + engine;
    ASSERT_EQ(binary(std::string("plan ") + kMlp + "--worlds 3 --strategies zero3 " + step + " --json p.json"), 0)
        << first_line(dir_ + "/err.txt");
    ASSERT_EQ(binary(std::string("run --backend cpu ") + kMlp + "--strategy zero3 " + step + " --emulate 3:2 --json r.json"),
              0)
        << first_line(dir_ + "/err.txt");
    EXPECT_EQ(read("p.json")["plans"][0]["rank_groups"].back()["predicted"]["peak_by_category"],
              read("r.json")["runs"][0]["ranks"][0]["peak"]["by_category"])
        << engine;
  }
  for (const char* engine : {"torch", "fsdp2"})
    ASSERT_EQ(binary(std::string("sweep --backend cpu ") + kMlp + "--emulate --worlds 2 --strategies zero2,zero3 "
                     "--precision bf16 --engine " + engine + " --out sw-" + engine),
              0)
        << engine << ": " << first_line(dir_ + "/err.txt");
}

// GPT-2 under zero2/zero3/hsdp bf16 (FSDP1's MixedPrecision on the bf16 module): every
// emulated rank of W = 3 measures its forms; the all-gathers carry bf16 (half the fp32 run's
// bytes), the reduce-scatters fp32; plan gives the run's peak.
TEST_F(Precision, Bf16FsdpGpt2RunsEveryRankAsPredicted) {
  for (const char* strategy : {"zero2 --units 1", "zero3 --units 1", "zero3 --units 2 --overlap off --attention math",
                               "hsdp --shard-group 1 --units 1", "zero3 --units 1 --accumulate 2",
                               "zero3 --units 1 --engine fsdp2", "zero2 --units 2 --engine fsdp2 --attention math",
                               "hsdp --shard-group 3 --units 1 --engine fsdp2", "zero3 --units 1 --checkpoint full",
                               "zero2 --units 1 --engine fsdp2 --checkpoint every:2",
                               "zero3 --units 1 --accumulate 2 --no-sync", "zero2 --units 2 --accumulate 3 --no-sync "
                               "--engine fsdp2", "zero3 --units 1 --checkpoint attention --attention math",
                               "zero2 --units 1 --checkpoint attention --engine fsdp2"})
    for (int r = 0; r < 3; ++r) {
      const std::string args = std::string("run --backend cpu ") + kGpt2 + "--strategy " + strategy + " --emulate 3:" +
                               std::to_string(r);
      ASSERT_EQ(binary(args + " --precision bf16 --json b.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
      const json run = read("b.json")["runs"][0];
      const json& rank = run["ranks"][0];
      expect_bf16_rank_as_predicted(run, rank, args);
      EXPECT_EQ(rank["comm_bytes"], rank["predicted"]["comm_bytes"]) << args;
      ASSERT_EQ(binary(args + " --json f.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
      const json fp32 = read("f.json")["runs"][0]["ranks"][0];
      EXPECT_EQ(rank["resting"], fp32["resting"]) << args;
      EXPECT_EQ(2 * rank["comm"]["all_gather"]["bytes"].get<std::int64_t>(),
                fp32["comm"]["all_gather"]["bytes"].get<std::int64_t>())
          << args;
      EXPECT_EQ(rank["comm"]["reduce_scatter"]["bytes"], fp32["comm"]["reduce_scatter"]["bytes"]) << args;
    }
  ASSERT_EQ(binary(std::string("plan ") + kGpt2 + "--worlds 3 --strategies zero3 --units 1 --precision bf16 "
                   "--json p.json"),
            0)
      << first_line(dir_ + "/err.txt");
  ASSERT_EQ(binary(std::string("run --backend cpu ") + kGpt2 + "--strategy zero3 --units 1 --precision bf16 "
                   "--emulate 3:2 --json r.json"),
            0)
      << first_line(dir_ + "/err.txt");
  const json plan = read("p.json")["plans"][0];
  EXPECT_EQ(plan["rank_groups"].back()["predicted"]["peak_by_category"],
            read("r.json")["runs"][0]["ranks"][0]["peak"]["by_category"]);
}

// Llama under zero2/zero3/hsdp bf16 (FSDP1's MixedPrecision and fully_shard's on Hugging Face's
// module cast to bf16): every emulated rank of W = 3 measures its forms; the all-gathers carry
// bf16 (half the fp32 run's bytes), the reduce-scatters fp32; plan gives the run's peak.
TEST_F(Precision, Bf16FsdpLlamaRunsEveryRankAsPredicted) {
  for (const char* strategy : {"zero2 --units 1", "zero3 --units 1", "zero3 --units 2 --overlap off --attention math",
                               "hsdp --shard-group 1 --units 1", "zero3 --units 1 --accumulate 2",
                               "zero3 --units 1 --engine fsdp2", "zero2 --units 2 --engine fsdp2 --attention math",
                               "hsdp --shard-group 3 --units 1 --engine fsdp2", "zero3 --units 1 --checkpoint full",
                               "zero2 --units 1 --engine fsdp2 --checkpoint every:2",
                               "zero3 --units 1 --checkpoint attention --attention math",
                               "zero2 --units 2 --engine fsdp2 --checkpoint attention",
                               "zero3 --units 1 --accumulate 2 --no-sync", "zero2 --units 2 --accumulate 3 --no-sync "
                               "--engine fsdp2"})
    for (int r = 0; r < 3; ++r) {
      const std::string args = std::string("run --backend cpu ") + kLlama + "--strategy " + strategy + " --emulate 3:" +
                               std::to_string(r);
      ASSERT_EQ(binary(args + " --precision bf16 --json b.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
      const json run = read("b.json")["runs"][0];
      const json& rank = run["ranks"][0];
      expect_bf16_rank_as_predicted(run, rank, args);
      EXPECT_EQ(rank["comm_bytes"], rank["predicted"]["comm_bytes"]) << args;
      ASSERT_EQ(binary(args + " --json f.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
      const json fp32 = read("f.json")["runs"][0]["ranks"][0];
      EXPECT_EQ(rank["resting"], fp32["resting"]) << args;
      EXPECT_EQ(2 * rank["comm"]["all_gather"]["bytes"].get<std::int64_t>(),
                fp32["comm"]["all_gather"]["bytes"].get<std::int64_t>())
          << args;
      EXPECT_EQ(rank["comm"]["reduce_scatter"]["bytes"], fp32["comm"]["reduce_scatter"]["bytes"]) << args;
    }
  for (const char* engine : {"torch", "fsdp2"}) {
    ASSERT_EQ(binary(std::string("plan ") + kLlama + "--worlds 3 --strategies zero3 --units 1 --precision bf16 "
                     "--engine " + engine + " --json p.json"),
              0)
        << first_line(dir_ + "/err.txt");
    ASSERT_EQ(binary(std::string("run --backend cpu ") + kLlama + "--strategy zero3 --units 1 --precision bf16 "
                     "--engine " + engine + " --emulate 3:2 --json r.json"),
              0)
        << first_line(dir_ + "/err.txt");
    const json plan = read("p.json")["plans"][0];
    const json& predicted = plan["rank_groups"].back()["predicted"];
    EXPECT_FALSE(predicted["peak_total"].is_null()) << engine;
    EXPECT_EQ(predicted["peak_by_category"], read("r.json")["runs"][0]["ranks"][0]["peak"]["by_category"]) << engine;
  }
}

// The MLP under autocast with --checkpoint full and every:2 (ddp; zero1 with --accumulate 2):
// every emulated rank of W = 2, 3, 4 measures its forms, the peak's place among them (a
// batch wide against the width puts the peak in the top layer's re-run, its casts and its
// output beside dy).
TEST_F(Precision, Bf16CheckpointedMlpRunsEveryRankAsPredicted) {
  int recompute_places = 0;
  for (const char* flags : {"--strategy ddp --checkpoint full", "--strategy zero1 --checkpoint every:2 --accumulate 2"})
    for (int world = 2; world <= 4; ++world)
      for (int r = 0; r < world; ++r) {
        const std::string args = std::string("run --backend cpu --layers 3 --width 8 --batch 64 --activation none "
                                             "--loss sum --steps 2 --precision bf16 ") +
                                 flags + " --emulate " + std::to_string(world) + ":" + std::to_string(r);
        ASSERT_EQ(binary(args + " --json k.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
        const json run = read("k.json")["runs"][0];
        const json& rank = run["ranks"][0];
        expect_bf16_rank_as_predicted(run, rank, args);
        EXPECT_EQ(rank["resting"], rank["predicted"]["resting"]) << args;
        EXPECT_EQ(rank["comm_bytes"], rank["predicted"]["comm_bytes"]) << args;
        EXPECT_EQ(rank["peak"]["where"], rank["predicted"]["peak_where"]) << args;
        recompute_places += rank["peak"]["where"].get<std::string>().rfind("recompute", 0) == 0 ? 1 : 0;
      }
  EXPECT_GT(recompute_places, 0);
}

// plan --precision bf16 of the MLP prints and writes autocast's forms: what the run of the
// same rank measures, param_cast among the peak's categories, the label saying bf16.
TEST_F(Precision, Bf16MlpPlanIsTheRunsPrediction) {
  ASSERT_EQ(binary(std::string("plan ") + kMlp + "--worlds 2 --strategies zero1 --precision bf16 --json p.json"), 0)
      << first_line(dir_ + "/err.txt");
  std::ifstream o(dir_ + "/out.txt");
  const std::string out((std::istreambuf_iterator<char>(o)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("precision=bf16"), std::string::npos) << out;
  EXPECT_NE(out.find("param_cast"), std::string::npos) << out;
  const json plan = read("p.json")["plans"][0];
  EXPECT_EQ(plan["precision"], "bf16");
  ASSERT_EQ(binary(std::string("run --backend cpu ") + kMlp + "--strategy zero1 --precision bf16 --emulate 2:1 "
                   "--json r.json"),
            0)
      << first_line(dir_ + "/err.txt");
  const json rank = read("r.json")["runs"][0]["ranks"][0];
  const json& group = plan["rank_groups"].back();  // rank 1's
  EXPECT_EQ(group["predicted"]["peak_by_category"], rank["peak"]["by_category"]);
  EXPECT_GT(group["predicted"]["peak_by_category"]["param_cast"].get<std::int64_t>(), 0);
}

TEST_F(Precision, Bf16MlpUnderMpirunHoldsItsPredictionsOnBothRanks) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  for (const char* strategy : {"ddp", "zero1", "zero2 --units 1", "zero3 --units 1", "zero3 --units 1 --engine fsdp2",
                               "ddp --checkpoint full", "zero1 --checkpoint every:2"}) {
    const int rc = shell("cd '" + dir_ + "' && timeout -k 5 120 mpirun --oversubscribe -np 2 '" + bin_ +
                         "' run --backend cpu --comm mpi " + kMlp + "--precision bf16 --strategy " + strategy +
                         " --json m.json > out.txt 2> err.txt");
    ASSERT_EQ(rc, 0) << strategy << ": " << first_line(dir_ + "/err.txt");
    const json run = read("m.json")["runs"][0];
    ASSERT_EQ(run["ranks"].size(), 2u);
    for (const json& rank : run["ranks"]) {
      expect_bf16_rank_as_predicted(run, rank, strategy);
      EXPECT_EQ(rank["resting"], rank["predicted"]["resting"]) << strategy;
      EXPECT_EQ(rank["comm_bytes"], rank["predicted"]["comm_bytes"]) << strategy;
    }
  }
#endif
}

TEST_F(Precision, WhatIsNotBuiltIsRefusedByName) {
  const std::string g = std::string("run --backend cpu ") + kGpt2;
  const std::string m = std::string("run --backend cpu ") + kMlp;
  const struct {
    std::string args;
    std::string line;
  } cases[] = {
      {m + "--precision bf16 --schedule zbv",
       "shardscope: error: --precision bf16 and --schedule zbv: the zero-bubble split (B and W apart) under "
       "autocast is not built yet; allowed: gpipe, 1f1b, interleaved-1f1b"},
      {m + "--precision bf16 --checkpoint attention",
       "shardscope: error: --checkpoint attention: the MLP has no attention to recompute; allowed with --model "
       "gpt2|llama, or give --checkpoint none, full or every:K"},
      {"run --backend cpu --layers 2 --width 8 --precision bf16 --mesh dp=1,tp=2",
       "shardscope: error: --mesh and --precision bf16 and --model mlp: a data-parallel mesh of the MLP under "
       "autocast is not built yet (its pipelines are: give --schedule); allowed: --model gpt2|llama"},
      {"run --backend cuda --layers 2 --width 8 --precision bf16",
       "shardscope: error: --precision bf16 and --backend cuda: the autocast step runs on the cpu backend only; pass "
       "--backend cpu"},
      {"run --backend cuda --layers 2 --width 8 --precision bf16 --strategy zero3",
       "shardscope: error: --precision bf16 and --backend cuda: the autocast step runs on the cpu backend only; pass "
       "--backend cpu"},
      {"run --backend cpu --layers 2 --width 8 --precision fp16",
       "shardscope: error: --precision: unknown 'fp16'; allowed: fp32, bf16"},
      {g + "--precision bf16 --schedule zb-h1",
       "shardscope: error: --precision bf16 and --schedule zb-h1: the zero-bubble split (B and W apart) under "
       "autocast is not built yet; allowed: gpipe, 1f1b, interleaved-1f1b"},
      {g + "--precision bf16 --schedule zbv",
       "shardscope: error: --precision bf16 and --schedule zbv: the zero-bubble split (B and W apart) under "
       "autocast is not built yet; allowed: gpipe, 1f1b, interleaved-1f1b"},
      {g + "--precision bf16 --strategy zero3 --mesh dp=2,tp=2 --emulate 4:0",
       "shardscope: error: --mesh and --precision bf16 and --strategy zero3: FSDP's mixed precision on a mesh is not "
       "built yet; allowed: --strategy ddp|zero1 (autocast), or no --mesh"},
      {g + "--precision bf16 --mesh dp=1,tp=2 --sp",
       "shardscope: error: --sp and --precision bf16: sequence parallelism under autocast is not built yet; give "
       "--precision fp32"},
      {std::string("run --backend cuda ") + kGpt2 + "--precision bf16",
       "shardscope: error: --precision bf16 and --backend cuda: the autocast step runs on the cpu backend only; pass "
       "--backend cpu"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(binary(c.args), 2) << c.args;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.args;
  }
}

// --mesh dp=D,tp=T under bf16 (Megatron's split, each rank casting its own shards; the
// row-parallel outputs all-reduced in bf16): every emulated rank of dp=2,tp=2 and tp=4,
// GPT-2 and Llama, ddp and zero1, flash and math, and --checkpoint full with --accumulate 2,
// each group's bytes its prediction.
TEST_F(Precision, TensorParallelTransformersRunBf16AsPredictedOnEveryRank) {
  const char* const llama4 =
      "--model llama --layers 2 --hidden 32 --heads 4 --kv-heads 4 --ffn 48 --vocab 64 --seq 8 --batch 2 --steps 2 ";
  const char* const gpt2 = "--model gpt2 --layers 2 --hidden 32 --heads 4 --vocab 64 --seq 8 --batch 2 --steps 2 ";
  for (const char* model : {gpt2, llama4})
    for (const char* setting : {"--strategy ddp --attention flash", "--strategy zero1 --attention math",
                                "--strategy ddp --checkpoint full --accumulate 2"})
      for (const char* mesh : {"dp=2,tp=2", "tp=4"})
        for (int rank = 0; rank < 4; ++rank) {
          const std::string args = std::string("run --backend cpu ") + model + "--precision bf16 " + setting +
                                   " --mesh " + mesh + " --emulate 4:" + std::to_string(rank);
          ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
          const json run = read("r.json")["runs"][0];
          const json& r = run["ranks"][0];
          expect_bf16_rank_as_predicted(run, r, args);
          EXPECT_EQ(r["comm_bytes"], r["predicted"]["comm_bytes"]) << args;
          EXPECT_GT(r["peak"]["by_category"]["param_cast"].get<std::int64_t>(), 0) << args;
          const json& tp = r["comm_groups"]["tp"];
          EXPECT_GT(tp["comm_bytes"].get<std::int64_t>(), 0) << args;
          EXPECT_EQ(tp["comm_bytes"], tp["predicted_comm_bytes"]) << args;
          EXPECT_EQ(r["comm_groups"]["dp"]["comm_bytes"], r["comm_groups"]["dp"]["predicted_comm_bytes"]) << args;
        }
}

// plan on a bf16 dp × tp mesh: ddp and zero1 planned, each rank group's peak the one an
// emulated run of its first rank measures; zero3 listed skipped with the reason.
TEST_F(Precision, PlanTakesBf16TensorParallelTransformersAsTheirRunsMeasureThem) {
  const std::string gpt2 = "--model gpt2 --layers 2 --hidden 32 --heads 4 --vocab 64 --seq 8 --batch 2 ";
  ASSERT_EQ(binary("plan " + gpt2 + "--precision bf16 --mesh dp=2,tp=2 --strategies ddp,zero1,zero3 --json p.json"), 0)
      << first_line(dir_ + "/err.txt");
  const json plans = read("p.json")["plans"];
  ASSERT_EQ(plans.size(), 3u);
  int planned = 0;
  for (const json& p : plans) {
    if (p.value("skipped", false)) {
      EXPECT_EQ(p["strategy"], "zero3") << p.dump();
      EXPECT_NE(p["reason"].get<std::string>().find("--precision bf16 and --strategy zero3"), std::string::npos);
      continue;
    }
    ++planned;
    EXPECT_EQ(p["precision"], "bf16") << p.dump();
    for (const json& group : p["rank_groups"]) {
      const std::string args = "run --backend cpu " + gpt2 + "--steps 2 --precision bf16 --strategy " +
                               p["strategy"].get<std::string>() + " --mesh dp=2,tp=2 --emulate 4:" +
                               std::to_string(group["first"].get<int>());
      ASSERT_EQ(binary(args + " --json r.json"), 0) << args << ": " << first_line(dir_ + "/err.txt");
      const json run = read("r.json")["runs"][0];
      const json& rank = run["ranks"][0];
      EXPECT_EQ(rank["peak"]["total"], group["predicted"]["peak_total"]) << args;
      EXPECT_EQ(rank["peak"]["by_category"], group["predicted"]["peak_by_category"]) << args;
      EXPECT_EQ(rank["comm_bytes"], group["predicted"]["comm_bytes"]) << args;
    }
  }
  EXPECT_EQ(planned, 2);
}

TEST_F(Precision, PlanTakesBf16TransformersUnderDdpAndZero1) {
  ASSERT_EQ(binary(std::string("plan ") + kGpt2 + "--precision bf16 --worlds 2 --strategies ddp,zero1 --json p.json"), 0)
      << first_line(dir_ + "/err.txt");
  const json plans = read("p.json")["plans"];
  ASSERT_EQ(plans.size(), 2u);
  for (const json& p : plans) {
    EXPECT_EQ(p["precision"], "bf16") << p.dump();
    const json& rank = p["rank_groups"][0]["predicted"];
    EXPECT_GT(rank["peak_total"].get<std::int64_t>(), rank["resting_total"].get<std::int64_t>());
  }
  // --checkpoint attention: the plan's rank is the run's, measured and predicted.
  for (const char* model : {kGpt2, kLlama}) {
    const std::string flags = std::string(model) + "--precision bf16 --checkpoint attention --attention math ";
    ASSERT_EQ(binary("plan " + flags + "--worlds 2 --strategies zero1 --json p.json"), 0)
        << first_line(dir_ + "/err.txt");
    const json planned = read("p.json")["plans"][0]["rank_groups"][0]["predicted"];
    ASSERT_EQ(binary("run --backend cpu " + flags + "--strategy zero1 --emulate 2:0 --json r.json"), 0)
        << first_line(dir_ + "/err.txt");
    const json rank = read("r.json")["runs"][0]["ranks"][0];
    EXPECT_EQ(planned["peak_total"], rank["predicted"]["peak_total"]) << flags;
    EXPECT_EQ(planned["peak_total"], rank["peak"]["total"]) << flags;
    EXPECT_EQ(planned["saved"], rank["predicted"]["saved"]) << flags;
    EXPECT_GT(planned["saved"]["after_forward_bytes"].get<std::int64_t>(), 0) << flags;
  }
}

}  // namespace
