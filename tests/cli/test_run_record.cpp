// A data-parallel run's record, through the binary: the time of each step, and the part
// of it spent inside collectives.
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
  EXPECT_NE(text.find("comm ms  step ms"), std::string::npos) << text;
}

}  // namespace
