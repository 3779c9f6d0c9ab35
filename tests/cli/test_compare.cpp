// `shardscope compare`: two result documents matched configuration by configuration and
// rank by rank; every byte figure that differs is named with its difference, and step
// times are set as ratios. Bad inputs are exit 2 with one line naming the file.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/cli/compare.hpp"
#include "harness/report/table.hpp"
#include "support/report_doc.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// The report document, and a "new" one: zero3 (one layer per unit) rank 1 holds 32 KiB
// more temp at its peak, every step takes twice as long, and the root-unit zero3 run is
// gone.
struct Pair {
  json base = testing::report_document();
  json fresh = testing::report_document();
  Pair() {
    json& rank = fresh["runs"][1]["ranks"][1];
    rank["peak"]["by_category"]["temp"] = rank["peak"]["by_category"]["temp"].get<std::int64_t>() + 32768;
    rank["peak"]["total"] = rank["peak"]["total"].get<std::int64_t>() + 32768;
    for (json& run : fresh["runs"])
      for (const char* field : {"ranks", "stages"})
        if (run.contains(field))
          for (json& r : run[field]) r["step_ms"]["median"] = 2 * r["step_ms"]["median"].get<double>();
    fresh["runs"].erase(2);
    fresh["backend"] = "cuda";
  }
};

TEST(Compare, MatchesConfigurationsAndNamesWhatDiffers) {
  const Pair p;
  const json cmp = compare_documents(p.base, "a.json", p.fresh, "b.json");
  EXPECT_EQ(cmp["base"]["backend"], "cpu");
  EXPECT_EQ(cmp["new"]["backend"], "cuda");
  ASSERT_EQ(cmp["runs"].size(), 5u);  // zero2, zero3, ddp, two pipelines; the skipped one is not compared
  EXPECT_EQ(cmp["only_in_base"], json::array({"zero3 W=2 units=all"}));
  EXPECT_TRUE(cmp["only_in_new"].empty());
  const json& zero3 = cmp["runs"][1];
  EXPECT_EQ(zero3["label"], "zero3 W=2 1 layer/unit");
  ASSERT_EQ(zero3["ranks"].size(), 2u);
  EXPECT_TRUE(zero3["ranks"][0]["differs"].empty());
  EXPECT_EQ(zero3["ranks"][1]["differs"], json::array({"peak temp +32,768 B", "peak +32,768 B"}));
  for (const json& run : cmp["runs"])
    for (const json& r : run["ranks"])
      EXPECT_DOUBLE_EQ(r["new"]["step_ms"].get<double>(), 2 * r["base"]["step_ms"].get<double>());

  std::ostringstream os;
  print_comparison(cmp, os);
  const std::string text = os.str();
  EXPECT_NE(text.find("base: a.json (backend cpu, comm mpi, git abc, host h)"), std::string::npos) << text;
  EXPECT_NE(text.find("new:  b.json (backend cuda"), std::string::npos) << text;
  // The differing configuration gets a row per rank; the others one row.
  EXPECT_NE(text.find("peak temp +32,768 B; peak +32,768 B"), std::string::npos) << text;
  EXPECT_NE(text.find("+32,768"), std::string::npos) << text;
  EXPECT_NE(text.find("zero2 W=2 1 layer/unit  all"), std::string::npos) << text;
  EXPECT_NE(text.find("only in base: zero3 W=2 units=all"), std::string::npos) << text;
  EXPECT_NE(text.find("configurations compared: 5; bytes identical in 4, different in 1; step time new/base: "
                      "median 2.000 (2.000 to 2.000)"),
            std::string::npos)
      << text;
}

TEST(Compare, ADocumentAgainstItselfIsIdentical) {
  const json doc = testing::report_document();
  const json cmp = compare_documents(doc, "a", doc, "a");
  for (const json& run : cmp["runs"])
    for (const json& r : run["ranks"]) EXPECT_TRUE(r["differs"].empty()) << r;
  std::ostringstream os;
  print_comparison(cmp, os);
  EXPECT_NE(os.str().find("bytes identical in 6, different in 0; step time new/base: median 1.000"),
            std::string::npos)
      << os.str();
}

// Files are read as given: fields of the wrong type are passed over, never a crash.
TEST(Compare, FieldsOfTheWrongTypeArePassedOver) {
  json odd = testing::report_document();
  odd["runs"].push_back(5);
  odd["runs"][0]["kind"] = 7;
  odd["runs"][1]["skipped"] = "no";
  odd["runs"][1]["ranks"][0]["rank"] = "zero";
  odd["runs"][1]["ranks"][1]["step_ms"] = 3;
  odd["runs"][1]["ranks"][1]["peak"] = "high";
  odd["runs"][3]["ranks"] = "all of them";
  const json base = testing::report_document();
  json cmp;
  ASSERT_NO_THROW(cmp = compare_documents(base, "a", odd, "b"));
  std::ostringstream os;
  ASSERT_NO_THROW(print_comparison(cmp, os));
  // zero3 (one layer per unit), the first run compared: rank 0's number is a string in
  // the new file (not matched), rank 1 compared.
  const json& zero3 = cmp["runs"][0];
  EXPECT_EQ(zero3["label"], "zero3 W=2 1 layer/unit");
  ASSERT_EQ(zero3["ranks"].size(), 1u);
  EXPECT_TRUE(zero3["ranks"][0]["new"]["step_ms"].is_null());
  EXPECT_FALSE(zero3["ranks"][0]["differs"].empty());
  EXPECT_EQ(cmp["only_in_base"], json::array({"zero2 W=2 1 layer/unit"}));  // its kind no longer matches
}

class CompareCli : public testing::BinaryTest {
 protected:
  int compare(const std::string& args) {
    const int rc = testing::shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' compare " + args +
                                  " > out.txt 2> err.txt");
    line_ = testing::first_line(dir_ + "/err.txt");
    return rc;
  }
  std::string line_;
};

TEST_F(CompareCli, BadInputsNameTheFile) {
  std::ofstream(dir_ + "/good.json") << testing::report_document().dump();
  std::ofstream(dir_ + "/text.json") << "not json";
  std::ofstream(dir_ + "/plan.json") << json{{"schema", "shardscope-plan/1"}, {"plans", json::array()}}.dump();
  EXPECT_EQ(compare("good.json good.json"), 0) << line_;
  EXPECT_EQ(compare("good.json"), 2);
  EXPECT_EQ(line_, "shardscope: error: compare: expected two result files, BASE.json NEW.json; got 1 argument "
                   "(shardscope compare --help)");
  EXPECT_EQ(compare("missing.json good.json"), 2);
  EXPECT_EQ(line_.rfind("shardscope: error: BASE: cannot read 'missing.json': ", 0), 0u) << line_;
  EXPECT_EQ(compare("good.json text.json"), 2);
  EXPECT_EQ(line_.rfind("shardscope: error: NEW: 'text.json' is not valid JSON", 0), 0u) << line_;
  EXPECT_EQ(compare("good.json plan.json"), 2);
  EXPECT_EQ(line_, "shardscope: error: NEW: 'plan.json' is not a shardscope/1 result (a run's --json or a "
                   "sweep's DIR/shardscope.json)");
}

}  // namespace
}  // namespace shardscope
