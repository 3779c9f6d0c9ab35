// Pipelines of any size are predicted by closed forms in bounded memory: a run that
// cannot fit is refused by the memory check at once (exit 3, both figures), before it
// builds anything of the model's size or of micro-batches × layers, and `plan` answers
// under a 4 GB address-space cap (a walk over micro-batches × layers once took 23 GB;
// interleaved-1f1b's, 7.8 GB).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace shardscope {
namespace {

using testing::first_line;
using testing::shell;

class PipelineBounds : public testing::BinaryTest {
 protected:
  // `bash -c` so that ulimit applies to the binary alone; returns the exit code and the
  // seconds it took, stderr's first line in line_.
  int timed(const std::string& command, double* seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = shell("cd '" + dir_ + "' && timeout 60 bash -c 'ulimit -v 4000000; exec \"$0\" \"$@\"' '" + bin_ +
                         "' " + command + " > out.txt 2> err.txt");
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    line_ = first_line(dir_ + "/err.txt");
    return rc;
  }
  std::string line_;
};

TEST_F(PipelineBounds, AModelThatCannotFitIsRefusedAtOnce) {
  double seconds = 0;
  EXPECT_EQ(timed("run --layers 100000 --width 1000000 --batch 10000000 --activation relu --loss mse "
                  "--schedule gpipe --microbatches 10000 --emulate 2:0",
                  &seconds),
            3)
      << line_;
  EXPECT_LT(seconds, 1.0);
  EXPECT_EQ(line_.rfind("shardscope: error: rank 0: predicted peak ", 0), 0u) << line_;
  // Stage 0 holds all 10,000 micro-batches' saved outputs, 50,000 activations of 1000
  // rows of width 1e6 fp32 (4e9 B) each: about 2e18 B, beside what the process can have.
  EXPECT_NE(line_.find(" exceeds the memory this process can have, "), std::string::npos) << line_;
  EXPECT_NE(line_.find("EiB"), std::string::npos) << line_;
  // interleaved-1f1b's peak is a closed form too (O(S·v) positions of the stage's list
  // visited, the steady state's repeats skipped): as quick, in as little memory.
  EXPECT_EQ(timed("run --layers 100000 --width 1000000 --batch 10000000 --activation relu --loss mse "
                  "--schedule interleaved-1f1b --chunks 2 --microbatches 10000 --emulate 2:0",
                  &seconds),
            3)
      << line_;
  EXPECT_LT(seconds, 1.0);
  EXPECT_EQ(line_.rfind("shardscope: error: rank 0: predicted peak ", 0), 0u) << line_;
}

TEST_F(PipelineBounds, APlanOfAnySizeAnswersUnderAnAddressSpaceCap) {
  double seconds = 0;
  ASSERT_EQ(timed("plan --layers 100000 --width 1 --batch 10000 --schedules gpipe --worlds 2 "
                  "--microbatches 10000 --json plan.json",
                  &seconds),
            0)
      << line_;
  EXPECT_LT(seconds, 5.0);
  std::ifstream in(dir_ + "/plan.json");
  const nlohmann::json plan = nlohmann::json::parse(in);
  ASSERT_EQ(plan["plans"].size(), 1u);
  const nlohmann::json& stages = plan["plans"][0]["stages"];
  ASSERT_EQ(stages.size(), 2u);
  // GPipe's stage 0 saves, per micro-batch, its 50,000 layers' inputs and 49,999 weights
  // (layer 0's input needs no gradient), all live before the first backward.
  const nlohmann::json& p = stages[0]["predicted"];
  EXPECT_EQ(p["total_tensors"], 10000LL * 99999);
  EXPECT_EQ(p["peak_live_tensors"], 10000LL * 99999);
  EXPECT_EQ(p["peak_live_bytes"], 50000LL * 10000 * 4);  // every input, 1 row of width 1 each
  EXPECT_GT(p["peak_total"].get<long long>(), p["resting_total"].get<long long>());

  ASSERT_EQ(timed("plan --layers 100000 --width 1 --batch 10000 --schedules interleaved-1f1b --chunks 2 "
                  "--worlds 2 --microbatches 10000",
                  &seconds),
            0)
      << line_;
  EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace shardscope
