// What a pipeline stage should measure (DESIGN §2, §4): saved tensors walked through
// the stage's action list, and the resting bytes of the layers it owns.
#pragma once

#include <cstdint>

#include "harness/pipeline/pipeline_stage.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

struct SavedPrediction {
  int peak_live_tensors = 0;
  std::int64_t peak_live_bytes = 0;  // distinct tensors: a tensor saved twice counts once
  int total_tensors = 0;
  int before_first_backward = 0;
};

// Walks the stage's actions with autograd's saves per (micro-batch, chunk), taking each
// micro-batch's real rows. Per F over layers [f, l) of `rows` rows:
//   each layer: its Linear's input (the micro-batch slice, the received activation or the
//   previous layer's output) and, unless it is the model's layer 0 (input is data), a
//   reference to its weight (0 bytes); with relu, the ReLU's output;
//   on the last virtual stage with mse: the loss's input (the last output, already saved
//   when relu) and the target slice.
// Released at B; with a split backward B releases the ReLU outputs, weight references
// and the loss's saves, and W the Linear inputs.
SavedPrediction predict_saved(const ModelConfig& model, const PipelineLayout& layout, int stage);

// Bytes the stage sends in one step, which equal the bytes it receives: for each of its
// virtual stages, each micro-batch's activation to the next virtual stage (unless it is
// the last) and its input gradient to the previous one (unless it is the first), the
// same rows x width fp32 tensors coming the other way; a neighbour on the same stage (S =
// 1 with chunks) takes them in place. Over all M micro-batches that is B x width x 4
// bytes per neighbour and direction.
std::int64_t predict_p2p_bytes(const ModelConfig& model, const PipelineLayout& layout, int stage);

// Parameters, gradients and AdamW state (exp_avg, exp_avg_sq, a 4-byte step per
// tensor) of the stage's layers: 16 P_own + 8 layers_own.
std::int64_t predict_resting_total(const ModelConfig& model, const PipelineLayout& layout, int stage);
// The same per category: param and grad 4 P_own each, optim 8 P_own + 8 layers_own.
CategoryBytes predict_resting(const ModelConfig& model, const PipelineLayout& layout, int stage);

// The stage's peak tracked bytes in a step (the tracker's requested total), walked
// symbolically over its lowered program in the executor's order, with each buffer's size
// (rows_m x width fp32 for micro-batch m): the resting bytes; the whole-batch input (stage
// of virtual stage 0) and mse target (stage of the last); then per program step its comm
// group (receive buffers allocated in order, then the sent outputs nobody here keeps
// freed) and its action as Mlp runs it: F allocates each layer's output (and the 4-byte
// loss scalar on the last virtual stage, freed at once, with the unsaved sum output),
// B allocates the loss gradient and per layer dx, freeing dy and the output as it goes
// (split backward: keeps dz, frees only the last output), W frees dz and the outputs;
// act_in and the tape go at B (W when split). The peak is the max after every allocation;
// the optimizer allocates nothing.
std::int64_t predict_peak_total(const ModelConfig& model, const PipelineLayout& layout, int stage);
// What the walk holds at its peak, per category (its total is predict_peak_total): the
// batch, the target, unsaved outputs, the loss scalar and gradients computed here are
// temp; saved outputs and received activations activation; received gradients comm.
CategoryBytes predict_peak(const ModelConfig& model, const PipelineLayout& layout, int stage,
                           const StageProgram& program);

}  // namespace shardscope
