#include "harness/records/json_write.hpp"

#include <string>

namespace shardscope {
namespace {

using nlohmann::json;

template <typename T>
json or_null(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json peak_json(const PeakFigures& p) {
  return {{"total", p.total}, {"phase", p.phase}, {"where", p.where}, {"by_category", to_json(p.by_category)}};
}

json comm_json(const CommFigures& comm) {
  json j = json::object();
  for (int k = 0; k < kCollKindCount; ++k) {
    const CollectiveFigures& c = comm[k];
    j[std::string(kCollKindNames[k])] = {
        {"calls", c.calls},
        {"bytes", c.bytes},
        {"ms", c.ms},
        {"exposed_ms", c.exposed_ms},
        {"busbw_gbps", or_null(c.busbw_gbps)}};
  }
  return j;
}

json time_json(const TimeSummary& t) {
  return {{"median", or_null(t.median)}, {"min", or_null(t.min)}, {"max", or_null(t.max)}};
}

void add_allocator(const AllocatorFigures& a, json& r) {
  r["rounded"] = {{"resting_total", a.rounded_resting_total}, {"peak_total", a.rounded_peak_total}};
  if (a.pool)
    r["pool"] = {{"used_current", a.pool->used_current},
                 {"used_high", a.pool->used_high},
                 {"reserved_current", a.pool->reserved_current},
                 {"reserved_high", a.pool->reserved_high}};
  else
    r["pool"] = nullptr;
  r["outside_pool_bytes"] = or_null(a.outside_pool_bytes);
  r["outside_pool_source"] = or_null(a.outside_pool_source);
  if (!a.outside_pool_parts) {
    r["outside_pool_parts"] = nullptr;
    return;
  }
  const OutsidePoolParts& parts = *a.outside_pool_parts;
  const auto part = [](const MeasuredPartFigures& p) { return json{{"bytes", or_null(p.bytes)}, {"source", p.source}}; };
  json nccl = json::array();
  for (const NcclMemoryFigures& c : parts.nccl)
    nccl.push_back({{"communicator", c.communicator},
                    {"ranks", c.ranks},
                    {"init_bytes", or_null(c.init_bytes)},
                    {"bytes", or_null(c.bytes)},
                    {"source", c.source}});
  r["outside_pool_parts"] = {{"cuda_context", part(parts.cuda_context)},
                             {"cublas", part(parts.cublas)},
                             {"nccl", std::move(nccl)},
                             {"other", or_null(parts.other)}};
}

void add_placement(const std::optional<Placement>& p, json& r) {
  if (!p) return;
  r["local_rank"] = p->local_rank;
  r["device"] = or_null(p->device);
}

// "comm_groups" under --mesh: {"dp": {...}, "tp": {...}, "pp": {...}}.
json comm_groups_json(const std::vector<GroupCommRecord>& groups) {
  json out = json::object();
  for (const GroupCommRecord& g : groups)
    out[g.axis] = {{"world", g.world},
                   {"rank", g.rank},
                   {"members", g.members},
                   {"comm", comm_json(g.comm)},
                   {"comm_bytes", g.comm_bytes},
                   {"predicted_comm_bytes", g.predicted_comm_bytes}};
  return out;
}

}  // namespace

json to_json(const TimelineRecord& t) {
  json j;
  j["unit"] = t.unit;
  j["coalesced"] = t.coalesced;
  j["merged_events"] = t.merged_events;
  j["events"] = t.events;
  j["sample_limit"] = t.sample_limit;
  j["categories"] = kCategoryNames;
  json memory = json::array();
  for (const TimelineRow& row : t.memory) {
    json r = json::array();
    r.push_back(row.t_ms);
    for (std::int64_t v : row.bytes) r.push_back(v);
    memory.push_back(std::move(r));
  }
  json marks = json::array();
  for (const TimelineMark& m : t.marks) marks.push_back({m.t_ms, m.phase, m.place});
  json spans = json::array();
  for (const TimelineSpanRecord& s : t.spans) {
    json span = {{"name", s.name}, {"start_ms", s.start_ms}, {"end_ms", s.end_ms}, {"depth", s.depth}};
    if (s.bytes) span["bytes"] = *s.bytes;
    if (s.track) span["track"] = *s.track;
    spans.push_back(std::move(span));
  }
  j["memory"] = std::move(memory);
  j["marks"] = std::move(marks);
  j["dropped_marks"] = t.dropped_marks;
  j["spans"] = std::move(spans);
  j["dropped_spans"] = t.dropped_spans;
  return j;
}

namespace {

json rank_saved_json(const RankSaved& s) {
  return {{"after_forward_bytes", s.after_forward_bytes}, {"after_forward_tensors", s.after_forward_tensors}};
}

json saved_json(const SavedFigures& s) {
  return {{"peak_live_tensors", s.peak_live_tensors},
          {"peak_live_bytes", s.peak_live_bytes},
          {"total_tensors", s.total_tensors},
          {"before_first_backward", s.before_first_backward}};
}

json layer_range(const LayerRange& r) { return json::array({r[0], r[1]}); }

// A stage's "chunks_layers", left out with one chunk (a run's stage and a plan's alike).
void add_chunks_layers(const std::optional<std::vector<LayerRange>>& chunks, json& stage) {
  if (!chunks) return;
  json all = json::array();
  for (const LayerRange& c : *chunks) all.push_back(layer_range(c));
  stage["chunks_layers"] = std::move(all);
}

void add_place(const RunPlace& p, json& run) {
  run["backend"] = p.backend;
  run["comm"] = p.comm;
  run["emulated"] = p.emulated;
  if (p.rank) run["rank"] = *p.rank;
}

json data_parallel_json(const DataParallelRun& dp) {
  json run;
  run["kind"] = "data_parallel";
  run["strategy"] = dp.strategy;
  run["engine"] = dp.engine;
  run["precision"] = dp.precision;
  if (dp.bf16_gemm) run["bf16_gemm"] = *dp.bf16_gemm;
  run["accumulate"] = dp.accumulate;
  run["no_sync"] = dp.no_sync;
  run["overlap"] = dp.overlap;
  run["world"] = dp.world;
  run["units"] = dp.units;
  run["layers_per_unit"] = dp.layers_per_unit ? json(*dp.layers_per_unit) : json("all");
  run["prefetch"] = dp.prefetch;
  run["ddp_bucket"] = dp.ddp_bucket;
  run["bucket_mb"] = dp.bucket_mb;
  run["steps"] = dp.steps;
  run["timed_steps"] = dp.timed_steps;
  run["seed"] = dp.seed;
  if (dp.shard_group) run["shard_group"] = *dp.shard_group;
  if (dp.mesh) {
    run["mesh"] = {{"dp", dp.mesh->dp}, {"tp", dp.mesh->tp}, {"pp", dp.mesh->pp}};
    if (dp.mesh->sp) run["mesh"]["sp"] = true;
  }
  run["model"] = to_json(dp.model);
  json ranks = json::array();
  for (const RankRecord& r : dp.ranks) ranks.push_back(to_json(r));
  run["ranks"] = std::move(ranks);
  add_place(dp.place, run);
  return run;
}

json pipeline_json(const PipelineRun& pp) {
  json run;
  run["kind"] = "pipeline";
  run["schedule"] = pp.schedule;
  run["precision"] = pp.precision;
  if (!pp.autocast_region.empty()) run["autocast_region"] = pp.autocast_region;
  run["world"] = pp.world;
  run["microbatches"] = pp.microbatches;
  run["chunks"] = pp.chunks;
  run["steps"] = pp.steps;
  run["timed_steps"] = pp.timed_steps;
  run["seed"] = pp.seed;
  run["model"] = to_json(pp.model);
  run["split"] = pp.split;
  run["microbatch_rows"] = pp.microbatch_rows;
  if (pp.mesh) {
    run["mesh"] = {{"dp", pp.mesh->dp}, {"tp", pp.mesh->tp}, {"pp", pp.mesh->pp}};
    if (pp.mesh->sp) run["mesh"]["sp"] = true;
  }
  json stages = json::array();
  for (const StageRecord& s : pp.stages) stages.push_back(to_json(s));
  run["stages"] = std::move(stages);
  run["wall_makespan_ms"] = or_null(pp.wall_makespan_ms);
  run["replayed_makespan_ms"] = or_null(pp.replayed_makespan_ms);
  add_place(pp.place, run);
  return run;
}

json skipped_json(const SkippedRun& s) {
  json record = s.config.is_object() ? s.config : json::object();
  record["skipped"] = true;
  record["reason"] = s.reason;
  return record;
}

}  // namespace

json to_json(const CategoryFigures& b) {
  json j;
  j["total"] = b.total;
  for (int c = 0; c < kCategoryCount; ++c) j[kCategoryNames[c]] = b.bytes[c];
  return j;
}

json to_json(const ModelRecord& m) {
  json j = {{"layers", m.layers},
            {"width", m.width},
            {"params", m.params},
            {"param_tensors", m.param_tensors},
            {"param_bytes", m.param_bytes},
            {"activation", m.activation},
            {"loss", m.loss},
            {"batch", m.batch}};
  if (m.family) j["family"] = *m.family;
  if (m.checkpoint) j["checkpoint"] = *m.checkpoint;
  if (m.shape) {
    const TransformerShapeRecord& s = *m.shape;
    j["shape"] = {{"model_type", s.model_type},
                  {"hidden", s.hidden},
                  {"heads", s.heads},
                  {"kv_heads", s.kv_heads},
                  {"head_dim", s.head_dim},
                  {"ffn", s.ffn},
                  {"vocab", s.vocab},
                  {"seq", s.seq},
                  {"positions", s.positions},
                  {"tied_embeddings", s.tied_embeddings},
                  {"qkv_bias", s.qkv_bias},
                  {"out_bias", s.out_bias},
                  {"attention", s.attention}};
  }
  return j;
}

json to_json(const RankPredicted& p) {
  if (!p.peak_known) {
    json j = {{"resting_total", p.resting_total},
              {"resting", to_json(p.resting)},
              {"peak_total", nullptr},
              {"peak_by_category", nullptr},
              {"peak_phase", nullptr},
              {"peak_where", nullptr},
              {"comm_bytes", p.comm_bytes}};
    if (p.model_states) j["model_states"] = *p.model_states;
    return j;
  }
  json j = {{"resting_total", p.resting_total},
            {"resting", to_json(p.resting)},
            {"peak_total", p.peak_total},
            {"peak_by_category", to_json(p.peak_by_category)},
            {"peak_phase", p.peak_phase},
            {"peak_where", p.peak_where},
            {"comm_bytes", p.comm_bytes}};
  if (p.saved) j["saved"] = rank_saved_json(*p.saved);
  if (p.model_states) j["model_states"] = *p.model_states;
  return j;
}

json to_json(const RankRecord& rank) {
  json r;
  r["rank"] = rank.rank;
  r["resting"] = to_json(rank.resting);
  r["peak"] = peak_json(rank.peak);
  r["predicted"] = to_json(rank.predicted);
  add_allocator(rank.allocator, r);
  r["comm"] = comm_json(rank.comm);
  r["comm_bytes"] = rank.comm_bytes;
  r["step_ms"] = time_json(rank.step_ms);
  r["step_ms_all"] = rank.step_ms_all;
  r["comm_ms"] = time_json(rank.comm_ms);
  r["comm_ms_all"] = rank.comm_ms_all;
  r["comm_exposed_ms"] = time_json(rank.comm_exposed_ms);
  r["comm_exposed_ms_all"] = rank.comm_exposed_ms_all;
  r["loss"] = rank.loss;
  if (rank.timeline) r["timeline"] = to_json(*rank.timeline);
  add_placement(rank.placement, r);
  if (rank.saved) r["saved"] = rank_saved_json(*rank.saved);
  if (rank.comm_groups) r["comm_groups"] = comm_groups_json(*rank.comm_groups);
  return r;
}

json to_json(const StagePredicted& p) {
  json j = saved_json(p.saved);
  j["resting_total"] = p.resting_total;
  j["peak_total"] = p.peak_total;
  j["peak_by_category"] = to_json(p.peak_by_category);
  j["p2p_sent_bytes"] = p.p2p_sent_bytes;
  j["comm_bytes"] = p.comm_bytes;
  j["peak_live_microbatches"] = p.peak_live_microbatches;
  j["peak_live_microbatches_theory"] = p.peak_live_microbatches_theory;
  j["peak_held_microbatches"] = p.peak_held_microbatches;
  j["peak_held_microbatches_theory"] = p.peak_held_microbatches_theory;
  return j;
}

json to_json(const StageRecord& s) {
  json r;
  r["stage"] = s.stage;
  r["rank"] = s.rank;
  r["world"] = s.world;
  r["layers"] = layer_range(s.layers);
  add_chunks_layers(s.chunks_layers, r);
  r["saved"] = saved_json(s.saved);
  r["predicted"] = to_json(s.predicted);
  r["resting"] = to_json(s.resting);
  r["peak"] = peak_json(s.peak);
  add_allocator(s.allocator, r);
  r["p2p"] = {{"sent_bytes", s.p2p_sent_bytes}, {"recv_bytes", s.p2p_recv_bytes}, {"peak_comm_bytes", s.p2p_peak_comm_bytes}};
  if (s.p2p_dtype) r["p2p"]["dtype"] = *s.p2p_dtype;
  r["comm"] = comm_json(s.comm);
  r["comm_bytes"] = s.comm_bytes;
  r["busy_ms"] = or_null(s.busy_ms);
  r["step_ms"] = time_json(s.step_ms);
  r["step_ms_all"] = s.step_ms_all;
  r["actions_end_ms"] = or_null(s.actions_end_ms);
  r["bubble_fraction"] = or_null(s.bubble_fraction);
  r["bubble_fraction_replayed"] = or_null(s.bubble_fraction_replayed);
  r["bubble_fraction_theory"] = s.bubble_fraction_theory;
  if (s.replayed_makespan_ms) r["replayed_makespan_ms"] = *s.replayed_makespan_ms;
  if (s.action_ms) {
    json actions = json::array();
    for (const ActionTime& a : *s.action_ms)
      actions.push_back({{"action", a.action}, {"microbatch", a.microbatch}, {"chunk", a.chunk}, {"ms", a.ms}});
    r["action_ms"] = std::move(actions);
  } else {
    r["action_ms"] = nullptr;
  }
  r["loss"] = or_null(s.loss);
  if (s.timeline) r["timeline"] = to_json(*s.timeline);
  add_placement(s.placement, r);
  if (s.comm_groups) r["comm_groups"] = comm_groups_json(*s.comm_groups);
  return r;
}

json to_json(const RunRecord& run) {
  if (const auto* dp = std::get_if<DataParallelRun>(&run)) return data_parallel_json(*dp);
  if (const auto* pp = std::get_if<PipelineRun>(&run)) return pipeline_json(*pp);
  return skipped_json(std::get<SkippedRun>(run));
}

json to_json(const Provenance& p) {
  return {{"git", or_null(p.git)},   {"command", or_null(p.command)}, {"host", or_null(p.host)},
          {"cpu", or_null(p.cpu)},   {"cores", or_null(p.cores)}, {"gpu", or_null(p.gpu)},         {"blas", or_null(p.blas)},
          {"mpi", or_null(p.mpi)},   {"nccl", or_null(p.nccl)},       {"cuda", or_null(p.cuda)}};
}

namespace {

// A run's header in a plan: the run's fields without what only a run has.
json plan_header(json run) {
  for (const char* key : {"steps", "timed_steps", "seed", "ranks", "stages", "wall_makespan_ms",
                          "replayed_makespan_ms", "backend", "comm", "emulated", "rank"})
    run.erase(key);
  return run;
}

// --fit's answer (a plan without --fit has no "fit", and is written as before);
// `limiting` names the rank ("limiting_rank") or the stage ("limiting_stage").
json fit_json(const FitRecord& fit, const char* limiting) {
  return {{"dimension", fit.dimension},
          {"smallest", fit.smallest},
          {"value", or_null(fit.value)},
          {"peak_bytes", or_null(fit.peak_bytes)},
          {"peak_bytes_next", or_null(fit.peak_bytes_next)},
          {limiting, or_null(fit.limiting)},
          {"resting_bytes", or_null(fit.resting_bytes)},
          {"bound", fit.bound},
          {"reason", fit.reason}};
}

json plan_json(const PlanRecord& plan) {
  if (const auto* dp = std::get_if<DataParallelPlan>(&plan)) {
    json run = plan_header(data_parallel_json(dp->run));
    json groups = json::array();
    for (const RankGroupPlan& g : dp->rank_groups) {
      json group = {{"first", g.first}, {"last", g.last}, {"predicted", to_json(g.predicted)}, {"fits", or_null(g.fits)}};
      if (g.ranks) group["ranks"] = *g.ranks;
      groups.push_back(std::move(group));
    }
    run["rank_groups"] = std::move(groups);
    run["fits_every_rank"] = or_null(dp->fits_every_rank);
    if (dp->fit) run["fit"] = fit_json(*dp->fit, "limiting_rank");
    return run;
  }
  if (const auto* pp = std::get_if<PipelinePlan>(&plan)) {
    json run = plan_header(pipeline_json(pp->run));
    run["bubble_fraction_theory"] = pp->bubble_fraction_theory;
    json stages = json::array();
    for (const StagePlan& s : pp->stages) {
      json stage = {{"stage", s.stage}, {"rank", s.rank}, {"layers", layer_range(s.layers)}};
      if (s.ranks) stage["ranks"] = *s.ranks;
      add_chunks_layers(s.chunks_layers, stage);
      stage["predicted"] = to_json(s.predicted);
      stage["fits"] = or_null(s.fits);
      stages.push_back(std::move(stage));
    }
    run["stages"] = std::move(stages);
    run["fits_every_rank"] = or_null(pp->fits_every_rank);
    if (pp->fit) run["fit"] = fit_json(*pp->fit, "limiting_stage");
    return run;
  }
  return skipped_json(std::get<SkippedRun>(plan));
}

}  // namespace

json to_json(const PlanDocument& plan) {
  json plans = json::array();
  for (const PlanRecord& p : plan.plans) plans.push_back(plan_json(p));
  json doc = {{"schema", kPlanSchema},
              {"version", plan.version},
              {"command", plan.command},
              {"memory_bytes", or_null(plan.memory_bytes)},
              {"not_counted", plan.not_counted},
              {"plans", std::move(plans)}};
  // Only with --overhead: the figure added to every peak for the verdicts, and whose it is.
  if (plan.overhead)
    doc["overhead"] = {{"file", plan.overhead->file},
                       {"bytes", plan.overhead->bytes},
                       {"source", plan.overhead->source},
                       {"taken_from", plan.overhead->taken_from}};
  return doc;
}

json to_json(const ResultDocument& doc) {
  json runs = json::array();
  for (const RunRecord& run : doc.runs) runs.push_back(to_json(run));
  json j = {{"schema", kResultSchema},
            {"version", doc.version},
            {"backend", or_null(doc.backend)},
            {"comm", or_null(doc.comm)},
            {"emulated", doc.emulated ? json(*doc.emulated) : json("mixed")},
            {"provenance", to_json(doc.provenance)},
            {"runs", std::move(runs)}};
  if (doc.sweep) {
    json sweep = {{"jobs", doc.sweep->jobs}, {"skipped", doc.sweep->skipped}, {"complete", doc.sweep->complete}};
    if (doc.sweep->error) sweep["error"] = *doc.sweep->error;
    j["sweep"] = std::move(sweep);
  }
  return j;
}

}  // namespace shardscope
