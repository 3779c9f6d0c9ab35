// GPT-2's saved bytes and what its blocks hold in a data-parallel step's walk
// (gpt2_forms.hpp has the symbols; transformer_step.cpp the walk itself).
//
// Live bytes by category (X = 16N: the batch's ids and the target, temp throughout):
//   per transformer block, activation  K = 8a + 2F + 16N + A (+ 2a: math with B or H
//     1) (ln_1's mean, rstd and output; qkv and the output (flash) or q, k, v and y
//     (math): 4a; the lse or the probabilities; x_mid; ln_2's mean, rstd, output;
//     c_fc's and GELU's outputs; and the block's output, which the next block saves)
//   the embeddings: arange(T) 8T and x0 a; ln_f: mean and rstd 8N, output a
// The top block's backward: each gradient buffer as it is made.
#include "harness/predict/gpt2_forms.hpp"

#include <string>
#include <vector>

namespace shardscope {
namespace {

using i64 = std::int64_t;

struct Sizes : TokenSizes {
  i64 v = 0;  // math: what saving v holds (a copy, a; with B = 1 or H = 1 the qkv it views, 3a)
};

Sizes sizes(const TransformerShape& s, int batch) {
  Sizes z;
  static_cast<TokenSizes&>(z) = token_sizes(s, batch);
  z.v = batch == 1 || s.heads == 1 ? 3 * z.a : z.a;
  return z;
}

}  // namespace

SavedForm gpt2_block_saved(const TransformerShape& shape, int batch) {
  const Sizes z = sizes(shape, batch);
  return {8 * z.a + 2 * z.F + 16 * z.N + z.A + (z.flash ? 0 : z.v - z.a), z.flash ? 13 : 15};
}

SavedForm gpt2_saved_after_forward(const TransformerShape& shape, int batch) {
  const Sizes z = sizes(shape, batch);
  const SavedForm block = gpt2_block_saved(shape, batch);
  return {8 * z.N + 8 * z.T + z.L * block.bytes + z.a + 8 * z.N + z.a + z.lambda + 8 * z.N + 4,
          9 + z.L * block.tensors};
}

StepTransient gpt2_step_transient(const TransformerShape& shape, int batch, const StepUnits& units) {
  const Sizes z = sizes(shape, batch);
  const i64 a = z.a, F = z.F, A = z.A, N = z.N;
  const i64 X = 16 * N;
  const i64 V = z.v;
  StepBlocks blocks(z);
  blocks.base = 8 * z.T + a;  // arange(T) and x0
  blocks.K = gpt2_block_saved(shape, batch).bytes;
  blocks.final_held = 8 * N + a;  // ln_f's mean, rstd and output
  // A top block's gradient buffers, from its output freed (A4), dy = a.
  blocks.backward = [&](PeakWalk& walk, i64 A4, i64 pu, i64 gu, const std::string& where) {
    auto consider = [&](i64 temp, i64 act) { walk.consider(temp, act, pu, gu, Phase::backward, where); };
    consider(X + a + F, A4);                   // d gelu
    consider(X + 2 * a + F, A4 - 2 * F);       // d ln_2 out
    consider(X + 3 * a, A4 - 2 * F - a);       // d x_mid
    const i64 A8 = A4 - 2 * F - 2 * a - 8 * N;
    consider(X + 2 * a, A8);                   // d attention output
    if (z.flash) {
      consider(X + 5 * a, A8);                 // d qkv
    } else {
      consider(X + 3 * a, A8 - a);             // d out, head-major
      consider(X + 2 * a + A, A8 - a);         // d probabilities
      consider(X + 3 * a + A, A8 - a);         // d v
      consider(X + 3 * a + A, A8 - a - V - A); // d q
      consider(X + 4 * a + A, A8 - a - V - A); // d k
      consider(X + 7 * a, A8 - 3 * a - V - A); // d qkv
    }
    const i64 A9 = z.flash ? A8 - 4 * a - A : A8 - 3 * a - V - A;
    consider(X + 5 * a, A9);                   // d ln_1 out
    consider(X + 3 * a, A9 - a);               // dx
  };
  return transformer_step_transient(blocks, units);
}

PieceForms gpt2_piece(const TransformerShape& shape, int rows, const PiecePlace& place) {
  const Sizes z = sizes(shape, rows);
  const i64 a = z.a, F = z.F, A = z.A, lambda = z.lambda, N = z.N, n = place.blocks;
  const i64 K = gpt2_block_saved(shape, rows).bytes;
  // Saves a transformer block records: x, ln_1's mean, rstd, weight and output, c_attn's
  // weight, then flash's qkv, output and lse or math's q, k, probabilities and v; c_proj's
  // input and weight, x_mid, ln_2's mean, rstd, weight and output, c_fc's weight, its
  // output (GELU's input), GELU's output and mlp c_proj's weight.
  const i64 block_saves = z.flash ? 20 : 21;
  PieceForms p;
  p.boundary = a;
  p.input = a;
  p.saves = n * block_saves;
  p.saved_bytes = n * K;
  // The blocks' K counts each one's input: x0 (the embeddings' output, activation), the
  // received buffer (activation), or the previous chunk's unsaved output on this stage
  // (temp, held by that chunk).
  p.held_act = n * K - (place.first || place.recv_act ? 0 : a);
  if (place.first) {  // the token ids (the batch's slice, temp) and arange(T)
    p.saves += 2;
    p.saved_bytes += 8 * N + 8 * z.T;
    p.held_act += 8 * z.T;
  }
  if (place.last) {  // ln_f (input, mean, rstd, weight, output), the head's weight; the loss's three
    p.saves += 6 + 3;
    p.saved_bytes += 8 * N + 2 * a + lambda + 8 * N + 4;
    p.held_act += 8 * N + 2 * a + lambda + 4;
  }
  p.held_temp = !place.last && !place.send_act ? a : 0;
  p.forward_temp = place.last ? lambda + 4 : a;
  // B. The last piece: the loss's dlogits, the head's d ln_f, ln_f's dx (dlogits and ln_f's
  // output freed); then its top block starts with the final block's saves released and its
  // own output (ln_f's input) freed, dy the final block's dx (temp). Any other piece's top
  // block frees its output (held as temp on one stage, already sent on more) and reads the
  // gradient of it (dy_live until the residual adds it in).
  std::vector<PieceMoment>& m = p.backward;
  i64 y = 0, dy = 0;  // the top block's start: activation beyond held, its dy when temp
  const bool outer = !place.last;
  if (place.last) {
    m.push_back({0, lambda, false});
    m.push_back({-lambda - 4, lambda + a, false});
    m.push_back({-lambda - 4 - a, 2 * a, false});
    y = -(lambda + 4 + 2 * a + 8 * N);
    dy = a;
  }
  const i64 t = place.last ? 0 : -p.held_temp;  // the output a non-last piece held as temp is gone
  m.push_back({y, t + dy + F, outer});                      // d gelu
  m.push_back({y - 2 * F, t + dy + F + a, outer});          // d ln_2 out
  m.push_back({y - 2 * F - a, t + dy + 2 * a, outer});      // d x_mid
  const i64 a8 = y - 2 * F - 2 * a - 8 * N;
  m.push_back({a8, t + 2 * a, false});                      // d attention output (dy freed)
  if (z.flash) {
    m.push_back({a8, t + 5 * a, false});                    // d qkv
  } else {
    m.push_back({a8 - a, t + 3 * a, false});                // d out, head-major
    m.push_back({a8 - a, t + 2 * a + A, false});            // d probabilities
    m.push_back({a8 - a, t + 3 * a + A, false});            // d v
    m.push_back({a8 - a - z.v - A, t + 3 * a + A, false});  // d q
    m.push_back({a8 - a - z.v - A, t + 4 * a + A, false});  // d k
    m.push_back({a8 - 3 * a - z.v - A, t + 7 * a, false});  // d qkv
  }
  const i64 a9 = z.flash ? a8 - 4 * a - A : a8 - 3 * a - z.v - A;
  m.push_back({a9, t + 5 * a, false});                      // d ln_1 out
  m.push_back({a9 - a, t + 3 * a, false});                  // dx
  return p;
}

}  // namespace shardscope
