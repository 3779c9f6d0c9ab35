// Measurement as records (harness/records/result.hpp): what the tracker, the
// communicator's ledger and the backend hold, copied into the fields of a result.
#pragma once

#include <string>
#include <vector>

#include "harness/records/result.hpp"
#include "shardscope/backend.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"
#include "shardscope/mesh.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

CategoryFigures category_figures(const CategoryBytes& b);
// Per collective kind: calls, bytes, ms and the bus bandwidth (none when emulated: an
// emulated call moves nothing, so its time is not a transfer's).
CommFigures comm_figures(const CommLedger& ledger, int world, bool emulated);
ModelRecord model_record(const ModelConfig& m);
PeakFigures peak_figures(const PeakRecord& peak, std::string where);
// A data-parallel rank's "predicted".
RankPredicted rank_predicted(const Prediction& p);
// The median, minimum and maximum of the timed steps (all but the first, the warm-up): none when
// no step was timed.
TimeSummary time_summary(const std::vector<double>& step_ms);
// How many of a run's `steps` are timed: all but the first, the warm-up.
int timed_steps(int steps);
// The tracker's allocator-granular figures, the CUDA pool's counters (none on cpu), the
// bytes outside the pool (none when unknown) and their source ("nvml" or
// "cuda_mem_get_info_delta", see OutsidePool; none on cpu).
AllocatorFigures allocator_figures(Backend& backend);
// The record of `breakdown`, with `other`: what `outside` holds beyond the parts (null when a
// part in it was not measured, or the parts exceed it).
OutsidePoolParts outside_pool_parts(const OutsidePoolBreakdown& breakdown, const OutsidePool& outside);

// A rank's group (a --mesh axis, or HSDP's shard and replicate groups): its name, its
// members (world ranks, in its order), its ledger, and the bytes its closed forms give.
GroupCommRecord group_record(const std::string& name, Communicator& comm, std::vector<int> members,
                             std::int64_t predicted_bytes);
// Under --mesh, a rank's group of `axis`.
GroupCommRecord group_record(MeshComms& mesh, MeshAxis axis, int world_rank, std::int64_t predicted_bytes);
// The groups' ledgers summed (calls, bytes, ms, exposed ms): what the rank's "comm" says
// under --mesh or HSDP (no busbw: the groups differ in size).
CommLedger summed_ledger(const std::vector<Communicator*>& groups);
CommLedger summed_ledger(MeshComms& mesh);

// A rank's timeline, times in ms since the run started:
//   memory: the state when recording started, at 0; then one row after each kept event;
//   marks: where the marked phase/place changes;
//   spans: by start, a parent before its children; bytes for collectives and p2p only.
TimelineRecord timeline_record(const Timeline& timeline);

}  // namespace shardscope
