// `shardscope sweep` end to end with stand-ins: a fake `shardscope run` (a shell script
// that writes a result document or refuses or fails on cue) and a fake mpirun. A real
// mpirun is used too when one is installed.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness/cli/child_process.hpp"
#include "harness/cli/sweep.hpp"
#include "harness/report/json_io.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Args = std::vector<std::string>;

// Behaviour by environment: FAKE_SKIP=<strategy|schedule> exits 2, FAKE_FAIL=<name>
// exits 3 on rank FAKE_FAIL_RANK (default 0), FAKE_HANG=<name> sleeps. Every
// invocation appends its arguments to FAKE_LOG. Under mpirun only rank 0 writes.
const char* kFakeRun = R"SH(#!/bin/sh
echo "$*" >> "$FAKE_LOG"
json= ; strategy= ; schedule= ; emulate= ; micro=0 ; units=all
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json=$2; shift ;;
    --strategy) strategy=$2; shift ;;
    --schedule) schedule=$2; shift ;;
    --emulate) emulate=$2; shift ;;
    --microbatches) micro=$2; shift ;;
    --units) units=$2; shift ;;
  esac
  shift
done
name=${strategy:-$schedule}
world=${OMPI_COMM_WORLD_SIZE:-1}
rank=${OMPI_COMM_WORLD_RANK:-0}
first=0; last=$((world - 1)); emulated=false; comm=mpi
if [ -n "$emulate" ]; then
  world=${emulate%:*}; rank=${emulate#*:}; first=$rank; last=$rank; emulated=true; comm=fake
fi
if [ "$name" = "$FAKE_SKIP" ]; then echo "shardscope: error: --units $units: not for $name" >&2; exit 2; fi
if [ "$name" = "$FAKE_FAIL" ] && [ "$rank" = "${FAKE_FAIL_RANK:-0}" ]; then
  echo "shardscope: error: rank $rank: out of memory: needs 9 B, has 8 B" >&2; exit 3
fi
if [ "$name" = "$FAKE_HANG" ]; then sleep 30 & echo $! > "$FAKE_PIDFILE"; wait; exit 0; fi
[ "$rank" = 0 ] || [ -n "$emulate" ] || exit 0
entries=""
r=$first
while [ $r -le $last ]; do
  if [ -n "$schedule" ]; then e="{\"stage\": $r, \"rank\": $r}"
  else e="{\"rank\": $r, \"resting\": {\"total\": 8421440, \"param\": 2105344, \"grad\": 2105344, \"optim\": 4210752}}"; fi
  entries="$entries${entries:+, }$e"
  r=$((r + 1))
done
if [ -n "$schedule" ]; then
  run="{\"kind\": \"pipeline\", \"schedule\": \"$schedule\", \"world\": $world, \"microbatches\": $micro, \"stages\": [$entries]}"
else
  run="{\"kind\": \"data_parallel\", \"strategy\": \"$strategy\", \"world\": $world, \"layers_per_unit\": \"$units\", \"model\": {\"param_bytes\": 2105344}, \"ranks\": [$entries]}"
fi
printf '{"schema": "shardscope/1", "version": "fake", "backend": "cpu", "comm": "%s", "emulated": %s, "provenance": {"git": "fake", "command": "fake run"}, "runs": [%s]}\n' "$comm" "$emulated" "$run" > "$json"
echo "the run's own table for $name"
)SH";

// Logs its arguments, runs rank 0 of the job only; FAKE_MPIRUN_DIE=N reports rank N dead.
const char* kFakeMpirun = R"SH(#!/bin/sh
echo "$*" >> "$FAKE_MPIRUN_LOG"
[ "$1" = "-np" ] || exit 99
np=$2; shift 2
[ "$1" = "--oversubscribe" ] && shift
if [ -n "$FAKE_MPIRUN_DIE" ]; then
  echo "mpirun noticed that process rank $FAKE_MPIRUN_DIE with PID 0 on node vm exited on signal 9 (Killed)." >&2
  exit 137
fi
OMPI_COMM_WORLD_SIZE=$np OMPI_COMM_WORLD_RANK=0 exec "$@"
)SH";

class SweepFake : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = (fs::temp_directory_path() / "shardscope-sweep-XXXXXX").string();
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    dir_ = templ;
    fake_run_ = write_script("fake_run.sh", kFakeRun);
    fake_mpirun_ = write_script("fake_mpirun.sh", kFakeMpirun);
    out_ = dir_ + "/results";
    set("FAKE_LOG", dir_ + "/run.log");
    set("FAKE_MPIRUN_LOG", dir_ + "/mpirun.log");
    set("FAKE_PIDFILE", dir_ + "/hang.pid");
  }
  void TearDown() override {
    for (const std::string& name : set_) unsetenv(name.c_str());
    fs::remove_all(dir_);
  }
  std::string write_script(const std::string& name, const char* text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    fs::permissions(path, fs::perms::owner_all);
    return path;
  }
  void set(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    set_.push_back(name);
  }
  // Runs the sweep with --out; stdout and stderr captured.
  int sweep(Args args) {
    args.insert(args.end(), {"--out", out_});
    testing::internal::CaptureStdout();
    testing::internal::CaptureStderr();
    int rc = -1;
    try {
      rc = sweep_main(args, fake_run_);
    } catch (...) {
      stdout_ = testing::internal::GetCapturedStdout();
      stderr_ = testing::internal::GetCapturedStderr();
      throw;
    }
    stdout_ = testing::internal::GetCapturedStdout();
    stderr_ = testing::internal::GetCapturedStderr();
    return rc;
  }
  json result() const { return read_json_file(out_ + "/shardscope.json"); }
  std::string log(const char* name) const {
    std::ifstream in(dir_ + "/" + name);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Only shardscope.json is left in DIR: no temporary, no .runs.
  void expect_only_the_result() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(out_)) names.push_back(e.path().filename().string());
    EXPECT_EQ(names, std::vector<std::string>{"shardscope.json"});
  }

  std::string dir_, out_, fake_run_, fake_mpirun_, stdout_, stderr_;
  std::vector<std::string> set_;
};

TEST_F(SweepFake, EmulatedRanksAreMergedAndSkippedConfigurationsRecorded) {
  set("FAKE_SKIP", "zero2");
  ASSERT_EQ(sweep({"--strategies", "ddp,zero2", "--schedules", "1f1b", "--microbatches", "2", "--worlds", "2",
                   "--emulate", "--steps", "1"}),
            0)
      << stderr_;
  const json doc = result();
  EXPECT_EQ(doc["schema"], "shardscope/1");
  EXPECT_EQ(doc["comm"], "fake");
  EXPECT_EQ(doc["emulated"], true);
  EXPECT_EQ(doc["provenance"]["command"].get<std::string>().rfind("shardscope sweep --strategies ddp,zero2", 0), 0u);
  ASSERT_EQ(doc["runs"].size(), 3u);
  const json& ddp = doc["runs"][0];
  EXPECT_EQ(ddp["strategy"], "ddp");
  ASSERT_EQ(ddp["ranks"].size(), 2u);  // rank 0's and rank 1's processes, merged
  EXPECT_EQ(ddp["ranks"][0]["rank"], 0);
  EXPECT_EQ(ddp["ranks"][1]["rank"], 1);
  const json& zero2 = doc["runs"][1];
  EXPECT_EQ(zero2["skipped"], true);
  EXPECT_EQ(zero2["strategy"], "zero2");
  EXPECT_EQ(zero2["world"], 2);
  EXPECT_EQ(zero2["reason"], "--units all: not for zero2");
  const json& pipe = doc["runs"][2];
  ASSERT_EQ(pipe["stages"].size(), 2u);
  EXPECT_EQ(pipe["stages"][1]["stage"], 1);
  EXPECT_EQ(doc["sweep"]["complete"], true);
  // Every rank ran as its own process, with the pass-through flag.
  const std::string runs = log("run.log");
  EXPECT_NE(runs.find("--emulate 2:0"), std::string::npos) << runs;
  EXPECT_NE(runs.find("--emulate 2:1"), std::string::npos);
  EXPECT_NE(runs.find("--strategy ddp --steps 1 --emulate 2:0 --json"), std::string::npos);
  // Tables and where the JSON went, not the runs' own output.
  EXPECT_NE(stdout_.find("8,421,440"), std::string::npos) << stdout_;
  EXPECT_NE(stdout_.find("zero2 W=2: --units all: not for zero2"), std::string::npos) << stdout_;
  EXPECT_NE(stdout_.find(out_ + "/shardscope.json"), std::string::npos);
  EXPECT_EQ(stdout_.find("the run's own table"), std::string::npos);
  expect_only_the_result();
}

TEST_F(SweepFake, AFailedRunEndsTheSweepWithExit3AndWritesWhatCompleted) {
  set("FAKE_FAIL", "zero1");
  set("FAKE_FAIL_RANK", "1");
  fs::create_directories(out_);
  std::ofstream(out_ + "/shardscope.json") << "{ an older, broken file";
  EXPECT_EQ(sweep({"--strategies", "ddp,zero1,zero3", "--worlds", "2", "--emulate"}), 3);
  EXPECT_NE(stderr_.find("shardscope: error: rank 1: out of memory: needs 9 B, has 8 B (zero1 W=2)"),
            std::string::npos)
      << stderr_;
  const json doc = result();  // whole and valid: the completed ddp run
  ASSERT_EQ(doc["runs"].size(), 1u);
  EXPECT_EQ(doc["runs"][0]["strategy"], "ddp");
  EXPECT_EQ(doc["sweep"]["complete"], false);
  EXPECT_NE(doc["sweep"]["error"].get<std::string>().find("rank 1"), std::string::npos);
  EXPECT_EQ(log("run.log").find("zero3"), std::string::npos) << "the sweep goes on after a failure";
  expect_only_the_result();
}

TEST_F(SweepFake, ATimeoutKillsTheJobsWholeProcessGroup) {
  set("FAKE_HANG", "ddp");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(sweep({"--strategies", "ddp", "--worlds", "1", "--timeout", "1"}), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(stderr_.find("shardscope: error: ddp W=1: timed out after 1 s"), std::string::npos) << stderr_;
  // The script's own child (sleep 30) went with it.
  const pid_t sleeper = std::stoi(log("hang.pid"));
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = kill(sleeper, 0) != 0 && errno == ESRCH;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(gone) << "sleep " << sleeper << " outlived the timeout";
  EXPECT_EQ(result()["runs"].size(), 0u);
}

TEST_F(SweepFake, MpirunGetsTheWorldAndEveryRunFlag) {
  ASSERT_EQ(sweep({"--mpirun", fake_mpirun_, "--strategies", "zero3", "--worlds", "1,2", "--oversubscribe",
                   "--units=1"}),
            0)
      << stderr_;
  const std::string calls = log("mpirun.log");
  EXPECT_NE(calls.find("-np 2 --oversubscribe " + fake_run_ + " run --strategy zero3 --units=1 --json "),
            std::string::npos)
      << calls;
  EXPECT_EQ(calls.find("-np 1"), std::string::npos) << "W = 1 runs without mpirun";
  const json doc = result();
  ASSERT_EQ(doc["runs"].size(), 2u);
  EXPECT_EQ(doc["runs"][1]["ranks"].size(), 2u);
  EXPECT_EQ(doc["emulated"], false);
  EXPECT_EQ(doc["comm"], "mpi");
}

TEST_F(SweepFake, ARankMpirunReportsDeadIsNamed) {
  set("FAKE_MPIRUN_DIE", "1");
  EXPECT_EQ(sweep({"--mpirun", fake_mpirun_, "--strategies", "ddp", "--worlds", "2"}), 3);
  EXPECT_NE(stderr_.find("shardscope: error: rank 1: exited on signal 9 (Killed) (ddp W=2)"), std::string::npos)
      << stderr_;
  EXPECT_NE(stderr_.find("mpirun noticed"), std::string::npos) << "the job's stderr is shown";
}

TEST_F(SweepFake, RealMpirunSkipsAndFails) {
  if (find_executable("mpirun").empty()) GTEST_SKIP() << "no mpirun on PATH";
  set("FAKE_SKIP", "zero2");
  set("FAKE_FAIL", "zero3");
  set("FAKE_FAIL_RANK", "1");
  EXPECT_EQ(sweep({"--strategies", "ddp,zero2,zero3", "--worlds", "2"}), 3) << stderr_;
  EXPECT_NE(stderr_.find("shardscope: error: rank 1: out of memory"), std::string::npos) << stderr_;
  const json doc = result();
  ASSERT_EQ(doc["runs"].size(), 2u) << doc.dump(1);
  EXPECT_EQ(doc["runs"][0]["ranks"].size(), 2u);
  EXPECT_EQ(doc["runs"][1]["skipped"], true);
  EXPECT_EQ(doc["runs"][1]["reason"], "--units all: not for zero2");
}

TEST_F(SweepFake, BadUsageIsRefusedBeforeAnythingRuns) {
  std::ofstream(dir_ + "/a_file") << "x";
  EXPECT_THROW(sweep_main({"--out", dir_ + "/a_file", "--strategies", "ddp", "--worlds", "1"}, fake_run_), UsageError);
  EXPECT_THROW(sweep_main({"--mpirun", dir_ + "/none", "--strategies", "ddp", "--out", out_}, fake_run_), UsageError);
  EXPECT_THROW(sweep_main({"--worlds", "x"}, fake_run_), UsageError);
  EXPECT_EQ(log("run.log"), "");
  testing::internal::CaptureStdout();
  EXPECT_EQ(sweep_main({"--help"}, fake_run_), 0);
  EXPECT_NE(testing::internal::GetCapturedStdout().find("usage: shardscope sweep"), std::string::npos);
}

TEST_F(SweepFake, ReportAndCsvAreWrittenAlsoWhenASweepFails) {
  set("FAKE_FAIL", "zero1");
  const std::string report = dir_ + "/r.html", csv = dir_ + "/csv/sub";
  EXPECT_EQ(sweep({"--strategies", "ddp,zero1", "--worlds", "2", "--emulate", "--report", report, "--csv", csv}), 3);
  std::ifstream in(report);
  std::ostringstream html;
  html << in.rdbuf();
  EXPECT_NE(html.str().find("Incomplete"), std::string::npos);
  EXPECT_NE(html.str().find("out of memory"), std::string::npos);
  int bars = 0;
  for (std::size_t at = html.str().find("class=\"bar peak\""); at != std::string::npos;
       at = html.str().find("class=\"bar peak\"", at + 1))
    ++bars;
  EXPECT_EQ(bars, 2) << "the completed ddp run's two ranks";
  auto lines = [](const std::string& path) {
    std::ifstream f(path);
    int n = 0;
    for (std::string line; std::getline(f, line);) ++n;
    return n;
  };
  EXPECT_EQ(lines(csv + "/data_parallel.csv"), 1 + 2 * 8);
  EXPECT_EQ(lines(csv + "/pipeline.csv"), 1);
  EXPECT_EQ(log("run.log").find("--report"), std::string::npos) << "not a run flag";
  EXPECT_EQ(log("run.log").find("--csv"), std::string::npos);
  EXPECT_NE(stdout_.find("report: " + report), std::string::npos) << stdout_;
  expect_only_the_result();
}

TEST_F(SweepFake, AnUnwritableReportOrCsvIsRefusedBeforeAnythingRuns) {
  std::ofstream(dir_ + "/a_file") << "x";
  auto refusal = [&](const Args& args) -> std::string {
    try {
      sweep_main(args, fake_run_);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const Args ddp = {"--strategies", "ddp", "--worlds", "1", "--out", out_};
  Args bad_report = ddp, bad_csv = ddp;
  bad_report.insert(bad_report.end(), {"--report", dir_ + "/none/r.html"});
  bad_csv.insert(bad_csv.end(), {"--csv", dir_ + "/a_file"});
  EXPECT_EQ(refusal(bad_report).rfind("--report FILE: cannot write", 0), 0u) << refusal(bad_report);
  EXPECT_NE(refusal(bad_csv).find("--csv DIR: '" + dir_ + "/a_file' exists and is not a directory"), std::string::npos)
      << refusal(bad_csv);
  EXPECT_EQ(log("run.log"), "");
}

}  // namespace
}  // namespace shardscope
