// `shardscope compare`: two result documents matched configuration by configuration and
// rank by rank; every byte figure that differs is named with its difference, and step
// times are set as ratios. Bad inputs are exit 2 with one line naming the file, and for
// a document's content the run and the field.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/cli/compare.hpp"
#include "harness/records/json_read.hpp"
#include "harness/report/table.hpp"
#include "shardscope/check.hpp"
#include "support/records_of.hpp"
#include "support/report_doc.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
using Labels = std::vector<std::string>;

// compare_documents on hand-made documents, read as records as compare reads its files.
Comparison compared(const json& base, const std::string& base_path, const json& fresh, const std::string& new_path) {
  return compare_documents(testing::records_of(base), base_path, testing::records_of(fresh), new_path);
}

// The report document with every field a result file holds (what run and sweep write).
json full_document() { return testing::complete_document(testing::report_document()); }

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
  const Comparison cmp = compared(p.base, "a.json", p.fresh, "b.json");
  EXPECT_EQ(cmp.base.backend, "cpu");
  EXPECT_EQ(cmp.fresh.backend, "cuda");
  ASSERT_EQ(cmp.runs.size(), 5u);  // zero2, zero3, ddp, two pipelines; the skipped one is not compared
  EXPECT_EQ(cmp.only_in_base, Labels({"zero3 W=2 units=all"}));
  EXPECT_TRUE(cmp.only_in_new.empty());
  const ComparedRun& zero3 = cmp.runs[1];
  EXPECT_EQ(zero3.label, "zero3 W=2 units=1");
  ASSERT_EQ(zero3.ranks.size(), 2u);
  EXPECT_TRUE(zero3.ranks[0].differs.empty());
  EXPECT_EQ(zero3.ranks[1].differs, Labels({"peak temp +32,768 B", "peak +32,768 B"}));
  for (const ComparedRun& run : cmp.runs)
    for (const ComparedRank& r : run.ranks) {
      ASSERT_TRUE(r.base.step_ms && r.fresh.step_ms) << run.label;
      EXPECT_DOUBLE_EQ(*r.fresh.step_ms, 2 * *r.base.step_ms);
    }

  std::ostringstream os;
  print_comparison(cmp, os, TableOptions{true, true});  // --bytes exact --wide
  const std::string text = os.str();
  EXPECT_NE(text.find("base: a.json (backend cpu, comm mpi, git abc, host h)"), std::string::npos) << text;
  EXPECT_NE(text.find("new:  b.json (backend cuda"), std::string::npos) << text;
  // The differing configuration gets a row per rank; the others one row.
  EXPECT_NE(text.find("peak temp +32,768 B; peak +32,768 B"), std::string::npos) << text;
  EXPECT_NE(text.find("+32,768"), std::string::npos) << text;
  EXPECT_NE(text.find("zero2 W=2 units=1       all"), std::string::npos) << text;
  EXPECT_NE(text.find("only in base: zero3 W=2 units=all"), std::string::npos) << text;
  EXPECT_NE(text.find("configurations compared: 5; bytes identical in 4, different in 1; step time new/base: "
                      "median 2.000 (2.000 to 2.000)"),
            std::string::npos)
      << text;
}

TEST(Compare, ADocumentAgainstItselfIsIdentical) {
  const json doc = testing::report_document();
  const Comparison cmp = compared(doc, "a", doc, "a");
  for (const ComparedRun& run : cmp.runs)
    for (const ComparedRank& r : run.ranks) EXPECT_TRUE(r.differs.empty()) << run.label << " rank " << r.rank;
  std::ostringstream os;
  print_comparison(cmp, os);
  EXPECT_NE(os.str().find("bytes identical in 6, different in 0; step time new/base: median 1.000"),
            std::string::npos)
      << os.str();
}

// Runs of one model left unpaired are set side by side across settings: ddp at W = 4
// against zero3 at W = 2 (`compare ddp.json zero3.json`), ranks by number, the ranks W = 2
// cannot have on the base side alone.
TEST(Compare, PairsRunsOfOneModelAcrossSettings) {
  json base = testing::report_document(), fresh = testing::report_document();
  base["runs"] = json::array({base["runs"][3]});    // ddp W=4
  fresh["runs"] = json::array({fresh["runs"][1]});  // zero3 W=2 units=1
  fresh["runs"][0]["ranks"][0]["resting"]["total"] = 9000;
  const Comparison cmp = compared(base, "ddp.json", fresh, "zero3.json");
  EXPECT_TRUE(cmp.only_in_base.empty());
  EXPECT_TRUE(cmp.only_in_new.empty());
  ASSERT_EQ(cmp.runs.size(), 1u);
  const ComparedRun& run = cmp.runs[0];
  EXPECT_EQ(run.label, "ddp W=4 vs zero3 W=2 units=1");
  EXPECT_TRUE(run.across_settings);
  EXPECT_EQ(run.base_label, "ddp W=4");
  EXPECT_EQ(run.new_label, "zero3 W=2 units=1");
  ASSERT_EQ(run.ranks.size(), 4u);
  EXPECT_EQ(run.ranks[0].differs[0], "resting -7,000 B");
  ASSERT_FALSE(run.ranks[0].differences.empty());
  EXPECT_EQ(run.ranks[0].differences[0].what, "resting");
  EXPECT_EQ(run.ranks[0].differences[0].base, 16000);
  EXPECT_EQ(run.ranks[0].differences[0].fresh, 9000);
  EXPECT_FALSE(run.ranks[0].differences[0].count);
  EXPECT_EQ(run.ranks[2].differs, Labels({"rank only in base"}));
  EXPECT_FALSE(run.ranks[2].fresh.resting.has_value());
  EXPECT_TRUE(comparison_differs(cmp));
  std::ostringstream os;
  print_comparison(cmp, os);
  const std::string text = os.str();
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 120u) << line;
  // Ranks 0, 1 and 2-3 each a row: base and new side by side, "=" where new equals base.
  EXPECT_NE(text.find("  ddp W=4 vs zero3 W=2 units=1  0            15.6 KiB  8.79 KiB"), std::string::npos) << text;
  EXPECT_NE(text.find("  ddp W=4 vs zero3 W=2 units=1  1            15.6 KiB         ="), std::string::npos) << text;
  EXPECT_NE(text.find("  ddp W=4 vs zero3 W=2 units=1  2-3          15.6 KiB         -"), std::string::npos) << text;
  EXPECT_NE(text.find("ddp W=4 vs zero3 W=2 units=1, rank 0: resting -6.84 KiB"), std::string::npos) << text;
  EXPECT_NE(text.find("ddp W=4 vs zero3 W=2 units=1, rank 2-3: rank only in base"), std::string::npos) << text;
  EXPECT_NE(text.find("1 of them across settings"), std::string::npos) << text;
  // The same configuration is still paired with its own first: zero3 with zero3.
  base = testing::report_document();
  EXPECT_FALSE(comparison_differs(compared(base, "a", base, "a")));
}

// The reader's refusal of `doc` read from 'a.json' (what compare reads its files with);
// "" when it accepts it.
std::string refusal(const json& doc) {
  try {
    read_result(doc, "a.json");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// What run and sweep write is accepted: the report document holds a skipped record
// (a configuration and a reason, no model, no ranks); step times are null when no step
// was timed; a run may list no stage. A figure a record lacks is refused, naming it.
TEST(CompareInput, AcceptsWhatRunAndSweepWrite) {
  json doc = full_document();
  ASSERT_EQ(doc["runs"][6]["skipped"], true);
  EXPECT_EQ(refusal(doc), "");
  doc["runs"][0]["ranks"][0]["step_ms"] = {{"median", nullptr}, {"min", nullptr}, {"max", nullptr}};
  doc["runs"][0]["ranks"][1]["step_ms"]["median"] = nullptr;
  doc["runs"][1]["ranks"][1]["resting"]["total"] = std::numeric_limits<std::int64_t>::max();  // the largest count
  doc["runs"].push_back({{"kind", "data_parallel"}, {"skipped", true}, {"strategy", "zero3"}, {"world", 8},
                         {"reason", "needs 8 ranks"}});
  json zb = doc["runs"][4];
  zb["skipped"] = false;
  zb["schedule"] = "zb-h1";
  zb["stages"] = json::array();
  doc["runs"].push_back(zb);
  EXPECT_EQ(refusal(doc), "");
  doc["runs"][1]["ranks"][0]["peak"].erase("total");
  EXPECT_EQ(refusal(doc), "'a.json': runs[1] (zero3 W=2 units=1): ranks[0].peak.total is missing; expected a byte "
                          "count");
}

// The QA cases: a run without a kind, or with no more than one, was listed as "only in
// base: data parallel".
TEST(CompareInput, RefusesARunWithoutItsKindOrName) {
  json doc = full_document();
  doc["runs"][0] = json::object();
  EXPECT_EQ(refusal(doc), "'a.json': runs[0]: kind is missing; expected \"data_parallel\" or \"pipeline\"");
  doc["runs"][0] = {{"kind", "tensor_parallel"}};
  EXPECT_EQ(refusal(doc), "'a.json': runs[0]: kind is \"tensor_parallel\", not \"data_parallel\" or \"pipeline\"");
  doc["runs"][0] = {{"kind", "data_parallel"}};
  EXPECT_EQ(refusal(doc), "'a.json': runs[0]: strategy is missing; expected a strategy name");
  doc["runs"][0] = {{"skipped", false}, {"strategy", "ddp"}};  // only a skipped record is passed over
  EXPECT_EQ(refusal(doc), "'a.json': runs[0]: kind is missing; expected \"data_parallel\" or \"pipeline\"");
  doc["runs"][0] = {{"kind", "pipeline"}, {"schedule", "gpipe"}, {"world", "two"}};
  EXPECT_EQ(refusal(doc), "'a.json': runs[0]: world is \"two\", not a positive integer");
  doc = full_document();
  doc["runs"][4].erase("model");
  EXPECT_EQ(refusal(doc), "'a.json': runs[4] (gpipe S=2 M=2 chunks=1): model is missing; expected an object "
                          "(layers, width, batch, ...)");
  doc = full_document();
  doc["runs"][6]["skipped"] = "yes";
  EXPECT_EQ(refusal(doc), "'a.json': runs[6]: skipped is \"yes\", not true or false");
}

TEST(CompareInput, RefusesARunOrRankThatIsNotAnObject) {
  json doc = full_document();
  doc["runs"].push_back(5);
  EXPECT_EQ(refusal(doc), "'a.json': runs[7] is 5, not a run (an object)");
  doc = full_document();
  doc["runs"][3]["ranks"] = "all of them";
  EXPECT_EQ(refusal(doc), "'a.json': runs[3] (ddp W=4): ranks is \"all of them\", not an array of rank "
                          "records");
  doc = full_document();
  doc["runs"][4]["stages"][1] = json::array({1, 2});
  EXPECT_EQ(refusal(doc), "'a.json': runs[4] (gpipe S=2 M=2 chunks=1): stages[1] is [1,2], not a stage record "
                          "(an object)");
  doc = full_document();
  doc["runs"][1]["ranks"][1]["peak"] = "high";
  EXPECT_EQ(refusal(doc), "'a.json': runs[1] (zero3 W=2 units=1): ranks[1].peak is \"high\", not an object");
}

// "x" was read as 0 and shown as a difference of minus the other file's bytes.
TEST(CompareInput, RefusesAByteCountOfTheWrongType) {
  json doc = full_document();
  doc["runs"][0]["ranks"][1]["resting"]["total"] = "x";
  EXPECT_EQ(refusal(doc), "'a.json': runs[0] (zero2 W=2 units=1): ranks[1].resting.total is \"x\", not a byte "
                          "count");
  doc = full_document();
  doc["runs"][4]["stages"][0]["saved"]["peak_live_tensors"] = true;
  EXPECT_EQ(refusal(doc), "'a.json': runs[4] (gpipe S=2 M=2 chunks=1): stages[0].saved.peak_live_tensors is true, "
                          "not a count");
  doc = full_document();
  doc["runs"][2]["ranks"][0]["rank"] = "zero";
  EXPECT_EQ(refusal(doc), "'a.json': runs[2] (zero3 W=2 units=all): ranks[0].rank is \"zero\", not a rank number");
  doc = full_document();
  doc["runs"][2]["ranks"][1]["step_ms"]["median"] = "fast";
  EXPECT_EQ(refusal(doc), "'a.json': runs[2] (zero3 W=2 units=all): ranks[1].step_ms.median is \"fast\", not a "
                          "time in ms (a number >= 0) or null");
}

// nlohmann keeps 2^70 (and 1.5) as a double, 2^63 as unsigned: a figure is read into
// int64, so 2^70 printed a difference of "--9,223,372,036,854,737,904".
TEST(CompareInput, RefusesADoubleOrTooLargeByteCount) {
  const std::string at = "'a.json': runs[3] (ddp W=4): ranks[2].peak.by_category.temp is ";
  json doc = full_document();
  json& temp = doc["runs"][3]["ranks"][2]["peak"]["by_category"]["temp"];
  temp = json::parse("1180591620717411303424");
  ASSERT_TRUE(temp.is_number_float());
  EXPECT_EQ(refusal(doc), at + "1.1805916207174113e+21, not a byte count (beyond 2^63 - 1)");
  temp = json::parse("9223372036854775808");
  ASSERT_TRUE(temp.is_number_unsigned());
  EXPECT_EQ(refusal(doc), at + "9223372036854775808, not a byte count (beyond 2^63 - 1)");
  temp = 1.5;
  EXPECT_EQ(refusal(doc), at + "1.5, not a byte count (not an integer)");
  temp = 2048.0;  // whole, but not written as a byte count is
  EXPECT_EQ(refusal(doc), at + "2048.0, not a byte count (not an integer)");
  temp = 2048;
  EXPECT_EQ(refusal(doc), "");
}

TEST(CompareInput, RefusesANegativeCount) {
  json doc = full_document();
  doc["runs"][5]["stages"][1]["peak"]["total"] = -19464;
  EXPECT_EQ(refusal(doc), "'a.json': runs[5] (gpipe S=2 M=2 chunks=1): stages[1].peak.total is -19464, not a byte "
                          "count (negative)");
  doc = full_document();
  doc["runs"][0]["ranks"][0]["comm_bytes"] = -0.5;
  EXPECT_EQ(refusal(doc), "'a.json': runs[0] (zero2 W=2 units=1): ranks[0].comm_bytes is -0.5, not a byte "
                          "count (negative)");
  doc = full_document();
  doc["runs"][0]["ranks"][0]["step_ms"]["median"] = -1.0;
  EXPECT_EQ(refusal(doc), "'a.json': runs[0] (zero2 W=2 units=1): ranks[0].step_ms.median is -1.0, not a time "
                          "in ms (a number >= 0) or null");
}

// Ranks are matched by number: one given twice would match whichever came last.
TEST(CompareInput, RefusesARankNumberGivenTwice) {
  json doc = full_document();
  doc["runs"][3]["ranks"][3]["rank"] = 1;
  EXPECT_EQ(refusal(doc), "'a.json': runs[3] (ddp W=4): ranks[3].rank is 1, not a rank number no other "
                          "record has");
}

// A figure one record lacks is refused where the file is read (CompareInput), never
// shown as 0 with a difference; a rank only one side has shows "-" on the other. A total
// that differs is named even where no category does.
TEST(Compare, ATotalThatDiffersAloneIsNamed) {
  const json base = testing::report_document();
  json fresh = testing::report_document();
  fresh["runs"][3]["ranks"][1]["resting"]["total"] = 20000;  // its categories still say 16,000
  const Comparison cmp = compared(base, "a", fresh, "b");
  const ComparedRun& ddp = cmp.runs[3];
  ASSERT_EQ(ddp.label, "ddp W=4");
  EXPECT_TRUE(ddp.ranks[0].differs.empty());
  EXPECT_EQ(ddp.ranks[1].differs, Labels({"resting +4,000 B"}));
  std::ostringstream os;
  print_comparison(cmp, os, TableOptions{true, true});  // --bytes exact --wide
  // Rank 1's row: label, rank, resting B (base), its difference, peak B (base).
  std::istringstream lines(os.str());
  std::string line;
  while (std::getline(lines, line) && line.rfind("  ddp W=4                 1 ", 0) != 0) {
  }
  std::istringstream words(line);
  std::vector<std::string> cell(6);
  for (std::string& c : cell) words >> c;
  EXPECT_EQ(cell, std::vector<std::string>({"ddp", "W=4", "1", "16,000", "+4,000", "28,288"})) << os.str();
}

// Emulated runs list the one rank each played: matched, with no rank to set side by side.
TEST(Compare, ARunWithNoRankInBothIsNamed) {
  json base = testing::report_document(), fresh = testing::report_document();
  base["runs"] = json::array({base["runs"][3]});
  fresh["runs"] = json::array({fresh["runs"][3]});
  json& kept = base["runs"][0]["ranks"];
  kept.erase(kept.begin() + 1, kept.end());  // rank 0
  fresh["runs"][0]["ranks"].erase(0);        // ranks 1 to 3
  std::ostringstream os;
  print_comparison(compared(base, "a", fresh, "b"), os);
  EXPECT_EQ(os.str().find("configuration  rank"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("\nno rank or stage is in both files\n\n  in both, no rank or stage in common: ddp W=4"
                          "\nconfigurations compared: 0;"),
            std::string::npos)
      << os.str();
}

// Labels name no model: two files of different models showed "only in base: ddp W=2
// " and "only in new: ddp W=2". A shared label gets the model.
TEST(Compare, LabelsNameTheModelWhereRunsDifferInIt) {
  const json base = testing::report_document();
  json fresh = testing::report_document();
  for (json& run : fresh["runs"])
    if (run.contains("model")) run["model"]["width"] = 64;
  const Comparison cmp = compared(base, "a", fresh, "b");
  EXPECT_TRUE(cmp.runs.empty());
  ASSERT_EQ(cmp.only_in_base.size(), 6u);
  EXPECT_EQ(cmp.only_in_base[0], "zero2 W=2 units=1, model 4x16 b8");
  ASSERT_EQ(cmp.only_in_new.size(), 6u);
  EXPECT_EQ(cmp.only_in_new[0], "zero2 W=2 units=1, model 4x64 b8");
  EXPECT_EQ(cmp.only_in_new[4], "gpipe S=2 M=2 chunks=1, model 2x64 b8");
  std::ostringstream os;
  print_comparison(cmp, os);
  // No header over an empty table: a line says why.
  EXPECT_EQ(os.str().find("configuration  rank"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("\nno configuration is in both files\n"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("only in new: zero3 W=2 units=all, model 4x64 b8\n"), std::string::npos) << os.str();

  // Models alike in shape are told apart by activation and loss; runs of one model
  // keep their plain label.
  fresh = testing::report_document();
  fresh["runs"][3]["model"]["activation"] = "relu";
  const Comparison one = compared(base, "a", fresh, "b");
  EXPECT_EQ(one.only_in_base, Labels({"ddp W=4, model 4x16 b8 none sum"}));
  EXPECT_EQ(one.only_in_new, Labels({"ddp W=4, model 4x16 b8 relu sum"}));
  ASSERT_FALSE(one.runs.empty());
  EXPECT_EQ(one.runs[0].label, "zero2 W=2 units=1");
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
  std::ofstream(dir_ + "/good.json") << full_document().dump();
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

// A document whose content is refused: exit 2, nothing printed, one line on stderr
// naming the file, the run and the field.
TEST_F(CompareCli, ARefusedDocumentIsOneLine) {
  json bad = full_document();
  bad["runs"][3]["ranks"][1]["peak"]["total"] = json::parse("1180591620717411303424");
  std::ofstream(dir_ + "/good.json") << full_document().dump();
  std::ofstream(dir_ + "/bad.json") << bad.dump();
  EXPECT_EQ(compare("good.json bad.json"), 2);
  EXPECT_EQ(line_, "shardscope: error: 'bad.json': runs[3] (ddp W=4): ranks[1].peak.total is "
                   "1.1805916207174113e+21, not a byte count (beyond 2^63 - 1)");
  EXPECT_EQ(testing::shell("test $(wc -l < '" + dir_ + "/err.txt') -eq 1 && test ! -s '" + dir_ + "/out.txt'"), 0);
}

// --fail-on-diff: exit 1 when any byte figure differs (for CI), 0 when none does.
TEST_F(CompareCli, FailOnDiffExitsOneWhenABytefigureDiffers) {
  const json doc = full_document();
  json changed = doc;
  changed["runs"][3]["ranks"][1]["peak"]["total"] = changed["runs"][3]["ranks"][1]["peak"]["total"].get<std::int64_t>() + 1;
  std::ofstream(dir_ + "/a.json") << doc.dump();
  std::ofstream(dir_ + "/b.json") << changed.dump();
  EXPECT_EQ(compare("--fail-on-diff a.json a.json"), 0) << line_;
  EXPECT_EQ(compare("--fail-on-diff a.json b.json"), 1) << line_;
  EXPECT_EQ(compare("a.json b.json --fail-on-diff"), 1) << line_;
  EXPECT_EQ(compare("a.json b.json"), 0) << line_;  // without the flag, a report
  EXPECT_EQ(compare("--bytes exact --wide a.json b.json"), 0) << line_;
  std::ifstream in(dir_ + "/out.txt");
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("ddp W=4                 1"), std::string::npos) << out;
  EXPECT_NE(out.find("peak +1 B"), std::string::npos) << out;
  EXPECT_EQ(compare("--bytes mib a.json a.json"), 2);
  EXPECT_EQ(line_, "shardscope: error: --bytes: unknown 'mib'; allowed: binary, exact");
  EXPECT_EQ(compare("--wide --wide a.json a.json"), 2);
  EXPECT_EQ(line_, "shardscope: error: --wide: given more than once; give it once");
}

// compare has no flag but --help: a misspelt one is named, not counted as a file.
TEST_F(CompareCli, AnUnknownFlagIsNamed) {
  std::ofstream(dir_ + "/good.json") << full_document().dump();
  EXPECT_EQ(compare("--foo good.json good.json"), 2);
  EXPECT_EQ(line_, "shardscope: error: compare: unknown flag '--foo' (shardscope compare --help)");
  EXPECT_EQ(compare("good.json good.json --json=x"), 2);
  EXPECT_EQ(line_, "shardscope: error: compare: unknown flag '--json=x' (shardscope compare --help)");
}

}  // namespace
}  // namespace shardscope
