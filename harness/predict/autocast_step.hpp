// The peak of a transformer's data-parallel step under --precision bf16 with the torch
// engine, ddp and zero1 (docs/formulas.md, "bf16: the step's peak"): what GPT-2 and Llama
// hold beyond their resting bytes at the highest instant of a step run as
// torch.autocast(bfloat16) runs it (harness/model/gpt2_autocast.cpp, llama_autocast.cpp),
// each instant a formula.
//
// Three kinds of bytes move: activation (what the blocks save: fp32 statistics, inputs
// and x_mid, bf16 casts of the Linears' inputs and outputs, the attention's saves), the
// weights' bf16 casts (each made in the forward, held by the GEMM's save until that
// Linear's backward: param_cast) and temp (the batch's ids and target X = 16N
// throughout; on the CPU a bf16 GEMM widens its operands into fp32 temps beside its
// output, forward and backward, and a gradient at a bf16 tensor is an fp32 temp of bf16
// values). Parameters, gradients and AdamW's state stay fp32: resting bytes are the fp32
// forms' (transformer_forms.hpp), and ddp's and zero1's collectives run on them in place.
//
// Symbols as autocast_forms.hpp: N = B·T, a = 4Nh, F = 4Nf, Λ = 4NV, A the attention's
// save (flash's log-sum-exp 4BHT, math's probabilities 4BHT²); X = 16N. A weight's fp32
// bytes are W (its cast W/2, its widened copy W). --checkpoint full|every:K: a wrapped
// block's casts stay in autocast's cast cache until the loss's end, and its re-run makes
// them again. --checkpoint attention: the attention core's own save A (flash's
// log-sum-exp, math's probabilities) is not kept; H and K are A less (autocast_step.cpp).
//
// Under tensor parallelism (tp = T > 1, docs/formulas.md "bf16 under tensor parallelism")
// a rank's blocks hold its shards: every weight's bytes (so its cast and its widened copy)
// and every tensor of the attention's heads or the MLP's inner features a T-th (GPT-2's
// q, k, v and output, Llama's Q and C_k, F, A), the residual stream, the norms and the
// Linears' input casts whole; the head's weight W_V and the logits Λ a T-th. A
// row-parallel Linear's GEMM adds no bias (its rounded copy is gone) and its partial
// product (a, fp32 here) is cast into a bf16 temp for the all-reduce (a/2) beside it: one
// more instant after each of the block's two row-parallel GEMMs, temp X + 3a/2.
#pragma once

#include <cstdint>
#include <vector>

#include "harness/predict/transformer_step.hpp"
#include "shardscope/category.hpp"

namespace shardscope {

// The category the weights' bf16 casts are counted in: param_cast (the model allocates
// them there).
constexpr Category kWeightCastCategory = Category::param_cast;

// One instant of a transformer block under autocast, relative to where the block starts:
// temp (the batch's ids and target X = 16N included), activation beyond S and casts
// beyond C (the activations, its input among them, and the casts held before it); a
// backward instant from its output freed, with dy_live when its dy (a, in temp) is still
// alive (the residual's add frees it).
struct AutocastInstant {
  std::int64_t temp = 0, act = 0, cast = 0;
  bool dy_live = false;
};

// What a family's blocks hold under autocast (autocast_step.cpp writes each out): K a
// block's activations beside its input (its output included), c its weights' casts; base
// the activations before block 1 (the embeddings'); stats the final norm's statistics;
// W_V the head's weight (4Vh, fp32 bytes); a block's forward and backward instants. The
// data-parallel step's walk and a pipeline piece (autocast_piece.hpp) read them.
// lambda: the logits' bytes on the rank, Λ (Λ/T under tp); loss_stats: under tp the
// vocabulary-parallel loss's statistics, max and sum (8N, temp), made once its
// log-probabilities and total_weight are and freed before its value is written (0 with
// one rank).
struct AutocastFamily {
  std::int64_t base = 0, K = 0, c = 0, stats = 0, W_V = 0, lambda = 0, loss_stats = 0;
  std::vector<AutocastInstant> forward, backward;
};
// recompute_attention: --checkpoint attention (the attention core's own save A, flash's
// log-sum-exp or math's probabilities, not kept from forward to backward).
AutocastFamily gpt2_autocast_family(const TransformerShape& shape, int batch, int tp = 1,
                                    bool recompute_attention = false);
AutocastFamily llama_autocast_family(const TransformerShape& shape, int batch, int tp = 1,
                                     bool recompute_attention = false);

// What a ddp or zero1 step of GPT-2 / Llama under autocast holds beyond its resting
// bytes at its peak, per category, with that instant's phase and place.
// tp > 1: a tensor-parallel rank's (ddp or zero1 along dp).
StepTransient gpt2_step_transient_autocast(const TransformerShape& shape, int batch,
                                           const CheckpointPolicy& checkpoint = CheckpointPolicy{}, int tp = 1);
StepTransient llama_step_transient_autocast(const TransformerShape& shape, int batch,
                                            const CheckpointPolicy& checkpoint = CheckpointPolicy{}, int tp = 1);

}  // namespace shardscope
