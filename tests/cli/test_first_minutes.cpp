// What a new user meets first, through the real binary: --version, the closest flag
// named for a misspelt one, one layer per unit by default.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "support/shell.hpp"

namespace shardscope {
namespace {

using testing::first_line;
using testing::shell;

class FirstMinutes : public testing::BinaryTest {
 protected:
  // `shardscope <args>` in dir_: the exit code; stdout in out_, stderr in err_ and its
  // first line in line_.
  int shardscope(const std::string& args) {
    const int rc = shell("cd '" + dir_ + "' && timeout 120 '" + bin_ + "' " + args + " > out.txt 2> err.txt");
    out_ = read(dir_ + "/out.txt");
    err_ = read(dir_ + "/err.txt");
    line_ = first_line(dir_ + "/err.txt");
    return rc;
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::string out_, err_, line_;
};

TEST_F(FirstMinutes, VersionNamesTheVersionAndTheCommit) {
  ASSERT_EQ(shardscope("--version"), 0) << line_;
  EXPECT_EQ(out_.rfind("shardscope ", 0), 0u) << out_;
  EXPECT_NE(out_.find(" (git "), std::string::npos) << out_;
  EXPECT_TRUE(err_.empty()) << err_;
  // The commit is the one the result files carry in provenance.git.
  ASSERT_EQ(shardscope("run --layers 2 --width 8 --batch 2 --steps 2 --json r.json"), 0) << line_;
  const std::string doc = read(dir_ + "/r.json");
  ASSERT_EQ(shardscope("--version"), 0);
  const std::string commit = out_.substr(out_.find("(git ") + 5, out_.find(')') - out_.find("(git ") - 5);
  EXPECT_FALSE(commit.empty());
  EXPECT_NE(doc.find("\"git\": \"" + commit + "\""), std::string::npos) << commit;
}

TEST_F(FirstMinutes, AnUnknownFlagNamesTheClosestKnownOne) {
  const struct {
    const char* args;
    const char* line;
  } cases[] = {
      {"plan --world 64", "shardscope: error: unknown flag '--world'; did you mean --worlds? (shardscope plan --help "
                          "lists the flags)"},
      {"sweep --world 2", "shardscope: error: unknown flag '--world'; did you mean --worlds? (shardscope sweep --help "
                          "lists the flags)"},
      {"run --layer 2", "shardscope: error: unknown flag '--layer'; did you mean --layers? (shardscope run --help "
                        "lists the flags)"},
      {"run --stategy=zero3", "shardscope: error: unknown flag '--stategy=zero3'; did you mean --strategy? "
                              "(shardscope run --help lists the flags)"},
      {"run --micro 2", "shardscope: error: unknown flag '--micro'; did you mean --microbatches? (shardscope run "
                        "--help lists the flags)"},
      {"compare --fail-on-dif a.json b.json", "shardscope: error: compare: unknown flag '--fail-on-dif'; did you "
                                              "mean --fail-on-diff? (shardscope compare --help)"},
      {"--verison", "shardscope: error: unknown flag '--verison'; did you mean --version?; a command comes first: "
                    "run, sweep, plan, compare"},
      // Nothing close: no guess.
      {"run --bogus 1", "shardscope: error: unknown flag '--bogus' (shardscope run --help lists the flags)"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(shardscope(c.args), 2) << c.args;
    EXPECT_EQ(line_, c.line) << c.args;
  }
}

// zero2 and zero3 shard one layer per unit unless told otherwise, as FSDP's per-layer
// wrap policy does; --units all is the root unit.
TEST_F(FirstMinutes, ZeroThreeDefaultsToOneLayerPerUnit) {
  const std::string model = "plan --layers 32 --width 4096 --strategies zero3 --worlds 64 --bytes exact";
  ASSERT_EQ(shardscope(model + " --json default.json"), 0) << line_;
  const std::string by_default = out_;
  ASSERT_EQ(shardscope(model + " --units 1 --json one.json"), 0) << line_;
  EXPECT_EQ(by_default, out_);
  // The peak with 32 units: 353,452,160 B blocking, and under the default --overlap on
  // unit 30's backward also holds unit 31's full gradient in flight, 4·(4096² + 4096) B.
  EXPECT_NE(out_.find("420,577,408"), std::string::npos) << out_;
  std::string a = read(dir_ + "/default.json"), b = read(dir_ + "/one.json");
  // Only the command lines differ.
  for (std::string* doc : {&a, &b}) doc->erase(doc->find("\"command\""), doc->find('\n', doc->find("\"command\"")) - doc->find("\"command\""));
  EXPECT_EQ(a, b);
  EXPECT_NE(a.find("\"layers_per_unit\": 1"), std::string::npos) << a;
  ASSERT_EQ(shardscope(model + " --units all"), 0) << line_;
  EXPECT_NE(out_.find("4,448,092,164"), std::string::npos) << out_;  // the root unit's peak
  // A run says so too, in its JSON and its table.
  ASSERT_EQ(shardscope("run --strategy zero2 --layers 3 --width 8 --batch 2 --steps 2 --json r.json"), 0) << line_;
  const std::string run = read(dir_ + "/r.json");
  EXPECT_NE(run.find("\"layers_per_unit\": 1"), std::string::npos) << run;
  EXPECT_NE(run.find("\"units\": 3"), std::string::npos) << run;
}

// Ten timed steps by default (one warm-up), their spread in the JSON and the table, which
// fits 120 columns.
TEST_F(FirstMinutes, ARunTimesTenStepsAndPrintsTheirSpread) {
  ASSERT_EQ(shardscope("run --layers 2 --width 8 --batch 2 --json r.json"), 0) << line_;
  const std::string doc = read(dir_ + "/r.json");
  EXPECT_NE(doc.find("\"steps\": 11"), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"timed_steps\": 10"), std::string::npos) << doc;
  EXPECT_NE(doc.find("\"max\": "), std::string::npos) << doc;
  EXPECT_NE(out_.find("time per step in ms, over 10 timed steps"), std::string::npos) << out_;
  EXPECT_NE(out_.find("step ms: min  median"), std::string::npos) << out_;
  std::istringstream lines(out_);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 120u) << line;
  EXPECT_TRUE(err_.empty()) << err_;
}

// A plan of a large model with --memory: its title (P in the billions) and its pipeline
// table's verdict column used to run to 127 and 140 columns. Columns are counted as
// characters: "×" and "μ" are two bytes each in UTF-8.
TEST_F(FirstMinutes, APlanOfALargeModelFitsOneHundredTwentyColumns) {
  const auto columns = [](const std::string& line) {
    std::size_t n = 0;
    for (const unsigned char c : line) n += (c & 0xC0) != 0x80;
    return n;
  };
  for (const std::string flags : {"--strategies ddp,zero1,zero2,zero3 --worlds 8,64",
                                  "--schedules 1f1b,interleaved-1f1b --chunks 2 --microbatches 8 --worlds 4"}) {
    ASSERT_EQ(shardscope("plan --layers 80 --width 8192 --batch 16 --activation relu --loss mse --memory 80GiB " + flags),
              0)
        << line_;
    EXPECT_NE(out_.find("fits in 80.0 GiB"), std::string::npos) << out_;
    EXPECT_NE(out_.find(" GiB spare"), std::string::npos) << out_;
    std::istringstream lines(out_);
    for (std::string line; std::getline(lines, line);) EXPECT_LE(columns(line), 120u) << flags << ": " << line;
  }
}

}  // namespace
}  // namespace shardscope
