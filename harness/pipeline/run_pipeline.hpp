// Pipeline runs: one stage per rank, a schedule executed over p2p (docs/design.md §4).
#pragma once

#include <nlohmann/json.hpp>

#include "harness/pipeline/pipeline_stage.hpp"
#include "shardscope/backend.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// Refuses what the schedule cannot run at `stages` (UsageError naming the flag).
void validate_pipeline(const RunConfig& cfg, int stages);
nlohmann::json pipeline_header(const RunConfig& cfg, int stages);
// A stage record's "layers" ([first, last] of its first chunk) and, with chunks,
// "chunks_layers" (every chunk's), added to `record`.
void add_stage_layers(const PipelineLayout& layout, int stage, nlohmann::json& record);
// Stage s's closed forms (harness/predict/pipeline_forms). interleaved-1f1b's peak is
// still walked over the stage's lowered program, which needs `layout` (null otherwise).
StageForms stage_forms(const PipelineShape& shape, int s, const PipelineLayout* layout);
// A stage record's "predicted": the closed forms, and the live micro-batch counts of the
// schedule's lists with their theory (docs/design.md §4).
nlohmann::json stage_prediction_json(const StageForms& forms, const Schedule& sched, int s);
// Runs the steps on this stage; returns the stage's record (docs/design.md §7 "stages").
nlohmann::json run_pipeline(const RunConfig& cfg, Backend& backend, Communicator& comm);
// Takes the gathered stage records (one per stage), replays the schedule with each
// action's measured ms ("action_ms") and writes every stage's "bubble_fraction_replayed"
// and "replayed_makespan_ms"; returns the makespan in ms. When the records are not the
// whole pipeline (an emulated run reports one stage), leaves them as they are and
// returns null.
nlohmann::json fill_replayed_bubbles(const RunConfig& cfg, nlohmann::json& stages);

// Takes the gathered stage records and writes every stage's wall-clock
// "bubble_fraction": 1 − busy_ms / makespan, the makespan being the latest
// "actions_end_ms" of any stage (each measured from the step's start, which a barrier
// aligns across ranks), so the optimizer, which is no part of the schedule, is no part
// of the bubble. Returns the makespan in ms; null, leaving the records as they are, when
// they are not the whole pipeline or not timed (one step: the warm-up).
nlohmann::json fill_wall_bubbles(nlohmann::json& stages);

}  // namespace shardscope
