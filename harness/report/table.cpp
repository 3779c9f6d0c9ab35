#include "harness/report/table.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <variant>

#include "harness/records/json_write.hpp"
#include "harness/report/cells.hpp"
#include "harness/report/record_label.hpp"
#include "harness/report/table_parts.hpp"
#include "harness/report/text_table.hpp"
#include "shardscope/category.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// As `run --units` takes it: "units=1", "units=all" (the trace names processes so too).
std::string units_label(const json* layers_per_unit) {
  if (!layers_per_unit) return {};
  return "units=" + cells::text(layers_per_unit);
}

// A pipeline run: its "kind", else a "stages" or "schedule" field.
bool is_pipeline(const json& run) {
  if (const json* kind = cells::at(run, {"kind"}); kind && kind->is_string())
    return kind->get<std::string>() == "pipeline";
  return run.contains("stages") || run.contains("schedule");
}

// Whether units shape the run (tables::uses_units): true when the strategy is unknown.
bool uses_units(const json& run) {
  const json* s = cells::at(run, {"strategy"});
  const std::optional<StrategyKind> kind = s && s->is_string() ? find_strategy(s->get<std::string>()) : std::nullopt;
  const json* e = cells::at(run, {"engine"});
  if (e && cells::text(e) == "deepspeed") return false;  // one flat group, no units
  return !kind || shards_by_unit(*kind);
}

}  // namespace

bool is_skipped(const json& run) {
  const json* s = cells::at(run, {"skipped"});
  return s && s->is_boolean() && s->get<bool>();
}

std::string run_label(const json& run) {
  std::string label;
  const bool pipeline = is_pipeline(run);
  const json* name = cells::at(run, {pipeline ? "schedule" : "strategy"});
  label += name ? cells::text(name) : (pipeline ? "pipeline" : "data parallel");
  // Under a mesh a pipeline job's world is its D·T·S ranks; its stages are the mesh's pp.
  const json* mesh = cells::at(run, {"mesh"});
  const json* stages = pipeline && mesh ? cells::at(run, {"mesh", "pp"}) : nullptr;
  if (const json* w = stages ? stages : cells::at(run, {"world"})) label += (pipeline ? " S=" : " W=") + cells::text(w);
  if (stages)
    label += " mesh=dp" + cells::text(cells::at(run, {"mesh", "dp"})) + ",tp" + cells::text(cells::at(run, {"mesh", "tp"})) +
             ",pp" + cells::text(stages);
  if (!pipeline) {
    if (const json* k = cells::at(run, {"layers_per_unit"}); k && uses_units(run)) label += " " + units_label(k);
    if (const json* e = cells::at(run, {"engine"}); e && cells::text(e) != "torch") label += " engine=" + cells::text(e);
    if (const json* p = cells::at(run, {"precision"}); p && cells::text(p) != "fp32") label += " precision=" + cells::text(p);
    if (const json* c = cells::at(run, {"model", "checkpoint"})) label += " checkpoint=" + cells::text(c);
    if (const json* a = cells::at(run, {"accumulate"}); a && cells::text(a) != "1") label += " accumulate=" + cells::text(a);
    if (const json* n = cells::at(run, {"no_sync"}); n && n->is_boolean() && n->get<bool>()) label += " no_sync";
  } else {
    if (const json* m = cells::at(run, {"microbatches"})) label += " M=" + cells::text(m);
    if (const json* v = cells::at(run, {"chunks"})) label += " chunks=" + cells::text(v);
    if (const json* p = cells::at(run, {"precision"}); p && cells::text(p) != "fp32") label += " precision=" + cells::text(p);
    if (const json* a = cells::at(run, {"autocast_region"}); a && cells::text(a) != "microbatch")
      label += " autocast_region=" + cells::text(a);
  }
  return label;
}

std::string run_label(const DataParallelRun& run) {
  std::string label = run.strategy + " W=" + std::to_string(run.world);
  if (tables::uses_units(run)) label += " " + tables::units_setting(run);
  if (run.mesh)
    label += " mesh=dp" + std::to_string(run.mesh->dp) + ",tp" + std::to_string(run.mesh->tp) + ",pp" +
             std::to_string(run.mesh->pp) + (run.mesh->sp ? ",sp" : "");
  return label + tables::setting_label(run);
}

std::string run_label(const PipelineRun& run) {
  return run.schedule + " S=" + std::to_string(run.world) + " M=" + std::to_string(run.microbatches) +
         " chunks=" + std::to_string(run.chunks) + (run.precision != "fp32" ? " precision=" + run.precision : "") +
         (run.autocast_region == "step" ? " autocast_region=step" : "");
}

std::string run_label(const RunRecord& run) {
  if (const auto* dp = std::get_if<DataParallelRun>(&run)) return run_label(*dp);
  if (const auto* pp = std::get_if<PipelineRun>(&run)) return run_label(*pp);
  return run_label(std::get<SkippedRun>(run).config);
}

void print_skipped(const std::vector<const SkippedRun*>& skipped, std::ostream& os) {
  if (skipped.empty()) return;
  os << "skipped (the configuration cannot run):\n";
  for (const SkippedRun* s : skipped)
    os << "  " << (is_pipeline(s->config) ? "pipeline " : "data parallel ") << run_label(s->config) << ": "
       << s->reason << '\n';
  os << '\n';
}

std::string bytes_footnote(const TableOptions& options, bool predictions) {
  std::string note = options.exact_bytes ? "Bytes: exact (--bytes exact), as the JSON and CSV hold them."
                                         : "Bytes: binary units (1 KiB = 1024 B), three significant figures; --bytes exact "
                                           "prints them\nto the byte, as the JSON and CSV hold them.";
  if (!options.wide)
    note += predictions ? " \"=\": the prediction equals the measured figure. --wide: every column."
                        : " --wide: every column.";
  return note + "\n";
}

namespace tables {

bool uses_units(const DataParallelRun& run) {
  if (run.engine == "deepspeed") return false;  // one flat group, no units
  const std::optional<StrategyKind> kind = find_strategy(run.strategy);
  return !kind || shards_by_unit(*kind);
}

std::string accumulate_label(const DataParallelRun& run) {
  return (run.accumulate != 1 ? " accumulate=" + std::to_string(run.accumulate) : std::string()) +
         (run.no_sync ? " no_sync" : "");
}

std::string setting_label(const DataParallelRun& run) {
  return (run.shard_group ? " shard_group=" + std::to_string(*run.shard_group) : std::string()) +
         (run.engine != "torch" ? " engine=" + run.engine : std::string()) +
         (run.precision != "fp32" ? " precision=" + run.precision : std::string()) +
         (run.model.checkpoint ? " checkpoint=" + *run.model.checkpoint : std::string()) + accumulate_label(run);
}

std::string units_setting(const DataParallelRun& run) {
  return "units=" + (run.layers_per_unit ? std::to_string(*run.layers_per_unit) : std::string("all"));
}

std::string fixed(const std::optional<double>& v, int decimals) {
  if (!v) return cells::kMissing;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, *v);
  return buf;
}

std::string percent(const std::optional<double>& v) {
  if (!v) return cells::kMissing;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * *v);
  return buf;
}

std::string multiple(std::int64_t bytes, std::int64_t base) {
  if (base == 0) return cells::kMissing;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(bytes) / static_cast<double>(base));
  return buf;
}

std::string predicted_bytes(std::int64_t predicted, std::int64_t measured, const TableOptions& options) {
  const bool differs = measured != predicted;
  if (!options.wide && !differs) return cells::kSame;
  return cells::bytes(predicted, options) + (differs ? " !" : "");
}

std::string measured_bytes(std::int64_t measured, std::int64_t predicted, const TableOptions& options) {
  std::string cell = cells::bytes(measured, options);
  if (measured != predicted) cell += " ! " + cells::bytes(predicted, options);
  return cell;
}

std::string model_line(const ModelRecord& model, bool batch_per_rank, const TableOptions& options) {
  std::string line;
  if (model.shape) {
    // "llama-3 style": the family, its model_type when another, then the shape.
    const TransformerShapeRecord& s = *model.shape;
    const std::string family = model.family.value_or(s.model_type);
    line = family + (s.model_type != family ? " (" + s.model_type + ")" : "") + ", " + std::to_string(model.layers) +
           " layers x hidden " + std::to_string(s.hidden);
    line += ", heads " + std::to_string(s.heads) + (s.kv_heads != s.heads ? " (kv " + std::to_string(s.kv_heads) + ")" : "");
    line += ", ffn " + std::to_string(s.ffn) + ", vocab " + std::to_string(s.vocab);
    line += s.tied_embeddings ? " (tied)" : "";
    line += ", seq " + std::to_string(s.seq) + ", attention " + s.attention;
    line += ", batch " + std::to_string(model.batch) + (model.batch == 1 ? " sequence" : " sequences") +
            (batch_per_rank ? "/rank" : "");
  } else {
    line = std::to_string(model.layers) + " x " + std::to_string(model.width);
    line += ", activation " + model.activation;
    line += ", loss " + model.loss;
    line += ", batch " + std::to_string(model.batch) + (batch_per_rank ? "/rank" : "");
  }
  if (model.checkpoint) line += ", checkpoint " + *model.checkpoint;
  line += ", P = " + cells::group_digits(model.params) + " params";
  line += ", 4P = " + (options.exact_bytes ? cells::group_digits(model.param_bytes) + " B"
                                           : cells::bytes(model.param_bytes, options));
  return line;
}

std::string wrap_text(const std::string& text, const std::string& sep, std::size_t width, const std::string& indent) {
  const auto trimmed = [](std::string s) {
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s;
  };
  std::string out, line;
  bool holds_a_part = false;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t end = text.find(sep, at);
    end = end == std::string::npos ? text.size() : end + sep.size();  // the separator stays with its part
    const std::string part = text.substr(at, end - at);
    if (holds_a_part && line.size() + trimmed(part).size() > width) {
      out += trimmed(line) + "\n";
      line = indent;
      holds_a_part = false;
    }
    line += part;
    holds_a_part = true;
    at = end;
  }
  return out + trimmed(line);
}

std::string title_lines(const std::string& title, const TableOptions& options) {
  return options.wide ? title : wrap_text(title, ", ", TableOptions::kColumns, "  ");
}

std::string mesh_title(const std::optional<MeshRecord>& mesh) {
  if (!mesh) return "";
  return " (mesh dp=" + std::to_string(mesh->dp) + ",tp=" + std::to_string(mesh->tp) + ",pp=" + std::to_string(mesh->pp) +
         (mesh->sp ? ", --sp" : "") + ")";
}

std::string setup_line(const RunPlace& place) {
  std::string line = "backend " + place.backend + ", comm " + place.comm;
  if (place.emulated) line += ", emulated (times are compute only)";
  return line;
}

std::string cores_note(int world, const ResultDocument& doc) {
  const std::optional<std::int64_t> cores = doc.provenance.cores;
  if (!cores || *cores <= 0 || world <= *cores) return {};
  return "  " + std::to_string(world) + " ranks share " + std::to_string(*cores) + (*cores == 1 ? " core" : " cores") +
         " here: a rank waits for a core, so these times are longer than with a core per rank\n";
}

std::vector<std::string> step_spread(const TimeSummary& step, const std::vector<double>& all) {
  std::string max = fixed(step.max, 3);
  // Files written before step_ms.max: the largest timed step (the first is warm-up).
  if (!step.max && all.size() >= 2) max = fixed(*std::max_element(all.begin() + 1, all.end()), 3);
  return {fixed(step.min, 3), fixed(step.median, 3), max};
}

bool same_group(const ModelRecord& a, const ModelRecord& b) {
  const auto shape = [](const ModelRecord& m) { return to_json(m).value("shape", nlohmann::json()); };
  return a.layers == b.layers && a.width == b.width && a.params == b.params && a.param_tensors == b.param_tensors &&
         a.param_bytes == b.param_bytes && a.activation == b.activation && a.loss == b.loss && a.batch == b.batch &&
         a.family == b.family && shape(a) == shape(b);
}

void print_live_at_peak(const std::vector<std::string>& head_names, const std::vector<LiveRow>& rows,
                        const TableOptions& options, std::ostream& os) {
  std::vector<int> live;
  for (int c = 0; c < kCategoryCount; ++c)
    for (const LiveRow& row : rows)
      if (row.measured && row.measured->bytes[c] != 0) {
        live.push_back(c);
        break;
      }
  if (live.empty()) return;
  std::vector<std::string> cols = head_names;
  for (const int c : live) cols.emplace_back(kCategoryNames[c]);
  std::vector<Align> align(cols.size(), Align::right);
  std::fill(align.begin(), align.begin() + static_cast<std::ptrdiff_t>(head_names.size()), Align::left);
  TextTable table(cols, align);
  for (const LiveRow& row : rows) {
    std::vector<std::string> line = row.head;
    for (const int c : live)
      line.push_back(row.measured ? measured_bytes(row.measured->bytes[c], row.predicted->bytes[c], options)
                                  : cells::kMissing);
    table.add_row(std::move(line));
  }
  os << "  live at the peak, bytes per category (a figure that differs from its prediction is followed by\n"
        "  \"! predicted\")\n";
  // The category names are the table's widest cells: their columns, not the figures, set
  // the width.
  table.print(os, 2);
  os << '\n';
}

namespace {

std::string part_cell(const std::optional<std::int64_t>& bytes, const TableOptions& options) {
  return bytes ? cells::bytes(*bytes, options) : std::string("not measured");
}

// "world (2 ranks) 412 MiB, 204 MiB at init"; communicators joined by "; ".
std::string nccl_cell(const std::vector<NcclMemoryFigures>& nccl, const TableOptions& options) {
  if (nccl.empty()) return "none";
  std::string out;
  for (const NcclMemoryFigures& c : nccl) {
    out += (out.empty() ? "" : "; ") + c.communicator + " (" + std::to_string(c.ranks) +
           (c.ranks == 1 ? " rank) " : " ranks) ") + part_cell(c.bytes, options);
    if (c.init_bytes && c.init_bytes != c.bytes) out += ", " + cells::bytes(*c.init_bytes, options) + " at init";
  }
  return out;
}

}  // namespace

void print_outside_pool(const std::vector<std::string>& head_names, const std::vector<OutsideRow>& rows,
                        const TableOptions& options, std::ostream& os) {
  const bool any = std::any_of(rows.begin(), rows.end(), [](const OutsideRow& r) {
    return r.figures && (r.figures->outside_pool_bytes || r.figures->outside_pool_parts);
  });
  if (!any) return;
  std::vector<std::string> cols = head_names;
  for (const char* c : {"outside the pool B", "source", "CUDA context", "cuBLAS", "NCCL", "other"}) cols.push_back(c);
  std::vector<Align> align(cols.size(), Align::right);
  std::fill(align.begin(), align.begin() + static_cast<std::ptrdiff_t>(head_names.size()), Align::left);
  align[head_names.size() + 1] = Align::left;
  align[head_names.size() + 4] = Align::left;
  TextTable table(cols, align);
  for (const OutsideRow& row : rows) {
    std::vector<std::string> line = row.head;
    const AllocatorFigures* a = row.figures;
    line.push_back(a && a->outside_pool_bytes ? cells::bytes(*a->outside_pool_bytes, options) : cells::kMissing);
    line.push_back(a && a->outside_pool_source ? *a->outside_pool_source : cells::kMissing);
    if (a && a->outside_pool_parts) {
      const OutsidePoolParts& p = *a->outside_pool_parts;
      line.push_back(part_cell(p.cuda_context.bytes, options));
      line.push_back(part_cell(p.cublas.bytes, options));
      line.push_back(nccl_cell(p.nccl, options));
      line.push_back(p.other ? cells::bytes(*p.other, options) : cells::kMissing);
    } else {
      line.resize(cols.size(), cells::kMissing);
    }
    table.add_row(std::move(line));
  }
  os << "  device memory outside the pool, per rank (the CUDA context, cuBLAS, NCCL per communicator, each\n"
        "  measured as it was made; other: the rest, e.g. kernels loaded at their first launch)\n";
  table.print(os, 2);
  os << '\n';
}

// "0-3" for [first, last].
std::string layer_range(const LayerRange& r) { return std::to_string(r[0]) + "-" + std::to_string(r[1]); }

std::string stage_layers(const LayerRange& layers, const std::optional<std::vector<LayerRange>>& chunks_layers) {
  if (!chunks_layers || chunks_layers->size() < 2) return layer_range(layers);
  std::string out;
  for (const LayerRange& range : *chunks_layers) out += (out.empty() ? "" : ",") + layer_range(range);
  return out;
}

std::string stage_layers(const StageRecord& stage) { return stage_layers(stage.layers, stage.chunks_layers); }

}  // namespace tables

void print_tables(const ResultDocument& doc, std::ostream& os, const TableOptions& options) {
  if (doc.runs.empty()) {
    os << "(no runs)\n";
    return;
  }
  std::vector<const DataParallelRun*> data_parallel;
  std::vector<const PipelineRun*> pipeline;
  std::vector<const SkippedRun*> skipped;
  for (const RunRecord& run : doc.runs) {
    if (const auto* dp = std::get_if<DataParallelRun>(&run)) data_parallel.push_back(dp);
    else if (const auto* pp = std::get_if<PipelineRun>(&run)) pipeline.push_back(pp);
    else skipped.push_back(&std::get<SkippedRun>(run));
  }
  if (!data_parallel.empty()) tables::print_data_parallel_tables(data_parallel, doc, options, os);
  if (!pipeline.empty()) tables::print_pipeline_tables(pipeline, doc, options, os);
  print_skipped(skipped, os);
  if (!data_parallel.empty() || !pipeline.empty()) os << bytes_footnote(options);
}

}  // namespace shardscope
