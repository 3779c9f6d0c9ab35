// Pipeline runs: one stage per rank, a schedule executed over p2p (docs/design.md §4).
#pragma once

#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/pipeline/pipeline_stage.hpp"
#include "harness/records/result.hpp"
#include "shardscope/backend.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// Refuses what the schedule cannot run at `stages` (UsageError naming the flag).
void validate_pipeline(const RunConfig& cfg, int stages);
// A pipeline run's fields before its stages (schedule, world, microbatches, chunks,
// steps, timed_steps, seed, model, split, microbatch_rows); no stages yet.
PipelineRun pipeline_run(const RunConfig& cfg, int stages);
// The same as JSON ("kind" too), without the fields only a run has (stages, backend,
// comm, emulated and the makespans).
nlohmann::json pipeline_header(const RunConfig& cfg, int stages);
// A stage's "layers" ([first, last] of its first chunk) and, with chunks,
// "chunks_layers" (every chunk's); add_stage_layers adds them to a JSON record.
void stage_layers(const PipelineLayout& layout, int stage, LayerRange* layers,
                  std::optional<std::vector<LayerRange>>* chunks_layers);
void add_stage_layers(const PipelineLayout& layout, int stage, nlohmann::json& record);
// A stage record's "predicted": the closed forms, and the live micro-batch counts of the
// schedule's lists with their theory (docs/design.md §4).
StagePredicted stage_predicted(const StageForms& forms, const Schedule& sched, int s);
nlohmann::json stage_prediction_json(const StageForms& forms, const Schedule& sched, int s);
// Runs the steps on this stage; returns the stage's record (docs/design.md §7 "stages").
StageRecord run_pipeline(const RunConfig& cfg, Backend& backend, Communicator& comm);
// Takes the gathered stage records (one per stage), replays the schedule with each
// action's measured ms ("action_ms") and writes every stage's "bubble_fraction_replayed"
// and "replayed_makespan_ms"; returns the makespan in ms. When the records are not the
// whole pipeline (an emulated run reports one stage), leaves them as they are and
// returns none.
std::optional<double> fill_replayed_bubbles(const RunConfig& cfg, std::vector<StageRecord>& stages);

// Takes the gathered stage records and writes every stage's wall-clock
// "bubble_fraction": 1 − busy_ms / makespan, the makespan being the latest
// "actions_end_ms" of any stage (each measured from the step's start, which a barrier
// aligns across ranks), so the optimizer, which is no part of the schedule, is no part
// of the bubble. Returns the makespan in ms; null, leaving the records as they are, when
// they are not the whole pipeline or not timed (one step: the warm-up).
std::optional<double> fill_wall_bubbles(std::vector<StageRecord>& stages);

// Both of the above over each pipeline of a run's gathered records: the whole run, or
// under --mesh each data-parallel replica's stages; the run's makespans are the longest.
// `wall`: the stages ran for real (an emulated run has no wall-clock bubble).
void fill_bubbles(const RunConfig& cfg, bool wall, PipelineRun& run);

}  // namespace shardscope
