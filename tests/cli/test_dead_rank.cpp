// A rank killed mid-run ends the whole sweep within seconds with exit 3, the line
// `shardscope: error:` naming the rank, and no process left behind (docs/design.md §6).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "support/processes.hpp"

namespace {

using shardscope::testing::find_rank;
using shardscope::testing::read_file;

TEST(DeadRank, KilledRankEndsTheSweepWithExit3NamingIt) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "this build has no MPI: multi-rank jobs cannot start";
#endif
  const char* bin = std::getenv("SHARDSCOPE_BIN");
  if (!bin || !*bin) GTEST_SKIP() << "run through ctest (SHARDSCOPE_BIN unset)";
  if (std::system("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  char tmpl[] = "/tmp/shardscope-dead-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  // This test's own folder names its processes (each rank's --json lies in it): a fixed
  // flag would also match the same test run at the same time from another checkout, and
  // kill or wait for that one's ranks.
  const std::string marker = dir + "/out/";
  const std::string cmd = "'" + std::string(bin) + "' sweep --strategies ddp --worlds 2 --steps 100000 --out '" + dir +
                          "/out' > '" + dir + "/stdout' 2> '" + dir + "/stderr'";
  int rc = -1;
  std::thread sweep([&] {
    const int s = std::system(cmd.c_str());
    rc = WIFEXITED(s) ? WEXITSTATUS(s) : -1;
  });
  int victim = -1;
  for (int i = 0; i < 200 && victim < 0; ++i) {  // wait for rank 1 to start (up to 20 s)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    victim = find_rank(marker, 1);
  }
  ASSERT_GT(victim, 0) << "rank 1 never started";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = std::chrono::steady_clock::now();
  kill(victim, SIGKILL);
  sweep.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(rc, 3);
  EXPECT_LT(seconds, 10.0);
  const std::string err = read_file(dir + "/stderr");
  EXPECT_NE(err.find("shardscope: error: rank 1"), std::string::npos) << err;
  // Rank 0, stopped by mpirun's SIGTERM, does not pass for the culprit: its line says
  // where the SIGTERM came from.
  const std::string log = read_file(dir + "/out/failed-job.log");
  EXPECT_NE(log.find("mpirun noticed that process rank 1"), std::string::npos) << log;
  if (log.find("rank 0: interrupted by SIGTERM") != std::string::npos) {
    EXPECT_NE(log.find("rank 0: interrupted by SIGTERM (mpirun sends it to every rank when one has failed"),
              std::string::npos)
        << log;
  }
  EXPECT_EQ(find_rank(marker, 0), -1) << "rank 0 was left behind";
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
}

}  // namespace
