// Data-parallel bars: per run a cluster, per rank a resting and a peak bar stacked by
// category, the predicted totals marked.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/html_charts.hpp"
#include "harness/report/html_svg.hpp"
#include "harness/report/record_label.hpp"
#include "harness/report/table_parts.hpp"

namespace shardscope::html {
namespace {

// One bar: bytes per category (kCategoryNames order), its total, the prediction.
struct Bar {
  std::array<std::int64_t, kCategoryCount> bytes{};
  std::int64_t total = 0;
  bool has_predicted = false;
  std::int64_t predicted = 0;
};

// `figures`: resting, or peak.by_category with the peak's total in `total`.
Bar make_bar(const CategoryFigures& figures, std::int64_t total, std::int64_t predicted) {
  return {figures.bytes, total, true, predicted};
}

std::string bar_tip(const std::string& who, const char* what, const Bar& b) {
  std::string tip = who + ", " + what + ": " + cells::group_digits(b.total) + " B";
  if (b.has_predicted) tip += " (predicted " + cells::group_digits(b.predicted) + " B)";
  for (std::size_t i = 0; i < b.bytes.size(); ++i)
    if (b.bytes[i] != 0)
      tip += std::string("\n") + kCategoryNames[i] + ": " + cells::group_digits(b.bytes[i]) + " B";
  return tip;
}

struct RankBars {
  std::string rank;  // "0"
  Bar resting, peak;
  std::string phase, where;
};

std::vector<RankBars> bars_of(const DataParallelRun& run) {
  std::vector<RankBars> out;
  for (const RankRecord& r : run.ranks)
    out.push_back({std::to_string(r.rank), make_bar(r.resting, r.resting.total, r.predicted.resting_total),
                   make_bar(r.peak.by_category, r.peak.total, r.predicted.peak_total), r.peak.phase, r.peak.where});
  return out;
}

}  // namespace

std::string data_parallel_bars(const std::vector<const DataParallelRun*>& runs) {
  std::vector<std::vector<RankBars>> all;
  std::size_t nbars = 0;
  double ymax = 0.0;
  for (const DataParallelRun* run : runs) {
    all.push_back(bars_of(*run));
    nbars += all.back().size();
    for (const RankBars& rb : all.back())
      for (const Bar* b : {&rb.resting, &rb.peak})
        ymax = std::max({ymax, static_cast<double>(b->total),
                         b->has_predicted ? static_cast<double>(b->predicted) : 0.0});
  }
  if (nbars == 0) return "<p class=\"none\">no rank records</p>";

  const double left = 76, right = 12, top = 14, plot_h = 240, bottom = 92, cluster_pad = 22, min_cluster = 112;
  const double per_rank = std::clamp((1240.0 - left - right - cluster_pad * runs.size()) / nbars, 14.0, 48.0);
  const double bar_w = (per_rank - 8.0) / 2.0;
  double width = left + right;
  for (const auto& ranks : all) width += std::max(min_cluster, per_rank * ranks.size() + cluster_pad);
  const std::vector<double> ticks = nice_byte_ticks(ymax, 5);
  const double scale = plot_h / std::max(1.0, ticks.back());
  const double y0 = top + plot_h;

  Svg svg(width, top + plot_h + bottom, "bars", "bytes per rank at rest and at peak, by category");
  svg.bytes_axis(left, width - right, y0, scale, ticks);
  double x = left;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const DataParallelRun& run = *runs[i];
    const auto& ranks = all[i];
    const double cluster_w = std::max(min_cluster, per_rank * ranks.size() + cluster_pad);
    const std::string label = run_label(run);
    svg.begin_group("class=\"run\" data-run=\"" + escape(label) + "\"");
    double bx = x + (cluster_w - per_rank * ranks.size()) / 2.0 + 4.0;
    // Rank labels that would overlap (many ranks, narrow bars) are thinned to every k-th
    // (each bar's tooltip still names its rank): "r63" at the small font is about 6.3 px
    // a character.
    const std::size_t widest = ("r" + (ranks.empty() ? std::string() : ranks.back().rank)).size();
    const std::size_t every =
        std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil((6.3 * widest + 4.0) / per_rank)));
    std::size_t j = 0;
    for (const RankBars& rb : ranks) {
      const bool labelled = j++ % every == 0;
      const std::string who = label + ", rank " + rb.rank;
      int which = 0;
      for (const Bar* b : {&rb.resting, &rb.peak}) {
        const bool peak = which++ == 1;
        const double bar_x = bx + (peak ? bar_w + 2.0 : 0.0);
        std::string tip = bar_tip(who, peak ? "at the peak" : "at rest after the step", *b);
        if (peak) tip += "\npeak in " + rb.phase + ", " + rb.where;
        svg.begin_group(std::string("class=\"bar ") + (peak ? "peak" : "resting") + "\" data-rank=\"" +
                            escape(rb.rank) + "\"",
                        tip);
        double y = y0;
        for (std::size_t c = 0; c < b->bytes.size(); ++c) {
          if (b->bytes[c] <= 0) continue;
          const double h = static_cast<double>(b->bytes[c]) * scale;
          svg.rect(bar_x, y - h, bar_w, h, category_color(c));
          y -= h;
        }
        if (b->total > 0 && y0 - y < 0.5) svg.rect(bar_x, y0 - b->total * scale, bar_w, b->total * scale, "#bab0ac");
        if (b->has_predicted) {
          const double py = y0 - static_cast<double>(b->predicted) * scale;
          svg.line(bar_x - 3, py, bar_x + bar_w + 3, py, "#111", "stroke-width=\"2.5\" class=\"predicted\"");
        }
        svg.end_group();
        svg.text(bar_x + bar_w / 2, y0 + 11, peak ? "P" : "R", "class=\"tiny\" text-anchor=\"middle\"");
      }
      if (labelled) svg.text(bx + bar_w + 1, y0 + 23, "r" + rb.rank, "class=\"small\" text-anchor=\"middle\"");
      bx += per_rank;
    }
    const double cx = x + cluster_w / 2;
    svg.text(cx, y0 + 38, run.strategy, "class=\"strong\" text-anchor=\"middle\"");
    if (tables::uses_units(run))
      svg.text(cx, y0 + 51, tables::units_setting(run), "class=\"small\" text-anchor=\"middle\"");
    bool same = true;
    for (const RankBars& rb : ranks) same = same && rb.phase == ranks.front().phase && rb.where == ranks.front().where;
    if (!ranks.empty() && same) {
      svg.text(cx, y0 + 66, "peak: " + ranks.front().phase, "class=\"small peakat\" text-anchor=\"middle\"");
      svg.text(cx, y0 + 79, "at " + ranks.front().where, "class=\"small peakat\" text-anchor=\"middle\"");
    } else if (!ranks.empty()) {
      svg.text(cx, y0 + 66, "peaks differ by rank", "class=\"small peakat\" text-anchor=\"middle\"");
      svg.text(cx, y0 + 79, "(hover a P bar)", "class=\"small\" text-anchor=\"middle\"");
    }
    svg.end_group();
    x += cluster_w;
    if (i + 1 < runs.size()) svg.line(x, top, x, y0, "#eee");
  }
  return svg.str();
}

}  // namespace shardscope::html
