// Llama under FSDP's MixedPrecision(param_dtype=bf16, reduce_dtype=fp32) and DeepSpeed's
// bf16 (ModelConfig::param_bf16): Hugging Face's LlamaForCausalLM cast to bf16
// (model.to(torch.bfloat16), no autocast), on bf16 views of the strategy's parameters and
// bf16 gradient slots (param_bf16_parts.hpp). Unlike GPT-2's module it does not stay in
// bf16. What each op keeps (docs/design.md, "Llama's bf16 module"; bench/hf_llama_saved.py
// --precision module --itemize lists Hugging Face's):
//   each RMSNorm  its bf16 input upcast to fp32 (Hugging Face's hidden_states.to(float32),
//                 saved), the fp32 rstd (N) and its bf16 output. Hugging Face also keeps the
//                 bf16 x·rstd its weight multiplies; our fused RMSNorm does not (as in fp32),
//                 and rounds x·rstd to bf16 inside before the weight's multiply.
//   the stream    a layer's bf16 input and x_mid are saved by nobody (the residual adds
//                 save nothing, the norms their fp32 copies): x_mid is freed when the layer's
//                 output is made, the input once the layer's forward ends (Model::forward).
//   q, k, v       bf16 (RoPE in our kernel, in place: no cos/sin tables, where Hugging Face
//                 saves bf16 cos and sin (1, 1, T, d) once a forward)
//   flash         q, k, v at their own widths, its bf16 output and the fp32 log-sum-exp
//   math          torch's math SDPA on bf16: q, k and v upcast to fp32 head-major (k and v
//                 expanded to H heads), the fp32 probabilities, a bf16 output
//   the MLP       gate's output, SiLU's, up's and their product, bf16
//   the loss      the bf16 logits (saved by nobody) upcast to fp32 (Hugging Face's
//                 logits.float(), a temp), fp32 log-probabilities, the target, an fp32
//                 total_weight.
// Every gradient is bf16 (the strategy reduces it in fp32): the stream's, each Linear's
// input gradient, the norms' (computed in fp32 inside the kernel from the saved fp32 copy).
// --checkpoint attention keeps no save of the core's own (flash's lse, math's probabilities):
// torch's checkpoint around SDPA makes it again in backward. The zero-bubble split is not
// built (no pipeline takes FSDP's or DeepSpeed's bf16).
#include <memory>
#include <string>
#include <vector>

#include "harness/model/llama_heads.hpp"
#include "harness/model/models.hpp"
#include "harness/model/param_bf16_parts.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using namespace transformer;

const char* const kFamily = "llama";
constexpr int kEmbeddingBlock = 0;
constexpr int kEmbedTokens = 0;

// ---- the bf16 kernels Llama adds (each computes in fp32 and rounds its outputs once) ----

// The fused RMSNorm on x32 (n, h), the fp32 upcast of its bf16 input: rstd (n) fp32 and
// y = bf16(gamma · bf16(x32 · rstd)), as Hugging Face rounds the normalized input to the
// module's dtype before its weight's multiply.
void rms_norm_bf16(Backend& be, Bf16* y, float* rstd, const float* x32, const Bf16* gamma, i64 n, int h, float eps) {
  const std::vector<float> ones(floats(h), 1.0f), g = widened(gamma, h);
  std::vector<float> xn(floats(n * h));
  be.rms_norm_forward(xn.data(), rstd, x32, ones.data(), static_cast<int>(n), h, eps);
  for (i64 i = 0; i < n; ++i)
    for (i64 j = 0; j < h; ++j)
      y[i * h + j] = to_bf16(g[floats(j)] * from_bf16(to_bf16(xn[floats(i * h + j)])));
}

// Its backward from dy (n, h) bf16: dx (n, h) bf16 and the weight's gradient with beta.
void rms_norm_bf16_backward(Backend& be, Bf16* dx, Bf16* dgamma, const Bf16* dy, const float* x32, const float* rstd,
                            const Bf16* gamma, i64 n, int h, float beta) {
  const std::vector<float> dy32 = widened(dy, n * h), g = widened(gamma, h);
  std::vector<float> dx32(floats(n * h)), dg(floats(h));
  be.rms_norm_backward(dx32.data(), dg.data(), dy32.data(), x32, rstd, g.data(), static_cast<int>(n), h, 0.0f);
  round_into(dx, dx32.data(), n * h);
  write_grad(dgamma, dg.data(), h, beta);
}

// A Linear's backward whose input gradient adds onto dx (bf16, rounded once more), as
// autograd sums the gradients of a tensor several Linears read (q, k, v; gate, up).
void bf16_linear_backward_adding(Backend& be, Bf16* dx, Bf16* dw, Bf16* db, const Bf16* dy, const Bf16* x,
                                 const Bf16* w, i64 n, int in, int out, float beta) {
  std::vector<Bf16> part(floats(n * in));
  bf16_linear_backward(be, part.data(), dw, db, dy, x, w, n, in, out, beta);
  for (i64 i = 0; i < n * in; ++i) dx[i] = to_bf16(from_bf16(dx[i]) + from_bf16(part[floats(i)]));
}

// RoPE in place on bf16 x (n tokens, row stride ld = heads · head_dim).
void rope_bf16(Backend& be, Bf16* x, i64 n, const TransformerShape& s, int rows, int heads, bool inverse) {
  const int ld = heads * s.head_dim;
  std::vector<float> w = widened(x, n * ld);
  be.rope(w.data(), ld, rows, s.seq, heads, s.head_dim, s.rope_theta, inverse);
  round_into(x, w.data(), n * ld);
}

// An fp32 upcast (activation, saved) of bf16 x (count).
Buffer upcast(Backend& be, const Bf16* x, i64 count) {
  Buffer out = be.alloc(Category::activation, floats(count));
  be.cast_from_bf16(out.data(), x, floats(count), 0.0f);
  return out;
}

// ---- a decoder layer ----
class Bf16DecoderLayer final : public SequenceBlock {
 public:
  Bf16DecoderLayer(const TransformerShape& s, int layer)
      : SequenceBlock(s, kFamily), name_("block " + std::to_string(layer)), t_(llama_layer_tensors(s, layer)) {}
  // --checkpoint full|every:K: a wrapped layer's saves are dropped (its bf16 input, saved
  // by the checkpoint, stays) and it re-runs at the start of its backward.
  bool checkpointable() const override { return true; }
  // down_proj: its output's gradient arrives first (the residual saves nothing).
  std::vector<TensorRef> first_backward_module(int index) const override {
    return module_tensors(index, {t_.downW});
  }
  // --checkpoint attention: the core's own save (flash's fp32 lse, math's fp32 probabilities)
  // is not kept; torch's checkpoint around SDPA re-runs it on the saved q, k, v when its
  // backward unpacks a save (flash: a new bf16 output and lse, saved; math: the probabilities
  // made again in the math backward).
  void set_recompute_attention(bool on) override { recompute_attention_ = on; }
  std::string name() const override { return name_; }
  const std::vector<ParamSpec>& params() const override { return t_.params; }
  std::int64_t input_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  std::int64_t output_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  std::int64_t input_bytes(int rows) const override { return 2 * input_elems(rows); }
  DType output_dtype() const override { return DType::bf16; }
  bool saves_input() const override { return false; }  // the input norm saves its fp32 upcast
  bool saves_output() const override { return false; }

  // What the forward keeps: each norm's fp32 input, rstd and bf16 output; flash's bf16 q,
  // k, v, output and fp32 lse, or math's fp32 q, k, v (head-major, k and v expanded),
  // probabilities and bf16 output; x_mid (bf16, until the output is made); the MLP's.
  enum Held : int {
    kX1, kRstd1, kY1, kQ, kK, kV, kOut, kAttn, kXmid, kX2, kRstd2, kY2, kGate, kSilu, kUp, kProd, kHeld
  };

  Buffer forward(const BlockCall& c, const float* x_in, bool /*input_requires_grad*/, bool output_saved,
                 BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = s_.ffn;
    const int hs = s_.hidden, fs = s_.ffn, q = static_cast<int>(qw()), kv = static_cast<int>(kvw());
    const Bf16* x = as_bf16(x_in);
    auto p = [&](int t) { return t < 0 ? nullptr : bf16_param(c, t); };
    auto act16 = [&](i64 count) { return bf16_tensor(be, Category::activation, count); };
    auto module = [&](std::initializer_list<int> t) { return module_tensors(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    held.clear();
    held.resize(kHeld);

    // input_layernorm: the fp32 upcast (saved), rstd (saved), the bf16 output.
    c.access.module_forward_begin(module({t_.norm1}));
    norm_forward(c, held, kX1, x, t_.norm1, norm_ref_);
    c.access.module_forward_end(module({t_.norm1}));

    // q, k, v (each saves the norm's output and its weight); RoPE on q and k in place.
    const bool flash = s_.attention == AttentionMode::flash;
    const Category qkv_category = flash ? Category::activation : Category::temp;
    Buffer qb, kb, vb;
    auto project = [&](Buffer& out, int w, int b, int width) {
      c.access.module_forward_begin(module({w, b}));
      out = bf16_tensor(be, qkv_category, n * width);
      bf16_linear(be, out.bf16(), held[kY1].bf16(), p(w), p(b), n, hs, width);
      c.access.module_forward_end(module({w, b}));
    };
    project(qb, t_.qW, t_.qB, q);
    project(kb, t_.kW, t_.kB, kv);
    project(vb, t_.vW, t_.vB, kv);
    for (const WeightRef* ref : {&q_ref_, &k_ref_, &v_ref_}) {
      c.saved.save(held[kY1].raw(), 2 * n * h);
      c.saved.save((*ref)(), 0);
    }
    rope_bf16(be, qb.bf16(), n, s_, c.rows, s_.heads, false);
    rope_bf16(be, kb.bf16(), n, s_, c.rows, s_.kv_heads, false);

    if (flash) {
      // Flash SDPA (GQA native) on bf16 q, k, v: saves them, its bf16 output (token-major:
      // o_proj's input too) and the fp32 log-sum-exp (B, H, T).
      held[kOut] = act16(n * q);
      held[kAttn] = be.alloc(Category::activation, floats(lse_elems(c.rows)));
      {
        const std::vector<float> q32 = widened(qb.bf16(), n * q), k32 = widened(kb.bf16(), n * kv),
                                 v32 = widened(vb.bf16(), n * kv);
        std::vector<float> out32(floats(n * q));
        be.flash_attention_forward(attention_args(s_, c.rows, q32.data(), k32.data(), v32.data(), q, kv),
                                   out32.data(), q, held[kAttn].data());
        round_into(held[kOut].bf16(), out32.data(), n * q);
      }
      held[kQ] = std::move(qb);
      held[kK] = std::move(kb);
      held[kV] = std::move(vb);
      c.saved.save(held[kQ].raw(), 2 * n * q);
      c.saved.save(held[kK].raw(), 2 * n * kv);
      c.saved.save(held[kV].raw(), 2 * n * kv);
      c.saved.save(held[kOut].raw(), 2 * n * q);
      if (recompute_attention_)
        held[kAttn].reset();  // not saved: the core's checkpoint makes it again
      else
        c.saved.save(held[kAttn].data(), 4 * lse_elems(c.rows));
    } else {
      // Math SDPA on the CPU upcasts q, k, v to fp32: q head-major, k and v expanded to H
      // heads (its bmms save them), fp32 probabilities, and hands back a bf16 output,
      // token-major for o_proj.
      {
        const std::vector<float> q32 = widened(qb.bf16(), n * q), k32 = widened(kb.bf16(), n * kv),
                                 v32 = widened(vb.bf16(), n * kv);
        held[kQ] = be.alloc(Category::activation, floats(n * q));
        be.permute_heads(held[kQ].data(), q32.data(), q, c.rows, s_.seq, s_.heads, s_.head_dim, true);
        held[kK] = be.alloc(Category::activation, floats(n * q));
        expand_heads(be, held[kK].data(), k32.data(), kv, c.rows, s_.seq, s_.heads, s_.kv_heads, s_.head_dim);
        held[kV] = be.alloc(Category::activation, floats(n * q));
        expand_heads(be, held[kV].data(), v32.data(), kv, c.rows, s_.seq, s_.heads, s_.kv_heads, s_.head_dim);
      }
      qb.reset();
      kb.reset();
      vb.reset();
      const MathAttention m = math_attention(s_, c.rows);
      auto [probs, out32] = math_attention_forward(be, m, held[kQ].data(), held[kK].data(),
                                                   m.head_major(held[kV].data()), !recompute_attention_);
      held[kAttn] = std::move(probs);
      held[kOut] = act16(n * q);
      round_into(held[kOut].bf16(), out32.data(), n * q);
      out32.reset();
      for (int j : {kQ, kK, kAttn, kV})
        if (held[j]) c.saved.save(held[j].data(), static_cast<i64>(held[j].bytes()));
    }

    // x_mid = x + o_proj(out), bf16 (temp: the post-attention norm saves its fp32 upcast).
    c.access.module_forward_begin(module({t_.oW, t_.oB}));
    held[kXmid] = bf16_tensor(be, Category::temp, n * h);
    bf16_linear(be, held[kXmid].bf16(), held[kOut].bf16(), p(t_.oW), p(t_.oB), n, q, hs, x);
    c.saved.save(held[kOut].raw(), 2 * n * q);
    c.saved.save(o_ref_(), 0);
    c.access.module_forward_end(module({t_.oW, t_.oB}));

    // post_attention_layernorm
    c.access.module_forward_begin(module({t_.norm2}));
    norm_forward(c, held, kX2, held[kXmid].bf16(), t_.norm2, norm2_ref_);
    c.access.module_forward_end(module({t_.norm2}));

    // The MLP in Hugging Face's order: gate (saves y2), SiLU (saves gate's output), up
    // (saves y2), the product (saves both factors), down (saves the product).
    const Bf16* y2 = held[kY2].bf16();
    c.access.module_forward_begin(module({t_.gateW}));
    held[kGate] = act16(n * f);
    bf16_linear(be, held[kGate].bf16(), y2, p(t_.gateW), nullptr, n, hs, fs);
    c.saved.save(held[kY2].raw(), 2 * n * h);
    c.saved.save(gate_ref_(), 0);
    c.access.module_forward_end(module({t_.gateW}));
    held[kSilu] = act16(n * f);
    {
      std::vector<float> g = widened(held[kGate].bf16(), n * f);
      be.silu_forward(g.data(), g.data(), floats(n * f));
      round_into(held[kSilu].bf16(), g.data(), n * f);
    }
    c.saved.save(held[kGate].raw(), 2 * n * f);
    c.access.module_forward_begin(module({t_.upW}));
    held[kUp] = act16(n * f);
    bf16_linear(be, held[kUp].bf16(), y2, p(t_.upW), nullptr, n, hs, fs);
    c.saved.save(held[kY2].raw(), 2 * n * h);
    c.saved.save(up_ref_(), 0);
    c.access.module_forward_end(module({t_.upW}));
    held[kProd] = act16(n * f);
    for (i64 i = 0; i < n * f; ++i)
      held[kProd].bf16()[i] = to_bf16(from_bf16(held[kSilu].bf16()[i]) * from_bf16(held[kUp].bf16()[i]));
    c.saved.save(held[kSilu].raw(), 2 * n * f);
    c.saved.save(held[kUp].raw(), 2 * n * f);

    // out = x_mid + down_proj(product): (N, h) bf16, activation when a checkpoint saves it.
    c.access.module_forward_begin(module({t_.downW}));
    Buffer out = bf16_tensor(be, output_saved ? Category::activation : Category::temp, n * h);
    bf16_linear(be, out.bf16(), held[kProd].bf16(), p(t_.downW), nullptr, n, fs, hs, held[kXmid].bf16());
    c.saved.save(held[kProd].raw(), 2 * n * f);
    c.saved.save(down_ref_(), 0);
    c.access.module_forward_end(module({t_.downW}));
    held[kXmid].reset();  // the residual's last use
    return out;
  }

  Buffer backward(const BlockCall& c, const float* /*x*/, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = s_.ffn;
    const int hs = s_.hidden, fs = s_.ffn, q = static_cast<int>(qw()), kv = static_cast<int>(kvw());
    auto p = [&](int t) { return t < 0 ? nullptr : bf16_param(c, t); };
    auto g = [&](int t) { return t < 0 ? nullptr : bf16_grad(c, t); };
    auto tmp16 = [&](i64 count) { return bf16_tensor(be, Category::temp, count); };
    auto module = [&](std::initializer_list<int> t) { return module_tensors(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    auto drop = [&](int j) {
      c.saved.release(held[j].raw());
      held[j].reset();
    };
    out.reset();

    // down_proj: d product (N, f); then its factors: d up = dp · silu, d silu = dp · up,
    // d gate = SiLU'(gate) · d silu (in dp's buffer).
    c.access.module_backward_begin(module({t_.downW}));
    Buffer dp = tmp16(n * f);
    bf16_linear_backward(be, dp.bf16(), g(t_.downW), nullptr, dy.bf16(), held[kProd].bf16(), p(t_.downW), n, fs, hs,
                         beta);
    c.saved.release(down_ref_());
    drop(kProd);
    c.access.module_backward_end(module({t_.downW}), true);
    Buffer du = tmp16(n * f);
    {
      std::vector<float> d = widened(dp.bf16(), n * f);
      const std::vector<float> silu = widened(held[kSilu].bf16(), n * f), up = widened(held[kUp].bf16(), n * f),
                               gate = widened(held[kGate].bf16(), n * f);
      for (i64 i = 0; i < n * f; ++i) du.bf16()[i] = to_bf16(d[floats(i)] * silu[floats(i)]);
      drop(kSilu);
      for (i64 i = 0; i < n * f; ++i) d[floats(i)] = from_bf16(to_bf16(d[floats(i)] * up[floats(i)]));
      drop(kUp);
      be.silu_backward(d.data(), d.data(), gate.data(), floats(n * f));
      round_into(dp.bf16(), d.data(), n * f);
      drop(kGate);
    }
    // up_proj, then gate_proj (the module used last first, as autograd reaches them):
    // dy2 = d up W_up + d gate W_gate.
    c.access.module_backward_begin(module({t_.upW}));
    Buffer dy2 = tmp16(n * h);
    bf16_linear_backward(be, dy2.bf16(), g(t_.upW), nullptr, du.bf16(), held[kY2].bf16(), p(t_.upW), n, hs, fs, beta);
    du.reset();
    c.saved.release(up_ref_());
    c.access.module_backward_end(module({t_.upW}), true);
    c.access.module_backward_begin(module({t_.gateW}));
    bf16_linear_backward_adding(be, dy2.bf16(), g(t_.gateW), nullptr, dp.bf16(), held[kY2].bf16(), p(t_.gateW), n,
                                hs, fs, beta);
    dp.reset();
    c.saved.release(gate_ref_());
    c.saved.release(held[kY2].raw());
    drop(kY2);
    c.access.module_backward_end(module({t_.gateW}), true);

    // post_attention_layernorm, then the residual: dx_mid = the norm's dx + dy.
    c.access.module_backward_begin(module({t_.norm2}));
    Buffer dmid = tmp16(n * h);
    rms_norm_bf16_backward(be, dmid.bf16(), g(t_.norm2), dy2.bf16(), held[kX2].data(), held[kRstd2].data(),
                           p(t_.norm2), n, hs, beta);
    dy2.reset();
    c.saved.release(norm2_ref_());
    drop(kX2);
    drop(kRstd2);
    c.access.module_backward_end(module({t_.norm2}), true);
    add_into(dmid, dy, n * h);

    // o_proj: d out (N, H d)
    c.access.module_backward_begin(module({t_.oW, t_.oB}));
    Buffer dout = tmp16(n * q);
    bf16_linear_backward(be, dout.bf16(), g(t_.oW), g(t_.oB), dmid.bf16(), held[kOut].bf16(), p(t_.oW), n, q, hs,
                         beta);
    c.saved.release(o_ref_());
    c.saved.release(held[kOut].raw());  // o_proj's save of out (flash's own stays)
    c.access.module_backward_end(module({t_.oW, t_.oB}), true);

    // The attention: dq (N, H d), dk and dv (N, K d) in one bf16 buffer; RoPE back on dq, dk.
    Buffer dqkv = s_.attention == AttentionMode::flash ? flash_backward(c, dout, held) : math_backward(c, dout, held);
    Bf16* dq = dqkv.bf16();
    Bf16* dk = dq + n * q;
    Bf16* dv = dk + n * kv;
    rope_bf16(be, dq, n, s_, c.rows, s_.heads, true);
    rope_bf16(be, dk, n, s_, c.rows, s_.kv_heads, true);

    // v, k and q projections, the last used first: dy1 = dv W_v + dk W_k + dq W_q.
    const Bf16* y1 = held[kY1].bf16();
    c.access.module_backward_begin(module({t_.vW, t_.vB}));
    Buffer dy1 = tmp16(n * h);
    bf16_linear_backward(be, dy1.bf16(), g(t_.vW), g(t_.vB), dv, y1, p(t_.vW), n, hs, kv, beta);
    c.saved.release(v_ref_());
    c.access.module_backward_end(module({t_.vW, t_.vB}), true);
    c.access.module_backward_begin(module({t_.kW, t_.kB}));
    bf16_linear_backward_adding(be, dy1.bf16(), g(t_.kW), g(t_.kB), dk, y1, p(t_.kW), n, hs, kv, beta);
    c.saved.release(k_ref_());
    c.access.module_backward_end(module({t_.kW, t_.kB}), true);
    c.access.module_backward_begin(module({t_.qW, t_.qB}));
    bf16_linear_backward_adding(be, dy1.bf16(), g(t_.qW), g(t_.qB), dq, y1, p(t_.qW), n, hs, q, beta);
    dqkv.reset();
    c.saved.release(q_ref_());
    c.saved.release(held[kY1].raw());
    c.saved.release(held[kY1].raw());
    drop(kY1);
    c.access.module_backward_end(module({t_.qW, t_.qB}), true);

    // input_layernorm, then the residual: dx = the norm's dx + dx_mid.
    c.access.module_backward_begin(module({t_.norm1}));
    Buffer dx = tmp16(n * h);
    rms_norm_bf16_backward(be, dx.bf16(), g(t_.norm1), dy1.bf16(), held[kX1].data(), held[kRstd1].data(),
                           p(t_.norm1), n, hs, beta);
    dy1.reset();
    c.saved.release(norm_ref_());
    drop(kX1);
    drop(kRstd1);
    c.access.module_backward_end(module({t_.norm1}), true);
    add_into(dx, dmid, n * h);
    return finish_backward(held, std::move(dx), needs_dx);
  }

  Buffer backward_input(const BlockCall&, const float*, Buffer&, Buffer, bool, bool, BlockTape&) override {
    throw_unbuilt_param_bf16_split(kFamily);
  }
  void backward_weight(const BlockCall&, const float*, float, BlockTape&) override {
    throw_unbuilt_param_bf16_split(kFamily);
  }

 private:
  i64 qw() const { return static_cast<i64>(s_.heads) * s_.head_dim; }     // q's width, H d
  i64 kvw() const { return static_cast<i64>(s_.kv_heads) * s_.head_dim; }  // k's and v's, K d
  i64 lse_elems(int rows) const { return static_cast<i64>(rows) * s_.heads * s_.seq; }

  // An RMSNorm's forward on bf16 x: held[at] its fp32 upcast, held[at + 1] rstd,
  // held[at + 2] its bf16 output; saves the upcast, rstd and the weight.
  void norm_forward(const BlockCall& c, std::vector<Buffer>& held, int at, const Bf16* x, int weight,
                    const WeightRef& ref) const {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden;
    held[at] = upcast(be, x, n * h);
    held[at + 1] = be.alloc(Category::activation, floats(n));
    held[at + 2] = bf16_tensor(be, Category::activation, n * h);
    rms_norm_bf16(be, held[at + 2].bf16(), held[at + 1].data(), held[at].data(), bf16_param(c, weight), n, s_.hidden,
                  s_.norm_eps);
    c.saved.save(held[at].data(), 4 * n * h);
    c.saved.save(held[at + 1].data(), 4 * n);
    c.saved.save(ref(), 0);
  }

  // dst += src (bf16, count), src freed: a residual's gradient.
  static void add_into(Buffer& dst, Buffer& src, i64 count) {
    for (i64 i = 0; i < count; ++i) dst.bf16()[i] = to_bf16(from_bf16(dst.bf16()[i]) + from_bf16(src.bf16()[i]));
    src.reset();
  }

  // Flash: dq, dk, dv (bf16, one buffer) from the saved q, k, v, output and lse (all
  // released and freed); frees dout. --checkpoint attention: the flash forward runs again
  // first on the saved q, k, v, making a new bf16 output and fp32 lse (activation, saved),
  // which its backward reads; freed with the rest.
  Buffer flash_backward(const BlockCall& c, Buffer& dout, std::vector<Buffer>& held) const {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), q = qw(), kv = kvw();
    const std::vector<float> q32 = widened(held[kQ].bf16(), n * q), k32 = widened(held[kK].bf16(), n * kv),
                             v32 = widened(held[kV].bf16(), n * kv);
    const AttentionArgs args =
        attention_args(s_, c.rows, q32.data(), k32.data(), v32.data(), static_cast<int>(q), static_cast<int>(kv));
    Buffer rerun;  // the re-run's bf16 output
    if (recompute_attention_) {
      rerun = bf16_tensor(be, Category::activation, n * q);
      held[kAttn] = be.alloc(Category::activation, floats(lse_elems(c.rows)));
      std::vector<float> out32(floats(n * q));
      be.flash_attention_forward(args, out32.data(), static_cast<int>(q), held[kAttn].data());
      round_into(rerun.bf16(), out32.data(), n * q);
      c.saved.save(rerun.raw(), 2 * n * q);
      c.saved.save(held[kAttn].data(), 4 * lse_elems(c.rows));
    }
    Buffer dqkv = bf16_tensor(be, Category::temp, n * (q + 2 * kv));
    {
      const std::vector<float> o32 = widened((rerun ? rerun : held[kOut]).bf16(), n * q),
                               do32 = widened(dout.bf16(), n * q);
      std::vector<float> d32(floats(n * (q + 2 * kv)));
      be.flash_attention_backward(args, o32.data(), static_cast<int>(q), do32.data(), held[kAttn].data(), d32.data(),
                                  d32.data() + n * q, d32.data() + n * (q + kv));
      round_into(dqkv.bf16(), d32.data(), n * (q + 2 * kv));
    }
    dout.reset();
    for (int j : {kQ, kK, kV, kOut, kAttn}) {
      c.saved.release(held[j].raw());
      held[j].reset();
    }
    if (rerun) {
      c.saved.release(rerun.raw());
      rerun.reset();
    }
    return dqkv;
  }

  // Math: the bf16 output (which only o_proj saved) freed; dout upcast to fp32 (as the
  // math path's own conversion back to bf16 takes it in backward), then through the saved
  // q, expanded k, probabilities and expanded v in fp32 (released and freed); k's and v's
  // gradients summed over each kv head's query heads; dq, dk, dv rounded into one bf16
  // buffer beside the fp32 ones.
  Buffer math_backward(const BlockCall& c, Buffer& dout, std::vector<Buffer>& held) const {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), q = qw(), kv = kvw();
    held[kOut].reset();
    Buffer dout32 = be.alloc(Category::temp, floats(n * q));
    be.cast_from_bf16(dout32.data(), dout.bf16(), floats(n * q), 0.0f);
    dout.reset();
    const MathAttention m = math_attention(s_, c.rows);
    HeadGrads hg = math_attention_backward(be, c.saved, m, dout32, held[kQ], held[kK], held[kAttn],
                                           m.head_major(held[kV].data()), held[kV]);
    Buffer dqkv = bf16_tensor(be, Category::temp, n * (q + 2 * kv));
    std::vector<float> tok(floats(n * q));
    be.permute_heads(tok.data(), hg.dq.data(), static_cast<int>(q), c.rows, s_.seq, s_.heads, s_.head_dim, false);
    round_into(dqkv.bf16(), tok.data(), n * q);
    reduce_heads(be, tok.data(), hg.dk.data(), static_cast<int>(kv), c.rows, s_.seq, s_.heads, s_.kv_heads,
                 s_.head_dim);
    round_into(dqkv.bf16() + n * q, tok.data(), n * kv);
    reduce_heads(be, tok.data(), hg.dv.data(), static_cast<int>(kv), c.rows, s_.seq, s_.heads, s_.kv_heads,
                 s_.head_dim);
    round_into(dqkv.bf16() + n * (q + kv), tok.data(), n * kv);
    return dqkv;
  }

  std::string name_;
  bool recompute_attention_ = false;  // --checkpoint attention
  LlamaLayerTensors t_;  // its tensors, and where each lies among them
  WeightRef norm_ref_, q_ref_, k_ref_, v_ref_, o_ref_, norm2_ref_, gate_ref_, up_ref_, down_ref_;
};

// ---- the final block: model.norm and the head (lm_head, or the embedding when tied) ----
// The norm as a layer's (the fp32 upcast of its bf16 input, rstd and its bf16 output
// saved), then logits (N, V) = y W^T in bf16 (mm saves y and the weight). Backward: d y
// (temp, bf16) beside dlogits, dlogits freed, y released; dx (temp, bf16) and the norm's
// gradient; a tied weight's gradient written first with beta, the embedding adding its part.
class Bf16FinalNorm final : public SequenceBlock {
 public:
  explicit Bf16FinalNorm(const TransformerShape& s) : SequenceBlock(s, kFamily) {
    params_ = {{"model.norm.weight", {s.hidden}, 0.0f, 1.0f}};
    if (!s.tied_embeddings) params_.push_back({"lm_head.weight", {s.vocab, s.hidden}, uniform_bound(kInitStd)});
  }
  std::string name() const override { return "final"; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  TensorRef tied_param() const override {
    return s_.tied_embeddings ? TensorRef{kEmbeddingBlock, kEmbedTokens} : TensorRef{};
  }
  std::int64_t input_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  std::int64_t output_elems(int rows) const override { return tokens(rows) * s_.vocab; }
  DType output_dtype() const override { return DType::bf16; }
  bool saves_input() const override { return false; }   // the norm saves its fp32 upcast
  bool saves_output() const override { return false; }  // the loss upcasts the logits

  Buffer forward(const BlockCall& c, const float* x, bool /*input_requires_grad*/, bool output_saved,
                 BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden;
    std::vector<Buffer>& held = tape.held;
    held.clear();
    held.resize(kHeld);
    c.access.module_forward_begin(module_tensors(c.index, {0}));
    held[kX] = upcast(be, as_bf16(x), n * h);
    held[kRstd] = be.alloc(Category::activation, floats(n));
    held[kY] = bf16_tensor(be, Category::activation, n * h);
    rms_norm_bf16(be, held[kY].bf16(), held[kRstd].data(), held[kX].data(), bf16_param(c, 0), n, s_.hidden,
                  s_.norm_eps);
    c.saved.save(held[kX].data(), 4 * n * h);
    c.saved.save(held[kRstd].data(), 4 * n);
    c.saved.save(norm_ref_(), 0);
    c.access.module_forward_end(module_tensors(c.index, {0}));
    c.access.module_forward_begin({head_tensor(c)});
    Buffer out = bf16_tensor(be, output_saved ? Category::activation : Category::temp, n * s_.vocab);
    bf16_linear(be, out.bf16(), held[kY].bf16(), head_weight(c), nullptr, n, s_.hidden, s_.vocab);
    c.saved.save(held[kY].raw(), 2 * n * h);
    c.saved.save(head_ref_(), 0);
    c.access.module_forward_end({head_tensor(c)});
    return out;
  }

  Buffer backward(const BlockCall& c, const float* /*x*/, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden;
    std::vector<Buffer>& held = tape.held;
    out.reset();
    c.access.module_backward_begin({head_tensor(c)});
    Buffer dnorm = bf16_tensor(be, Category::temp, n * h);
    bf16_linear_backward(be, dnorm.bf16(), head_grad(c), nullptr, dy.bf16(), held[kY].bf16(), head_weight(c), n,
                         s_.hidden, s_.vocab, beta);
    dy.reset();
    c.saved.release(head_ref_());
    c.saved.release(held[kY].raw());
    held[kY].reset();
    c.access.module_backward_end({head_tensor(c)}, true);
    c.access.module_backward_begin(module_tensors(c.index, {0}));
    Buffer dx = bf16_tensor(be, Category::temp, n * h);
    rms_norm_bf16_backward(be, dx.bf16(), bf16_grad(c, 0), dnorm.bf16(), held[kX].data(), held[kRstd].data(),
                           bf16_param(c, 0), n, s_.hidden, beta);
    dnorm.reset();
    c.saved.release(norm_ref_());
    for (int j : {kX, kRstd}) {
      c.saved.release(held[j].data());
      held[j].reset();
    }
    c.access.module_backward_end(module_tensors(c.index, {0}), true);
    return finish_backward(held, std::move(dx), needs_dx);
  }

  Buffer backward_input(const BlockCall&, const float*, Buffer&, Buffer, bool, bool, BlockTape&) override {
    throw_unbuilt_param_bf16_split(kFamily);
  }
  void backward_weight(const BlockCall&, const float*, float, BlockTape&) override {
    throw_unbuilt_param_bf16_split(kFamily);
  }

 private:
  enum Held : int { kX, kRstd, kY, kHeld };
  TensorRef head_tensor(const BlockCall& c) const {
    return s_.tied_embeddings ? TensorRef{kEmbeddingBlock, kEmbedTokens} : TensorRef{c.index, 1};
  }
  const Bf16* head_weight(const BlockCall& c) const {
    const TensorRef t = head_tensor(c);
    return as_bf16(c.access.param(t.block, t.tensor));
  }
  Bf16* head_grad(const BlockCall& c) const {
    const TensorRef t = head_tensor(c);
    return as_bf16(c.access.grad(t.block, t.tensor));
  }
  std::vector<ParamSpec> params_;
  WeightRef norm_ref_, head_ref_;
};

// ---- cross-entropy on the logits upcast to fp32 (Hugging Face's loss) ----
// Forward: the bf16 logits upcast (temp, fp32, freed when the loss is made), fp32
// log-probabilities (saved), an fp32 total_weight (saved), the loss from them. Backward:
// dlogits in fp32 (log_softmax's and nll_loss's backward in one), the saves released, then
// cast to bf16 (temp, the head's dy) and the fp32 one freed.
class UpcastCrossEntropy final : public ModelLoss {
 public:
  explicit UpcastCrossEntropy(const TransformerShape& s) : s_(s) {}
  bool saves_input() const override { return false; }
  bool is_mean() const override { return true; }
  std::int64_t target_elems(int rows) const override { return id_floats(tokens(rows)); }
  void fill_target(Backend& backend, float* target, const DataSlice& at) const override {
    const std::vector<float> host = token_rows(at, s_.seq, s_.vocab, kTargetBase);
    backend.upload(target, host.data(), host.size());
  }

  void forward(Backend& be, SavedTensors& saved, const float* logits, const float* target, int rows, float scale,
               float* value) override {
    const i64 n = tokens(rows), v = s_.vocab;
    Held& h = held_[target];  // one per micro-batch in flight, by its target
    Buffer wide = be.alloc(Category::temp, floats(n * v));
    be.cast_from_bf16(wide.data(), as_bf16(logits), floats(n * v), 0.0f);
    h.logprobs = be.alloc(Category::activation, floats(n * v));
    h.total_weight = be.alloc(Category::activation, 1);
    be.log_softmax_forward(h.logprobs.data(), wide.data(), n, s_.vocab);
    be.fill(h.total_weight.data(), static_cast<float>(n), 1);
    be.nll_loss_forward(value, h.logprobs.data(), ids_of(target), n, s_.vocab, scale);
    saved.save(h.logprobs.data(), 4 * n * v);
    saved.save(target, 8 * n);
    saved.save(h.total_weight.data(), 4);
    wide.reset();
  }

  Buffer backward(Backend& be, SavedTensors& saved, const float* /*logits*/, const float* target, int rows,
                  float scale) override {
    const i64 n = tokens(rows), v = s_.vocab;
    auto it = held_.find(target);
    SHARDSCOPE_REQUIRE(it != held_.end(), std::string(kFamily) + ": cross-entropy backward without its forward");
    Held& h = it->second;
    Buffer d32 = be.alloc(Category::temp, floats(n * v));
    be.cross_entropy_backward(d32.data(), h.logprobs.data(), ids_of(target), n, s_.vocab, scale);
    saved.release(h.logprobs.data());
    saved.release(target);
    saved.release(h.total_weight.data());
    held_.erase(it);
    Buffer dlogits = bf16_tensor(be, Category::temp, n * v);
    be.cast_to_bf16(dlogits.bf16(), d32.data(), floats(n * v));
    d32.reset();
    return dlogits;
  }

 private:
  struct Held {
    Buffer logprobs;
    Buffer total_weight;
  };
  i64 tokens(int rows) const { return static_cast<i64>(rows) * s_.seq; }
  TransformerShape s_;
  std::map<const float*, Held> held_;
};

}  // namespace

std::unique_ptr<Model> make_llama_param_bf16(const TransformerShape& s) {
  std::vector<std::unique_ptr<Block>> blocks;
  blocks.push_back(make_bf16_embedding_block(s, {"model.embed_tokens.weight", ""}, kFamily));
  for (int i = 0; i < s.layers; ++i) blocks.push_back(std::make_unique<Bf16DecoderLayer>(s, i));
  blocks.push_back(std::make_unique<Bf16FinalNorm>(s));
  return std::make_unique<Model>(std::move(blocks), std::make_unique<UpcastCrossEntropy>(s));
}

}  // namespace shardscope
