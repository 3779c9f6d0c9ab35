// The seed's tables, byte for byte, through the real binary: the default sweep (every
// rank its own `shardscope run` under mpirun) against tests/reference/seed-3.13.json;
// single-rank runs and the exit codes of bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/report/text_table.hpp"
#include "shardscope/backend.hpp"
#include "support/shell.hpp"

namespace {

using shardscope::testing::env;
using shardscope::testing::shell;

std::string temp_dir() {
  char tmpl[] = "/tmp/shardscope-seed-XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d ? d : "/tmp";
}

nlohmann::json load(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

class SeedTable : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = env("SHARDSCOPE_BIN");
    ref_dir_ = env("SHARDSCOPE_REFERENCE_DIR");
    if (bin_.empty() || ref_dir_.empty()) GTEST_SKIP() << "run through ctest (SHARDSCOPE_BIN unset)";
    dir_ = temp_dir();
  }
  void TearDown() override {
    if (!dir_.empty()) shell("rm -rf '" + dir_ + "'");
  }
  std::string bin_, ref_dir_, dir_;
};

TEST_F(SeedTable, DefaultSweepReproducesTheSeedsTablesByteForByte) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "this build has no MPI: multi-rank jobs cannot start";
#endif
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  ASSERT_EQ(shell("'" + bin_ + "' sweep --out '" + dir_ + "' > '" + dir_ + "/out.txt' 2> '" + dir_ + "/err.txt'"), 0)
      << [&] {
           std::ifstream err(dir_ + "/err.txt");
           return std::string(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
         }();
  // stdout holds the tables, every line within 120 columns; the progress is on stderr.
  {
    std::ifstream out(dir_ + "/out.txt");
    int lines = 0;
    for (std::string line; std::getline(out, line); ++lines) {
      EXPECT_LE(shardscope::display_width(line), 120u) << line;
      EXPECT_NE(line.rfind("[", 0), 0u) << "a progress line on stdout: " << line;
    }
    EXPECT_GT(lines, 100);
    std::ifstream err(dir_ + "/err.txt");
    int progress = 0;
    for (std::string line; std::getline(err, line);) progress += line.rfind("[", 0) == 0;
    EXPECT_EQ(progress, 18);
  }
  const nlohmann::json doc = load(dir_ + "/shardscope.json");
  const nlohmann::json ref = load(ref_dir_ + "/seed-3.13.json");
  ASSERT_EQ(doc["schema"], "shardscope/1");
  int matched = 0;
  for (const auto& row : ref["data_parallel"]["resting_bytes_per_rank"]) {
    bool found = false;
    for (const auto& run : doc["runs"]) {
      if (run.value("kind", "") != "data_parallel" || run["strategy"] != row["strategy"] ||
          run["world"] != row["world"] || run["layers_per_unit"] != "all")
        continue;
      found = true;
      ASSERT_EQ(run["ranks"].size(), row["world"].get<std::size_t>());
      for (const auto& rank : run["ranks"]) {
        SCOPED_TRACE(row.dump() + " rank " + rank["rank"].dump());
        EXPECT_EQ(rank["resting"]["total"], row["total"]);
        EXPECT_EQ(rank["resting"]["param"], row["param"]);
        EXPECT_EQ(rank["resting"]["grad"], row["grad"]);
        EXPECT_EQ(rank["resting"]["optim"], row["optim"]);
        EXPECT_EQ(rank["predicted"]["resting_total"], row["total"]);
        EXPECT_EQ(rank["peak"]["total"], rank["predicted"]["peak_total"]);
      }
      ++matched;
    }
    EXPECT_TRUE(found) << row.dump();
  }
  EXPECT_EQ(matched, 8);
  // ZeRO-3 below ZeRO-2 at peak only with one layer per unit (W = 4).
  auto peak = [&](const std::string& s, const nlohmann::json& units) -> std::int64_t {
    for (const auto& run : doc["runs"])
      if (run.value("kind", "") == "data_parallel" && run["strategy"] == s && run["world"] == 4 &&
          run["layers_per_unit"] == units)
        return run["ranks"][0]["peak"]["total"].get<std::int64_t>();
    return -1;
  };
  EXPECT_EQ(peak("zero2", "all"), peak("zero3", "all"));
  EXPECT_GT(peak("zero3", 1), 0);
  EXPECT_LT(peak("zero3", 1), peak("zero2", 1));
  // The pipeline table: the last stage's saved tensors.
  int pipes = 0;
  for (const auto& row : ref["pipeline"]["last_stage"]) {
    for (const auto& run : doc["runs"]) {
      if (run.value("kind", "") != "pipeline" || run["schedule"] != row["schedule"] ||
          run["microbatches"] != row["microbatches"])
        continue;
      const auto& last = run["stages"].back();
      SCOPED_TRACE(row.dump());
      EXPECT_EQ(last["stage"], 1);
      EXPECT_EQ(last["saved"]["peak_live_tensors"], row["peak_live"]);
      EXPECT_EQ(last["saved"]["before_first_backward"], row["saved_before_first_backward"]);
      EXPECT_EQ(last["saved"]["total_tensors"], row["saved_total"]);
      ++pipes;
    }
  }
  EXPECT_EQ(pipes, 6);
}

TEST_F(SeedTable, SingleRankSeedModelRestsAt8421440) {
  const std::string json = dir_ + "/one.json";
  ASSERT_EQ(shell("'" + bin_ + "' run --layers 8 --width 256 --batch 32 --activation none --loss sum "
                  "--steps 3 --json '" + json + "' > /dev/null"), 0);
  const nlohmann::json doc = load(json);
  const auto& r = doc["runs"][0]["ranks"][0];
  EXPECT_EQ(r["resting"]["total"], 8421440);
  EXPECT_EQ(r["resting"]["param"], 2105344);
  EXPECT_EQ(r["resting"]["grad"], 2105344);
  EXPECT_EQ(r["resting"]["optim"], 4210752);
  EXPECT_EQ(doc["runs"][0]["timed_steps"], 2);
  for (const char* field : {"git", "command", "host", "cpu", "blas"})
    EXPECT_TRUE(doc["provenance"].contains(field)) << field;
}

TEST_F(SeedTable, BadInputExitsTwoWithOneLine) {
  const char* bad[] = {"--layers 0", "--width -3", "--batch abc", "--activation tanh", "--loss l1",
                       "--frobnicate 1", "--strategy zero9", "--units 0", "--emulate 4:4",
                       "--json /nonexistent-dir/x.json", "--layers 100001", "--width 1000001",
                       "--batch 10000001"};
  for (const char* flags : bad) {
    const std::string err = dir_ + "/err.txt";
    EXPECT_EQ(shell("'" + bin_ + "' run " + flags + " > /dev/null 2> '" + err + "'"), 2) << flags;
    std::ifstream in(err);
    std::string line;
    std::getline(in, line);
    EXPECT_EQ(line.rfind("shardscope: error: ", 0), 0u) << flags << ": " << line;
  }
  // A model that cannot fit is refused before allocating: exit 3, both figures named.
  const std::string err = dir_ + "/oom.txt";
  EXPECT_EQ(shell("'" + bin_ + "' run --layers 4 --width 200000 > /dev/null 2> '" + err + "'"), 3);
  std::ifstream in(err);
  std::string line;
  std::getline(in, line);
  EXPECT_NE(line.find("predicted peak"), std::string::npos) << line;
  EXPECT_NE(line.find("MemAvailable"), std::string::npos) << line;
  EXPECT_NE(line.find("`shardscope plan` predicts every rank of any world"), std::string::npos) << line;
}

}  // namespace

namespace {

// --comm is never quietly replaced: mpi at one rank initialises MPI (a singleton),
// self under a multi-rank launch is refused.
TEST_F(SeedTable, CommIsTakenAsAskedOrRefused) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "this build has no MPI: multi-rank jobs cannot start";
#endif
  if (std::system("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  const std::string json = dir_ + "/mpi1.json";
  ASSERT_EQ(shell("'" + bin_ + "' run --comm mpi --layers 2 --width 16 --batch 4 --steps 2 --json '" + json +
                  "' > /dev/null"),
            0);
  EXPECT_EQ(load(json)["comm"], "mpi");
  EXPECT_EQ(shell("mpirun -np 2 --oversubscribe '" + bin_ +
                  "' run --comm self --layers 2 --width 16 --batch 4 > /dev/null 2>&1"),
            2);
}

}  // namespace

namespace {

// Without a visible GPU (or without CUDA in the build), --backend cuda is a
// configuration this machine cannot run: exit 2, one line, so a sweep records it as
// skipped instead of failing.
TEST_F(SeedTable, CudaWithoutAGpuIsExitTwo) {
  if (shardscope::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible here";
  const std::string err = dir_ + "/cuda.txt";
  EXPECT_EQ(shell("'" + bin_ + "' run --backend cuda > /dev/null 2> '" + err + "'"), 2);
  std::ifstream in(err);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line.rfind("shardscope: error: --backend cuda", 0), 0u) << line;
}

}  // namespace

namespace {

// Only rank 0 writes the outputs; when it refuses a path, every rank must stop too
// (exit 2), not wait in the next collective for a rank that is gone.
TEST_F(SeedTable, AnUnwritableJsonEndsEveryRank) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "this build has no MPI: multi-rank jobs cannot start";
#endif
  if (std::system("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(shell("timeout 60 mpirun -np 2 --oversubscribe '" + bin_ +
                  "' run --json /nonexistent-dir/x.json > /dev/null 2>&1"),
            2);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
}

}  // namespace
