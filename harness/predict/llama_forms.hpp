// Closed forms of what a Llama step holds besides its model states (docs/formulas.md,
// "Llama's activations"): what autograd saves (docs/design.md's choice per op), and the
// transient bytes of a data-parallel step at its peak, walked in the order
// harness/model/llama.cpp allocates and frees, written as formulas.
//
// Symbols: B sequences, T tokens a sequence, N = B·T tokens, h hidden, f ffn, V vocab,
// H heads, K kv heads, d head_dim; a = 4Nh (one (N, h) activation), Q = 4N·H·d (q, the
// attention's output; with math also k and v expanded to H heads), C = 4N·K·d (k, v),
// F = 4Nf, Λ = 4NV (the logits), and the attention's save: flash keeps the log-sum-exp,
// A = 4·B·H·T; math keeps the probabilities, A = 4·B·H·T². Token ids are int64 (8 bytes).
#pragma once

#include <vector>

#include "harness/predict/piece_forms.hpp"
#include "harness/predict/transformer_step.hpp"

namespace shardscope {

// Saved for backward when the forward, loss included, has ended: unique storages
// holding bytes (parameters excluded).
//   per block   flash 4a + 2Q + 2C + 8N + A + 4F, math 4a + 4Q + 8N + A + 4F; 15 storages
//   the model   8N + L·block + 2a + 4N + Λ + 8N + 4     in 7 + 15L
// (the ids; the blocks; the final norm's input, rstd and output; the log-probabilities,
// the target and nll_loss's total_weight).
// tp > 1: a tensor-parallel rank's (Q, C, F, A, Λ its T-th; the residual stream's a whole).
// sp: --sp, the stream's a and the norms' statistics a T-th (docs/formulas.md, "Sequence parallelism").
SavedForm llama_block_saved(const TransformerShape& shape, int batch, int tp = 1, bool sp = false);
// Under --checkpoint a wrapped layer saves only its input: a in 1 storage; under
// --checkpoint attention a math layer saves A (the probabilities, 1 storage) less.
SavedForm llama_saved_after_forward(const TransformerShape& shape, int batch,
                                    const CheckpointPolicy& checkpoint = CheckpointPolicy{}, int tp = 1,
                                    bool sp = false);

// What a data-parallel step holds beyond its resting bytes at its peak
// (transformer_step.hpp walks it; the blocks' part is Llama's).
// What Llama's blocks hold, for `batch` sequences, as the walk and a pipeline's pieces read it.
// recompute_attention: --checkpoint attention (math: K less A, the probabilities made
// again in the attention's backward; the forward's attention instants).
StepBlocks llama_blocks(const TransformerShape& shape, int batch, bool recompute_attention = false, int tp = 1,
                        bool sp = false);
StepTransient llama_step_transient(const TransformerShape& shape, int batch, const StepUnits& units,
                                   const CheckpointPolicy& checkpoint = CheckpointPolicy{}, int tp = 1,
                                   bool sp = false);

// One micro-batch of `rows` sequences through a pipeline piece of Llama
// (transformer_piece.hpp): place.blocks decoder layers, with the embedding when first and
// the final norm, the head and the loss when last.
// tp > 1: a tensor-parallel rank's piece (the blocks' figures at tp, the zero-bubble
// halves' too; the boundary a whole). sp (--sp, tp > 1): the blocks' figures under --sp,
// the boundary the rank's seq/T tokens (a/T); no zero-bubble halves (not built).
PieceForms llama_piece(const TransformerShape& shape, int rows, const PiecePlace& place, int tp = 1,
                       bool sp = false);

}  // namespace shardscope
