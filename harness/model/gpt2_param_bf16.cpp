// GPT-2 under FSDP's MixedPrecision(param_dtype=bf16, reduce_dtype=fp32) (ModelConfig::
// param_bf16, --precision bf16 with zero2/zero3/hsdp): nanoGPT's module run in bf16, no
// autocast, on bf16 views of the strategy's gathered units (param_bf16_parts.hpp). What
// each op saves is torch 2.15's on the module cast to bf16 (bench/torch_saved.py
// --precision module): per block ln_1's input, bf16 mean and rstd and output, c_attn's
// output (flash: q, k, v are views of it), flash's output and fp32 log-sum-exp (math: fp32
// head-major q, k, v and probabilities, and its bf16 output), x_mid, ln_2's statistics and
// output, c_fc's and GELU's outputs, all bf16 but the fp32 ones named. Each Linear and norm
// names its tensors to BlockAccess's module hooks around its use, as gpt2.cpp's blocks do
// (DeepSpeed's stage 3 under bf16 gathers each on its own; no-ops for every other strategy).
// (harness/predict/param_bf16_forms.hpp has the account and the step's instants.)
#include <memory>
#include <string>
#include <vector>

#include "harness/model/models.hpp"
#include "harness/model/param_bf16_parts.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using namespace transformer;

const char* const kFamily = "gpt2";
constexpr int kEmbeddingBlock = 0;
constexpr int kWte = 0;

// ---- a transformer block: its tensors, in gpt2_block_params' order ----
using namespace gpt2_block;  // its tensors, in gpt2_block_params' order (models.hpp)

class Bf16Block final : public SequenceBlock {
 public:
  Bf16Block(const TransformerShape& s, int layer)
      : SequenceBlock(s, kFamily), name_("block " + std::to_string(layer)), params_(gpt2_block_params(s, layer)) {}
  // --checkpoint full|every:K: a wrapped block's saves are dropped (its input, bf16, saved
  // by the checkpoint) and it re-runs at the start of its backward; nothing outlives them.
  bool checkpointable() const override { return true; }
  // mlp.c_proj: its output's gradient arrives first (the residual saves nothing).
  std::vector<TensorRef> first_backward_module(int index) const override {
    return module_tensors(index, {kMlpProjW, kMlpProjB});
  }
  // --checkpoint attention: the core runs under torch's checkpoint (torch 2.15 on the bf16
  // module, bench/torch_saved.py --precision module --checkpoint attention): its inputs, q, k
  // and v (views of c_attn's bf16 output), are its checkpoint's save, its own saves are not
  // kept (flash's fp32 log-sum-exp; math's fp32 head-major q, k, v and probabilities), its
  // output stays c_proj's save; backward re-runs it on the saved qkv.
  void set_recompute_attention(bool on) override { recompute_attention_ = on; }
  std::string name() const override { return name_; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  std::int64_t input_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  std::int64_t output_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  std::int64_t input_bytes(int rows) const override { return 2 * input_elems(rows); }
  DType output_dtype() const override { return DType::bf16; }
  bool saves_input() const override { return true; }  // ln_1's input
  bool saves_output() const override { return false; }

  // What the forward keeps, bf16 but lse, q, k, v and probs (fp32).
  enum Held : int {
    kMean1, kRstd1, kLn1, kQkv, kLse, kOut, kXmid, kMean2, kRstd2, kLn2, kFc, kGelu, kQ, kK, kV, kProbs, kHeld
  };

  Buffer forward(const BlockCall& c, const float* x_in, bool /*input_requires_grad*/, bool output_saved,
                 BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = s_.ffn;
    const int hs = s_.hidden, fs = s_.ffn;
    const i64 b = 2 * n * h;  // bytes of one bf16 (N, h) activation
    const Bf16* x = as_bf16(x_in);
    auto p = [&](int t) { return bf16_param(c, t); };
    auto act16 = [&](i64 count) { return bf16_tensor(be, Category::activation, count); };
    auto module = [&](std::initializer_list<int> t) { return module_tensors(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    held.clear();
    held.resize(kHeld);

    // ln_1: its output, mean and rstd (bf16); saves its input and statistics.
    c.access.module_forward_begin(module({kLn1W, kLn1B}));
    held[kMean1] = act16(n);
    held[kRstd1] = act16(n);
    held[kLn1] = act16(n * h);
    bf16_layer_norm(be, held[kLn1].bf16(), held[kMean1].bf16(), held[kRstd1].bf16(), x, p(kLn1W), p(kLn1B), n, hs,
                    s_.norm_eps);
    c.saved.save(x, b);
    c.saved.save(held[kMean1].raw(), 2 * n);
    c.saved.save(held[kRstd1].raw(), 2 * n);
    c.saved.save(ln_weight_(), 0);
    c.access.module_forward_end(module({kLn1W, kLn1B}));

    // c_attn (addmm saves its input; the weight is a view of the unit)
    const bool flash = s_.attention == AttentionMode::flash;
    c.access.module_forward_begin(module({kAttnW, kAttnB}));
    Buffer qkv = bf16_tensor(be, flash || recompute_attention_ ? Category::activation : Category::temp, 3 * n * h);
    bf16_linear(be, qkv.bf16(), held[kLn1].bf16(), p(kAttnW), p(kAttnB), n, hs, 3 * hs);
    c.saved.save(held[kLn1].raw(), b);
    c.saved.save(attn_ref_(), 0);
    c.access.module_forward_end(module({kAttnW, kAttnB}));

    if (flash) {
      // Flash SDPA on bf16 q, k, v (views of qkv): saves them, its bf16 output and the fp32
      // log-sum-exp (B, heads, T).
      held[kQkv] = std::move(qkv);
      held[kLse] = be.alloc(Category::activation, floats(static_cast<i64>(c.rows) * s_.heads * s_.seq));
      held[kOut] = act16(n * h);
      const std::vector<float> qkv32 = widened(held[kQkv].bf16(), 3 * n * h);
      std::vector<float> out32(floats(n * h));
      be.flash_attention_forward(attention(c.rows, qkv32.data()), out32.data(), hs, held[kLse].data());
      round_into(held[kOut].bf16(), out32.data(), n * h);
      c.saved.save(held[kQkv].raw(), 3 * b);  // or the core's checkpoint's
      if (recompute_attention_) {
        held[kLse].reset();  // the core's own saves are not kept; y stays c_proj's
      } else {
        c.saved.save(held[kOut].raw(), b);
        c.saved.save(held[kLse].data(), 4 * static_cast<i64>(c.rows) * s_.heads * s_.seq);
      }
    } else if (recompute_attention_) {
      // The core under its checkpoint: the saved qkv, the fp32 head-major q, k, v (temp) and
      // probabilities made and freed, the bf16 output c_proj's save.
      held[kQkv] = std::move(qkv);
      c.saved.save(held[kQkv].raw(), 3 * b);
      Buffer qh[3];
      head_major_qkv(be, held[kQkv], c.rows, Category::temp, qh);
      const MathAttention m = math_attention(s_, c.rows);
      auto [probs, out32] = math_attention_forward(be, m, qh[0].data(), qh[1].data(), m.head_major(qh[2].data()), false);
      held[kOut] = act16(n * h);
      round_into(held[kOut].bf16(), out32.data(), n * h);
      out32.reset();
    } else {
      // Math SDPA on the CPU upcasts q, k, v to fp32 (head-major copies its bmms save), keeps
      // fp32 probabilities and hands back a bf16 output, token-major for c_proj.
      Buffer qh[3];
      head_major_qkv(be, qkv, c.rows, Category::activation, qh);
      for (int j : {kQ, kK, kV}) held[j] = std::move(qh[j - kQ]);
      qkv.reset();
      const MathAttention m = math_attention(s_, c.rows);
      auto [probs, out32] =
          math_attention_forward(be, m, held[kQ].data(), held[kK].data(), m.head_major(held[kV].data()));
      held[kProbs] = std::move(probs);
      held[kOut] = act16(n * h);
      round_into(held[kOut].bf16(), out32.data(), n * h);
      out32.reset();
      c.saved.save(held[kQ].data(), 2 * b);
      c.saved.save(held[kK].data(), 2 * b);
      c.saved.save(held[kProbs].data(), static_cast<i64>(held[kProbs].bytes()));
      c.saved.save(held[kV].data(), 2 * b);
    }

    // x_mid = x + c_proj(y), bf16: c_proj saves y.
    c.access.module_forward_begin(module({kProjW, kProjB}));
    held[kXmid] = act16(n * h);
    bf16_linear(be, held[kXmid].bf16(), held[kOut].bf16(), p(kProjW), p(kProjB), n, hs, hs, x);
    c.saved.save(held[kOut].raw(), b);
    c.saved.save(proj_ref_(), 0);
    c.access.module_forward_end(module({kProjW, kProjB}));

    // ln_2
    c.access.module_forward_begin(module({kLn2W, kLn2B}));
    held[kMean2] = act16(n);
    held[kRstd2] = act16(n);
    held[kLn2] = act16(n * h);
    bf16_layer_norm(be, held[kLn2].bf16(), held[kMean2].bf16(), held[kRstd2].bf16(), held[kXmid].bf16(), p(kLn2W),
                    p(kLn2B), n, hs, s_.norm_eps);
    c.saved.save(held[kXmid].raw(), b);
    c.saved.save(held[kMean2].raw(), 2 * n);
    c.saved.save(held[kRstd2].raw(), 2 * n);
    c.saved.save(ln2_weight_(), 0);
    c.access.module_forward_end(module({kLn2W, kLn2B}));

    // c_fc (GELU's input), GELU (mlp c_proj's input)
    c.access.module_forward_begin(module({kFcW, kFcB}));
    held[kFc] = act16(n * f);
    bf16_linear(be, held[kFc].bf16(), held[kLn2].bf16(), p(kFcW), p(kFcB), n, hs, fs);
    c.saved.save(held[kLn2].raw(), b);
    c.saved.save(fc_ref_(), 0);
    c.access.module_forward_end(module({kFcW, kFcB}));
    held[kGelu] = act16(n * f);
    {
      std::vector<float> g = widened(held[kFc].bf16(), n * f);
      be.gelu_tanh_forward(g.data(), g.data(), floats(n * f));
      round_into(held[kGelu].bf16(), g.data(), n * f);
    }
    c.saved.save(held[kFc].raw(), 2 * n * f);

    // out = x_mid + mlp.c_proj(gelu): (N, h) bf16, activation when the next block saves it.
    c.access.module_forward_begin(module({kMlpProjW, kMlpProjB}));
    Buffer out = bf16_tensor(be, output_saved ? Category::activation : Category::temp, n * h);
    bf16_linear(be, out.bf16(), held[kGelu].bf16(), p(kMlpProjW), p(kMlpProjB), n, fs, hs, held[kXmid].bf16());
    c.saved.save(held[kGelu].raw(), 2 * n * f);
    c.saved.save(mlp_ref_(), 0);
    c.access.module_forward_end(module({kMlpProjW, kMlpProjB}));
    return out;
  }

  Buffer backward(const BlockCall& c, const float* x_in, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = s_.ffn;
    const int hs = s_.hidden, fs = s_.ffn;
    const Bf16* x = as_bf16(x_in);
    auto p = [&](int t) { return bf16_param(c, t); };
    auto g = [&](int t) { return bf16_grad(c, t); };
    auto drop = [&](int j) {
      c.saved.release(tape.held[j].raw());
      tape.held[j].reset();
    };
    auto tmp16 = [&](i64 count) { return bf16_tensor(be, Category::temp, count); };
    auto module = [&](std::initializer_list<int> t) { return module_tensors(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    out.reset();

    // mlp c_proj: d gelu (N, f) bf16; GELU's backward in place; c_fc: d ln_2 (N, h).
    c.access.module_backward_begin(module({kMlpProjW, kMlpProjB}));
    Buffer dg = tmp16(n * f);
    bf16_linear_backward(be, dg.bf16(), g(kMlpProjW), g(kMlpProjB), dy.bf16(), held[kGelu].bf16(), p(kMlpProjW), n,
                         fs, hs, beta);
    c.saved.release(mlp_ref_());
    drop(kGelu);
    c.access.module_backward_end(module({kMlpProjW, kMlpProjB}), true);
    {
      std::vector<float> d = widened(dg.bf16(), n * f);
      const std::vector<float> u = widened(held[kFc].bf16(), n * f);
      be.gelu_tanh_backward(d.data(), d.data(), u.data(), floats(n * f));
      round_into(dg.bf16(), d.data(), n * f);
    }
    drop(kFc);
    c.access.module_backward_begin(module({kFcW, kFcB}));
    Buffer dln = tmp16(n * h);
    bf16_linear_backward(be, dln.bf16(), g(kFcW), g(kFcB), dg.bf16(), held[kLn2].bf16(), p(kFcW), n, hs, fs, beta);
    dg.reset();
    c.saved.release(fc_ref_());
    drop(kLn2);
    c.access.module_backward_end(module({kFcW, kFcB}), true);

    // ln_2, then the residual: dx_mid = ln_2's dx + dy
    c.access.module_backward_begin(module({kLn2W, kLn2B}));
    Buffer dmid = tmp16(n * h);
    bf16_layer_norm_backward(be, dmid.bf16(), g(kLn2W), g(kLn2B), dln.bf16(), held[kXmid].bf16(), held[kMean2].bf16(),
                             held[kRstd2].bf16(), p(kLn2W), n, hs, beta);
    dln.reset();
    c.saved.release(ln2_weight_());
    drop(kXmid);
    drop(kMean2);
    drop(kRstd2);
    c.access.module_backward_end(module({kLn2W, kLn2B}), true);
    add_bf16(dmid, dy, n * h);

    // attention's c_proj: d y (N, h)
    c.access.module_backward_begin(module({kProjW, kProjB}));
    Buffer dattn = tmp16(n * h);
    bf16_linear_backward(be, dattn.bf16(), g(kProjW), g(kProjB), dmid.bf16(), held[kOut].bf16(), p(kProjW), n, hs, hs,
                         beta);
    c.saved.release(proj_ref_());
    c.saved.release(held[kOut].raw());  // c_proj's save of y (flash's own save stays)
    c.access.module_backward_end(module({kProjW, kProjB}), true);

    // attention: dqkv (N, 3h) bf16
    Buffer dqkv;
    if (s_.attention == AttentionMode::flash) {
      if (recompute_attention_) {
        // y, which only c_proj saved, is freed; the core's checkpoint re-runs flash on the
        // saved qkv: a new fp32 log-sum-exp and bf16 output (activation, saved).
        held[kOut].reset();
        held[kLse] = be.alloc(Category::activation, floats(static_cast<i64>(c.rows) * s_.heads * s_.seq));
        held[kOut] = bf16_tensor(be, Category::activation, n * h);
        const std::vector<float> qkv32 = widened(held[kQkv].bf16(), 3 * n * h);
        std::vector<float> out32(floats(n * h));
        be.flash_attention_forward(attention(c.rows, qkv32.data()), out32.data(), hs, held[kLse].data());
        round_into(held[kOut].bf16(), out32.data(), n * h);
        c.saved.save(held[kOut].raw(), b_bytes(c.rows));
        c.saved.save(held[kLse].data(), static_cast<i64>(held[kLse].bytes()));
      }
      dqkv = tmp16(3 * n * h);
      const std::vector<float> qkv32 = widened(held[kQkv].bf16(), 3 * n * h), o32 = widened(held[kOut].bf16(), n * h),
                               do32 = widened(dattn.bf16(), n * h);
      std::vector<float> d32(floats(3 * n * h));
      be.flash_attention_backward(attention(c.rows, qkv32.data()), o32.data(), hs, do32.data(), held[kLse].data(),
                                  d32.data(), d32.data() + h, d32.data() + 2 * h);
      round_into(dqkv.bf16(), d32.data(), 3 * n * h);
      dattn.reset();
      for (int j : {kQkv, kOut}) drop(j);
      c.saved.release(held[kLse].data());
      held[kLse].reset();
    } else {
      held[kOut].reset();
      // The bf16 output's gradient upcast to fp32 (token-major), as the math path's own
      // conversion back to bf16 takes it in backward.
      Buffer dout = be.alloc(Category::temp, floats(n * h));
      be.cast_from_bf16(dout.data(), dattn.bf16(), floats(n * h), 0.0f);
      dattn.reset();
      const MathAttention m = math_attention(s_, c.rows);
      if (recompute_attention_) {
        // The core's checkpoint re-runs it on the saved qkv: the fp32 head-major q, k, v
        // (activation, saved by its bmms); math_attention_backward makes the probabilities
        // again (torch's early stop: the product with v is not re-run).
        Buffer qh[3];
        head_major_qkv(be, held[kQkv], c.rows, Category::activation, qh);
        for (int j : {kQ, kK, kV}) {
          held[j] = std::move(qh[j - kQ]);
          c.saved.save(held[j].data(), static_cast<i64>(held[j].bytes()));
        }
      }
      HeadGrads hg = math_attention_backward(be, c.saved, m, dout, held[kQ], held[kK], held[kProbs],
                                             m.head_major(held[kV].data()), held[kV]);
      if (recompute_attention_) drop(kQkv);  // the checkpoint's save of its inputs
      dqkv = tmp16(3 * n * h);
      std::vector<float> tok(floats(n * h));
      int at = 0;
      for (const Buffer* d : {&hg.dq, &hg.dk, &hg.dv}) {
        be.permute_heads(tok.data(), d->data(), hs, c.rows, s_.seq, s_.heads, s_.head_dim, false);
        for (i64 i = 0; i < n; ++i) round_into(dqkv.bf16() + i * 3 * h + at * h, tok.data() + i * h, h);
        ++at;
      }
    }

    // c_attn: d ln_1
    c.access.module_backward_begin(module({kAttnW, kAttnB}));
    dln = tmp16(n * h);
    bf16_linear_backward(be, dln.bf16(), g(kAttnW), g(kAttnB), dqkv.bf16(), held[kLn1].bf16(), p(kAttnW), n, hs,
                         3 * hs, beta);
    dqkv.reset();
    c.saved.release(attn_ref_());
    drop(kLn1);
    c.access.module_backward_end(module({kAttnW, kAttnB}), true);

    // ln_1, then the residual: dx = ln_1's dx + dx_mid
    c.access.module_backward_begin(module({kLn1W, kLn1B}));
    Buffer dx = tmp16(n * h);
    bf16_layer_norm_backward(be, dx.bf16(), g(kLn1W), g(kLn1B), dln.bf16(), x, held[kMean1].bf16(),
                             held[kRstd1].bf16(), p(kLn1W), n, hs, beta);
    dln.reset();
    c.saved.release(ln_weight_());
    c.saved.release(x);
    drop(kMean1);
    drop(kRstd1);
    c.access.module_backward_end(module({kLn1W, kLn1B}), true);
    add_bf16(dx, dmid, n * h);
    return finish_backward(held, std::move(dx), needs_dx);
  }

  Buffer backward_input(const BlockCall&, const float*, Buffer&, Buffer, bool, bool, BlockTape&) override {
    throw_unbuilt_param_bf16_split(kFamily);
  }
  void backward_weight(const BlockCall&, const float*, float, BlockTape&) override {
    throw_unbuilt_param_bf16_split(kFamily);
  }

 private:
  bool recompute_attention_ = false;  // --checkpoint attention
  i64 b_bytes(int rows) const { return 2 * tokens(rows) * s_.hidden; }
  // The fp32 head-major copies of q, k and v (B, H, T, d) of the bf16 qkv (N, 3h), category c.
  void head_major_qkv(Backend& be, const Buffer& qkv, int rows, Category c, Buffer (&out)[3]) const {
    const i64 n = tokens(rows), h = s_.hidden;
    const std::vector<float> qkv32 = widened(qkv.bf16(), 3 * n * h);
    for (int j = 0; j < 3; ++j) {
      out[j] = be.alloc(c, floats(n * h));
      be.permute_heads(out[j].data(), qkv32.data() + j * h, 3 * s_.hidden, rows, s_.seq, s_.heads, s_.head_dim, true);
    }
  }
  AttentionArgs attention(int rows, const float* qkv) const {
    return attention_args(s_, rows, qkv, qkv + s_.hidden, qkv + 2 * s_.hidden, 3 * s_.hidden, 3 * s_.hidden);
  }
  // dst += src (bf16, count), src freed: a residual's gradient.
  static void add_bf16(Buffer& dst, Buffer& src, i64 count) {
    for (i64 i = 0; i < count; ++i) dst.bf16()[i] = to_bf16(from_bf16(dst.bf16()[i]) + from_bf16(src.bf16()[i]));
    src.reset();
  }

  std::string name_;
  std::vector<ParamSpec> params_;
  WeightRef ln_weight_, ln2_weight_, attn_ref_, proj_ref_, fc_ref_, mlp_ref_;
};

}  // namespace

std::unique_ptr<Model> make_gpt2_param_bf16(const TransformerShape& s) {
  std::vector<std::unique_ptr<Block>> blocks;
  blocks.push_back(make_bf16_embedding_block(s, {"transformer.wte.weight", "transformer.wpe.weight"}, kFamily));
  for (int i = 0; i < s.layers; ++i) blocks.push_back(std::make_unique<Bf16Block>(s, i));
  blocks.push_back(std::make_unique<Bf16FinalLayerNorm>(
      s, kFamily,
      std::vector<ParamSpec>{{"transformer.ln_f.weight", {s.hidden}, 0.0f, 1.0f}, {"transformer.ln_f.bias", {s.hidden}}},
      TensorRef{kEmbeddingBlock, kWte}));
  return std::make_unique<Model>(std::move(blocks), make_bf16_cross_entropy(s, kFamily));
}

}  // namespace shardscope
