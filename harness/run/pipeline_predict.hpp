// The one pipeline figure without a closed form yet: interleaved 1F1B's peak, walked over
// the stage's lowered program (every other figure: harness/predict/pipeline_forms).
#pragma once

#include <cstdint>

#include "harness/pipeline/pipeline_stage.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

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
// What the walk holds at its peak, per category: the
// batch, the target, unsaved outputs, the loss scalar and gradients computed here are
// temp; saved outputs and received activations activation; received gradients comm.
CategoryBytes predict_peak(const ModelConfig& model, const PipelineLayout& layout, int stage,
                           const StageProgram& program, const CategoryBytes& resting);

}  // namespace shardscope
