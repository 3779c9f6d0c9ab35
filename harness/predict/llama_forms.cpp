// Llama's saved bytes and what its blocks hold in a data-parallel step's walk
// (llama_forms.hpp has the symbols; transformer_step.cpp the walk itself).
//
// Live bytes by category (X = 16N: the batch's ids and the target, temp throughout):
//   per decoder layer, activation  K = the layer's saves less its input, plus its output
//     (which the next block saves): the same bytes as its saves (flash 4a + 2Q + 2C + 8N
//     + A + 4F, math 4a + 4Q + 8N + A + 4F)
//   the embeddings: x0 a; the final norm: rstd 4N, output a
// The top layer's backward: each gradient buffer as it is made. Math's forward passes
// through temporaries too, which never set the peak: q, k, v token-major beside their
// head-major copies (Q + 2C) hold a less than the same layer's d q, k, v token-major in
// backward, and the head-major output beside the token-major one (Q) a less than its
// d out head-major (with the same or more gathered parameters).
#include "harness/predict/llama_forms.hpp"

#include "harness/predict/transformer_piece.hpp"

#include <string>

namespace shardscope {
namespace {

using i64 = std::int64_t;

struct Sizes : TokenSizes {
  i64 Q = 0, C = 0;  // q's (and math's expanded k's and v's) bytes, and k's and v's
  i64 w = 0;         // the whole (N, h): 4Nh
  i64 ns = 0;        // the stream's tokens: N, or N/T under --sp
  i64 P = 0;         // replicated kv heads (K < T): every kv head's k and v gradients, 8K·d(h + b)
};

// Under tensor parallelism (tp = T > 1) a rank holds H/T query heads and K/T kv heads (one
// kv head when K < T), and f/T of the MLP: Q, C, F, A and the logits Λ are its T-th (C
// one head's when K < T); a (the residual stream) whole, or under --sp (sp) its N/T
// tokens' a/T, the norms' statistics likewise.
Sizes sizes(const TransformerShape& s, int batch, int tp = 1, bool sp = false) {
  Sizes z;
  static_cast<TokenSizes&>(z) = token_sizes(s, batch);
  z.Q = 4 * z.N * (s.heads / tp) * s.head_dim;
  z.C = 4 * z.N * kv_heads_per_rank(s, tp) * s.head_dim;
  if (kv_replicas(s, tp) > 1) z.P = 8 * static_cast<i64>(s.kv_heads) * s.head_dim * (s.hidden + (s.qkv_bias ? 1 : 0));
  z.F /= tp;
  z.A /= tp;
  z.lambda /= tp;
  z.w = z.a;
  z.ns = sp ? z.N / tp : z.N;
  if (sp) z.a /= tp;
  return z;
}

}  // namespace

SavedForm llama_block_saved(const TransformerShape& shape, int batch, int tp, bool sp) {
  const Sizes z = sizes(shape, batch, tp, sp);
  const i64 attention = z.flash ? 2 * z.Q + 2 * z.C : 4 * z.Q;
  return {4 * z.a + attention + 8 * z.ns + z.A + 4 * z.F, 15};
}

SavedForm llama_saved_after_forward(const TransformerShape& shape, int batch, const CheckpointPolicy& checkpoint,
                                    int tp, bool sp) {
  const Sizes z = sizes(shape, batch, tp, sp);
  SavedForm block = llama_block_saved(shape, batch, tp, sp);
  // --checkpoint attention: no probabilities (math) or log-sum-exp (flash).
  if (checkpoint.attention()) block = {block.bytes - z.A, block.tensors - 1};
  const int w = checkpoint.wrapped_of(z.L);  // each saves its input alone
  return {8 * z.N + (z.L - w) * block.bytes + w * z.a + 2 * z.a + 4 * z.ns + z.lambda + 8 * z.N + 4,
          7 + (z.L - w) * block.tensors + w};
}

StepBlocks llama_blocks(const TransformerShape& shape, int batch, bool recompute_attention, int tp, bool sp) {
  const Sizes z = sizes(shape, batch, tp, sp);
  const i64 a = z.a, Q = z.Q, C = z.C, F = z.F, A = z.A, N = z.N, ns = z.ns, w = z.w, P = z.P;
  const i64 g = 4 * static_cast<i64>(shape.hidden);  // --sp: an RMSNorm's part of its gradient (h floats)
  const i64 X = 16 * N;
  // --checkpoint attention: the attention's own save A (math's probabilities, flash's
  // log-sum-exp) is not kept from forward to backward.
  const i64 R = recompute_attention ? A : 0;
  StepBlocks blocks(z);
  blocks.base = a;  // x0
  blocks.K = llama_block_saved(shape, batch, tp, sp).bytes - R;
  // vocab_parallel_cross_entropy's statistics: max and sum, (N) each, temp.
  if (tp > 1) blocks.loss_stats = 8 * N;
  // Its forward's attention, from S: the input norm's rstd and output (4N + a), q, k, v
  // token-major (temp Q + 2C) beside their head-major copies (3Q); then the probabilities
  // A and the head-major output (temp Q); then, the probabilities freed, the token-major
  // output Q.
  // --sp: down_proj's whole partial product (w, temp) beside every save of the layer and
  // its output, which every other gathered or partial tensor of its forward lies below.
  const i64 K_sp = blocks.K;
  if ((R > 0 && !z.flash) || sp)
    blocks.forward_attention = [=](PeakWalk& walk, i64 S, i64 pu, i64 gu, const std::string& where) {
      auto consider = [&](i64 temp, i64 act) { walk.consider(temp, act, pu, gu, Phase::forward, where); };
      if (R > 0 && !z.flash) {
        consider(X + Q + 2 * C, S + 4 * ns + a + 3 * Q);
        consider(X + Q, S + 4 * ns + a + 3 * Q + A);
        consider(X + Q, S + 4 * ns + a + 4 * Q);
      }
      if (sp) consider(X + w, S + K_sp);
    };
  blocks.final_held = 4 * ns + a;  // the final norm's rstd and output
  if (sp) sequence_parallel_final(blocks, w, g);
  // A wrapped layer's re-run, from S with dy = a: math's q, k, v token-major (temp)
  // beside their head-major copies, then (those freed) the probabilities and the
  // head-major output (temp) beside the token-major one; then its output (temp).
  const i64 K = blocks.K;
  blocks.recompute = [=](PeakWalk& walk, i64 S, i64 pu, i64 gu, const std::string& where) {
    auto consider = [&](i64 temp, i64 act) { walk.consider(temp, act, pu, gu, Phase::backward, where, true); };
    if (!z.flash) {
      consider(X + a + Q + 2 * C, S + 4 * ns + a + 3 * Q);
      consider(X + a + Q, S + 4 * ns + a + 4 * Q + A);
    }
    if (sp) consider(X + 2 * a + w, S + K - a);  // --sp: down_proj's whole partial product beside it
    consider(X + 2 * a, S + K - a);
  };
  // A top layer's gradient buffers, from its output freed (A4), dy = a.
  blocks.backward = [=](PeakWalk& walk, i64 A4, i64 pu, i64 gu, const std::string& where) {
    auto consider = [&](i64 temp, i64 act, bool dy_live = false) {
      walk.consider(temp, act, pu, gu, Phase::backward, where, dy_live);
    };
    if (!sp) {
      consider(X + a + F, A4, true);                  // d product
      consider(X + a + 2 * F, A4 - F, true);          // d up
      consider(X + 2 * a + 2 * F, A4 - 4 * F, true);  // d y2
      consider(X + 3 * a, A4 - 4 * F - a, true);      // d x_mid
    } else {
      // dy gathered (w), d product; d up; y2's tokens gathered (w) beside gate's and up's
      // whole input gradient (w), reduce-scattered to d y2 (a) once the gathered y2 and
      // d gate are freed; d x_mid with the norm's part of its gradient (g).
      consider(X + a + w, A4, true);
      consider(X + a + w + F, A4, true);
      consider(X + a + 2 * F, A4 - F, true);
      consider(X + a + 2 * F + w, A4 - 4 * F, true);
      consider(X + a + 2 * F + 2 * w, A4 - 4 * F, true);
      consider(X + 2 * a + F + w, A4 - 4 * F, true);
      consider(X + 3 * a, A4 - 4 * F - a, true);
      consider(X + 3 * a + g, A4 - 4 * F - a, true);
    }
    // A5: the activations at the attention's backward with the probabilities held (under
    // --checkpoint attention only once they are recomputed, R = A before).
    const i64 A5 = A4 - 4 * F - 2 * a - 4 * ns + R;
    if (sp) {
      consider(X + a + w, A5 - R);            // d x_mid gathered
      consider(X + a + w + Q, A5 - R);        // d out beside it
    }
    consider(X + a + Q, A5 - R);              // d out
    i64 A6 = 0;
    if (z.flash) {
      if (R > 0) {                            // the flash forward again: its output, its lse
        consider(X + a + Q, A5 - R + Q);
        consider(X + a + Q, A5 + Q);
      }
      consider(X + a + 2 * Q + 2 * C, A5 + (R > 0 ? Q : 0));  // d q, k, v
      A6 = A5 - 2 * Q - 2 * C - A;
    } else {
      const i64 Am = A5 - Q;  // out, which only o_proj saved, freed
      consider(X + a + 2 * Q, Am - R);          // d out, head-major
      if (R > 0) consider(X + a + Q, Am);       // the probabilities recomputed (dout freed)
      consider(X + a + Q + A, Am);              // d probabilities
      consider(X + a + 2 * Q + A, Am);          // d v (expanded)
      consider(X + a + 2 * Q + A, Am - Q - A);  // d q
      consider(X + a + 3 * Q + A, Am - Q - A);  // d k (expanded)
      A6 = Am - 3 * Q - A;
      consider(X + a + 4 * Q + 2 * C, A6);      // d q, k, v token-major
    }
    // Replicated kv heads: every kv head's k and v gradients (P, temp) beside d y1, from
    // k_proj's weight gradient to their all-reduce.
    if (!sp) {
      consider(X + 2 * a + Q + 2 * C, A6);      // d y1
      if (P > 0) consider(X + 2 * a + Q + 2 * C + P, A6);
      consider(X + 3 * a, A6 - a);              // dx
    } else {
      // y1's tokens gathered (w) beside q, k and v's whole input gradient (w),
      // reduce-scattered to d y1 (a); dx with the norm's part of its gradient (g).
      consider(X + a + Q + 2 * C + w, A6);
      consider(X + a + Q + 2 * C + 2 * w, A6);
      if (P > 0) consider(X + a + Q + 2 * C + 2 * w + P, A6);
      consider(X + 2 * a + Q + 2 * C + w, A6);
      consider(X + 3 * a, A6 - a);
      consider(X + 3 * a + g, A6 - a);
    }
  };
  return blocks;
}

StepTransient llama_step_transient(const TransformerShape& shape, int batch, const StepUnits& units,
                                   const CheckpointPolicy& checkpoint, int tp, bool sp) {
  StepBlocks blocks = llama_blocks(shape, batch, checkpoint.attention(), tp, sp);
  blocks.checkpoint = checkpoint;
  return transformer_step_transient(blocks, units);
}

PieceForms llama_piece(const TransformerShape& shape, int rows, const PiecePlace& place, int tp, bool sp) {
  // Saves a layer records: x, its rstd and the norm's weight; the norm's output and a
  // weight for each of q, k and v; flash's q, k, v, output and lse or math's q, k, the
  // probabilities and v; o_proj's input and weight; x_mid, its rstd and the norm's weight;
  // the norm's output and gate's weight, gate's output, the norm's output and up's
  // weight, SiLU's output and up's output, their product and down's weight. The
  // embedding: the ids; the final block: the norm's input, rstd, weight and output, and
  // the head's weight.
  const bool flash = shape.attention == AttentionMode::flash;
  const int layer = flash ? 28 : 27;
  PieceSaves saves{1, layer, 5};
  if (place.checkpoint.attention()) {
    // --checkpoint attention: the core's own save (lse, probabilities) not recorded in F;
    // in B flash saves its re-run's output and lse (Q + A), math the probabilities (A),
    // once the product, SiLU's, up's and gate's outputs (4F), the norm's output and x_mid
    // (2a), its rstd (4N: the stream's) and, in math, o_proj's input (Q; flash's output
    // save keeps it) are released.
    const Sizes z = sizes(shape, rows, tp, sp);
    saves.block -= 1;
    saves.attention_resaves = flash ? 2 : 1;
    saves.attention_resave_bytes = flash ? z.Q + z.A : z.A;
    saves.attention_released_bytes = 4 * z.F + 2 * z.a + 4 * z.ns + (flash ? 0 : z.Q);
  }
  PieceForms p = transformer_piece(llama_blocks(shape, rows, place.checkpoint.attention(), tp, sp), saves, place);
  if (sp) return p;  // --sp: no zero-bubble split (pipeline_stage.cpp refuses it)
  // Between B and W (zb-h1, zbv). A layer keeps saved its input x, both norms' rstd and
  // output, o_proj's input (Q = 4N·H·d), x_mid and the product (4a + 8N + Q + F, in 13
  // saves: the input norm's output thrice, the other's twice, the two norms' weights),
  // and as temp its output gradients: gate's and up's (F each), the post-attention
  // norm's, o_proj's (dx_mid) and the input norm's (a each), q/k/v's (Q + 2·4N·K·d),
  // and its dy (a: the layer above's dx; the top layer's on a piece other than the last
  // is the received gradient, comm). The embedding keeps its dy (a; the ids, 8N, stay
  // saved); the final block its input, rstd and the norm's output (2a + 4N, 4 saves) and
  // dlogits and the norm's gradient (Λ + a).
  // Under tensor parallelism Q, C (KV), F, A and Λ are the rank's (sizes at tp), a whole.
  const Sizes z = sizes(shape, rows, tp);
  const std::int64_t n = place.blocks, a = z.a, N = z.N;
  const std::int64_t Q = z.Q, KV = z.C;
  // zbv's V bottom: a piece whose input is the previous chunk's output on this stage does
  // not own its first block's x (that chunk's temp), though it saves it; and its top
  // block's dy is that chunk's dx (temp), not a received gradient.
  const std::int64_t local_in = !place.first && !place.recv_act ? a : 0;
  const bool dy_received = !place.last && place.send_act;
  p.half_act = n * (4 * a + 8 * N + Q + z.F) + (place.last ? 2 * a + 4 * N : 0) - local_in;
  p.half_temp = n * (3 * a + 2 * z.F + Q + 2 * KV) + (n - (place.last ? 0 : 1)) * a + (place.first ? a : 0) +
                (place.last ? z.lambda + a : 0);
  p.half_comm = dy_received ? a : 0;
  p.half_temp += !place.last && !dy_received ? a : 0;
  p.half_saves = 13 * n + (place.first ? 1 : 0) + (place.last ? 4 : 0);
  p.half_saved_bytes = p.half_act + local_in + (place.first ? 8 * N : 0);
  // B's instants. The last piece: dlogits (Λ, the log-probabilities and total_weight then
  // freed), the norm's gradient (a), its dx (a, the top layer's dy) with the norm's
  // scratch (h floats, 4h). Each layer from (act, temp): d product (F), d up (F), SiLU's
  // and up's outputs and gate's freed, d y2 (a), d x_mid (a) with the scratch, d out
  // (Q); the attention (flash: dq, dk, dv Q + 2C beside d out, then q, k, v and lse
  // freed, R = Q + 2C + A; math: its buffers as the whole backward's, out kept, R = 3Q +
  // A); d y1 (a), dx (a) with the scratch. A layer ends 3F + R lower in activation and
  // 2F + 4a + Q + 2C higher in temp than it began: the top and the bottom layer bound
  // every instant.
  const std::int64_t F = z.F, A = z.A, C = z.C, s4 = 4 * static_cast<std::int64_t>(shape.hidden);
  std::vector<PieceMoment>& m = p.split_backward;
  std::int64_t act = 0, temp = 0;
  if (place.last) push_head_split_backward(m, z.lambda, a, s4, act, temp);
  const std::int64_t R = flash ? Q + 2 * C + A : 3 * Q + A;
  auto one_layer = [&](std::int64_t x, std::int64_t t) {
    m.push_back({x, t + F, true});
    m.push_back({x, t + 2 * F, true});
    const std::int64_t x3 = x - 3 * F, t2 = t + 2 * F;
    m.push_back({x3, t2 + a, true});
    m.push_back({x3, t2 + 2 * a + s4, true});
    m.push_back({x3, t2 + 2 * a + Q, true});
    if (flash) {
      m.push_back({x3, t2 + 2 * a + 2 * Q + 2 * C, true});
    } else {
      m.push_back({x3, t2 + 2 * a + 2 * Q, true});
      m.push_back({x3, t2 + 2 * a + Q + A, true});
      m.push_back({x3, t2 + 2 * a + 2 * Q + A, true});
      m.push_back({x3 - Q - A, t2 + 2 * a + 2 * Q + A, true});
      m.push_back({x3 - Q - A, t2 + 2 * a + 3 * Q + A, true});
      m.push_back({x3 - 3 * Q - A, t2 + 2 * a + 4 * Q + 2 * C, true});
    }
    m.push_back({x3 - R, t2 + 3 * a + Q + 2 * C, true});
    m.push_back({x3 - R, t2 + 4 * a + Q + 2 * C + s4, true});
  };
  one_layer(act, temp);
  if (n > 1) one_layer(act - (n - 1) * (3 * F + R), temp + (n - 1) * (2 * F + 4 * a + Q + 2 * C));
  // A piece other than the last frees its output as its top block starts (held as temp
  // when the next chunk is on this stage).
  if (!place.last)
    for (PieceMoment& mo : m) {
      mo.temp -= p.held_temp;
      mo.output_freed = true;
    }
  // W with replicated kv heads (K < T): the top layer's W (on the last piece after the
  // final block's, which frees dlogits and the norm's gradient, Λ + a temp, and its
  // input, rstd and output, 2a + 4N) frees its dy (a: the received gradient, comm, or
  // temp), the product, y2, x_mid, its rstd and o_proj's out (F + 2a + 4N + Q,
  // activation), d gate, d up, d y2 and d x_mid (2F + 2a, temp), then holds every kv
  // head's k and v gradients (P, temp) until their all-reduce: the W's highest instant
  // (every lower layer's holds less, the layer above's saves and gradients freed).
  if (z.P > 0) {
    const std::int64_t w_act = -(F + 2 * a + 4 * N + Q) - (place.last ? 2 * a + 4 * N : 0);
    const std::int64_t w_temp =
        -(2 * F + 2 * a) - (dy_received ? 0 : a) - (place.last ? z.lambda + a : 0) + z.P;
    p.split_weight.push_back({w_act, w_temp, false});
  }
  return p;
}

}  // namespace shardscope
