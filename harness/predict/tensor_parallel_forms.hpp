// Closed forms of a tensor-parallel MLP (--mesh dp=D,tp=T; docs/formulas.md, "Tensor
// parallelism"): every rank of a data-parallel group of D ranks, each holding its 1/T
// slice of the Linears (column, row, column, row, ...).
#pragma once

#include <cstdint>
#include <vector>

#include "shardscope/predict.hpp"

namespace shardscope {

// The parameter elements of each tensor of a tensor-parallel rank's MLP slice, in torch
// order (weight, bias per layer): a column Linear's width/T rows of its weight and of its
// bias, a row Linear's width/T columns of its weight and its whole bias.
std::vector<std::int64_t> tensor_parallel_mlp_tensors(const ModelConfig& m, int tp);

// The D ranks of one data-parallel group (ddp or zero1 along dp), in dp order, with the
// tensor-parallel group's all-reduces in comm_bytes and in axis_comm_bytes[tp].
std::vector<Prediction> predict_tensor_parallel_mlp(const RunConfig& cfg, int dp_world);

// The same for a tensor-parallel transformer (Megatron's split; docs/formulas.md, "Tensor
// parallelism of the transformers"): model states of the rank's tensors
// (transformer_tensor_sizes at tp), the step's walk at tp (gpt2_forms.hpp), and the
// group's all-reduces: the embedding's output, each block's two row-parallel outputs and
// two column-parallel input gradients, the loss's max and sum (N floats each) and its
// 4-byte value, and the head's input gradient: 2a + 4La + 8N + 4. Under --precision bf16
// (autocast, ddp and zero1 along dp) the row-parallel outputs are bf16: 2a + 3La + 8N + 4,
// and the step is autocast_step.hpp's at tp.
std::vector<Prediction> predict_tensor_parallel_transformer(const RunConfig& cfg, int dp_world);

}  // namespace shardscope
