// The test oracle for a pipeline stage's step peak: a walk of the stage's lowered
// program (harness/pipeline/lower.cpp), as the executor allocates. It replays the code
// the forms predict, so it is no prediction: the tests hold harness/predict/
// pipeline_forms' closed forms (interleaved 1F1B's above all, whose sends wait for their
// consumer's unit-time round) equal to it on configurations too many to run.
#pragma once

#include "harness/pipeline/pipeline_stage.hpp"
#include "shardscope/category.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// The stage's peak tracked bytes (the tracker's first instant of the maximum, per
// category), walked over its lowered program with one summary per (micro-batch, chunk),
// so O(actions) time and O(v·M) memory whatever the layers: from `resting`, the batch
// (stage of virtual stage 0) and mse's target (stage of the last), both temp; per program
// step its receives (activation: saved by the first Linear; gradient: comm), then the
// sent buffers nobody here keeps freed; then its action as the Mlp allocates:
//   F: n outputs (the unsaved last one temp), whose maximum is after the last; the
//      loss scalar (4 B) on the last virtual stage, then the unsaved output and it go;
//      an unsaved last output bound for another stage waits, owned, for its send;
//   B: dy (received, or the loss gradient, temp); whole: the first dx (temp) is its
//      maximum, then everything but the input gradient goes; split: its saved last
//      output goes (or, when the next chunk here still reads it in a W to come, zbv's
//      V bottom, is handed to that pair until then), then n-1+[k > 0] input gradients
//      (temp), kept as dz until W;
//   W: frees what the pair holds.
// The optimizer allocates nothing.
CategoryBytes walk_peak(const ModelConfig& model, const PipelineLayout& layout, int stage,
                        const StageProgram& program, const CategoryBytes& resting);

}  // namespace shardscope
