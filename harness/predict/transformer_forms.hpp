// Closed forms of the transformer families (--model gpt2|llama, docs/formulas.md,
// "Transformers"): parameters per tensor, per block and per model, and the blocks a
// partition sees.
//
// Blocks, in the model's order: 0 the embeddings (gpt2: wte, wpe; llama: embed_tokens),
// 1..L the transformer blocks, L + 1 the final norm and, when untied, the head. A tied
// head is the token embedding's tensor (block 0), listed once, as torch's
// named_parameters() lists it. Tensors are in torch's order with the names of the
// reference modules' state_dict (nanoGPT's GPT for gpt2, Hugging Face's
// LlamaForCausalLM for llama, mistral and qwen2).
//
// Everything here is O(layers) or O(tensors) and allocation-free per element, so an
// 80-layer 70B model at any world is planned at once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/config.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

// One parameter tensor: its state_dict name, elements and block.
struct TransformerTensor {
  std::string name;
  std::int64_t elems = 0;
  int block = 0;
};

// Blocks of the model: L + 2 (embeddings, L transformer blocks, final norm and head).
int transformer_blocks(const TransformerShape& shape);

// Parameters of the embeddings (block 0), of one transformer block, of the final block
// (norm, and the head when untied), and of the whole model.
std::int64_t embedding_params(const TransformerShape& shape);
std::int64_t block_params(const TransformerShape& shape);
std::int64_t final_params(const TransformerShape& shape);
std::int64_t transformer_params(const TransformerShape& shape);

// Parameter tensors of one transformer block, and of the whole model.
int block_param_tensors(const TransformerShape& shape);
int transformer_param_tensors(const TransformerShape& shape);

// Every parameter tensor in torch's order, named; and their elements alone (what
// zero1's partition takes).
std::vector<TransformerTensor> transformer_tensors(const TransformerShape& shape);
// With tp > 1: a tensor-parallel rank's part of each (Megatron's split: docs/formulas.md,
// "Tensor parallelism of the transformers"), the same tensors in the same order.
std::vector<std::int64_t> transformer_tensor_sizes(const TransformerShape& shape, int tp = 1);

// With fewer kv heads than tp (K < T, T divisible by K; Llama's GQA) each rank holds a copy
// of one kv head, and each decoder layer's backward all-reduces over the tp group every
// kv head's k_proj and v_proj gradients (the rank's copy's in its head's slot, zeros
// elsewhere): 8·K·d·(h + b) bytes (b = 1 with q/k/v biases); 0 otherwise.
std::int64_t kv_replica_all_reduce_bytes(const TransformerShape& shape, int tp);

// Parameters of each of the L + 2 blocks, in order (what FSDP's units take); with tp > 1
// a tensor-parallel rank's.
std::vector<std::int64_t> transformer_block_sizes(const TransformerShape& shape, int tp = 1);

// FSDP's units of a transformer, as torch FSDP1 with the transformer wrap policy forms
// them (docs/design.md, "Transformers"): blocks_per_unit = 0 ("--units all") is one
// root unit holding every block; K > 0 puts K transformer blocks in each unit (the last
// what is left) after a root unit of what no wrapped block holds: the embeddings and
// the final block, not contiguous (blocks {0, L + 1}).
std::vector<std::vector<int>> transformer_unit_blocks(const TransformerShape& shape, int blocks_per_unit);

// Model states of every rank of a data-parallel job of `world` ranks training a
// transformer with cfg.strategy (docs/formulas.md, "Transformers"): at rest, parameters,
// gradients and AdamW's state per rank, and the bytes each step's collectives move.
//   ddp    4P param, 4P grad (+ 4P with --ddp-bucket copy), 8P + 4T optim
//   zero1  4P param, 4P grad, 8 P_own + 4 T_own optim (torch's ZeroRedundancyOptimizer
//          over the T tensors in torch's order)
//   zero2, zero3  per unit u (transformer_unit_blocks) 4 s_u param, 4 s_u grad,
//          8 s_u + 4 optim, s_u = ceil(P_u / W)
// Communication: ddp all-reduce 4P; zero1 also broadcast 4P; zero2 and zero3 reduce-scatter
// Σ 4 padded_u and all-gather Σ 4 padded_u, zero3 gathering every unit but the root again
// in backward (the root is not resharded after forward). The peak is left unknown
// (peak_known false) for the activation forms to fill. O(tensors + units + world).
std::vector<Prediction> transformer_model_states(const RunConfig& cfg, int world);

}  // namespace shardscope
