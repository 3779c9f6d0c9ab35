// PyTorch's own CPU allocator, measured (tests/reference/torch-1.13-cpu.json, the tests'
// own copy of the reference figures): every strategy's resting bytes per rank, torch's default DDP
// bucket included, reproduced to the byte through the real binary, each rank emulated.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "support/shell.hpp"

namespace {

using shardscope::testing::env;
using shardscope::testing::shell;

// torch's wrapping, as the reference names it, and the shardscope flags that model it.
const std::map<std::string, std::string>& flags_for() {
  static const std::map<std::string, std::string> m = {
      {"ddp (default bucket, gradient_as_bucket_view=False)", "--strategy ddp --ddp-bucket copy"},
      {"ddp (gradient_as_bucket_view=True)", "--strategy ddp"},
      {"zero1 (ZeroRedundancyOptimizer under DDP, default bucket)", "--strategy zero1 --ddp-bucket copy"},
      {"fsdp root unit (SHARD_GRAD_OP = FULL_SHARD)", "--strategy zero2 --units all"},
      {"fsdp one unit per Linear, SHARD_GRAD_OP", "--strategy zero2 --units 1"},
      {"fsdp one unit per Linear, FULL_SHARD", "--strategy zero3 --units 1"},
  };
  return m;
}

TEST(TorchReference, EveryRestingFigureOfTorchsAllocatorIsReproduced) {
  const std::string bin = env("SHARDSCOPE_BIN"), ref_dir = env("SHARDSCOPE_REFERENCE_DIR");
  if (bin.empty() || ref_dir.empty()) GTEST_SKIP() << "run through ctest (SHARDSCOPE_BIN unset)";
  std::ifstream in(ref_dir + "/torch-1.13-cpu.json");
  ASSERT_TRUE(in) << ref_dir << "/torch-1.13-cpu.json";
  const nlohmann::json ref = nlohmann::json::parse(in);
  const nlohmann::json& model = ref["model"];
  ASSERT_EQ(model["loss"], "mse");
  char tmpl[] = "/tmp/shardscope-torchref-XXXXXX";
  const std::string dir = mkdtemp(tmpl) ? tmpl : "";
  ASSERT_FALSE(dir.empty());

  int checked = 0;
  for (const auto& row : ref["per_rank_bytes"]) {
    const std::string strategy = row["strategy"];
    ASSERT_TRUE(flags_for().count(strategy)) << "a reference row this test does not know: " << strategy;
    std::vector<int> worlds;
    if (row["world"].is_array()) worlds = row["world"].get<std::vector<int>>();
    else worlds = {row["world"].get<int>()};
    for (int world : worlds) {
      for (int rank = 0; rank < world; ++rank) {
        SCOPED_TRACE(strategy + " W=" + std::to_string(world) + " rank " + std::to_string(rank));
        const std::string json = dir + "/r.json";
        const std::string cmd = "'" + bin + "' run --backend cpu --layers " + model["layers"].dump() +
                                " --width " + model["width"].dump() + " --batch " +
                                model["batch_per_rank"].dump() + " --activation relu --loss mse --steps 3 " +
                                flags_for().at(strategy) + " --emulate " + std::to_string(world) + ":" +
                                std::to_string(rank) + " --json '" + json + "' > /dev/null";
        ASSERT_EQ(shell(cmd), 0) << cmd;
        std::ifstream out(json);
        const nlohmann::json doc = nlohmann::json::parse(out);
        const nlohmann::json& r = doc["runs"][0]["ranks"][0];
        EXPECT_EQ(r["resting"]["total"], row["resting_allocator"]);
        EXPECT_EQ(r["predicted"]["resting_total"], row["resting_allocator"]);
        ++checked;
      }
    }
  }
  shell("rm -rf '" + dir + "'");
  EXPECT_EQ(checked, 2 * (2 + 4) + 2 + 4 + 3 * (2 + 4));  // every rank of every row
}

}  // namespace
