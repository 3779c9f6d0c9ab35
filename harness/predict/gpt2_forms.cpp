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

#include "harness/predict/transformer_piece.hpp"

#include <string>
#include <vector>

namespace shardscope {
namespace {

using i64 = std::int64_t;

// Under tensor parallelism (tp = T > 1) a rank's attention holds H/T heads and its MLP
// f/T features: q = a/T is one of its (N, h/T) tensors (q, k, v, y), and F, A and the
// logits Λ are its parts, F/T, A/T and Λ/T; a (the residual stream, the norms) is whole.
// Under --sp the residual stream's a, and the norms' statistics 16N a block, are the
// rank's N/T tokens' (a/T, 16N/T): the Sizes' a is then a/T, ns = N/T; w is the whole
// (N, h)'s 4Nh, the gathered and partial tensors' bytes.
struct Sizes : TokenSizes {
  i64 q = 0;  // one (N, h/T) tensor of the attention: a with one rank
  i64 v = 0;  // math: what saving v holds (a copy, q; with B = 1 or H/T = 1 the qkv it views, 3q)
  i64 w = 0;  // the whole (N, h): 4Nh
  i64 ns = 0;  // the stream's tokens: N, or N/T under --sp
};

Sizes sizes(const TransformerShape& s, int batch, int tp = 1, bool sp = false) {
  Sizes z;
  static_cast<TokenSizes&>(z) = token_sizes(s, batch);
  z.q = z.a / tp;
  z.F /= tp;
  z.A /= tp;
  z.lambda /= tp;
  z.v = batch == 1 || s.heads / tp == 1 ? 3 * z.q : z.q;
  z.w = z.a;
  z.ns = sp ? z.N / tp : z.N;
  if (sp) z.a /= tp;
  return z;
}

}  // namespace

SavedForm gpt2_block_saved(const TransformerShape& shape, int batch, int tp, bool sp) {
  const Sizes z = sizes(shape, batch, tp, sp);
  return {4 * z.a + 4 * z.q + 2 * z.F + 16 * z.ns + z.A + (z.flash ? 0 : z.v - z.q), z.flash ? 13 : 15};
}

SavedForm gpt2_saved_after_forward(const TransformerShape& shape, int batch, const CheckpointPolicy& checkpoint,
                                   int tp, bool sp) {
  const Sizes z = sizes(shape, batch, tp, sp);
  SavedForm block = gpt2_block_saved(shape, batch, tp, sp);
  // --checkpoint attention: no probabilities (math) or log-sum-exp (flash).
  if (checkpoint.attention()) block = {block.bytes - z.A, block.tensors - 1};
  const int w = checkpoint.wrapped_of(z.L);  // each saves its input alone
  return {8 * z.N + 8 * z.T + (z.L - w) * block.bytes + w * z.a + z.a + 8 * z.ns + z.a + z.lambda + 8 * z.N + 4,
          9 + (z.L - w) * block.tensors + w};
}

StepBlocks gpt2_blocks(const TransformerShape& shape, int batch, bool recompute_attention, int tp, bool sp) {
  const Sizes z = sizes(shape, batch, tp, sp);
  const i64 a = z.a, q = z.q, F = z.F, A = z.A, N = z.N, ns = z.ns, w = z.w;
  const i64 g = 8 * static_cast<i64>(shape.hidden);  // --sp: a LayerNorm's part of its gradients (2h floats)
  const i64 X = 16 * N;
  const i64 V = z.v;
  // --checkpoint attention: the attention's own save A (math's probabilities, flash's
  // log-sum-exp) is not kept from forward to backward.
  const i64 R = recompute_attention ? A : 0;
  StepBlocks blocks(z);
  blocks.base = 8 * z.T + a;  // arange(T) and x0
  blocks.K = gpt2_block_saved(shape, batch, tp, sp).bytes - R;
  // Its forward's attention, from S: ln_1's mean, rstd and output (8N + a), q, k and v's
  // save V, the probabilities A and the head-major output (temp q). The probabilities are
  // freed before the output is copied token-major: that instant (8N + a + 3q + V, temp q)
  // and the head-major copies beside qkv (8N + a + 3q, temp 3q) lie below the block's output.
  // --sp: mlp.c_proj's whole partial product (w, temp) beside every save of the block and
  // its output, which every other gathered or partial tensor of its forward lies below.
  const i64 K_sp = blocks.K;
  if ((R > 0 && !z.flash) || sp)
    blocks.forward_attention = [=](PeakWalk& walk, i64 S, i64 pu, i64 gu, const std::string& where) {
      if (R > 0 && !z.flash) walk.consider(X + q, S + 8 * ns + a + 2 * q + V + A, pu, gu, Phase::forward, where);
      if (sp) walk.consider(X + w, S + K_sp, pu, gu, Phase::forward, where);
    };
  // vocab_parallel_cross_entropy's statistics: max and sum, (N) each, temp.
  if (tp > 1) blocks.loss_stats = 8 * N;
  blocks.final_held = 8 * ns + a;  // ln_f's mean, rstd and output
  if (sp) sequence_parallel_final(blocks, w, g);
  // A wrapped block's re-run: its allocations only grow up to its output (math's qkv,
  // copied head-major and freed, and the head-major attention output hold less:
  // 8N + 7a and 8N + 6a + A beside K + a), so its highest instant is the output made.
  const i64 K = blocks.K;
  // Under --sp its mlp.c_proj's whole partial product (w) lies beside that output.
  blocks.recompute = [=](PeakWalk& walk, i64 S, i64 pu, i64 gu, const std::string& where) {
    if (sp) walk.consider(X + 2 * a + w, S + K - a, pu, gu, Phase::backward, where, true);
    walk.consider(X + 2 * a, S + K - a, pu, gu, Phase::backward, where, true);
  };
  // A top block's gradient buffers, from its output freed (A4), dy = a. Under tensor
  // parallelism the input gradients of c_fc and c_attn (d ln_2 out, d ln_1 out) are
  // all-reduced in place: no buffer more.
  blocks.backward = [=](PeakWalk& walk, i64 A4, i64 pu, i64 gu, const std::string& where) {
    auto consider = [&](i64 temp, i64 act, bool dy_live = false) {
      walk.consider(temp, act, pu, gu, Phase::backward, where, dy_live);
    };
    if (!sp) {
      consider(X + a + F, A4, true);                   // d gelu
      consider(X + 2 * a + F, A4 - 2 * F, true);       // d ln_2 out
      consider(X + 3 * a, A4 - 2 * F - a, true);       // d x_mid
    } else {
      // dy gathered (w), d gelu; ln_2's output gathered (w) beside c_fc's whole input
      // gradient (w), which is reduce-scattered to d ln_2 out (a); d x_mid with ln_2's
      // part of its gradients (g).
      consider(X + a + w, A4, true);
      consider(X + a + w + F, A4, true);
      consider(X + a + F + w, A4 - 2 * F, true);
      consider(X + a + F + 2 * w, A4 - 2 * F, true);
      consider(X + 2 * a + F + w, A4 - 2 * F, true);
      consider(X + 3 * a, A4 - 2 * F - a, true);
      consider(X + 3 * a + g, A4 - 2 * F - a, true);
    }
    // A8: the activations at the attention's backward with the probabilities held (under
    // --checkpoint attention only once they are recomputed, R = A before).
    const i64 A8 = A4 - 2 * F - 2 * a - 8 * ns + R;
    if (sp) {
      consider(X + a + w, A8 - R);             // d x_mid gathered
      consider(X + a + w + q, A8 - R);         // d attention output beside it
    }
    consider(X + a + q, A8 - R);               // d attention output
    if (z.flash) {
      if (R > 0) {                             // the flash forward again: its output, its lse
        consider(X + a + q, A8 - R + q);
        consider(X + a + q, A8 + q);
      }
      consider(X + a + 4 * q, A8 + (R > 0 ? q : 0));  // d qkv
    } else {
      consider(X + a + 2 * q, A8 - q - R);         // d out, head-major
      if (R > 0) consider(X + a + q, A8 - q);      // the probabilities recomputed (dout freed)
      consider(X + a + q + A, A8 - q);             // d probabilities
      consider(X + a + 2 * q + A, A8 - q);         // d v
      consider(X + a + 2 * q + A, A8 - q - V - A); // d q
      consider(X + a + 3 * q + A, A8 - q - V - A); // d k
      consider(X + a + 6 * q, A8 - 3 * q - V - A); // d qkv
    }
    const i64 A9 = z.flash ? A8 - 4 * q - A : A8 - 3 * q - V - A;
    if (!sp) {
      consider(X + 2 * a + 3 * q, A9);           // d ln_1 out
      consider(X + 3 * a, A9 - a);               // dx
    } else {
      // ln_1's output gathered (w), c_attn's whole input gradient (w) reduce-scattered to
      // d ln_1 out (a); dx with ln_1's part of its gradients (g).
      consider(X + a + 3 * q + w, A9);
      consider(X + a + 3 * q + 2 * w, A9);
      consider(X + 2 * a + 3 * q + w, A9);
      consider(X + 3 * a, A9 - a);
      consider(X + 3 * a + g, A9 - a);
    }
  };
  return blocks;
}

StepTransient gpt2_step_transient(const TransformerShape& shape, int batch, const StepUnits& units,
                                  const CheckpointPolicy& checkpoint, int tp, bool sp) {
  StepBlocks blocks = gpt2_blocks(shape, batch, checkpoint.attention(), tp, sp);
  blocks.checkpoint = checkpoint;
  return transformer_step_transient(blocks, units);
}

PieceForms gpt2_piece(const TransformerShape& shape, int rows, const PiecePlace& place, int tp, bool sp) {
  // Saves a block records: x, ln_1's mean, rstd, weight and output, c_attn's weight, then
  // flash's qkv, output and lse or math's q, k, probabilities and v; c_proj's input and
  // weight, x_mid, ln_2's mean, rstd, weight and output, c_fc's weight, its output (GELU's
  // input), GELU's output and mlp c_proj's weight. The embeddings: the ids and arange;
  // the final block: ln_f's input, mean, rstd, weight and output, and the head's weight.
  const bool flash = shape.attention == AttentionMode::flash;
  const int block = flash ? 20 : 21;
  PieceSaves saves{2, block, 6};
  if (place.checkpoint.attention()) {
    // --checkpoint attention: the core's own save (lse, probabilities) not recorded in F;
    // in B flash saves its re-run's output and lse (q + A), math the probabilities (A),
    // once GELU's and c_fc's outputs (2F), ln_2's output, x_mid and statistics (2a + 16N:
    // the stream's) and, in math, c_proj's y (q; flash's output save keeps it) are released.
    const Sizes z = sizes(shape, rows, tp, sp);
    saves.block -= 1;
    saves.attention_resaves = flash ? 2 : 1;
    saves.attention_resave_bytes = flash ? z.q + z.A : z.A;
    saves.attention_released_bytes = 2 * z.F + 2 * z.a + 8 * z.ns + (flash ? 0 : z.q);
  }
  PieceForms p = transformer_piece(gpt2_blocks(shape, rows, place.checkpoint.attention(), tp, sp), saves, place);
  if (sp) return p;  // --sp: no zero-bubble split (pipeline_stage.cpp refuses it)
  // Between B and W (zb-h1, zbv). A block keeps saved its input x, ln_1's and ln_2's mean,
  // rstd and output, y, x_mid and GELU's output (4a + q + 16N + F, in 12 saves with the
  // two norms' weights), and as temp its output gradients: c_fc's (F), ln_2's, c_proj's
  // (dx_mid) and ln_1's (a each), dqkv (3q), and its dy (a: the block above's dx; the
  // top block's on a piece other than the last is the received gradient, comm). The
  // embeddings keep arange (8T; the ids, 8N, saved too) and their dy (a); the final
  // block its input, ln_f's mean, rstd and output (2a + 8N, 5 saves) and dlogits and
  // d ln_f (Λ + a). Under tensor parallelism q, F, A and Λ are the rank's (sizes at tp:
  // q = a/T, the attention's tensors; a whole); with one rank q = a.
  const Sizes z = sizes(shape, rows, tp);
  const std::int64_t n = place.blocks, a = z.a, q = z.q, N = z.N;
  // zbv's V bottom: a piece whose input is the previous chunk's output on this stage does
  // not own its first block's x (that chunk's temp), though it saves it; and its top
  // block's dy is that chunk's dx (temp), not a received gradient.
  const std::int64_t local_in = !place.first && !place.recv_act ? a : 0;
  const bool dy_received = !place.last && place.send_act;
  p.half_act =
      n * (4 * a + q + 16 * N + z.F) + (place.first ? 8 * z.T : 0) + (place.last ? 2 * a + 8 * N : 0) - local_in;
  p.half_temp = n * (3 * a + 3 * q + z.F) + (n - (place.last ? 0 : 1)) * a + (place.first ? a : 0) +
                (place.last ? z.lambda + a : 0);
  p.half_comm = dy_received ? a : 0;
  p.half_temp += !place.last && !dy_received ? a : 0;
  p.half_saves = 12 * n + (place.first ? 2 : 0) + (place.last ? 5 : 0);
  p.half_saved_bytes = p.half_act + local_in + (place.first ? 8 * N : 0);
  // B's instants. The last piece: dlogits (Λ, the log-probabilities and total_weight then
  // freed), d ln_f (a; all-reduced in place under tp), ln_f's dx (a, the top block's dy)
  // with the norm's scratch (2h floats, 8h). Each block from (act, temp): d gelu (F),
  // GELU's input freed, d ln_2 out (a), d x_mid (a) with the scratch, d y (q); the
  // attention (flash: dqkv 3q beside d y, then qkv and lse freed, R = 3q + A; math: its
  // buffers as the whole backward's, y kept, R = 2q + v + A); d ln_1 out (a), dx (a)
  // with the scratch. A block ends F + R lower in activation and F + 4a + 3q higher in
  // temp than it began: each instant is linear in the block's depth, so the top and the
  // bottom block bound them.
  const std::int64_t F = z.F, A = z.A, V = z.v, s8 = 8 * static_cast<std::int64_t>(shape.hidden);
  std::vector<PieceMoment>& m = p.split_backward;
  std::int64_t act = 0, temp = 0;
  if (place.last) push_head_split_backward(m, z.lambda, a, s8, act, temp);
  const std::int64_t R = flash ? 3 * q + A : 2 * q + V + A;
  auto one_block = [&](std::int64_t x, std::int64_t t) {
    const std::int64_t t2 = t + F + 2 * a;  // d gelu, d ln_2 out and d x_mid kept
    m.push_back({x, t + F, true});
    m.push_back({x - F, t + F + a, true});
    m.push_back({x - F, t2 + s8, true});
    m.push_back({x - F, t2 + q, true});
    if (flash) {
      m.push_back({x - F, t2 + 4 * q, true});
    } else {
      m.push_back({x - F, t2 + 2 * q, true});
      m.push_back({x - F, t2 + q + A, true});
      m.push_back({x - F, t2 + 2 * q + A, true});
      m.push_back({x - F - V - A, t2 + 2 * q + A, true});
      m.push_back({x - F - V - A, t2 + 3 * q + A, true});
      m.push_back({x - F - V - A - 2 * q, t2 + 6 * q, true});
    }
    m.push_back({x - F - R, t2 + 3 * q + a, true});
    m.push_back({x - F - R, t2 + 3 * q + 2 * a + s8, true});
  };
  one_block(act, temp);
  if (n > 1) one_block(act - (n - 1) * (F + R), temp + (n - 1) * (F + 4 * a + 3 * q));
  // A piece other than the last frees its output as its top block starts (held as temp
  // when the next chunk is on this stage).
  if (!place.last)
    for (PieceMoment& mo : m) {
      mo.temp -= p.held_temp;
      mo.output_freed = true;
    }
  return p;
}

}  // namespace shardscope
