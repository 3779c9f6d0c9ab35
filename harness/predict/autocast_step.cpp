// The bf16 step's instants (autocast_step.hpp has the symbols), in time order, as the
// autocast models allocate and free: every transformer block's forward, the final block's
// head GEMM and the loss's end (where the autocast region ends: the cast cache lets go of
// the wrapped blocks' casts); the head's backward and the final norm's dx; every block's
// backward from the top, a wrapped one's re-run first.
// Each instant is one where an allocation is followed by a free; instants that another
// instant of the same block holds at least as much as in every category are left out,
// each with the one that covers it named below.
#include "harness/predict/autocast_step.hpp"

#include "harness/predict/transformer_forms.hpp"

#include <string>
#include <vector>

namespace shardscope {
namespace {

using i64 = std::int64_t;

std::string layer(int b) { return "layer " + std::to_string(b); }

// The instants of a step: temp, activation and casts beyond the resting bytes. The
// first of the largest total is kept, as the tracker keeps it.
class CastWalk {
 public:
  void at(i64 temp, i64 act, i64 cast, Phase phase, const std::string& where) {
    const i64 total = temp + act + cast;
    if (total <= best_total_) return;
    best_total_ = total;
    best_.bytes = CategoryBytes{};
    best_.bytes[Category::temp] += temp;
    best_.bytes[Category::activation] += act;
    best_.bytes[kWeightCastCategory] += cast;
    best_.phase = phase;
    best_.where = where;
  }
  const StepTransient& best() const { return best_; }

 private:
  StepTransient best_;
  i64 best_total_ = -1;
};

// The walk. Model block b (1..L) is transformer block b - 1: wrapped by --checkpoint, it
// holds only its output a past its forward, and its casts (c, in autocast's cache) until
// the loss's end; unwrapped, K and its casts until its backward. Its re-run at the start of
// its backward walks its forward's instants beside dy (a, temp), its output made as temp
// (the block saves none, freed at once: temp X + 3a with r and dy, act K - a, casts c).
// The final block and the loss (S_L, C_L after the L blocks; y's cast a/2 saved by the
// head; under tp Λ and W_V are the rank's):
//   head GEMM   temp X + a + W_V + Λ (y's and the weight's widened copies, the logits)
//               act S_L + stats + a/2, cast C_L + W_V/2
//   loss's end  temp X + Λ + 4 (the logits, the loss scalar), act + Λ + 4 (the
//               log-probabilities, total_weight); y's fp32 output (a) was freed once cast;
//               under tp its statistics (8N, temp) are live beside them first: that
//               instant, temp X + Λ + 4 + 8N, is the one above the end
//   then the wrapped blocks' casts go (C_L becomes C'_L, the unwrapped blocks')
//   head back   temp X + Λ + 2a + W_V (dlogits, the widened copies, d y), act S_L + stats
//               + a/2 (the log-probabilities freed), cast C'_L + W_V/2
//   norm's dx   temp X + 2a (d y, dx), act S_L + stats, cast C'_L (y's and the weight's
//               casts released)
// The loss's gradient alone (dlogits beside the log-probabilities) holds 4 less than the
// loss's end.
StepTransient walk(const AutocastFamily& f, const TokenSizes& z, const CheckpointPolicy& checkpoint) {
  const i64 X = 16 * z.N, a = z.a, lambda = f.lambda;
  const int L = z.L;
  auto wrapped = [&](int b) { return checkpoint.wraps(b - 1); };
  // held[b], casts[b], kept[b]: activations, casts (forward) and casts past the loss
  // (unwrapped blocks') once blocks 1..b have run their forward.
  std::vector<i64> held(L + 1, f.base), casts(L + 1, 0), kept(L + 1, 0);
  for (int b = 1; b <= L; ++b) {
    held[b] = held[b - 1] + (wrapped(b) ? a : f.K);
    casts[b] = casts[b - 1] + f.c;
    kept[b] = kept[b - 1] + (wrapped(b) ? 0 : f.c);
  }
  CastWalk w;
  for (int b = 1; b <= L; ++b)
    for (const AutocastInstant& i : f.forward)
      w.at(i.temp, held[b - 1] + i.act, casts[b - 1] + i.cast, Phase::forward, layer(b));
  const std::string fin = layer(L + 1);
  const i64 S = held[L];
  w.at(X + a + f.W_V + lambda, S + f.stats + a / 2, casts[L] + f.W_V / 2, Phase::forward, fin);
  w.at(X + lambda + 4 + f.loss_stats, S + f.stats + a / 2 + lambda + 4, casts[L] + f.W_V / 2, Phase::forward, fin);
  w.at(X + lambda + 2 * a + f.W_V, S + f.stats + a / 2, kept[L] + f.W_V / 2, Phase::backward, fin);
  w.at(X + 2 * a, S + f.stats, kept[L], Phase::backward, fin);
  for (int b = L; b >= 1; --b) {
    if (wrapped(b)) {
      const std::string re = "recompute of block " + std::to_string(b - 1);
      for (const AutocastInstant& i : f.forward) w.at(i.temp + a, held[b - 1] + i.act, kept[b - 1] + i.cast, Phase::backward, re);
      w.at(X + 3 * a, held[b - 1] + f.K - a, kept[b - 1] + f.c, Phase::backward, re);
    }
    for (const AutocastInstant& i : f.backward)
      w.at(i.temp, held[b - 1] + i.act, kept[b - 1] + i.cast, Phase::backward, layer(b));
  }
  return w.best();
}

}  // namespace

// GPT-2, one block (forward from S and C, the activations and casts before it, its input
// among S): W_a = 12h²/T (c_attn's weight), W_p = 4h²/T, W_f = 4hf/T (c_fc's and mlp
// c_proj's); q = a/T (one of the attention's (N, h/T) tensors: a with one rank), F_T = F/T,
// A_T = A/T; b = 4h with one rank (a row-parallel bias rounded into its GEMM), 0 under tp;
// c = (W_a + W_p + 2 W_f)/2 its casts; H the attention's saves beside ln_1's (flash: qkv
// 3q/2, the output q/2, the lse A_T; math: fp32 q, k, v 3q, the output q/2, the
// probabilities A_T); K = 16N + 3a + H + F_T its activations, its output included.
//   c_attn    temp X + a + W_a + 3q + 12h/T (ln_1's out widened, the weight widened, qkv
//             3q, the bias rounded), act S + 8N + a/2 (mean, rstd, the input cast), cast W_a/2
//   flash     temp X + 4q (qkv, the output), act S + 8N + a/2 + 3q/2 + A_T
//   math      temp X + 3q (qkv beside the head-major q, k, v), act S + 8N + a/2 + 3q;
//             then temp X + q (the head-major output beside its token-major copy), act
//             S + 8N + a/2 + 4q + A_T
//   c_proj    temp X + q + W_p + a + b, act S + 8N + a/2 + H, cast (W_a + W_p)/2
//   (tp)      temp X + 3a/2 (its partial product beside its bf16 cast for the all-reduce)
//   c_fc      temp X + a + W_f + F_T + 4f/T, act S + 16N + 2a + H (x_mid, ln_2's), cast + W_f/2
//   mlp proj  temp X + F_T + W_f + a + b, act S + 16N + 2a + H + F_T (c_fc's and GELU's
//             outputs), cast c
//   (tp)      temp X + 3a/2, as after c_proj
// --checkpoint attention (R = A_T, else 0): H is R less (the core's own save goes); math's
// second instant is two, the head-major output's temp beside the probabilities (act S + 8N
// + a/2 + 3q + A_T) and then beside the token-major copy (act S + 8N + a/2 + 4q, the
// probabilities freed); flash's backward re-runs the core in bf16 (y, c_proj's save alone,
// freed; a new lse A_T and bf16 output q/2, saved, the output's fp32 values its widened
// copy): act S + 8N + a/2 + H + R, the temps as above; math's backward makes the
// probabilities again (A_T), its instant as above.
// (ln_1's output beside its cast lies below c_attn; the output's cast below flash's;
// x_mid beside c_proj's result below c_proj, under tp x_mid beside the bf16 sum (a/2)
// equal to the instant before it; the block's output likewise, and below the next
// block's c_attn or the head.)
// Its backward (its output freed: S + K - a, casts c, dy a in temp):
//   mlp proj  temp X + 2a + 2F_T + W_f (dy, its rounded copy, GELU's out widened, the
//             weight widened, d gelu F_T), act S + K - a, cast c
//   c_fc      temp X + 3a + F_T + W_f (dy, d c_fc F_T, the widened copies, d ln_2), act
//             S + K - a - F_T, cast c - W_f/2
//   c_proj    temp X + 2a + 2q + W_p (dx_mid, its rounded copy, y widened, d y), act
//             S + 8N + a/2 + H, cast (W_a + W_p)/2
//   flash     temp X + a + 8q (dx_mid, d y, dqkv 3q, qkv and the output widened 4q), act
//             the same, cast W_a/2
//   math      temp X + a + 5q + A_T (dx_mid, dqkv, d out head-major, dP, dv), act
//             S + 8N + a/2 + 3q + A_T (y's cast freed), cast W_a/2
//   c_attn    temp X + 3a + 3q + W_a (dx_mid, dqkv, the widened copies, d ln_1), act
//             S + 8N + a/2, cast W_a/2
// (GELU's input widened lies below mlp proj; ln_2's dx below c_fc; math's dq, dk below
// its dv; ln_1's dx below c_attn. The all-reduces of the input gradients are in place.)
AutocastFamily gpt2_autocast_family(const TransformerShape& s, int batch, int tp, bool recompute_attention) {
  const TokenSizes z = token_sizes(s, batch);
  const i64 T = tp, h = s.hidden, f = s.ffn, V = s.vocab;
  const i64 N = z.N, a = z.a, q = a / T, F = z.F / T, A = z.A / T, X = 16 * N;
  const i64 Wa = 12 * h * h / T, Wp = 4 * h * h / T, Wf = 4 * h * f / T, b = T == 1 ? 4 * h : 0;
  const i64 R = recompute_attention ? A : 0;  // --checkpoint attention: the core's own save, not kept
  const i64 H = (z.flash ? 2 * q + A : 7 * q / 2 + A) - R;
  AutocastFamily g;
  g.c = (Wa + Wp + 2 * Wf) / 2;
  g.K = 16 * N + 3 * a + H + F;
  g.base = 8 * z.T + a;  // arange(T), x0
  g.stats = 8 * N;       // ln_f's mean and rstd
  g.W_V = 4 * V * h / T;
  g.lambda = z.lambda / T;
  g.loss_stats = T > 1 ? 8 * N : 0;
  g.forward.push_back({X + a + Wa + 3 * q + 12 * h / T, 8 * N + a / 2, Wa / 2});
  if (z.flash) {
    g.forward.push_back({X + 4 * q, 8 * N + a / 2 + 3 * q / 2 + A, Wa / 2});
  } else {
    g.forward.push_back({X + 3 * q, 8 * N + a / 2 + 3 * q, Wa / 2});
    if (R > 0) g.forward.push_back({X + q, 8 * N + a / 2 + 3 * q + A, Wa / 2});
    g.forward.push_back({X + q, 8 * N + a / 2 + 4 * q + A - R, Wa / 2});
  }
  g.forward.push_back({X + q + Wp + a + b, 8 * N + a / 2 + H, (Wa + Wp) / 2});
  if (T > 1) g.forward.push_back({X + 3 * a / 2, 8 * N + a / 2 + H, (Wa + Wp) / 2});
  g.forward.push_back({X + a + Wf + F + 4 * f / T, 16 * N + 2 * a + H, (Wa + Wp + Wf) / 2});
  g.forward.push_back({X + F + Wf + a + b, 16 * N + 2 * a + H + F, g.c});
  if (T > 1) g.forward.push_back({X + 3 * a / 2, 16 * N + 2 * a + H + F, g.c});
  g.backward.push_back({X + 2 * a + 2 * F + Wf, g.K - a, g.c, true});
  g.backward.push_back({X + 3 * a + F + Wf, g.K - a - F, g.c - Wf / 2, true});
  g.backward.push_back({X + 2 * a + 2 * q + Wp, 8 * N + a / 2 + H, (Wa + Wp) / 2});
  if (z.flash)
    g.backward.push_back({X + a + 8 * q, 8 * N + a / 2 + H + R, Wa / 2});
  else
    g.backward.push_back({X + a + 5 * q + A, 8 * N + a / 2 + 3 * q + A, Wa / 2});
  g.backward.push_back({X + 3 * a + 3 * q + Wa, 8 * N + a / 2, Wa / 2});
  return g;
}

StepTransient gpt2_step_transient_autocast(const TransformerShape& s, int batch, const CheckpointPolicy& checkpoint,
                                           int tp) {
  return walk(gpt2_autocast_family(s, batch, tp, checkpoint.attention()), token_sizes(s, batch), checkpoint);
}

// Llama, one layer (forward from S and C): Q = 4N·H·d/T (q, the attention's output), C_k =
// 4N·K·d/T (k, v); W_q = 4h·H·d/T (q's and o's weights), W_k = 4h·K·d/T (k's and v's),
// W_f = 4hf/T (gate, up, down); F and A below are the rank's F/T and A/T; b_q, b_k the
// column-parallel biases' fp32 bytes (a T-th), b_o o_proj's with one rank (0 under tp,
// or without them); c = W_q + W_k + 3W_f/2 its casts; H the attention's saves (flash: bf16
// q, k, v and output Q + C_k, the lse A; math: fp32 q and k, v expanded 3Q, the output
// Q/2, the probabilities A); K = 8N + 9a/2 + H + 2F, its output included. Under tp
// o_proj and down_proj each add the instant temp X + 3a/2 (the partial product beside
// its bf16 cast), as GPT-2's row-parallel Linears. Replicated kv heads (K < T: one kv head
// a rank, C_k = 4N·d, W_k = 4h·d): k_proj's and v_proj's backward hold P = 8K·d(h + b)
// more (every kv head's k and v gradients, temp, all-reduced once both are made).
//   q_proj    temp X + 2a + W_q + Q + b_q (the norm's output, its cast widened, the weight
//             widened, q), act S + 4N + a/2 (rstd, q's input cast), cast W_q/2
//   v_proj    temp X + 2a + Q + 2C_k + W_k + b_k, act S + 4N + 3a/2, cast W_q/2 + W_k
//   flash     temp X + 2Q + 2C_k (q, k, v, the output), act S + 4N + 3a/2 + Q/2 + C_k + A
//   math      temp X + Q + 2C_k (q, k, v beside their fp32 head-major copies), act
//             S + 4N + 3a/2 + 3Q; then temp X + Q (the head-major output beside its
//             token-major copy), act S + 4N + 3a/2 + 4Q + A
//   o_proj    temp X + Q + W_q + a + b_o, act S + 4N + 3a/2 + H, cast W_q + W_k
//   up_proj   temp X + 2a + 2F + W_f (the norm's output, gate's SiLU'd, up's input cast
//             widened, the weight widened, up), act S + 8N + 7a/2 + H + F, cast + W_f
//   down_proj temp X + F + W_f + a, act S + 8N + 7a/2 + H + 2F, cast c
// --checkpoint attention (R = A, else 0): H is R less; math's second instant is two (act
// S + 4N + 3a/2 + 3Q + A, then S + 4N + 3a/2 + 4Q), flash's backward re-runs the core in
// bf16 (the output, o_proj's save alone, freed; a new lse and bf16 output Q/2): act
// S + 4N + 3a/2 + H + R; math's backward as above, its probabilities made again.
// (k_proj lies below v_proj; the output's cast below flash's; gate_proj below up_proj;
// up's and the product's casts below up_proj; the layer's output below the next
// layer's q_proj or the head.)
// Its backward (S + K - a, casts c, dy a):
//   down      temp X + 2a + 2F + W_f, act S + K - a, cast c
//   d up      temp X + a + 3F (dy, d product, d up, SiLU's output widened), act
//             S + K - a - F/2, cast c - W_f/2
//   gate      temp X + 3a + 2F + W_f (dy, d gate, d up, the widened copies, d y2), act
//             S + K - a - 2F, cast c - W_f/2
//   up        temp X + 4a + F + W_f (dy, d up, d y2, the widened copies, its part), act
//             S + K - 3a/2 - 2F, cast c - W_f
//   o_proj    temp X + 2a + 2Q + W_q (dx_mid, its rounded copy, the output widened, d out),
//             act S + 4N + 3a/2 + H, cast W_q + W_k
//   flash     temp X + a + 4Q + 4C_k (dx_mid, d out, dq dk dv, q k v and the output
//             widened), act the same, cast W_q/2 + W_k
//   math      temp X + a + 3Q + 2C_k + A (dx_mid, dq dk dv, d out head-major, dP, dv
//             expanded), act S + 4N + 3a/2 + 3Q + A, cast W_q/2 + W_k
//   q_proj    temp X + 3a + Q + 2C_k + W_q (dx_mid, dq dk dv, the widened copies, d y1),
//             act S + 4N + 3a/2, cast W_q/2 + W_k
//   k_proj    temp X + 4a + Q + 2C_k + W_k (d y1 held beside its part), the same
// (the up and gate widened copies lie below d up; dx_mid beside d y2 below up; v_proj's
// part equals k_proj's, which comes first; math's dq, dk below its dv; the norm's dx
// below q_proj.)
AutocastFamily llama_autocast_family(const TransformerShape& s, int batch, int tp, bool recompute_attention) {
  const TokenSizes z = token_sizes(s, batch);
  const i64 T = tp, h = s.hidden, f = s.ffn / T, V = s.vocab, hd = static_cast<i64>(s.heads / T) * s.head_dim,
            kd = static_cast<i64>(kv_heads_per_rank(s, tp)) * s.head_dim;
  const i64 P = kv_replica_all_reduce_bytes(s, tp);
  const i64 N = z.N, a = z.a, F = z.F / T, A = z.A / T, X = 16 * N;
  const i64 Q = 4 * N * hd, Ck = 4 * N * kd;
  const i64 Wq = 4 * h * hd, Wk = 4 * h * kd, Wf = 4 * h * f;
  const i64 bq = s.qkv_bias ? 4 * hd : 0, bk = s.qkv_bias ? 4 * kd : 0, bo = s.out_bias && T == 1 ? 4 * h : 0;
  const i64 R = recompute_attention ? A : 0;  // --checkpoint attention: the core's own save, not kept
  const i64 H = (z.flash ? Q + Ck + A : 7 * Q / 2 + A) - R;
  AutocastFamily l;
  l.c = Wq + Wk + 3 * Wf / 2;
  l.K = 8 * N + 9 * a / 2 + H + 2 * F;
  l.base = a;       // x0
  l.stats = 4 * N;  // the final RMSNorm's rstd
  l.W_V = 4 * V * h / T;
  l.lambda = z.lambda / T;
  l.loss_stats = T > 1 ? 8 * N : 0;
  l.forward.push_back({X + 2 * a + Wq + Q + bq, 4 * N + a / 2, Wq / 2});
  l.forward.push_back({X + 2 * a + Q + 2 * Ck + Wk + bk, 4 * N + 3 * a / 2, Wq / 2 + Wk});
  if (z.flash) {
    l.forward.push_back({X + 2 * Q + 2 * Ck, 4 * N + 3 * a / 2 + Q / 2 + Ck + A, Wq / 2 + Wk});
  } else {
    l.forward.push_back({X + Q + 2 * Ck, 4 * N + 3 * a / 2 + 3 * Q, Wq / 2 + Wk});
    if (R > 0) l.forward.push_back({X + Q, 4 * N + 3 * a / 2 + 3 * Q + A, Wq / 2 + Wk});
    l.forward.push_back({X + Q, 4 * N + 3 * a / 2 + 4 * Q + A - R, Wq / 2 + Wk});
  }
  l.forward.push_back({X + Q + Wq + a + bo, 4 * N + 3 * a / 2 + H, Wq + Wk});
  if (T > 1) l.forward.push_back({X + 3 * a / 2, 4 * N + 3 * a / 2 + H, Wq + Wk});
  l.forward.push_back({X + 2 * a + 2 * F + Wf, 8 * N + 7 * a / 2 + H + F, Wq + Wk + Wf});
  l.forward.push_back({X + F + Wf + a, 8 * N + 7 * a / 2 + H + 2 * F, l.c});
  if (T > 1) l.forward.push_back({X + 3 * a / 2, 8 * N + 7 * a / 2 + H + 2 * F, l.c});
  l.backward.push_back({X + 2 * a + 2 * F + Wf, l.K - a, l.c, true});
  l.backward.push_back({X + a + 3 * F, l.K - a - F / 2, l.c - Wf / 2, true});
  l.backward.push_back({X + 3 * a + 2 * F + Wf, l.K - a - 2 * F, l.c - Wf / 2, true});
  l.backward.push_back({X + 4 * a + F + Wf, l.K - 3 * a / 2 - 2 * F, l.c - Wf, true});
  l.backward.push_back({X + 2 * a + 2 * Q + Wq, 4 * N + 3 * a / 2 + H, Wq + Wk});
  if (z.flash)
    l.backward.push_back({X + a + 4 * Q + 4 * Ck, 4 * N + 3 * a / 2 + H + R, Wq / 2 + Wk});
  else
    l.backward.push_back({X + a + 3 * Q + 2 * Ck + A, 4 * N + 3 * a / 2 + 3 * Q + A, Wq / 2 + Wk});
  l.backward.push_back({X + 3 * a + Q + 2 * Ck + Wq, 4 * N + 3 * a / 2, Wq / 2 + Wk});
  l.backward.push_back({X + 4 * a + Q + 2 * Ck + Wk + P, 4 * N + 3 * a / 2, Wq / 2 + Wk});
  return l;
}

StepTransient llama_step_transient_autocast(const TransformerShape& s, int batch, const CheckpointPolicy& checkpoint,
                                            int tp) {
  return walk(llama_autocast_family(s, batch, tp, checkpoint.attention()), token_sizes(s, batch), checkpoint);
}

}  // namespace shardscope
