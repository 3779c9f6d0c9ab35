// A transformer's pipeline piece under autocast (autocast_piece.hpp), from the family's
// blocks under autocast (autocast_step.cpp writes each instant out).
#include "harness/predict/autocast_piece.hpp"

#include <algorithm>
#include <vector>

#include "harness/predict/autocast_step.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

// The saves each part records (counts): the embeddings', one block's, the final block's
// (the loss's three beside them).
struct Saves {
  int embeddings = 0, block = 0, final_block = 0;
};

PieceForms autocast_piece(const AutocastFamily& f, const TokenSizes& z, const Saves& saves, const PiecePlace& place) {
  const i64 a = z.a, lambda = f.lambda, N = z.N, n = place.blocks;
  const i64 X = 16 * N;  // the ids and the target in the walk's temp: the stage's base here
  const i64 in = place.first ? f.base : place.recv_act ? a : 0;
  const i64 head = f.stats + a / 2;  // the final block's beside its input: statistics, y's cast
  // --checkpoint full|every:K: a wrapped block holds its output a (not K) past its forward,
  // and its casts only until the micro-batch's region ends with the stage's forward (the
  // cache's: its saves dropped); its re-run makes them again, saved to its backward.
  // Blocks [0, i): held_below(i) activations, kept_below(i) casts past the forward.
  auto held_below = [&](i64 i) {
    const i64 w = place.wrapped_in(0, static_cast<int>(i));
    return w * a + (i - w) * f.K;
  };
  auto kept_below = [&](i64 i) { return (i - place.wrapped_in(0, static_cast<int>(i))) * f.c; };
  const i64 wrapped = place.wrapped_in(0, static_cast<int>(n)), top_wrapped = place.top_wrapped();
  PieceForms p;
  p.boundary = a;
  p.input = a;
  p.held_act = held_below(n) - a + in + (place.last ? a + head + lambda + 4 : 0);
  p.held_cast = kept_below(n) + (place.last ? f.W_V / 2 : 0);
  // Every weight's cast is saved (the biases' are the GEMMs' temps): under one region a step
  // each is made once, wrapped or not.
  p.step_cast = n * f.c + (place.last ? f.W_V / 2 : 0);
  p.saved_bytes = p.held_act + p.held_cast + (place.first ? 8 * N : 0) + (place.last ? 8 * N : 0) +
                  (!place.first && !place.recv_act ? a : 0);
  p.saves = (n - wrapped) * saves.block + wrapped + (place.first ? saves.embeddings : 0) +
            (place.last ? saves.final_block + 3 : 0);
  p.recompute_saves = wrapped * saves.block;
  if (top_wrapped >= 0) {
    // The topmost wrapped block's re-run ends with its saves recorded again (K − a and its
    // casts c; its input the checkpoint's), the blocks above it (K + c each) and, on the
    // last piece, the loss (Λ + 8N + 4) and the final block (its input, statistics, y's
    // cast and the head's weight cast) released.
    const i64 above = n - 1 - top_wrapped;
    const i64 released = above * saves.block + (place.last ? saves.final_block + 3 : 0);
    const i64 released_bytes =
        above * (f.K + f.c) + (place.last ? lambda + 8 * N + 4 + a + head + f.W_V / 2 : 0);
    p.recompute_live = std::max<i64>(0, saves.block - released);
    p.recompute_live_bytes = std::max<i64>(0, f.K - a + f.c - released_bytes);
    // --autocast-region step: the re-run's casts are the cache's (saved by no other pair: the
    // block's forward saves were dropped), but the casts the blocks above and the head
    // release stay saved by another live pair of the chunk, when there is one.
    p.recompute_live_bytes_shared =
        std::max<i64>(0, f.K - a + f.c - released_bytes + above * f.c + (place.last ? f.W_V / 2 : 0));
  }
  p.held_temp = !place.last && !place.send_act ? a : 0;
  p.forward_temp = place.last ? lambda + 4 + f.loss_stats : a;
  // F: the top block's instants (every lower block's lie below them: more held, as many
  // casts or more), every block's casts in the cache to the region's end.
  // A wrapped block's output made (fp32, activation when the next block or the final one
  // saves it, else temp) beside its last GEMM's fp32 product (a, temp), its saves and casts
  // not yet dropped: the topmost one's (a lower one's lies below the blocks' above it), in
  // time order with the top block's instants.
  const i64 below_top = in + held_below(n - 1);
  auto wrapped_output = [&] {
    const bool saved = top_wrapped + 1 < n || place.last;
    p.forward.push_back({in + held_below(top_wrapped) + f.K - a + (saved ? a : 0), saved ? a : 2 * a, false, false,
                         (top_wrapped + 1) * f.c});
  };
  if (top_wrapped >= 0 && top_wrapped < n - 1) wrapped_output();
  for (const AutocastInstant& i : f.forward)
    p.forward.push_back({below_top + i.act, i.temp - X, false, false, (n - 1) * f.c + i.cast});
  if (top_wrapped == n - 1) wrapped_output();
  if (place.last)
    p.forward.push_back({in + held_below(n) + head, a + f.W_V + lambda, false, false, n * f.c + f.W_V / 2});
  // The end of F with the wrapped blocks' casts still cached (the region ends after it).
  if (wrapped > 0) p.forward.push_back({p.held_act, p.forward_temp, false, false, p.step_cast});
  // B, relative to its start (this micro-batch's held bytes included).
  std::vector<PieceMoment>& m = p.backward;
  if (place.last) {
    m.push_back({0, lambda, false});                                             // dlogits
    m.push_back({-lambda - 4, lambda + 2 * a + f.W_V, false});                   // the head's backward
    m.push_back({-lambda - 4 - a / 2, 2 * a, false, false, -f.W_V / 2});         // the final norm's dx
  }
  // The top block starts with its output freed: below the held bytes by what the piece
  // holds past the top block's input (H, relative), its casts by what it holds past the
  // blocks below's (C). A wrapped block first re-runs (its forward's instants beside dy,
  // then its output, temp, beside K − a and its casts c); then its backward's instants.
  // The topmost wrapped block below the top, when there is one, from its own H and C
  // (every other block's instants lie below one of these two's).
  const bool outer = !place.last;
  auto block = [&](i64 j, i64 H, i64 C) {
    const bool top = j == n - 1;
    auto push = [&](i64 temp, i64 act, i64 cast, bool dy_live) {
      const bool live = outer && top && dy_live;
      m.push_back({H + act, temp - X - (live ? a : 0) - (outer ? p.held_temp : 0), live, false, C + cast});
    };
    if (place.wraps(static_cast<int>(j))) {
      for (const AutocastInstant& i : f.forward) push(i.temp + a, i.act, i.cast, true);
      push(X + 3 * a, f.K - a, f.c, true);
    }
    for (const AutocastInstant& i : f.backward) push(i.temp, i.act, i.cast, i.dy_live);
  };
  const i64 H_top = -(p.held_act - in - held_below(n - 1)), C_top = -(p.held_cast - kept_below(n - 1));
  block(n - 1, H_top, C_top);
  if (top_wrapped >= 0 && top_wrapped < n - 1)
    block(top_wrapped, H_top - (held_below(n - 1) - held_below(top_wrapped)),
          C_top - (kept_below(n - 1) - kept_below(top_wrapped)));
  return p;
}

}  // namespace

PieceForms mlp_autocast_piece(const PiecePlace& place, int width, int rows, bool relu, bool mse) {
  const i64 w = width, a = 2 * w * rows, A = 4 * w * rows, c = 2 * w * w, cb = 2 * w, n = place.blocks;
  const i64 first = place.first ? 1 : 0, ls = relu ? 1 : 0, m = place.last && mse ? 1 : 0;
  PieceForms p;
  p.boundary = p.input = a;
  p.held_act = a * ((place.recv_act ? 1 : 0) + first + n - 1 + ls) + m * A;
  p.held_cast = c * (n - first);
  p.step_cast = n * (c + cb);  // every weight's and bias's cast, the unsaved ones with them
  p.held_temp = !relu && !place.last && !place.send_act ? a : 0;
  p.forward_temp = (relu ? 0 : a) + (place.last ? 4 : 0);
  p.output_saved = relu;
  // Saves: every Linear's input, the weight casts saved, ReLU's outputs, mse's input and
  // target; distinct bytes: n inputs, the last output with relu, the casts, mse's two.
  p.saves = n + (n - first) + (relu ? n : 0) + 2 * m;
  p.saved_bytes = a * (n + ls) + c * (n - first) + 2 * m * A;
  // The end of F with autocast's cast cache still holding the biases' casts (and the first
  // Linear's weight cast): the region ends after it.
  p.forward.push_back({p.held_act, p.forward_temp, false, false, p.held_cast + n * cb + first * c});
  std::vector<PieceMoment>& b = p.backward;
  i64 act = 0, dy = 0;  // the loss gradient (temp) on the last piece
  if (place.last && mse) {
    b.push_back({0, A, true});
    act = -A;
    b.push_back({act, A + a, true});
  }
  if (place.last) dy = a;
  b.push_back({act, dy + 3 * c, true});
  if (n > 1 || !place.first) b.push_back({act, dy + a, true});
  return p;
}

// GPT-2's saves under autocast are fp32's by count: x, ln_1's mean, rstd, weight and
// output cast, c_attn's weight cast, flash's qkv, output and lse (math's q, k,
// probabilities and v), c_proj's weight cast and input, x_mid, ln_2's mean, rstd, weight
// and output cast, c_fc's weight cast, its output, GELU's output and mlp c_proj's weight
// cast; the embeddings' ids and arange; the final block's input, mean, rstd, weight, y's
// cast and the head's weight cast.
PieceForms gpt2_autocast_piece(const TransformerShape& shape, int rows, const PiecePlace& place, int tp) {
  const int block = shape.attention == AttentionMode::flash ? 20 : 21;
  return autocast_piece(gpt2_autocast_family(shape, rows, tp), token_sizes(shape, rows), {2, block, 6}, place);
}

// Llama's: as fp32's, each of q, k and v saving its own input cast.
PieceForms llama_autocast_piece(const TransformerShape& shape, int rows, const PiecePlace& place, int tp) {
  const int layer = shape.attention == AttentionMode::flash ? 28 : 27;
  return autocast_piece(llama_autocast_family(shape, rows, tp), token_sizes(shape, rows), {1, layer, 5}, place);
}

}  // namespace shardscope
