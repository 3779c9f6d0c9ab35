// --strategy hsdp --shard-group G through the binary: every emulated rank of W = 4 (groups
// of 2, both engines) and W = 8 (groups of 2 and 4) on the MLP, GPT-2 and Llama holds its
// predictions, the shard and replicate groups apart, each group's members as torch's
// (replicate, shard) mesh makes them; the four real ranks under mpirun do too; bad flags are exit 2 in one
// line naming them; plan and sweep take hsdp. Also: plan and sweep with --mesh and a
// --worlds item that is not the mesh's world are exit 2 naming both flags.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

constexpr const char* kMlp = " --layers 4 --width 32 --batch 6 --activation relu --loss mse --steps 2 ";
constexpr const char* kGpt2 = " --model gpt2 --hidden 16 --heads 2 --vocab 29 --seq 6 --layers 2 --batch 2 --steps 2 ";
constexpr const char* kLlama =
    " --model llama --hidden 16 --heads 4 --kv-heads 2 --ffn 24 --vocab 13 --seq 6 --layers 2 --batch 2 --steps 2 ";

class HsdpCli : public shardscope::testing::BinaryTest {
 protected:
  json run_record(const std::string& flags) {
    const int rc = shell("cd '" + dir_ + "' && timeout 120 '" + bin_ + "' run --backend cpu" + flags +
                         " --json r.json > out.txt 2> err.txt");
    EXPECT_EQ(rc, 0) << flags << ": " << first_line(dir_ + "/err.txt");
    std::ifstream in(dir_ + "/r.json");
    return json::parse(in);
  }
  int refused(const std::string& command) {
    return shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' " + command + " > /dev/null 2> err.txt");
  }
  // rank's figures equal their forms, and its groups are torch's: the shard group the G
  // consecutive ranks from floor(r/G)·G, the replicate group the ranks G apart.
  static void expect_predicted(const json& rank, int world, int G, const std::string& what) {
    const json& p = rank["predicted"];
    EXPECT_EQ(rank["resting"], p["resting"]) << what;
    EXPECT_EQ(rank["peak"]["total"], p["peak_total"]) << what;
    EXPECT_EQ(rank["peak"]["by_category"], p["peak_by_category"]) << what;
    EXPECT_EQ(rank["peak"]["where"], p["peak_where"]) << what;
    EXPECT_EQ(rank["comm_bytes"], p["comm_bytes"]) << what;
    EXPECT_EQ(rank["saved"], p["saved"]) << what;
    ASSERT_TRUE(rank.contains("comm_groups")) << what;
    const int r = rank["rank"].get<int>();
    json shard = json::array(), replicate = json::array();
    for (int i = 0; i < G; ++i) shard.push_back(r / G * G + i);
    for (int i = r % G; i < world; i += G) replicate.push_back(i);
    const json& g = rank["comm_groups"];
    EXPECT_EQ(g["shard"]["members"], shard) << what;
    EXPECT_EQ(g["replicate"]["members"], replicate) << what;
    EXPECT_EQ(g["shard"]["rank"], r % G) << what;
    EXPECT_EQ(g["replicate"]["rank"], r / G) << what;
    std::int64_t sum = 0;
    for (const char* name : {"shard", "replicate"}) {
      EXPECT_EQ(g[name]["comm_bytes"], g[name]["predicted_comm_bytes"]) << what << " " << name;
      sum += g[name]["comm_bytes"].get<std::int64_t>();
    }
    EXPECT_EQ(sum, rank["comm_bytes"].get<std::int64_t>()) << what;
    // The replicas all-reduce the rank's gradient shards once a step: its resting gradient.
    EXPECT_EQ(g["replicate"]["comm"]["all_reduce"]["bytes"], world / G > 1 ? rank["resting"]["grad"] : json(0))
        << what;
    EXPECT_EQ(g["shard"]["comm"]["all_reduce"]["bytes"], 0) << what;
  }
};

TEST_F(HsdpCli, EveryEmulatedRankHoldsItsPredictionsGroupByGroup) {
  const struct {
    int world, G;
    const char* engine;
  } shapes[] = {{4, 2, "torch"}, {8, 2, "torch"}, {8, 4, "torch"}, {4, 2, "fsdp2"}};
  for (const char* model : {kMlp, kGpt2, kLlama})
    for (const auto& s : shapes)
      for (int r = 0; r < s.world; ++r) {
        const std::string what = std::string(model) + "W=" + std::to_string(s.world) + " G=" + std::to_string(s.G) +
                                 " engine=" + s.engine + " rank " + std::to_string(r);
        const json doc = run_record(std::string(model) + "--strategy hsdp --shard-group " + std::to_string(s.G) +
                                    " --units 1 --engine " + s.engine + " --emulate " + std::to_string(s.world) + ":" +
                                    std::to_string(r));
        const json& run = doc["runs"][0];
        EXPECT_EQ(run["strategy"], "hsdp") << what;
        EXPECT_EQ(run["shard_group"], s.G) << what;
        EXPECT_EQ(run["world"], s.world) << what;
        expect_predicted(run["ranks"][0], s.world, s.G, what);
      }
}

TEST_F(HsdpCli, UnderMpirunEveryRankHoldsItsPredictions) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  for (const char* model : {kMlp, kGpt2, kLlama}) {
    const int rc = shell("cd '" + dir_ + "' && timeout -k 5 180 mpirun --oversubscribe -np 4 '" + bin_ +
                         "' run --backend cpu --comm mpi" + model +
                         "--strategy hsdp --shard-group 2 --units 1 --json m.json > out.txt 2> err.txt");
    ASSERT_EQ(rc, 0) << model << ": " << first_line(dir_ + "/err.txt");
    std::ifstream in(dir_ + "/m.json");
    const json run = json::parse(in)["runs"][0];
    ASSERT_EQ(run["ranks"].size(), 4u);
    for (const json& rank : run["ranks"]) {
      expect_predicted(rank, 4, 2, std::string(model) + "rank " + rank["rank"].dump());
      EXPECT_TRUE(rank["comm_groups"]["replicate"]["comm"]["all_reduce"]["busbw_gbps"].is_number());
    }
    // Every rank draws its own rows, and the replicas keep the same parameters: ranks G
    // apart see other rows, so their losses differ.
    EXPECT_NE(run["ranks"][0]["loss"], run["ranks"][2]["loss"]) << model;
  }
#endif
}

TEST_F(HsdpCli, BadFlagsAreRefusedNamingThem) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {"--strategy hsdp --emulate 4:0",
       "shardscope: error: --strategy hsdp needs --shard-group G (ranks per shard group, dividing the world)"},
      {"--strategy zero3 --shard-group 2 --emulate 4:0",
       "shardscope: error: --shard-group is only valid with --strategy hsdp"},
      {"--strategy hsdp --shard-group 3 --emulate 4:1",
       "shardscope: error: --shard-group 3: it must divide the world, 4 ranks (--emulate 4:1)"},
      {"--strategy hsdp --shard-group 0 --emulate 4:0",
       "shardscope: error: --shard-group: '0' is not a positive integer"},
      {"--strategy hsdp --shard-group 2 --engine deepspeed --emulate 4:0",
       "shardscope: error: --strategy hsdp and --engine deepspeed: deepspeed's hybrid partitioning is not built; give "
       "--engine torch (FSDP1's HYBRID_SHARD) or fsdp2 (fully_shard on a 2-D mesh)"},
      {"--strategy hsdp --shard-group 2 --mesh dp=4 --emulate 4:0",
       "shardscope: error: --strategy hsdp and --mesh: give one of them (hsdp's groups are its own mesh)"},
      {"--strategy hsdp --shard-group 2",
       "shardscope: error: --shard-group 2: it must divide the world, 1 rank (one process without mpirun)"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(refused(std::string("run --backend cpu") + kMlp + c.flags), 2) << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
  // Llama's bf16 module runs under hsdp, its attention recompute too (was refused naming hsdp).
  EXPECT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + kLlama +
                  "--strategy hsdp --shard-group 2 --precision bf16 --checkpoint attention --emulate 4:0 > /dev/null "
                  "2> err.txt"),
            0)
      << first_line(dir_ + "/err.txt");
}

// plan and sweep take hsdp in --strategies with --shard-group (which reaches hsdp's jobs
// alone): each hsdp entry is labelled with its G, its ranks' figures depend on G (not on
// W, but for the replicas' all-reduce being there), an emulated sweep's ranks hold their
// predictions, and a G that does not divide a world skips that configuration.
TEST_F(HsdpCli, PlanAndSweepTakeHsdp) {
  ASSERT_EQ(refused(std::string("plan --strategies zero3,hsdp --shard-group 2 --worlds 4,8 --json p.json") + kMlp),
            0)
      << first_line(dir_ + "/err.txt");
  std::ifstream in(dir_ + "/p.json");
  const json plans = json::parse(in)["plans"];
  ASSERT_EQ(plans.size(), 4u);
  std::map<std::pair<std::string, int>, json> by;
  for (const json& p : plans) by[{p["strategy"].get<std::string>(), p["world"].get<int>()}] = p;
  const json& h4 = by[{"hsdp", 4}];
  const json& h8 = by[{"hsdp", 8}];
  const json& z4 = by[{"zero3", 4}];
  EXPECT_EQ(h4["shard_group"], 2);
  EXPECT_FALSE(z4.contains("shard_group"));
  ASSERT_EQ(h4["rank_groups"].size(), 1u);  // every rank alike
  const json& p4 = h4["rank_groups"][0]["predicted"];
  const json& p8 = h8["rank_groups"][0]["predicted"];
  EXPECT_EQ(p4["resting"], p8["resting"]);
  EXPECT_EQ(p4["comm_bytes"], p8["comm_bytes"]);
  EXPECT_GT(p4["resting"]["total"].get<std::int64_t>(),
            z4["rank_groups"][0]["predicted"]["resting"]["total"].get<std::int64_t>());

  ASSERT_EQ(refused(std::string("sweep --emulate --out o --strategies hsdp --shard-group 2 --worlds 4") + kMlp), 0)
      << first_line(dir_ + "/err.txt");
  std::ifstream sin(dir_ + "/o/shardscope.json");
  const json run = json::parse(sin)["runs"][0];
  EXPECT_EQ(run["strategy"], "hsdp");
  EXPECT_EQ(run["shard_group"], 2);
  ASSERT_EQ(run["ranks"].size(), 4u);
  for (const json& rank : run["ranks"]) expect_predicted(rank, 4, 2, "sweep rank " + rank["rank"].dump());

  ASSERT_EQ(refused(std::string("plan --strategies ddp,hsdp --shard-group 3 --worlds 3,4 --json q.json") + kMlp), 0)
      << first_line(dir_ + "/err.txt");
  std::ifstream qin(dir_ + "/q.json");
  const json q = json::parse(qin);
  int skipped = 0;
  for (const json& p : q["plans"])
    if (p.value("skipped", false)) {
      ++skipped;
      EXPECT_EQ(p["strategy"], "hsdp");
      EXPECT_EQ(p["world"], 4);
      EXPECT_EQ(p["reason"], "--shard-group 3: it must divide the world, 4 ranks");
    }
  EXPECT_EQ(skipped, 1);

  EXPECT_EQ(refused(std::string("plan --strategies ddp --shard-group 2") + kMlp), 2);
  EXPECT_EQ(first_line(dir_ + "/err.txt"),
            "shardscope: error: --shard-group: applies to hsdp runs; add hsdp to --strategies");
  EXPECT_EQ(refused(std::string("plan --strategies hsdp --worlds 4") + kMlp), 2);
  EXPECT_EQ(first_line(dir_ + "/err.txt"),
            "shardscope: error: --strategy hsdp needs --shard-group G (ranks per shard group, dividing the world)");
}

TEST_F(HsdpCli, PlanAndSweepRefuseWorldsThatAreNotTheMeshs) {
  const std::string line =
      "shardscope: error: --mesh dp=2,tp=2,pp=1 and --worlds 8: the mesh is dp·tp·pp = 4 ranks; give --worlds 4 or "
      "leave --worlds out";
  EXPECT_EQ(refused(std::string("plan --strategies zero1 --mesh dp=2,tp=2 --worlds 4,8") + kMlp), 2);
  EXPECT_EQ(first_line(dir_ + "/err.txt"),
            "shardscope: error: --worlds and --mesh dp=2,tp=2,pp=1: the mesh's dp·tp·pp (4 ranks) is the world; drop "
            "--worlds");
  EXPECT_EQ(refused(std::string("sweep --emulate --out o --strategies zero1 --mesh dp=2,tp=2 --worlds 8") + kMlp), 2);
  EXPECT_EQ(first_line(dir_ + "/err.txt"), line);
  // Without --worlds the mesh's world is the one planned.
  EXPECT_EQ(refused(std::string("plan --strategies zero1 --mesh dp=2,tp=2") + kMlp), 0)
      << first_line(dir_ + "/err.txt");
}

}  // namespace
