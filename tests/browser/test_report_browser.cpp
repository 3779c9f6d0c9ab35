// The HTML report in a real browser: `shardscope sweep --report` on a small sweep and on
// the seed's sweep, rendered by headless Chromium (Debian's `chromium`, installed here
// with apt-get when missing and running as root; skipped with the reason otherwise) to
// a PNG and to its DOM. Checks that the charts are in the DOM Chromium built, and that
// the picture is not blank: the category colours are painted (decoded with zlib when
// the build found it; else the PNG must be well above a blank page's size).
//
// SHARDSCOPE_SCREENSHOT=PATH keeps the seed sweep's screenshot there (docs/report-seed.png).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "harness/cli/child_process.hpp"
#include "harness/report/json_io.hpp"
#include "support/png_check.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

std::string find_chromium() {
  if (const char* own = std::getenv("SHARDSCOPE_CHROMIUM"); own && *own) return find_executable(own);
  for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"})
    if (std::string path = find_executable(name); !path.empty()) return path;
  return {};
}

class ReportBrowser : public testing::BinaryTest {
 protected:
  void SetUp() override {
    testing::BinaryTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    chromium_ = find_chromium();
    // scripts/test.sh installs it (scripts/deps.sh chromium) before ctest runs.
    if (chromium_.empty())
      why_not_ = "no chromium on PATH (scripts/test.sh installs it; or set SHARDSCOPE_CHROMIUM)";
  }

  // Runs argv with stdout/stderr to files under dir_; returns the exit code (-1: none).
  int run(const std::vector<std::string>& argv, int timeout_s, const std::vector<std::string>& env = {}) {
    ChildSpec spec{argv, dir_ + "/stdout", dir_ + "/stderr", env, static_cast<double>(timeout_s)};
    const ChildResult r = run_child(spec);
    out_ = read_file(spec.stdout_path);
    err_ = read_file(spec.stderr_path);
    return r.end == ChildResult::End::exited ? r.code : -1;
  }

  // Renders `html` (an absolute path) to dir_/out.png and its DOM to dom_.
  void render(const std::string& html, int height) {
    const std::vector<std::string> common = {chromium_, "--headless", "--no-sandbox", "--disable-gpu",
                                             "--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars",
                                             "--user-data-dir=" + dir_ + "/profile",
                                             "--window-size=1400," + std::to_string(height)};
    std::vector<std::string> shot = common;
    shot.insert(shot.end(), {"--screenshot=" + dir_ + "/out.png", "file://" + html});
    ASSERT_EQ(run(shot, 180), 0) << err_;
    ASSERT_TRUE(fs::exists(dir_ + "/out.png")) << out_ << err_;
    std::vector<std::string> dump = common;
    dump.insert(dump.end(), {"--dump-dom", "file://" + html});
    ASSERT_EQ(run(dump, 180), 0) << err_;
    dom_ = out_;
  }

  // The page as Chromium built it holds every chart, one peak bar per rank.
  void expect_charts_in_dom(const nlohmann::json& doc) {
    EXPECT_NE(dom_.find("shardscope report"), std::string::npos);
    int ranks = 0;
    bool dp = false, pp = false;
    for (const auto& run : doc["runs"]) {
      if (run.value("skipped", false)) continue;
      if (run.contains("ranks")) ranks += static_cast<int>(run["ranks"].size()), dp = true;
      if (run.contains("stages")) pp = true;
    }
    ASSERT_TRUE(dp && pp) << "the sweep should hold both kinds of runs";
    EXPECT_GE(count(dom_, "<svg class=\"bars\""), 1);
    EXPECT_EQ(count(dom_, "class=\"bar peak\""), ranks);
    EXPECT_EQ(count(dom_, "class=\"bar resting\""), ranks);
    EXPECT_GE(count(dom_, "class=\"predicted\""), 2 * ranks);
    EXPECT_GE(count(dom_, "<svg class=\"memory\""), 1) << "no memory-over-time chart: no timeline?";
    EXPECT_GE(count(dom_, "<svg class=\"gantt\""), 1);
    EXPECT_GE(count(dom_, "class=\"act\""), 4);
    EXPECT_GE(count(dom_, "<svg class=\"activation\""), 1);
    EXPECT_NE(dom_.find("<pre class=\"tables\">"), std::string::npos);
  }

  // The PNG is the window's size and not blank: the chart colours are painted.
  void expect_painted(int height) {
    const std::string png = read_file(dir_ + "/out.png");
    const testing::PngCheck check = testing::check_png(png);
    ASSERT_TRUE(check.ok) << check.error;
    EXPECT_EQ(check.width, 1400u);
    EXPECT_EQ(check.height, static_cast<unsigned>(height));
    if (check.decoded) {
      EXPECT_GT(check.non_white_fraction, 0.05) << "the page looks blank";
      EXPECT_GT(check.distinct_colors, 50u);
      for (std::size_t i = 0; i < testing::kPngColors.size(); ++i)  // every sweep here runs zero2 or zero3
        EXPECT_GT(check.pixels_of[i], 500u) << testing::kPngColors[i].name << " is not painted";
    } else {
      // Without zlib: a blank page of this size compresses to ~20 KB.
      EXPECT_GT(png.size(), 100u * 1024u) << "the page looks blank (" << png.size() << " bytes)";
    }
  }

  std::string chromium_, why_not_, out_, err_, dom_;
};

TEST_F(ReportBrowser, SmallSweepRendersEveryChart) {
  if (chromium_.empty()) GTEST_SKIP() << why_not_;
  const std::string report = dir_ + "/r.html";
  ASSERT_EQ(run({bin_, "sweep", "--emulate", "--strategies", "zero2,zero3", "--schedules", "1f1b", "--worlds", "2",
                 "--microbatches", "4", "--layers", "4", "--width", "32", "--batch", "4", "--steps", "2", "--backend",
                 "cpu", "--out", dir_ + "/results", "--report", report, "--csv", dir_ + "/csv"},
                240),
            0)
      << err_;
  const std::string html = read_file(report);
  ASSERT_FALSE(html.empty());
  EXPECT_LT(html.size(), 400u * 1024u);
  EXPECT_EQ(html.find("http"), std::string::npos);
  EXPECT_NE(html.find("$ shardscope sweep --emulate --strategies zero2,zero3"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir_ + "/csv/data_parallel.csv"));
  EXPECT_TRUE(fs::exists(dir_ + "/csv/pipeline.csv"));
  render(report, 2000);
  if (HasFatalFailure()) return;
  expect_charts_in_dom(read_json_file(dir_ + "/results/shardscope.json"));
  expect_painted(2000);
}

// The report command of docs/cli.md, as a user types it in an empty folder.
TEST_F(ReportBrowser, SeedSweepReport) {
#ifndef SHARDSCOPE_WITH_MPI
  GTEST_SKIP() << "this build has no MPI: multi-rank jobs cannot start";
#endif
  if (chromium_.empty()) GTEST_SKIP() << why_not_;
  const fs::path before = fs::current_path();
  fs::current_path(dir_);
  const int code = run({bin_, "sweep", "--report", "seed.html", "--trace", "seed.json"}, 600);
  fs::current_path(before);
  ASSERT_EQ(code, 0) << err_;
  const std::string html = read_file(dir_ + "/seed.html");
  EXPECT_LT(html.size(), 600u * 1024u);
  EXPECT_NE(html.find("$ shardscope sweep --report seed.html --trace seed.json</pre>"), std::string::npos);
  const int height = 3000;
  render(dir_ + "/seed.html", height);
  if (HasFatalFailure()) return;
  const nlohmann::json doc = read_json_file(dir_ + "/results/shardscope.json");
  expect_charts_in_dom(doc);
  // zero2 and zero3 at W = 2 and 4, each with a root unit and one layer per unit.
  EXPECT_GE(count(dom_, "<svg class=\"memory\""), 12);
  EXPECT_EQ(count(dom_, "<svg class=\"gantt\""), 6);
  expect_painted(height);
  if (const char* keep = std::getenv("SHARDSCOPE_SCREENSHOT"); keep && *keep)
    fs::copy_file(dir_ + "/out.png", keep, fs::copy_options::overwrite_existing);
}

}  // namespace
}  // namespace shardscope
