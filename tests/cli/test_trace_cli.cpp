// `--trace FILE` through the real binary (SHARDSCOPE_BIN): `run` alone and under
// `mpirun -np 2` (rank 0's trace holds both ranks' processes), `sweep --trace` (every
// run's ranks in one file, the flag not passed on to the jobs), and the refusals.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "harness/cli/child_process.hpp"
#include "harness/report/json_io.hpp"
#include "support/trace_check.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::trace_problems;
using testing::trace_processes;
using testing::trace_slice_names;

class TraceCli : public testing::BinaryTest {
 protected:
  // Runs argv; returns the exit code (-1 when it did not exit).
  int run(std::vector<std::string> argv) {
    ChildSpec spec;
    spec.argv = std::move(argv);
    spec.stdout_path = dir_ + "/stdout";
    spec.stderr_path = dir_ + "/stderr";
    spec.extra_env = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};
    spec.timeout_s = 240;
    const ChildResult r = run_child(spec);
    std::ifstream in(spec.stderr_path);
    std::ostringstream s;
    s << in.rdbuf();
    err_ = s.str();
    return r.end == ChildResult::End::exited ? r.code : -1;
  }
  static void expect_valid(const json& trace) {
    const std::vector<std::string> problems = trace_problems(trace);
    EXPECT_TRUE(problems.empty()) << problems.size() << " problems, first: " << problems.front();
  }
  std::string err_;
};

const std::vector<std::string> kSmall = {"--layers", "4", "--width", "32", "--batch", "8", "--steps", "2"};

std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST_F(TraceCli, RunAloneWritesAValidTrace) {
  const std::string trace_path = dir_ + "/one.trace.json";
  ASSERT_EQ(run(cat({bin_, "run", "--backend", "cpu", "--trace", trace_path, "--json", dir_ + "/one.json"}, kSmall)), 0)
      << err_;
  const json trace = read_json_file(trace_path);
  expect_valid(trace);
  const auto procs = trace_processes(trace);
  ASSERT_EQ(procs.size(), 1u);
  EXPECT_EQ(procs.at(100000), "ddp W=1 rank 0");
  const std::vector<std::string> names = trace_slice_names(trace, 100000);
  for (const char* want : {"step", "forward", "backward", "forward layer 3", "optimizer", "all_reduce 16896 B"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  // The JSON carries the timeline the trace was rendered from.
  const json doc = read_json_file(dir_ + "/one.json");
  EXPECT_TRUE(doc["runs"][0]["ranks"][0]["timeline"]["memory"].is_array());
}

TEST_F(TraceCli, UnderMpirunRankZerosTraceHoldsBothRanks) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "this build has no MPI: multi-rank jobs cannot start";
#endif
  if (find_executable("mpirun").empty()) GTEST_SKIP() << "no mpirun on PATH";
  const std::string trace_path = dir_ + "/two.trace.json";
  ASSERT_EQ(run(cat({find_executable("mpirun"), "-np", "2", "--oversubscribe", bin_, "run", "--backend", "cpu",
                     "--strategy", "zero3", "--units", "1", "--trace", trace_path},
                    kSmall)),
            0)
      << err_;
  const json trace = read_json_file(trace_path);
  expect_valid(trace);
  const auto procs = trace_processes(trace);
  ASSERT_EQ(procs.size(), 2u);
  EXPECT_EQ(procs.at(100000), "zero3 W=2 units=1 rank 0");
  EXPECT_EQ(procs.at(100001), "zero3 W=2 units=1 rank 1");
  for (int pid : {100000, 100001}) {
    const std::vector<std::string> names = trace_slice_names(trace, pid);
    EXPECT_NE(std::find(names.begin(), names.end(), "unit 3"), names.end()) << pid;
    bool gather = false;
    for (const std::string& n : names) gather = gather || n.rfind("all_gather ", 0) == 0;
    EXPECT_TRUE(gather) << pid;
  }
}

TEST_F(TraceCli, SweepWritesOneTraceOfEveryRunsRanks) {
  const std::string trace_path = dir_ + "/sweep.trace.json";
  ASSERT_EQ(run(cat({bin_, "sweep", "--emulate", "--strategies", "ddp,zero3", "--worlds", "2", "--units", "1",
                     "--out", dir_ + "/out", "--trace", trace_path},
                    kSmall)),
            0)
      << err_;
  const json trace = read_json_file(trace_path);
  expect_valid(trace);
  const auto procs = trace_processes(trace);
  ASSERT_EQ(procs.size(), 4u);
  EXPECT_EQ(procs.at(100000), "ddp W=2 rank 0 (emulated)");
  EXPECT_EQ(procs.at(200001), "zero3 W=2 units=1 rank 1 (emulated)");
  // The sweep's JSON holds every rank's timeline; the trace is rendered from it.
  const json doc = read_json_file(dir_ + "/out/shardscope.json");
  for (const auto& r : doc["runs"])
    for (const auto& rank : r["ranks"]) EXPECT_TRUE(rank.contains("timeline"));
}

TEST_F(TraceCli, RefusedBeforeAnyWork) {
  EXPECT_EQ(run({bin_, "run", "--trace", dir_ + "/t.json", "--timeline", "off"}), 2);
  EXPECT_NE(err_.find("--trace FILE needs the timeline"), std::string::npos) << err_;
  EXPECT_EQ(run({bin_, "run", "--timeline", "maybe"}), 2);
  EXPECT_NE(err_.find("--timeline: unknown 'maybe'; allowed: on, off"), std::string::npos) << err_;
  EXPECT_EQ(run({bin_, "run", "--trace", dir_ + "/missing/t.json"}), 2);
  EXPECT_NE(err_.find("--trace FILE: cannot write"), std::string::npos) << err_;
  EXPECT_EQ(run({bin_, "sweep", "--emulate", "--strategies", "ddp", "--out", dir_ + "/o", "--trace",
                 dir_ + "/missing/t.json"}),
            2);
  EXPECT_NE(err_.find("--trace FILE: cannot write"), std::string::npos) << err_;
  EXPECT_FALSE(fs::exists(dir_ + "/o/shardscope.json")) << "nothing ran";
}

}  // namespace
}  // namespace shardscope
