// Pipeline runs (docs/design.md §4, §7): validation, the run header, one stage's record, and
// the replayed bubbles filled in once every stage's record is gathered.
#include "harness/pipeline/run_pipeline.hpp"

#include "harness/run/memory_check.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <tuple>

#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/predict/workspace_forms.hpp"
#include "harness/records/json_write.hpp"
#include "harness/run/records.hpp"
#include "shardscope/check.hpp"
#include "shardscope/mesh.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {

void stage_layers(const PipelineLayout& layout, int stage, LayerRange* layers,
                  std::optional<std::vector<LayerRange>>* chunks_layers) {
  const Schedule& sched = layout.schedule;
  auto range = [&](int vstage) { return LayerRange{layout.first_layer(vstage), layout.end_layer(vstage) - 1}; };
  *layers = range(vstage_of(sched, stage, 0));
  chunks_layers->reset();
  if (layout.chunks() > 1) {
    chunks_layers->emplace();
    for (int c = 0; c < layout.chunks(); ++c) (*chunks_layers)->push_back(range(vstage_of(sched, stage, c)));
  }
}

void add_stage_layers(const PipelineLayout& layout, int stage, nlohmann::json& record) {
  StageRecord r;
  stage_layers(layout, stage, &r.layers, &r.chunks_layers);
  const nlohmann::json j = to_json(r);
  record["layers"] = j["layers"];
  if (j.contains("chunks_layers")) record["chunks_layers"] = j["chunks_layers"];
}

StagePredicted stage_predicted(const StageForms& forms, const Schedule& sched, int s) {
  StagePredicted p;
  p.saved = {forms.saved.peak_live_tensors, forms.saved.peak_live_bytes, forms.saved.total_tensors,
             forms.saved.before_first_backward};
  p.resting_total = forms.resting.total();
  p.peak_total = forms.peak.total();
  p.peak_by_category = category_figures(forms.peak);
  // Sent, and as many received: p2p.sent_bytes, p2p.recv_bytes; comm_bytes is both, the
  // tied embedding's all-reduce on the first and last stage, and under --mesh dp=D the
  // gradients' all-reduce over the data-parallel group.
  p.p2p_sent_bytes = forms.p2p_sent_bytes;
  p.comm_bytes = forms.comm_bytes();
  // From F to B (docs/design.md §4's theory), and until the last backward action, which is how
  // long saved tensors stay (differs for zb-h1): counted on the schedule's lists beside
  // their formulas.
  p.peak_live_microbatches = peak_live_microbatches(sched, s);
  p.peak_live_microbatches_theory = peak_live_microbatches_theory(sched, s);
  p.peak_held_microbatches = peak_held_microbatches(sched, s);
  p.peak_held_microbatches_theory = peak_held_microbatches_theory(sched, s);
  return p;
}

nlohmann::json stage_prediction_json(const StageForms& forms, const Schedule& sched, int s) {
  return to_json(stage_predicted(forms, sched, s));
}

void validate_pipeline(const RunConfig& cfg, int stages) { (void)pipeline_shape(cfg, stages); }

PipelineRun pipeline_run(const RunConfig& cfg, int stages) {
  const PipelineShape shape = pipeline_shape(cfg, stages);
  PipelineRun run;
  run.schedule = std::string(schedule_name(shape.schedule));
  run.precision = std::string(precision_name(cfg.precision));
  if (cfg.model.autocast) run.autocast_region = cfg.model.autocast_step ? "step" : "microbatch";
  run.world = stages;
  run.microbatches = shape.microbatches;
  run.chunks = shape.chunks;
  run.steps = cfg.steps;
  run.timed_steps = timed_steps(cfg.steps);
  run.seed = cfg.seed;
  run.model = model_record(cfg.model);
  run.split = shape.split;
  run.microbatch_rows = tensor_split_sizes(cfg.model.batch, shape.microbatches);
  if (cfg.mesh.given) run.mesh = MeshRecord{cfg.mesh.dp, cfg.mesh.tp, cfg.mesh.pp, cfg.model.sequence_parallel};
  return run;
}

nlohmann::json pipeline_header(const RunConfig& cfg, int stages) {
  nlohmann::json run = to_json(RunRecord(pipeline_run(cfg, stages)));
  for (const char* key : {"stages", "wall_makespan_ms", "replayed_makespan_ms", "backend", "comm", "emulated"})
    run.erase(key);
  return run;
}

StageRecord run_pipeline(const RunConfig& cfg, Backend& backend, Communicator& world_comm) {
  // Under --mesh dp=D,pp=S the schedule runs inside the rank's pipeline group and the
  // gradients are averaged over its data-parallel group; without a mesh the world is the
  // pipeline.
  std::optional<MeshComms> mesh;
  if (cfg.mesh.given) mesh = make_mesh_comms(world_comm, cfg.mesh);
  Communicator& comm = mesh ? mesh->group(MeshAxis::pp) : world_comm;
  Communicator* dp = mesh ? &mesh->group(MeshAxis::dp) : nullptr;
  Communicator* tp = mesh ? &mesh->group(MeshAxis::tp) : nullptr;
  const int s = comm.rank();
  // The closed forms first, from the flags alone: the memory check compares their peak
  // before the stage builds its schedule, program or anything of the model's size.
  const PipelineShape shape = pipeline_shape(cfg, comm.world());
  StageForms forms = predict_pipeline_stage(shape, s, dp ? dp->world() : 1);
  add_backend_workspace(forms, backend.name());
  const std::int64_t predicted_peak = forms.peak.total();
  check_memory(predicted_peak, backend, comm.rank());
  // Untracked host bookkeeping grows with the schedule (every stage's action list, its
  // lowering and validation) and with what the executor keeps per live micro-batch and
  // layer (tapes, saved-tensor entries). Per-unit figures measured on x86-64,
  // rounded up.
  const std::int64_t M = shape.microbatches, forwards = static_cast<std::int64_t>(shape.stages) * shape.chunks * M;
  std::int64_t layers_here = 0;  // over the stage's chunks
  for (int c = 0; c < shape.chunks; ++c)
    layers_here += shape.split[static_cast<std::size_t>(placed_vstage(shape.schedule, shape.stages, s, c))];
  const std::int64_t stage_forwards = static_cast<std::int64_t>(shape.chunks) * M;
  const std::int64_t bookkeeping = 6'144 * stage_forwards + 256 * M * layers_here + 512 * forwards;
  if (backend.device_free_bytes() < 0)
    check_host_memory(predicted_peak + bookkeeping, comm.rank(), "predicted peak plus estimated schedule bookkeeping");
  else
    check_host_memory(bookkeeping, comm.rank(), "estimated schedule bookkeeping on the host");

  PipelineStage stage(cfg, backend, comm, make_pipeline_layout(shape), dp, tp);
  const PipelineLayout& layout = stage.layout();
  const Schedule& sched = layout.schedule;
  const StagePredicted predicted = stage_predicted(forms, sched, s);
  {
    ScopedRange range(backend, "setup");
    stage.setup();
  }

  std::vector<double> step_ms;
  std::vector<double> losses;
  for (int i = 0; i < cfg.steps; ++i) {
    stage.prepare_batch(i);
    backend.synchronize();
    world_comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const float loss = stage.step();
    backend.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    losses.push_back(loss);
  }

  const Tracker& tr = backend.tracker();
  const SavedTensors& saved = stage.saved();
  StageRecord r;
  r.stage = s;
  r.rank = world_comm.rank();
  r.world = comm.world();
  shardscope::stage_layers(layout, s, &r.layers, &r.chunks_layers);
  r.saved = {saved.peak_live(), saved.peak_live_bytes(), saved.total(), saved.before_first_backward()};
  r.predicted = predicted;
  r.resting = category_figures(tr.current());
  r.peak = peak_figures(tr.peak(), stage.peak_where());
  r.allocator = allocator_figures(backend);
  const CommLedger& ledger = comm.ledger();
  r.p2p_sent_bytes = ledger[CollKind::send].bytes;
  r.p2p_recv_bytes = ledger[CollKind::recv].bytes;
  r.p2p_peak_comm_bytes = stage.peak_comm_bytes();
  if (stage.p2p_dtype() == DType::bf16) r.p2p_dtype = "bf16";
  r.comm = comm_figures(ledger, comm.world(), comm.emulated());
  // A pipeline's only all-reduce is the tied embedding's, between two ranks (its first
  // and last stage): nccl-tests' factor for a world of 2.
  {
    CommFigures pair = comm_figures(ledger, 2, comm.emulated());
    const int k = static_cast<int>(CollKind::all_reduce);
    r.comm[k] = pair[k];
  }
  r.comm_bytes = ledger.total_bytes();
  if (mesh) {
    // "comm" sums the groups' ledgers (the pair's busbw kept for the tied all-reduce is
    // the pipeline group's when no other group all-reduces; the data-parallel and
    // tensor-parallel groups' busbw are in comm_groups).
    const CommLedger sum = summed_ledger(*mesh);
    const int k = static_cast<int>(CollKind::all_reduce);
    const CommFigures pair = r.comm;
    r.comm = comm_figures(sum, world_comm.world(), true);
    if (dp->world() == 1 && tp->world() == 1) r.comm[k] = pair[k];
    r.comm_bytes = sum.total_bytes();
    const std::array<std::int64_t, kMeshAxes> axis_bytes = {forms.dp_all_reduce_bytes, forms.tp_all_reduce_bytes,
                                                            forms.pp_comm_bytes()};
    r.comm_groups.emplace();
    for (int a = 0; a < kMeshAxes; ++a)
      r.comm_groups->push_back(group_record(*mesh, static_cast<MeshAxis>(a), world_comm.rank(),
                                            axis_bytes[static_cast<std::size_t>(a)]));
  }

  double busy = 0.0;
  std::vector<ActionTime> actions;
  for (const ActionTiming& t : stage.action_ms()) {
    busy += t.ms;
    actions.push_back({action_name(t.action.kind), t.action.microbatch, t.action.chunk, t.ms});
  }
  // Action times are the last step's. With one step that step is the warm-up, which
  // nothing reports as a time (docs/design.md §6): busy, bubbles and action times are null then.
  const bool timed = step_ms.size() >= 2;
  if (timed) r.busy_ms = busy;
  r.step_ms = time_summary(step_ms);
  r.step_ms_all = step_ms;
  // The wall-clock bubble needs every stage's end (fill_wall_bubbles, once all stages
  // are gathered); it means nothing for an emulated stage, whose peers never ran. The
  // replayed one likewise (fill_replayed_bubbles).
  if (timed) r.actions_end_ms = stage.actions_end_ms();
  r.bubble_fraction_theory = bubble_theory(sched);
  if (timed) r.action_ms = std::move(actions);
  if (stage.holds_loss()) r.loss = losses;
  if (tr.recording()) r.timeline = timeline_record(tr.timeline());
  return r;
}

void fill_bubbles(const RunConfig& cfg, bool wall, PipelineRun& run) {
  // Without a mesh the records are one pipeline; under --mesh each data-parallel replica
  // is one (the ranks of a pp group: the same dp and tp coordinates), and the run's
  // makespans are the longest replica's.
  std::map<std::pair<int, int>, std::vector<std::size_t>> replicas;
  for (std::size_t i = 0; i < run.stages.size(); ++i) {
    const MeshCoord c = cfg.mesh.given ? cfg.mesh.coord(run.stages[i].rank) : MeshCoord{};
    replicas[{c.dp, c.tp}].push_back(i);
  }
  for (const auto& [key, members] : replicas) {
    std::vector<StageRecord> one;
    for (std::size_t i : members) one.push_back(std::move(run.stages[i]));
    const std::optional<double> w = wall ? fill_wall_bubbles(one) : std::nullopt;
    const std::optional<double> r = fill_replayed_bubbles(cfg, one);
    if (w) run.wall_makespan_ms = std::max(run.wall_makespan_ms.value_or(0.0), *w);
    if (r) run.replayed_makespan_ms = std::max(run.replayed_makespan_ms.value_or(0.0), *r);
    for (std::size_t k = 0; k < members.size(); ++k) run.stages[members[k]] = std::move(one[k]);
  }
}

std::optional<double> fill_wall_bubbles(std::vector<StageRecord>& stages) {
  if (stages.empty()) return std::nullopt;
  const int S = static_cast<int>(stages.size());
  double makespan = 0.0;
  for (const StageRecord& st : stages) {
    // One stage of a larger (emulated) pipeline, or an untimed stage: nothing to say.
    if (st.world != S || !st.actions_end_ms || !st.busy_ms) return std::nullopt;
    makespan = std::max(makespan, *st.actions_end_ms);
  }
  if (makespan <= 0.0) return std::nullopt;
  for (StageRecord& st : stages) st.bubble_fraction = 1.0 - *st.busy_ms / makespan;
  return makespan;
}

std::optional<double> fill_replayed_bubbles(const RunConfig& cfg, std::vector<StageRecord>& stages) {
  if (stages.empty()) return std::nullopt;
  const int S = static_cast<int>(stages.size());
  // An emulated run reports one stage of a larger pipeline: nothing to replay.
  for (const StageRecord& st : stages)
    if (st.world != S) return std::nullopt;
  std::vector<StageRecord*> by_stage(S, nullptr);
  for (StageRecord& st : stages) {
    if (st.stage < 0 || st.stage >= S || by_stage[st.stage]) return std::nullopt;
    by_stage[st.stage] = &st;
  }
  const Schedule sched = make_schedule(cfg.schedule.value(), S, pipeline_microbatches(cfg, S), cfg.chunks);
  // (stage, kind, micro-batch, chunk) -> measured ms
  std::map<std::tuple<int, char, int, int>, double> ms;
  for (int st = 0; st < S; ++st) {
    if (!by_stage[st]->action_ms) return std::nullopt;
    for (const ActionTime& a : *by_stage[st]->action_ms)
      ms[{st, a.action.empty() ? '\0' : a.action[0], a.microbatch, a.chunk}] = a.ms;
  }
  for (int st = 0; st < S; ++st)
    for (const Action& a : sched.actions[st])
      if (!ms.count({st, action_name(a.kind)[0], a.microbatch, a.chunk})) return std::nullopt;
  const ReplayResult r = replay(sched, [&](int st, const Action& a) {
    return ms.at({st, action_name(a.kind)[0], a.microbatch, a.chunk});
  });
  for (int st = 0; st < S; ++st) {
    by_stage[st]->bubble_fraction_replayed = r.bubble_fraction[st];
    by_stage[st]->replayed_makespan_ms = r.makespan;
  }
  return r.makespan;
}

}  // namespace shardscope
