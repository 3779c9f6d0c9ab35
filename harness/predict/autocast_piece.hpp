// A transformer's pipeline piece under --precision bf16 with the torch engine
// (piece_forms.hpp; docs/formulas.md, "bf16: the pipeline"): what one micro-batch costs the
// run of blocks one virtual stage holds when each micro-batch's forward of a stage is its
// own autocast region (torch.autocast around the stage's forward, the last stage's loss
// inside it, as the data-parallel step's region ends with the loss). Every Linear's input
// needs a gradient in a transformer block, so every weight's bf16 cast is saved by its GEMM
// and held from the micro-batch's F to its B (param_cast): each micro-batch in flight holds
// its own casts. The residual stream between blocks, and so what a stage sends and
// receives, stays fp32 (fp32 + bf16 is fp32), as does its gradient.
//
// Read from the family's blocks under autocast (autocast_step.hpp: AutocastFamily), with
// the symbols there: N = r·T tokens of the micro-batch, a = 4Nh, Λ = 4NV, X = 16N.
#pragma once

#include "harness/predict/piece_forms.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// One micro-batch of `rows` sequences through a GPT-2 or Llama piece under autocast:
//   held from F to B   activation  n·K − a + in + (last: a + stats + a/2 + Λ + 4)
//                      param_cast  n·c + (last: W_V/2, the head's weight cast)
//     in = base (first), a (received), 0 (the previous chunk's output on this stage)
//   saved bytes        the held ones, both categories, with the ids (8N, first), the
//                      target (8N, last) and an input the previous chunk here holds (a)
//   F's instants       the top block's forward instants above in + (n−1)·K and casts
//                      (n−1)·c; the last piece's head GEMM (a + W_V + Λ temp beside y's
//                      cast a/2 and the head's cast)
//   end of F           its output a, or the logits Λ and the loss scalar 4
//   B's instants       the last piece's dlogits, the head's backward and the final norm's
//                      dx; then the top block's backward instants, its dy the received
//                      gradient (comm) unless last.
PieceForms gpt2_autocast_piece(const TransformerShape& shape, int rows, const PiecePlace& place);
PieceForms llama_autocast_piece(const TransformerShape& shape, int rows, const PiecePlace& place);

}  // namespace shardscope
