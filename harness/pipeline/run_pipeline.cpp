// Pipeline runs (docs/design.md §4, §7): validation, the run header, one stage's record, and
// the replayed bubbles filled in once every stage's record is gathered.
#include "harness/pipeline/run_pipeline.hpp"

#include "harness/run/memory_check.hpp"

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <tuple>

#include "harness/pipeline/peak_walk.hpp"
#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/run/records.hpp"
#include "shardscope/check.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {

namespace {

nlohmann::json layer_range(const PipelineLayout& layout, int vstage) {
  return nlohmann::json::array({layout.first_layer(vstage), layout.end_layer(vstage) - 1});
}

}  // namespace

void add_stage_layers(const PipelineLayout& layout, int stage, nlohmann::json& record) {
  const Schedule& sched = layout.schedule;
  record["layers"] = layer_range(layout, vstage_of(sched, stage, 0));
  if (layout.chunks() > 1) {
    nlohmann::json all = nlohmann::json::array();
    for (int c = 0; c < layout.chunks(); ++c) all.push_back(layer_range(layout, vstage_of(sched, stage, c)));
    record["chunks_layers"] = all;
  }
}

StageForms stage_forms(const PipelineShape& shape, int s, const PipelineLayout* layout) {
  StageForms forms = predict_pipeline_stage(shape, s);
  if (shape.schedule == "interleaved-1f1b") {
    SHARDSCOPE_REQUIRE(layout != nullptr, "stage_forms: interleaved-1f1b's peak needs the layout");
    forms.peak = walk_peak(shape.model, *layout, s, lower(layout->schedule).at(s), forms.resting);
  }
  return forms;
}

nlohmann::json stage_prediction_json(const StageForms& forms, const Schedule& sched, int s) {
  return {{"peak_live_tensors", forms.saved.peak_live_tensors},
          {"peak_live_bytes", forms.saved.peak_live_bytes},
          {"total_tensors", forms.saved.total_tensors},
          {"before_first_backward", forms.saved.before_first_backward},
          {"resting_total", forms.resting.total()},
          {"peak_total", forms.peak.total()},
          {"peak_by_category", category_json(forms.peak)},
          // Sent, and as many received: p2p.sent_bytes, p2p.recv_bytes; comm_bytes is both.
          {"p2p_sent_bytes", forms.p2p_sent_bytes},
          {"comm_bytes", 2 * forms.p2p_sent_bytes},
          // From F to B (docs/design.md §4's theory), and until the last backward action, which
          // is how long saved tensors stay (differs for zb-h1): counted on the
          // schedule's lists beside their formulas.
          {"peak_live_microbatches", peak_live_microbatches(sched, s)},
          {"peak_live_microbatches_theory", peak_live_microbatches_theory(sched, s)},
          {"peak_held_microbatches", peak_held_microbatches(sched, s)},
          {"peak_held_microbatches_theory", peak_held_microbatches_theory(sched, s)}};
}

void validate_pipeline(const RunConfig& cfg, int stages) { (void)pipeline_shape(cfg, stages); }

nlohmann::json pipeline_header(const RunConfig& cfg, int stages) {
  const PipelineShape shape = pipeline_shape(cfg, stages);
  nlohmann::json run;
  run["kind"] = "pipeline";
  run["schedule"] = cfg.schedule;
  run["world"] = stages;
  run["microbatches"] = shape.microbatches;
  run["chunks"] = shape.chunks;
  run["steps"] = cfg.steps;
  run["timed_steps"] = cfg.steps > 1 ? cfg.steps - 1 : 0;
  run["seed"] = cfg.seed;
  run["model"] = model_json(cfg.model);
  run["split"] = shape.split;
  run["microbatch_rows"] = tensor_split_sizes(cfg.model.batch, shape.microbatches);
  return run;
}

nlohmann::json run_pipeline(const RunConfig& cfg, Backend& backend, Communicator& comm) {
  const int s = comm.rank();
  // The closed forms first, from the flags alone: the memory check compares their peak
  // before the stage builds its schedule, program or anything of the model's size.
  const PipelineShape shape = pipeline_shape(cfg, comm.world());
  std::optional<PipelineLayout> layout_for_walk;
  if (shape.schedule == "interleaved-1f1b") layout_for_walk = make_pipeline_layout(cfg, comm.world());
  const StageForms forms = stage_forms(shape, s, layout_for_walk ? &*layout_for_walk : nullptr);
  const std::int64_t predicted_peak = forms.peak.total();
  check_memory(predicted_peak, backend, comm.rank());
  // Untracked host bookkeeping grows with the schedule (every stage's action list, its
  // lowering and validation) and with what the executor keeps per live micro-batch and
  // layer (tapes, saved-tensor entries). Per-unit figures measured on x86-64 (README
  // "Command line"), rounded up.
  const std::int64_t M = shape.microbatches, forwards = static_cast<std::int64_t>(shape.stages) * shape.chunks * M;
  std::int64_t stage_layers = 0;
  for (int c = 0; c < shape.chunks; ++c) stage_layers += shape.split[static_cast<std::size_t>(c) * shape.stages + s];
  const std::int64_t stage_forwards = static_cast<std::int64_t>(shape.chunks) * M;
  const std::int64_t bookkeeping = 6'144 * stage_forwards + 256 * M * stage_layers + 512 * forwards;
  if (backend.device_free_bytes() < 0)
    check_host_memory(predicted_peak + bookkeeping, comm.rank(), "predicted peak plus estimated schedule bookkeeping");
  else
    check_host_memory(bookkeeping, comm.rank(), "estimated schedule bookkeeping on the host");

  PipelineStage stage(cfg, backend, comm);
  const PipelineLayout& layout = stage.layout();
  const Schedule& sched = layout.schedule;
  const nlohmann::json predicted = stage_prediction_json(forms, sched, s);
  {
    ScopedRange range(backend, "setup");
    stage.setup();
  }

  std::vector<double> step_ms;
  std::vector<double> losses;
  for (int i = 0; i < cfg.steps; ++i) {
    stage.prepare_batch(i);
    backend.synchronize();
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const float loss = stage.step();
    backend.synchronize();
    const auto t1 = std::chrono::steady_clock::now();
    step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    losses.push_back(loss);
  }

  const Tracker& tr = backend.tracker();
  const SavedTensors& saved = stage.saved();
  nlohmann::json r;
  r["stage"] = s;
  r["rank"] = comm.rank();
  r["world"] = comm.world();
  add_stage_layers(layout, s, r);
  r["saved"] = {{"peak_live_tensors", saved.peak_live()},
                {"peak_live_bytes", saved.peak_live_bytes()},
                {"total_tensors", saved.total()},
                {"before_first_backward", saved.before_first_backward()}};
  r["predicted"] = predicted;
  r["resting"] = category_json(tr.current());
  const PeakRecord& peak = tr.peak();
  r["peak"] = {{"total", peak.total},
               {"phase", std::string(phase_name(peak.phase))},
               {"where", stage.peak_where()},
               {"by_category", category_json(peak.by_category)}};
  add_allocator_figures(backend, r);
  const CommLedger& ledger = comm.ledger();
  r["p2p"] = {{"sent_bytes", ledger[CollKind::send].bytes},
              {"recv_bytes", ledger[CollKind::recv].bytes},
              {"peak_comm_bytes", stage.peak_comm_bytes()}};
  r["comm"] = comm_json(ledger, comm.world(), comm.emulated());
  r["comm_bytes"] = ledger.total_bytes();

  double busy = 0.0;
  nlohmann::json actions = nlohmann::json::array();
  for (const ActionTiming& t : stage.action_ms()) {
    busy += t.ms;
    actions.push_back({{"action", action_name(t.action.kind)},
                       {"microbatch", t.action.microbatch},
                       {"chunk", t.action.chunk},
                       {"ms", t.ms}});
  }
  // Action times are the last step's. With one step that step is the warm-up, which
  // nothing reports as a time (docs/design.md §6): busy, bubbles and action times are null then.
  const bool timed = step_ms.size() >= 2;
  r["busy_ms"] = timed ? nlohmann::json(busy) : nlohmann::json(nullptr);
  r["step_ms"] = step_ms_json(step_ms);
  r["step_ms_all"] = step_ms;
  // The wall-clock bubble needs every stage's end (fill_wall_bubbles, once all stages
  // are gathered); it means nothing for an emulated stage, whose peers never ran.
  r["actions_end_ms"] = timed ? nlohmann::json(stage.actions_end_ms()) : nlohmann::json(nullptr);
  r["bubble_fraction"] = nullptr;
  r["bubble_fraction_replayed"] = nullptr;  // fill_replayed_bubbles, once all stages are gathered
  r["bubble_fraction_theory"] = bubble_theory(sched);
  r["action_ms"] = timed ? actions : nlohmann::json(nullptr);
  r["loss"] = stage.holds_loss() ? nlohmann::json(losses) : nlohmann::json(nullptr);
  if (tr.recording()) r["timeline"] = timeline_json(tr.timeline());
  return r;
}

nlohmann::json fill_wall_bubbles(nlohmann::json& stages) {
  if (!stages.is_array() || stages.empty()) return nullptr;
  const int S = static_cast<int>(stages.size());
  double makespan = 0.0;
  for (const auto& st : stages) {
    // One stage of a larger (emulated) pipeline, or an untimed stage: nothing to say.
    if (!st.is_object() || st.value("world", S) != S) return nullptr;
    const auto end = st.find("actions_end_ms");
    const auto busy = st.find("busy_ms");
    if (end == st.end() || !end->is_number() || busy == st.end() || !busy->is_number()) return nullptr;
    makespan = std::max(makespan, end->get<double>());
  }
  if (makespan <= 0.0) return nullptr;
  for (auto& st : stages) st["bubble_fraction"] = 1.0 - st["busy_ms"].get<double>() / makespan;
  return makespan;
}

nlohmann::json fill_replayed_bubbles(const RunConfig& cfg, nlohmann::json& stages) {
  if (!stages.is_array() || stages.empty()) return nullptr;
  const int S = static_cast<int>(stages.size());
  // An emulated run reports one stage of a larger pipeline: nothing to replay.
  for (const auto& st : stages)
    if (!st.is_object() || st.value("world", S) != S) return nullptr;
  std::vector<nlohmann::json*> by_stage(S, nullptr);
  for (auto& st : stages) {
    const int idx = st.value("stage", -1);
    if (idx < 0 || idx >= S || by_stage[idx]) return nullptr;
    by_stage[idx] = &st;
  }
  const Schedule sched = make_schedule(cfg.schedule, S, pipeline_microbatches(cfg, S), cfg.chunks);
  // (stage, kind, micro-batch, chunk) -> measured ms
  std::map<std::tuple<int, char, int, int>, double> ms;
  for (int st = 0; st < S; ++st) {
    const auto it = by_stage[st]->find("action_ms");
    if (it == by_stage[st]->end() || !it->is_array()) return nullptr;
    for (const auto& a : *it)
      ms[{st, a.at("action").get<std::string>().at(0), a.at("microbatch").get<int>(), a.at("chunk").get<int>()}] =
          a.at("ms").get<double>();
  }
  for (int st = 0; st < S; ++st)
    for (const Action& a : sched.actions[st])
      if (!ms.count({st, action_name(a.kind)[0], a.microbatch, a.chunk})) return nullptr;
  const ReplayResult r = replay(sched, [&](int st, const Action& a) {
    return ms.at({st, action_name(a.kind)[0], a.microbatch, a.chunk});
  });
  for (int st = 0; st < S; ++st) {
    (*by_stage[st])["bubble_fraction_replayed"] = r.bubble_fraction[st];
    (*by_stage[st])["replayed_makespan_ms"] = r.makespan;
  }
  return r.makespan;
}

}  // namespace shardscope
