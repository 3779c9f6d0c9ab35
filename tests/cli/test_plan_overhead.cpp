// `shardscope plan --memory SIZE --overhead RESULT.json`: a measured cuda run's memory outside
// the pool (the most any of its ranks held) is added to every rank's peak, so the verdicts
// and --fit are about the whole device. The measured run here is a fixture written by hand,
// tests/data/overhead/synthetic-cuda-run.json (no GPU on the machines CI runs on): rank 0
// held 600,000,000 B outside the pool, rank 1 650,000,000 B.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
using testing::env;
using testing::first_line;
using testing::shell;

constexpr std::int64_t kOverhead = 650'000'000;  // the fixture's rank 1, its largest
const std::string kModel = "--strategies ddp --worlds 2 --layers 2 --width 8 --batch 4";

class PlanOverhead : public testing::BinaryTest {
 protected:
  void SetUp() override {
    BinaryTest::SetUp();
    if (env("SHARDSCOPE_TEST_DATA_DIR").empty()) GTEST_SKIP() << "run through ctest";
    fixture_ = env("SHARDSCOPE_TEST_DATA_DIR") + "/overhead/synthetic-cuda-run.json";
  }
  // `shardscope plan <flags>` in dir_: the exit code; stdout in out_, stderr's first line in line_.
  int plan(const std::string& flags) {
    const int rc = shell("cd '" + dir_ + "' && timeout 120 '" + bin_ + "' plan " + flags + " > out.txt 2> err.txt");
    std::ifstream in(dir_ + "/out.txt");
    out_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    line_ = first_line(dir_ + "/err.txt");
    return rc;
  }
  json plan_json(const std::string& flags) {
    EXPECT_EQ(plan(flags + " --json plan.json"), 0) << line_;
    std::ifstream in(dir_ + "/plan.json");
    return json::parse(in);
  }
  // The predicted peak of the one rank group of ddp at W = 2 (every rank alike).
  std::int64_t ddp_peak() {
    const json p = plan_json(kModel);
    return p["plans"][0]["rank_groups"][0]["predicted"]["peak_total"].get<std::int64_t>();
  }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
    return dir_ + "/" + name;
  }
  std::string fixture_, out_, line_;
};

TEST_F(PlanOverhead, TheMostAnyRankHeldIsAddedToEveryPeakForTheVerdict) {
  const std::int64_t peak = ddp_peak();
  ASSERT_GT(peak, 0);
  const std::string with = " --overhead '" + fixture_ + "'";
  // Exactly the peak plus the overhead fits; a byte less does not; without --overhead a
  // byte less fits by a wide margin: the overhead decided.
  json fits = plan_json(kModel + " --memory " + std::to_string(peak + kOverhead) + with);
  EXPECT_EQ(fits["plans"][0]["rank_groups"][0]["fits"], true);
  EXPECT_EQ(fits["plans"][0]["fits_every_rank"], true);
  EXPECT_EQ(fits["overhead"]["bytes"], kOverhead);
  EXPECT_EQ(fits["overhead"]["source"], "nvml");
  EXPECT_EQ(fits["overhead"]["taken_from"], "ddp W=2, rank 1");
  EXPECT_EQ(fits["overhead"]["file"], fixture_);
  // The predictions stay the allocator's.
  EXPECT_EQ(fits["plans"][0]["rank_groups"][0]["predicted"]["peak_total"], peak);
  json over = plan_json(kModel + " --memory " + std::to_string(peak + kOverhead - 1) + with);
  EXPECT_EQ(over["plans"][0]["rank_groups"][0]["fits"], false);
  EXPECT_EQ(over["plans"][0]["fits_every_rank"], false);
  json alone = plan_json(kModel + " --memory " + std::to_string(peak + kOverhead - 1));
  EXPECT_EQ(alone["plans"][0]["rank_groups"][0]["fits"], true);
  EXPECT_FALSE(alone.contains("overhead"));  // a plan without it is written as before
}

TEST_F(PlanOverhead, TheTablesSayItAndTheNoteNamesTheFileAndRank) {
  const std::int64_t peak = ddp_peak();
  ASSERT_EQ(plan(kModel + " --wide --bytes exact --memory " + std::to_string(peak + kOverhead - 1) + " --overhead '" +
                 fixture_ + "'"),
            0)
      << line_;
  EXPECT_NE(out_.find("less 650,000,000 B (619.89 MiB) outside the pool"), std::string::npos) << out_;
  EXPECT_NE(out_.find("no, 1 B over"), std::string::npos) << out_;
  EXPECT_NE(out_.find("beside 619.89 MiB outside the pool, among the worlds planned"), std::string::npos) << out_;
  EXPECT_NE(out_.find("Outside the pool: 650,000,000 B (619.89 MiB) per rank"), std::string::npos) << out_;
  EXPECT_NE(out_.find("'" + fixture_ + "'"), std::string::npos) << out_;
  EXPECT_NE(out_.find("(ddp W=2, rank 1, measured"), std::string::npos) << out_;
}

TEST_F(PlanOverhead, FitSearchesWhatTheMemoryLeavesBesideIt) {
  const std::int64_t memory = kOverhead + (std::int64_t{64} << 20);
  const json with = plan_json("--strategies zero3 --worlds 2 --units 1 --memory " + std::to_string(memory) +
                              " --fit batch --overhead '" + fixture_ + "'");
  const json without =
      plan_json("--strategies zero3 --worlds 2 --units 1 --memory " + std::to_string(memory - kOverhead) + " --fit batch");
  ASSERT_TRUE(with["plans"][0]["fit"]["value"].is_number()) << with["plans"][0]["fit"];
  EXPECT_EQ(with["plans"][0]["fit"], without["plans"][0]["fit"]);
  const json alone = plan_json("--strategies zero3 --worlds 2 --units 1 --memory " + std::to_string(memory) + " --fit batch");
  EXPECT_GT(alone["plans"][0]["fit"]["value"].get<std::int64_t>(), with["plans"][0]["fit"]["value"].get<std::int64_t>());
}

TEST_F(PlanOverhead, BadFilesAreExit2NamingTheFlagTheFileAndWhatIsWrong) {
  const auto refused = [&](const std::string& flags, const std::string& wanted) {
    EXPECT_EQ(plan(kModel + " " + flags), 2) << flags;
    EXPECT_EQ(line_.rfind("shardscope: error: --overhead", 0), 0u) << flags << ": " << line_;
    EXPECT_NE(line_.find(wanted), std::string::npos) << flags << ": " << line_;
    std::ifstream none(dir_ + "/plan.json");
    EXPECT_FALSE(none.good()) << flags << ": a refused plan wrote its file";
  };
  refused("--memory 80GiB --overhead '" + dir_ + "/missing.json' --json plan.json", "cannot read '" + dir_ + "/missing.json'");
  const std::string text = write("text.json", "not json\n");
  refused("--memory 80GiB --overhead '" + text + "' --json plan.json", text);
  const std::string other = write("other.json", R"({"schema": "shardscope-plan/1", "plans": []})");
  refused("--memory 80GiB --overhead '" + other + "' --json plan.json", "is not a shardscope/1 result");

  json bad;
  {
    std::ifstream in(fixture_);
    bad = json::parse(in);
  }
  bad["runs"][0]["ranks"][1]["outside_pool_bytes"] = "lots";
  const std::string typo = write("typo.json", bad.dump());
  refused("--memory 80GiB --overhead '" + typo + "' --json plan.json", "ranks[1].outside_pool_bytes is \"lots\"");

  // A cpu run measures nothing outside a pool.
  ASSERT_EQ(shell("cd '" + dir_ + "' && '" + bin_ +
                  "' run --backend cpu --layers 2 --width 8 --batch 4 --steps 2 --emulate 2:0 --json cpu.json > /dev/null 2>&1"),
            0);
  refused("--memory 80GiB --overhead '" + dir_ + "/cpu.json' --json plan.json", "records no outside_pool_bytes");
  // Its figure alone fills the memory.
  refused("--memory 650000000 --overhead '" + fixture_ + "' --json plan.json", "leave nothing of --memory 650,000,000 B");
}

TEST_F(PlanOverhead, ItNeedsMemoryAndIsGivenOnce) {
  EXPECT_EQ(plan(kModel + " --overhead '" + fixture_ + "'"), 2);
  EXPECT_EQ(line_.rfind("shardscope: error: --overhead", 0), 0u) << line_;
  EXPECT_NE(line_.find("needs --memory SIZE"), std::string::npos) << line_;
  EXPECT_EQ(plan(kModel + " --memory 80GiB --overhead '" + fixture_ + "' --overhead '" + fixture_ + "'"), 2);
  EXPECT_NE(line_.find("--overhead: given twice"), std::string::npos) << line_;
}

}  // namespace
}  // namespace shardscope
