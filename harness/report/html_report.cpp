#include "harness/report/html_report.hpp"

#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "harness/records/result.hpp"
#include "harness/report/cells.hpp"
#include "harness/report/html_charts.hpp"
#include "harness/report/html_svg.hpp"
#include "harness/report/table.hpp"
#include "harness/report/table_parts.hpp"

namespace shardscope {
namespace {

using html::escape;

// System fonts only: nothing is fetched.
constexpr const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,"DejaVu Sans",sans-serif;
 margin:20px 28px;color:#222;background:#fff;max-width:1400px;font-size:14px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #ddd;padding-bottom:3px}
h3{font-size:15px;margin:18px 0 4px}.meta{color:#555;margin:2px 0}
pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace;font-size:12px;
 background:#f7f7f7;border:1px solid #e4e4e4;padding:8px;overflow-x:auto}
pre.cmd{white-space:pre-wrap;word-break:break-all}
.warn{color:#b00020}div.warn{border:1px solid #b00020;padding:6px 8px;margin:8px 0;background:#fff4f4}
.legend{margin:4px 0 6px;font-size:12px}.key{margin-right:14px;white-space:nowrap}
.key i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px;border:1px solid #0002}
.key b.tick{display:inline-block;width:14px;height:0;border-top:3px solid #111;margin-right:4px;vertical-align:3px}
.key b.dash{display:inline-block;width:14px;height:0;border-top:2px dashed #111;margin-right:4px;vertical-align:3px}
.note{color:#555;font-size:12px;margin:2px 0 6px}.sub{color:#555;font-size:12px;margin:6px 0 0 4px}
svg{max-width:100%;height:auto;display:block}svg text{font-size:11px;fill:#333}
svg .yl{text-anchor:end;font-size:10px;fill:#666}svg .xl{text-anchor:middle;font-size:10px;fill:#666}
svg .small{font-size:10.5px}svg .tiny{font-size:9px;fill:#777}svg .strong{font-weight:600;font-size:12px}
svg .none{font-size:13px;fill:#999}svg .actl{font-size:9.5px;fill:#fff}svg .peakat{fill:#8a1c1c}
.panels{display:flex;flex-wrap:wrap;gap:6px 18px}figure{margin:6px 0 10px}figcaption{font-size:12.5px;margin-bottom:2px}
)";

std::string phase_legend() {
  std::string out = "<div class=\"legend\">phases (strip under each chart): ";
  for (const char* p : {"forward", "backward", "optimizer", "communication"})
    out += std::string("<span class=\"key\"><i style=\"background:") + html::phase_color(p) + "\"></i>" + p + "</span>";
  return out + "<span class=\"key\"><b class=\"dash\"></b>predicted peak</span></div>";
}

std::string text(const std::optional<std::string>& v) { return v ? *v : cells::kMissing; }

std::string header(const ResultDocument& doc, const std::string& command) {
  const Provenance& p = doc.provenance;
  std::string out = "<h1>shardscope report</h1><p class=\"meta\">shardscope " + escape(doc.version) + " · git " +
                    escape(text(p.git)) + " · host " + escape(text(p.host)) + " · " + escape(text(p.cpu));
  if (p.gpu) out += " · " + escape(*p.gpu);
  out += " · backend " + escape(text(doc.backend)) + ", comm " + escape(text(doc.comm));
  if (doc.emulated && *doc.emulated) out += " · emulated (times are compute only)";
  out += "</p><pre class=\"cmd\">$ " + escape(command) + "</pre>";
  if (doc.sweep && !doc.sweep->complete)
    out += "<div class=\"warn\">Incomplete: a run failed and the sweep stopped; this report shows what completed. " +
           escape(text(doc.sweep->error)) + "</div>";
  return out;
}

std::string data_parallel_section(const std::vector<const DataParallelRun*>& runs) {
  std::string out = "<h2 id=\"data-parallel\">Data parallel</h2>";
  for (const auto& group : tables::group_runs(runs)) {
    const DataParallelRun& first = *group.front();
    out += "<section class=\"dp-group\"><h3>data parallel, W = " + escape(std::to_string(first.world)) + ": " +
           escape(tables::model_line(first.model, true, TableOptions{true, true})) + "</h3><p class=\"note\">" +
           escape(tables::setup_line(first.place) + tables::steps_note(group)) + "</p>";
    out += "<div class=\"sub\">bytes per rank: R at rest after the step, P at the peak, by category; the black "
           "tick is the predicted total</div>" +
           html::category_legend() + html::data_parallel_bars(group);
    out += "<div class=\"sub\">bytes over the run, per rank (one scale for every chart of this world)</div>" +
           html::category_legend() + phase_legend() + html::data_parallel_timelines(group) + "</section>";
  }
  return out;
}

std::string pipeline_section(const std::vector<const PipelineRun*>& runs) {
  std::string out = "<h2 id=\"pipeline\">Pipeline</h2>";
  for (const auto& group : tables::group_runs(runs)) {
    const PipelineRun& first = *group.front();
    out += "<section class=\"pp-group\"><h3>pipeline, S = " + escape(std::to_string(first.world)) + " stages: " +
           escape(tables::model_line(first.model, false, TableOptions{true, true})) + "</h3><p class=\"note\">" +
           escape(tables::setup_line(first.place) + tables::steps_note(group)) + "</p>" + html::action_legend() +
           html::pipeline_charts(group) + "</section>";
  }
  return out;
}

}  // namespace

std::string render_html_report(const ResultDocument& doc, const std::string& command) {
  std::vector<const DataParallelRun*> data_parallel;
  std::vector<const PipelineRun*> pipeline;
  for (const RunRecord& run : doc.runs) {
    if (const auto* dp = std::get_if<DataParallelRun>(&run)) data_parallel.push_back(dp);
    else if (const auto* pp = std::get_if<PipelineRun>(&run)) pipeline.push_back(pp);
  }
  std::string cmd = command;
  if (cmd.empty()) cmd = text(doc.provenance.command);

  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
                    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
                    "<title>shardscope report</title><style>";
  out += kStyle;
  out += "</style></head><body>\n";
  // Shared by every Gantt: the hatch that shades a stage's idle time.
  out += "<svg width=\"0\" height=\"0\" style=\"position:absolute\" aria-hidden=\"true\"><defs>"
         "<pattern id=\"hatch\" width=\"5\" height=\"5\" patternUnits=\"userSpaceOnUse\" "
         "patternTransform=\"rotate(45)\"><rect width=\"5\" height=\"5\" fill=\"#f4f4f4\"/>"
         "<rect width=\"2\" height=\"5\" fill=\"#c9c9c9\"/></pattern></defs></svg>\n";
  out += header(doc, cmd);
  out += "<p class=\"meta\">";
  if (!data_parallel.empty()) out += "<a href=\"#data-parallel\">Data parallel</a> · ";
  if (!pipeline.empty()) out += "<a href=\"#pipeline\">Pipeline</a> · ";
  out += "<a href=\"#tables\">Tables</a></p>\n";
  if (data_parallel.empty() && pipeline.empty()) out += "<p class=\"note\">No completed runs.</p>";
  if (!data_parallel.empty()) out += data_parallel_section(data_parallel) + "\n";
  if (!pipeline.empty()) out += pipeline_section(pipeline) + "\n";
  std::ostringstream tables;
  print_tables(doc, tables, TableOptions{true, true});  // a page has room for every byte
  out += "<h2 id=\"tables\">Tables</h2><pre class=\"tables\">" + escape(tables.str()) + "</pre>\n";
  out += "<p class=\"note\">Written by shardscope: one self-contained file (inline SVG, no scripts, no network). "
         "Hover a bar, an action or a peak marker for its exact figures.</p>\n</body></html>\n";
  return out;
}

}  // namespace shardscope
