// The watchdog on every collective (docs/cli.md `--comm-timeout`): a peer that is alive
// but stuck (SIGSTOP, or the SHARDSCOPE_TEST_STALL hook) ends the job with exit 3 within
// --comm-timeout + 10 s, with one line naming the rank, the collective, its bytes and
// the timeout, and no process left behind. Bad values of the flag are refused, naming it.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "support/processes.hpp"
#include "support/shell.hpp"

namespace {

using shardscope::testing::first_line;
using shardscope::testing::shell;

using shardscope::testing::find_rank;
using shardscope::testing::read_file;

class StuckRank : public shardscope::testing::BinaryTest {
 protected:
  void SetUp() override {
    BinaryTest::SetUp();
    if (IsSkipped()) return;
#ifndef SHARDSCOPE_WITH_MPI
    GTEST_SKIP() << "this build has no MPI: multi-rank jobs cannot start";
#endif
    if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  }
};

TEST_F(StuckRank, ASigstoppedPeerEndsTheSweepWithExit3NamingTheTimeout) {
  // This test's own folder names its processes (each rank's --json lies in it), so that
  // the same test run by someone else on this machine is never taken for this one.
  const std::string marker = dir_ + "/out/";
  const std::string cmd = "'" + bin_ + "' sweep --strategies ddp --worlds 2 --steps 100000 --comm-timeout 2 --out '" +
                          dir_ + "/out' > '" + dir_ + "/stdout' 2> '" + dir_ + "/stderr'";
  int rc = -1;
  std::thread sweep([&] { rc = shell(cmd); });
  int victim = -1;
  for (int i = 0; i < 200 && victim < 0; ++i) {  // wait for rank 1 to start (up to 20 s)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    victim = find_rank(marker, 1);
  }
  if (victim <= 0) sweep.join();
  ASSERT_GT(victim, 0) << "rank 1 never started";
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // well into its steps
  const auto t0 = std::chrono::steady_clock::now();
  kill(victim, SIGSTOP);  // alive, holding its sockets, and never answering
  sweep.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // mpirun's kill reaches the stopped rank (SIGKILL needs no SIGCONT); allow it a moment
  // to be reaped. A zombie ('Z') is gone in all but name.
  bool left = true;
  for (int i = 0; i < 50 && left; ++i) {
    const std::string stat = read_file("/proc/" + std::to_string(victim) + "/stat");
    const std::size_t paren = stat.rfind(')');
    left = paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
    if (left) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string state = read_file("/proc/" + std::to_string(victim) + "/stat");
  if (left) {  // never leave a stopped process behind, whatever the outcome
    kill(victim, SIGKILL);
    kill(victim, SIGCONT);
  }
  EXPECT_EQ(rc, 3);
  EXPECT_LT(seconds, 2.0 + 10.0);
  EXPECT_GE(seconds, 1.5) << "ended before the timeout could have passed";
  const std::string err = read_file(dir_ + "/stderr") + read_file(dir_ + "/out/failed-job.log");
  // Rank 0 waits on the stopped rank 1 in an all-reduce of DDP's gradients (8 layers of
  // 256 x 256 + 256 floats: 2,105,344 B), or, on a machine so loaded that rank 1 was
  // stopped before its first step, in the barrier that starts the run.
  const bool in_all_reduce =
      err.find("rank 0: all_reduce of 2105344 B did not complete within --comm-timeout 2 s") != std::string::npos;
  const bool in_barrier =
      err.find("rank 0: barrier of 0 B did not complete within --comm-timeout 2 s") != std::string::npos;
  EXPECT_TRUE(in_all_reduce || in_barrier) << err;
  EXPECT_FALSE(left) << "the stopped rank 1 was left behind: " << state;
  EXPECT_EQ(find_rank(marker, 0), -1) << "rank 0 was left behind";
}

// The hook scripts/gpu-check.sh uses where no second process can be stopped: rank 1
// sleeps 30 s before its first collective; rank 0's watchdog ends the job long before.
TEST_F(StuckRank, ARankThatSleepsPastTheTimeoutEndsTheRunWithExit3) {
  const std::string err = dir_ + "/err";
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = shell("cd '" + dir_ + "' && SHARDSCOPE_TEST_STALL=1:30 timeout 60 mpirun -np 2 --oversubscribe "
                       "-x SHARDSCOPE_TEST_STALL '" + bin_ + "' run --comm mpi --layers 2 --width 16 --batch 4 "
                       "--comm-timeout 1 > /dev/null 2> '" + err + "'");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(rc, 3);
  EXPECT_LT(seconds, 1.0 + 10.0);
  const std::string text = read_file(err);
  // 2 layers of 16 x 16 + 16 floats: 2,176 B.
  EXPECT_NE(text.find("shardscope: error: rank 0: all_reduce of 2176 B did not complete within --comm-timeout 1 s"),
            std::string::npos)
      << text;
}

TEST_F(StuckRank, TheTimeoutIsAPositiveNumberOfSecondsAtMostADay) {
  for (const char* bad : {"0", "-1", "86401", "inf", "nan", "1e3", "' 2'", "2s", "0.0"}) {
    const std::string err = dir_ + "/err";
    EXPECT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' run --layers 2 --width 16 --comm-timeout " +
                    bad + " > /dev/null 2> '" + err + "'"),
              2)
        << bad;
    EXPECT_EQ(first_line(err).rfind("shardscope: error: --comm-timeout", 0), 0u) << bad << ": " << first_line(err);
    EXPECT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' sweep --strategies ddp --worlds 2 --emulate "
                    "--comm-timeout " + bad + " --out o > /dev/null 2> '" + err + "'"),
              2)
        << "sweep " << bad;
    EXPECT_NE(read_file(err).find("--comm-timeout"), std::string::npos) << "sweep " << bad << ": " << read_file(err);
  }
  EXPECT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ +
                  "' run --layers 2 --width 16 --comm-timeout 0.5 > /dev/null 2>&1"),
            0);
  EXPECT_EQ(shell("cd '" + dir_ + "' && SHARDSCOPE_TEST_STALL=x timeout 60 '" + bin_ +
                  "' run --layers 2 --width 16 > /dev/null 2> err"),
            2);
  EXPECT_NE(first_line(dir_ + "/err").find("SHARDSCOPE_TEST_STALL"), std::string::npos) << first_line(dir_ + "/err");
}

}  // namespace
