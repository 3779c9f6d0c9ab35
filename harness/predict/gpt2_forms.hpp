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

#include <vector>

#include "harness/predict/piece_forms.hpp"
#include "harness/predict/transformer_step.hpp"

namespace shardscope {

// Saved for backward when the forward, loss included, has ended: unique storages
// holding bytes (parameters excluded), as torch's saved_tensors_hooks count them.
//   per block   8a + 2F + 16N + A     in 13 storages (flash); math adds 2a when B = 1
//               or H = 1 (v saved as qkv), in 15
//   the model   8N + 8T + L·block + a + 8N + a + Λ + 8N + 4     in 9 + 13L | 9 + 15L
// (the ids and arange(T); the blocks; ln_f's input, mean and rstd, and output; the
// log-probabilities, the target and nll_loss's total_weight).
// Under tensor parallelism (tp = T) a rank's block saves 4a + 4q + 2F/T + 16N + A/T
// (q = a/T: its qkv 3q and y q; math: q, k q each, v q or 3q), and the model Λ/T.
// Under --sp (sp) the stream's tensors are the rank's N/T tokens: a rank's block saves
// 4a/T + 4q + 2F/T + 16N/T + A/T, the one-rank block's T-th (flash).
SavedForm gpt2_block_saved(const TransformerShape& shape, int batch, int tp = 1, bool sp = false);
// Under --checkpoint a wrapped block saves only its input: a in 1 storage; under
// --checkpoint attention a math block saves A (the probabilities, 1 storage) less.
SavedForm gpt2_saved_after_forward(const TransformerShape& shape, int batch,
                                   const CheckpointPolicy& checkpoint = CheckpointPolicy{}, int tp = 1,
                                   bool sp = false);

// What a data-parallel step holds beyond its resting bytes at its peak
// (transformer_step.hpp walks it; the blocks' part is GPT-2's).
// What GPT-2's blocks hold, for `batch` sequences, as the walk and a pipeline's pieces read it;
// recompute_attention: --checkpoint attention (math: K less A, the probabilities made
// again in the attention's backward; the forward's attention instant).
// tp > 1: a tensor-parallel rank's (every a of the attention's heads and every F, A, Λ
// a T-th, the residual stream's a whole; the loss's statistics 8N).
// sp: --sp (docs/formulas.md, "Sequence parallelism"): the stream's a, and the norms'
// statistics, a T-th; the gathered and partial tensors (the whole (N, h)) in temp.
StepBlocks gpt2_blocks(const TransformerShape& shape, int batch, bool recompute_attention = false, int tp = 1,
                       bool sp = false);
StepTransient gpt2_step_transient(const TransformerShape& shape, int batch, const StepUnits& units,
                                  const CheckpointPolicy& checkpoint = CheckpointPolicy{}, int tp = 1,
                                  bool sp = false);

// One micro-batch of `rows` sequences through a pipeline piece of GPT-2 (piece_forms.hpp):
// place.blocks transformer blocks, with the embeddings when first and the final block and
// the loss when last (docs/formulas.md, "Transformers: the pipeline"). Its figures are the
// data-parallel walk's, cut at the piece's ends: held from F to B
//   blocks n·K (each saves its input: x0, the received buffer, the block before's output;
//   less the input a when it is the previous chunk's on the same stage, held there as temp),
//   first + 8T (arange), last + 8N + 2a (ln_f's mean, rstd, input, output) + Λ + 4
//   (log-probabilities, total_weight);
// the end of F adds its unsaved output a, or on the last piece the logits Λ and the loss
// scalar 4 (temp); B's instants are the loss's and the final block's (last piece) and the
// top transformer block's gradient buffers, each lower block holding K less.
// tp > 1: a tensor-parallel rank's piece (the blocks' figures at tp, the zero-bubble
// halves' too; the boundary a whole). sp (--sp, tp > 1): the blocks' figures under --sp,
// the boundary the rank's seq/T tokens (a/T); no zero-bubble halves (not built).
PieceForms gpt2_piece(const TransformerShape& shape, int rows, const PiecePlace& place, int tp = 1,
                      bool sp = false);

}  // namespace shardscope
