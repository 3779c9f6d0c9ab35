// Closed forms of what a GPT-2 step holds besides its model states (docs/formulas.md,
// "GPT-2's activations"): what autograd saves (torch's figure, which the model equals),
// and the transient bytes of a data-parallel step at its peak, walked in the order
// harness/model/gpt2.cpp allocates and frees, written as formulas.
//
// Symbols: B sequences, T tokens a sequence, N = B·T tokens, h hidden, f ffn, V vocab,
// H heads; a = 4Nh (one (N, h) activation), F = 4Nf, Λ = 4NV (the logits), and the
// attention's saves: flash keeps the log-sum-exp, A = 4·B·H·T; math keeps the
// probabilities, A = 4·B·H·T², and v: a copy (a), or with B = 1 or H = 1 the qkv output
// it is a view of (3a: torch's matmul reshapes it without a copy). Token ids are int64.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardscope/category.hpp"
#include "shardscope/config.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

// Saved for backward when the forward, loss included, has ended: unique storages
// holding bytes (parameters excluded), as torch's saved_tensors_hooks count them.
//   per block   8a + 2F + 16N + A     in 13 storages (flash); math adds 2a when B = 1
//               or H = 1 (v saved as qkv), in 15
//   the model   8N + 8T + L·block + a + 8N + a + Λ + 8N + 4     in 9 + 13L | 9 + 15L
// (the ids and arange(T); the blocks; ln_f's input, mean and rstd, and output; the
// log-probabilities, the target and nll_loss's total_weight).
struct SavedForm {
  std::int64_t bytes = 0;
  int tensors = 0;
};
SavedForm gpt2_block_saved(const TransformerShape& shape, int batch);
SavedForm gpt2_saved_after_forward(const TransformerShape& shape, int batch);

// FSDP's units of a GPT-2 as the step's walk needs them (harness/strategies/partition.hpp
// forms them): unit 0 the root (the embeddings and the final block), then units of
// transformer blocks. Empty for ddp and zero1.
struct Gpt2Units {
  std::vector<std::int64_t> bytes;  // 4 × each unit's padded flat parameter
  std::vector<int> top_block;       // each unit's last block (a model block index)
  bool reshard = false;             // zero3: units but the root are freed after their forward
  bool prefetch = true;             // --prefetch 1: a unit's backward gathers the next
};

// What a data-parallel step holds beyond its resting bytes at its peak, per category,
// with the phase and place of that instant.
struct StepTransient {
  CategoryBytes bytes;
  Phase phase = Phase::forward;
  std::string where;
};
StepTransient gpt2_step_transient(const TransformerShape& shape, int batch, const Gpt2Units& units);

// Completes a GPT-2's data-parallel predictions of `world` ranks running cfg.strategy,
// whose model states are filled (transformer_model_states): the peak (resting + the
// step's transient) and the saves after forward, on every rank.
void add_gpt2_step(const RunConfig& cfg, int world, std::vector<Prediction>& ranks);

}  // namespace shardscope
