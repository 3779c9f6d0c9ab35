// The CSV files: one row per rank x category (data parallel) and per stage (pipeline),
// the documented columns in order, figures as the JSON has them, RFC 4180 quoting.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/report/csv.hpp"
#include "shardscope/check.hpp"
#include "support/records_of.hpp"
#include "support/report_doc.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
using Rows = std::vector<std::vector<std::string>>;

// An RFC 4180 reader: CRLF records, quoted fields with doubled quotes. Fails the test on
// a bare LF or CR outside quotes, or on text after a closing quote.
Rows parse_csv(const std::string& text) {
  Rows rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, was_quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else if (c == '"') quoted = false;
      else field += c;
      continue;
    }
    if (c == '"') {
      EXPECT_TRUE(field.empty() && !was_quoted) << "quote inside a field at " << i;
      quoted = was_quoted = true;
    } else if (c == ',') {
      row.push_back(field), field.clear(), was_quoted = false;
    } else if (c == '\r') {
      EXPECT_TRUE(i + 1 < text.size() && text[i + 1] == '\n') << "bare CR at " << i;
      row.push_back(field), field.clear(), was_quoted = false;
      rows.push_back(row), row.clear();
      ++i;
    } else {
      EXPECT_NE(c, '\n') << "bare LF at " << i;
      EXPECT_FALSE(was_quoted) << "text after a closing quote at " << i;
      field += c;
    }
  }
  EXPECT_FALSE(quoted) << "unterminated quote";
  EXPECT_TRUE(field.empty() && row.empty()) << "the last record lacks its CRLF";
  return rows;
}

const std::vector<std::string> kDpHeader = {
    "world", "strategy", "units", "prefetch", "ddp_bucket", "rank", "category", "resting_bytes",
    "peak_bytes_at_peak", "predicted_resting_bytes", "peak_total", "peak_phase", "peak_where",
    "comm_bytes_per_step", "step_ms_median", "predicted_peak_bytes_at_peak", "comm_ms_median", "engine",
    "precision", "checkpoint", "accumulate", "no_sync"};
const std::vector<std::string> kPpHeader = {
    "schedule", "stages", "microbatches", "chunks", "stage", "layers", "saved_peak_live_tensors",
    "saved_peak_live_bytes", "saved_total", "saved_before_first_backward", "predicted_peak_live_tensors",
    "predicted_peak_live_bytes", "resting_total", "peak_total", "busy_ms", "step_ms_median", "bubble_wall",
    "bubble_replayed", "bubble_theory", "predicted_resting_total", "predicted_peak_total", "p2p_bytes_per_step",
    "predicted_p2p_bytes_per_step", "precision"};

TEST(Csv, FieldsAreQuotedAsRfc4180Says) {
  EXPECT_EQ(csv_field("plain"), "plain");
  EXPECT_EQ(csv_field(""), "");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
  EXPECT_EQ(csv_field("cr\r"), "\"cr\r\"");
  EXPECT_EQ(csv_field("unit 7"), "unit 7");
}

TEST(Csv, DataParallelOneRowPerRankAndCategory) {
  const ResultDocument doc = testing::records_of(testing::report_document());
  const Rows rows = parse_csv(data_parallel_csv(doc));
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows[0], kDpHeader);
  // zero2 (2 ranks), zero3 (2), zero3 root unit (2), ddp (4): 10 ranks x 11 categories
  // (the document predates workspace, master and param_cast: their rows read 0).
  const std::size_t k = kCategoryCount;
  ASSERT_EQ(k, 11u);
  ASSERT_EQ(rows.size(), 1u + 10u * k);
  for (const auto& row : rows) ASSERT_EQ(row.size(), kDpHeader.size());
  // zero2 rank 0, in category order.
  for (std::size_t c = 0; c < 8; ++c) EXPECT_EQ(rows[1 + c][6], testing::kReportCategories[c]);
  for (std::size_t c = 8; c < k; ++c) {
    EXPECT_EQ(rows[1 + c][6], kCategoryNames[c]);
    EXPECT_EQ(rows[1 + c][7], "0");
  }
  const std::vector<std::string> param_unsharded = {"2", "zero2", "1", "1", "", "0", "param_unsharded", "0", "8192",
                                                    "0", "28288", "backward", "unit 3", "6144", "1.25", "8192", "0.75",
                                                    "torch", "fp32", "none", "1", "false"};
  EXPECT_EQ(rows[2], param_unsharded);
  EXPECT_EQ(rows[1 + k][5], "1");                // zero2 rank 1
  EXPECT_EQ(rows[1 + 2 * k][1], "zero3");        // zero3 rank 0
  EXPECT_EQ(rows[1 + 2 * k + 1][8], "4096");     // its gathered units at the peak
  EXPECT_EQ(rows[1 + 4 * k][2], "all");          // root unit
  // ddp: no units or prefetch; its bucket instead.
  const auto& ddp = rows[1 + 6 * k];
  EXPECT_EQ(ddp[0], "4");
  EXPECT_EQ(ddp[1], "ddp");
  EXPECT_EQ(ddp[2], "");
  EXPECT_EQ(ddp[3], "");
  EXPECT_EQ(ddp[4], "view");
  EXPECT_EQ(rows.back()[5], "3");
  EXPECT_EQ(rows.back()[6], "param_cast");
  EXPECT_EQ(rows[rows.size() - 4][6], "temp");
}

// The CSV once filled a missing comm_bytes with the sum over kinds and a missing peak
// phase with an empty field; a file missing them is now refused where it is read, so
// the CSV never meets one.
TEST(Csv, AFigureMissingFromAFileIsRefusedBeforeAnyCsv) {
  json doc = testing::complete_document(testing::report_document());
  doc["runs"][0]["ranks"][0].erase("comm_bytes");
  try {
    (void)read_result(doc, "r.json");
    FAIL() << "read a rank without comm_bytes";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()), "'r.json': runs[0] (zero2 W=2 units=1): ranks[0].comm_bytes is missing; expected a byte count");
  }
  doc = testing::complete_document(testing::report_document());
  doc["runs"][0]["ranks"][0]["peak"].erase("phase");
  EXPECT_THROW((void)read_result(doc, "r.json"), UsageError);
  // Null where the record may hold none: an empty field.
  doc = testing::complete_document(testing::report_document());
  doc["runs"][0]["ranks"][0]["step_ms"]["median"] = nullptr;
  const Rows rows = parse_csv(data_parallel_csv(read_result(doc, "r.json")));
  EXPECT_EQ(rows[1][14], "");
  EXPECT_EQ(rows[1][13], "6144");
}

// A run's settings are columns of their own: engine, precision, checkpoint, accumulate,
// no_sync, as the record says them.
TEST(Csv, DataParallelRowsSayTheirSettings) {
  json doc = testing::report_document();
  doc["runs"][0]["engine"] = "fsdp2";
  doc["runs"][0]["precision"] = "bf16";
  doc["runs"][0]["model"]["checkpoint"] = "attention";
  doc["runs"][0]["accumulate"] = 3;
  doc["runs"][0]["no_sync"] = true;
  const Rows rows = parse_csv(data_parallel_csv(testing::records_of(doc)));
  const std::vector<std::string> settings(rows[1].end() - 5, rows[1].end());
  EXPECT_EQ(settings, (std::vector<std::string>{"fsdp2", "bf16", "attention", "3", "true"}));
  const std::vector<std::string> zero3(rows[1 + 2 * kCategoryCount].end() - 5, rows[1 + 2 * kCategoryCount].end());
  EXPECT_EQ(zero3, (std::vector<std::string>{"torch", "fp32", "none", "1", "false"}));
}

TEST(Csv, PipelineOneRowPerStageSkippedLeftOut) {
  json doc = testing::report_document();
  doc["runs"][4]["stages"][1]["chunks_layers"] = {{1, 1}, {3, 3}};
  doc["runs"][4]["schedule"] = "a \"b\", c";
  const std::string text = pipeline_csv(testing::records_of(doc));
  EXPECT_NE(text.find("\"1-1,3-3\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"a \"\"b\"\", c\""), std::string::npos) << text;
  const Rows rows = parse_csv(text);
  EXPECT_EQ(rows[0], kPpHeader);
  ASSERT_EQ(rows.size(), 1u + 2u * 2u);  // two runs of two stages; the skipped one has none
  for (const auto& row : rows) ASSERT_EQ(row.size(), kPpHeader.size());
  const std::vector<std::string> stage1 = {"a \"b\", c", "2", "2", "1", "1", "1-1,3-3", "10", "3072", "10", "10",
                                           "10", "3072", "16904", "19464", "4", "6", "0.333333333", "0.333333333",
                                           "0.333333333", "16904", "19464", "2048", "2048", "fp32"};
  EXPECT_EQ(rows[2], stage1);
  EXPECT_EQ(rows[3][5], "0-0");
}

TEST(Csv, NoRunsOfAKindGivesTheHeaderAlone) {
  const ResultDocument doc = testing::records_of({{"schema", "shardscope/1"}, {"runs", json::array()}});
  EXPECT_EQ(parse_csv(data_parallel_csv(doc)).size(), 1u);
  EXPECT_EQ(parse_csv(pipeline_csv(doc)).size(), 1u);
  EXPECT_EQ(parse_csv(pipeline_csv(ResultDocument{})).size(), 1u);
}

}  // namespace
}  // namespace shardscope
