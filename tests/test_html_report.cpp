// The HTML report: one bar per rank per run with the predicted totals marked, a memory
// chart per distinct rank or "no timeline recorded", a Gantt per pipeline run from its
// spans or replayed from action_ms, everything escaped, nothing fetched.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/report/html_report.hpp"
#include "harness/report/html_svg.hpp"
#include "harness/report/timeline_view.hpp"
#include "shardscope/check.hpp"
#include "support/records_of.hpp"
#include "support/report_doc.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
using testing::report_document;

// The report of a hand-made document, read into the records as a result file is.
std::string render_html_report(const json& doc, const std::string& command) {
  return shardscope::render_html_report(testing::records_of(doc), command);
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// The text of each `<g class="run" ...>` cluster of the bar charts, in order.
std::vector<std::string> run_clusters(const std::string& html) {
  std::vector<std::string> out;
  const std::string open = "<g class=\"run\"";
  for (std::size_t at = html.find(open); at != std::string::npos;) {
    const std::size_t next = html.find(open, at + open.size());
    const std::size_t svg_end = html.find("</svg>", at);
    out.push_back(html.substr(at, std::min(next, svg_end) - at));
    at = next;
  }
  return out;
}

TEST(HtmlReport, IsOneSelfContainedPage) {
  const std::string html = render_html_report(report_document(), "shardscope sweep --report r.html");
  ASSERT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<meta charset=\"utf-8\">"), std::string::npos);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  // Nothing that would reach the network or run code.
  for (const char* banned : {"http", "<script", "<link", "@import", "src=", "<iframe", "<img", "@font-face"})
    EXPECT_EQ(html.find(banned), std::string::npos) << banned;
  // Every url() is the page's own pattern.
  EXPECT_EQ(count(html, "url("), count(html, "url(#hatch)"));
  EXPECT_NE(html.find("<pattern id=\"hatch\""), std::string::npos);
  EXPECT_NE(html.find("$ shardscope sweep --report r.html"), std::string::npos);
  EXPECT_LT(html.size(), 400u * 1024u);
}

TEST(HtmlReport, OneRestingAndOnePeakBarPerRankPerRunWithPredictedMarks) {
  const json doc = report_document();
  const std::string html = render_html_report(doc, "x");
  // Two data-parallel groups (W = 2, W = 4): one bar chart each.
  EXPECT_EQ(count(html, "<svg class=\"bars\""), 2);
  const std::vector<std::string> clusters = run_clusters(html);
  const std::vector<int> ranks = {2, 2, 2, 4};  // zero2, zero3, zero3 root, ddp
  ASSERT_EQ(clusters.size(), ranks.size()) << html;
  for (std::size_t i = 0; i < clusters.size(); ++i) {
    EXPECT_EQ(count(clusters[i], "class=\"bar resting\""), ranks[i]) << i;
    EXPECT_EQ(count(clusters[i], "class=\"bar peak\""), ranks[i]) << i;
    EXPECT_EQ(count(clusters[i], "class=\"predicted\""), 2 * ranks[i]) << i;
    for (int r = 0; r < ranks[i]; ++r)
      EXPECT_NE(clusters[i].find("class=\"bar peak\" data-rank=\"" + std::to_string(r) + "\""), std::string::npos);
    EXPECT_NE(clusters[i].find("peak: backward"), std::string::npos) << clusters[i];
    EXPECT_NE(clusters[i].find("at unit 3"), std::string::npos);
  }
  EXPECT_NE(clusters[0].find("data-run=\"zero2 W=2 units=1\""), std::string::npos);
  EXPECT_NE(clusters[2].find("data-run=\"zero3 W=2 units=all\""), std::string::npos);
  // Category colours and the legend of all eight categories.
  for (const char* c : kCategoryNames)
    EXPECT_NE(html.find(std::string("</i>") + c + "</span>"), std::string::npos) << c;
  EXPECT_NE(html.find(html::category_color(1)), std::string::npos);  // param_unsharded is drawn
}

TEST(HtmlReport, MemoryChartsPerDistinctRankElseNoTimeline) {
  const std::string html = render_html_report(report_document(), "x");
  // zero2 and zero3 (units=1): both ranks alike, one chart each; the root-unit
  // zero3 and ddp runs recorded no timeline.
  EXPECT_EQ(count(html, "<svg class=\"memory\""), 2);
  EXPECT_EQ(count(html, "<svg class=\"memory none\""), 2);
  EXPECT_NE(html.find("(alike: ranks 0, 1)"), std::string::npos);
  EXPECT_GE(count(html, "no timeline recorded"), 2);
  // Stacked areas of the categories that hold bytes, the peak and the predicted peak.
  EXPECT_EQ(count(html, "class=\"area\" data-category=\"param_unsharded\""), 2);
  EXPECT_EQ(count(html, "class=\"area\" data-category=\"comm\""), 0);  // never non-zero
  EXPECT_EQ(count(html, "class=\"peakmark\""), 2);
  EXPECT_EQ(count(html, "class=\"predicted-peak\""), 2);
}

TEST(HtmlReport, GanttFromSpansAndReplayedFromActionTimes) {
  const std::string html = render_html_report(report_document(), "x");
  EXPECT_EQ(count(html, "<svg class=\"gantt\""), 2);
  EXPECT_EQ(count(html, "class=\"act\""), 16);     // 2 runs x 2 stages x 4 actions (the earlier step's F dropped)
  EXPECT_EQ(count(html, "class=\"bubble\""), 4);  // one shaded row per stage
  EXPECT_EQ(count(html, "data-kind=\"F\""), 8);
  // From spans: the last step, from its start on each stage's clock (F0 of stage 1 at 1 ms).
  EXPECT_NE(html.find("stage 1: F0, 1.0000 ms (from 1.0000 ms)"), std::string::npos) << html;
  EXPECT_NE(html.find("the last step as measured"), std::string::npos);
  // Replayed: stage 0's B0 waits for stage 1's B0, which ends at 4 ms.
  EXPECT_NE(html.find("replayed with free messages"), std::string::npos);
  EXPECT_EQ(count(html, "stage 0: B0, 1.0000 ms (from 4.0000 ms)"), 2);  // measured and replayed agree
  EXPECT_EQ(count(html, "stage 0: B1, 1.0000 ms (from 5.0000 ms)"), 2);
  // Activation bytes: a line per stage where a timeline exists, else the note.
  EXPECT_EQ(count(html, "<svg class=\"activation\""), 1);
  EXPECT_EQ(count(html, "<svg class=\"activation none\""), 1);
  EXPECT_EQ(count(html, "class=\"stage-line\""), 2);
}

TEST(HtmlReport, EscapesEveryText) {
  json doc = report_document();
  doc["runs"][0]["strategy"] = "<b>zero2</b> & \"q\"";
  doc["runs"][0]["ranks"][0]["peak"]["where"] = "unit <7>";
  doc["runs"][4]["schedule"] = "<script>alert(1)</script>";
  doc["provenance"]["host"] = "a<b";
  const std::string html = render_html_report(doc, "shardscope sweep --out 'a&b' <x>");
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<b>zero2"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;zero2&lt;/b&gt; &amp; &quot;q&quot;"), std::string::npos);
  EXPECT_NE(html.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(html.find("unit &lt;7&gt;"), std::string::npos);
  EXPECT_NE(html.find("host a&lt;b"), std::string::npos);
  EXPECT_NE(html.find("--out &#39;a&amp;b&#39; &lt;x&gt;"), std::string::npos);
  EXPECT_EQ(html::escape("<&>\"'"), "&lt;&amp;&gt;&quot;&#39;");
  // The page says UTF-8: well-formed sequences pass, anything else becomes U+FFFD.
  EXPECT_EQ(html::escape("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(html::escape("r\xFF.json"), "r\xEF\xBF\xBD.json");
  EXPECT_EQ(html::escape("\xC0\xAF<"), "\xEF\xBF\xBD\xEF\xBF\xBD&lt;");  // an overlong '/'
  EXPECT_EQ(html::escape("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate
  EXPECT_EQ(html::escape("\xE2\x82"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // cut short
}

TEST(HtmlReport, TablesAndAnIncompleteSweepAreShown) {
  json doc = report_document();
  doc["sweep"]["complete"] = false;
  doc["sweep"]["error"] = "rank 1: zero3 W=4: killed by signal 9";
  const std::string html = render_html_report(doc, "x");
  EXPECT_NE(html.find("<pre class=\"tables\">"), std::string::npos);
  EXPECT_NE(html.find("at rest (after the step), bytes per rank"), std::string::npos);
  EXPECT_NE(html.find("× 4P"), std::string::npos);
  EXPECT_NE(html.find("Incomplete"), std::string::npos);
  EXPECT_NE(html.find("killed by signal 9"), std::string::npos);
  EXPECT_NE(html.find("--layers 2 cannot fill 4 stages"), std::string::npos);  // the skipped list
}

// Whatever the records hold renders: no run at all, a run whose ranks or stages are
// missing (an emulated job's file lists the one it played), a stage without a timeline.
TEST(HtmlReport, AnythingMissingStillRenders) {
  ResultDocument doc;
  EXPECT_NE(shardscope::render_html_report(doc, "x").find("No completed runs."), std::string::npos);
  DataParallelRun dp;
  dp.strategy = "zero3";
  dp.world = 4;
  dp.model.layers = dp.model.width = dp.model.batch = 1;
  PipelineRun pp;
  pp.schedule = "gpipe";
  pp.world = 2;
  pp.model = dp.model;
  doc.runs = {dp, pp};
  EXPECT_NE(shardscope::render_html_report(doc, "x").find("</html>"), std::string::npos);
  dp.ranks.push_back(RankRecord{});  // no timeline
  pp.stages.push_back(StageRecord{});
  doc.runs = {dp, pp};
  const std::string html = shardscope::render_html_report(doc, "x");
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_NE(html.find("no timeline recorded"), std::string::npos);
}

// The charts read a timeline's rows by category: a file whose columns are not the eight
// categories in order is refused where it is read, not drawn with its columns guessed.
TEST(TimelineView, ColumnsAreTheCategoriesOrTheFileIsRefused) {
  json timeline = to_json(TimelineRecord{});
  EXPECT_NO_THROW(read_timeline_record(timeline, "a.json"));
  timeline["categories"] = {"temp", "param", "bogus"};
  try {
    read_timeline_record(timeline, "a.json");
    ADD_FAILURE() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("timeline.categories is [\"temp\",\"param\",\"bogus\"]"), std::string::npos)
        << e.what();
  }
}

TEST(TimelineView, RowTotalsAndActionNames) {
  TimelineRow row;
  row.bytes[7] = 7;  // temp
  row.bytes[0] = 3;  // param
  EXPECT_EQ(row_total(row), 10);
  EXPECT_EQ(parse_span_action("F(m=2)").kind, 'F');
  EXPECT_EQ(parse_span_action("F(m=2)").microbatch, 2);
  EXPECT_EQ(parse_span_action("B(m=3, chunk 1)").chunk, 1);
  EXPECT_EQ(parse_span_action("W(m=0,c=2)").chunk, 2);
  EXPECT_EQ(parse_span_action("forward layer 3").kind, 0);
  EXPECT_EQ(parse_span_action("F(x)").kind, 0);
}

}  // namespace
}  // namespace shardscope
