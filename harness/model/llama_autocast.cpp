// Llama under the torch engine's --precision bf16: our Llama (llama.cpp: a fused RMSNorm,
// RoPE in the kernel) run as torch.autocast("cpu", dtype=torch.bfloat16) runs its ops
// (harness/predict/autocast_forms.hpp has the account). Parameters, gradients and the
// embedding stay fp32. Each Linear's GEMM runs in bf16 on a bf16 cast of its input, made
// at each call (q, k and v each cast the norm's output anew, and gate and up, as autocast
// caches only parameters), and of its weight (once per forward, saved until that Linear's
// backward); its output is bf16. The RMSNorms, the residual stream, the math attention (on
// fp32 q, k and v expanded, as torch's CPU math SDPA upcasts) and the loss run in fp32;
// RoPE rotates q and k in fp32 and flash attention takes and saves them in bf16 (Hugging
// Face's rotated q and k are fp32 and SDPA's autocast casts them: the same bytes), with v,
// its bf16 output and the fp32 log-sum-exp; SiLU and the product are bf16.
//
// Every save below is what torch's autocast saves for the same op (bench/hf_llama_saved.py
// --precision bf16 --itemize lists Hugging Face's: ours is that less the composite norm's
// x·rstd and the rotary tables, as in fp32). The bf16 arithmetic and buffers are
// autocast_parts.hpp's; the weights' casts are allocated as param_cast (kCastCategory).
//
// Under tensor parallelism (llama.cpp's split) each rank casts its own shards: q_proj,
// k_proj, v_proj, gate_proj and up_proj column-parallel (each on its own cast of the whole
// norm output), o_proj and down_proj row-parallel: the bf16 partial product, without
// o_proj's bias, all-reduced in bf16 (2 B an element), then the residual and the bias
// added in fp32. The fp32 gradients at the norms' outputs (q, k and v's sum; gate and up's)
// are all-reduced in fp32, as Megatron's f sits before autocast's casts. Fewer kv heads
// than tp are replicated as in fp32 (llama.cpp): a copy's k_proj and v_proj gradients are
// made into its head's slot of every kv head's (fp32, temp), all-reduced over tp and
// written onto the gradients.
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "harness/model/autocast_parts.hpp"
#include "harness/model/llama_heads.hpp"
#include "harness/model/models.hpp"

namespace shardscope {
namespace {

using namespace transformer;

const char* const kFamily = "llama";
constexpr int kEmbeddingBlock = 0;
constexpr int kEmbedTokens = 0;

class AutocastLayer final : public SequenceBlock {
 public:
  AutocastLayer(const TransformerShape& s, int layer, const TensorParallel& tp)
      : SequenceBlock(s, kFamily),
        name_("block " + std::to_string(layer)),
        t_(llama_layer_tensors(s, layer, tp)),
        tp_(tp),
        fl_(s.ffn / tp.size),
        as_(attention_shape(s, tp.size)),
        kv_replicas_(kv_replicas(s, tp.size)),
        kv_head_(tp.rank / kv_replicas_) {}
  bool checkpointable() const override { return true; }
  // --checkpoint attention: the core's own save (flash's lse, math's probabilities) is not
  // kept; its recompute in backward runs in bf16 as torch's non-reentrant checkpoint of
  // the core does (it restores the autocast state).
  void set_recompute_attention(bool on) override { recompute_attention_ = on; }
  // Wrapped by --checkpoint: the seven weights' casts outlive the layer's dropped saves in
  // autocast's cast cache until the region ends; the rest goes.
  void drop_checkpointed(BlockTape& tape) override { keep_only(tape.held, {kWq, kWk, kWv, kWo, kWg, kWu, kWd}); }
  void use_step_casts(std::shared_ptr<StepCasts> casts) override { step_casts_ = std::move(casts); }

  std::string name() const override { return name_; }
  const std::vector<ParamSpec>& params() const override { return t_.params; }
  std::int64_t input_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  std::int64_t output_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  bool saves_input() const override { return true; }  // the input RMSNorm's input
  bool saves_output() const override { return false; }

  // bf16: the five input casts (yq, yk, yv, yg, yu), q, k, v and out with flash, out with
  // math, gate, SiLU, up, the product, the seven weight casts; fp32: the statistics,
  // x_mid, the lse; with math q and k, v expanded, head-major, and the probabilities.
  enum Held : int {
    kRstd1, kYq, kYk, kYv, kWq, kWk, kWv, kQ, kK, kV, kOut, kAttn, kWo, kXmid, kRstd2, kYg, kWg, kGate, kSilu, kYu,
    kWu, kUp, kProd, kWd, kHeld
  };

  Buffer forward(const BlockCall& c, const float* x, bool /*input_requires_grad*/, bool output_saved,
                 BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = fl_;
    const i64 a = 4 * n * h;  // bytes of one fp32 (N, h) activation
    const int hs = s_.hidden, fs = fl_, q = static_cast<int>(qw()), kv = static_cast<int>(kvw());
    const bool split = tp_.size > 1;
    auto param = [&](int t) { return t < 0 ? nullptr : c.access.param(c.index, t); };
    auto act = [&](i64 count) { return be.alloc(Category::activation, floats(count)); };
    std::vector<Buffer>& held = tape.held;
    held.clear();
    held.resize(kHeld);
    // A Linear on fp32 x (n, in): its input cast (held[xi], saved), its weight's cast
    // (held[wi], saved); returns its output, an fp32 temp of bf16 values.
    auto linear = [&](const float* xin, int xi, int t, int wi, int bias, int in, int out) {
      held[xi] = cast_bf16(be, Category::activation, xin, n * in);
      held[wi] = weight_cast_bf16(be, step_casts_.get(), param(t), static_cast<i64>(out) * in);
      Buffer y = autocast_linear(be, held[xi], held[wi], param(bias), n, in, out);
      c.saved.save(held[xi].data(), 2 * n * in);
      c.saved.save(held[wi].data(), 2 * static_cast<i64>(out) * in);
      return y;
    };

    // input_layernorm (fused RMSNorm, fp32): saves its input and rstd.
    held[kRstd1] = act(n);
    Buffer y = be.alloc(Category::temp, floats(n * h));
    be.rms_norm_forward(y.data(), held[kRstd1].data(), x, param(t_.norm1), static_cast<int>(n), hs, s_.norm_eps);
    c.saved.save(x, a);
    c.saved.save(held[kRstd1].data(), 4 * n);
    c.saved.save(norm_ref_(), 0);

    // q, k, v projections, each on its own cast of y; RoPE on q and k (fp32), rounded to
    // the bf16 SDPA takes.
    Buffer qb = linear(y.data(), kYq, t_.qW, kWq, t_.qB, hs, q);
    Buffer kb = linear(y.data(), kYk, t_.kW, kWk, t_.kB, hs, kv);
    Buffer vb = linear(y.data(), kYv, t_.vW, kWv, t_.vB, hs, kv);
    y.reset();
    be.rope(qb.data(), q, c.rows, s_.seq, as_.heads, s_.head_dim, s_.rope_theta, false);
    be.rope(kb.data(), kv, c.rows, s_.seq, as_.kv_heads, s_.head_dim, s_.rope_theta, false);
    autocast_round(qb.data(), n * q);
    autocast_round(kb.data(), n * kv);

    if (s_.attention == AttentionMode::flash) {
      // SDPA (flash, GQA native) saves bf16 q, k, v and output and the fp32 lse (B, H, T).
      held[kQ] = cast_bf16(be, Category::activation, qb.data(), n * q);
      held[kK] = cast_bf16(be, Category::activation, kb.data(), n * kv);
      held[kV] = cast_bf16(be, Category::activation, vb.data(), n * kv);
      held[kAttn] = act(lse_elems(c.rows));
      Buffer o = be.alloc(Category::temp, floats(n * q));
      be.flash_attention_forward(flash_args(c.rows, qb.data(), kb.data(), vb.data()), o.data(), q,
                                 held[kAttn].data());
      qb.reset();
      kb.reset();
      vb.reset();
      // --checkpoint attention: the lse is freed, not saved, and the output is o_proj's
      // save alone (the checkpoint keeps its inputs, q, k and v).
      if (recompute_attention_) held[kAttn].reset();
      held[kOut] = cast_bf16(be, Category::activation, o.data(), n * q);
      o.reset();
      c.saved.save(held[kQ].data(), 2 * n * q);
      c.saved.save(held[kK].data(), 2 * n * kv);
      c.saved.save(held[kV].data(), 2 * n * kv);
      if (!recompute_attention_) {
        c.saved.save(held[kOut].data(), 2 * n * q);
        c.saved.save(held[kAttn].data(), 4 * lse_elems(c.rows));
      }
    } else {
      // Math SDPA upcasts to fp32: q head-major, k and v expanded to H heads, the
      // probabilities; its output back in bf16, token-major for o_proj.
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
      // --checkpoint attention: the probabilities are freed, not saved (the backward
      // makes them again).
      auto [probs, o] = math_attention_forward(be, m, held[kQ].data(), held[kK].data(), m.head_major(held[kV].data()),
                                               !recompute_attention_);
      held[kAttn] = std::move(probs);
      held[kOut] = cast_bf16(be, Category::activation, o.data(), n * q);
      o.reset();
      for (int j : {kQ, kK, kAttn, kV})
        if (held[j]) c.saved.save(held[j].data(), static_cast<i64>(held[j].bytes()));
    }

    // x_mid = x + o_proj(out) (fp32 + bf16): o_proj saves out and its weight's cast.
    // Row-parallel under tp: the bf16 partial product all-reduced, the residual and the
    // bias added.
    held[kWo] = weight_cast_bf16(be, step_casts_.get(), param(t_.oW), h * q);
    Buffer r = autocast_linear(be, held[kOut], held[kWo], split ? nullptr : param(t_.oB), n, q, hs);
    c.saved.save(held[kOut].data(), 2 * n * q);
    c.saved.save(held[kWo].data(), 2 * h * q);
    if (split) {
      Buffer sum = reduce_row_parallel(c, r, n * h, kFamily);
      held[kXmid] = act(n * h);
      add_row_parallel_output(be, held[kXmid].data(), x, sum, param(t_.oB), n, hs);
    } else {
      held[kXmid] = act(n * h);
      be.copy(held[kXmid].data(), x, floats(n * h));
      be.add(held[kXmid].data(), r.data(), floats(n * h));
      r.reset();
    }

    // post_attention_layernorm (fp32)
    held[kRstd2] = act(n);
    y = be.alloc(Category::temp, floats(n * h));
    be.rms_norm_forward(y.data(), held[kRstd2].data(), held[kXmid].data(), param(t_.norm2), static_cast<int>(n), hs,
                        s_.norm_eps);
    c.saved.save(held[kXmid].data(), a);
    c.saved.save(held[kRstd2].data(), 4 * n);
    c.saved.save(norm2_ref_(), 0);

    // The MLP in Hugging Face's order: gate (on its cast of y2), SiLU (saves gate's
    // output), up (on its own cast), the product (saves both factors), down.
    Buffer g = linear(y.data(), kYg, t_.gateW, kWg, -1, hs, fs);
    held[kGate] = cast_bf16(be, Category::activation, g.data(), n * f);
    be.silu_forward(g.data(), g.data(), floats(n * f));
    autocast_round(g.data(), n * f);
    held[kSilu] = cast_bf16(be, Category::activation, g.data(), n * f);
    c.saved.save(held[kGate].data(), 2 * n * f);
    Buffer u = linear(y.data(), kYu, t_.upW, kWu, -1, hs, fs);
    y.reset();
    held[kUp] = cast_bf16(be, Category::activation, u.data(), n * f);
    be.mul(g.data(), g.data(), u.data(), floats(n * f));
    u.reset();
    held[kProd] = cast_bf16(be, Category::activation, g.data(), n * f);
    g.reset();
    c.saved.save(held[kSilu].data(), 2 * n * f);
    c.saved.save(held[kUp].data(), 2 * n * f);

    // out = x_mid + down_proj(product): (N, h) fp32, activation when the next block saves it.
    held[kWd] = weight_cast_bf16(be, step_casts_.get(), param(t_.downW), h * f);
    r = autocast_linear(be, held[kProd], held[kWd], nullptr, n, fs, hs);
    c.saved.save(held[kProd].data(), 2 * n * f);
    c.saved.save(held[kWd].data(), 2 * h * f);
    const Category out_category = output_saved ? Category::activation : Category::temp;
    if (split) {
      Buffer sum = reduce_row_parallel(c, r, n * h, kFamily);
      Buffer out = be.alloc(out_category, floats(n * h));
      add_row_parallel_output(be, out.data(), held[kXmid].data(), sum, nullptr, n, hs);
      return out;
    }
    Buffer out = be.alloc(out_category, floats(n * h));
    be.copy(out.data(), held[kXmid].data(), floats(n * h));
    be.add(out.data(), r.data(), floats(n * h));
    return out;
  }

  Buffer backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, f = fl_;
    const int hs = s_.hidden, fs = fl_, q = static_cast<int>(qw()), kv = static_cast<int>(kvw());
    const bool split = tp_.size > 1;
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto grad = [&](int t) { return t < 0 ? nullptr : c.access.grad(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    auto drop = [&](int j) { drop_saved(c.saved, tape.held[j]); };
    out.reset();

    // down_proj, then the product's factors: d up = dp * silu, d silu = dp * up, d gate =
    // SiLU'(d silu), each a gradient at a bf16 tensor (rounded)
    Buffer dr = rounded_copy(be, dy.data(), n * h);
    Buffer dp = autocast_linear_backward(be, dr.data(), held[kProd], held[kWd], grad(t_.downW), nullptr, n, fs, hs, beta);
    dr.reset();
    drop(kWd);
    drop(kProd);
    Buffer du = be.alloc(Category::temp, floats(n * f));
    {
      Buffer s = widen(be, held[kSilu], n * f);
      be.mul(du.data(), dp.data(), s.data(), floats(n * f));
    }
    autocast_round(du.data(), n * f);
    drop(kSilu);
    {
      Buffer up = widen(be, held[kUp], n * f);
      be.mul(dp.data(), dp.data(), up.data(), floats(n * f));
    }
    autocast_round(dp.data(), n * f);
    drop(kUp);
    {
      Buffer gate = widen(be, held[kGate], n * f);
      be.silu_backward(dp.data(), dp.data(), gate.data(), floats(n * f));
    }
    autocast_round(dp.data(), n * f);
    drop(kGate);
    // gate_proj and up_proj, each onto its own cast of y2; y2's gradient is their sum (fp32)
    Buffer dy2 = autocast_linear_backward(be, dp.data(), held[kYg], held[kWg], grad(t_.gateW), nullptr, n, hs, fs, beta);
    dp.reset();
    drop(kWg);
    drop(kYg);
    {
      Buffer dyu = autocast_linear_backward(be, du.data(), held[kYu], held[kWu], grad(t_.upW), nullptr, n, hs, fs, beta);
      be.add(dy2.data(), dyu.data(), floats(n * h));
    }
    du.reset();
    drop(kWu);
    drop(kYu);
    column_parallel_input_grad(c, tp_, dy2, kFamily);

    // post_attention_layernorm, then the residual: dx_mid = the norm's dx + dy
    Buffer dmid = be.alloc(Category::temp, floats(n * h));
    be.rms_norm_backward(dmid.data(), grad(t_.norm2), dy2.data(), held[kXmid].data(), held[kRstd2].data(),
                         param(t_.norm2), static_cast<int>(n), hs, beta);
    dy2.reset();
    c.saved.release(norm2_ref_());
    drop(kXmid);
    drop(kRstd2);
    add_residual(be, dmid, dy, n * h);

    // o_proj
    dr = rounded_copy(be, dmid.data(), n * h);
    Buffer dout = autocast_linear_backward(be, dr.data(), held[kOut], held[kWo], grad(t_.oW),
                                           split ? nullptr : grad(t_.oB), n, q, hs, beta);
    dr.reset();
    // Under tp o_proj's bias is added in fp32 after the sum: its gradient sums dx_mid's fp32 rows.
    if (split && t_.oB >= 0) be.bias_grad(grad(t_.oB), dmid.data(), static_cast<int>(n), hs, beta);
    drop(kWo);
    c.saved.release(held[kOut].data());  // o_proj's save of out

    // attention: dq (N, H d), dk and dv (N, K d) in one buffer, one after another
    Buffer dqkv = be.alloc(Category::temp, floats(n * (q + 2 * kv)));
    float* dq = dqkv.data();
    float* dk = dq + n * q;
    float* dv = dk + n * kv;
    if (s_.attention == AttentionMode::flash) {
      Buffer qf = widen(be, held[kQ], n * q);
      Buffer kf = widen(be, held[kK], n * kv);
      Buffer vf = widen(be, held[kV], n * kv);
      Buffer of;
      Buffer rerun;  // --checkpoint attention: the re-run's bf16 output (saved)
      if (recompute_attention_) {
        // The output, which only o_proj saved, is freed; the core's checkpoint re-runs
        // flash in bf16 on the saved q, k, v: a new lse and bf16 output (activation,
        // saved), the output's fp32 values rounded as its widened copy.
        held[kOut].reset();
        held[kAttn] = be.alloc(Category::activation, floats(lse_elems(c.rows)));
        of = be.alloc(Category::temp, floats(n * q));
        be.flash_attention_forward(flash_args(c.rows, qf.data(), kf.data(), vf.data()), of.data(), q,
                                   held[kAttn].data());
        rerun = cast_bf16(be, Category::activation, of.data(), n * q);
        autocast_round(of.data(), n * q);
        c.saved.save(held[kAttn].data(), static_cast<i64>(held[kAttn].bytes()));
        c.saved.save(rerun.data(), 2 * n * q);
      } else {
        of = widen(be, held[kOut], n * q);
      }
      be.flash_attention_backward(flash_args(c.rows, qf.data(), kf.data(), vf.data()), of.data(), q, dout.data(),
                                  held[kAttn].data(), dq, dk, dv);
      dout.reset();
      for (int j : {kQ, kK, kV, kOut, kAttn})
        if (held[j]) drop(j);
      if (rerun) drop_saved(c.saved, rerun);
    } else {
      held[kOut].reset();
      const MathAttention m = math_attention(as_, c.rows);
      HeadGrads hg = math_attention_backward(be, c.saved, m, dout, held[kQ], held[kK], held[kAttn],
                                             m.head_major(held[kV].data()), held[kV]);
      be.permute_heads(dq, hg.dq.data(), q, c.rows, s_.seq, as_.heads, s_.head_dim, false);
      reduce_heads(be, dk, hg.dk.data(), kv, c.rows, s_.seq, as_.heads, as_.kv_heads, s_.head_dim);
      reduce_heads(be, dv, hg.dv.data(), kv, c.rows, s_.seq, as_.heads, as_.kv_heads, s_.head_dim);
    }
    // SDPA's gradients are bf16; RoPE's backward in fp32; the projections' outputs' bf16.
    autocast_round(dqkv.data(), n * (q + 2 * kv));
    be.rope(dq, q, c.rows, s_.seq, as_.heads, s_.head_dim, s_.rope_theta, true);
    be.rope(dk, kv, c.rows, s_.seq, as_.kv_heads, s_.head_dim, s_.rope_theta, true);
    autocast_round(dq, n * (q + kv));

    // q, k, v projections, each onto its own cast of y1; y1's gradient is their sum (fp32).
    // Replicated kv heads: k's and v's gradients into the rank's slot of every kv head's
    // (a temp, zeros elsewhere), all-reduced over tp, then written with beta.
    Buffer dy1 = autocast_linear_backward(be, dq, held[kYq], held[kWq], grad(t_.qW), grad(t_.qB), n, hs, q, beta);
    Buffer kv_part;
    float* kv_slot[4] = {grad(t_.kW), grad(t_.kB), grad(t_.vW), grad(t_.vB)};
    float kv_beta = beta;
    const i64 kw = static_cast<i64>(kv) * h, kb = t_.kB >= 0 ? kv : 0;
    if (kv_replicas_ > 1) {
      kv_part = be.alloc(Category::temp, floats(s_.kv_heads * 2 * (kw + kb)));
      be.fill(kv_part.data(), 0.0f, kv_part.count());
      float* at = kv_part.data() + kv_head_ * 2 * (kw + kb);
      kv_slot[0] = at;
      kv_slot[1] = kb > 0 ? at + kw : nullptr;
      kv_slot[2] = at + kw + kb;
      kv_slot[3] = kb > 0 ? at + 2 * kw + kb : nullptr;
      kv_beta = 0.0f;
    }
    for (auto [d, xi, wi, wslot, bslot] : {std::tuple{dk, kYk, kWk, 0, 1}, std::tuple{dv, kYv, kWv, 2, 3}}) {
      Buffer part = autocast_linear_backward(be, d, held[xi], held[wi], kv_slot[wslot], kv_slot[bslot], n, hs, kv,
                                             kv_beta);
      be.add(dy1.data(), part.data(), floats(n * h));
    }
    if (kv_part) {
      std::vector<GradSlot> slots = {{grad(t_.kW), kw}};
      if (kb > 0) slots.push_back({grad(t_.kB), kb});
      slots.push_back({grad(t_.vW), kw});
      if (kb > 0) slots.push_back({grad(t_.vB), kb});
      reduce_norm_grads(c, kv_part, slots, beta, kFamily, kv_head_ * 2 * (kw + kb));
    }
    dqkv.reset();
    for (int j : {kWq, kYq, kWk, kYk, kWv, kYv}) drop(j);
    column_parallel_input_grad(c, tp_, dy1, kFamily);

    // input_layernorm, then the residual: dx = the norm's dx + dx_mid
    Buffer dx = be.alloc(Category::temp, floats(n * h));
    be.rms_norm_backward(dx.data(), grad(t_.norm1), dy1.data(), x, held[kRstd1].data(), param(t_.norm1),
                         static_cast<int>(n), hs, beta);
    dy1.reset();
    c.saved.release(norm_ref_());
    c.saved.release(x);
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
  // The attention's shape on this rank: its H/T query heads and K/T kv heads (one, a
  // replica, when K < T).
  static TransformerShape attention_shape(TransformerShape s, int tp) {
    s.kv_heads = kv_heads_per_rank(s, tp);
    s.heads /= tp;
    return s;
  }
  i64 qw() const { return static_cast<i64>(as_.heads) * s_.head_dim; }      // q's width here, H d/T
  i64 kvw() const { return static_cast<i64>(as_.kv_heads) * s_.head_dim; }  // k's and v's, K d/T
  i64 lse_elems(int rows) const { return static_cast<i64>(rows) * as_.heads * s_.seq; }
  AttentionArgs flash_args(int rows, const float* q, const float* k, const float* v) const {
    return attention_args(as_, rows, q, k, v, static_cast<int>(qw()), static_cast<int>(kvw()));
  }

  std::string name_;
  LlamaLayerTensors t_;  // its tensors, and where each lies among them
  TensorParallel tp_;
  int fl_;               // the MLP's inner features on this rank: f/T
  TransformerShape as_;  // the attention's shape on this rank
  int kv_replicas_;      // the ranks holding a copy of each kv head: T/K when K < T, else 1
  int kv_head_;          // the kv head this rank's copy is (replicated kv heads)
  bool recompute_attention_ = false;  // --checkpoint attention
  WeightRef norm_ref_, norm2_ref_;
  std::shared_ptr<StepCasts> step_casts_;  // --autocast-region step (null: per micro-batch)
};

}  // namespace

std::unique_ptr<Model> make_llama_autocast(const TransformerShape& s, const TensorParallel& tp) {
  std::vector<std::unique_ptr<Block>> blocks;
  blocks.push_back(make_embedding_block(s, {"model.embed_tokens.weight", ""}, kFamily, tp));
  for (int i = 0; i < s.layers; ++i) blocks.push_back(std::make_unique<AutocastLayer>(s, i, tp));
  std::vector<ParamSpec> final_params = {{"model.norm.weight", {s.hidden}, 0.0f, 1.0f}};
  if (!s.tied_embeddings) {
    // lm_head: vocabulary-parallel under tp (rank r's V/T rows).
    const i64 rows = s.vocab / tp.size;
    ParamSpec head{"lm_head.weight", {rows, s.hidden}, uniform_bound(kInitStd)};
    if (tp.size > 1) shard_rows(head, tp.rank, rows, s.hidden);
    final_params.push_back(head);
  }
  blocks.push_back(std::make_unique<AutocastFinal>(
      s, kFamily, AutocastFinal::Norm::rms, std::move(final_params),
      s.tied_embeddings ? TensorRef{kEmbeddingBlock, kEmbedTokens} : TensorRef{}, tp));
  return std::make_unique<Model>(std::move(blocks), make_cross_entropy(s, kFamily, tp));
}

}  // namespace shardscope
