// A data-parallel run's record, through the binary: the time of each step, and the part
// of it spent inside collectives; where each rank ran (its rank on the node, its device).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::shell;

class RunRecord : public shardscope::testing::BinaryTest {};

TEST_F(RunRecord, CommTimeIsPartOfEveryStep) {
  ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ +
                  "' run --strategy zero3 --units 1 --layers 4 --width 64 --batch 8 --steps 5 --json r.json"
                  " > out.txt 2> err.txt"),
            0);
  std::ifstream in(dir_ + "/r.json");
  const json rank = json::parse(in)["runs"][0]["ranks"][0];
  const std::vector<double> step = rank["step_ms_all"], comm = rank["comm_ms_all"];
  ASSERT_EQ(step.size(), 5u);
  ASSERT_EQ(comm.size(), 5u);
  for (std::size_t i = 0; i < step.size(); ++i) {
    EXPECT_GT(comm[i], 0.0) << "step " << i;  // zero3 gathers every unit twice, even alone
    EXPECT_LE(comm[i], step[i]) << "step " << i;
  }
  // The median and minimum leave out the warm-up step, as step_ms's do.
  std::vector<double> timed(comm.begin() + 1, comm.end());
  std::sort(timed.begin(), timed.end());
  EXPECT_DOUBLE_EQ(rank["comm_ms"]["min"].get<double>(), timed.front());
  EXPECT_DOUBLE_EQ(rank["comm_ms"]["median"].get<double>(), (timed[1] + timed[2]) / 2);
  // The table prints it beside the step's.
  std::ifstream out(dir_ + "/out.txt");
  const std::string text((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("comm ms  exposed ms  step ms"), std::string::npos) << text;
  // The part of it the step waited for: within it every step, all of it with --overlap off.
  const std::vector<double> exposed = rank["comm_exposed_ms_all"];
  ASSERT_EQ(exposed.size(), 5u);
  for (std::size_t i = 0; i < exposed.size(); ++i) {
    EXPECT_GE(exposed[i], 0.0) << "step " << i;
    EXPECT_LE(exposed[i], comm[i]) << "step " << i;
  }
}

TEST_F(RunRecord, SaysWhereItsRankRan) {
  ASSERT_EQ(shell("cd '" + dir_ + "' && timeout 60 '" + bin_ +
                  "' run --backend cpu --layers 2 --width 8 --batch 4 --steps 1 --json r.json > out.txt 2> err.txt"),
            0);
  std::ifstream in(dir_ + "/r.json");
  const json rank = json::parse(in)["runs"][0]["ranks"][0];
  EXPECT_EQ(rank["local_rank"], 0);
  EXPECT_TRUE(rank.contains("device") && rank["device"].is_null()) << rank.value("device", json("absent"));
}

// Under mpirun the rank on the node comes from MPI, not from launcher variables that
// mislead. Without Open MPI's own variables, a launch reads as srun --mpi=pmix's:
// PMIX_RANK (the world rank) and SLURM_LOCALID, here 0 on every rank; read as the
// local rank, they put both ranks on GPU 0. The two ranks share this node: 0 and 1.
TEST_F(RunRecord, LocalRankComesFromMpiNotFromLauncherVariables) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "no MPI in this build";
#else
  if (shell("command -v mpirun >/dev/null") != 0) GTEST_SKIP() << "no mpirun";
  ASSERT_EQ(shell("cd '" + dir_ + "' && timeout -k 5 60 mpirun --oversubscribe -np 2 -x SLURM_LOCALID=0"
                  " env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u OMPI_COMM_WORLD_LOCAL_RANK"
                  " sh -c 'test -n \"$PMIX_RANK\" && exec \"$0\" \"$@\"' '" + bin_ +
                  "' run --backend cpu --layers 2 --width 8 --batch 4 --steps 1 --json r.json > out.txt 2> err.txt"),
            0) << "PMIX_RANK unset under mpirun, or the run failed";
  std::ifstream in(dir_ + "/r.json");
  const json ranks = json::parse(in)["runs"][0]["ranks"];
  ASSERT_EQ(ranks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r]["rank"], r);
    EXPECT_EQ(ranks[r]["local_rank"], r);
    EXPECT_TRUE(ranks[r]["device"].is_null());
  }
#endif
}

}  // namespace
