// The Llama family as Hugging Face's LlamaForCausalLM (--model llama; mistral and qwen2
// configs are the same module): the token embedding (no positions), L decoder layers
// (input RMSNorm; q, k, v projections, with biases for qwen2 or attention_bias; RoPE on q
// and k; grouped-query causal attention; o projection; residual; post-attention RMSNorm;
// SwiGLU MLP down(silu(gate(x)) * up(x)); residual), the final RMSNorm, the head (untied
// lm_head unless the config ties it to the embedding) and cross-entropy over the
// vocabulary, mean over tokens.
//
// A block's rows are sequences: N = rows * seq tokens, (N, features) fp32 row-major;
// q is (N, H d), k and v (N, K d) (H heads, K kv heads, d head_dim).
//
// What each op saves (docs/design.md §2, "Llama") is what torch's
// eager autograd saves for the same op where it is one op of torch's: a fused RMSNorm
// (F.rms_norm) saves its input and rstd; RoPE runs in our kernel on q and k in place,
// so SDPA's q and k are the rotated ones and no cos/sin tensors exist; flash attention
// saves q, k, v at their own (kv) size, its output and the log-sum-exp, as torch's SDPA
// with enable_gqa does; math attention saves what torch's math SDPA saves on k and v
// expanded to H heads (Hugging Face's repeat_kv); the SwiGLU saves gate's output, its
// SiLU, up's output and their product, as Hugging Face's module does.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "harness/model/llama_heads.hpp"
#include "harness/model/models.hpp"
#include "harness/model/transformer_parts.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using namespace transformer;

const char* const kFamily = "llama";

// The embedding block's table, which a tied head reads.
constexpr int kEmbeddingBlock = 0;
constexpr int kEmbedTokens = 0;

}  // namespace

LlamaLayerTensors llama_layer_tensors(const TransformerShape& s, int layer, const TensorParallel& tp) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const i64 h = s.hidden, f = s.ffn / tp.size, q = static_cast<i64>(s.heads / tp.size) * s.head_dim,
            kv = static_cast<i64>(kv_heads_per_rank(s, tp.size)) * s.head_dim;
  LlamaLayerTensors t;
  const float w = uniform_bound(kInitStd);
  auto add = [&](int& index, const std::string& name, std::vector<std::int64_t> shape, float bound = 0.0f,
                 float center = 0.0f) {
    index = static_cast<int>(t.params.size());
    t.params.push_back({p + name, std::move(shape), bound, center});
  };
  // Hugging Face's state_dict order: self_attn (q, k, v, o), mlp (gate, up, down),
  // input_layernorm, post_attention_layernorm. Biases start at zero, norms at one.
  add(t.qW, "self_attn.q_proj.weight", {q, h}, w);
  if (s.qkv_bias) add(t.qB, "self_attn.q_proj.bias", {q});
  add(t.kW, "self_attn.k_proj.weight", {kv, h}, w);
  if (s.qkv_bias) add(t.kB, "self_attn.k_proj.bias", {kv});
  add(t.vW, "self_attn.v_proj.weight", {kv, h}, w);
  if (s.qkv_bias) add(t.vB, "self_attn.v_proj.bias", {kv});
  add(t.oW, "self_attn.o_proj.weight", {h, q}, w);
  if (s.out_bias) add(t.oB, "self_attn.o_proj.bias", {h});
  add(t.gateW, "mlp.gate_proj.weight", {f, h}, w);
  add(t.upW, "mlp.up_proj.weight", {f, h}, w);
  add(t.downW, "mlp.down_proj.weight", {h, f}, w);
  add(t.norm1, "input_layernorm.weight", {h}, 0.0f, 1.0f);
  add(t.norm2, "post_attention_layernorm.weight", {h}, 0.0f, 1.0f);
  if (tp.size > 1) {
    const int r = tp.rank;
    // Replicated kv heads (fewer than tp): rank r's copy is kv head r / (T/K), the one
    // model's rows of that head, the same on the T/K ranks that share it.
    const int kr = r / kv_replicas(s, tp.size);
    shard_rows(t.params[t.qW], r, q, h);
    shard_rows(t.params[t.kW], kr, kv, h);
    shard_rows(t.params[t.vW], kr, kv, h);
    if (s.qkv_bias) {
      shard_rows(t.params[t.qB], r, 1, q);
      shard_rows(t.params[t.kB], kr, 1, kv);
      shard_rows(t.params[t.vB], kr, 1, kv);
    }
    shard_cols(t.params[t.oW], r, q, static_cast<i64>(s.heads) * s.head_dim);
    shard_rows(t.params[t.gateW], r, f, h);
    shard_rows(t.params[t.upW], r, f, h);
    shard_cols(t.params[t.downW], r, f, s.ffn);
  }
  return t;
}

namespace {

// ---- a decoder layer ----
// Under tensor parallelism (Megatron's split) rank r of T holds query heads [r H/T, (r+1)
// H/T) and kv heads [r K/T, (r+1) K/T) (T divides K: each rank's query heads read only
// its kv heads), or with fewer kv heads than tp (K divides T) a copy of kv head r / (T/K),
// the one its query heads read: q_proj, k_proj and v_proj column-parallel (their heads'
// rows, and of the biases; a copy's gradients summed over the group, KvGrads), o_proj
// row-parallel (the H d/T columns its heads feed; the bias whole); gate_proj and up_proj
// column-parallel (f/T rows each), down_proj row-parallel (f/T
// columns). A row-parallel projection's partial product is made in the buffer it ends
// in (x_mid, the layer's output) and all-reduced in place, then the residual (and
// o_proj's bias) added; the input gradient of q, k, v (one sum) and of gate and up (one
// sum) are all-reduced in place. The RMSNorms are whole on every rank, their gradients
// the same on every rank and not reduced.
class DecoderLayer final : public SequenceBlock {
 public:
  DecoderLayer(const TransformerShape& s, int layer, const TensorParallel& tp)
      : SequenceBlock(s, kFamily),
        name_("block " + std::to_string(layer)),
        tp_(tp),
        fl_(s.ffn / tp.size),
        as_(attention_shape(s, tp.size)),
        kv_replicas_(kv_replicas(s, tp.size)),
        kv_head_(tp.rank / kv_replicas_),
        t_(llama_layer_tensors(s, layer, tp)) {}
  bool checkpointable() const override { return true; }
  // down_proj: its output's gradient arrives first (the residual saves nothing).
  std::vector<TensorRef> first_backward_module(int index) const override {
    return module_tensors(index, {t_.downW});
  }
  void set_recompute_attention(bool on) override { recompute_attention_ = on; }
  std::string name() const override { return name_; }
  const std::vector<ParamSpec>& params() const override { return t_.params; }
  std::int64_t input_elems(int rows) const override { return stream(rows) * s_.hidden; }
  std::int64_t output_elems(int rows) const override { return stream(rows) * s_.hidden; }
  bool saves_input() const override { return true; }  // the input RMSNorm's input
  bool saves_output() const override { return false; }

  // What the forward keeps in tape.held: q, k, v (rotated), out and lse with flash; q
  // head-major, k and v expanded head-major, the probabilities and out with math.
  enum Held : int { kRstd1, kY1, kQ, kK, kV, kOut, kAttn, kXmid, kRstd2, kY2, kGate, kSilu, kUp, kProd, kHeld };
  // What the zero-bubble B keeps besides for W: each Linear's and each norm's output
  // gradient (temp): down_proj's dy, gate_proj's and up_proj's, the post-attention
  // norm's, o_proj's (the residual's dx_mid), q/k/v's (one buffer, rotated back), the
  // input norm's.
  enum Kept : int { kDy = kHeld, kDgate, kDup, kDy2, kDmid, kDqkv, kDy1, kKept };

  Buffer forward(const BlockCall& c, const float* x, bool /*input_requires_grad*/, bool output_saved,
                 BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = fl_;
    const i64 ns = stream(c.rows);  // the residual stream's tokens here: n, or n/T under --sp
    const i64 a = 4 * ns * h;       // bytes of one (N, h) activation of the stream
    const int hs = s_.hidden, q = static_cast<int>(qw()), kv = static_cast<int>(kvw());
    auto param = [&](int t) { return t < 0 ? nullptr : c.access.param(c.index, t); };
    auto act = [&](i64 count) { return be.alloc(Category::activation, floats(count)); };
    auto module = [&](std::initializer_list<int> t) { return module_tensors(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    held.clear();
    held.resize(kHeld);

    // input_layernorm (fused RMSNorm): saves its input and rstd (N, 1).
    c.access.module_forward_begin(module({t_.norm1}));
    held[kRstd1] = act(ns);
    held[kY1] = act(ns * h);
    be.rms_norm_forward(held[kY1].data(), held[kRstd1].data(), x, param(t_.norm1), static_cast<int>(ns), hs,
                        s_.norm_eps);
    c.saved.save(x, a);
    c.saved.save(held[kRstd1].data(), 4 * ns);
    c.saved.save(norm_ref_(), 0);
    c.access.module_forward_end(module({t_.norm1}));

    // q, k, v projections (each saves the norm's output and its weight); RoPE on q and k
    // in place. Flash saves all three; math copies them head-major and frees them.
    const bool flash = s_.attention == AttentionMode::flash;
    const Category qkv_category = flash ? Category::activation : Category::temp;
    Buffer qb, kb, vb;
    {
      // --sp: the norm's tokens gathered once for the three (a temp (N, h)); each saves the rank's.
      Buffer whole = gathered(c, held[kY1]);
      const float* y1 = whole ? whole.data() : held[kY1].data();
      // Each projection is a module: its output made after its pre-forward hook.
      auto project = [&](Buffer& out, int w, int b, int width) {
        c.access.module_forward_begin(module({w, b}));
        out = be.alloc(qkv_category, floats(n * width));
        linear_forward(be, out.data(), y1, param(w), param(b), n, hs, width, 0.0f);
        c.access.module_forward_end(module({w, b}));
      };
      project(qb, t_.qW, t_.qB, q);
      project(kb, t_.kW, t_.kB, kv);
      project(vb, t_.vW, t_.vB, kv);
    }
    for (const WeightRef* ref : {&q_ref_, &k_ref_, &v_ref_}) {
      c.saved.save(held[kY1].data(), a);
      c.saved.save((*ref)(), 0);
    }
    be.rope(qb.data(), q, c.rows, s_.seq, as_.heads, s_.head_dim, s_.rope_theta, false);
    be.rope(kb.data(), kv, c.rows, s_.seq, as_.kv_heads, s_.head_dim, s_.rope_theta, false);

    if (flash) {
      // SDPA (flash, GQA native) saves q, k, v, its output (token-major: o_proj's input
      // too) and the log-sum-exp (B, H, T).
      held[kOut] = act(n * q);
      held[kAttn] = act(lse_elems(c.rows));
      be.flash_attention_forward(flash_args(c.rows, qb.data(), kb.data(), vb.data()), held[kOut].data(), q,
                                 held[kAttn].data());
      held[kQ] = std::move(qb);
      held[kK] = std::move(kb);
      held[kV] = std::move(vb);
      c.saved.save(held[kQ].data(), 4 * n * q);
      c.saved.save(held[kK].data(), 4 * n * kv);
      c.saved.save(held[kV].data(), 4 * n * kv);
      c.saved.save(held[kOut].data(), 4 * n * q);
      // --checkpoint attention: the log-sum-exp is freed, not saved (flash_backward runs
      // the flash forward again).
      if (recompute_attention_)
        held[kAttn].reset();
      else
        c.saved.save(held[kAttn].data(), 4 * lse_elems(c.rows));
    } else {
      // Math SDPA on k and v expanded to H heads: q head-major, k and v expanded (bmm's
      // operands), the probabilities (B, H, T, T); its output copied token-major.
      held[kQ] = act(n * q);
      be.permute_heads(held[kQ].data(), qb.data(), q, c.rows, s_.seq, as_.heads, s_.head_dim, true);
      held[kK] = act(n * q);
      expand_heads(be, held[kK].data(), kb.data(), kv, c.rows, s_.seq, as_.heads, as_.kv_heads, s_.head_dim);
      held[kV] = act(n * q);
      expand_heads(be, held[kV].data(), vb.data(), kv, c.rows, s_.seq, as_.heads, as_.kv_heads, s_.head_dim);
      qb.reset();
      kb.reset();
      vb.reset();
      const MathAttention m = math_attention(as_, c.rows);
      // --checkpoint attention: the probabilities are freed, not saved (math_backward
      // recomputes them).
      auto [probs, out] = math_attention_forward(be, m, held[kQ].data(), held[kK].data(),
                                                 m.head_major(held[kV].data()), !recompute_attention_);
      held[kAttn] = std::move(probs);
      held[kOut] = std::move(out);
      for (int j : {kQ, kK, kAttn, kV})
        if (held[j]) c.saved.save(held[j].data(), static_cast<i64>(held[j].bytes()));
    }

    // x_mid = x + o_proj(out): o_proj saves out and its weight.
    c.access.module_forward_begin(module({t_.oW, t_.oB}));
    held[kXmid] = act(ns * h);
    residual_linear_forward(c, tp_, held[kXmid].data(), x, held[kOut].data(), param(t_.oW), param(t_.oB), n, q, hs,
                            kFamily);
    c.saved.save(held[kOut].data(), 4 * n * q);
    c.saved.save(o_ref_(), 0);
    c.access.module_forward_end(module({t_.oW, t_.oB}));

    // post_attention_layernorm
    c.access.module_forward_begin(module({t_.norm2}));
    held[kRstd2] = act(ns);
    held[kY2] = act(ns * h);
    be.rms_norm_forward(held[kY2].data(), held[kRstd2].data(), held[kXmid].data(), param(t_.norm2),
                        static_cast<int>(ns), hs, s_.norm_eps);
    c.saved.save(held[kXmid].data(), a);
    c.saved.save(held[kRstd2].data(), 4 * ns);
    c.saved.save(norm2_ref_(), 0);
    c.access.module_forward_end(module({t_.norm2}));

    // The MLP in Hugging Face's order: gate (saves y2), SiLU (saves gate's output), up
    // (saves y2), the product (saves both factors), down (saves the product).
    const int fs = fl_;
    c.access.module_forward_begin(module({t_.gateW}));
    held[kGate] = act(n * f);
    // --sp: the norm's tokens gathered once for gate and up (a temp (N, h), freed after up).
    Buffer y2_whole = gathered(c, held[kY2]);
    const float* y2 = y2_whole ? y2_whole.data() : held[kY2].data();
    linear_forward(be, held[kGate].data(), y2, param(t_.gateW), nullptr, n, hs, fs, 0.0f);
    c.saved.save(held[kY2].data(), a);
    c.saved.save(gate_ref_(), 0);
    c.access.module_forward_end(module({t_.gateW}));
    held[kSilu] = act(n * f);
    be.silu_forward(held[kSilu].data(), held[kGate].data(), floats(n * f));
    c.saved.save(held[kGate].data(), 4 * n * f);
    c.access.module_forward_begin(module({t_.upW}));
    held[kUp] = act(n * f);
    linear_forward(be, held[kUp].data(), y2, param(t_.upW), nullptr, n, hs, fs, 0.0f);
    y2_whole.reset();
    c.saved.save(held[kY2].data(), a);
    c.saved.save(up_ref_(), 0);
    c.access.module_forward_end(module({t_.upW}));
    held[kProd] = act(n * f);
    be.mul(held[kProd].data(), held[kSilu].data(), held[kUp].data(), floats(n * f));
    c.saved.save(held[kSilu].data(), 4 * n * f);
    c.saved.save(held[kUp].data(), 4 * n * f);

    // out = x_mid + down_proj(product): (N, h), activation when the next block saves it.
    c.access.module_forward_begin(module({t_.downW}));
    Buffer out = be.alloc(output_saved ? Category::activation : Category::temp, floats(ns * h));
    residual_linear_forward(c, tp_, out.data(), held[kXmid].data(), held[kProd].data(), param(t_.downW), nullptr, n, fs,
                            hs, kFamily);
    c.saved.save(held[kProd].data(), 4 * n * f);
    c.saved.save(down_ref_(), 0);
    c.access.module_forward_end(module({t_.downW}));
    return out;
  }

  Buffer backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = fl_, ns = stream(c.rows);
    const int hs = s_.hidden, fs = fl_, q = static_cast<int>(qw()), kv = static_cast<int>(kvw());
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto grad = [&](int t) { return t < 0 ? nullptr : c.access.grad(c.index, t); };
    auto temp = [&](i64 count) { return be.alloc(Category::temp, floats(count)); };
    std::vector<Buffer>& held = tape.held;
    auto drop = [&](int j) { drop_saved(c.saved, tape.held[j]); };
    auto module = [&](std::initializer_list<int> t) { return module_tensors(c.index, t); };
    out.reset();  // nothing in this block needs its output

    // down_proj (under --sp its output gradient's tokens gathered: the reduce-scatter's
    // backward), then the product's factors: d up = dp * silu, d silu = dp * up, d gate = SiLU'(d silu)
    c.access.module_backward_begin(module({t_.downW}));
    Buffer dy_whole = gathered(c, dy);
    Buffer dp = temp(n * f);
    linear_backward(be, dp.data(), grad(t_.downW), nullptr, dy_whole ? dy_whole.data() : dy.data(), held[kProd].data(),
                    param(t_.downW), n, fs, hs, beta);
    dy_whole.reset();
    c.saved.release(down_ref_());
    drop(kProd);
    c.access.module_backward_end(module({t_.downW}), true);
    Buffer du = temp(n * f);
    be.mul(du.data(), dp.data(), held[kSilu].data(), floats(n * f));
    drop(kSilu);
    be.mul(dp.data(), dp.data(), held[kUp].data(), floats(n * f));
    drop(kUp);
    be.silu_backward(dp.data(), dp.data(), held[kGate].data(), floats(n * f));
    drop(kGate);
    // up_proj and gate_proj, up first as autograd reaches them (the module used last
    // first): dy2 = d up W_up + d gate W_gate (--sp: the norm's saved tokens gathered again
    // for the weights' gradients, dy2 (N, h) reduce-scattered to the rank's)
    c.access.module_backward_begin(module({t_.upW}));
    Buffer y2_whole = gathered(c, held[kY2]);
    const float* y2 = y2_whole ? y2_whole.data() : held[kY2].data();
    Buffer dy2 = temp(n * h);
    linear_backward(be, dy2.data(), grad(t_.upW), nullptr, du.data(), y2, param(t_.upW), n, hs, fs, beta);
    du.reset();
    c.saved.release(up_ref_());
    c.access.module_backward_end(module({t_.upW}), true);
    c.access.module_backward_begin(module({t_.gateW}));
    linear_backward(be, dy2.data(), grad(t_.gateW), nullptr, dp.data(), y2, param(t_.gateW), n, hs, fs, beta, 1.0f);
    dp.reset();
    y2_whole.reset();
    column_input_grad(c, dy2);
    c.saved.release(gate_ref_());
    c.saved.release(held[kY2].data());
    drop(kY2);
    c.access.module_backward_end(module({t_.gateW}), true);

    // post_attention_layernorm, then the residual: dx_mid = the norm's dx + dy
    c.access.module_backward_begin(module({t_.norm2}));
    Buffer dmid = temp(ns * h);
    norm_backward(c, dmid, dy2, held[kXmid].data(), held[kRstd2], t_.norm2, beta);
    c.saved.release(norm2_ref_());
    drop(kXmid);
    drop(kRstd2);
    c.access.module_backward_end(module({t_.norm2}), true);
    add_residual(be, dmid, dy, ns * h);

    // o_proj (its output gradient's tokens gathered under --sp; its bias's gradient summed
    // over all of them)
    c.access.module_backward_begin(module({t_.oW, t_.oB}));
    Buffer dmid_whole = gathered(c, dmid);
    Buffer dout = temp(n * q);
    linear_backward(be, dout.data(), grad(t_.oW), grad(t_.oB), dmid_whole ? dmid_whole.data() : dmid.data(),
                    held[kOut].data(), param(t_.oW), n, q, hs, beta);
    dmid_whole.reset();
    c.saved.release(o_ref_());
    c.saved.release(held[kOut].data());  // o_proj's save of out
    c.access.module_backward_end(module({t_.oW, t_.oB}), true);

    // attention: dq (N, H d), dk and dv (N, K d) in one buffer, laid out one after another
    Buffer dqkv = s_.attention == AttentionMode::flash ? flash_backward(c, dout, held) : math_backward(c, dout, held);
    float* dq = dqkv.data();
    float* dk = dq + n * q;
    float* dv = dk + n * kv;
    be.rope(dq, q, c.rows, s_.seq, as_.heads, s_.head_dim, s_.rope_theta, true);
    be.rope(dk, kv, c.rows, s_.seq, as_.kv_heads, s_.head_dim, s_.rope_theta, true);

    // v, k and q projections, the last used first as autograd reaches them:
    // dy1 = dv W_v + dk W_k + dq W_q
    c.access.module_backward_begin(module({t_.vW, t_.vB}));
    Buffer y1_whole = gathered(c, held[kY1]);
    const float* y1 = y1_whole ? y1_whole.data() : held[kY1].data();
    Buffer dy1 = temp(n * h);
    // A replicated kv copy's (kv heads fewer than tp) k and v gradients go into its slot of
    // the group's sum, reduced once q's is made.
    const bool copies = kv_replicas_ > 1;
    KvGrads kvg = copies ? kv_grads(c, beta) : KvGrads{};
    const float kv_beta = copies ? kvg.beta : beta;
    linear_backward(be, dy1.data(), copies ? kvg.vW : grad(t_.vW), copies ? kvg.vB : grad(t_.vB), dv, y1,
                    param(t_.vW), n, hs, kv, kv_beta);
    c.saved.release(v_ref_());
    c.access.module_backward_end(module({t_.vW, t_.vB}), true);
    c.access.module_backward_begin(module({t_.kW, t_.kB}));
    linear_backward(be, dy1.data(), copies ? kvg.kW : grad(t_.kW), copies ? kvg.kB : grad(t_.kB), dk, y1,
                    param(t_.kW), n, hs, kv, kv_beta, 1.0f);
    c.saved.release(k_ref_());
    c.access.module_backward_end(module({t_.kW, t_.kB}), true);
    c.access.module_backward_begin(module({t_.qW, t_.qB}));
    linear_backward(be, dy1.data(), grad(t_.qW), grad(t_.qB), dq, y1, param(t_.qW), n, hs, q, beta, 1.0f);
    reduce_kv_grads(c, kvg, beta);
    y1_whole.reset();
    column_input_grad(c, dy1);
    dqkv.reset();
    c.saved.release(q_ref_());
    c.saved.release(held[kY1].data());
    c.saved.release(held[kY1].data());
    drop(kY1);
    c.access.module_backward_end(module({t_.qW, t_.qB}), true);

    // input_layernorm, then the residual: dx = the norm's dx + dx_mid
    c.access.module_backward_begin(module({t_.norm1}));
    Buffer dx = temp(ns * h);
    norm_backward(c, dx, dy1, x, held[kRstd1], t_.norm1, beta);
    c.saved.release(norm_ref_());
    c.saved.release(x);
    drop(kRstd1);
    c.access.module_backward_end(module({t_.norm1}), true);
    add_residual(be, dx, dmid, ns * h);
    return finish_backward(held, std::move(dx), needs_dx);
  }

  // B: dx through the same ops as backward, without the weights' gradients. What W
  // reads stays: every Linear's saved input, each norm's saved input, rstd and weight
  // reference, and the output gradients (Kept). SiLU's, the product's and the
  // attention's saves go as backward lets them go; each Linear's weight reference goes
  // with its dx. Under tensor parallelism B all-reduces the input gradients of gate and
  // up and of q, k and v, as backward does; W needs no communication.
  Buffer backward_input(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, bool free_output,
                        BlockTape& tape) override {
    SHARDSCOPE_REQUIRE(!tp_.sequence, "llama: the zero-bubble split of a sequence-parallel layer is not built");
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = fl_;
    const int hs = s_.hidden, fs = fl_, q = static_cast<int>(qw()), kv = static_cast<int>(kvw());
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto temp = [&](i64 count) { return be.alloc(Category::temp, floats(count)); };
    std::vector<Buffer>& held = tape.held;
    auto drop = [&](int j) { drop_saved(c.saved, tape.held[j]); };
    held.resize(kKept);
    if (free_output) out.reset();

    // down_proj, the product's factors, SiLU
    Buffer& dp = held[kDgate];
    dp = temp(n * f);
    linear_input_grad(be, dp.data(), dy.data(), param(t_.downW), n, fs, hs);
    c.saved.release(down_ref_());
    held[kDup] = temp(n * f);
    be.mul(held[kDup].data(), dp.data(), held[kSilu].data(), floats(n * f));
    drop(kSilu);
    be.mul(dp.data(), dp.data(), held[kUp].data(), floats(n * f));
    drop(kUp);
    be.silu_backward(dp.data(), dp.data(), held[kGate].data(), floats(n * f));
    drop(kGate);
    // up_proj and gate_proj (in backward's order: up first)
    held[kDy2] = temp(n * h);
    linear_input_grad(be, held[kDy2].data(), held[kDup].data(), param(t_.upW), n, hs, fs);
    linear_input_grad(be, held[kDy2].data(), dp.data(), param(t_.gateW), n, hs, fs, 1.0f);
    column_parallel_input_grad(c, tp_, held[kDy2], kFamily);
    c.saved.release(gate_ref_());
    c.saved.release(up_ref_());

    // post_attention_layernorm, then the residual
    held[kDmid] = temp(n * h);
    rms_norm_input_grad(be, held[kDmid].data(), held[kDy2].data(), held[kXmid].data(), held[kRstd2].data(),
                        param(t_.norm2), n, hs);
    be.add(held[kDmid].data(), dy.data(), floats(n * h));
    held[kDy] = std::move(dy);

    // o_proj, the attention, the q, k, v projections
    Buffer dout = temp(n * q);
    linear_input_grad(be, dout.data(), held[kDmid].data(), param(t_.oW), n, q, hs);
    c.saved.release(o_ref_());
    held[kDqkv] = s_.attention == AttentionMode::flash ? flash_backward(c, dout, held, /*keep_out*/ true)
                                                       : math_backward(c, dout, held, /*keep_out*/ true);
    float* dq = held[kDqkv].data();
    float* dk = dq + n * q;
    float* dv = dk + n * kv;
    be.rope(dq, q, c.rows, s_.seq, as_.heads, s_.head_dim, s_.rope_theta, true);
    be.rope(dk, kv, c.rows, s_.seq, as_.kv_heads, s_.head_dim, s_.rope_theta, true);
    // v, k and q (in backward's order)
    held[kDy1] = temp(n * h);
    linear_input_grad(be, held[kDy1].data(), dv, param(t_.vW), n, hs, kv);
    linear_input_grad(be, held[kDy1].data(), dk, param(t_.kW), n, hs, kv, 1.0f);
    linear_input_grad(be, held[kDy1].data(), dq, param(t_.qW), n, hs, q, 1.0f);
    column_parallel_input_grad(c, tp_, held[kDy1], kFamily);
    for (const WeightRef* ref : {&q_ref_, &k_ref_, &v_ref_}) c.saved.release((*ref)());

    // input_layernorm, then the residual
    Buffer dx;
    if (needs_dx) {
      dx = temp(n * h);
      rms_norm_input_grad(be, dx.data(), held[kDy1].data(), x, held[kRstd1].data(), param(t_.norm1), n, hs);
      be.add(dx.data(), held[kDmid].data(), floats(n * h));
    }
    return dx;
  }

  // W: the parameter gradients in the order backward writes them, each from its kept
  // output gradient (freed) and its saved input (released and freed).
  void backward_weight(const BlockCall& c, const float* x, float beta, BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows);
    const int hs = s_.hidden, fs = fl_, q = static_cast<int>(qw()), kv = static_cast<int>(kvw());
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto grad = [&](int t) { return t < 0 ? nullptr : c.access.grad(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    auto drop = [&](int j) { drop_saved(c.saved, tape.held[j]); };
    linear_weight_grad(be, grad(t_.downW), nullptr, held[kDy].data(), held[kProd].data(), n, fs, hs, beta);
    held[kDy].reset();
    drop(kProd);
    linear_weight_grad(be, grad(t_.gateW), nullptr, held[kDgate].data(), held[kY2].data(), n, hs, fs, beta);
    held[kDgate].reset();
    linear_weight_grad(be, grad(t_.upW), nullptr, held[kDup].data(), held[kY2].data(), n, hs, fs, beta);
    held[kDup].reset();
    c.saved.release(held[kY2].data());
    drop(kY2);
    rms_norm_weight_grad(be, grad(t_.norm2), held[kDy2].data(), held[kXmid].data(), held[kRstd2].data(), param(t_.norm2),
                         n, hs, beta);
    held[kDy2].reset();
    c.saved.release(norm2_ref_());
    drop(kXmid);
    drop(kRstd2);
    linear_weight_grad(be, grad(t_.oW), grad(t_.oB), held[kDmid].data(), held[kOut].data(), n, q, hs, beta);
    held[kDmid].reset();
    drop(kOut);  // o_proj's save of out
    const float* dq = held[kDqkv].data();
    linear_weight_grad(be, grad(t_.qW), grad(t_.qB), dq, held[kY1].data(), n, hs, q, beta);
    KvGrads kvg = kv_grads(c, beta);  // a replicated copy's: into its slot of the group's sum
    linear_weight_grad(be, kvg.kW, kvg.kB, dq + n * q, held[kY1].data(), n, hs, kv, kvg.beta);
    linear_weight_grad(be, kvg.vW, kvg.vB, dq + n * (q + kv), held[kY1].data(), n, hs, kv, kvg.beta);
    reduce_kv_grads(c, kvg, beta);
    held[kDqkv].reset();
    c.saved.release(held[kY1].data());
    c.saved.release(held[kY1].data());
    drop(kY1);
    rms_norm_weight_grad(be, grad(t_.norm1), held[kDy1].data(), x, held[kRstd1].data(), param(t_.norm1), n, hs, beta);
    held[kDy1].reset();
    c.saved.release(norm_ref_());
    c.saved.release(x);
    drop(kRstd1);
    held.clear();
  }

 private:
  // The attention's shape on this rank: its H/T query heads and K/T kv heads.
  static TransformerShape attention_shape(TransformerShape s, int tp) {
    s.kv_heads = kv_heads_per_rank(s, tp);
    s.heads /= tp;
    return s;
  }
  // Replicated kv heads (kv_replicas_ > 1, fewer kv heads than tp): k_proj's and v_proj's
  // gradients of the rank's copy are made into its head's slot of a temp holding every kv
  // head's (K slots, each k_proj's weight and bias then v_proj's: 2d(h + b) floats, b = 1
  // with qkv biases), zeros but the rank's; the temp is all-reduced over the tp group,
  // which makes each slot the sum of its T/K copies' gradients, the rank's slot is
  // written onto the gradients with beta, and the temp freed (reduce_kv_grads). The
  // copies' gradients are then equal, and so the copies stay equal. Otherwise the
  // gradients themselves, with beta.
  struct KvGrads {
    Buffer part;
    float *kW = nullptr, *kB = nullptr, *vW = nullptr, *vB = nullptr;
    float beta = 0.0f;
  };
  i64 kv_weight_floats() const { return kvw() * s_.hidden; }
  i64 kv_bias_floats() const { return s_.qkv_bias ? kvw() : 0; }
  i64 kv_slot_floats() const { return 2 * (kv_weight_floats() + kv_bias_floats()); }
  KvGrads kv_grads(const BlockCall& c, float beta) const {
    auto grad = [&](int t) { return t < 0 ? nullptr : c.access.grad(c.index, t); };
    KvGrads g;
    if (kv_replicas_ == 1) {
      g.kW = grad(t_.kW), g.kB = grad(t_.kB), g.vW = grad(t_.vW), g.vB = grad(t_.vB);
      g.beta = beta;
      return g;
    }
    const i64 w = kv_weight_floats(), b = kv_bias_floats();
    g.part = c.backend.alloc(Category::temp, floats(s_.kv_heads * kv_slot_floats()));
    c.backend.fill(g.part.data(), 0.0f, g.part.count());
    float* at = g.part.data() + kv_head_ * kv_slot_floats();
    g.kW = at;
    g.kB = b > 0 ? at + w : nullptr;
    g.vW = at + w + b;
    g.vB = b > 0 ? at + 2 * w + b : nullptr;
    return g;
  }
  void reduce_kv_grads(const BlockCall& c, KvGrads& g, float beta) const {
    if (!g.part) return;
    auto grad = [&](int t) { return c.access.grad(c.index, t); };
    const i64 w = kv_weight_floats(), b = kv_bias_floats();
    std::vector<GradSlot> slots = {{grad(t_.kW), w}};
    if (b > 0) slots.push_back({grad(t_.kB), b});
    slots.push_back({grad(t_.vW), w});
    if (b > 0) slots.push_back({grad(t_.vB), b});
    reduce_norm_grads(c, g.part, slots, beta, kFamily, kv_head_ * kv_slot_floats());
  }
  // The residual stream's tokens on this rank for `rows` sequences: N, or N/T under --sp.
  i64 stream(int rows) const { return stream_tokens(tp_, tokens(rows)); }
  // Under --sp the whole (N, h) of a stream tensor's tokens, gathered (temp); empty without.
  Buffer gathered(const BlockCall& c, const Buffer& part) const {
    return tp_.sequence ? gather_tokens(c, tp_, part.data(), tokens(c.rows), s_.hidden, kFamily) : Buffer{};
  }
  // A column-parallel pair's or triple's input gradient (N, h), this rank's part of the
  // sum: all-reduced in place under tp, reduce-scattered to the rank's tokens under --sp
  // (dx replaced by its (N/T, h) part).
  void column_input_grad(const BlockCall& c, Buffer& dx) const {
    if (tp_.sequence)
      dx = scatter_tokens(c, tp_, dx, tokens(c.rows), s_.hidden, kFamily);
    else
      column_parallel_input_grad(c, tp_, dx, kFamily);
  }
  // An RMSNorm's backward over the stream's tokens: dx (allocated by the caller) from dy
  // (freed); its weight's gradient with beta, or under --sp the rank's part of it made in
  // a temp (h) and all-reduced over the group (reduce_norm_grads).
  void norm_backward(const BlockCall& c, Buffer& dx, Buffer& dy, const float* x, const Buffer& rstd, int wt,
                     float beta) const {
    Backend& be = c.backend;
    const int h = s_.hidden, ns = static_cast<int>(stream(c.rows));
    const float* gamma = c.access.param(c.index, wt);
    if (!tp_.sequence) {
      be.rms_norm_backward(dx.data(), c.access.grad(c.index, wt), dy.data(), x, rstd.data(), gamma, ns, h, beta);
      dy.reset();
      return;
    }
    Buffer part = be.alloc(Category::temp, floats(h));
    be.rms_norm_backward(dx.data(), part.data(), dy.data(), x, rstd.data(), gamma, ns, h, 0.0f);
    dy.reset();
    reduce_norm_grads(c, part, {{c.access.grad(c.index, wt), h}}, beta, kFamily);
  }
  i64 qw() const { return static_cast<i64>(as_.heads) * s_.head_dim; }      // q's width, H d
  i64 kvw() const { return static_cast<i64>(as_.kv_heads) * s_.head_dim; }  // k's and v's, K d
  i64 lse_elems(int rows) const { return static_cast<i64>(rows) * as_.heads * s_.seq; }

  AttentionArgs flash_args(int rows, const float* q, const float* k, const float* v) const {
    return attention_args(as_, rows, q, k, v, static_cast<int>(qw()), static_cast<int>(kvw()));
  }

  // Flash: dq, dk, dv from the saved q, k, v, output and lse (all released and freed);
  // frees dout.
  // With keep_out (the split's B) out stays, still saved by o_proj for W.
  // --checkpoint attention: the flash forward runs again first (torch's checkpoint around
  // SDPA, when its backward unpacks a save), making a new output and log-sum-exp
  // (activation, saved) that its backward reads; freed with the rest.
  Buffer flash_backward(const BlockCall& c, Buffer& dout, std::vector<Buffer>& held, bool keep_out = false) const {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), q = qw(), kv = kvw();
    const AttentionArgs args = flash_args(c.rows, held[kQ].data(), held[kK].data(), held[kV].data());
    Buffer rerun;  // the re-run's output
    if (recompute_attention_) {
      rerun = be.alloc(Category::activation, floats(n * q));
      held[kAttn] = be.alloc(Category::activation, floats(lse_elems(c.rows)));
      be.flash_attention_forward(args, rerun.data(), q, held[kAttn].data());
      c.saved.save(rerun.data(), static_cast<i64>(rerun.bytes()));
      c.saved.save(held[kAttn].data(), static_cast<i64>(held[kAttn].bytes()));
    }
    Buffer dqkv = be.alloc(Category::temp, floats(n * (q + 2 * kv)));
    be.flash_attention_backward(args, rerun ? rerun.data() : held[kOut].data(), static_cast<int>(q), dout.data(),
                                held[kAttn].data(), dqkv.data(), dqkv.data() + n * q, dqkv.data() + n * (q + kv));
    dout.reset();
    for (int j : {kQ, kK, kV, kOut, kAttn}) {
      c.saved.release(held[j].data());
      if (j != kOut || !keep_out) held[j].reset();
    }
    if (rerun) drop_saved(c.saved, rerun);
    return dqkv;
  }

  // Math: through the saved q, expanded k, probabilities and expanded v (released and
  // freed; out, which only o_proj saved, freed first); frees dout. k's and v's
  // gradients are summed over each kv head's query heads.
  Buffer math_backward(const BlockCall& c, Buffer& dout, std::vector<Buffer>& held, bool keep_out = false) const {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), q = qw(), kv = kvw();
    if (!keep_out) held[kOut].reset();
    const MathAttention m = math_attention(as_, c.rows);
    HeadGrads g = math_attention_backward(be, c.saved, m, dout, held[kQ], held[kK], held[kAttn],
                                          m.head_major(held[kV].data()), held[kV]);
    Buffer dqkv = be.alloc(Category::temp, floats(n * (q + 2 * kv)));
    float* dq = dqkv.data();
    be.permute_heads(dq, g.dq.data(), static_cast<int>(q), c.rows, s_.seq, as_.heads, s_.head_dim, false);
    reduce_heads(be, dq + n * q, g.dk.data(), static_cast<int>(kv), c.rows, s_.seq, as_.heads, as_.kv_heads,
                 s_.head_dim);
    reduce_heads(be, dq + n * (q + kv), g.dv.data(), static_cast<int>(kv), c.rows, s_.seq, as_.heads, as_.kv_heads,
                 s_.head_dim);
    return dqkv;
  }

  std::string name_;
  TensorParallel tp_;
  int fl_;               // the MLP's inner features on this rank: f/T
  TransformerShape as_;  // the attention's shape on this rank
  int kv_replicas_;      // the ranks holding a copy of each kv head: T/K when K < T, else 1
  int kv_head_;          // with copies, the kv head this rank's is
  bool recompute_attention_ = false;  // --checkpoint attention
  LlamaLayerTensors t_;  // its tensors, and where each lies among them
  WeightRef norm_ref_, q_ref_, k_ref_, v_ref_, o_ref_, norm2_ref_, gate_ref_, up_ref_, down_ref_;
};

// ---- the final block: model.norm and the head (lm_head, or the embedding when tied) ----
class FinalBlock final : public FinalNormHead {
 public:
  FinalBlock(const TransformerShape& s, const TensorParallel& tp)
      : FinalNormHead(s, kFamily, /*norm_stats: rstd*/ 1, tp) {
    params_ = {{"model.norm.weight", {s.hidden}, 0.0f, 1.0f}};
    if (!s.tied_embeddings) {
      // lm_head: vocabulary-parallel under tp (rank r's V/T rows).
      ParamSpec head{"lm_head.weight", {vocab(), s.hidden}, uniform_bound(kInitStd)};
      if (tp.size > 1) shard_rows(head, tp.rank, vocab(), s.hidden);
      params_.push_back(head);
    }
  }
  const std::vector<ParamSpec>& params() const override { return params_; }
  TensorRef tied_param() const override {
    return s_.tied_embeddings ? TensorRef{kEmbeddingBlock, kEmbedTokens} : TensorRef{};
  }

 private:
  void norm_forward(const BlockCall& c, float* y, const std::vector<Buffer>& st, const float* x,
                    i64 n) const override {
    c.backend.rms_norm_forward(y, st[0].data(), x, c.access.param(c.index, 0), static_cast<int>(n), s_.hidden,
                               s_.norm_eps);
  }
  void norm_backward(const BlockCall& c, float* dx, const float* dy, const float* x, const std::vector<Buffer>& st,
                     i64 n, float beta, float* into) const override {
    c.backend.rms_norm_backward(dx, into ? into : c.access.grad(c.index, 0), dy, x, st[0].data(),
                                c.access.param(c.index, 0), static_cast<int>(n), s_.hidden, beta);
  }
  void norm_input_grad(const BlockCall& c, float* dx, const float* dy, const float* x, const std::vector<Buffer>& st,
                       i64 n) const override {
    rms_norm_input_grad(c.backend, dx, dy, x, st[0].data(), c.access.param(c.index, 0), n, s_.hidden);
  }
  void norm_weight_grad(const BlockCall& c, const float* dy, const float* x, const std::vector<Buffer>& st, i64 n,
                        float beta) const override {
    rms_norm_weight_grad(c.backend, c.access.grad(c.index, 0), dy, x, st[0].data(), c.access.param(c.index, 0), n,
                         s_.hidden, beta);
  }
  const float* head_weight(const BlockCall& c) const override {
    return s_.tied_embeddings ? c.access.param(kEmbeddingBlock, kEmbedTokens) : c.access.param(c.index, 1);
  }
  float* head_grad(const BlockCall& c) const override {
    return s_.tied_embeddings ? c.access.grad(kEmbeddingBlock, kEmbedTokens) : c.access.grad(c.index, 1);
  }
  TensorRef head_tensor(const BlockCall& c) const override {
    return s_.tied_embeddings ? TensorRef{kEmbeddingBlock, kEmbedTokens} : TensorRef{c.index, 1};
  }
  const void* head_key(const BlockCall& /*c*/) const override { return head_ref_(); }

  std::vector<ParamSpec> params_;
  WeightRef head_ref_;
};

}  // namespace

std::unique_ptr<Model> make_llama(const ModelConfig& m, const TensorParallel& split) {
  TensorParallel tp = split;
  tp.sequence = m.sequence_parallel && tp.size > 1;
  TransformerShape s = m.transformer;
  if (s.head_dim == 0 && s.heads > 0) s.head_dim = s.hidden / s.heads;
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  SHARDSCOPE_REQUIRE(s.layers > 0 && s.hidden > 0 && s.heads > 0 && s.kv_heads > 0 && s.heads % s.kv_heads == 0 &&
                         s.head_dim > 0 && s.head_dim % 2 == 0 && s.ffn > 0 && s.vocab > 0 && s.seq > 0,
                     "llama: an unchecked transformer shape");
  SHARDSCOPE_REQUIRE(tp.size == 1 || (!m.param_bf16 && !(m.autocast && tp.sequence) && s.heads % tp.size == 0 &&
                                      (s.kv_heads % tp.size == 0 || tp.size % s.kv_heads == 0) &&
                                      s.ffn % tp.size == 0 && s.vocab % tp.size == 0),
                     "llama: an unchecked tensor-parallel shape");
  SHARDSCOPE_REQUIRE(!tp.sequence || s.seq % tp.size == 0, "llama: an unchecked sequence-parallel shape");
  if (m.autocast) return make_llama_autocast(s, tp);
  if (m.param_bf16) return make_llama_param_bf16(s);
  std::vector<std::unique_ptr<Block>> blocks;
  blocks.push_back(make_embedding_block(s, {"model.embed_tokens.weight", ""}, kFamily, tp));
  for (int i = 0; i < s.layers; ++i) blocks.push_back(std::make_unique<DecoderLayer>(s, i, tp));
  blocks.push_back(std::make_unique<FinalBlock>(s, tp));
  return std::make_unique<Model>(std::move(blocks), make_cross_entropy(s, kFamily, tp));
}

}  // namespace shardscope
