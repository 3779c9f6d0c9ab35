// Closed forms of what a GPT-2 step holds besides its model states (docs/formulas.md,
// "GPT-2's activations"): what autograd saves (torch's figure, which the model equals),
// and the transient bytes of a data-parallel step at its peak, walked in the order
// harness/model/gpt2.cpp allocates and frees, written as formulas.
//
// Symbols: B sequences, T tokens a sequence, N = B·T tokens, h hidden, f ffn, V vocab,
// H heads; a = 4Nh (one (N, h) activation), F = 4Nf, Λ = 4NV (the logits), and the
// attention's saves: flash keeps the log-sum-exp, A = 4·B·H·T; math keeps the
// probabilities, A = 4·B·H·T². Token ids are int64 (8 bytes).
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
//   per block   8a + 2F + 16N + A     in 13 storages (flash) or 15 (math)
//   the model   8N + 8T + L·block + a + 8N + a + Λ + 8N + 4     in 9 + 13L | 9 + 15L
// (the ids and arange(T); the blocks; ln_f's input, mean and rstd, and output; the
// log-probabilities, the target and nll_loss's total_weight).
struct SavedForm {
  std::int64_t bytes = 0;
  int tensors = 0;
};
SavedForm gpt2_block_saved(const TransformerShape& shape, int batch);
SavedForm gpt2_saved_after_forward(const TransformerShape& shape, int batch);

// What a data-parallel step holds beyond its resting bytes at its peak, per category,
// with the phase and place of that instant. `gathered` is the bytes of parameters
// gathered for the step (FSDP's one root unit: 4 × its padded flat parameter, held from
// the forward through the backward, with a full gradient of the same size from the
// backward's first block; 0 for ddp and zero1); `unit` names places by that unit
// ("unit 0") instead of by block ("layer 3").
struct StepTransient {
  CategoryBytes bytes;
  Phase phase = Phase::forward;
  std::string where;
};
StepTransient gpt2_step_transient(const TransformerShape& shape, int batch, std::int64_t gathered);

// Completes a GPT-2's data-parallel predictions, whose resting bytes are filled: the
// peak (resting + the step's transient, `gathered` as above) and the saves after
// forward, on every rank.
void add_gpt2_step(const ModelConfig& model, std::int64_t gathered, std::vector<Prediction>& ranks);

}  // namespace shardscope
