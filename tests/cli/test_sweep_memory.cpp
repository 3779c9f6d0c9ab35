// The sweep's memory does not grow with its ranks' timelines: they wait on disk and are
// written one record at a time. Twelve emulated ranks of 300 steps, traced, took 387 MB
// (VmHWM) when the sweep held every timeline, and ended in std::bad_alloc under a 400 MB
// address-space limit; now about 35 MB. The limit is set above what the binary needs
// to start (its libraries), so the test means the same with CUDA's.
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
  // 340 MiB above what the binary needs to start (400 MB in all on a CPU build, where the
  // sweep that held every timeline needed 387 MB more than that start).
  const long startup = testing::startup_address_space_kib(bin_);
  ASSERT_GT(startup, 0) << "the binary does not start even under 16 GiB";
  const int rc = testing::shell("cd '" + dir_ + "' && ulimit -v " + std::to_string(startup + 340 * 1024) +
                                " && timeout 120 '" + bin_ +
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
