// A transformer's pipeline piece under autocast (autocast_piece.hpp), from the family's
// blocks under autocast (autocast_step.cpp writes each instant out).
#include "harness/predict/autocast_piece.hpp"

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
  PieceForms p;
  p.boundary = a;
  p.input = a;
  p.held_act = n * f.K - a + in + (place.last ? a + head + lambda + 4 : 0);
  p.held_cast = n * f.c + (place.last ? f.W_V / 2 : 0);
  p.step_cast = p.held_cast;  // every weight's cast is saved (the biases' are the GEMMs' temps)
  p.saved_bytes = p.held_act + p.held_cast + (place.first ? 8 * N : 0) + (place.last ? 8 * N : 0) +
                  (!place.first && !place.recv_act ? a : 0);
  p.saves = n * saves.block + (place.first ? saves.embeddings : 0) + (place.last ? saves.final_block + 3 : 0);
  p.held_temp = !place.last && !place.send_act ? a : 0;
  p.forward_temp = place.last ? lambda + 4 + f.loss_stats : a;
  // F: the top block's instants (every lower block's lie below them: K > 0 more held).
  for (const AutocastInstant& i : f.forward)
    p.forward.push_back({in + (n - 1) * f.K + i.act, i.temp - X, false, false, (n - 1) * f.c + i.cast});
  if (place.last) p.forward.push_back({in + n * f.K + head, a + f.W_V + lambda, false, false, n * f.c + f.W_V / 2});
  // B, relative to its start (this micro-batch's held bytes included).
  std::vector<PieceMoment>& m = p.backward;
  if (place.last) {
    m.push_back({0, lambda, false});                                             // dlogits
    m.push_back({-lambda - 4, lambda + 2 * a + f.W_V, false});                   // the head's backward
    m.push_back({-lambda - 4 - a / 2, 2 * a, false, false, -f.W_V / 2});         // the final norm's dx
  }
  // The top block starts with its output freed: below the held bytes by what the piece
  // holds past the top block's input.
  const i64 above = p.held_act - in - (n - 1) * f.K;
  const i64 cast_above = p.held_cast - (n - 1) * f.c;
  const bool outer = !place.last;
  for (const AutocastInstant& i : f.backward) {
    const bool live = outer && i.dy_live;
    m.push_back({i.act - above, i.temp - X - (live ? a : 0) - (outer ? p.held_temp : 0), live, false,
                 i.cast - cast_above});
  }
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
