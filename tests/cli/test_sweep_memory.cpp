// The sweep's memory does not grow with its ranks' timelines: they wait on disk and are
// written one record at a time. Twelve emulated ranks of 300 steps, traced, took 387 MB
// (VmHWM) when the sweep held every timeline, and ended in std::bad_alloc under a 400 MB
// address-space limit; now about 35 MB.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/report/json_io.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

class SweepMemory : public testing::BinaryTest {
 protected:
  std::string read(const std::string& name) const {
    std::ifstream in(dir_ + "/" + name);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
};

TEST_F(SweepMemory, ManyTimelinesFitUnderAnAddressSpaceLimit) {
  const int rc = testing::shell("cd '" + dir_ + "' && ulimit -v 400000 && timeout 120 '" + bin_ +
                                "' sweep --emulate --strategies ddp --worlds 12 --steps 300 --layers 4 --width 32 "
                                "--out o --trace t.json > out.txt 2> err.txt");
  ASSERT_EQ(rc, 0) << read("err.txt");
  const nlohmann::json doc = read_json_file(dir_ + "/o/shardscope.json");
  ASSERT_EQ(doc["runs"].size(), 1u);
  const nlohmann::json& ranks = doc["runs"][0]["ranks"];
  ASSERT_EQ(ranks.size(), 12u);
  for (const nlohmann::json& rank : ranks) {
    EXPECT_FALSE(rank.contains("timeline_spill")) << "the on-disk stand-in reached the results";
    ASSERT_TRUE(rank.contains("timeline"));
    EXPECT_GT(rank["timeline"]["memory"].size(), 3000u) << "300 steps of about 20 events each";
  }
  const nlohmann::json trace = read_json_file(dir_ + "/t.json");
  int processes = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) processes += e["name"] == "process_name";
  EXPECT_EQ(processes, 12);
}

}  // namespace
}  // namespace shardscope
