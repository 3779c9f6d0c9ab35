// Closed forms of zero2 and zero3 under --engine fsdp2 (torch's fully_shard; docs/formulas.md,
// "FSDP2"). Every parameter tensor t is sharded along dim 0: d_t rows of e_t elements,
// c_t = ceil(d_t / W) rows a rank (torch.chunk), rank r holding
// n_{t,r} = clamp(d_t − r·c_t, 0, c_t) of them; its storage is padded to p_t = c_t·e_t.
// A unit u's padded shards together are A_u = Σ_{t∈u} p_t elements.
//   resting   param 4 Σ_t p_t, grad 4 Σ_u A_u (= the same), optim Σ_t (8 n_{t,r}·e_t + 4)
//   traffic   all-gather Σ_u 4·W·A_u (twice for a unit resharded after forward),
//             reduce-scatter Σ_u 4·W·A_u
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "shardscope/config.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

// (d_t, e_t) of every parameter tensor in torch's order, from the modules' shapes: the
// MLP's Linear weight (w, w) and bias (w); GPT-2's and Llama's (out, in) Linear weights,
// (num, h) embeddings and 1-D biases and norms.
std::vector<std::pair<std::int64_t, std::int64_t>> fsdp2_tensor_rows(const ModelConfig& model);

// Every rank of a data-parallel job of `world` ranks running cfg.strategy (zero2 or
// zero3) under --engine fsdp2. The MLP's peak is walked in closed form (formulas.md); a
// transformer's is the torch engine's step walk (transformer_step.hpp) over fsdp2's
// per-unit buffers.
std::vector<Prediction> predict_fsdp2_ranks(const RunConfig& cfg, int world);

}  // namespace shardscope
