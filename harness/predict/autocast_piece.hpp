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
// The MLP's piece under autocast: each Linear's GEMM and ReLU give bf16, so what a stage
// sends and receives is bf16 (a = 2·width·r bytes a micro-batch and direction). With
// A = 4·width·r (fp32), c = 2·width² (a weight's cast), cb = 2·width (a bias's), n layers,
// first = [virtual stage 0], ls = [relu] (the last output saved), m = [mse and last]:
//   held from F to B   activation  a·([received] + first + n−1 + ls) + m·A (its received
//                      input or the batch's cast, the outputs the next Linears and ReLU
//                      save, mse's fp32 cast of the output)
//                      param_cast  c·(n − first): the saved weight casts (virtual stage
//                      0's first Linear's input needs no gradient: its cast is not saved)
//   end of F           the unsaved last output a (temp) and the loss scalar 4 (last),
//                      beside autocast's cast cache: every bias cast n·cb and the first
//                      Linear's weight cast, freed when the region ends
//   B's instants       the loss gradient (sum: a; mse: A beside its fp32 input, then A + a
//                      with the input freed); the top Linear's dW in bf16 and its fp32
//                      cast (3c), then dx (a, unless n = 1 on virtual stage 0), its dy the
//                      received gradient (comm) unless last.
PieceForms mlp_autocast_piece(const PiecePlace& place, int width, int rows, bool relu, bool mse);
// tp > 1: a tensor-parallel rank's piece (the family's blocks at tp, autocast_step.hpp; the
// boundary a whole).
PieceForms gpt2_autocast_piece(const TransformerShape& shape, int rows, const PiecePlace& place, int tp = 1);
PieceForms llama_autocast_piece(const TransformerShape& shape, int rows, const PiecePlace& place, int tp = 1);

}  // namespace shardscope
