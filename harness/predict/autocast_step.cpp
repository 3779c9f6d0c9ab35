// The bf16 step's instants (autocast_step.hpp has the symbols), in time order, as the
// autocast models allocate and free:
//   the top transformer block's forward (every lower block's instants hold the same
//   bytes less the blocks above it: K activation and c casts each), the final block's
//   head GEMM and the loss's end; the loss's gradient and the head's backward, the final
//   norm's dx; the top block's backward (every lower block's instants hold less: the
//   saves and casts of the blocks above are released).
// Each instant is one where an allocation is followed by a free; instants that another
// instant of the same step holds at least as much as in every category are left out,
// each with the one that covers it named below.
#include "harness/predict/autocast_step.hpp"

#include <string>

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

// The final block and the loss, both families: S_L and C_L the activations and casts
// after the L blocks (block L's output, the norm's input, among them); `stats` the norm's
// (LayerNorm's mean and rstd 8N, RMSNorm's rstd 4N); the head's weight W_V = 4Vh, cast
// W_V/2; y's cast a/2 saved by the head.
//   head GEMM   temp X + a + W_V + Λ (y's and the weight's widened copies, the logits)
//               act S_L + stats + a/2, cast C_L + W_V/2
//   loss's end  temp X + Λ + 4 (the logits, the loss scalar), act + Λ + 4 (the
//               log-probabilities, total_weight); y's fp32 output (a) was freed once cast
//   head back   temp X + Λ + 2a + W_V (dlogits, the widened copies, d y), act S_L + stats
//               + a/2 (the log-probabilities freed), cast C_L + W_V/2
//   norm's dx   temp X + 2a (d y, dx), act S_L + stats, cast C_L (y's and the weight's
//               casts released)
// The loss's gradient alone (dlogits beside the log-probabilities) holds 4 less than the
// loss's end.
void final_and_loss(CastWalk& w, const TokenSizes& z, i64 S_L, i64 C_L, i64 stats, i64 W_V) {
  const i64 X = 16 * z.N, a = z.a, lambda = z.lambda;
  const std::string fin = layer(z.L + 1);
  w.at(X + a + W_V + lambda, S_L + stats + a / 2, C_L + W_V / 2, Phase::forward, fin);
  w.at(X + lambda + 4, S_L + stats + a / 2 + lambda + 4, C_L + W_V / 2, Phase::forward, fin);
  w.at(X + lambda + 2 * a + W_V, S_L + stats + a / 2, C_L + W_V / 2, Phase::backward, fin);
  w.at(X + 2 * a, S_L + stats, C_L, Phase::backward, fin);
}

}  // namespace

// GPT-2, one block (forward from S and C, the activations and casts before it, its input
// among S): W_a = 12h² (c_attn's weight), W_p = 4h², W_f = 4hf (c_fc's and mlp c_proj's);
// c = (W_a + W_p + 2 W_f)/2 its casts; H the attention's saves beside ln_1's (flash: qkv
// 3a/2, the output a/2, the lse A; math: fp32 q, k, v 3a, the output a/2, the
// probabilities A); K = 16N + 3a + H + F its activations, its output included.
//   c_attn    temp X + 4a + W_a + 12h (ln_1's out widened, the weight widened, qkv 3a,
//             the bias rounded), act S + 8N + a/2 (mean, rstd, the input cast), cast W_a/2
//   flash     temp X + 4a (qkv, the output), act S + 8N + 2a + A
//   math      temp X + 3a (qkv beside the head-major q, k, v), act S + 8N + 7a/2; then
//             temp X + a (the head-major output beside its token-major copy), act
//             S + 8N + 9a/2 + A
//   c_proj    temp X + 2a + W_p + 4h, act S + 8N + a/2 + H, cast (W_a + W_p)/2
//   c_fc      temp X + a + W_f + F + 4f, act S + 16N + 2a + H (x_mid, ln_2's), cast + W_f/2
//   mlp proj  temp X + F + W_f + a + 4h, act S + 16N + 2a + H + F (c_fc's and GELU's
//             outputs), cast c
// (ln_1's output beside its cast lies below c_attn; the output's cast below flash's;
// x_mid beside c_proj's result below c_proj, the block's output below the next block's
// c_attn or the head.)
// Backward of the top block (its output freed: S + K - a, casts c, dy a in temp):
//   mlp proj  temp X + 2a + 2F + W_f (dy, its rounded copy, GELU's out widened, the
//             weight widened, d gelu F), act S + K - a, cast c
//   c_fc      temp X + 3a + F + W_f (dy, d c_fc F, the widened copies, d ln_2), act
//             S + K - a - F, cast c - W_f/2
//   c_proj    temp X + 4a + W_p (dx_mid, its rounded copy, y widened, d y), act
//             S + 8N + a/2 + H, cast (W_a + W_p)/2
//   flash     temp X + 9a (dx_mid, d y, dqkv 3a, qkv and the output widened 4a), act the
//             same, cast W_a/2
//   math      temp X + 6a + A (dx_mid, dqkv, d out head-major, dP, dv), act
//             S + 8N + 7a/2 + A (y's cast freed), cast W_a/2
//   c_attn    temp X + 6a + W_a (dx_mid, dqkv, the widened copies, d ln_1), act
//             S + 8N + a/2, cast W_a/2
// (GELU's input widened lies below mlp proj; ln_2's dx below c_fc; math's dq, dk below
// its dv; ln_1's dx below c_attn.)
StepTransient gpt2_step_transient_autocast(const TransformerShape& s, int batch) {
  const TokenSizes z = token_sizes(s, batch);
  const i64 h = s.hidden, f = s.ffn, V = s.vocab;
  const i64 N = z.N, a = z.a, F = z.F, A = z.A, X = 16 * N;
  const i64 Wa = 12 * h * h, Wp = 4 * h * h, Wf = 4 * h * f;
  const i64 c = (Wa + Wp + 2 * Wf) / 2;
  const i64 H = z.flash ? 2 * a + A : 7 * a / 2 + A;
  const i64 K = 16 * N + 3 * a + H + F;
  const i64 base = 8 * z.T + a;  // arange(T), x0
  const int L = z.L;
  const i64 S = base + (L - 1) * K, C = (L - 1) * c;  // before the top block
  const std::string top = layer(L);
  CastWalk w;
  auto fwd = [&](i64 temp, i64 act, i64 cast) { w.at(temp, S + act, C + cast, Phase::forward, top); };
  fwd(X + 4 * a + Wa + 12 * h, 8 * N + a / 2, Wa / 2);
  if (z.flash) {
    fwd(X + 4 * a, 8 * N + 2 * a + A, Wa / 2);
  } else {
    fwd(X + 3 * a, 8 * N + 7 * a / 2, Wa / 2);
    fwd(X + a, 8 * N + 9 * a / 2 + A, Wa / 2);
  }
  fwd(X + 2 * a + Wp + 4 * h, 8 * N + a / 2 + H, (Wa + Wp) / 2);
  fwd(X + a + Wf + F + 4 * f, 16 * N + 2 * a + H, (Wa + Wp + Wf) / 2);
  fwd(X + F + Wf + a + 4 * h, 16 * N + 2 * a + H + F, c);
  final_and_loss(w, z, S + K, C + c, 8 * N, 4 * V * h);
  auto back = [&](i64 temp, i64 act, i64 cast) { w.at(temp, S + act, C + cast, Phase::backward, top); };
  back(X + 2 * a + 2 * F + Wf, K - a, c);
  back(X + 3 * a + F + Wf, K - a - F, c - Wf / 2);
  back(X + 4 * a + Wp, 8 * N + a / 2 + H, (Wa + Wp) / 2);
  if (z.flash)
    back(X + 9 * a, 8 * N + a / 2 + H, Wa / 2);
  else
    back(X + 6 * a + A, 8 * N + 7 * a / 2 + A, Wa / 2);
  back(X + 6 * a + Wa, 8 * N + a / 2, Wa / 2);
  return w.best();
}

// Llama, one layer (forward from S and C): Q = 4N·H·d (q, the attention's output), C_k =
// 4N·K·d (k, v); W_q = 4h·H·d (q's and o's weights), W_k = 4h·K·d (k's and v's), W_f =
// 4hf (gate, up, down); b_q, b_k, b_o the biases' fp32 bytes (0 without them); c = W_q +
// W_k + 3W_f/2 its casts; H the attention's saves (flash: bf16 q, k, v and output
// Q + C_k, the lse A; math: fp32 q and k, v expanded 3Q, the output Q/2, the
// probabilities A); K = 8N + 9a/2 + H + 2F, its output included.
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
// (k_proj lies below v_proj; the output's cast below flash's; gate_proj below up_proj;
// up's and the product's casts below up_proj; the layer's output below the next
// layer's q_proj or the head.)
// Backward of the top layer (S + K - a, casts c, dy a):
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
StepTransient llama_step_transient_autocast(const TransformerShape& s, int batch) {
  const TokenSizes z = token_sizes(s, batch);
  const i64 h = s.hidden, f = s.ffn, V = s.vocab, hd = static_cast<i64>(s.heads) * s.head_dim,
            kd = static_cast<i64>(s.kv_heads) * s.head_dim;
  const i64 N = z.N, a = z.a, F = z.F, A = z.A, X = 16 * N;
  const i64 Q = 4 * N * hd, Ck = 4 * N * kd;
  const i64 Wq = 4 * h * hd, Wk = 4 * h * kd, Wf = 4 * h * f;
  const i64 bq = s.qkv_bias ? 4 * hd : 0, bk = s.qkv_bias ? 4 * kd : 0, bo = s.out_bias ? 4 * h : 0;
  const i64 c = Wq + Wk + 3 * Wf / 2;
  const i64 H = z.flash ? Q + Ck + A : 7 * Q / 2 + A;
  const i64 K = 8 * N + 9 * a / 2 + H + 2 * F;
  const i64 base = a;  // x0
  const int L = z.L;
  const i64 S = base + (L - 1) * K, C = (L - 1) * c;
  const std::string top = layer(L);
  CastWalk w;
  auto fwd = [&](i64 temp, i64 act, i64 cast) { w.at(temp, S + act, C + cast, Phase::forward, top); };
  fwd(X + 2 * a + Wq + Q + bq, 4 * N + a / 2, Wq / 2);
  fwd(X + 2 * a + Q + 2 * Ck + Wk + bk, 4 * N + 3 * a / 2, Wq / 2 + Wk);
  if (z.flash) {
    fwd(X + 2 * Q + 2 * Ck, 4 * N + 3 * a / 2 + Q / 2 + Ck + A, Wq / 2 + Wk);
  } else {
    fwd(X + Q + 2 * Ck, 4 * N + 3 * a / 2 + 3 * Q, Wq / 2 + Wk);
    fwd(X + Q, 4 * N + 3 * a / 2 + 4 * Q + A, Wq / 2 + Wk);
  }
  fwd(X + Q + Wq + a + bo, 4 * N + 3 * a / 2 + H, Wq + Wk);
  fwd(X + 2 * a + 2 * F + Wf, 8 * N + 7 * a / 2 + H + F, Wq + Wk + Wf);
  fwd(X + F + Wf + a, 8 * N + 7 * a / 2 + H + 2 * F, c);
  final_and_loss(w, z, S + K, C + c, 4 * N, 4 * V * h);
  auto back = [&](i64 temp, i64 act, i64 cast) { w.at(temp, S + act, C + cast, Phase::backward, top); };
  back(X + 2 * a + 2 * F + Wf, K - a, c);
  back(X + a + 3 * F, K - a - F / 2, c - Wf / 2);
  back(X + 3 * a + 2 * F + Wf, K - a - 2 * F, c - Wf / 2);
  back(X + 4 * a + F + Wf, K - 3 * a / 2 - 2 * F, c - Wf);
  back(X + 2 * a + 2 * Q + Wq, 4 * N + 3 * a / 2 + H, Wq + Wk);
  if (z.flash)
    back(X + a + 4 * Q + 4 * Ck, 4 * N + 3 * a / 2 + H, Wq / 2 + Wk);
  else
    back(X + a + 3 * Q + 2 * Ck + A, 4 * N + 3 * a / 2 + 3 * Q + A, Wq / 2 + Wk);
  back(X + 3 * a + Q + 2 * Ck + Wq, 4 * N + 3 * a / 2, Wq / 2 + Wk);
  back(X + 4 * a + Q + 2 * Ck + Wk, 4 * N + 3 * a / 2, Wq / 2 + Wk);
  return w.best();
}

}  // namespace shardscope
