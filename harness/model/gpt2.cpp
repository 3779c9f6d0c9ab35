// The GPT-2 family as nanoGPT's GPT module (--model gpt2): an embedding block (token and
// learned position embeddings), L transformer blocks (LayerNorm, fused QKV Linear,
// causal attention, output Linear, residual, LayerNorm, Linear h -> ffn, GELU (tanh),
// Linear ffn -> h, residual), a final block (LayerNorm, the head tied to the token
// embedding) and cross-entropy over the vocabulary, mean over tokens.
//
// A block's rows are sequences: N = rows * seq tokens, one activation row per token,
// (N, features) fp32 row-major. The model's input and the loss's target are int64 token
// ids (transformer_args.hpp: 2 floats a token).
//
// What each op saves is what torch 2.x eager autograd saves for nanoGPT's module
// (docs/design.md §2 lists it; bench/torch_saved.py measures torch's): each save below
// names the op of torch that saves it. Everything saved is category activation, except
// the token ids (the batch and the target, temp); everything else transient is temp.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "harness/model/models.hpp"
#include "harness/model/transformer_parts.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using namespace transformer;

const char* const kFamily = "gpt2";

// The index of the weights the head ties: the embedding block's tensor 0 (wte).
constexpr int kEmbeddingBlock = 0;
constexpr int kWte = 0;

// ---- a transformer block ----
using namespace gpt2_block;  // its tensors, in gpt2_block_params' order (models.hpp)

}  // namespace

std::vector<ParamSpec> gpt2_block_params(const TransformerShape& s, int layer, const TensorParallel& tp) {
  const std::string p = "transformer.h." + std::to_string(layer) + ".";
  const i64 h = s.hidden, hl = h / tp.size, fl = s.ffn / tp.size;
  const float w = uniform_bound(kInitStd);
  // nanoGPT scales the residual projections' init by 1 / sqrt(2 L).
  const float wr = uniform_bound(kInitStd / std::sqrt(2.0f * static_cast<float>(s.layers)));
  std::vector<ParamSpec> params = {
      {p + "ln_1.weight", {h}, 0.0f, 1.0f},      {p + "ln_1.bias", {h}},
      {p + "attn.c_attn.weight", {3 * hl, h}, w}, {p + "attn.c_attn.bias", {3 * hl}},
      {p + "attn.c_proj.weight", {h, hl}, wr},    {p + "attn.c_proj.bias", {h}},
      {p + "ln_2.weight", {h}, 0.0f, 1.0f},      {p + "ln_2.bias", {h}},
      {p + "mlp.c_fc.weight", {fl, h}, w},        {p + "mlp.c_fc.bias", {fl}},
      {p + "mlp.c_proj.weight", {h, fl}, wr},     {p + "mlp.c_proj.bias", {h}}};
  if (tp.size > 1) {
    // q, k and v each give their rows [r hl, (r + 1) hl): three blocks of hl rows, h·h
    // elements apart in the whole (3h, h) weight, h apart in its bias.
    ParamSpec& qkv_w = params[kAttnW];
    qkv_w.full_cols = h * h, qkv_w.shard_first = tp.rank * hl * h, qkv_w.shard_cols = hl * h;
    ParamSpec& qkv_b = params[kAttnB];
    qkv_b.full_cols = h, qkv_b.shard_first = tp.rank * hl, qkv_b.shard_cols = hl;
    shard_cols(params[kProjW], tp.rank, hl, h);
    shard_rows(params[kFcW], tp.rank, fl, h);
    shard_rows(params[kFcB], tp.rank, 1, fl);
    shard_cols(params[kMlpProjW], tp.rank, fl, s.ffn);
  }
  return params;
}

namespace {

// Under tensor parallelism (Megatron's ParallelAttention and ParallelMLP), rank r of T
// holds heads [r H/T, (r + 1) H/T): c_attn is column-parallel (its heads' rows of q, k and
// v, and of the bias: qkv is (N, 3h/T), laid out q | k | v as the one-rank model's),
// attn.c_proj row-parallel (the h/T columns those heads feed; its bias whole), c_fc
// column-parallel (f/T rows) and mlp.c_proj row-parallel (f/T columns; bias whole). A
// row-parallel Linear's partial output is made in the buffer it ends in (x_mid, the
// block's output), all-reduced over the group in place, then the residual and the bias
// are added; each column-parallel Linear's input gradient (ln_1's and ln_2's output
// gradient) is all-reduced in place. The norms are whole on every rank: their inputs
// and output gradients are the same on every rank, and so are their gradients, which
// are not reduced (as Megatron without sequence parallelism).
class TransformerBlock final : public SequenceBlock {
 public:
  TransformerBlock(const TransformerShape& s, int layer, const TensorParallel& tp)
      : SequenceBlock(s, kFamily),
        name_("block " + std::to_string(layer)),
        tp_(tp),
        hl_(s.hidden / tp.size),
        fl_(s.ffn / tp.size),
        as_(attention_shape(s, tp.size)) {
    params_ = gpt2_block_params(s, layer, tp);
  }
  bool checkpointable() const override { return true; }
  // mlp.c_proj: its output's gradient arrives first (the residual saves nothing).
  std::vector<TensorRef> first_backward_module(int index) const override {
    return module_tensors(index, {kMlpProjW, kMlpProjB});
  }
  void set_recompute_attention(bool on) override { recompute_attention_ = on; }
  std::string name() const override { return name_; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  std::int64_t input_elems(int rows) const override { return stream(rows) * s_.hidden; }
  std::int64_t output_elems(int rows) const override { return stream(rows) * s_.hidden; }
  bool saves_input() const override { return true; }  // ln_1's input
  bool saves_output() const override { return false; }

  // What the forward keeps in tape.held: qkv and lse with flash only, the last four with math only.
  enum Held : int { kMean1, kRstd1, kLn1, kQkv, kAttnOut, kLse, kXmid, kMean2, kRstd2, kLn2, kFc, kGelu };
  enum HeldMath : int { kQ = kGelu + 1, kK, kV, kProbs, kHeld };
  // What the zero-bubble B keeps besides for W: each Linear's and each norm's output
  // gradient (temp): mlp.c_proj's dy, c_fc's (after GELU), ln_2's, attn.c_proj's (the
  // residual's dx_mid), c_attn's dqkv, ln_1's.
  enum Kept : int { kDy = kHeld, kDfc, kDln2, kDmid, kDqkv, kDln1, kKept };

  Buffer forward(const BlockCall& c, const float* x, bool /*input_requires_grad*/, bool output_saved,
                 BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, hl = hl_, f = fl_;
    const i64 ns = stream(c.rows);  // the residual stream's tokens here: n, or n/T under --sp
    const i64 a = 4 * ns * h;   // bytes of one (N, h) activation of the stream (N/T tokens under --sp)
    const i64 al = 4 * n * hl;  // of the attention's (N, h/T) on this rank
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto act = [&](i64 count) { return be.alloc(Category::activation, floats(count)); };
    auto module = [&](std::initializer_list<int> t) { return module_tensors(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    held.clear();
    held.resize(kHeld);

    // ln_1: saves its input, mean and rstd (N, 1) each.
    c.access.module_forward_begin(module({kLn1W, kLn1B}));
    held[kMean1] = act(ns);
    held[kRstd1] = act(ns);
    held[kLn1] = act(ns * h);
    be.layer_norm_forward(held[kLn1].data(), held[kMean1].data(), held[kRstd1].data(), x, param(kLn1W),
                          param(kLn1B), static_cast<int>(ns), s_.hidden, s_.norm_eps);
    c.saved.save(x, a);
    c.saved.save(held[kMean1].data(), 4 * ns);
    c.saved.save(held[kRstd1].data(), 4 * ns);
    c.saved.save(ln_weight_(), 0);
    c.access.module_forward_end(module({kLn1W, kLn1B}));

    // c_attn: saves its input (ln_1's output, addmm's mat1) and its weight.
    const bool flash = s_.attention == AttentionMode::flash;
    // (N, 3h): saved by flash, and by math when its v is a view of it
    const bool qkv_saved = flash || v_is_view(c.rows);
    c.access.module_forward_begin(module({kAttnW, kAttnB}));
    Buffer qkv = be.alloc(qkv_saved ? Category::activation : Category::temp, floats(3 * n * hl));
    column_parallel_forward(c, qkv, held[kLn1], param(kAttnW), param(kAttnB), 3 * hl_);
    c.saved.save(held[kLn1].data(), a);
    c.saved.save(attn_weight_(), 0);
    c.access.module_forward_end(module({kAttnW, kAttnB}));

    const float* y = nullptr;  // the attention's output, token-major (N, h): c_proj's input
    if (flash) {
      // Flash SDPA saves q, k, v (views of the one qkv storage), its output and the
      // log-sum-exp (B, heads, T).
      held[kAttnOut] = act(n * hl);
      held[kLse] = act(static_cast<i64>(c.rows) * as_.heads * s_.seq);
      be.flash_attention_forward(attention(c.rows, qkv.data()), held[kAttnOut].data(), hl_, held[kLse].data());
      c.saved.save(qkv.data(), 3 * al);
      c.saved.save(held[kAttnOut].data(), al);
      // --checkpoint attention: the log-sum-exp is freed, not saved (flash_backward runs
      // the flash forward again).
      if (recompute_attention_)
        held[kLse].reset();
      else
        c.saved.save(held[kLse].data(), 4 * static_cast<i64>(c.rows) * as_.heads * s_.seq);
      held[kQkv] = std::move(qkv);
      y = held[kAttnOut].data();
    } else {
      // Math SDPA: head-major copies of q and k (bmm 1's operands), the probabilities
      // (B, heads, T, T) (softmax's result and bmm 2's self), v (bmm 2's mat2: a copy,
      // or with one sequence or one head a view of qkv, as torch's matmul reshapes it);
      // its head-major output is copied token-major for c_proj (which saves it).
      const int t = s_.seq, hd = s_.head_dim;
      const bool v_view = v_is_view(c.rows);
      for (int j : {kQ, kK, kV}) {
        if (j == kV && v_view) continue;
        held[j] = act(n * hl);
        be.permute_heads(held[j].data(), qkv.data() + (j == kQ ? 0 : j == kK ? hl : 2 * hl), 3 * hl_, c.rows, t,
                         as_.heads, hd, true);
      }
      if (v_view) held[kQkv] = std::move(qkv);
      qkv.reset();
      // --checkpoint attention: the probabilities are freed, not saved (math_backward
      // recomputes them).
      auto [probs, attn_out] = math_attention_forward(be, math_attention(as_, c.rows), held[kQ].data(),
                                                      held[kK].data(), v_operand(c.rows, held), !recompute_attention_);
      held[kProbs] = std::move(probs);
      held[kAttnOut] = std::move(attn_out);  // y = out.transpose(1, 2).contiguous(), (N, h)
      c.saved.save(held[kQ].data(), al);
      c.saved.save(held[kK].data(), al);
      if (held[kProbs]) c.saved.save(held[kProbs].data(), static_cast<i64>(held[kProbs].bytes()));
      c.saved.save(held[v_view ? static_cast<int>(kQkv) : static_cast<int>(kV)].data(), v_view ? 3 * al : al);
      y = held[kAttnOut].data();
    }

    // x_mid = x + c_proj(y): c_proj saves y (mm's mat1) and its weight.
    c.access.module_forward_begin(module({kProjW, kProjB}));
    held[kXmid] = act(ns * h);
    row_parallel_forward(c, held[kXmid], x, y, param(kProjW), param(kProjB), hl_);
    c.saved.save(y, al);
    c.saved.save(proj_weight_(), 0);
    c.access.module_forward_end(module({kProjW, kProjB}));

    // ln_2
    c.access.module_forward_begin(module({kLn2W, kLn2B}));
    held[kMean2] = act(ns);
    held[kRstd2] = act(ns);
    held[kLn2] = act(ns * h);
    be.layer_norm_forward(held[kLn2].data(), held[kMean2].data(), held[kRstd2].data(), held[kXmid].data(),
                          param(kLn2W), param(kLn2B), static_cast<int>(ns), s_.hidden, s_.norm_eps);
    c.saved.save(held[kXmid].data(), a);
    c.saved.save(held[kMean2].data(), 4 * ns);
    c.saved.save(held[kRstd2].data(), 4 * ns);
    c.saved.save(ln2_weight_(), 0);
    c.access.module_forward_end(module({kLn2W, kLn2B}));

    // c_fc (saves ln_2's output), GELU (saves its input), mlp c_proj (saves GELU's output)
    c.access.module_forward_begin(module({kFcW, kFcB}));
    held[kFc] = act(n * f);
    column_parallel_forward(c, held[kFc], held[kLn2], param(kFcW), param(kFcB), fl_);
    c.saved.save(held[kLn2].data(), a);
    c.saved.save(fc_weight_(), 0);
    c.access.module_forward_end(module({kFcW, kFcB}));
    held[kGelu] = act(n * f);
    be.gelu_tanh_forward(held[kGelu].data(), held[kFc].data(), floats(n * f));
    c.saved.save(held[kFc].data(), 4 * n * f);

    // out = x_mid + mlp.c_proj(gelu): (N, h), activation when the next block saves it.
    c.access.module_forward_begin(module({kMlpProjW, kMlpProjB}));
    Buffer out = be.alloc(output_saved ? Category::activation : Category::temp, floats(ns * h));
    row_parallel_forward(c, out, held[kXmid].data(), held[kGelu].data(), param(kMlpProjW), param(kMlpProjB), fl_);
    c.saved.save(held[kGelu].data(), 4 * n * f);
    c.saved.save(mlp_proj_weight_(), 0);
    c.access.module_forward_end(module({kMlpProjW, kMlpProjB}));
    return out;
  }

  Buffer backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, hl = hl_, f = fl_, ns = stream(c.rows);
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto grad = [&](int t) { return c.access.grad(c.index, t); };
    auto temp = [&](i64 count) { return be.alloc(Category::temp, floats(count)); };
    auto drop = [&](int j) { drop_saved(c.saved, tape.held[j]); };
    auto module = [&](std::initializer_list<int> t) { return module_tensors(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    out.reset();  // nothing in this block needs its output

    // mlp c_proj (under --sp its output gradient's tokens gathered: the reduce-scatter's
    // backward; its bias's gradient summed over all of them), GELU, c_fc
    c.access.module_backward_begin(module({kMlpProjW, kMlpProjB}));
    Buffer dy_whole = tp_.sequence ? gather_tokens(c, tp_, dy.data(), n, s_.hidden, kFamily) : Buffer{};
    Buffer dg = temp(n * f);
    linear_backward(be, dg.data(), grad(kMlpProjW), grad(kMlpProjB), dy_whole ? dy_whole.data() : dy.data(),
                    held[kGelu].data(), param(kMlpProjW), n, fl_, s_.hidden, beta);
    dy_whole.reset();
    c.saved.release(mlp_proj_weight_());
    drop(kGelu);
    c.access.module_backward_end(module({kMlpProjW, kMlpProjB}), true);
    be.gelu_tanh_backward(dg.data(), dg.data(), held[kFc].data(), floats(n * f));
    drop(kFc);
    c.access.module_backward_begin(module({kFcW, kFcB}));
    Buffer dln = column_parallel_backward(c, dg, held[kLn2], param(kFcW), grad(kFcW), grad(kFcB), fl_, beta);
    dg.reset();
    c.saved.release(fc_weight_());
    drop(kLn2);
    c.access.module_backward_end(module({kFcW, kFcB}), true);

    // ln_2, then the residual: dx_mid = ln_2's dx + dy
    c.access.module_backward_begin(module({kLn2W, kLn2B}));
    Buffer dmid = temp(ns * h);
    norm_backward(c, dmid, dln, held[kXmid].data(), held[kMean2], held[kRstd2], kLn2W, kLn2B, beta);
    c.saved.release(ln2_weight_());
    drop(kXmid);
    drop(kMean2);
    drop(kRstd2);
    c.access.module_backward_end(module({kLn2W, kLn2B}), true);
    add_residual(be, dmid, dy, ns * h);

    // attention's c_proj (its output gradient's tokens gathered under --sp)
    c.access.module_backward_begin(module({kProjW, kProjB}));
    Buffer dmid_whole = tp_.sequence ? gather_tokens(c, tp_, dmid.data(), n, s_.hidden, kFamily) : Buffer{};
    Buffer dattn = temp(n * hl);
    linear_backward(be, dattn.data(), grad(kProjW), grad(kProjB), dmid_whole ? dmid_whole.data() : dmid.data(),
                    held[kAttnOut].data(), param(kProjW), n, hl_, s_.hidden, beta);
    dmid_whole.reset();
    c.saved.release(proj_weight_());
    c.saved.release(held[kAttnOut].data());  // c_proj's save of y
    c.access.module_backward_end(module({kProjW, kProjB}), true);

    // attention: dqkv (N, 3h)
    Buffer dqkv = s_.attention == AttentionMode::flash ? flash_backward(c, dattn, held) : math_backward(c, dattn, held);

    // c_attn
    c.access.module_backward_begin(module({kAttnW, kAttnB}));
    dln = column_parallel_backward(c, dqkv, held[kLn1], param(kAttnW), grad(kAttnW), grad(kAttnB), 3 * hl_, beta);
    dqkv.reset();
    c.saved.release(attn_weight_());
    drop(kLn1);
    c.access.module_backward_end(module({kAttnW, kAttnB}), true);

    // ln_1, then the residual: dx = ln_1's dx + dx_mid
    c.access.module_backward_begin(module({kLn1W, kLn1B}));
    Buffer dx = temp(ns * h);
    norm_backward(c, dx, dln, x, held[kMean1], held[kRstd1], kLn1W, kLn1B, beta);
    c.saved.release(ln_weight_());
    c.saved.release(x);
    drop(kMean1);
    drop(kRstd1);
    c.access.module_backward_end(module({kLn1W, kLn1B}), true);
    add_residual(be, dx, dmid, ns * h);
    return finish_backward(held, std::move(dx), needs_dx);
  }

  // B: dx through the same ops as backward, without the weights' gradients. What W
  // reads stays: every Linear's saved input, each norm's saved input, mean, rstd and
  // weight reference, and the output gradients (Kept). GELU's and the attention's saves
  // go as backward lets them go; each Linear's weight reference goes with its dx. Under
  // tensor parallelism B all-reduces c_fc's and c_attn's input gradients, as backward
  // does; W needs no communication.
  Buffer backward_input(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, bool free_output,
                        BlockTape& tape) override {
    SHARDSCOPE_REQUIRE(!tp_.sequence, "gpt2: the zero-bubble split of a sequence-parallel block is not built");
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden, hl = hl_, f = fl_;
    const int hs = s_.hidden;
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto temp = [&](i64 count) { return be.alloc(Category::temp, floats(count)); };
    std::vector<Buffer>& held = tape.held;
    held.resize(kKept);
    if (free_output) out.reset();

    // mlp c_proj, GELU, c_fc (under tp its input gradient all-reduced in place, as backward's)
    held[kDfc] = temp(n * f);
    linear_input_grad(be, held[kDfc].data(), dy.data(), param(kMlpProjW), n, fl_, hs);
    c.saved.release(mlp_proj_weight_());
    be.gelu_tanh_backward(held[kDfc].data(), held[kDfc].data(), held[kFc].data(), floats(n * f));
    drop_saved(c.saved, held[kFc]);
    held[kDln2] = temp(n * h);
    linear_input_grad(be, held[kDln2].data(), held[kDfc].data(), param(kFcW), n, hs, fl_);
    column_parallel_input_grad(c, held[kDln2]);
    c.saved.release(fc_weight_());

    // ln_2, then the residual
    held[kDmid] = temp(n * h);
    layer_norm_input_grad(be, held[kDmid].data(), held[kDln2].data(), held[kXmid].data(), held[kMean2].data(),
                          held[kRstd2].data(), param(kLn2W), n, hs);
    be.add(held[kDmid].data(), dy.data(), floats(n * h));
    held[kDy] = std::move(dy);

    // attention's c_proj, the attention, c_attn
    Buffer dattn = temp(n * hl);
    linear_input_grad(be, dattn.data(), held[kDmid].data(), param(kProjW), n, hl_, hs);
    c.saved.release(proj_weight_());
    held[kDqkv] = s_.attention == AttentionMode::flash ? flash_backward(c, dattn, held, /*keep_out*/ true)
                                                       : math_backward(c, dattn, held, /*keep_out*/ true);
    held[kDln1] = temp(n * h);
    linear_input_grad(be, held[kDln1].data(), held[kDqkv].data(), param(kAttnW), n, hs, 3 * hl_);
    column_parallel_input_grad(c, held[kDln1]);
    c.saved.release(attn_weight_());

    // ln_1, then the residual
    Buffer dx;
    if (needs_dx) {
      dx = temp(n * h);
      layer_norm_input_grad(be, dx.data(), held[kDln1].data(), x, held[kMean1].data(),
                            held[kRstd1].data(), param(kLn1W), n, hs);
      be.add(dx.data(), held[kDmid].data(), floats(n * h));
    }
    return dx;
  }

  // W: the parameter gradients in the order backward writes them, each from its kept
  // output gradient (freed) and its saved input (released and freed).
  void backward_weight(const BlockCall& c, const float* x, float beta, BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows);
    const int hs = s_.hidden, fs = fl_, hls = hl_;  // the rank's f/T and h/T under tp
    auto param = [&](int t) { return c.access.param(c.index, t); };
    auto grad = [&](int t) { return c.access.grad(c.index, t); };
    std::vector<Buffer>& held = tape.held;
    auto drop = [&](int j) { drop_saved(c.saved, tape.held[j]); };
    linear_weight_grad(be, grad(kMlpProjW), grad(kMlpProjB), held[kDy].data(), held[kGelu].data(), n, fs, hs, beta);
    held[kDy].reset();
    drop(kGelu);
    linear_weight_grad(be, grad(kFcW), grad(kFcB), held[kDfc].data(), held[kLn2].data(), n, hs, fs, beta);
    held[kDfc].reset();
    drop(kLn2);
    layer_norm_weight_grad(be, grad(kLn2W), grad(kLn2B), held[kDln2].data(), held[kXmid].data(), held[kMean2].data(),
                           held[kRstd2].data(), param(kLn2W), n, hs, beta);
    held[kDln2].reset();
    c.saved.release(ln2_weight_());
    drop(kXmid);
    drop(kMean2);
    drop(kRstd2);
    linear_weight_grad(be, grad(kProjW), grad(kProjB), held[kDmid].data(), held[kAttnOut].data(), n, hls, hs, beta);
    held[kDmid].reset();
    drop(kAttnOut);  // c_proj's save of y
    linear_weight_grad(be, grad(kAttnW), grad(kAttnB), held[kDqkv].data(), held[kLn1].data(), n, hs, 3 * hls, beta);
    held[kDqkv].reset();
    drop(kLn1);
    layer_norm_weight_grad(be, grad(kLn1W), grad(kLn1B), held[kDln1].data(), x, held[kMean1].data(),
                           held[kRstd1].data(), param(kLn1W), n, hs, beta);
    held[kDln1].reset();
    c.saved.release(ln_weight_());
    c.saved.release(x);
    drop(kMean1);
    drop(kRstd1);
    held.clear();
  }

 private:
  // The attention's shape on this rank: its H/T heads.
  static TransformerShape attention_shape(TransformerShape s, int tp) {
    s.heads /= tp;
    s.kv_heads /= tp;
    return s;
  }

  // The residual stream's tokens on this rank for `rows` sequences: N, or N/T under --sp.
  i64 stream(int rows) const { return stream_tokens(tp_, tokens(rows)); }

  // y (N, out) = ln W^T + b for c_attn and c_fc (column-parallel under tp): under --sp
  // ln's tokens are gathered first into a temp (N, h), freed once y is made (the Linear
  // saves the rank's tokens, as Megatron's does).
  void column_parallel_forward(const BlockCall& c, Buffer& y, const Buffer& ln, const float* w, const float* b,
                               int out) const {
    const i64 n = tokens(c.rows);
    Buffer whole = tp_.sequence ? gather_tokens(c, tp_, ln.data(), n, s_.hidden, kFamily) : Buffer{};
    linear_forward(c.backend, y.data(), whole ? whole.data() : ln.data(), w, b, n, s_.hidden, out, 0.0f);
  }
  // c_fc's and c_attn's backward from dy (N, out), their input ln saved: the weights'
  // gradients and the input gradient (temp), this rank's part of the sum: all-reduced in
  // place under tp; under --sp the saved tokens of ln gathered again (a temp (N, h), freed
  // after the weights' gradients) and the input gradient (N, h) reduce-scattered to the
  // rank's (N/T, h).
  Buffer column_parallel_backward(const BlockCall& c, const Buffer& dy, const Buffer& ln, const float* w, float* dw,
                                  float* db, int out, float beta) const {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows);
    Buffer whole = tp_.sequence ? gather_tokens(c, tp_, ln.data(), n, s_.hidden, kFamily) : Buffer{};
    Buffer dln = be.alloc(Category::temp, floats(n * s_.hidden));
    linear_backward(be, dln.data(), dw, db, dy.data(), whole ? whole.data() : ln.data(), w, n, s_.hidden, out, beta);
    if (!tp_.sequence) {
      column_parallel_input_grad(c, dln);
      return dln;
    }
    whole.reset();
    return scatter_tokens(c, tp_, dln, n, s_.hidden, kFamily);
  }
  // A LayerNorm's backward over the stream's tokens: dx (allocated by the caller) from dy
  // (freed); its weight's and bias's gradients with beta, or under --sp the rank's part
  // of them made in a temp (2h) and all-reduced over the group (reduce_norm_grads).
  void norm_backward(const BlockCall& c, Buffer& dx, Buffer& dy, const float* x, const Buffer& mean,
                     const Buffer& rstd, int wt, int bt, float beta) const {
    Backend& be = c.backend;
    const int h = s_.hidden, ns = static_cast<int>(stream(c.rows));
    const float* gamma = c.access.param(c.index, wt);
    if (!tp_.sequence) {
      be.layer_norm_backward(dx.data(), c.access.grad(c.index, wt), c.access.grad(c.index, bt), dy.data(), x,
                             mean.data(), rstd.data(), gamma, ns, h, beta);
      dy.reset();
      return;
    }
    Buffer part = be.alloc(Category::temp, floats(2 * static_cast<i64>(h)));
    be.layer_norm_backward(dx.data(), part.data(), part.data() + h, dy.data(), x, mean.data(), rstd.data(), gamma, ns,
                           h, 0.0f);
    dy.reset();
    reduce_norm_grads(c, part, {{c.access.grad(c.index, wt), h}, {c.access.grad(c.index, bt), h}}, beta, kFamily);
  }

  // out (N, h) = residual + x W^T + b, x of `in` features here (row-parallel under tp).
  void row_parallel_forward(const BlockCall& c, Buffer& out, const float* residual, const float* x, const float* w,
                            const float* b, int in) const {
    residual_linear_forward(c, tp_, out.data(), residual, x, w, b, tokens(c.rows), in, s_.hidden, kFamily);
  }
  void column_parallel_input_grad(const BlockCall& c, Buffer& dx) const {
    transformer::column_parallel_input_grad(c, tp_, dx, kFamily);
  }

  // torch's math attention multiplies the probabilities by v reshaped to (B·heads, T,
  // hd): a view of the qkv output when B or heads is 1 (the two dimensions merge), a
  // copy otherwise. Then qkv is what is saved (3a bytes) instead of a copy of v (a).
  // Under tensor parallelism: the rank's heads (H/T) and its qkv (N, 3h/T).
  bool v_is_view(int rows) const { return rows == 1 || as_.heads == 1; }
  MathOperand v_operand(int rows, const std::vector<Buffer>& held) const {
    if (!v_is_view(rows)) return math_attention(as_, rows).head_major(held[kV].data());
    // One sequence: head j starts j·hd columns in; one head: sequence b starts b·T rows in.
    const i64 stride = rows == 1 ? s_.head_dim : static_cast<i64>(s_.seq) * 3 * hl_;
    return {held[kQkv].data() + 2 * hl_, 3 * hl_, stride};
  }

  AttentionArgs attention(int rows, const float* qkv) const {
    return attention_args(as_, rows, qkv, qkv + hl_, qkv + 2 * hl_, 3 * hl_, 3 * hl_);
  }

  // Flash: dq, dk, dv into one (N, 3h) gradient laid out as qkv, from the saved qkv,
  // output and lse (all three released and freed); frees dattn.
  // With keep_out (the split's B) y stays, still saved by c_proj for W.
  // --checkpoint attention: the flash forward runs again first (torch's checkpoint around
  // SDPA, when its backward unpacks a save), making a new output and log-sum-exp
  // (activation, saved) that its backward reads; freed with the rest.
  Buffer flash_backward(const BlockCall& c, Buffer& dattn, std::vector<Buffer>& held, bool keep_out = false) const {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = hl_;
    Buffer rerun;  // the re-run's output
    if (recompute_attention_) {
      rerun = be.alloc(Category::activation, floats(n * h));
      held[kLse] = be.alloc(Category::activation, floats(static_cast<i64>(c.rows) * as_.heads * s_.seq));
      be.flash_attention_forward(attention(c.rows, held[kQkv].data()), rerun.data(), hl_, held[kLse].data());
      c.saved.save(rerun.data(), static_cast<i64>(rerun.bytes()));
      c.saved.save(held[kLse].data(), static_cast<i64>(held[kLse].bytes()));
    }
    Buffer dqkv = be.alloc(Category::temp, floats(3 * n * h));
    be.flash_attention_backward(attention(c.rows, held[kQkv].data()), rerun ? rerun.data() : held[kAttnOut].data(),
                                hl_, dattn.data(), held[kLse].data(), dqkv.data(), dqkv.data() + h,
                                dqkv.data() + 2 * h);
    dattn.reset();
    for (int j : {kQkv, kAttnOut, kLse}) {
      c.saved.release(held[j].data());
      if (j != kAttnOut || !keep_out) held[j].reset();
    }
    if (rerun) drop_saved(c.saved, rerun);
    return dqkv;
  }

  // Math: through the saved q, k, probabilities and v (released and freed; y, which
  // only c_proj saved, freed too); frees dattn. Returns the (N, 3h) gradient.
  Buffer math_backward(const BlockCall& c, Buffer& dattn, std::vector<Buffer>& held, bool keep_out = false) const {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = hl_;
    if (!keep_out) held[kAttnOut].reset();
    const int v_held = v_is_view(c.rows) ? static_cast<int>(kQkv) : static_cast<int>(kV);
    HeadGrads g = math_attention_backward(be, c.saved, math_attention(as_, c.rows), dattn, held[kQ], held[kK],
                                          held[kProbs], v_operand(c.rows, held), held[v_held]);
    // back to token-major, laid out as qkv
    Buffer dqkv = be.alloc(Category::temp, floats(3 * n * h));
    int at = 0;
    for (const Buffer* d : {&g.dq, &g.dk, &g.dv})
      be.permute_heads(dqkv.data() + h * at++, d->data(), 3 * hl_, c.rows, s_.seq, as_.heads, s_.head_dim, false);
    return dqkv;
  }

  std::string name_;
  TensorParallel tp_;
  int hl_;                // the attention's width on this rank: h/T (q, k, v, y each)
  int fl_;                // the MLP's: f/T
  TransformerShape as_;   // the attention's shape on this rank (H/T heads)
  std::vector<ParamSpec> params_;
  bool recompute_attention_ = false;  // --checkpoint attention
  WeightRef ln_weight_, attn_weight_, proj_weight_, ln2_weight_, fc_weight_, mlp_proj_weight_;
};

// ---- the final block: ln_f and the head, whose weight is the embedding's wte ----
class FinalBlock final : public FinalNormHead {
 public:
  FinalBlock(const TransformerShape& s, const TensorParallel& tp)
      : FinalNormHead(s, kFamily, /*norm_stats: mean, rstd*/ 2, tp) {
    params_ = {{"transformer.ln_f.weight", {s.hidden}, 0.0f, 1.0f}, {"transformer.ln_f.bias", {s.hidden}}};
  }
  const std::vector<ParamSpec>& params() const override { return params_; }
  TensorRef tied_param() const override { return {kEmbeddingBlock, kWte}; }

 private:
  void norm_forward(const BlockCall& c, float* y, const std::vector<Buffer>& st, const float* x,
                    i64 n) const override {
    c.backend.layer_norm_forward(y, st[0].data(), st[1].data(), x, param(c, 0), param(c, 1), static_cast<int>(n),
                                 s_.hidden, s_.norm_eps);
  }
  void norm_backward(const BlockCall& c, float* dx, const float* dy, const float* x, const std::vector<Buffer>& st,
                     i64 n, float beta, float* into) const override {
    c.backend.layer_norm_backward(dx, into ? into : grad(c, 0), into ? into + s_.hidden : grad(c, 1), dy, x,
                                  st[0].data(), st[1].data(), param(c, 0), static_cast<int>(n), s_.hidden, beta);
  }
  void norm_input_grad(const BlockCall& c, float* dx, const float* dy, const float* x, const std::vector<Buffer>& st,
                       i64 n) const override {
    layer_norm_input_grad(c.backend, dx, dy, x, st[0].data(), st[1].data(), param(c, 0), n, s_.hidden);
  }
  void norm_weight_grad(const BlockCall& c, const float* dy, const float* x, const std::vector<Buffer>& st, i64 n,
                        float beta) const override {
    layer_norm_weight_grad(c.backend, grad(c, 0), grad(c, 1), dy, x, st[0].data(), st[1].data(), param(c, 0), n,
                           s_.hidden, beta);
  }
  // The tied head reads and writes the embedding block's wte.
  const float* head_weight(const BlockCall& c) const override { return c.access.param(kEmbeddingBlock, kWte); }
  float* head_grad(const BlockCall& c) const override { return c.access.grad(kEmbeddingBlock, kWte); }
  TensorRef head_tensor(const BlockCall& /*c*/) const override { return {kEmbeddingBlock, kWte}; }
  // A reference of its own: the table's gathered copy may move between forward and backward
  // (DeepSpeed's stage 3 gathers it again for the head's backward).
  const void* head_key(const BlockCall& /*c*/) const override { return head_ref_(); }
  static const float* param(const BlockCall& c, int t) { return c.access.param(c.index, t); }
  static float* grad(const BlockCall& c, int t) { return c.access.grad(c.index, t); }

  std::vector<ParamSpec> params_;
  WeightRef head_ref_;
};

}  // namespace

std::unique_ptr<Model> make_gpt2(const ModelConfig& m, const TensorParallel& split) {
  TensorParallel tp = split;
  tp.sequence = m.sequence_parallel && tp.size > 1;
  TransformerShape s = m.transformer;
  s.tied_embeddings = true;  // nanoGPT's head is the token embedding
  if (s.head_dim == 0 && s.heads > 0) s.head_dim = s.hidden / s.heads;
  if (s.ffn == 0) s.ffn = 4 * s.hidden;
  if (s.kv_heads == 0) s.kv_heads = s.heads;
  if (s.positions == 0) s.positions = s.seq;
  SHARDSCOPE_REQUIRE(s.layers > 0 && s.hidden > 0 && s.heads > 0 && s.hidden % s.heads == 0 && s.vocab > 0 &&
                         s.seq > 0 && s.seq <= s.positions && s.kv_heads == s.heads &&
                         s.head_dim * s.heads == s.hidden,
                     "gpt2: an unchecked transformer shape");
  SHARDSCOPE_REQUIRE(tp.size == 1 || (!m.param_bf16 && !(m.autocast && tp.sequence) && s.heads % tp.size == 0 &&
                                      s.ffn % tp.size == 0 && s.vocab % tp.size == 0),
                     "gpt2: an unchecked tensor-parallel shape");
  SHARDSCOPE_REQUIRE(!tp.sequence || s.seq % tp.size == 0, "gpt2: an unchecked sequence-parallel shape");
  if (m.autocast) return make_gpt2_autocast(s, tp);
  if (m.param_bf16) return make_gpt2_param_bf16(s);
  std::vector<std::unique_ptr<Block>> blocks;
  blocks.push_back(make_embedding_block(s, {"transformer.wte.weight", "transformer.wpe.weight"}, kFamily, tp));
  for (int i = 0; i < s.layers; ++i) blocks.push_back(std::make_unique<TransformerBlock>(s, i, tp));
  blocks.push_back(std::make_unique<FinalBlock>(s, tp));
  return std::make_unique<Model>(std::move(blocks), make_cross_entropy(s, kFamily, tp));
}

}  // namespace shardscope
