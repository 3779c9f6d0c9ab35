// The text tables: key figures appear, multiples of 4P are right, differing ranks get
// their own rows, missing fields print "-". Most tests read the wide, exact tables
// (--wide --bytes exact: every column, every byte); the compact default is tested last.
#include <gtest/gtest.h>

#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "harness/report/html_report.hpp"
#include "harness/report/record_label.hpp"
#include "harness/report/table.hpp"
#include "harness/report/text_table.hpp"
#include "support/records_of.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

json seed_model() {
  return {{"layers", 8}, {"width", 256}, {"params", 526336}, {"param_tensors", 16},
          {"param_bytes", 2105344}, {"activation", "none"}, {"loss", "sum"}, {"batch", 32}};
}

json dp_rank(int rank, std::int64_t param, std::int64_t grad, std::int64_t optim, std::int64_t peak) {
  const std::int64_t total = param + grad + optim;
  return {{"rank", rank},
          {"resting", {{"total", total}, {"param", param}, {"param_unsharded", 0}, {"grad", grad},
                       {"grad_unsharded", 0}, {"optim", optim}, {"activation", 0}, {"comm", 0}, {"temp", 0}}},
          {"peak", {{"total", peak}, {"phase", "backward"}, {"where", "layer 7"}, {"by_category", {{"param", param}}}}},
          {"predicted", {{"resting_total", total}, {"peak_total", peak}, {"comm_bytes", 2105344}}},
          {"pool", nullptr},
          {"comm", {{"all_reduce", {{"calls", 1}, {"bytes", 2105344}, {"ms", 1.0}, {"busbw_gbps", 2.1}}},
                    {"broadcast", {{"calls", 0}, {"bytes", 0}, {"ms", 0.0}, {"busbw_gbps", 0.0}}}}},
          {"step_ms", {{"median", 12.5}, {"min", 12.0}}}};
}

json dp_run(const std::string& strategy, json ranks) {
  return {{"kind", "data_parallel"}, {"strategy", strategy}, {"world", 2}, {"units", 1},
          {"layers_per_unit", "all"}, {"prefetch", 1}, {"steps", 3}, {"timed_steps", 2},
          {"model", seed_model()}, {"ranks", std::move(ranks)}};
}

json document() {
  json ddp = dp_run("ddp", {dp_rank(0, 2105344, 2105344, 4210752, 10526720),
                            dp_rank(1, 2105344, 2105344, 4210752, 10526720)});
  // zero1 at W = 2 with an uneven partition: rank 1 owns less optimizer state.
  json zero1 = dp_run("zero1", {dp_rank(0, 2105344, 2105344, 2105376, 9000000),
                                dp_rank(1, 2105344, 2105344, 2105344, 9000000)});
  zero1["ranks"][1]["predicted"]["resting_total"] = 6316000;  // a wrong prediction: marked "!"
  json stage = {{"stage", 1}, {"rank", 1}, {"world", 2}, {"layers", {1, 1}},
                {"saved", {{"peak_live_tensors", 5}, {"peak_live_bytes", 384}, {"total_tensors", 40},
                           {"before_first_backward", 5}}},
                {"predicted", {{"peak_live_tensors", 5}, {"peak_live_bytes", 384}, {"peak_total", 23460}}},
                {"resting", {{"total", 21140}}}, {"peak", {{"total", 23456}}},
                {"busy_ms", 0.25}, {"step_ms", {{"median", 1.5}, {"min", 1.25}}},
                {"bubble_fraction", 0.125}, {"bubble_fraction_replayed", 0.1},
                {"bubble_fraction_theory", 1.0 / 9.0}};
  json pipe = {{"kind", "pipeline"}, {"schedule", "1f1b"}, {"world", 2}, {"microbatches", 8}, {"chunks", 1},
               {"model", {{"layers", 2}, {"width", 32}, {"params", 2112}, {"param_tensors", 4},
                          {"param_bytes", 8448}, {"activation", "relu"}, {"loss", "mse"}, {"batch", 8}}},
               {"stages", json::array({stage})}};
  json skipped = {{"kind", "pipeline"}, {"skipped", true}, {"schedule", "gpipe"}, {"world", 4},
                  {"microbatches", 2}, {"reason", "--layers 2 cannot fill 4 stages"}};
  return {{"schema", "shardscope/1"}, {"version", "0.1.0"}, {"backend", "cpu"}, {"comm", "mpi"},
          {"emulated", false}, {"runs", {ddp, zero1, pipe, skipped}}};
}

// --wide --bytes exact.
std::string render(const json& doc) {
  std::ostringstream os;
  print_tables(testing::records_of(doc), os, TableOptions{true, true});
  return os.str();
}

// The default: fits 120 columns.
std::string render_compact(const json& doc) {
  std::ostringstream os;
  print_tables(testing::records_of(doc), os);
  return os.str();
}

// The line of `text` containing `needle` ("" when none).
std::string line_with(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) return line;
  return {};
}

int count_lines_with(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
  return n;
}

// Every setting where not the default is in every label: the table's strategy cell, the
// run's label from its JSON and from its record (compare, report), the report's
// captions; the seed's settings add nothing.
TEST(Table, EnginePrecisionCheckpointAndAccumulationInEveryLabel) {
  json doc = document();
  json& run = doc["runs"][0];
  run["strategy"] = "zero3";
  run["engine"] = "fsdp2";
  run["precision"] = "bf16";
  run["model"]["checkpoint"] = "every:2";
  run["accumulate"] = 4;
  run["no_sync"] = true;
  const std::string settings = " engine=fsdp2 precision=bf16 checkpoint=every:2 accumulate=4 no_sync";
  const std::string name = run["strategy"].get<std::string>();
  EXPECT_NE(render(doc).find(name + settings), std::string::npos) << render(doc);
  EXPECT_NE(run_label(run).find(settings), std::string::npos) << run_label(run);
  const ResultDocument records = testing::records_of(doc);
  EXPECT_NE(run_label(records.runs[0]).find(settings), std::string::npos) << run_label(records.runs[0]);
  EXPECT_EQ(run_label(records.runs[0]), run_label(run));
  EXPECT_NE(render_html_report(records, "shardscope sweep").find(settings), std::string::npos);
  // The default settings: none of them.
  const json plain = document();
  for (const char* word : {"engine=", "precision=", "checkpoint=", "accumulate=", "no_sync"})
    EXPECT_EQ(render(plain).find(word), std::string::npos) << word;
}

TEST(Table, HeaderNamesModelBackendAndComm) {
  const std::string out = render(document());
  EXPECT_NE(out.find("8 x 256, activation none, loss sum, batch 32/rank, P = 526,336 params, "
                     "4P = 2,105,344 B"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("backend cpu, comm mpi"), std::string::npos);
  EXPECT_EQ(out.find("emulated"), std::string::npos);
  EXPECT_NE(out.find("× 4P"), std::string::npos);
}

TEST(Table, DdpRestsAtFourTimesTheWeightsOnOneRow) {
  const std::string out = render(document());
  const std::string ddp = line_with(out, "ddp ");
  ASSERT_FALSE(ddp.empty()) << out;
  EXPECT_NE(ddp.find("8,421,440"), std::string::npos) << ddp;
  EXPECT_NE(ddp.find("4.000"), std::string::npos) << ddp;
  EXPECT_NE(ddp.find("all ranks"), std::string::npos) << ddp;
  EXPECT_NE(ddp.find("4,210,752"), std::string::npos) << ddp;
  EXPECT_EQ(ddp.find('!'), std::string::npos) << ddp;
  // Identical ranks: one row in each of the four data-parallel tables.
  EXPECT_EQ(count_lines_with(out, "ddp "), 4) << out;
}

TEST(Table, DifferingRanksGetTheirOwnRows) {
  const std::string out = render(document());
  EXPECT_EQ(count_lines_with(out, "zero1"), 8) << out;  // 2 ranks x 4 tables
  const std::string r0 = line_with(out, "rank 0");
  const std::string r1 = line_with(out, "rank 1");
  EXPECT_NE(r0.find("6,316,064"), std::string::npos) << r0;
  EXPECT_NE(r0.find("3.000"), std::string::npos) << r0;  // 6,316,064 / 2,105,344
  EXPECT_NE(r1.find("6,316,032"), std::string::npos) << r1;
  EXPECT_NE(r1.find("6,316,000 !"), std::string::npos) << r1;  // mismatched prediction
  EXPECT_EQ(line_with(out, "zero1").find("all ranks"), std::string::npos);
}

// What was live at the peak, per category, beside its prediction: only categories live
// somewhere; a figure that differs is followed by "! predicted".
TEST(Table, LiveAtThePeakByCategory) {
  json doc = document();
  for (json& run : doc["runs"]) {
    if (run.value("kind", "") != "data_parallel") continue;
    for (json& rank : run["ranks"]) {
      rank["peak"]["by_category"] = {{"param", 2105344}, {"grad", 2105344}, {"activation", 262144}, {"temp", 65536}};
      rank["predicted"]["peak_by_category"] = rank["peak"]["by_category"];
    }
  }
  doc["runs"][1]["ranks"][1]["predicted"]["peak_by_category"]["temp"] = 32768;
  const std::string out = render(doc);
  const std::string title = line_with(out, "live at the peak");
  ASSERT_FALSE(title.empty()) << out;
  const std::string header = line_with(out.substr(out.find(title)), "strategy");
  EXPECT_NE(header.find("activation"), std::string::npos) << header;
  EXPECT_EQ(header.find("param_unsharded"), std::string::npos) << header;  // zero everywhere
  EXPECT_EQ(header.find("optim"), std::string::npos) << header;
  const std::string after = out.substr(out.find(title));
  EXPECT_NE(line_with(after, "all ranks").find("262,144"), std::string::npos) << after;  // ddp
  EXPECT_EQ(line_with(after, "all ranks").find('!'), std::string::npos) << after;
  EXPECT_NE(line_with(after, "rank 1").find("65,536 ! 32,768"), std::string::npos) << after;
  EXPECT_EQ(line_with(after, "rank 0").find('!'), std::string::npos) << after;
}

// A stage's point-to-point bytes per step beside their prediction.
TEST(Table, PipelineP2pBytesBesideTheirPrediction) {
  json doc = document();
  json& stage = doc["runs"][2]["stages"][0];
  stage["comm_bytes"] = 2048;
  stage["predicted"]["comm_bytes"] = 2048;
  const std::string row = line_with(render(doc), "1f1b");  // p2p B/step is its last column
  EXPECT_EQ(row.substr(row.size() - 6), " 2,048") << render(doc);
  stage["predicted"]["comm_bytes"] = 1024;
  EXPECT_NE(line_with(render(doc), "1f1b").find("2,048 ! 1,024"), std::string::npos) << render(doc);
}

// The line of the time table (the one after "time per step") holding `needle`.
std::string time_row(const std::string& out, const std::string& needle) {
  const std::size_t at = out.find("time per step");
  return at == std::string::npos ? "" : line_with(out.substr(at), needle);
}

TEST(Table, PeakCommunicationAndTime) {
  const std::string out = render(document());
  const std::string peak = line_with(out, "10,526,720");
  ASSERT_FALSE(peak.empty()) << out;
  EXPECT_NE(peak.find("5.000"), std::string::npos) << peak;  // 10,526,720 / 2,105,344
  EXPECT_NE(peak.find("backward"), std::string::npos);
  EXPECT_NE(peak.find("layer 7"), std::string::npos);
  EXPECT_NE(peak.find("2,105,344"), std::string::npos);  // communication per step
  const std::string time = time_row(out, "ddp ");
  ASSERT_FALSE(time.empty()) << out;
  EXPECT_NE(time.find("all_reduce"), std::string::npos) << time;
  EXPECT_NE(time.find("2.10"), std::string::npos);
  // min, median and max of the step: max from step_ms_all when the record has no max.
  EXPECT_NE(time.find("12.000  12.500    -"), std::string::npos) << time;
  json doc = document();
  for (json& rank : doc["runs"][0]["ranks"]) rank["step_ms_all"] = {99.0, 12.0, 12.5, 13.75};
  EXPECT_NE(time_row(render(doc), "ddp ").find("12.000  12.500  13.750"), std::string::npos) << render(doc);
  doc["runs"][0]["ranks"][0]["step_ms"]["max"] = 14.25;
  doc["runs"][0]["ranks"][1]["step_ms"]["max"] = 14.25;
  EXPECT_NE(time_row(render(doc), "ddp ").find("12.000  12.500  14.250"), std::string::npos) << render(doc);
  EXPECT_NE(out.find("over 2 timed steps"), std::string::npos) << out;
}

TEST(Table, ARowForAllRanksShowsTheSlowestRanksTime) {
  json ddp = dp_run("ddp", {dp_rank(0, 2105344, 2105344, 4210752, 10526720),
                            dp_rank(1, 2105344, 2105344, 4210752, 10526720)});
  ddp["ranks"][1]["step_ms"]["median"] = 31.25;  // same bytes, slower
  ddp["ranks"][1]["comm"]["all_reduce"]["busbw_gbps"] = 0.75;
  json doc = document();
  doc["runs"] = json::array({ddp});
  const std::string time = time_row(render(doc), "ddp ");
  ASSERT_NE(time.find("all ranks"), std::string::npos) << time;
  EXPECT_NE(time.find("31.250"), std::string::npos) << time;
  EXPECT_NE(time.find("0.75"), std::string::npos) << time;
  EXPECT_EQ(time.find("12.500"), std::string::npos) << time;
}

TEST(Table, PipelineStageRowAndSkipped) {
  const std::string out = render(document());
  EXPECT_NE(out.find("pipeline, S = 2 stages: 2 x 32, activation relu, loss mse, batch 8,"), std::string::npos)
      << out;
  const std::string stage = line_with(out, "5 / 40 / 5");
  ASSERT_FALSE(stage.empty()) << out;
  EXPECT_EQ(stage.rfind("  1f1b", 0), 0u) << stage;
  EXPECT_NE(stage.find(" 1-1 "), std::string::npos) << stage;
  EXPECT_NE(stage.find("384"), std::string::npos);
  EXPECT_NE(stage.find("5 / 384"), std::string::npos);
  const std::string times = line_with(out.substr(out.find("bubble: wall")), "1f1b");
  EXPECT_NE(times.find("12.5% / 10.0% / 11.1%"), std::string::npos) << out;
  EXPECT_NE(times.find("0.250         1.250   1.500    -"), std::string::npos) << out;
  EXPECT_NE(stage.find("21,140"), std::string::npos);
  const std::size_t measured = stage.find("23,456"), predicted = stage.find("23,460 !");  // a wrong prediction
  ASSERT_NE(predicted, std::string::npos) << stage;
  EXPECT_LT(measured, predicted) << stage;
  EXPECT_NE(out.find("gpipe S=4 M=2: --layers 2 cannot fill 4 stages"), std::string::npos) << out;
}

// A figure the record holds as null (no step timed) prints "-", and so does every figure
// of a run that reported no rank.
TEST(Table, MissingFiguresPrintDashesAndEmulatedIsSaid) {
  json doc = {{"schema", "shardscope/1"}, {"backend", "cpu"}, {"comm", "fake"}, {"emulated", true},
              {"runs", {{{"kind", "data_parallel"}, {"strategy", "zero3"}, {"world", 4}, {"units", 8}, {"model", seed_model()},
                         {"ranks", {{{"rank", 2}, {"resting", {{"total", 100}}},
                                     {"comm", {{"all_gather", {{"bytes", 64}, {"busbw_gbps", 7702.48}}}}}}}}}}}};
  const std::string out = render(doc);
  EXPECT_NE(out.find("emulated (times are compute only)"), std::string::npos) << out;
  const std::string row = line_with(out, "zero3");
  EXPECT_NE(row.find("rank 2"), std::string::npos) << out;  // one emulated rank of four
  EXPECT_NE(row.find("100"), std::string::npos);
  const std::string time_row = line_with(out, "all_gather");
  EXPECT_NE(time_row.find("zero3"), std::string::npos) << out;
  EXPECT_EQ(time_row.substr(time_row.size() - 24), "          -       -    -") << out;  // untimed
  EXPECT_EQ(out.find("7702"), std::string::npos) << "an emulated collective has no bandwidth";
  doc["runs"][0]["ranks"] = json::array();
  const std::string none = render(doc);
  std::istringstream words(line_with(none, "zero3"));
  std::vector<std::string> cells;
  for (std::string w; words >> w;) cells.push_back(w);
  ASSERT_EQ(cells.size(), 10u) << none;  // strategy, units, prefetch, rank, 6 figures
  for (std::size_t i = 3; i < cells.size(); ++i) EXPECT_EQ(cells[i], "-") << none;
  EXPECT_EQ(render(json::object()), "(no runs)\n");
}

// The default tables fit 120 columns: binary units, "=" for a prediction equal to its
// figure and the prediction with " !" where it differs, settings every row shares said
// once above the table; --wide brings the columns back.
TEST(Table, CompactTablesFit120Columns) {
  json doc = document();
  doc["runs"].push_back(dp_run("zero3", {dp_rank(0, 526336, 526336, 1052676, 5327904),
                                         dp_rank(1, 526336, 526336, 1052676, 5327904)}));
  doc["runs"].back()["layers_per_unit"] = 1;
  doc["runs"][0]["ddp_bucket"] = doc["runs"][1]["ddp_bucket"] = "view";
  const std::string out = render_compact(doc);
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(display_width(line), 120u) << line;
  const std::string ddp = line_with(out, "ddp ");
  EXPECT_NE(ddp.find("8.03 MiB"), std::string::npos) << ddp;  // 8,421,440 B
  EXPECT_NE(ddp.find("4.02 MiB"), std::string::npos) << ddp;  // optim 4,210,752 B
  EXPECT_EQ(ddp.find("8,421,440"), std::string::npos) << ddp;
  EXPECT_EQ(ddp.substr(ddp.find_last_not_of(' ')), "=") << ddp;  // the prediction equals it
  EXPECT_NE(line_with(out, "rank 1").find("6.02 MiB !"), std::string::npos) << out;  // 6,316,000: differs
  const std::string zero3 = line_with(out, "zero3 ");
  EXPECT_EQ(zero3.rfind("  zero3     1      all ranks", 0), 0u) << zero3;  // units as --units takes them
  EXPECT_NE(out.find("prefetch 1 (zero2, zero3); DDP bucket view (ddp, zero1)"), std::string::npos) << out;
  // DeepSpeed's ddp (stage 0) buckets as its engine does: DDP's bucket setting is not said of it.
  json ds = document();
  ds["runs"].push_back(dp_run("ddp", {dp_rank(0, 526336, 526336, 1052676, 5327904)}));
  ds["runs"][0]["ddp_bucket"] = "view";
  ds["runs"][0]["engine"] = "deepspeed";
  EXPECT_EQ(render_compact(ds).find("DDP bucket"), std::string::npos) << render_compact(ds);
  EXPECT_EQ(line_with(out, "strategy").find("prefetch"), std::string::npos) << out;
  EXPECT_NE(out.find("Bytes: binary units (1 KiB = 1024 B)"), std::string::npos) << out;
  EXPECT_NE(out.find("4P = 2.01 MiB"), std::string::npos) << out;
  // The pipeline: chunks and rank said once, the step's spread in the time table.
  EXPECT_NE(out.find("chunks 1; stage s runs on rank s"), std::string::npos) << out;
  const std::string stage = line_with(out, "5 / 40 / 5");
  EXPECT_NE(stage.find("  384 B  "), std::string::npos) << stage;
  // 23,456 measured and 23,460 predicted both read 22.9 KiB: the mark tells them apart.
  EXPECT_NE(stage.find("22.9 KiB  22.9 KiB !"), std::string::npos) << stage;
  // --bytes exact alone: exact bytes, still compact.
  std::ostringstream exact;
  print_tables(testing::records_of(doc), exact, TableOptions{true, false});
  EXPECT_NE(line_with(exact.str(), "ddp ").find("8,421,440"), std::string::npos) << exact.str();
  EXPECT_EQ(line_with(exact.str(), "strategy").find("prefetch"), std::string::npos) << exact.str();
  // --wide: the prefetch and bucket columns, and the predictions in full.
  const std::string wide = render(doc);
  EXPECT_NE(line_with(wide, "strategy").find("prefetch"), std::string::npos) << wide;
  const std::string wide_ddp = line_with(wide, "ddp ");
  EXPECT_EQ(wide_ddp.substr(wide_ddp.size() - 9), "8,421,440") << wide;
}

// Ranks that outnumber the host's cores wait for one: a line says so above the times.
TEST(Table, RanksBeyondTheCoresAreSaidAboveTheTimes) {
  json doc = document();
  doc["provenance"] = {{"cores", 2}};
  EXPECT_EQ(render_compact(doc).find("ranks share"), std::string::npos);  // W = 2 on 2 cores
  for (json& run : doc["runs"]) run["world"] = 4;
  const std::string out = render_compact(doc);
  const std::size_t note = out.find("4 ranks share 2 cores here");
  ASSERT_NE(note, std::string::npos) << out;
  EXPECT_LT(out.find("time per step"), note);
  EXPECT_LT(note, out.find("main collective  busbw")) << out;
  doc["emulated"] = true;  // emulated ranks run one at a time
  EXPECT_EQ(render_compact(doc).find("ranks share"), std::string::npos);
}

TEST(Cells, BinaryBytesHaveThreeSignificantFigures) {
  EXPECT_EQ(cells::binary_bytes(0), "0 B");
  EXPECT_EQ(cells::binary_bytes(512), "512 B");
  EXPECT_EQ(cells::binary_bytes(1023), "1023 B");
  EXPECT_EQ(cells::binary_bytes(1024), "1.00 KiB");
  EXPECT_EQ(cells::binary_bytes(2105344), "2.01 MiB");
  EXPECT_EQ(cells::binary_bytes(16904), "16.5 KiB");
  EXPECT_EQ(cells::binary_bytes(353452160), "337 MiB");
  EXPECT_EQ(cells::binary_bytes(4448092164), "4.14 GiB");
  EXPECT_EQ(cells::binary_bytes(1000 * 1024), "0.977 MiB");  // not "1000 KiB": four figures
  EXPECT_EQ(cells::binary_bytes(-2048), "-2.00 KiB");
  EXPECT_EQ(cells::binary_bytes(std::numeric_limits<std::int64_t>::min()), "-8.00 EiB");
}

TEST(TextTable, AlignsColumnsByCodePoints) {
  TextTable t({"name", "× 4P"}, {Align::left, Align::right});
  t.add_row({"ddp", "4.000"});
  t.add_row({"zero3", "1.000"});
  std::ostringstream os;
  t.print(os, 0);
  EXPECT_EQ(os.str(), "name    × 4P\n-----  -----\nddp    4.000\nzero3  1.000\n");
  EXPECT_EQ(display_width("× 4P"), 4u);
}

}  // namespace
}  // namespace shardscope
