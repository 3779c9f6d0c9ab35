// `shardscope sweep` end to end with stand-ins: a fake `shardscope run` (a shell script
// that writes a result document or refuses or fails on cue) and a fake mpirun. A real
// mpirun is used too when one is installed.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <iostream>
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
#include "harness/cli/sweep_out_dir.hpp"
#include "harness/records/json_write.hpp"
#include "harness/report/json_io.hpp"
#include "shardscope/check.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Args = std::vector<std::string>;

// Behaviour by environment: FAKE_SKIP=<strategy|schedule> exits 2, FAKE_FAIL=<name>
// exits 3 on rank FAKE_FAIL_RANK (default 0), FAKE_KILL=<name> kills itself with SIGKILL
// on that rank, FAKE_HANG=<name> sleeps (its pid in FAKE_PIDFILE.sh, its sleeper's in
// FAKE_PIDFILE), FAKE_SLOW=<seconds> sleeps that long before writing, FAKE_RMDIR=<path>
// removes that path before writing, FAKE_FDS=<file>
// lists its open descriptors there. Every invocation
// appends its arguments to FAKE_LOG, FAKE_CORRUPT=<from>|<to> edits the JSON it wrote.
// Under mpirun only rank 0 writes.
const char* kFakeRun = R"SH(#!/bin/sh
echo "$*" >> "$FAKE_LOG"
json= ; strategy= ; schedule= ; emulate= ; micro=0 ; units=1
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
if [ "$name" = "$FAKE_KILL" ] && [ "$rank" = "${FAKE_FAIL_RANK:-0}" ]; then kill -9 $$; fi
if [ "$name" = "$FAKE_HANG" ]; then echo $$ > "$FAKE_PIDFILE.sh"; sleep 30 & echo $! > "$FAKE_PIDFILE"; wait; exit 0; fi
[ -z "$FAKE_SLOW" ] || sleep "$FAKE_SLOW"
[ -z "$FAKE_RMDIR" ] || rm -rf "$FAKE_RMDIR"
[ -z "$FAKE_FDS" ] || ls -l /proc/$$/fd > "$FAKE_FDS"
[ "$rank" = 0 ] || [ -n "$emulate" ] || exit 0
# Complete records from FAKE_TEMPLATES (written by the test from the record types), each
# "@KEY@" string replaced: a rank's resting bytes 8421440 (param 2105344, grad 2105344,
# optim 4210752), a model of param_bytes 2105344.
kind=rank; [ -z "$schedule" ] || kind=stage
[ "$micro" != 0 ] || micro=$world
[ "$units" = all ] && units_json='"all"' || units_json=$units
entries=""
r=$first
while [ $r -le $last ]; do
  e=$(sed -e "s|\"@R@\"|$r|g" -e "s|\"@WORLD@\"|$world|g" "$FAKE_TEMPLATES/$kind.json")
  entries="$entries${entries:+, }$e"
  r=$((r + 1))
done
if [ -n "$schedule" ]; then run_template=pipeline; else run_template=data_parallel; fi
run=$(sed -e "s|\"@NAME@\"|\"$name\"|" -e "s|\"@WORLD@\"|$world|" -e "s|\"@MICRO@\"|$micro|" \
          -e "s|\"@UNITS@\"|$units_json|" -e "s|\"@COMM@\"|\"$comm\"|" -e "s|\"@EMULATED@\"|$emulated|" \
          -e "s|\"@ENTRIES@\"|[$entries]|" "$FAKE_TEMPLATES/$run_template.json")
sed -e "s|\"@COMM@\"|\"$comm\"|" -e "s|\"@EMULATED@\"|$emulated|" -e "s|\"@RUN@\"|[$run]|" \
    "$FAKE_TEMPLATES/document.json" > "$json"
[ -z "$FAKE_CORRUPT" ] || sed -i "s|$FAKE_CORRUPT|" "$json"
echo "the run's own table for $name"
)SH";

// Logs its arguments, runs rank 0 of the job only; FAKE_MPIRUN_DIE=N reports rank N dead;
// FAKE_MPIRUN_REFUSE=CODE fails on its own, starting nothing, as mpirun does for an option
// it does not know.
const char* kFakeMpirun = R"SH(#!/bin/sh
echo "$*" >> "$FAKE_MPIRUN_LOG"
if [ -n "$FAKE_MPIRUN_REFUSE" ]; then
  echo "mpirun: Error: unknown option \"--bogus\"" >&2
  echo "Type 'mpirun --help' for usage." >&2
  exit "$FAKE_MPIRUN_REFUSE"
fi
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
    // Beside dir_, not in it: tests list what dir_ holds.
    write_templates(dir_ + ".templates");
    set("FAKE_TEMPLATES", dir_ + ".templates");
  }
  // The fake run's documents: complete records (every field the writer writes), with
  // "@KEY@" strings where it puts its own values.
  static void write_templates(const std::string& dir) {
    fs::create_directories(dir);
    auto put = [&](const std::string& name, const json& j) { std::ofstream(dir + "/" + name) << json_text(j); };
    RankRecord rank;
    rank.resting.total = 8421440;
    rank.resting.bytes[static_cast<int>(Category::param)] = 2105344;
    rank.resting.bytes[static_cast<int>(Category::grad)] = 2105344;
    rank.resting.bytes[static_cast<int>(Category::optim)] = 4210752;
    json r = to_json(rank);
    r["rank"] = "@R@";
    put("rank.json", r);
    json st = to_json(StageRecord{});
    st["stage"] = "@R@";
    st["rank"] = "@R@";
    st["world"] = "@WORLD@";
    put("stage.json", st);
    ModelRecord model{1, 1, 526336, 2, 2105344, "none", "sum", 1, std::nullopt, std::nullopt, std::nullopt};
    DataParallelRun dp;
    dp.units = 1;
    dp.model = model;
    // What both kinds of run put in: the strategy's or schedule's name, the world, the
    // ranks or stages, comm, emulated and backend.
    auto put_run = [&](const std::string& name, json run, const char* name_key, const char* entries_key) {
      run[name_key] = "@NAME@";
      run["world"] = "@WORLD@";
      run[entries_key] = "@ENTRIES@";
      run["comm"] = "@COMM@";
      run["emulated"] = "@EMULATED@";
      run["backend"] = "cpu";
      put(name, run);
    };
    json d = to_json(RunRecord(dp));
    d["layers_per_unit"] = "@UNITS@";
    put_run("data_parallel.json", d, "strategy", "ranks");
    PipelineRun pp;
    pp.chunks = 1;
    pp.model = model;
    json p = to_json(RunRecord(pp));
    p["microbatches"] = "@MICRO@";
    put_run("pipeline.json", p, "schedule", "stages");
    ResultDocument doc;
    doc.version = "fake";
    doc.backend = "cpu";
    doc.provenance.git = "fake";
    doc.provenance.command = "fake run";
    json j = to_json(doc);
    j["comm"] = "@COMM@";
    j["emulated"] = "@EMULATED@";
    j["runs"] = "@RUN@";
    put("document.json", j);
  }
  void TearDown() override {
    for (const std::string& name : set_) unsetenv(name.c_str());
    fs::remove_all(dir_);
    fs::remove_all(dir_ + ".templates");
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
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    int rc = -1;
    try {
      rc = sweep_main(args, fake_run_);
    } catch (...) {
      stdout_ = ::testing::internal::GetCapturedStdout();
      stderr_ = ::testing::internal::GetCapturedStderr();
      throw;
    }
    stdout_ = ::testing::internal::GetCapturedStdout();
    progress_.clear();
    stderr_ = shardscope::testing::without_progress(::testing::internal::GetCapturedStderr(), &progress_);
    return rc;
  }
  json result() const { return read_json_file(out_ + "/shardscope.json"); }
  // The sweep in a child process (a copy of this one), its stdout and stderr to files in
  // dir_; returns its pid. For signals, which would end this process once the sweep
  // lets go of them, and for two sweeps at once.
  pid_t sweep_in_child(Args args, const std::string& out) {
    args.insert(args.end(), {"--out", out});
    std::cout.flush();
    const pid_t pid = fork();
    if (pid != 0) return pid;
    FILE* o = std::freopen((dir_ + "/child.stdout").c_str(), "w", stdout);
    FILE* e = std::freopen((dir_ + "/child.stderr").c_str(), "w", stderr);
    int rc = 100;
    try {
      if (o && e) rc = sweep_main(args, fake_run_);
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "shardscope: error: %s\n", ex.what());
      rc = dynamic_cast<const UsageError*>(&ex) ? 2 : 3;
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  // Waits for the fake run to say it hangs (FAKE_HANG); false after 10 s.
  bool wait_for_hang() const {
    for (int i = 0; i < 500; ++i) {
      if (fs::exists(dir_ + "/hang.pid") && !log("hang.pid").empty()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  // Whether the fake run's sleeper is gone (waits up to 2 s). A zombie counts as gone:
  // it has ended, only its new parent has not reaped it yet.
  bool sleeper_gone() const {
    const std::string pid = log("hang.pid");
    for (int i = 0; i < 100; ++i) {
      std::ifstream status("/proc/" + std::to_string(std::stoi(pid)) + "/status");
      std::string line;
      while (std::getline(status, line) && line.rfind("State:", 0) != 0) {
      }
      if (!status || line.find("Z (zombie)") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  static std::vector<std::string> names_in(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
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
  std::string progress_;  // the sweep's progress lines, from its stderr
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
  EXPECT_EQ(zero2["reason"], "--units 1: not for zero2");
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
  EXPECT_NE(stdout_.find("8.03 MiB"), std::string::npos) << stdout_;  // 8,421,440 B
  EXPECT_NE(stdout_.find("zero2 W=2 units=1: --units 1: not for zero2"), std::string::npos) << stdout_;
  // Progress on stderr, one line per job; stdout holds the tables alone.
  EXPECT_EQ(progress_, "[1/3] ddp W=2: done\n[2/3] zero2 W=2 units=1: skipped: --units 1: not for zero2\n"
                       "[3/3] 1f1b S=2 M=2: done\n");
  EXPECT_EQ(stdout_.find("[1/3]"), std::string::npos) << stdout_;
  EXPECT_TRUE(stderr_.empty()) << stderr_;
  EXPECT_NE(stdout_.find(out_ + "/shardscope.json"), std::string::npos);
  EXPECT_EQ(stdout_.find("the run's own table"), std::string::npos);
  expect_only_the_result();
}

// A job's result file is read into the records where the sweep reads it: a field of the
// wrong type ends the sweep as a failed job (exit 3), naming the file, run, rank and field.
TEST_F(SweepFake, AJobsResultWithABadFieldIsAFailureNamingTheField) {
  set("FAKE_CORRUPT", "\"comm_bytes\":0|\"comm_bytes\":\"x\"");
  EXPECT_EQ(sweep({"--strategies", "ddp", "--worlds", "1"}), 3);
  EXPECT_NE(stderr_.find("ddp W=1: finished, but its result is unusable: '"), std::string::npos) << stderr_;
  EXPECT_NE(stderr_.find(".json': runs[0] (ddp W=1): ranks[0].comm_bytes is \"x\", not a byte count"),
            std::string::npos)
      << stderr_;
  EXPECT_EQ(result()["sweep"]["complete"], false);
}

TEST_F(SweepFake, AFailedRunEndsTheSweepWithExit3AndWritesWhatCompleted) {
  set("FAKE_FAIL", "zero1");
  set("FAKE_FAIL_RANK", "1");
  fs::create_directories(out_);
  std::ofstream(out_ + "/shardscope.json") << "{ an older, broken file";
  EXPECT_EQ(sweep({"--strategies", "ddp,zero1,zero3", "--worlds", "2", "--emulate"}), 3);
  // One line: the rank's own error line is not repeated, its stderr is kept in a file.
  EXPECT_EQ(stderr_, "shardscope: error: rank 1: out of memory: needs 9 B, has 8 B (zero1 W=2; its output: " + out_ +
                         "/failed-job.log)\n");
  EXPECT_EQ(log("results/failed-job.log"), "shardscope: error: rank 1: out of memory: needs 9 B, has 8 B\n");
  const json doc = result();  // whole and valid: the completed ddp run
  ASSERT_EQ(doc["runs"].size(), 1u);
  EXPECT_EQ(doc["runs"][0]["strategy"], "ddp");
  EXPECT_EQ(doc["sweep"]["complete"], false);
  EXPECT_NE(doc["sweep"]["error"].get<std::string>().find("rank 1"), std::string::npos);
  EXPECT_EQ(log("run.log").find("zero3"), std::string::npos) << "the sweep goes on after a failure";
  EXPECT_EQ(names_in(out_), (std::vector<std::string>{"failed-job.log", "shardscope.json"}));
}

TEST_F(SweepFake, ATimeoutKillsTheJobsWholeProcessGroup) {
  set("FAKE_HANG", "ddp");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(sweep({"--strategies", "ddp", "--worlds", "1", "--timeout", "1"}), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_NE(stderr_.find("shardscope: error: ddp W=1: timed out after 1 s; every rank was stopped"), std::string::npos)
      << stderr_;
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
  EXPECT_EQ(stderr_, "shardscope: error: rank 1: exited on signal 9 (Killed) (ddp W=2; its output: " + out_ +
                         "/failed-job.log)\n");
  EXPECT_NE(log("results/failed-job.log").find("mpirun noticed that process rank 1"), std::string::npos)
      << "mpirun's account is kept, not shown";
}

TEST_F(SweepFake, RealMpirunSkipsAndFails) {
  if (find_executable("mpirun").empty()) GTEST_SKIP() << "no mpirun on PATH";
  set("FAKE_SKIP", "zero2");
  set("FAKE_FAIL", "zero3");
  set("FAKE_FAIL_RANK", "1");
  EXPECT_EQ(sweep({"--strategies", "ddp,zero2,zero3", "--worlds", "2"}), 3) << stderr_;
  EXPECT_EQ(stderr_.rfind("shardscope: error: rank 1: out of memory", 0), 0u) << stderr_;
  EXPECT_EQ(std::count(stderr_.begin(), stderr_.end(), '\n'), 1) << "mpirun's banner is kept, not shown:\n"
                                                                  << stderr_;
  EXPECT_NE(log("results/failed-job.log").find("shardscope: error: rank 1: out of memory"), std::string::npos);
  const json doc = result();
  ASSERT_EQ(doc["runs"].size(), 2u) << doc.dump(1);
  EXPECT_EQ(doc["runs"][0]["ranks"].size(), 2u);
  EXPECT_EQ(doc["runs"][1]["skipped"], true);
  EXPECT_EQ(doc["runs"][1]["reason"], "--units 1: not for zero2");
}

TEST_F(SweepFake, BadUsageIsRefusedBeforeAnythingRuns) {
  std::ofstream(dir_ + "/a_file") << "x";
  EXPECT_THROW(sweep_main({"--out", dir_ + "/a_file", "--strategies", "ddp", "--worlds", "1"}, fake_run_), UsageError);
  EXPECT_THROW(sweep_main({"--mpirun", dir_ + "/none", "--strategies", "ddp", "--out", out_}, fake_run_), UsageError);
  EXPECT_THROW(sweep_main({"--worlds", "x"}, fake_run_), UsageError);
  EXPECT_EQ(log("run.log"), "");
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(sweep_main({"--help"}, fake_run_), 0);
  EXPECT_NE(::testing::internal::GetCapturedStdout().find("usage: shardscope sweep"), std::string::npos);
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
  EXPECT_EQ(lines(csv + "/data_parallel.csv"), 1 + 2 * 11);  // two ranks x eleven categories
  EXPECT_EQ(lines(csv + "/pipeline.csv"), 1);
  EXPECT_EQ(log("run.log").find("--report"), std::string::npos) << "not a run flag";
  EXPECT_EQ(log("run.log").find("--csv"), std::string::npos);
  EXPECT_NE(stdout_.find("report: " + report), std::string::npos) << stdout_;
  EXPECT_EQ(names_in(out_), (std::vector<std::string>{"failed-job.log", "shardscope.json"}));
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


// A run flag that `run` would refuse is bad usage of the sweep: refused before any job
// starts, and nothing is created.
TEST_F(SweepFake, ABadRunFlagEndsTheSweepBeforeAnyJob) {
  const std::vector<Args> bad = {{"--layerz", "3"},        {"--activation", "gelu"},         {"--steps"},
                                 {"--units", "0"},         {"--layers", "2", "--layers", "3"}, {"--seed", "x"}};
  for (const Args& flags : bad) {
    Args args = {"--emulate", "--worlds", "1,2", "--strategies", "ddp", "--out", out_};
    args.insert(args.end(), flags.begin(), flags.end());
    std::string what;
    try {
      sweep_main(args, fake_run_);
    } catch (const UsageError& e) {
      what = e.what();
    }
    EXPECT_NE(what.find(flags[0]), std::string::npos) << flags[0] << ": " << what;
  }
  EXPECT_EQ(log("run.log"), "");
  EXPECT_FALSE(fs::exists(out_));
}

// Exit 2 without the run's own error line is mpirun failing, not a configuration to skip.
TEST_F(SweepFake, MpirunFailingOnItsOwnIsAFailureNotASkip) {
  set("FAKE_MPIRUN_REFUSE", "2");
  EXPECT_EQ(sweep({"--mpirun", fake_mpirun_, "--strategies", "ddp,zero1", "--worlds", "2"}), 3);
  EXPECT_EQ(stderr_, "shardscope: error: ddp W=2: mpirun exited with code 2 (no rank reported an error): "
                     "\"mpirun: Error: unknown option \"--bogus\"\" (its output: " + out_ + "/failed-job.log)\n");
  EXPECT_EQ(result()["runs"].size(), 0u);
  EXPECT_EQ(result()["sweep"]["skipped"], 0);
  EXPECT_EQ(log("run.log"), "");
  set("FAKE_MPIRUN_REFUSE", "1");
  EXPECT_EQ(sweep({"--mpirun", fake_mpirun_, "--strategies", "ddp", "--worlds", "2"}), 3);
  EXPECT_NE(stderr_.find("ddp W=2: mpirun exited with code 1 (no rank reported an error): \"mpirun: Error"),
            std::string::npos)
      << stderr_;
}

// One process per rank (W = 1, or emulated): a rank killed by a signal is named.
TEST_F(SweepFake, ARankKilledBySignalIsNamed) {
  set("FAKE_KILL", "ddp");
  EXPECT_EQ(sweep({"--strategies", "ddp", "--worlds", "1"}), 3);
  EXPECT_NE(stderr_.find("shardscope: error: rank 0: killed by signal 9 (Killed) (ddp W=1)\n"), std::string::npos)
      << stderr_;
  set("FAKE_FAIL_RANK", "1");
  EXPECT_EQ(sweep({"--strategies", "ddp", "--worlds", "2", "--emulate"}), 3);
  EXPECT_NE(stderr_.find("shardscope: error: rank 1: killed by signal 9 (Killed) (ddp W=2)\n"), std::string::npos)
      << stderr_;
}

// The sweep's scratch folder is its own: a DIR/.runs of the user's is left alone.
TEST_F(SweepFake, TheScratchFolderIsTheSweepsOwn) {
  fs::create_directories(out_ + "/.runs");
  std::ofstream(out_ + "/.runs/mydata.txt") << "mine";
  ASSERT_EQ(sweep({"--strategies", "ddp", "--worlds", "1,2", "--emulate"}), 0) << stderr_;
  EXPECT_EQ(log("results/.runs/mydata.txt"), "mine");
  EXPECT_EQ(names_in(out_), (std::vector<std::string>{".runs", "shardscope.json"}));
  EXPECT_NE(log("run.log").find(out_ + "/.runs-"), std::string::npos) << log("run.log");
}

// A second sweep into the same DIR is refused while the first runs; the first finishes
// undisturbed.
TEST_F(SweepFake, TwoSweepsNeverShareAnOutDir) {
  set("FAKE_HANG", "zero1");
  const pid_t first = sweep_in_child({"--strategies", "ddp,zero1", "--worlds", "1"}, out_);
  ASSERT_TRUE(wait_for_hang());
  std::string what;
  try {
    sweep_main({"--strategies", "zero3", "--worlds", "1", "--out", out_}, fake_run_);
  } catch (const UsageError& e) {
    what = e.what();
  }
  EXPECT_EQ(what, "--out DIR: another sweep is writing there ('" + out_ + "')");
  EXPECT_EQ(log("run.log").find("zero3"), std::string::npos);
  kill(first, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(first, &status, 0), first);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 3) << log("child.stderr");
  const json doc = result();
  ASSERT_EQ(doc["runs"].size(), 1u);  // the first sweep's ddp run
  EXPECT_EQ(doc["runs"][0]["strategy"], "ddp");
  expect_only_the_result();  // no lock file, no scratch folder
  // The lock went with the first sweep.
  EXPECT_EQ(sweep({"--strategies", "zero3", "--worlds", "1"}), 0) << stderr_;
}

// A sweep killed outright (SIGKILL) leaves its lock file and its scratch folder; the next
// sweep into DIR takes the lock over and removes the folder, and leaves the user's own
// look-alikes (a .runs-XXXXXX file, a link, a longer name) alone.
TEST_F(SweepFake, TheNextSweepRemovesWhatAKilledSweepLeft) {
  set("FAKE_HANG", "zero1");
  const pid_t first = sweep_in_child({"--strategies", "ddp,zero1", "--worlds", "1"}, out_);
  ASSERT_TRUE(wait_for_hang());
  kill(first, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(first, &status, 0), first);
  const std::string sleeper = log("hang.pid");
  kill(std::stoi(sleeper), SIGKILL);  // the killed sweep could not stop its job
  std::vector<std::string> left = names_in(out_);
  ASSERT_EQ(left.size(), 2u) << ::testing::PrintToString(left);  // .runs-XXXXXX and the lock
  EXPECT_EQ(left[0], ".runs-" + left[0].substr(6));
  EXPECT_EQ(left[1], ".shardscope.lock");
  std::ofstream(out_ + "/.runs-myfile") << "mine";
  fs::create_directories(out_ + "/.runs-mydata1");
  fs::create_directory_symlink(dir_, out_ + "/.runs-mylink");

  unsetenv("FAKE_HANG");
  ASSERT_EQ(sweep({"--strategies", "zero3", "--worlds", "1"}), 0) << stderr_;
  EXPECT_EQ(names_in(out_),
            (std::vector<std::string>{".runs-mydata1", ".runs-myfile", ".runs-mylink", "shardscope.json"}));
  EXPECT_EQ(log("results/.runs-myfile"), "mine");
  EXPECT_TRUE(fs::exists(dir_ + "/run.log"));  // the link was not followed
}

// SIGHUP (a closed terminal) and SIGQUIT, like SIGINT and SIGTERM, stop mpirun and every
// rank, and the sweep writes what completed.
TEST_F(SweepFake, HangupAndQuitStopTheJobAndWriteWhatCompleted) {
  set("FAKE_HANG", "zero1");
  for (const int sig : {SIGHUP, SIGQUIT}) {
    fs::remove(dir_ + "/hang.pid");
    fs::remove_all(out_);
    const pid_t sweep =
        sweep_in_child({"--mpirun", fake_mpirun_, "--strategies", "ddp,zero1,zero3", "--worlds", "2"}, out_);
    ASSERT_TRUE(wait_for_hang());
    kill(sweep, sig);
    int status = 0;
    ASSERT_EQ(waitpid(sweep, &status, 0), sweep);
    ASSERT_TRUE(WIFEXITED(status)) << "signal " << sig << " ended the sweep itself";
    EXPECT_EQ(WEXITSTATUS(status), 3);
    EXPECT_TRUE(sleeper_gone()) << "a rank outlived signal " << sig;
    EXPECT_NE(log("child.stderr").find(std::string("shardscope: error: zero1 W=2: interrupted by ") +
                                       (sig == SIGHUP ? "SIGHUP" : "SIGQUIT")),
              std::string::npos)
        << log("child.stderr");
    const json doc = result();
    ASSERT_EQ(doc["runs"].size(), 1u);
    EXPECT_EQ(doc["sweep"]["complete"], false);
    expect_only_the_result();
  }
  EXPECT_EQ(log("run.log").find("zero3"), std::string::npos);
}

// SIGINT every 10 ms: the sweep is either ended before it created anything, or it
// leaves exactly a whole shardscope.json (never a temporary or a scratch folder).
TEST_F(SweepFake, RepeatedInterruptsNeverLeaveAHalfWrittenResult) {
  set("FAKE_HANG", "zero3");
  for (int trial = 0; trial < 8; ++trial) {
    const std::string out = dir_ + "/out" + std::to_string(trial);
    const pid_t sweep = sweep_in_child({"--strategies", "ddp,zero1,zero3", "--worlds", "1"}, out);
    std::this_thread::sleep_for(std::chrono::milliseconds(5 * trial));
    int status = 0;
    while (waitpid(sweep, &status, WNOHANG) == 0) {
      kill(sweep, SIGINT);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (WIFSIGNALED(status) && !fs::exists(out)) continue;  // ended before it began
    if (WIFEXITED(status)) {
      EXPECT_EQ(WEXITSTATUS(status), 3) << "trial " << trial;
    }
    if (WIFEXITED(status) && !fs::exists(out)) {  // stopped before it made anything: says so
      EXPECT_NE(log("child.stderr").find("before any job started"), std::string::npos) << log("child.stderr");
      continue;
    }
    ASSERT_TRUE(fs::exists(out)) << "trial " << trial;
    EXPECT_EQ(names_in(out), std::vector<std::string>{"shardscope.json"}) << "trial " << trial;
    EXPECT_EQ(read_json_file(out + "/shardscope.json")["schema"], "shardscope/1");
  }
}

// Output paths are all checked before anything is made.
TEST_F(SweepFake, ARefusedSweepCreatesNoFolder) {
  const Args ddp = {"--strategies", "ddp", "--worlds", "1"};
  auto refused = [&](Args extra) {
    Args args = ddp;
    args.insert(args.end(), extra.begin(), extra.end());
    try {
      sweep_main(args, fake_run_);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(refused({"--out", dir_ + "/newout", "--report", dir_ + "/nodir/r.html"}).rfind("--report FILE: cannot write", 0), 0u);
  EXPECT_EQ(refused({"--out", dir_ + "/newout", "--csv", dir_ + "/newcsv/a", "--trace", dir_ + "/nodir/t.json"})
                .rfind("--trace FILE: cannot write", 0),
            0u);
  std::ofstream(dir_ + "/a_file") << "x";
  EXPECT_EQ(refused({"--out", dir_ + "/newout", "--csv", dir_ + "/a_file/sub"}),
            "--csv DIR: cannot create '" + dir_ + "/a_file/sub': '" + dir_ + "/a_file' is not a directory");
  EXPECT_FALSE(fs::exists(dir_ + "/newout"));
  EXPECT_FALSE(fs::exists(dir_ + "/newcsv"));
  EXPECT_EQ(log("run.log"), "");
  // A report or trace in a folder that --out or --csv makes is fine.
  ASSERT_EQ(sweep({"--strategies", "ddp", "--worlds", "1", "--report", out_ + "/r.html", "--csv", out_ + "/csv/x",
                   "--trace", out_ + "/csv/t.json"}),
            0)
      << stderr_;
  EXPECT_TRUE(fs::exists(out_ + "/r.html"));
  EXPECT_TRUE(fs::exists(out_ + "/csv/t.json"));
  EXPECT_TRUE(fs::exists(out_ + "/csv/x/pipeline.csv"));
}

// Two outputs that name one file, or a folder that is an output's file, would lose one
// of them: refused (exit 2) before any job runs and before anything is created.
TEST_F(SweepFake, OutputsThatNameOneFileAreRefusedBeforeAnything) {
  const std::string d = dir_;
  fs::create_directories(d + "/real");
  fs::create_directory_symlink(d + "/real", d + "/link");
  auto refusal = [&](Args extra) -> std::string {
    Args args = {"--emulate", "--strategies", "ddp", "--worlds", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    try {
      sweep_main(args, fake_run_);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_EQ(refusal({"--out", d + "/o1", "--trace", d + "/o1/shardscope.json"}),
            "--out and --trace name the same file '" + d + "/o1/shardscope.json': give each its own");
  EXPECT_EQ(refusal({"--out", d + "/o4", "--trace", d + "/o4/../o4/shardscope.json"}),
            "--out and --trace name the same file '" + d + "/o4/../o4/shardscope.json': give each its own");
  EXPECT_EQ(refusal({"--out", d + "/real", "--trace", d + "/link/shardscope.json"}),
            "--out and --trace name the same file '" + d + "/link/shardscope.json': give each its own");
  EXPECT_EQ(refusal({"--out", d + "/o5", "--trace", d + "/c5/data_parallel.csv", "--csv", d + "/c5"}),
            "--csv and --trace name the same file '" + d + "/c5/data_parallel.csv': give each its own");
  EXPECT_EQ(refusal({"--out", d + "/o6", "--report", d + "/c6/pipeline.csv", "--csv", d + "/c6/"}),
            "--csv and --report name the same file '" + d + "/c6/pipeline.csv': give each its own");
  EXPECT_EQ(refusal({"--out", d + "/o7", "--report", d + "/same.out", "--trace", d + "/same.out"}),
            "--trace and --report name the same file '" + d + "/same.out': give each its own");
  EXPECT_EQ(refusal({"--out", d + "/q21", "--report", d + "/q21/.shardscope.lock"}),
            "--out (its lock) and --report name the same file '" + d + "/q21/.shardscope.lock': give each its own");
  EXPECT_EQ(refusal({"--out", d + "/q23", "--trace", d + "/q23/failed-job.log"}),
            "--out (its failed-job log) and --trace name the same file '" + d +
                "/q23/failed-job.log': give each its own");
  EXPECT_EQ(refusal({"--out", d + "/q22", "--csv", d + "/q22/shardscope.json"}),
            "--csv DIR: '" + d + "/q22/shardscope.json' is the file --out writes: give each its own");
  EXPECT_EQ(refusal({"--out", d + "/q24", "--csv", d + "/q24/shardscope.json/sub"}),
            "--csv DIR: '" + d + "/q24/shardscope.json/sub' lies inside '" + d +
                "/q24/shardscope.json', the file --out writes: give each its own");
  EXPECT_EQ(refusal({"--out", d + "/t.json", "--trace", d + "/t.json"}),
            "--out DIR: '" + d + "/t.json' is the file --trace writes: give each its own");
  EXPECT_EQ(refusal({"--out", d + "/o8", "--csv", d + "/r.html/", "--report", d + "/r.html"}),
            "--csv DIR: '" + d + "/r.html/' is the file --report writes: give each its own");
  EXPECT_EQ(log("run.log"), "") << "no job ran";
  EXPECT_EQ(names_in(d), (std::vector<std::string>{"fake_mpirun.sh", "fake_run.sh", "link", "real"}))
      << "nothing was created";
  EXPECT_TRUE(fs::is_empty(d + "/real"));
  // The CSVs beside the result, and a report in --out DIR, are fine.
  ASSERT_EQ(sweep({"--emulate", "--strategies", "ddp", "--worlds", "2", "--csv", out_, "--report",
                   out_ + "/shardscope.html", "--trace", out_ + "/trace.json"}),
            0)
      << stderr_;
  EXPECT_EQ(names_in(out_), (std::vector<std::string>{"data_parallel.csv", "pipeline.csv", "shardscope.html",
                                                       "shardscope.json", "trace.json"}));
}

// --timeout bounds an emulated job, all its ranks together (each rank is its own
// process, run one after another), as it bounds an mpirun job.
TEST_F(SweepFake, ATimeoutBoundsAnEmulatedJobsRanksTogether) {
  set("FAKE_SLOW", "0.45");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(sweep({"--emulate", "--strategies", "ddp", "--worlds", "16", "--timeout", "1"}), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));  // 16 ranks take 7.2 s
  // Ranks 0 and 1 end by 0.9 s; rank 2 gets what is left of the second, not a whole one
  // (which would let it finish, 3 of 16, at 1.35 s).
  EXPECT_TRUE(stderr_.find("timed out after 1 s with 2 of its 16") != std::string::npos ||
              stderr_.find("timed out after 1 s with 1 of its 16") != std::string::npos)
      << stderr_;
  EXPECT_NE(stderr_.find("shardscope: error: ddp W=16: timed out after 1 s with "), std::string::npos) << stderr_;
  EXPECT_NE(stderr_.find(" of its 16 emulated ranks done (--timeout bounds the whole job)"), std::string::npos)
      << stderr_;
}

// A job's process holds its stdout and stderr files once each (descriptors 1 and 2),
// nothing of the sweep's opening left behind.
TEST_F(SweepFake, AJobInheritsOnlyItsOwnStdoutAndStderr) {
  set("FAKE_FDS", dir_ + "/fds.txt");
  ASSERT_EQ(sweep({"--strategies", "ddp", "--worlds", "1"}), 0) << stderr_;
  const std::string fds = log("fds.txt");
  std::size_t job_files = 0;
  for (std::size_t at = fds.find(".runs-"); at != std::string::npos; at = fds.find(".runs-", at + 1)) ++job_files;
  EXPECT_EQ(job_files, 2u) << fds;
}

// A sweep killed outright (SIGKILL: nothing to catch) takes its job's process with it:
// mpirun, which passes SIGTERM on to its ranks, or an emulated rank.
TEST_F(SweepFake, AKilledSweepTakesItsJobWithIt) {
  set("FAKE_HANG", "ddp");
  const pid_t sweep_pid = sweep_in_child({"--emulate", "--strategies", "ddp", "--worlds", "1"}, out_);
  ASSERT_TRUE(wait_for_hang());
  const pid_t job = std::stoi(log("hang.pid.sh"));
  kill(sweep_pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(sweep_pid, &status, 0), sweep_pid);
  bool gone = false;
  for (int i = 0; i < 150 && !gone; ++i) {
    std::ifstream st("/proc/" + std::to_string(job) + "/status");
    std::string line;
    while (std::getline(st, line) && line.rfind("State:", 0) != 0) {
    }
    gone = !st || line.find("Z (zombie)") != std::string::npos;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(std::stoi(log("hang.pid")), SIGKILL);  // the job's own child is the job's to stop
  EXPECT_TRUE(gone) << "the job (pid " << job << ") outlived its sweep";
}

// Every sweep into --out DIR removes the scratch folders there: an output inside one is
// refused before anything runs, and what the folder holds is left alone. So is a --csv
// folder whose second file could not be written.
TEST_F(SweepFake, OutputsInAScratchFolderOrAnUnwritableCsvAreRefusedUpFront) {
  fs::create_directories(out_ + "/.runs-qqqqqq");
  std::ofstream(out_ + "/.runs-qqqqqq/precious.txt") << "mine";
  auto refusal = [&](Args args) -> std::string {
    args.insert(args.end(), {"--strategies", "ddp", "--worlds", "1", "--out", out_});
    try {
      sweep_main(args, fake_run_);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_EQ(refusal({"--report", out_ + "/.runs-qqqqqq/r.html"}),
            "--report FILE: '" + out_ + "/.runs-qqqqqq/r.html' lies in '" + out_ +
                "/.runs-qqqqqq', a sweep's scratch folder, which every sweep into --out DIR removes: write it elsewhere");
  EXPECT_NE(refusal({"--csv", out_ + "/.runs-abcdef"}).find("--csv DIR: "), std::string::npos);
  EXPECT_NE(refusal({"--trace", out_ + "/.runs-qqqqqq/sub/t.json"}).find("a sweep's scratch folder"), std::string::npos);
  EXPECT_EQ(log("results/.runs-qqqqqq/precious.txt"), "mine");
  fs::create_directories(dir_ + "/csv/pipeline.csv");
  EXPECT_EQ(refusal({"--csv", dir_ + "/csv"}), "--csv DIR: cannot write '" + dir_ + "/csv/pipeline.csv': it is a directory");
  EXPECT_EQ(log("run.log"), "");
}


// A sweep writing into DIR/.runs-abc123 would lose it all to the next sweep into DIR: such
// an --out is refused. A sweep removes only scratch folders no running sweep holds, and
// never a folder of the user's that has a scratch folder's name.
TEST_F(SweepFake, ASweepNeverRemovesAnotherSweepsFolder) {
  const Args ddp = {"--strategies", "ddp", "--worlds", "1"};
  Args inside = ddp;
  inside.insert(inside.end(), {"--out", out_ + "/.runs-abc123"});
  try {
    sweep_main(inside, fake_run_);
    ADD_FAILURE() << "--out in a scratch folder was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--out DIR: '" + out_ + "/.runs-abc123' is in '"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("which the next sweep into '" + out_ + "' removes"), std::string::npos)
        << e.what();
  }
  Args deeper = ddp;
  deeper.insert(deeper.end(), {"--out", out_ + "/.runs-abc123/sub"});
  EXPECT_THROW(sweep_main(deeper, fake_run_), UsageError);
  EXPECT_FALSE(fs::exists(out_)) << "a refused sweep makes nothing";

  fs::create_directories(out_ + "/.runs-mine01");
  std::ofstream(out_ + "/.runs-mine01/precious.txt") << "mine";
  fs::create_directories(out_ + "/.runs-empty1");
  {
    const ScratchDir running(out_);  // another sweep's, still running
    std::ofstream(running.path() + "/0.json") << "{}";
    remove_stale_scratch(out_);
    EXPECT_TRUE(fs::exists(running.path() + "/0.json")) << "a held scratch folder was removed";
  }
  EXPECT_EQ(log("results/.runs-mine01/precious.txt"), "mine");
  EXPECT_FALSE(fs::exists(out_ + "/.runs-empty1")) << "an empty one is what a killed sweep left";
  ASSERT_EQ(sweep(ddp), 0) << stderr_;
  EXPECT_EQ(names_in(out_), (std::vector<std::string>{".runs-mine01", "shardscope.json"}));
}


// An interrupted or failed sweep never writes over complete results: what it finished
// goes beside them, named as partial, and it says so. The next complete sweep takes the
// results' place and the partial file goes.
TEST_F(SweepFake, AnIncompleteSweepNeverReplacesCompleteResults) {
  ASSERT_EQ(sweep({"--strategies", "ddp", "--worlds", "1"}), 0) << stderr_;
  const std::string complete = log("results/shardscope.json");
  ASSERT_EQ(result()["sweep"]["complete"], true);

  set("FAKE_HANG", "zero1");
  const pid_t pid = sweep_in_child({"--strategies", "zero3,zero1", "--worlds", "1"}, out_);
  ASSERT_TRUE(wait_for_hang());
  kill(pid, SIGINT);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_EQ(log("results/shardscope.json"), complete) << "complete results were replaced";
  const json partial = read_json_file(out_ + "/shardscope.partial.json");
  ASSERT_EQ(partial["runs"].size(), 1u);
  EXPECT_EQ(partial["runs"][0]["strategy"], "zero3");
  EXPECT_EQ(partial["sweep"]["complete"], false);
  EXPECT_NE(log("child.stdout").find("results: " + out_ + "/shardscope.partial.json (incomplete; the complete "
                                     "results of an earlier sweep in " + out_ + "/shardscope.json were kept)"),
            std::string::npos)
      << log("child.stdout");
  EXPECT_NE(log("child.stderr").find("interrupted by SIGINT"), std::string::npos) << log("child.stderr");

  // A failure, like an interrupt, keeps them; an incomplete file is no complete result.
  unsetenv("FAKE_HANG");
  set("FAKE_FAIL", "zero1");
  EXPECT_EQ(sweep({"--strategies", "ddp,zero1", "--worlds", "1"}), 3);
  EXPECT_EQ(log("results/shardscope.json"), complete);
  EXPECT_EQ(read_json_file(out_ + "/shardscope.partial.json")["runs"][0]["strategy"], "ddp");

  unsetenv("FAKE_FAIL");
  ASSERT_EQ(sweep({"--strategies", "zero1", "--worlds", "1"}), 0) << stderr_;
  EXPECT_EQ(result()["runs"][0]["strategy"], "zero1");
  EXPECT_FALSE(fs::exists(out_ + "/shardscope.partial.json")) << "an older sweep's partial results were left";
  EXPECT_NE(stdout_.find("results: " + out_ + "/shardscope.json\n"), std::string::npos) << stdout_;

  // With no complete results there, an incomplete sweep writes shardscope.json as before.
  set("FAKE_FAIL", "zero1");
  EXPECT_EQ(sweep({"--strategies", "zero1", "--worlds", "1"}), 3);
  fs::remove(out_ + "/shardscope.json");
  std::ofstream(out_ + "/shardscope.json") << R"({"schema": "shardscope/1", "runs": [], "sweep": {"complete": false}})";
  EXPECT_EQ(sweep({"--strategies", "ddp,zero1", "--worlds", "1"}), 3);
  EXPECT_EQ(result()["runs"].size(), 1u);
  EXPECT_FALSE(fs::exists(out_ + "/shardscope.partial.json"));
}

// `run --comm fake` without --emulate is refused (exit 2); a sweep of such runs is refused
// too, before anything runs, not run with every job recorded as skipped.
TEST_F(SweepFake, TheFakeCommunicatorNeedsEmulate) {
  try {
    sweep_main({"--strategies", "ddp", "--worlds", "1", "--comm", "fake", "--out", out_}, fake_run_);
    ADD_FAILURE() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "--comm fake: needs --emulate (each rank its own process on the fake communicator)");
  }
  EXPECT_FALSE(fs::exists(out_));
  EXPECT_EQ(log("run.log"), "");
  EXPECT_EQ(sweep({"--strategies", "ddp", "--worlds", "2", "--comm", "fake", "--emulate"}), 0) << stderr_;
}

// A file that cannot be written at the end does not hide a failed job's error, which is
// reported first, nor keep the files after it from being written.
TEST_F(SweepFake, AFailedWriteHidesNeitherTheJobsErrorNorTheOtherFiles) {
  set("FAKE_FAIL", "zero1");
  fs::create_directories(dir_ + "/gone");
  set("FAKE_RMDIR", dir_ + "/gone");  // passes the check up front, is gone at the end
  const std::string report = dir_ + "/r.html";
  EXPECT_EQ(sweep({"--strategies", "ddp,zero1", "--worlds", "1", "--trace", dir_ + "/gone/t.json", "--report",
                   report}),
            3);
  const std::string first = "shardscope: error: rank 0: out of memory: needs 9 B, has 8 B (zero1 W=1; its output: ";
  EXPECT_EQ(stderr_.rfind(first, 0), 0u) << stderr_;
  EXPECT_NE(stderr_.find("\nshardscope: error: cannot write '" + dir_ + "/gone/t.json"), std::string::npos) << stderr_;
  EXPECT_TRUE(fs::exists(report)) << "the report after the failed trace was not written";
  EXPECT_NE(stdout_.find("report: " + report), std::string::npos) << stdout_;
  EXPECT_EQ(stdout_.find("trace: "), std::string::npos) << stdout_;
  EXPECT_EQ(result()["sweep"]["complete"], false);
}


}  // namespace
}  // namespace shardscope
