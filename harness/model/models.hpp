// The models, one factory each (one line per model in registry.cpp).
#pragma once

#include <memory>
#include <vector>

#include "harness/model/model.hpp"

namespace shardscope {

// With tp.size > 1 the MLP's Linears alternate column- and row-parallel (mlp.cpp).
std::unique_ptr<Model> make_mlp(const ModelConfig& config, const TensorParallel& tp = {});   // mlp.cpp
// UsageError naming --mesh and the flag when the MLP cannot be split into tp: the width
// must divide by tp and the layers be even (column and row Linears in pairs).
void check_mlp_tensor_parallel(const ModelConfig& config, int tp);
// With tp.size > 1: Megatron's tensor parallelism (attention by heads, the MLP column then
// row, the vocabulary-parallel embedding, head and cross-entropy; gpt2.cpp, llama.cpp).
std::unique_ptr<Model> make_gpt2(const ModelConfig& config, const TensorParallel& tp = {});  // gpt2.cpp
// GPT-2's transformer block `layer`: its parameter tensors in torch's order, nanoGPT's
// names, shapes and init (rank tp.rank's slices under tensor parallelism), for the fp32
// and the autocast blocks alike (gpt2.cpp).
std::vector<ParamSpec> gpt2_block_params(const TransformerShape& shape, int layer, const TensorParallel& tp = {});
// Where each of them lies among gpt2_block_params' tensors (the fp32, autocast and bf16-module
// blocks index them alike).
namespace gpt2_block {
enum Tensor : int { kLn1W, kLn1B, kAttnW, kAttnB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kMlpProjW, kMlpProjB };
}  // namespace gpt2_block
// GPT-2 under autocast(bfloat16) (config.autocast), for a shape make_gpt2 completed; with
// tp.size > 1 Megatron's split as make_gpt2's, each rank casting its own shards.
std::unique_ptr<Model> make_gpt2_autocast(const TransformerShape& shape, const TensorParallel& tp = {});  // gpt2_autocast.cpp
// GPT-2 under FSDP's MixedPrecision (config.param_bf16): the module in bf16 on the units' bf16 views.
std::unique_ptr<Model> make_gpt2_param_bf16(const TransformerShape& shape);  // gpt2_param_bf16.cpp
std::unique_ptr<Model> make_llama(const ModelConfig& config, const TensorParallel& tp = {});  // llama.cpp
// UsageError naming --mesh and each shape that tp does not divide: for any model what
// tp cannot split (check_mlp_tensor_parallel; a transformer's heads, ffn, vocabulary and
// kv heads), or that is not built (the MLP under --precision bf16).
void check_tensor_parallel(const ModelConfig& config, int tp);
// A Llama decoder layer's parameter tensors in Hugging Face's order and init (rank
// tp.rank's slices under tensor parallelism), and where each lies among them (-1: the
// shape has no such bias), for the fp32 and the autocast layers alike (llama.cpp).
struct LlamaLayerTensors {
  std::vector<ParamSpec> params;
  int qW = -1, qB = -1, kW = -1, kB = -1, vW = -1, vB = -1, oW = -1, oB = -1;
  int gateW = -1, upW = -1, downW = -1, norm1 = -1, norm2 = -1;
};
LlamaLayerTensors llama_layer_tensors(const TransformerShape& shape, int layer, const TensorParallel& tp = {});
// Llama under autocast(bfloat16) (config.autocast), for a shape make_llama completed; with
// tp.size > 1 Megatron's split as make_llama's.
std::unique_ptr<Model> make_llama_autocast(const TransformerShape& shape, const TensorParallel& tp = {});  // llama_autocast.cpp
// Llama under bf16 parameters (config.param_bf16: FSDP's MixedPrecision, DeepSpeed's bf16):
// Hugging Face's module cast to bf16, on the strategy's bf16 views.
std::unique_ptr<Model> make_llama_param_bf16(const TransformerShape& shape);  // llama_param_bf16.cpp

}  // namespace shardscope
