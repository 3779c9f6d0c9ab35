// --accumulate and --no-sync through the binary: the record says them, holds its
// predictions on every rank (emulated at W = 3, under mpirun at W = 2), the table's label
// names them (zero2/zero3 of both engines too), and a pipeline's accumulation is refused
// (exit 2, one line).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

constexpr const char* kModel = " --layers 4 --width 37 --batch 6 --activation relu --loss mse --steps 2 ";

class AccumulateCli : public shardscope::testing::BinaryTest {
 protected:
  json run_record(const std::string& flags, const std::string& file, std::string* out = nullptr) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + kModel + flags +
                         " --json " + file + " > out.txt 2> err.txt");
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

TEST_F(AccumulateCli, RecordsSayItAndEveryRankHoldsItsPrediction) {
  for (const char* strategy : {"ddp", "zero1", "zero2 --units 1", "zero3 --units 1 --engine fsdp2"})
    for (int r = 0; r < 3; ++r) {
      std::string out;
      const json doc = run_record(std::string("--strategy ") + strategy + " --accumulate 3 --no-sync --emulate 3:" +
                                      std::to_string(r),
                                  "r.json", &out);
      const json& run = doc["runs"][0];
      EXPECT_EQ(run["accumulate"], 3);
      EXPECT_EQ(run["no_sync"], true);
      expect_predicted(run["ranks"][0], std::string(strategy) + " rank " + std::to_string(r));
      EXPECT_NE(out.find("accumulate=3 no_sync"), std::string::npos) << out;
    }
  // Syncing every micro-step: ddp's three all-reduces of 4P a step (P = 4 x (37 x 37 + 37)).
  const json sync = run_record("--accumulate 3 --emulate 2:1", "s.json");
  EXPECT_EQ(sync["runs"][0]["no_sync"], false);
  expect_predicted(sync["runs"][0]["ranks"][0], "sync");
  EXPECT_EQ(sync["runs"][0]["ranks"][0]["comm_bytes"], 3 * 4 * 4 * (37 * 37 + 37));
  // The default says 1 and false, and its label neither.
  std::string out;
  const json plain = run_record("", "p.json", &out);
  EXPECT_EQ(plain["runs"][0]["accumulate"], 1);
  EXPECT_EQ(plain["runs"][0]["no_sync"], false);
  EXPECT_EQ(out.find("accumulate="), std::string::npos) << out;
}

TEST_F(AccumulateCli, PipelinesAndBadCountsAreRefused) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {"--schedule gpipe --accumulate 2",
       "shardscope: error: --accumulate and --schedule: a pipeline's micro-batches are already its gradient "
       "accumulation; give --microbatches, or --strategy with --accumulate"},
      {"--schedule 1f1b --no-sync",
       "shardscope: error: --no-sync and --schedule: a pipeline's micro-batches are already its gradient "
       "accumulation; give --microbatches, or --strategy with --accumulate"},
  };
  for (const auto& c : cases) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + kModel + c.flags +
                         " > /dev/null 2> err.txt");
    EXPECT_EQ(rc, 2) << c.flags;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.flags;
  }
  for (const char* k : {"0", "-1", "x", "10001"}) {
    const int rc = shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --backend cpu" + kModel +
                         "--accumulate " + k + " > /dev/null 2> err.txt");
    EXPECT_EQ(rc, 2) << k;
    EXPECT_EQ(first_line(dir_ + "/err.txt").rfind("shardscope: error: --accumulate", 0), 0u)
        << k << ": " << first_line(dir_ + "/err.txt");
  }
}

TEST_F(AccumulateCli, UnderMpirunBothRanksHoldTheirPredictions) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  for (const char* sync : {"--strategy zero1", "--strategy zero1 --no-sync", "--strategy zero3 --units 1",
                           "--strategy zero2 --units 1 --no-sync", "--strategy zero3 --engine fsdp2 --no-sync"}) {
    const int rc = shell("cd '" + dir_ + "' && timeout -k 5 120 mpirun --oversubscribe -np 2 '" + bin_ +
                         "' run --backend cpu --comm mpi" + kModel + "--accumulate 2 " + sync +
                         " --json m.json > out.txt 2> err.txt");
    ASSERT_EQ(rc, 0) << first_line(dir_ + "/err.txt");
    std::ifstream in(dir_ + "/m.json");
    const json run = json::parse(in)["runs"][0];
    EXPECT_EQ(run["accumulate"], 2);
    ASSERT_EQ(run["ranks"].size(), 2u);
    for (const json& rank : run["ranks"]) expect_predicted(rank, std::string(sync) + " rank " + rank["rank"].dump());
  }
#endif
}

}  // namespace
