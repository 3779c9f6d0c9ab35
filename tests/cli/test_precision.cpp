// --precision through the binary: every record (a run's of either kind, a plan's) says its
// precision, fp32 by default; bf16 where it is not built is refused by name on run, sweep
// and plan (exit 2, one line), as is a precision that does not exist.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace {

using nlohmann::json;
using shardscope::testing::first_line;
using shardscope::testing::shell;

class Precision : public shardscope::testing::BinaryTest {
 protected:
  json read(const std::string& file) {
    std::ifstream in(dir_ + "/" + file);
    return json::parse(in);
  }
  int binary(const std::string& args) {
    return shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' " + args + " > out.txt 2> err.txt");
  }
};

TEST_F(Precision, RecordsSayFp32ByDefaultAndWhenAskedFor) {
  const std::string mlp = "--backend cpu --layers 2 --width 8 --batch 4 --steps 2 ";
  ASSERT_EQ(binary("run " + mlp + "--strategy zero1 --emulate 2:1 --json dp.json"), 0) << first_line(dir_ + "/err.txt");
  EXPECT_EQ(read("dp.json")["runs"][0]["precision"], "fp32");
  ASSERT_EQ(binary("run " + mlp + "--precision fp32 --schedule 1f1b --emulate 2:0 --json pp.json"), 0)
      << first_line(dir_ + "/err.txt");
  EXPECT_EQ(read("pp.json")["runs"][0]["precision"], "fp32");
  ASSERT_EQ(binary("plan --layers 2 --width 8 --worlds 2 --strategies ddp,zero3 --schedules 1f1b --json plan.json"), 0)
      << first_line(dir_ + "/err.txt");
  const json plans = read("plan.json")["plans"];
  ASSERT_EQ(plans.size(), 3u);
  for (const json& p : plans) EXPECT_EQ(p["precision"], "fp32") << p.dump();
}

TEST_F(Precision, WhatIsNotBuiltIsRefusedByName) {
  const struct {
    const char* args;
    const char* line;
  } cases[] = {
      {"run --backend cpu --layers 2 --width 8 --precision bf16",
       "shardscope: error: --precision bf16: not built yet; allowed: fp32"},
      {"plan --layers 2 --width 8 --worlds 2 --precision bf16",
       "shardscope: error: --precision bf16: not built yet; allowed: fp32"},
      {"sweep --backend cpu --layers 2 --width 8 --worlds 2 --precision bf16 --out sw",
       "shardscope: error: --precision bf16: not built yet; allowed: fp32"},
      {"run --backend cpu --layers 2 --width 8 --precision fp16",
       "shardscope: error: --precision: unknown 'fp16'; allowed: fp32, bf16"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(binary(c.args), 2) << c.args;
    EXPECT_EQ(first_line(dir_ + "/err.txt"), c.line) << c.args;
  }
}

}  // namespace
