// GPT-2 under the torch engine's --precision bf16: nanoGPT's module run as
// torch.autocast("cpu", dtype=torch.bfloat16) runs it (harness/predict/autocast_forms.hpp
// has the account, docs/formulas.md "bf16: what autocast saves"). Parameters, their
// gradients and the embeddings stay fp32. Each Linear runs its GEMM in bf16: on a bf16 cast
// of its input (made at the call) and of its weight (made once per forward, as autocast's
// cast cache makes it, and held, saved, until that Linear's backward), its output bf16.
// LayerNorm, the residual stream (fp32 + bf16 is fp32), the math attention's softmax
// (torch upcasts q, k, v to fp32 on the CPU) and the loss run in fp32; flash attention
// takes and saves bf16 q, k, v and output with an fp32 log-sum-exp.
//
// Every save below is torch's (bench/torch_saved.py --precision bf16 --itemize lists
// them), in torch's dtype: saved.after_forward equals torch's figure byte for byte. The
// bf16 arithmetic and buffers are autocast_parts.hpp's. The weights' casts are allocated
// as param_cast (kCastCategory); they are saved tensors all the same, and the saved-tensor
// instrument counts them.
//
// Under tensor parallelism (Megatron's split, as gpt2.cpp's fp32 blocks) each rank casts its
// own shards: c_attn and c_fc column-parallel (their GEMMs on the whole input's cast, their
// outputs the rank's heads' q, k, v and f/T features), attn.c_proj and mlp.c_proj
// row-parallel: the partial product bf16, without the bias, all-reduced in bf16 (2 B an
// element), then the residual and the bias added in fp32. Each column-parallel Linear's
// input gradient is the fp32 gradient at the norm's output (Megatron's f sits before
// autocast's cast, whose backward hands f an fp32 gradient): all-reduced in fp32.
#include <memory>
#include <string>
#include <vector>

#include "harness/model/autocast_parts.hpp"
#include "harness/model/models.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using namespace transformer;

const char* const kFamily = "gpt2";
constexpr int kEmbeddingBlock = 0;
constexpr int kWte = 0;

// ---- a transformer block: its tensors, in gpt2_block_params' order ----
using namespace gpt2_block;  // its tensors, in gpt2_block_params' order (models.hpp)

class AutocastBlock final : public SequenceBlock {
 public:
  AutocastBlock(const TransformerShape& s, int layer, const TensorParallel& tp)
      : SequenceBlock(s, kFamily),
        name_("block " + std::to_string(layer)),
        params_(gpt2_block_params(s, layer, tp)),
        tp_(tp),
        hl_(s.hidden / tp.size),
        fl_(s.ffn / tp.size),
        as_(attention_shape(s, tp.size)) {}
  bool checkpointable() const override { return true; }
  void use_step_casts(std::shared_ptr<StepCasts> casts) override { step_casts_ = std::move(casts); }
  // --checkpoint attention: the core's own save (flash's lse, math's probabilities) is not
  // kept; its recompute in backward runs in bf16 as torch's non-reentrant checkpoint of
  // the core does (it restores the autocast state).
  void set_recompute_attention(bool on) override { recompute_attention_ = on; }
  // Wrapped by --checkpoint: the weights' casts outlive the block's dropped saves in
  // autocast's cast cache (a leaf's cast is cached) until the region ends; the rest goes.
  void drop_checkpointed(BlockTape& tape) override { keep_only(tape.held, {kWAttn, kWProj, kWFc, kWMlp}); }
  std::string name() const override { return name_; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  std::int64_t input_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  std::int64_t output_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  bool saves_input() const override { return true; }  // ln_1's input
  bool saves_output() const override { return false; }

  // What the forward keeps: fp32 statistics and x_mid; bf16 the Linears' inputs, qkv
  // (flash), the attention's output, c_fc's and GELU's outputs; bf16 weight casts; fp32
  // q, k, v (head-major) and probabilities with math.
  enum Held : int {
    kMean1, kRstd1, kLn1, kWAttn, kQkv, kLse, kOut, kWProj, kXmid, kMean2, kRstd2, kLn2, kWFc, kFc, kGelu, kWMlp,
    kQ, kK, kV, kProbs, kHeld
  };

  Buffer forward(const BlockCall& c, const float* x, bool /*input_requires_grad*/, bool output_saved,
                 BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = fl_, hl = hl_;
    const int hs = s_.hidden, fs = fl_;
    const i64 a = 4 * n * h;    // bytes of one fp32 (N, h) activation
    const i64 al = 4 * n * hl;  // of the attention's (N, h/T) on this rank
    const bool split = tp_.size > 1;
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto act = [&](i64 count) { return be.alloc(Category::activation, floats(count)); };
    // A weight's bf16 cast: the GEMM saves it (2 bytes an element).
    auto weight_cast = [&](int t, i64 elems) {
      Buffer w = weight_cast_bf16(be, step_casts_.get(), param(t), elems);
      c.saved.save(w.data(), 2 * elems);
      return w;
    };
    std::vector<Buffer>& held = tape.held;
    held.clear();
    held.resize(kHeld);

    // ln_1 (fp32): saves its input, mean and rstd; its output is cast for c_attn.
    held[kMean1] = act(n);
    held[kRstd1] = act(n);
    Buffer ln = be.alloc(Category::temp, floats(n * h));
    be.layer_norm_forward(ln.data(), held[kMean1].data(), held[kRstd1].data(), x, param(kLn1W), param(kLn1B),
                          static_cast<int>(n), hs, s_.norm_eps);
    c.saved.save(x, a);
    c.saved.save(held[kMean1].data(), 4 * n);
    c.saved.save(held[kRstd1].data(), 4 * n);
    c.saved.save(ln_weight_(), 0);
    held[kLn1] = cast_bf16(be, Category::activation, ln.data(), n * h);
    ln.reset();

    // c_attn (addmm saves mat1, its bf16 input, and mat2, the weight's cast)
    held[kWAttn] = weight_cast(kAttnW, 3 * hl * h);
    Buffer qkv = autocast_linear(be, held[kLn1], held[kWAttn], param(kAttnB), n, hs, 3 * hl_);
    c.saved.save(held[kLn1].data(), a / 2);

    if (s_.attention == AttentionMode::flash) {
      // Flash SDPA on bf16 q, k, v (views of the one qkv storage): saves them, its bf16
      // output and the fp32 log-sum-exp (B, heads, T). --checkpoint attention: the
      // log-sum-exp is freed, not saved (the checkpoint keeps its inputs, qkv).
      held[kQkv] = cast_bf16(be, Category::activation, qkv.data(), 3 * n * hl);
      held[kLse] = act(static_cast<i64>(c.rows) * as_.heads * s_.seq);
      Buffer out = be.alloc(Category::temp, floats(n * hl));
      be.flash_attention_forward(attention(c.rows, qkv.data()), out.data(), hl_, held[kLse].data());
      qkv.reset();
      if (recompute_attention_) held[kLse].reset();
      held[kOut] = cast_bf16(be, Category::activation, out.data(), n * hl);
      out.reset();
      c.saved.save(held[kQkv].data(), 3 * al / 2);
      if (!recompute_attention_) c.saved.save(held[kOut].data(), al / 2);  // else c_proj's alone
      if (held[kLse]) c.saved.save(held[kLse].data(), 4 * static_cast<i64>(c.rows) * as_.heads * s_.seq);
    } else {
      // Math SDPA on the CPU upcasts q, k, v to fp32 (head-major copies, saved by its
      // bmms: always copies), keeps the fp32 probabilities (not under --checkpoint
      // attention: the backward makes them again) and hands back its output in bf16,
      // copied token-major for c_proj.
      for (int j : {kQ, kK, kV}) {
        held[j] = act(n * hl);
        be.permute_heads(held[j].data(), qkv.data() + (j == kQ ? 0 : j == kK ? hl : 2 * hl), 3 * hl_, c.rows, s_.seq,
                         as_.heads, s_.head_dim, true);
      }
      qkv.reset();
      const MathAttention m = math_attention(as_, c.rows);
      auto [probs, out] = math_attention_forward(be, m, held[kQ].data(), held[kK].data(), m.head_major(held[kV].data()),
                                                 !recompute_attention_);
      held[kProbs] = std::move(probs);
      held[kOut] = cast_bf16(be, Category::activation, out.data(), n * hl);
      out.reset();
      c.saved.save(held[kQ].data(), al);
      c.saved.save(held[kK].data(), al);
      if (held[kProbs]) c.saved.save(held[kProbs].data(), static_cast<i64>(held[kProbs].bytes()));
      c.saved.save(held[kV].data(), al);
    }

    // x_mid = x + c_proj(y) (fp32 + bf16): c_proj saves y and its weight's cast. Row-parallel
    // under tp: the bf16 partial product all-reduced, then the residual and the bias added.
    held[kWProj] = weight_cast(kProjW, h * hl);
    Buffer r = autocast_linear(be, held[kOut], held[kWProj], split ? nullptr : param(kProjB), n, hl_, hs);
    if (split) {
      Buffer sum = reduce_row_parallel(c, r, n * h, kFamily);
      held[kXmid] = act(n * h);
      add_row_parallel_output(be, held[kXmid].data(), x, sum, param(kProjB), n, hs);
    } else {
      held[kXmid] = act(n * h);
      be.copy(held[kXmid].data(), x, floats(n * h));
      be.add(held[kXmid].data(), r.data(), floats(n * h));
      r.reset();
    }
    c.saved.save(held[kOut].data(), al / 2);

    // ln_2 (fp32), its output cast for c_fc
    held[kMean2] = act(n);
    held[kRstd2] = act(n);
    ln = be.alloc(Category::temp, floats(n * h));
    be.layer_norm_forward(ln.data(), held[kMean2].data(), held[kRstd2].data(), held[kXmid].data(), param(kLn2W),
                          param(kLn2B), static_cast<int>(n), hs, s_.norm_eps);
    c.saved.save(held[kXmid].data(), a);
    c.saved.save(held[kMean2].data(), 4 * n);
    c.saved.save(held[kRstd2].data(), 4 * n);
    c.saved.save(ln2_weight_(), 0);
    held[kLn2] = cast_bf16(be, Category::activation, ln.data(), n * h);
    ln.reset();

    // c_fc (bf16 out, GELU's input), GELU (bf16 out, mlp c_proj's input)
    held[kWFc] = weight_cast(kFcW, f * h);
    Buffer fc = autocast_linear(be, held[kLn2], held[kWFc], param(kFcB), n, hs, fs);
    c.saved.save(held[kLn2].data(), a / 2);
    held[kFc] = cast_bf16(be, Category::activation, fc.data(), n * f);
    be.gelu_tanh_forward(fc.data(), fc.data(), floats(n * f));
    held[kGelu] = cast_bf16(be, Category::activation, fc.data(), n * f);
    fc.reset();
    c.saved.save(held[kFc].data(), 2 * n * f);

    // out = x_mid + mlp.c_proj(gelu): (N, h) fp32, activation when the next block saves it
    // (row-parallel under tp, as c_proj).
    held[kWMlp] = weight_cast(kMlpProjW, h * f);
    r = autocast_linear(be, held[kGelu], held[kWMlp], split ? nullptr : param(kMlpProjB), n, fs, hs);
    const Category out_category = output_saved ? Category::activation : Category::temp;
    Buffer out;
    if (split) {
      Buffer sum = reduce_row_parallel(c, r, n * h, kFamily);
      out = be.alloc(out_category, floats(n * h));
      add_row_parallel_output(be, out.data(), held[kXmid].data(), sum, param(kMlpProjB), n, hs);
    } else {
      out = be.alloc(out_category, floats(n * h));
      be.copy(out.data(), held[kXmid].data(), floats(n * h));
      be.add(out.data(), r.data(), floats(n * h));
      r.reset();
    }
    c.saved.save(held[kGelu].data(), 2 * n * f);
    return out;
  }

  Buffer backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = fl_, hl = hl_;
    const int hs = s_.hidden, fs = fl_;
    const bool split = tp_.size > 1;
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto grad = [&](int t) { return c.access.grad(c.index, t); };
    // A row-parallel bias is added in fp32 after the sum under tp: its gradient is the
    // column sums of the fp32 output gradient (with one rank, of its bf16 rounding).
    auto row_bias_grad = [&](int t, const Buffer& dout) {
      if (split) be.bias_grad(grad(t), dout.data(), static_cast<int>(n), hs, beta);
    };
    auto drop = [&](int j) { drop_saved(c.saved, tape.held[j]); };
    // The gradient at a bf16 tensor is bf16: an fp32 copy of dy's values rounded.
    auto rounded = [&](const Buffer& g, i64 count) { return rounded_copy(be, g.data(), count); };
    std::vector<Buffer>& held = tape.held;
    out.reset();

    // mlp c_proj, GELU (in fp32 on the widened bf16 input, its gradient rounded), c_fc
    Buffer dr = rounded(dy, n * h);
    Buffer dg = autocast_linear_backward(be, dr.data(), held[kGelu], held[kWMlp], grad(kMlpProjW),
                                         split ? nullptr : grad(kMlpProjB), n, fs, hs, beta);
    dr.reset();
    row_bias_grad(kMlpProjB, dy);
    drop(kWMlp);
    drop(kGelu);
    {
      Buffer fc = widen(be, held[kFc], n * f);
      be.gelu_tanh_backward(dg.data(), dg.data(), fc.data(), floats(n * f));
    }
    autocast_round(dg.data(), n * f);
    drop(kFc);
    Buffer dln = autocast_linear_backward(be, dg.data(), held[kLn2], held[kWFc], grad(kFcW), grad(kFcB), n, hs, fs, beta);
    dg.reset();
    column_parallel_input_grad(c, tp_, dln, kFamily);
    drop(kWFc);
    drop(kLn2);

    // ln_2, then the residual: dx_mid = ln_2's dx + dy
    Buffer dmid = be.alloc(Category::temp, floats(n * h));
    be.layer_norm_backward(dmid.data(), grad(kLn2W), grad(kLn2B), dln.data(), held[kXmid].data(),
                           held[kMean2].data(), held[kRstd2].data(), param(kLn2W), static_cast<int>(n), hs, beta);
    dln.reset();
    c.saved.release(ln2_weight_());
    drop(kXmid);
    drop(kMean2);
    drop(kRstd2);
    add_residual(be, dmid, dy, n * h);

    // attention's c_proj
    dr = rounded(dmid, n * h);
    Buffer dattn = autocast_linear_backward(be, dr.data(), held[kOut], held[kWProj], grad(kProjW),
                                            split ? nullptr : grad(kProjB), n, hl_, hs, beta);
    dr.reset();
    row_bias_grad(kProjB, dmid);
    drop(kWProj);
    c.saved.release(held[kOut].data());  // c_proj's save of y

    // attention: dqkv (N, 3h), bf16 values
    Buffer dqkv = be.alloc(Category::temp, floats(3 * n * hl));
    if (s_.attention == AttentionMode::flash) {
      Buffer qkv = widen(be, held[kQkv], 3 * n * hl);
      Buffer o;
      Buffer rerun;  // --checkpoint attention: the re-run's bf16 output (saved)
      if (recompute_attention_) {
        // y, which only c_proj saved, is freed; the core's checkpoint re-runs flash in bf16
        // on the saved qkv: a new log-sum-exp and bf16 output (activation, saved), the
        // output's fp32 values rounded as its widened copy.
        held[kOut].reset();
        held[kLse] = be.alloc(Category::activation, floats(static_cast<i64>(c.rows) * as_.heads * s_.seq));
        o = be.alloc(Category::temp, floats(n * hl));
        be.flash_attention_forward(attention(c.rows, qkv.data()), o.data(), hl_, held[kLse].data());
        rerun = cast_bf16(be, Category::activation, o.data(), n * hl);
        autocast_round(o.data(), n * hl);
        c.saved.save(held[kLse].data(), static_cast<i64>(held[kLse].bytes()));
        c.saved.save(rerun.data(), 2 * n * hl);
      } else {
        o = widen(be, held[kOut], n * hl);
      }
      be.flash_attention_backward(attention(c.rows, qkv.data()), o.data(), hl_, dattn.data(), held[kLse].data(),
                                  dqkv.data(), dqkv.data() + hl, dqkv.data() + 2 * hl);
      dattn.reset();
      for (int j : {kQkv, kOut, kLse})
        if (held[j]) drop(j);
      if (rerun) drop_saved(c.saved, rerun);
    } else {
      held[kOut].reset();
      const MathAttention m = math_attention(as_, c.rows);
      HeadGrads g = math_attention_backward(be, c.saved, m, dattn, held[kQ], held[kK], held[kProbs],
                                            m.head_major(held[kV].data()), held[kV]);
      int at = 0;
      for (const Buffer* d : {&g.dq, &g.dk, &g.dv})
        be.permute_heads(dqkv.data() + hl * at++, d->data(), 3 * hl_, c.rows, s_.seq, as_.heads, s_.head_dim, false);
    }
    autocast_round(dqkv.data(), 3 * n * hl);

    // c_attn
    dln = autocast_linear_backward(be, dqkv.data(), held[kLn1], held[kWAttn], grad(kAttnW), grad(kAttnB), n, hs,
                                   3 * hl_, beta);
    dqkv.reset();
    column_parallel_input_grad(c, tp_, dln, kFamily);
    drop(kWAttn);
    drop(kLn1);

    // ln_1, then the residual: dx = ln_1's dx + dx_mid
    Buffer dx = be.alloc(Category::temp, floats(n * h));
    be.layer_norm_backward(dx.data(), grad(kLn1W), grad(kLn1B), dln.data(), x, held[kMean1].data(),
                           held[kRstd1].data(), param(kLn1W), static_cast<int>(n), hs, beta);
    dln.reset();
    c.saved.release(ln_weight_());
    c.saved.release(x);
    drop(kMean1);
    drop(kRstd1);
    add_residual(be, dx, dmid, n * h);
    return finish_backward(held, std::move(dx), needs_dx);
  }

  Buffer backward_input(const BlockCall&, const float*, Buffer&, Buffer, bool, bool, BlockTape&) override {
    throw_unbuilt_autocast_split(kFamily);
  }
  void backward_weight(const BlockCall&, const float*, float, BlockTape&) override {
    throw_unbuilt_autocast_split(kFamily);
  }

 private:
  // The attention's shape on this rank: its H/T heads.
  static TransformerShape attention_shape(TransformerShape s, int tp) {
    s.heads /= tp;
    s.kv_heads /= tp;
    return s;
  }
  AttentionArgs attention(int rows, const float* qkv) const {
    return attention_args(as_, rows, qkv, qkv + hl_, qkv + 2 * hl_, 3 * hl_, 3 * hl_);
  }

  std::string name_;
  std::vector<ParamSpec> params_;
  TensorParallel tp_;
  int hl_;               // the attention's width on this rank: h/T
  int fl_;               // the MLP's: f/T
  TransformerShape as_;  // the attention's shape on this rank (H/T heads)
  WeightRef ln_weight_, ln2_weight_;
  bool recompute_attention_ = false;  // --checkpoint attention
  std::shared_ptr<StepCasts> step_casts_;  // --autocast-region step (null: per micro-batch)
};

}  // namespace

std::unique_ptr<Model> make_gpt2_autocast(const TransformerShape& s, const TensorParallel& tp) {
  std::vector<std::unique_ptr<Block>> blocks;
  blocks.push_back(make_embedding_block(s, {"transformer.wte.weight", "transformer.wpe.weight"}, kFamily, tp));
  for (int i = 0; i < s.layers; ++i) blocks.push_back(std::make_unique<AutocastBlock>(s, i, tp));
  blocks.push_back(std::make_unique<AutocastFinal>(
      s, kFamily, AutocastFinal::Norm::layer,
      std::vector<ParamSpec>{{"transformer.ln_f.weight", {s.hidden}, 0.0f, 1.0f}, {"transformer.ln_f.bias", {s.hidden}}},
      TensorRef{kEmbeddingBlock, kWte}, tp));
  return std::make_unique<Model>(std::move(blocks), make_cross_entropy(s, kFamily, tp));
}

}  // namespace shardscope
