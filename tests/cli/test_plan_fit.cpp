// `shardscope plan --fit batch|seq`, through the real command line: the value it fits
// plans as fitting --memory, and one more does not, for the MLP under ddp, zero3 and
// pipelines and GPT-2 under ddp and zero3; what bounds it other than memory, and its
// refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/shell.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
using testing::env;
using testing::first_line;
using testing::shell;

class PlanFit : public testing::BinaryTest {
 protected:
  // `shardscope plan <flags> --json p.json` in dir_: the exit code; stdout in out_,
  // stderr's first line in line_, the document in doc_ (when written).
  int plan(const std::string& flags) {
    std::filesystem::remove(dir_ + "/p.json");
    const int rc = shell("cd '" + dir_ + "' && timeout 120 '" + bin_ + "' plan " + flags +
                         " --json p.json > out.txt 2> err.txt");
    std::ifstream in(dir_ + "/out.txt");
    out_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    line_ = first_line(dir_ + "/err.txt");
    doc_ = json();
    if (std::filesystem::exists(dir_ + "/p.json")) {
      std::ifstream j(dir_ + "/p.json");
      doc_ = json::parse(j);
    }
    return rc;
  }
  std::string hf(const std::string& name) { return env("SHARDSCOPE_TEST_DATA_DIR") + "/hf/" + name; }
  std::string out_, line_;
  json doc_;
};

// The highest predicted peak of a plan's one configuration, and whose it is.
std::pair<std::int64_t, int> highest_peak(const json& p) {
  std::int64_t peak = -1;
  int who = -1;
  if (p["kind"] == "pipeline") {
    for (const json& s : p["stages"])
      if (s["predicted"]["peak_total"].get<std::int64_t>() > peak)
        std::tie(peak, who) = std::make_pair(s["predicted"]["peak_total"].get<std::int64_t>(), s["stage"].get<int>());
  } else {
    for (const json& g : p["rank_groups"])
      if (g["predicted"]["peak_total"].get<std::int64_t>() > peak)
        std::tie(peak, who) = std::make_pair(g["predicted"]["peak_total"].get<std::int64_t>(), g["first"].get<int>());
  }
  return {peak, who};
}

// The "done when": the value --fit gives plans as fitting, and one more does not;
// the fit's peaks are the plans' at those values, its limiting rank (stage) the one over.
TEST_F(PlanFit, TheFittedValuePlansAsFittingAndOneMoreDoesNot) {
  const std::string gpt2 = "--hf-config '" + hf("gpt2.json") + "' ";
  const struct {
    std::string flags, memory, dimension;
  } cases[] = {
      {"--strategies ddp --worlds 2", "64MiB", "batch"},
      {"--strategies zero3 --worlds 4 --units 1 --activation relu --loss mse", "48MiB", "batch"},
      {"--strategies zero1 --worlds 3 --layers 2 --width 8", "100KiB", "batch"},
      {"--schedules 1f1b --worlds 4 --microbatches 4", "24MiB", "batch"},
      {"--schedules 1f1b --worlds 3 --microbatches 5 --layers 9 --width 64", "3MiB", "batch"},
      {"--schedules gpipe --worlds 2 --layers 4 --width 32", "1MiB", "batch"},
      {gpt2 + "--strategies ddp --worlds 2 --seq 256", "8GiB", "batch"},
      {gpt2 + "--strategies zero3 --worlds 4 --seq 128 --attention math", "6GB", "batch"},
      {gpt2 + "--strategies zero3 --worlds 2 --batch 16 --attention math", "6GiB", "seq"},
      {gpt2 + "--strategies ddp --worlds 2 --batch 8", "4GiB", "seq"},
  };
  for (const auto& c : cases) {
    const std::string flags = c.flags + " --memory " + c.memory;
    SCOPED_TRACE(flags + " --fit " + c.dimension);
    ASSERT_EQ(plan(flags + " --fit " + c.dimension), 0) << line_;
    ASSERT_EQ(doc_["plans"].size(), 1u);
    const json fit = doc_["plans"][0]["fit"];
    ASSERT_TRUE(fit.is_object()) << doc_["plans"][0].dump().substr(0, 300);
    EXPECT_EQ(fit["dimension"], c.dimension);
    EXPECT_EQ(fit["bound"], "memory") << fit["reason"];
    const std::int64_t b = fit["value"];
    const bool pipeline = doc_["plans"][0]["kind"] == "pipeline";
    EXPECT_GE(b, fit["smallest"].get<std::int64_t>());
    EXPECT_GT(b, 1) << "a memory that fits more than the smallest value exercises the search";
    const std::string limiting = pipeline ? "limiting_stage" : "limiting_rank";
    // At b every rank fits, and the fit's peak is the highest of the plan's.
    ASSERT_EQ(plan(flags + " --" + c.dimension + " " + std::to_string(b)), 0) << line_;
    EXPECT_EQ(doc_["plans"][0]["fits_every_rank"], true);
    EXPECT_EQ(highest_peak(doc_["plans"][0]).first, fit["peak_bytes"].get<std::int64_t>());
    // At b + 1 one does not: the fit's limiting rank, with the fit's next peak.
    ASSERT_EQ(plan(flags + " --" + c.dimension + " " + std::to_string(b + 1)), 0) << line_;
    EXPECT_EQ(doc_["plans"][0]["fits_every_rank"], false);
    const auto [next, who] = highest_peak(doc_["plans"][0]);
    EXPECT_EQ(next, fit["peak_bytes_next"].get<std::int64_t>());
    if (pipeline) EXPECT_EQ(who, fit[limiting].get<int>());
    else EXPECT_LE(who, fit[limiting].get<int>());  // its group's first rank
  }
}

// The table: a row per configuration within 120 columns, each answered, and what a
// pipeline's batch steps by.
TEST_F(PlanFit, TheTableSaysTheFitPerConfiguration) {
  ASSERT_EQ(plan("--strategies ddp,zero3 --schedules 1f1b --worlds 2,4 --memory 64MiB --fit batch --bytes exact"), 0)
      << line_;
  std::istringstream lines(out_);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 120u) << line;
  EXPECT_NE(out_.find("largest batch (per rank; per pipeline for a pipeline) at which every rank's peak fits 64.00 MiB:"),
            std::string::npos)
      << out_;
  EXPECT_NE(out_.find("peak at it  peak at batch + 1  limiting  bound"), std::string::npos) << out_;
  EXPECT_NE(out_.find("every batch from M up runs"), std::string::npos) << out_;
  int rows = 0;
  for (const json& p : doc_["plans"]) {
    ASSERT_TRUE(p["fit"].is_object());
    const std::string value = std::to_string(p["fit"]["value"].get<std::int64_t>());
    std::string grouped;  // "1,234"
    for (std::size_t i = 0; i < value.size(); ++i)
      grouped += (i > 0 && (value.size() - i) % 3 == 0 ? "," : "") + value.substr(i, 1);
    const std::string name = p["kind"] == "pipeline" ? "1f1b M=" + std::to_string(p["microbatches"].get<int>())
                                                     : p["strategy"].get<std::string>();
    const std::string world = (p["kind"] == "pipeline" ? "S=" : "W=") + std::to_string(p["world"].get<int>());
    std::istringstream again(out_);
    for (std::string line; std::getline(again, line);)
      rows += line.rfind("  " + name, 0) == 0 && line.find(world) != std::string::npos &&
              line.find(" " + grouped + " ") != std::string::npos && line.find(" memory") != std::string::npos;
  }
  EXPECT_EQ(rows, 6) << out_;
  // Without --fit the records have no fit (and are written as before: Records.ThePlanIsWrittenAsBefore).
  ASSERT_EQ(plan("--strategies ddp --worlds 2 --memory 64MiB"), 0) << line_;
  EXPECT_FALSE(doc_["plans"][0].contains("fit"));
  EXPECT_EQ(out_.find("largest batch"), std::string::npos);
}

// What ends the search when memory does not: GPT-2's learned positions, the largest
// --batch accepted; and when nothing fits, why: the model states at rest, or the peak at
// the smallest value (a pipeline's: one row per micro-batch). Each bound is real: one
// more is refused, or plans as not fitting.
TEST_F(PlanFit, BoundsOtherThanMemoryAndNothingFitting) {
  const std::string gpt2 = "--hf-config '" + hf("gpt2.json") + "' --strategies zero3 --worlds 2 ";
  ASSERT_EQ(plan(gpt2 + "--memory 80GiB --fit seq"), 0) << line_;
  json fit = doc_["plans"][0]["fit"];
  EXPECT_EQ(fit["value"], 1024);
  EXPECT_EQ(fit["bound"], "positions");
  EXPECT_TRUE(fit["peak_bytes_next"].is_null());
  EXPECT_NE(fit["reason"].get<std::string>().find("the model's 1,024 positions"), std::string::npos) << fit["reason"];
  EXPECT_NE(out_.find("bounded by the model's 1,024 positions"), std::string::npos) << out_;
  EXPECT_EQ(plan(gpt2 + "--memory 80GiB --seq 1025"), 2);
  EXPECT_NE(line_.find("--seq 1025 is above the model's positions"), std::string::npos) << line_;

  ASSERT_EQ(plan("--strategies ddp --worlds 2 --layers 1 --width 4 --memory 1TiB --fit batch"), 0) << line_;
  fit = doc_["plans"][0]["fit"];
  EXPECT_EQ(fit["value"], 10'000'000);
  EXPECT_EQ(fit["bound"], "largest_accepted");
  EXPECT_NE(out_.find("bounded by the largest --batch accepted, 10,000,000, not by memory"), std::string::npos) << out_;
  EXPECT_EQ(plan("--strategies ddp --worlds 2 --layers 1 --width 4 --memory 1TiB --batch 10000001"), 2);

  // ddp of the seed's model rests at 8,421,440 B.
  ASSERT_EQ(plan("--strategies ddp --worlds 2 --memory 8421439 --fit batch"), 0) << line_;
  fit = doc_["plans"][0]["fit"];
  EXPECT_TRUE(fit["value"].is_null());
  EXPECT_EQ(fit["bound"], "model_states");
  EXPECT_EQ(fit["resting_bytes"], 8'421'440);
  EXPECT_NE(out_.find("the model states alone take 8,421,440 B (8.03 MiB) at rest"), std::string::npos) << out_;
  ASSERT_EQ(plan("--strategies ddp --worlds 2 --memory 8421440 --fit batch"), 0) << line_;
  fit = doc_["plans"][0]["fit"];
  EXPECT_TRUE(fit["value"].is_null());
  EXPECT_EQ(fit["bound"], "peak");
  EXPECT_NE(out_.find("even at batch 1 the peak of rank 0 is"), std::string::npos) << out_;
  const std::int64_t at_one = fit["peak_bytes_next"];
  ASSERT_EQ(plan("--strategies ddp --worlds 2 --memory 8421440 --batch 1"), 0) << line_;
  EXPECT_EQ(doc_["plans"][0]["fits_every_rank"], false);
  EXPECT_EQ(highest_peak(doc_["plans"][0]).first, at_one);

  // A pipeline's smallest batch is M, a row per micro-batch (stage 0 of the seed's model
  // rests at 4,210,720 B).
  ASSERT_EQ(plan("--schedules 1f1b --worlds 2 --microbatches 3 --memory 4210720 --fit batch"), 0) << line_;
  fit = doc_["plans"][0]["fit"];
  EXPECT_EQ(fit["smallest"], 3);
  EXPECT_EQ(fit["bound"], "peak");
  EXPECT_NE(out_.find("even at batch 3 (one row per micro-batch) the peak of stage"), std::string::npos) << out_;
}

// Llama-3-8B at W = 8 under zero3 and 80 GiB (the question, answered in
// milliseconds): at 8,192 tokens not even one sequence fits (the peak at batch 1, as a
// plan at batch 1 says); at 1,024 tokens a batch does, and by seq at one sequence.
TEST_F(PlanFit, Llama3AtWorld8AnswersTheFittingQuestion) {
  const std::string llama = "--hf-config '" + hf("llama-3-8b.json") + "' --worlds 8 --strategies zero3 --memory 80GiB ";
  ASSERT_EQ(plan(llama + "--seq 8192 --fit batch"), 0) << line_;
  json fit = doc_["plans"][0]["fit"];
  ASSERT_FALSE(doc_["plans"][0]["rank_groups"][0]["predicted"]["peak_total"].is_null()) << "Llama's peak has its forms";
  EXPECT_EQ(fit["bound"], "peak");
  EXPECT_TRUE(fit["value"].is_null());
  EXPECT_NE(out_.find("even at batch 1 the peak of rank 0 is"), std::string::npos) << out_;
  const std::int64_t at_one = fit["peak_bytes_next"];
  ASSERT_EQ(plan(llama + "--seq 8192 --batch 1"), 0) << line_;
  EXPECT_EQ(doc_["plans"][0]["fits_every_rank"], false);
  EXPECT_EQ(highest_peak(doc_["plans"][0]).first, at_one);
  for (const std::string dimension : {"batch", "seq"}) {
    const std::string flags = llama + (dimension == "batch" ? "--seq 1024" : "--batch 1");
    SCOPED_TRACE(flags + " --fit " + dimension);
    ASSERT_EQ(plan(flags + " --fit " + dimension), 0) << line_;
    fit = doc_["plans"][0]["fit"];
    ASSERT_EQ(fit["bound"], "memory") << fit["reason"];
    const std::int64_t b = fit["value"];
    ASSERT_EQ(plan(flags + " --" + dimension + " " + std::to_string(b)), 0) << line_;
    EXPECT_EQ(doc_["plans"][0]["fits_every_rank"], true);
    EXPECT_EQ(highest_peak(doc_["plans"][0]).first, fit["peak_bytes"].get<std::int64_t>());
    ASSERT_EQ(plan(flags + " --" + dimension + " " + std::to_string(b + 1)), 0) << line_;
    EXPECT_EQ(doc_["plans"][0]["fits_every_rank"], false);
    EXPECT_EQ(highest_peak(doc_["plans"][0]).first, fit["peak_bytes_next"].get<std::int64_t>());
  }
}

// The question under DeepSpeed's stage 3 with every block checkpointed (Llama-3-8B,
// 8,192 tokens, W = 8, 80 GiB), fp32 and the bf16: its peak has closed forms
// (deepspeed_stage3_transformer_forms, the re-run's gathers and kept storages, measured equal
// on emulated ranks), so --fit batch answers, and planning that batch fits while one more
// does not.
TEST_F(PlanFit, Llama3UnderDeepSpeedStageThreeCheckpointedAnswersTheFit) {
  for (const char* precision : {"fp32", "bf16"}) {
    const std::string flags = "--hf-config '" + hf("llama-3-8b.json") + "' --engine deepspeed --precision " +
                              precision + " --checkpoint full --seq 8192 --worlds 8 --strategies zero3 " +
                              "--memory 80GiB ";
    SCOPED_TRACE(flags);
    ASSERT_EQ(plan(flags + "--fit batch"), 0) << line_;
    const json fit = doc_["plans"][0]["fit"];
    ASSERT_EQ(fit["bound"], "memory") << fit["reason"];
    const std::int64_t b = fit["value"];
    EXPECT_GT(b, 1);
    ASSERT_EQ(plan(flags + "--batch " + std::to_string(b)), 0) << line_;
    EXPECT_EQ(doc_["plans"][0]["fits_every_rank"], true);
    EXPECT_EQ(highest_peak(doc_["plans"][0]).first, fit["peak_bytes"].get<std::int64_t>());
    ASSERT_EQ(plan(flags + "--batch " + std::to_string(b + 1)), 0) << line_;
    EXPECT_EQ(doc_["plans"][0]["fits_every_rank"], false);
    EXPECT_EQ(highest_peak(doc_["plans"][0]).first, fit["peak_bytes_next"].get<std::int64_t>());
  }
}

TEST_F(PlanFit, RefusalsNameTheFlag) {
  const struct {
    const char* flags;
    const char* line;
  } cases[] = {
      {"--fit batch",
       "shardscope: error: --fit batch needs --memory SIZE: the size every rank's peak must fit in (e.g. --memory 80GiB)"},
      {"--fit seq --memory 1GiB", "shardscope: error: --fit seq: the MLP has no sequence length; --fit batch fits its rows per rank"},
      {"--fit rows --memory 1GiB", "shardscope: error: --fit: unknown 'rows'; allowed: batch, seq"},
      {"--fit batch --fit seq --memory 1GiB", "shardscope: error: --fit: given twice; give it once"},
      {"--memory 1GiB --fit", "shardscope: error: --fit: needs a value"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(plan(c.flags), 2) << c.flags;
    EXPECT_EQ(line_, c.line) << c.flags;
    EXPECT_TRUE(out_.empty()) << c.flags;
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/p.json")) << c.flags;
  }
}

}  // namespace
}  // namespace shardscope
