// Closed forms of what one pipeline stage holds and moves in a step (docs/design.md §2, §4;
// docs/formulas.md writes them out). Each is a formula of the model's shape,
// the schedule, S, M, v and the micro-batch sizes, evaluated in O(S·v + V) time and
// memory (interleaved 1F1B's peak visits O(S·v) positions of the stage's list, each a
// formula: harness/predict/interleaved_timing; zbv's O(S) positions likewise,
// harness/predict/zbv_timing): no action list, no lowered program and
// nothing of size M × layers is built, so a plan of any size answers at once and a run
// checks its memory before it builds anything, and measured == predicted checks the
// executor against independent code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/category.hpp"
#include "shardscope/config.hpp"
#include "shardscope/schedule_kind.hpp"

namespace shardscope {

// What the forms read: the model, the schedule and its S, M, v, and the layers
// of each virtual stage (V = S·v entries; virtual stage k lives on stage k % S as its
// chunk k / S, or in zbv's V on stage k for k < S and 2S-1-k after: placed_stage). Micro-batch m has rows r_m of torch.tensor_split(B, M): q = B / M,
// e = B % M, r_m = q + 1 for m < e, else q.
struct PipelineShape {
  ModelConfig model;
  ScheduleKind schedule = ScheduleKind::gpipe;
  int stages = 1;        // S
  int microbatches = 1;  // M
  int chunks = 1;        // v
  std::vector<int> split;  // layers (a transformer: transformer blocks) per virtual stage
  // --mesh tp=T: each stage's blocks are a tensor-parallel rank's slice (Megatron's split,
  // docs/formulas.md "Tensor-parallel pipeline stages"); 1 without.
  int tp = 1;
};

// The saved-tensor instrument's figures (docs/design.md §2).
struct SavedForms {
  std::int64_t peak_live_tensors = 0;
  std::int64_t peak_live_bytes = 0;  // distinct tensors: a tensor saved twice counts once
  std::int64_t total_tensors = 0;
  std::int64_t before_first_backward = 0;
};

struct StageForms {
  SavedForms saved;
  CategoryBytes resting;  // params, grads, AdamW state of the stage's layers
  CategoryBytes peak;     // the tracker's first instant of the step's maximum, per category
  std::int64_t p2p_sent_bytes = 0;  // one step; as many are received
  // A tied embedding's gradient all-reduced between the first and the last stage (both
  // hold it): the all-reduce's bytes (nccl-tests' size, 4·vocab·hidden), 0 elsewhere.
  std::int64_t tied_all_reduce_bytes = 0;
  // Under --mesh dp=D,pp=S with D > 1: the stage's gradients averaged over its
  // data-parallel group after the schedule, in place (each chunk's flat gradient and the
  // tied copy's, one all-reduce each): 4 bytes per parameter the stage holds, no buffer
  // of their own, so no figure of the peak changes. 0 when D = 1 (nothing is reduced).
  std::int64_t dp_all_reduce_bytes = 0;
  // Under --mesh tp=T > 1: the all-reduces inside the stage's blocks over its
  // tensor-parallel group, summed over the micro-batches (each in place: no figure of the
  // peak changes). 0 when T = 1.
  std::int64_t tp_all_reduce_bytes = 0;
  // What the stage moves in a step: sent and received (2·p2p) and the tied all-reduce
  // inside the pipeline group, the gradients' all-reduce inside the data-parallel group,
  // the blocks' all-reduces inside the tensor-parallel group.
  std::int64_t pp_comm_bytes() const { return 2 * p2p_sent_bytes + tied_all_reduce_bytes; }
  std::int64_t comm_bytes() const { return pp_comm_bytes() + dp_all_reduce_bytes + tp_all_reduce_bytes; }
};

// Stage `stage` (0 <= stage < S) of `shape`, which the caller has checked
// (pipeline_shape in harness/pipeline/ refuses what cannot run), replicated over
// `data_parallel` ranks (--mesh dp=D; 1 without a mesh).
StageForms predict_pipeline_stage(const PipelineShape& shape, int stage, int data_parallel = 1);

}  // namespace shardscope
