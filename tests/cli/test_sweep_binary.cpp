// `shardscope sweep` through the real binary (SHARDSCOPE_BIN): exit codes, the usage
// line, and a small emulated sweep of real `shardscope run` jobs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "harness/cli/child_process.hpp"
#include "support/shell.hpp"
#include "harness/report/json_io.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;

class SweepBinary : public testing::BinaryTest {
 protected:
  // Runs `shardscope sweep args...`; returns the exit code (-1 when it did not exit).
  int sweep(const std::vector<std::string>& args) {
    ChildSpec spec;
    spec.argv = {bin_, "sweep"};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.stdout_path = dir_ + "/stdout";
    spec.stderr_path = dir_ + "/stderr";
    spec.timeout_s = 240;
    const ChildResult r = run_child(spec);
    out_ = read(spec.stdout_path);
    progress_.clear();
    err_ = testing::without_progress(read(spec.stderr_path), &progress_);
    return r.end == ChildResult::End::exited ? r.code : -1;
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::string out_, err_;
  std::string progress_;  // the sweep's progress lines, from its stderr
};

TEST_F(SweepBinary, HelpAndBadFlags) {
  EXPECT_EQ(sweep({"--help"}), 0);
  EXPECT_NE(out_.find("usage: shardscope sweep"), std::string::npos) << out_;
  EXPECT_EQ(sweep({"--worlds", "2,x"}), 2);
  EXPECT_EQ(err_, "shardscope: error: --worlds: 'x' is not a positive integer\n");
  EXPECT_EQ(sweep({"--strategies", "fsdp"}), 2);
  EXPECT_NE(err_.find("allowed: ddp, zero1, zero2, zero3"), std::string::npos) << err_;
}

TEST_F(SweepBinary, AnEmulatedSweepOfRealRuns) {
  const std::string out = dir_ + "/results";
  ASSERT_EQ(sweep({"--emulate", "--strategies", "ddp,zero3", "--worlds", "2", "--layers", "2", "--width", "16",
                   "--batch", "4", "--steps", "2", "--units", "1", "--backend", "cpu", "--out", out}),
            0)
      << err_;
  const nlohmann::json doc = read_json_file(out + "/shardscope.json");
  EXPECT_EQ(doc["schema"], "shardscope/1");
  EXPECT_EQ(doc["emulated"], true);
  ASSERT_EQ(doc["runs"].size(), 2u) << doc.dump(1);
  for (const auto& run : doc["runs"]) {
    ASSERT_EQ(run["ranks"].size(), 2u) << run.dump(1);
    EXPECT_EQ(run["ranks"][0]["rank"], 0);
    EXPECT_EQ(run["ranks"][1]["rank"], 1);
    EXPECT_GT(run["ranks"][1]["resting"]["total"].get<long long>(), 0);
    // "rank" on a run is the one rank it played: the merged run played them all.
    EXPECT_FALSE(run.contains("rank")) << run.dump(1).substr(0, 400);
    EXPECT_EQ(run["emulated"], true);
  }
  EXPECT_EQ(doc["runs"][1]["layers_per_unit"], 1);
  EXPECT_NE(out_.find("emulated (times are compute only)"), std::string::npos) << out_;
  EXPECT_NE(out_.find("results: " + out + "/shardscope.json"), std::string::npos) << out_;
  EXPECT_FALSE(fs::exists(out + "/.runs"));
}

// A run flag `run` refuses ends the sweep at once: exit 2, one line, nothing created.
TEST_F(SweepBinary, ABadRunFlagIsBadUsageOfTheSweep) {
  const std::string out = dir_ + "/out2";
  EXPECT_EQ(sweep({"--emulate", "--worlds", "1,2", "--layers", "2", "--width", "16", "--batch", "4", "--strategies",
                   "ddp", "--out", out, "--layerz", "3"}),
            2);
  EXPECT_EQ(err_.rfind("shardscope: error: ", 0), 0u) << err_;
  EXPECT_NE(err_.find("--layerz"), std::string::npos) << err_;
  EXPECT_EQ(std::count(err_.begin(), err_.end(), '\n'), 1) << err_;
  EXPECT_EQ(out_.find("skipped"), std::string::npos) << out_;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(sweep({"--worlds", "999999999", "--out", out}), 2);
  EXPECT_EQ(err_, "shardscope: error: --worlds: 999999999 is above the largest allowed, 65536 ranks\n");
  EXPECT_FALSE(fs::exists(out));
}

// Data-parallel and pipeline jobs in one sweep, each with its own family's flags, none
// skipped for them; each emulated pipeline's bubble replayed from its stages' action
// times, its wall-clock bubble null, and the table, CSV and report cope with the null.
TEST_F(SweepBinary, AMixedEmulatedSweepReplaysItsPipelines) {
  const std::string out = dir_ + "/results";
  ASSERT_EQ(sweep({"--emulate", "--worlds", "2", "--strategies", "zero2", "--schedules", "zb-h1,interleaved-1f1b",
                   "--chunks", "2", "--units", "1", "--layers", "4", "--width", "8", "--batch", "4", "--steps", "2",
                   "--backend", "cpu", "--out", out, "--csv", out + "/csv", "--report", out + "/r.html"}),
            0)
      << err_;
  const nlohmann::json doc = read_json_file(out + "/shardscope.json");
  ASSERT_EQ(doc["runs"].size(), 3u) << doc.dump(1);
  EXPECT_EQ(doc["sweep"]["skipped"], 0) << out_;
  EXPECT_EQ(doc["runs"][0]["layers_per_unit"], 1);
  for (int i : {1, 2}) {
    const nlohmann::json& run = doc["runs"][i];
    ASSERT_EQ(run["stages"].size(), 2u) << run.dump(1);
    const double makespan = run["replayed_makespan_ms"].get<double>();
    EXPECT_GT(makespan, 0.0);
    for (const nlohmann::json& st : run["stages"]) {
      EXPECT_TRUE(st["bubble_fraction"].is_null()) << st.dump();
      const double replayed = st["bubble_fraction_replayed"].get<double>();
      EXPECT_GE(replayed, 0.0);
      EXPECT_LT(replayed, 1.0);
      // busy = (1 - bubble) x makespan: the replay is of this stage's own action times
      EXPECT_NEAR((1.0 - replayed) * makespan, st["busy_ms"].get<double>(), 1e-6 * makespan + 1e-9);
    }
  }
  EXPECT_EQ(doc["runs"][2]["chunks"], 2);
  EXPECT_NE(out_.find("  - / "), std::string::npos) << "the wall-clock bubble shown as unknown:\n" << out_;
  EXPECT_NE(read(out + "/csv/pipeline.csv").find("zb-h1"), std::string::npos);
  EXPECT_NE(read(out + "/r.html").find("bubble wall -"), std::string::npos);
}

// Outputs that name one file: exit 2, one line, before any job and before anything is made.
TEST_F(SweepBinary, OutputsThatNameOneFileAreBadUsage) {
  const std::vector<std::string> tiny = {"--emulate", "--strategies", "ddp", "--worlds", "2", "--layers", "2",
                                         "--width", "4", "--batch", "2", "--steps", "1"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), tiny.begin(), tiny.end());
    return extra;
  };
  EXPECT_EQ(sweep(with({"--out", dir_ + "/o1", "--trace", dir_ + "/o1/shardscope.json"})), 2);
  EXPECT_EQ(err_, "shardscope: error: --out and --trace name the same file '" + dir_ +
                      "/o1/shardscope.json': give each its own\n");
  EXPECT_EQ(out_, "") << "no job started";
  EXPECT_EQ(sweep(with({"--out", dir_ + "/q22", "--csv", dir_ + "/q22/shardscope.json"})), 2);
  EXPECT_EQ(err_, "shardscope: error: --csv DIR: '" + dir_ +
                      "/q22/shardscope.json' is the file --out writes: give each its own\n");
  EXPECT_EQ(out_, "");
  EXPECT_EQ(sweep(with({"--out", dir_ + "/q21", "--report", dir_ + "/q21/.shardscope.lock"})), 2);
  EXPECT_EQ(std::count(err_.begin(), err_.end(), '\n'), 1) << err_;
  EXPECT_FALSE(fs::exists(dir_ + "/o1"));
  EXPECT_FALSE(fs::exists(dir_ + "/q21"));
  EXPECT_FALSE(fs::exists(dir_ + "/q22"));
}

// A failed run (its memory check refuses it) ends the sweep with exit 3 and one error
// line naming the rank, the job and where its stderr went; the ranks' own errors (and
// mpirun's banners) are in DIR/failed-job.log, not on the terminal.
TEST_F(SweepBinary, AFailedRunIsOneErrorLineAndItsStderrIsKept) {
  const std::vector<std::string> huge = {"--strategies", "ddp", "--worlds", "2", "--width", "100000", "--layers",
                                         "10", "--batch", "2", "--steps", "1", "--backend", "cpu"};
  std::vector<std::vector<std::string>> modes = {{"--emulate"}};
#ifdef SHARDSCOPE_WITH_MPI
  if (!find_executable("mpirun").empty()) modes.push_back({"--oversubscribe"});
#endif
  for (const std::vector<std::string>& mode : modes) {
    const std::string out = dir_ + "/big" + std::to_string(&mode - modes.data());
    std::vector<std::string> args = huge;
    args.insert(args.end(), mode.begin(), mode.end());
    args.insert(args.end(), {"--out", out});
    EXPECT_EQ(sweep(args), 3) << mode[0] << ": " << err_;
    EXPECT_EQ(std::count(err_.begin(), err_.end(), '\n'), 1) << mode[0] << ": one line, not:\n" << err_;
    EXPECT_EQ(err_.rfind("shardscope: error: rank ", 0), 0u) << err_;
    const std::string tail = "(ddp W=2; its output: " + out + "/failed-job.log)\n";
    ASSERT_GE(err_.size(), tail.size()) << err_;
    EXPECT_EQ(err_.substr(err_.size() - tail.size()), tail) << err_;
    ASSERT_TRUE(fs::is_regular_file(out + "/failed-job.log")) << mode[0];
    const std::string kept = read(out + "/failed-job.log");
    EXPECT_NE(kept.find("shardscope: error: rank "), std::string::npos) << kept;
    const nlohmann::json doc = read_json_file(out + "/shardscope.json");
    EXPECT_EQ(doc["sweep"]["complete"], false);
    EXPECT_EQ(doc["sweep"]["error"].get<std::string>().find("failed-job.log"), std::string::npos)
        << "the JSON keeps the failure, not a path on this machine";
  }
}

// `run --csv DIR` writes the same files as the sweep, for its one run.
TEST_F(SweepBinary, RunWritesCsv) {
  ChildSpec spec;
  spec.argv = {bin_, "run", "--emulate", "2:1", "--strategy", "zero1", "--layers", "2", "--width", "8",
               "--batch", "2", "--steps", "2", "--backend", "cpu", "--csv", dir_ + "/csv"};
  spec.stdout_path = dir_ + "/stdout";
  spec.stderr_path = dir_ + "/stderr";
  spec.timeout_s = 120;
  const ChildResult r = run_child(spec);
  ASSERT_TRUE(r.end == ChildResult::End::exited && r.code == 0) << read(spec.stderr_path);
  std::istringstream dp(read(dir_ + "/csv/data_parallel.csv"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(dp, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1u + 11u);  // header, then rank 1's eleven categories (param_cast last)
  EXPECT_EQ(lines[0].rfind("world,strategy,units,prefetch,ddp_bucket,rank,category,", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("2,zero1,,,view,1,param,", 0), 0u) << lines[1];
  EXPECT_EQ(read(dir_ + "/csv/pipeline.csv").rfind("schedule,stages,", 0), 0u);
}

}  // namespace
}  // namespace shardscope
