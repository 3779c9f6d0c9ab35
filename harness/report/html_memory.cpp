// Data-parallel memory over time: per run and rank, the bytes of each category stacked
// as areas from timeline.memory, on one y scale for the whole group.
#include <algorithm>
#include <string>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/html_charts.hpp"
#include "harness/report/html_svg.hpp"
#include "harness/report/record_label.hpp"
#include "harness/report/table_parts.hpp"
#include "harness/report/timeline_view.hpp"

namespace shardscope::html {
namespace {

constexpr double kWidth = 660, kLeft = 72, kRight = 14, kTop = 16, kPlotH = 130, kStripH = 7;
constexpr double kHeight = kTop + kPlotH + 3 + kStripH + 30;

// One chart: a rank (and the ranks whose bytes change the same way).
struct Panel {
  const DataParallelRun* run = nullptr;
  const RankRecord* rank = nullptr;          // null: no rank recorded a timeline
  std::vector<std::string> ranks;            // the ranks it stands for
  const TimelineRecord* view = nullptr;      // the rank's timeline, with memory rows
};

bool same_bytes(const TimelineRecord& a, const TimelineRecord& b) {
  if (a.memory.size() != b.memory.size()) return false;
  for (std::size_t i = 0; i < a.memory.size(); ++i)
    if (a.memory[i].bytes != b.memory[i].bytes) return false;
  return true;
}

std::string ranks_note(const std::vector<std::string>& ranks) {
  if (ranks.size() < 2) return {};
  std::string out = " (alike: ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + ranks[i];
  return out + ")";
}

// At most one sample per pixel column (the one with the largest total, so the peak
// survives), in time order.
std::vector<TimelineRow> decimate(const std::vector<TimelineRow>& in, double t_end, double plot_w) {
  if (in.size() <= static_cast<std::size_t>(plot_w) * 2 || t_end <= 0.0) return in;
  std::vector<TimelineRow> out;
  long column = -1;
  for (const TimelineRow& s : in) {
    const long c = static_cast<long>(s.t_ms / t_end * plot_w);
    if (c != column) {
      out.push_back(s);
      column = c;
    } else if (row_total(s) > row_total(out.back())) {
      const double t = out.back().t_ms;
      out.back() = s;
      out.back().t_ms = t;
    }
  }
  return out;
}

std::string panel_svg(const Panel& p, double ymax_ticks, const std::vector<double>& ticks) {
  const TimelineRecord& v = *p.view;
  double t_end = v.memory.back().t_ms;
  for (const TimelineSpanRecord& s : v.spans) t_end = std::max(t_end, s.end_ms);
  for (const TimelineMark& m : v.marks) t_end = std::max(t_end, m.t_ms);
  const std::vector<double> xticks = nice_ticks(t_end, 6);
  const double t_max = std::max(xticks.back(), 1e-9);
  const double plot_w = kWidth - kLeft - kRight;
  const double xs = plot_w / t_max, ys = kPlotH / ymax_ticks, y0 = kTop + kPlotH;
  auto X = [&](double t) { return kLeft + std::max(0.0, t) * xs; };
  auto Y = [&](double b) { return y0 - b * ys; };

  Svg svg(kWidth, kHeight, "memory", "bytes by category over time, " + run_label(*p.run));
  svg.bytes_axis(kLeft, kWidth - kRight, y0, ys, ticks);
  for (const TimelineSpanRecord& s : v.spans)
    if (s.name == "step") svg.line(X(s.start_ms), kTop, X(s.start_ms), y0, "#bbb", "stroke-dasharray=\"2 3\"");

  const std::vector<TimelineRow> samples = decimate(v.memory, t_max, plot_w);
  std::array<bool, kCategoryCount> used{};
  for (const TimelineRow& s : samples)
    for (std::size_t c = 0; c < used.size(); ++c) used[c] = used[c] || s.bytes[c] != 0;
  // Each category as the area under its cumulative top edge, drawn top category first.
  for (std::size_t k = used.size(); k-- > 0;) {
    if (!used[k]) continue;
    std::string d = "M" + num(X(samples.front().t_ms)) + " " + num(y0);
    std::string last_y;
    for (std::size_t i = 0; i < samples.size(); ++i) {
      std::int64_t cum = 0;
      for (std::size_t c = 0; c <= k; ++c) cum += samples[i].bytes[c];
      const std::string y = num(Y(static_cast<double>(cum)));
      if (i > 0) d += "H" + num(X(samples[i].t_ms));
      if (y != last_y) d += "V" + y;
      last_y = y;
    }
    d += "H" + num(X(t_end)) + "V" + num(y0) + "Z";
    svg.path(d, category_color(k), std::string("class=\"area\" data-category=\"") + kCategoryNames[k] + "\"");
  }

  // The measured peak (the first instant of the largest total in the last step, the
  // step the record's peak comes from) and the predicted peak.
  const TimelineSpanRecord* step = last_step(v);
  std::size_t at = v.memory.size();
  for (std::size_t i = 0; i < v.memory.size(); ++i) {
    if (step && (v.memory[i].t_ms < step->start_ms || v.memory[i].t_ms > step->end_ms)) continue;
    if (at == v.memory.size() || row_total(v.memory[i]) > row_total(v.memory[at])) at = i;
  }
  if (at == v.memory.size()) at = 0;
  const double px = X(v.memory[at].t_ms);
  const std::string& phase = p.rank->peak.phase;
  const std::string& where = p.rank->peak.where;
  svg.begin_group("class=\"peakmark\"", "peak " + cells::group_digits(row_total(v.memory[at])) + " B at " +
                                            ms_label(v.memory[at].t_ms, 0.001) + " ms: " + phase + ", " + where);
  svg.line(px, kTop - 4, px, y0, "#111", "stroke-dasharray=\"3 2\"");
  const bool right_half = px > kLeft + plot_w * 0.6;
  svg.text(right_half ? px - 4 : px + 4, kTop + 6, "peak: " + phase + ", " + where,
           right_half ? "class=\"small\" text-anchor=\"end\"" : "class=\"small\"");
  svg.end_group();
  {
    const std::int64_t predicted = p.rank->predicted.peak_total;
    svg.begin_group("class=\"predicted-peak\"", "predicted peak " + cells::group_digits(predicted) + " B");
    svg.line(kLeft, Y(static_cast<double>(predicted)), kWidth - kRight, Y(static_cast<double>(predicted)), "#111",
             "stroke-width=\"1.5\" stroke-dasharray=\"6 3\" class=\"predicted\"");
    svg.end_group();
  }

  // Phases: one strip segment per run of equal phase between marks.
  const double sy = y0 + 3;
  for (std::size_t i = 0; i < v.marks.size();) {
    std::size_t j = i + 1;
    while (j < v.marks.size() && v.marks[j].phase == v.marks[i].phase) ++j;
    const double t1 = j < v.marks.size() ? v.marks[j].t_ms : t_end;
    svg.rect(X(v.marks[i].t_ms), sy, X(t1) - X(v.marks[i].t_ms), kStripH, phase_color(v.marks[i].phase));
    i = j;
  }
  svg.time_axis(kLeft, 0.0, xs, sy + kStripH, xticks);
  svg.text(kWidth - kRight, kHeight - 2, "ms since the run started", "class=\"small\" text-anchor=\"end\"");
  return svg.str();
}

std::string caption(const Panel& p) {
  const DataParallelRun& run = *p.run;
  std::string c = "<b>" + escape(run.strategy) + "</b>";
  if (tables::uses_units(run)) c += " · " + escape(tables::units_setting(run));
  // engine=, precision=, checkpoint=, accumulate= where not the default.
  if (const std::string s = tables::setting_label(run); !s.empty()) c += " ·" + escape(s);
  if (p.rank) c += " · rank " + escape(std::to_string(p.rank->rank));
  c += escape(ranks_note(p.ranks));
  if (!p.view) return c;
  const TimelineRecord& v = *p.view;
  // The first row is the state at the start, not an event.
  c += " · " + cells::group_digits(static_cast<std::int64_t>(v.memory.size()) - 1) + " events";
  if (v.coalesced)
    c += " · <span class=\"warn\">coalesced: " + cells::group_digits(v.merged_events) + " events merged</span>";
  if (v.dropped_spans > 0 || v.dropped_marks > 0)
    c += " · <span class=\"warn\">the oldest " + cells::group_digits(v.dropped_spans) + " ranges and " +
         cells::group_digits(v.dropped_marks) + " phase marks dropped</span>";
  return c;
}

}  // namespace

std::string data_parallel_timelines(const std::vector<const DataParallelRun*>& runs) {
  std::vector<Panel> panels;
  double ymax = 0.0;
  for (const DataParallelRun* run : runs) {
    const std::size_t first = panels.size();
    for (const RankRecord& r : run->ranks) {
      if (!r.timeline || r.timeline->memory.empty()) continue;
      const TimelineRecord& view = *r.timeline;
      for (const TimelineRow& s : view.memory) ymax = std::max(ymax, static_cast<double>(row_total(s)));
      ymax = std::max(ymax, static_cast<double>(r.predicted.peak_total));
      const std::string rank = std::to_string(r.rank);
      auto alike = std::find_if(panels.begin() + static_cast<std::ptrdiff_t>(first), panels.end(),
                                [&](const Panel& p) { return same_bytes(*p.view, view); });
      if (alike != panels.end()) {
        alike->ranks.push_back(rank);
        continue;
      }
      panels.push_back({run, &r, {rank}, &view});
    }
    if (panels.size() == first) panels.push_back({run, nullptr, {}, nullptr});  // no timeline recorded
  }
  const std::vector<double> ticks = nice_byte_ticks(ymax, 4);
  std::string out = "<div class=\"panels\">";
  for (const Panel& p : panels) {
    out += "<figure class=\"panel\"><figcaption>" + caption(p) + "</figcaption>";
    if (!p.view) {
      Svg svg(kWidth, 60, "memory none", "no timeline recorded, " + run_label(*p.run));
      svg.rect(0.5, 0.5, kWidth - 1, 59, "#fafafa", "stroke=\"#ccc\"");
      svg.text(kWidth / 2, 35, "no timeline recorded", "class=\"none\" text-anchor=\"middle\"");
      out += svg.str();
    } else {
      out += panel_svg(p, std::max(1.0, ticks.back()), ticks);
    }
    out += "</figure>";
  }
  return out + "</div>";
}

}  // namespace shardscope::html
