// Pipeline charts: per run a Gantt of every stage's F/B/W actions with the idle time
// shaded (placed by gantt_layout), and each stage's live activation bytes over the same
// window.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/gantt_layout.hpp"
#include "harness/report/html_charts.hpp"
#include "harness/report/html_svg.hpp"
#include "harness/report/table_parts.hpp"
#include "harness/report/timeline_view.hpp"

namespace shardscope::html {
namespace {

constexpr double kWidth = 1000, kLeft = 76, kRight = 96, kRowH = 20, kRowGap = 6, kTop = 8, kActH = 84;
constexpr std::size_t kActivation = static_cast<std::size_t>(Category::activation);  // its column in a sample

// A stage without a timeline draws as one with nothing in it.
const TimelineRecord kNoTimeline = [] {
  TimelineRecord none;
  return none;
}();

struct StageRow {
  const StageRecord* record = nullptr;
  std::string stage;
  const TimelineRecord* view = &kNoTimeline;
};

std::string act_label(const GanttAction& a, bool chunks) {
  std::string s(1, a.kind);
  s += std::to_string(a.microbatch);
  if (chunks) s += "." + std::to_string(a.chunk);
  return s;
}

std::string gantt_svg(const std::vector<StageRow>& rows, const GanttLayout& g, const std::string& label) {
  const double from = g.from_ms, plot_w = kWidth - kLeft - kRight;
  const std::vector<double> ticks = nice_ticks(g.to_ms - from, 8);
  const double xs = plot_w / std::max(ticks.back(), 1e-12);
  auto X = [&](double t) { return kLeft + (t - from) * xs; };
  const double height = kTop + rows.size() * (kRowH + kRowGap) + 22;
  bool chunks = false;
  for (const GanttStage& st : g.stages)
    for (const GanttAction& a : st.actions) chunks = chunks || a.chunk > 0;

  Svg svg(kWidth, height, "gantt", "pipeline actions per stage, " + label);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const GanttStage& st = g.stages[i];
    const std::string& stage = rows[i].stage;
    const double y = kTop + i * (kRowH + kRowGap);
    svg.text(kLeft - 6, y + kRowH / 2 + 4, "stage " + stage, "class=\"yl\"");
    double busy = 0.0;
    for (const GanttAction& a : st.actions)
      busy += std::max(0.0, std::min(a.end_ms, st.to_ms) - std::max(a.start_ms, st.from_ms));
    const double span = st.to_ms - st.from_ms;
    const std::string idle = tables::fixed(span > 0 ? std::optional<double>(100.0 * (1.0 - busy / span)) : std::nullopt, 1);
    const StageRecord& rec = *rows[i].record;
    svg.begin_group("class=\"bubble\"", "stage " + stage + ": idle " + idle + "% of the window drawn; bubble wall " +
                                            tables::percent(rec.bubble_fraction) + ", replayed " +
                                            tables::percent(rec.bubble_fraction_replayed) + ", theory " +
                                            tables::percent(rec.bubble_fraction_theory));
    svg.rect(X(st.from_ms), y, X(st.to_ms) - X(st.from_ms), kRowH, "url(#hatch)");
    svg.end_group();
    for (const GanttAction& a : st.actions) {
      const double x0 = X(std::max(a.start_ms, from)), x1 = X(std::min(a.end_ms, g.to_ms));
      svg.begin_group("class=\"act\" data-kind=\"" + std::string(1, a.kind) + "\"",
                      "stage " + stage + ": " + act_label(a, chunks) + ", " + ms_label(a.end_ms - a.start_ms, 0.0001) +
                          " ms (from " + ms_label(a.start_ms - from, 0.0001) + " ms)");
      svg.rect(x0, y, std::max(0.8, x1 - x0), kRowH, action_color(a.kind), "stroke=\"#fff\" stroke-width=\"0.6\"");
      if (x1 - x0 >= 20)
        svg.text((x0 + x1) / 2, y + kRowH / 2 + 4, act_label(a, chunks), "class=\"actl\" text-anchor=\"middle\"");
      svg.end_group();
    }
    svg.text(kWidth - kRight + 6, y + kRowH / 2 + 4, "idle " + idle + "%", "class=\"small\"");
  }
  svg.time_axis(kLeft, 0.0, xs, height - 22, ticks);
  svg.text(kWidth - kRight + 26, height - 7, "ms", "class=\"small\"");
  return svg.str();
}

// Each stage's activation bytes over [from, to] (its clock shifted by `shift[i]`).
std::string activation_svg(const std::vector<StageRow>& rows, const std::vector<double>& shift, double from,
                           double to, double ymax, const std::string& label) {
  const double plot_w = kWidth - kLeft - kRight;
  const std::vector<double> ticks = nice_ticks(to - from, 8);
  const double xs = plot_w / std::max(ticks.back(), 1e-12);
  const std::vector<double> yticks = nice_byte_ticks(ymax, 3);
  const double ys = kActH / std::max(1.0, yticks.back()), y0 = kTop + 6 + kActH;
  auto X = [&](double t) { return kLeft + (std::clamp(t, from, to) - from) * xs; };
  Svg svg(kWidth, y0 + 24, "activation", "live activation bytes per stage, " + label);
  svg.bytes_axis(kLeft, kWidth - kRight, y0, ys, yticks);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    std::string d, last_y;
    std::int64_t held = 0;
    for (const TimelineRow& s : rows[i].view->memory) {
      const double t = s.t_ms + shift[i];
      if (t > to) break;
      if (t < from) {
        held = s.bytes[kActivation];
        continue;
      }
      if (d.empty()) d = "M" + num(X(from)) + " " + (last_y = num(y0 - held * ys));
      const std::string y = num(y0 - s.bytes[kActivation] * ys);
      d += "H" + num(X(t));
      if (y != last_y) d += "V" + y;
      last_y = y;
      held = s.bytes[kActivation];
    }
    if (d.empty()) d = "M" + num(X(from)) + " " + num(y0 - held * ys);
    d += "H" + num(X(to));
    svg.path(d, "none", std::string("stroke=\"") + stage_color(i) + "\" stroke-width=\"1.6\" class=\"stage-line\"");
    const double ly = kTop + 10 + 14.0 * i;
    svg.line(kWidth - kRight + 6, ly - 4, kWidth - kRight + 20, ly - 4, stage_color(i), "stroke-width=\"2\"");
    svg.text(kWidth - kRight + 24, ly, "stage " + rows[i].stage, "class=\"small\"");
  }
  svg.time_axis(kLeft, 0.0, xs, y0, ticks);
  svg.text(kWidth - kRight + 26, y0 + 15, "ms", "class=\"small\"");
  return svg.str();
}

std::string none_svg(const std::string& css_class, const std::string& what) {
  Svg svg(kWidth, 44, css_class + " none", what);
  svg.rect(0.5, 0.5, kWidth - 1, 43, "#fafafa", "stroke=\"#ccc\"");
  svg.text(kWidth / 2, 27, what, "class=\"none\" text-anchor=\"middle\"");
  return svg.str();
}

std::string shifts_note(const std::vector<StageRow>& rows, const GanttLayout& g) {
  std::string note;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (g.stages[i].clock_shift_ms == 0.0) continue;
    note += (note.empty() ? "" : ", ") + std::string("stage ") + rows[i].stage + " " +
            (g.stages[i].clock_shift_ms > 0 ? "+" : "") + ms_label(g.stages[i].clock_shift_ms, 0.001) + " ms";
  }
  return " · clocks aligned by the messages between stages (" + note + ")";
}

}  // namespace

std::string pipeline_charts(const std::vector<const PipelineRun*>& runs) {
  // One activation scale for the group, over the whole timelines.
  double act_max = 0.0;
  for (const PipelineRun* run : runs)
    for (const StageRecord& st : run->stages)
      if (st.timeline)
        for (const TimelineRow& s : st.timeline->memory)
          act_max = std::max(act_max, static_cast<double>(s.bytes[kActivation]));

  std::string out;
  for (const PipelineRun* run : runs) {
    std::vector<StageRow> rows;
    for (const StageRecord& st : run->stages)
      rows.push_back({&st, std::to_string(st.stage), st.timeline ? &*st.timeline : &kNoTimeline});
    std::stable_sort(rows.begin(), rows.end(),
                     [](const StageRow& a, const StageRow& b) { return a.record->stage < b.record->stage; });
    const std::string microbatches = std::to_string(run->microbatches), chunks = std::to_string(run->chunks);
    const std::string precision = run->precision != "fp32" ? " precision=" + run->precision : "";
    const std::string label = run->schedule + ", M = " + microbatches + ", chunks " + chunks + precision;
    out += "<figure class=\"pipe\"><figcaption><b>" + escape(run->schedule) + "</b> · M = " + escape(microbatches) +
           " · chunks " + escape(chunks) + (precision.empty() ? "" : " ·" + escape(precision));

    // An emulated stage ran alone: its spans share no clock with the others'.
    const bool alone = run->place.emulated;
    std::vector<const TimelineRecord*> views;
    std::vector<const StageRecord*> records;
    for (const StageRow& row : rows) views.push_back(row.view), records.push_back(row.record);
    GanttLayout g = alone ? GanttLayout{} : measured_layout(views);
    if (g.source == GanttLayout::Source::none) g = replayed_layout(records);
    if (g.source == GanttLayout::Source::measured)
      out += " · the last step as measured (ms from its start on the earliest stage)" +
             (g.shifted ? escape(shifts_note(rows, g)) : std::string());
    else if (g.source == GanttLayout::Source::replayed)
      out += std::string(" · <span class=\"warn\">") + (alone ? "emulated stages" : "no timeline recorded") +
             "</span>: the measured action times (action_ms) replayed with free messages";
    out += "</figcaption>";
    // Why there is no chart: an untimed run (its one step is the warm-up, which nothing
    // reports), emulated stages without action times to replay, or no timeline at all.
    const bool untimed = run->timed_steps == 0;
    const char* why_none = untimed ? "no timed step: with --steps 1 the only step is the warm-up"
                           : alone ? "no action times to replay"
                                   : "no timeline recorded";
    out += g.source != GanttLayout::Source::none && g.to_ms > g.from_ms ? gantt_svg(rows, g, label)
                                                                         : none_svg("gantt", why_none);

    // Activations over the Gantt's window when it was measured; else over each stage's
    // last step from its own start (emulated stages ran alone), or the whole run.
    std::vector<double> shift(rows.size(), 0.0);
    double from = g.from_ms, to = g.to_ms;
    bool any_memory = false;
    for (const StageRow& row : rows) any_memory = any_memory || !row.view->memory.empty();
    std::string sub = "live activation bytes per stage";
    if (g.source == GanttLayout::Source::measured) {
      for (std::size_t i = 0; i < rows.size(); ++i) shift[i] = g.stages[i].clock_shift_ms;
    } else if (any_memory) {
      bool steps = true;
      from = 0.0, to = 0.0;
      for (std::size_t i = 0; i < rows.size() && steps; ++i) {
        const TimelineSpanRecord* last = last_step(*rows[i].view);
        steps = last != nullptr;
        if (last) shift[i] = -last->start_ms, to = std::max(to, last->end_ms - last->start_ms);
      }
      if (steps) {
        sub += ", over its last step (ms from the step's start on each stage's clock)";
      } else {
        std::fill(shift.begin(), shift.end(), 0.0);
        from = 1e300, to = -1e300;
        for (const StageRow& row : rows)
          if (!row.view->memory.empty())
            from = std::min(from, row.view->memory.front().t_ms), to = std::max(to, row.view->memory.back().t_ms);
        sub += ", over the whole run";
      }
    }
    out += "<div class=\"sub\">" + sub + "</div>";
    out += any_memory && to > from ? activation_svg(rows, shift, from, to, act_max, label)
                                   : none_svg("activation", "no timeline recorded");
    out += "</figure>";
  }
  return out;
}

}  // namespace shardscope::html
