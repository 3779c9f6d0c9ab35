// Closed forms of zero3 under --engine deepspeed (DeepSpeed's stage 3) for GPT-2 and Llama
// in fp32, and GPT-2 in bf16 (deepspeed_forms.hpp; the step: harness/strategies/
// deepspeed_zero3.hpp; docs/formulas.md, "Stage 3, a transformer's run" and "Stage 3 in
// bf16, GPT-2's run").
//
// DeepSpeed gathers each nn.Module with parameters of its own on its own: GPT-2's wte and
// wpe, each block's ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc and mlp.c_proj, ln_f and
// the head (wte's tensor); Llama's embed_tokens, each layer's input_layernorm, q, k, v and
// o projections, post_attention_layernorm, gate, up and down projections, the final norm
// and the head (lm_head, or embed_tokens' tensor when tied). A module's tensors above the
// persistence threshold are gathered (Ds3Gather) when it begins, in forward and again in
// backward, and released when it ends; in backward each of its tensors' gradients (4 n_t,
// grad_unsharded) is made when it begins and, once the tensor has no use left in the
// backward, copied into the bucket (last tensor first; a bucket that would overflow is
// reduced first, beside its zero tensors) and freed when it ends. The embeddings are never
// released in backward (their ids take no gradient): they stay gathered to the last
// bucket's reduction. The tied table's gradient lives from the head's backward to the
// embedding's.
//
// The activations and temporaries at each instant are the family's (gpt2_forms.cpp,
// llama_forms.cpp, with the symbols of transformer_step.hpp: N = B·T, X = 16N, a = 4Nh,
// F = 4Nf, Λ = 4NV, A the attention's save; GPT-2's K and Llama's Q = 4N·H·d, C = 4N·K·d);
// the walk below lists every instant at which a module is gathered or its gradients live,
// beside the instants of the attention's backward (nothing gathered, but the tied
// gradient); every other instant of a step lies below one of these (the families' forms
// say so of the forward's attention, and the loss's and the final block's are listed).
//
// bf16 (DeepSpeed's bf16: GPT-2's bf16 module, gpt2_param_bf16.cpp): e = 2 bytes an element
// of every partition, gather, gradient, bucket and zero tensor (4 in fp32); the master
// weights 4C (category master) in place of fp32's second copy; the activations the bf16
// module's (param_bf16_forms.hpp: b = 2Nh, p = 2Nf, Λ' = 2NV, the norms' statistics bf16,
// the attention's saves H = 4b + A flash, 7b + A math; total_weight 2 B); the optimizer's
// flattened gradient 2C (bf16) beside its fp32 cast 4C.
#include <functional>
#include <string>
#include <vector>

#include "harness/model/models.hpp"
#include "harness/predict/deepspeed_forms.hpp"
#include "harness/predict/gpt2_forms.hpp"
#include "harness/predict/llama_forms.hpp"
#include "harness/predict/param_bf16_forms.hpp"
#include "harness/predict/transformer_step.hpp"
#include "harness/strategies/deepspeed_layout.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

// The step's instants with what DeepSpeed holds at each: the module gathered now, the
// embeddings kept gathered, the gradients alive (grad_unsharded), a gather's flat buffer
// (comm) and a reduction's zero tensors (grad); the first of the largest kept.
class Stage3Walk {
 public:
  // e: bytes an element of the gathers, gradients and zero tensors (4 fp32, 2 bf16).
  Stage3Walk(const Ds3Layout& l, int world, int rank, i64 cap, i64 e)
      : l_(l), world_(world), rank_(rank), cap_(cap), e_(e), held_(l.elems.size(), 0),
        kept_by_rerun_(l.elems.size(), 0), grad_(l.elems.size(), false), uses_(l.elems.size(), 0) {}

  void place(Phase phase, const std::string& where) {
    phase_ = phase;
    where_ = where;
  }
  // An instant: temp and activation beyond the resting bytes.
  void at(i64 temp, i64 act, i64 comm = 0, i64 zeros = 0) {
    CategoryBytes b;
    b[Category::temp] = temp;
    b[Category::activation] = act;
    b[Category::param_unsharded] = gathered_;
    b[Category::grad_unsharded] = grads_;
    b[Category::comm] = comm;
    b[Category::grad] = zeros;
    peak.consider(b, phase_, where_);
  }

  // A module's pre-forward hook: its tensors gathered (an instant when any are).
  void forward_begin(const std::vector<int>& m, i64 temp, i64 act) {
    gather(m, temp, act);
    if (rerun_) return;  // a re-run's use is met by no backward of its own
    for (int t : m) ++uses_[t];
  }
  // Its post-forward hook: released. In a re-run the first-backward module has none (the
  // re-run stops inside it), and every other module's gathered bytes stay, kept by the
  // re-run's saves to its backward (whose pre-backward hook gathers it again).
  void forward_end(const std::vector<int>& m) {
    if (!rerun_) {
      release(m);
    } else if (m != entry_) {
      for (int t : m) {
        kept_by_rerun_[t] += held_[t];
        held_[t] = 0;
      }
    }
  }
  // --checkpoint: a wrapped block's first-backward module gathered by its pre-backward hook
  // (temp and act as they are then), then its re-run (the family's forward) until end_rerun.
  void begin_rerun(const std::vector<int>& entry, i64 temp, i64 act) {
    gather(entry, temp, act);
    entry_ = entry;
    rerun_ = true;
  }
  void end_rerun() { rerun_ = false; }
  // Its pre-backward hook: gathered again, then the gradients of its tensors that have none.
  void backward_begin(const std::vector<int>& m, i64 temp, i64 act) {
    gather(m, temp, act);
    bool made = false;
    for (int t : m)
      if (!grad_[t]) {
        grad_[t] = true;
        grads_ += e_ * l_.elems[t];
        made = true;
      }
    if (made) at(temp, act);
  }
  // Once its backward is done (temp and act as they are then): each gradient with no use
  // left copied into the bucket, last tensor first, a full bucket reduced first; then the
  // module released, or kept to the backward's end when its input takes no gradient.
  void backward_end(const std::vector<int>& m, i64 temp, i64 act, bool input_requires_grad) {
    for (int t : m) {  // its op's backward has run: a re-run's saves of its tensors go first
      gathered_ -= kept_by_rerun_[t];
      kept_by_rerun_[t] = 0;
    }
    for (auto it = m.rbegin(); it != m.rend(); ++it) {
      const int t = *it;
      if (--uses_[t] > 0) continue;
      if (used_ + l_.elems[t] > cap_ && used_ > 0) {
        at(temp, act, 0, zeros());
        bucket_.clear();
        used_ = 0;
      }
      bucket_.push_back(t);
      used_ += l_.elems[t];
      grad_[t] = false;
      grads_ -= e_ * l_.elems[t];
    }
    if (input_requires_grad)
      release(m);
    else
      kept_.insert(kept_.end(), m.begin(), m.end());
  }
  // After the backward (the batch freed): the last bucket's reduction beside the
  // embeddings still gathered, then those released.
  void epilogue() {
    place(Phase::communication, "-");
    if (used_ > 0) at(0, 0, 0, zeros());
    bucket_.clear();
    used_ = 0;
    release(kept_);
    kept_.clear();
  }

  DeepSpeedPeak peak;

 private:
  void gather(const std::vector<int>& m, i64 temp, i64 act) {
    std::vector<int> set;
    for (int t : m)
      if (!l_.persistent[t] && held_[t] == 0) set.push_back(t);
    const Ds3Gather g = ds3_gather(l_, set, world_, e_);
    if (g.held == 0) return;
    for (int t : set) held_[t] = set.size() == 1 ? g.held : e_ * l_.elems[t];
    gathered_ += g.held;
    at(temp, act, g.flat);
  }
  void release(const std::vector<int>& m) {
    for (int t : m) {
      gathered_ -= held_[t];
      held_[t] = 0;
    }
  }
  // The zero tensors the bucket's reduction holds: e·c_t for each tensor whose slice on
  // this rank is short of c_t.
  i64 zeros() const {
    i64 z = 0;
    for (int t : bucket_)
      if (l_.real(t, rank_) < l_.part[t]) z += e_ * l_.part[t];
    return z;
  }

  const Ds3Layout& l_;
  const int world_, rank_;
  const i64 cap_, e_;
  std::vector<i64> held_;  // per tensor: its gathered bytes (0: not gathered)
  std::vector<i64> kept_by_rerun_;  // per tensor: gathered bytes a re-run's saves keep
  std::vector<bool> grad_;
  std::vector<int> uses_;  // forward uses not yet met by a backward
  std::vector<int> bucket_, kept_;
  i64 gathered_ = 0, grads_ = 0, used_ = 0;
  bool rerun_ = false;
  std::vector<int> entry_;
  Phase phase_ = Phase::forward;
  std::string where_;
};

std::string layer(int b) { return "layer " + std::to_string(b); }

// One family's modules, in model tensor indices, and its activations at each instant.
struct Family {
  std::vector<int> tokens, positions;  // the embeddings (positions: GPT-2's wpe)
  std::vector<int> final_norm, head;
  // Block b's (1..L) instants through its modules in forward order, from S (the
  // activations below it, its input among them), and backward's per module from A4 (its
  // output freed, dy = a held). A re-run (rerun): the same instants with dy beside them,
  // its output temp.
  std::function<void(Stage3Walk&, int b, i64 S, bool rerun)> forward;
  std::function<void(Stage3Walk&, int b, i64 A4)> backward;
  // Block b's modules in forward order; the last is the first its backward reaches.
  std::function<std::vector<std::vector<int>>(int b)> block_modules;
  i64 base = 0, K = 0, final_held = 0;
  // The residual stream's (N, h) (a fp32, b bf16), the logits (Λ, Λ'), nll_loss's total_weight.
  i64 a = 0, lambda = 0, loss_weight = 4;
  // A stream no block saves (Llama's bf16 module: each norm saves its fp32 upcast): a block's
  // input is temp (stream bytes) through its forward, its output temp, K its saves alone.
  i64 stream = 0;
  std::vector<std::vector<int>> modules;  // every module once (the tied head's too)
  // The loss's instants from S (every save of the forward, the logits made) when it holds
  // more than the logits (Llama's bf16 module upcasts them); empty: the log-probabilities
  // and total_weight beside the logits, then dlogits (λ).
  std::function<void(Stage3Walk&, i64 S)> loss;
};

// GPT-2's modules (tensor indices): wte, wpe, each block's six (ln_1, c_attn, attn.c_proj,
// ln_2, c_fc, mlp.c_proj: weight and bias), ln_f, the tied head (wte).
constexpr int kGpt2PerBlock = 12, kGpt2FirstBlock = 2;
void gpt2_modules(Family& f, const TransformerShape& s) {
  f.tokens = {0};
  f.positions = {1};
  const int final_first = kGpt2FirstBlock + kGpt2PerBlock * s.layers;
  f.final_norm = {final_first, final_first + 1};
  f.head = {0};  // wte
  f.block_modules = [](int b) {
    std::vector<std::vector<int>> out;
    for (int i = 0; i < kGpt2PerBlock; i += 2) {
      const int t = kGpt2FirstBlock + kGpt2PerBlock * (b - 1) + i;
      out.push_back({t, t + 1});
    }
    return out;
  };
  f.modules = {f.tokens, f.positions, f.final_norm, f.head};
  for (int b = 1; b <= s.layers; ++b)
    for (const std::vector<int>& m : f.block_modules(b)) f.modules.push_back(m);
}
// Block b's (1..L) module i (0 ln_1, 2 c_attn, 4 attn.c_proj, 6 ln_2, 8 c_fc, 10 mlp.c_proj).
std::vector<int> gpt2_module(int b, int i) {
  const int t = kGpt2FirstBlock + kGpt2PerBlock * (b - 1) + i;
  return {t, t + 1};
}

Family gpt2_family(const ModelConfig& model) {
  const TransformerShape& s = model.transformer;
  const int batch = model.batch;
  const TokenSizes z = token_sizes(s, batch);
  const bool recompute_attention = model.checkpoint.attention();
  const StepBlocks blocks = gpt2_blocks(s, batch, recompute_attention);
  const i64 N = z.N, a = z.a, F = z.F, A = z.A, X = 16 * N, K = blocks.K;
  // --checkpoint attention: the attention's own save A not kept from forward to backward.
  const i64 R = recompute_attention ? A : 0;
  // Math's v: a copy (a), or with one sequence or one head a view of the saved qkv (3a).
  const bool view = batch == 1 || s.heads == 1;
  const i64 V = view ? 3 * a : a;
  const i64 att = (z.flash ? 4 * a + A : 3 * a + V + A) - R;  // the attention's saves
  Family f;
  gpt2_modules(f, s);
  f.base = blocks.base;
  f.K = K;
  f.final_held = blocks.final_held;
  f.a = a;
  f.lambda = z.lambda;
  const auto mod = gpt2_module;
  f.forward = [=](Stage3Walk& w, int b, i64 S, bool rerun) {
    const i64 Xd = rerun ? X + a : X;  // a re-run's dy beside the ids and target
    auto through = [&](int i, i64 temp, i64 act, i64 temp_out, i64 act_out) {
      w.forward_begin(mod(b, i), temp, act);
      w.at(temp_out, act_out);
      w.forward_end(mod(b, i));
    };
    through(0, Xd, S, Xd, S + 8 * N + a);                                 // ln_1: mean, rstd, output
    const bool qkv_saved = z.flash || view;                               // c_attn: qkv (3a)
    through(2, Xd, S + 8 * N + a, qkv_saved ? Xd : Xd + 3 * a, S + 8 * N + a + (qkv_saved ? 3 * a : 0));
    // --checkpoint attention, math: the probabilities beside the head-major output
    // (gpt2_forms.cpp's forward instant), no module gathered.
    if (R > 0 && !z.flash) w.at(Xd + a, S + 8 * N + 3 * a + V + A);
    const i64 S1 = S + 8 * N + a + att;                                   // after the attention
    through(4, Xd, S1, Xd, S1 + a);                                       // attn.c_proj: x_mid
    through(6, Xd, S1 + a, Xd, S1 + 2 * a + 8 * N);                       // ln_2
    through(8, Xd, S1 + 2 * a + 8 * N, Xd, S1 + 2 * a + 8 * N + F);       // c_fc; then GELU's F
    // mlp.c_proj: the output (a re-run's temp)
    through(10, Xd, S1 + 2 * a + 8 * N + 2 * F, rerun ? Xd + a : Xd, rerun ? S + K - a : S + K);
  };
  f.backward = [=](Stage3Walk& w, int b, i64 A4) {
    // mlp.c_proj: d gelu (F); GELU's output released
    w.backward_begin(mod(b, 10), X + a, A4);
    w.at(X + a + F, A4);
    w.backward_end(mod(b, 10), X + a + F, A4 - F, true);
    // c_fc (c_fc's output released): d ln_2 out (a); d gelu freed, ln_2's output released
    w.backward_begin(mod(b, 8), X + a + F, A4 - 2 * F);
    w.at(X + 2 * a + F, A4 - 2 * F);
    w.backward_end(mod(b, 8), X + 2 * a, A4 - 2 * F - a, true);
    // ln_2: d x_mid (a); d ln_2 out freed, x_mid, mean and rstd released
    w.backward_begin(mod(b, 6), X + 2 * a, A4 - 2 * F - a);
    w.at(X + 3 * a, A4 - 2 * F - a);
    // A8: with the attention's save (under --checkpoint attention once it is made again)
    const i64 A8 = A4 - 2 * F - 2 * a - 8 * N + R;
    w.backward_end(mod(b, 6), X + 2 * a, A8 - R, true);
    // attn.c_proj (dy freed by the residual): d attention output (a)
    w.backward_begin(mod(b, 4), X + a, A8 - R);
    w.at(X + 2 * a, A8 - R);
    w.backward_end(mod(b, 4), X + 2 * a, A8 - R, true);
    // the attention (no module): gpt2_forms.cpp's instants
    i64 A9 = 0;
    if (z.flash) {
      if (R > 0) {  // the flash forward again: its output, its lse
        w.at(X + 2 * a, A8 - R + a);
        w.at(X + 2 * a, A8 + a);
      }
      w.at(X + 5 * a, A8 + (R > 0 ? a : 0));  // d qkv
      A9 = A8 - 4 * a - A;
    } else {
      w.at(X + 3 * a, A8 - a - R);            // d out, head-major (y freed)
      if (R > 0) w.at(X + 2 * a, A8 - a);     // the probabilities made again (d out freed)
      w.at(X + 2 * a + A, A8 - a);            // d probabilities
      w.at(X + 3 * a + A, A8 - a);            // d v
      w.at(X + 3 * a + A, A8 - a - V - A);    // d q
      w.at(X + 4 * a + A, A8 - a - V - A);    // d k
      w.at(X + 7 * a, A8 - 3 * a - V - A);    // d qkv
      A9 = A8 - 3 * a - V - A;
    }
    // c_attn: d ln_1 out (a); dqkv freed, ln_1's output released
    w.backward_begin(mod(b, 2), X + 4 * a, A9);
    w.at(X + 5 * a, A9);
    w.backward_end(mod(b, 2), X + 2 * a, A9 - a, true);
    // ln_1: dx (a); d ln_1 out freed, mean and rstd released
    w.backward_begin(mod(b, 0), X + 2 * a, A9 - a);
    w.at(X + 3 * a, A9 - a);
    w.backward_end(mod(b, 0), X + 2 * a, A9 - a - 8 * N, true);
  };
  return f;
}

// Llama's modules (tensor indices): embed_tokens, each layer's nine (input_layernorm, q, k,
// v, o, post_attention_layernorm, gate, up, down), the final norm, the head (lm_head, or
// embed_tokens' tensor when tied); block_modules in forward order.
constexpr int kLlamaFirstBlock = 1;
std::vector<int> llama_module(const LlamaLayerTensors& t, int b, std::initializer_list<int> in_block) {
  const int per_block = static_cast<int>(t.params.size());
  std::vector<int> out;
  for (int i : in_block)
    if (i >= 0) out.push_back(kLlamaFirstBlock + per_block * (b - 1) + i);
  return out;
}
void llama_modules(Family& f, const TransformerShape& s, const LlamaLayerTensors& t) {
  const int final_first = kLlamaFirstBlock + static_cast<int>(t.params.size()) * s.layers;
  f.tokens = {0};
  f.final_norm = {final_first};
  f.head = s.tied_embeddings ? std::vector<int>{0} : std::vector<int>{final_first + 1};
  f.block_modules = [t](int b) {
    auto mod = [&](std::initializer_list<int> in_block) { return llama_module(t, b, in_block); };
    return std::vector<std::vector<int>>{mod({t.norm1}), mod({t.qW, t.qB}), mod({t.kW, t.kB}),
                                         mod({t.vW, t.vB}), mod({t.oW, t.oB}), mod({t.norm2}),
                                         mod({t.gateW}), mod({t.upW}), mod({t.downW})};
  };
  f.modules = {f.tokens, f.final_norm, f.head};
  for (int b = 1; b <= s.layers; ++b)
    for (const std::vector<int>& m : f.block_modules(b)) f.modules.push_back(m);
}

Family llama_family(const ModelConfig& model) {
  const TransformerShape& s = model.transformer;
  const TokenSizes z = token_sizes(s, model.batch);
  const bool recompute_attention = model.checkpoint.attention();
  const StepBlocks blocks = llama_blocks(s, model.batch, recompute_attention);
  const int d = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  const int kv_heads = s.kv_heads > 0 ? s.kv_heads : s.heads;
  const i64 N = z.N, a = z.a, F = z.F, A = z.A, X = 16 * N, K = blocks.K;
  const i64 Q = 4 * N * s.heads * d, C = 4 * N * kv_heads * d;
  // --checkpoint attention: the attention's own save A not kept from forward to backward.
  const i64 R = recompute_attention ? A : 0;
  const i64 att = (z.flash ? 2 * Q + 2 * C + A : 4 * Q + A) - R;  // the attention's saves
  const LlamaLayerTensors t = llama_layer_tensors(s, 0);
  Family f;
  llama_modules(f, s, t);
  f.base = blocks.base;
  f.K = K;
  f.final_held = blocks.final_held;
  f.a = a;
  f.lambda = z.lambda;
  auto mod = [=](int b, std::initializer_list<int> in_block) { return llama_module(t, b, in_block); };
  f.forward = [=](Stage3Walk& w, int b, i64 S, bool rerun) {
    const i64 Xd = rerun ? X + a : X;  // a re-run's dy beside the ids and target
    auto through = [&](const std::vector<int>& m, i64 temp, i64 act, i64 temp_out, i64 act_out) {
      w.forward_begin(m, temp, act);
      w.at(temp_out, act_out);
      w.forward_end(m);
    };
    const i64 P0 = S + 4 * N + a;
    through(mod(b, {t.norm1}), Xd, S, Xd, P0);  // rstd, output
    // q, k, v (flash saves them; math's are temp until copied head-major)
    const i64 tq = z.flash ? 0 : 1, aq = z.flash ? 1 : 0;
    through(mod(b, {t.qW, t.qB}), Xd, P0, Xd + tq * Q, P0 + aq * Q);
    through(mod(b, {t.kW, t.kB}), Xd + tq * Q, P0 + aq * Q, Xd + tq * (Q + C), P0 + aq * (Q + C));
    through(mod(b, {t.vW, t.vB}), Xd + tq * (Q + C), P0 + aq * (Q + C), Xd + tq * (Q + 2 * C),
            P0 + aq * (Q + 2 * C));
    // Math's attention, no module gathered (llama_forms.cpp's instants, where a re-run's dy
    // or --checkpoint attention can lift them): q, k, v token-major beside their head-major
    // copies; the probabilities beside the head-major output; the token-major output.
    if (!z.flash && (rerun || R > 0)) {
      w.at(Xd + Q + 2 * C, P0 + 3 * Q);
      w.at(Xd + Q, P0 + 3 * Q + A);
      w.at(Xd + Q, P0 + 4 * Q + A - R);
    }
    const i64 S1 = P0 + att;  // after the attention
    through(mod(b, {t.oW, t.oB}), Xd, S1, Xd, S1 + a);                             // x_mid
    through(mod(b, {t.norm2}), Xd, S1 + a, Xd, S1 + 2 * a + 4 * N);                // rstd, y2
    through(mod(b, {t.gateW}), Xd, S1 + 2 * a + 4 * N, Xd, S1 + 2 * a + 4 * N + F);  // then SiLU's F
    through(mod(b, {t.upW}), Xd, S1 + 2 * a + 4 * N + 2 * F, Xd, S1 + 2 * a + 4 * N + 3 * F);  // then the product
    // down: the output (a re-run's temp)
    through(mod(b, {t.downW}), Xd, S1 + 2 * a + 4 * N + 4 * F, rerun ? Xd + a : Xd, rerun ? S + K - a : S + K);
  };
  f.backward = [=](Stage3Walk& w, int b, i64 A4) {
    // down: d product (F); the product released
    w.backward_begin(mod(b, {t.downW}), X + a, A4);
    w.at(X + a + F, A4);
    w.backward_end(mod(b, {t.downW}), X + a + F, A4 - F, true);
    // the product's factors (no module): d up (F); SiLU's, up's and gate's outputs released
    w.at(X + a + 2 * F, A4 - F);
    // up: d y2 (a); d up freed
    w.backward_begin(mod(b, {t.upW}), X + a + 2 * F, A4 - 4 * F);
    w.at(X + 2 * a + 2 * F, A4 - 4 * F);
    w.backward_end(mod(b, {t.upW}), X + 2 * a + F, A4 - 4 * F, true);
    // gate: adds onto d y2; d gate freed, y2 released
    w.backward_begin(mod(b, {t.gateW}), X + 2 * a + F, A4 - 4 * F);
    w.backward_end(mod(b, {t.gateW}), X + 2 * a, A4 - 4 * F - a, true);
    // post_attention_layernorm: d x_mid (a); d y2 freed, x_mid and rstd released
    w.backward_begin(mod(b, {t.norm2}), X + 2 * a, A4 - 4 * F - a);
    w.at(X + 3 * a, A4 - 4 * F - a);
    // A5: with the attention's save (under --checkpoint attention once it is made again)
    const i64 A5 = A4 - 4 * F - 2 * a - 4 * N + R;
    w.backward_end(mod(b, {t.norm2}), X + 2 * a, A5 - R, true);
    // o (dy freed by the residual): d out (Q)
    w.backward_begin(mod(b, {t.oW, t.oB}), X + a, A5 - R);
    w.at(X + a + Q, A5 - R);
    w.backward_end(mod(b, {t.oW, t.oB}), X + a + Q, A5 - R, true);
    // the attention (no module): llama_forms.cpp's instants
    i64 A6 = 0;
    if (z.flash) {
      if (R > 0) {  // the flash forward again: its output, its lse
        w.at(X + a + Q, A5 - R + Q);
        w.at(X + a + Q, A5 + Q);
      }
      w.at(X + a + 2 * Q + 2 * C, A5 + (R > 0 ? Q : 0));  // d q, k, v
      A6 = A5 - 2 * Q - 2 * C - A;
    } else {
      const i64 Am = A5 - Q;  // out, which only o_proj saved, freed
      w.at(X + a + 2 * Q, Am - R);          // d out, head-major
      if (R > 0) w.at(X + a + Q, Am);       // the probabilities made again (d out freed)
      w.at(X + a + Q + A, Am);              // d probabilities
      w.at(X + a + 2 * Q + A, Am);          // d v (expanded)
      w.at(X + a + 2 * Q + A, Am - Q - A);  // d q
      w.at(X + a + 3 * Q + A, Am - Q - A);  // d k (expanded)
      A6 = Am - 3 * Q - A;
      w.at(X + a + 4 * Q + 2 * C, A6);      // d q, k, v token-major
    }
    // v: d y1 (a); then k and q add onto it; dq, dk, dv freed, y1 released
    const i64 T6 = X + a + Q + 2 * C;
    w.backward_begin(mod(b, {t.vW, t.vB}), T6, A6);
    w.at(T6 + a, A6);
    w.backward_end(mod(b, {t.vW, t.vB}), T6 + a, A6, true);
    w.backward_begin(mod(b, {t.kW, t.kB}), T6 + a, A6);
    w.backward_end(mod(b, {t.kW, t.kB}), T6 + a, A6, true);
    w.backward_begin(mod(b, {t.qW, t.qB}), T6 + a, A6);
    w.backward_end(mod(b, {t.qW, t.qB}), X + 2 * a, A6 - a, true);
    // input_layernorm: dx (a); d y1 freed, rstd released
    w.backward_begin(mod(b, {t.norm1}), X + 2 * a, A6 - a);
    w.at(X + 3 * a, A6 - a);
    w.backward_end(mod(b, {t.norm1}), X + 2 * a, A6 - a - 4 * N, true);
  };
  return f;
}


// GPT-2's bf16 module (gpt2_param_bf16.cpp) module by module: param_bf16_forms.hpp's block
// instants with each module's gather and gradients between them.
Family gpt2_bf16_family(const ModelConfig& model) {
  const TransformerShape& s = model.transformer;
  const TokenSizes z = token_sizes(s, model.batch);
  const bool ra = model.checkpoint.attention();
  const StepBlocks blocks = gpt2_param_bf16_blocks(s, model.batch, model.checkpoint);
  const i64 N = z.N, b = z.a / 2, p = z.F / 2, A = z.A, X = 16 * N, K = blocks.K;
  const bool flash = z.flash;
  // The attention's saves (qkv, out, lse | q, k, v, probs, out); --checkpoint attention: its
  // checkpoint's save qkv and c_proj's y alone, flash and math.
  const i64 H = ra ? 4 * b : flash ? 4 * b + A : 7 * b + A;
  Family f;
  gpt2_modules(f, s);
  f.base = blocks.base;
  f.K = K;
  f.final_held = blocks.final_held;
  f.a = b;
  f.lambda = z.lambda / 2;
  f.loss_weight = 2;
  const auto mod = gpt2_module;
  f.forward = [=](Stage3Walk& w, int blk, i64 S, bool rerun) {
    const i64 Xd = rerun ? X + b : X;  // a re-run's dy beside the ids and target
    auto through = [&](int i, i64 temp, i64 act, i64 temp_out, i64 act_out) {
      w.forward_begin(mod(blk, i), temp, act);
      w.at(temp_out, act_out);
      w.forward_end(mod(blk, i));
    };
    through(0, Xd, S, Xd, S + 4 * N + b);                                       // ln_1: mean, rstd, output
    const bool saved_qkv = flash || ra;  // qkv an activation (flash's save, or the checkpoint's)
    through(2, Xd, S + 4 * N + b, saved_qkv ? Xd : Xd + 3 * b, S + 4 * N + b + (saved_qkv ? 3 * b : 0));  // c_attn
    if (ra && !flash) {  // math's core under its checkpoint (no module): param_bf16_forms.cpp's instants
      const i64 Q = S + 4 * N + 4 * b;
      w.at(X + 8 * b, Q + A);
      w.at(X + 8 * b, Q + 2 * b);
      w.at(X + 6 * b, Q + 3 * b);
    }
    const i64 S1 = S + 4 * N + b + H;                                           // after the attention
    through(4, Xd, S1, Xd, S1 + b);                                             // attn.c_proj: x_mid
    through(6, Xd, S1 + b, Xd, S1 + 2 * b + 4 * N);                             // ln_2
    through(8, Xd, S1 + 2 * b + 4 * N, Xd, S1 + 2 * b + 4 * N + p);             // c_fc; then GELU's p
    // mlp.c_proj: the output (a re-run's temp)
    through(10, Xd, S1 + 2 * b + 4 * N + 2 * p, rerun ? Xd + b : Xd, rerun ? S + K - b : S + K);
  };
  f.backward = [=](Stage3Walk& w, int blk, i64 A4) {
    // mlp.c_proj: d gelu (p); GELU's output released
    w.backward_begin(mod(blk, 10), X + b, A4);
    w.at(X + b + p, A4);
    w.backward_end(mod(blk, 10), X + b + p, A4 - p, true);
    // c_fc (its output released): d ln_2 out (b); d gelu freed, ln_2's output released
    w.backward_begin(mod(blk, 8), X + b + p, A4 - 2 * p);
    w.at(X + 2 * b + p, A4 - 2 * p);
    w.backward_end(mod(blk, 8), X + 2 * b, A4 - 2 * p - b, true);
    // ln_2: d x_mid (b); d ln_2 out freed, x_mid, mean and rstd released
    w.backward_begin(mod(blk, 6), X + 2 * b, A4 - 2 * p - b);
    w.at(X + 3 * b, A4 - 2 * p - b);
    const i64 R = A4 - 2 * p - 2 * b - 4 * N;  // S + 4N + b + H
    w.backward_end(mod(blk, 6), X + 2 * b, R, true);
    // attn.c_proj (dy freed by the residual): d y (b)
    w.backward_begin(mod(blk, 4), X + b, R);
    w.at(X + 2 * b, R);
    w.backward_end(mod(blk, 4), X + 2 * b, R, true);
    // the attention (no module): param_bf16_forms.cpp's instants
    const i64 low = R - H;  // S + 4N + b: ln_1's statistics and output
    if (ra && flash) {  // --checkpoint attention: y freed, the core re-run on the saved qkv
      w.at(X + 2 * b, R - b + A);  // the re-run's log-sum-exp
      w.at(X + 2 * b, R + A);      // and its bf16 output
      w.at(X + 5 * b, R + A);      // d qkv
    } else if (ra) {
      const i64 Rq = R - b;                // qkv held
      w.at(X + 4 * b, Rq);                 // d y's fp32 upcast
      w.at(X + 3 * b, Rq + 6 * b);         // q, k, v again, fp32 head-major (d y freed)
      w.at(X + 5 * b, Rq + 6 * b);         // d out head-major
      w.at(X + 3 * b, Rq + 6 * b + A);     // the probabilities again (d out token-major freed)
      w.at(X + 3 * b + A, Rq + 6 * b + A);  // dP
      w.at(X + 5 * b + A, Rq + 6 * b + A);  // dv
      w.at(X + 5 * b + A, Rq + 4 * b);      // dq (v and the probabilities released)
      w.at(X + 7 * b + A, Rq + 4 * b);      // dk
      w.at(X + 10 * b, low);                // d qkv (q, k and the checkpoint's qkv released)
    } else if (flash) {
      w.at(X + 5 * b, R);  // d qkv
    } else {
      w.at(X + 4 * b, R - b);            // the output released; d y's fp32 upcast
      w.at(X + 5 * b, R - b);            // d out, head-major
      w.at(X + 3 * b + A, R - b);        // d probabilities
      w.at(X + 5 * b + A, R - b);        // d v
      w.at(X + 5 * b + A, low + 4 * b);  // v and the probabilities released; d q
      w.at(X + 7 * b + A, low + 4 * b);  // d k
      w.at(X + 10 * b, low);             // d qkv (bf16) beside d q, d k, d v
    }
    // c_attn: d ln_1 out (b) beside d qkv; d qkv freed, ln_1's output released
    w.backward_begin(mod(blk, 2), X + 4 * b, low);
    w.at(X + 5 * b, low);
    w.backward_end(mod(blk, 2), X + 2 * b, low - b, true);
    // ln_1: dx (b); d ln_1 out freed, mean and rstd released
    w.backward_begin(mod(blk, 0), X + 2 * b, low - b);
    w.at(X + 3 * b, low - b);
    w.backward_end(mod(blk, 0), X + 2 * b, low - b - 4 * N, true);
  };
  return f;
}

// Llama's bf16 module (llama_param_bf16.cpp: Hugging Face's module cast to bf16) module by
// module: param_bf16_forms.hpp's layer instants with each module's gather and gradients
// between them. No block saves the bf16 stream: a layer's input is temp (b) through its
// forward, its output temp too (stream = b), and a layer's backward starts from its saves
// alone (A4 = S + sv).
Family llama_bf16_family(const ModelConfig& model) {
  const TransformerShape& s = model.transformer;
  const TokenSizes z = token_sizes(s, model.batch);
  const StepBlocks blocks = llama_param_bf16_blocks(s, model.batch, model.checkpoint);
  const int d = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  const int kv_heads = s.kv_heads > 0 ? s.kv_heads : s.heads;
  const i64 N = z.N, b = z.a / 2, p = z.F / 2, A = z.A, X = 16 * N, sv = blocks.K;
  const i64 q2 = 2 * N * s.heads * d, c2 = 2 * N * kv_heads * d, Q = 2 * q2;
  const i64 lam = z.lambda, lam2 = z.lambda / 2;  // the fp32 log-probabilities, the bf16 logits
  const bool flash = z.flash;
  // The attention's saves; --checkpoint attention: its own save A not kept (flash's lse, math's
  // probabilities), made again in backward (R).
  const i64 R = model.checkpoint.attention() ? A : 0;
  const i64 H = (flash ? 2 * q2 + 2 * c2 + A : 3 * Q + A + q2) - R;
  const LlamaLayerTensors t = llama_layer_tensors(s, 0);
  Family f;
  llama_modules(f, s, t);
  f.base = 0;
  f.K = sv;
  f.final_held = blocks.final_held;
  f.a = b;
  f.lambda = lam2;
  f.stream = b;
  const auto mod = [=](int blk, std::initializer_list<int> in_block) { return llama_module(t, blk, in_block); };
  const CheckpointPolicy ck = model.checkpoint;
  const int L = s.layers;
  f.forward = [=](Stage3Walk& w, int blk, i64 S, bool rerun) {
    // --checkpoint (llama_param_bf16_forms.cpp's forward_block and recompute): a wrapped
    // layer's input is its checkpoint's save (activation, b), else temp; its output an
    // activation when the next layer is wrapped (that one's save), else temp; a re-run has dy
    // (b) beside its instants and its output temp.
    const bool wrapped = ck.wraps(blk - 1), next_wrapped = blk < L && ck.wraps(blk);
    const i64 T0 = X + (rerun || !wrapped ? b : 0);  // the ids, the target and the input (a re-run's dy)
    S += wrapped ? b : 0;
    const i64 out_t = rerun || !next_wrapped ? b : 0, out_a = b - out_t;
    auto through = [&](const std::vector<int>& m, i64 temp, i64 act, i64 temp_out, i64 act_out) {
      w.forward_begin(m, temp, act);
      w.at(temp_out, act_out);
      w.forward_end(m);
    };
    const i64 n1 = S + 3 * b + 4 * N;
    through(mod(blk, {t.norm1}), T0, S, T0, n1);  // the fp32 upcast 2b, rstd 4N, output b
    const i64 tq = flash ? 0 : 1, aq = flash ? 1 : 0;  // q, k, v: flash saves them, math's are temp
    through(mod(blk, {t.qW, t.qB}), T0, n1, T0 + tq * q2, n1 + aq * q2);
    through(mod(blk, {t.kW, t.kB}), T0 + tq * q2, n1 + aq * q2, T0 + tq * (q2 + c2), n1 + aq * (q2 + c2));
    through(mod(blk, {t.vW, t.vB}), T0 + tq * (q2 + c2), n1 + aq * (q2 + c2), T0 + tq * (q2 + 2 * c2),
            n1 + aq * (q2 + 2 * c2));
    // the attention (no module): param_bf16_forms.hpp's instants (flash's lse freed under R)
    if (flash && R > 0) w.at(T0, n1 + 2 * q2 + 2 * c2 + A);
    if (!flash) {
      w.at(T0 + q2 + 2 * c2, n1 + 3 * Q);
      if (R > 0) w.at(T0 + Q, n1 + 3 * Q + A);  // the probabilities, then freed
      w.at(T0 + Q, n1 + 3 * Q + A - R + Q);
      w.at(T0, n1 + 3 * Q + A - R + Q + q2);
    }
    const i64 S1 = n1 + H;
    through(mod(blk, {t.oW, t.oB}), T0, S1, T0 + b, S1);  // x_mid (temp)
    const i64 S2 = S1 + 3 * b + 4 * N;
    through(mod(blk, {t.norm2}), T0 + b, S1, T0 + b, S2);
    through(mod(blk, {t.gateW}), T0 + b, S2, T0 + b, S2 + p);          // then SiLU's p
    through(mod(blk, {t.upW}), T0 + b, S2 + 2 * p, T0 + b, S2 + 3 * p);  // then the product
    through(mod(blk, {t.downW}), T0 + b, S2 + 4 * p, T0 + b + out_t, S + sv + out_a);  // the output beside x_mid
  };
  f.backward = [=](Stage3Walk& w, int blk, i64 A4) {
    // down: d product (p); the product released
    w.backward_begin(mod(blk, {t.downW}), X + b, A4);
    w.at(X + b + p, A4);
    w.backward_end(mod(blk, {t.downW}), X + b + p, A4 - p, true);
    // the product's factors (no module): d up (p); SiLU's, up's and gate's outputs released
    w.at(X + b + 2 * p, A4 - p);
    // up: d y2 (b); d up freed
    w.backward_begin(mod(blk, {t.upW}), X + b + 2 * p, A4 - 4 * p);
    w.at(X + 2 * b + 2 * p, A4 - 4 * p);
    w.backward_end(mod(blk, {t.upW}), X + 2 * b + p, A4 - 4 * p, true);
    // gate: adds onto d y2; d gate freed, y2 released
    w.backward_begin(mod(blk, {t.gateW}), X + 2 * b + p, A4 - 4 * p);
    w.backward_end(mod(blk, {t.gateW}), X + 2 * b, A4 - 4 * p - b, true);
    // post_attention_layernorm: d x_mid (b); d y2 freed, the upcast and rstd released
    w.backward_begin(mod(blk, {t.norm2}), X + 2 * b, A4 - 4 * p - b);
    w.at(X + 3 * b, A4 - 4 * p - b);
    const i64 A5 = A4 - 4 * p - 3 * b - 4 * N;
    w.backward_end(mod(blk, {t.norm2}), X + 2 * b, A5, true);
    // o (dy freed by the residual): d out (q2)
    w.backward_begin(mod(blk, {t.oW, t.oB}), X + b, A5);
    w.at(X + b + q2, A5);
    w.backward_end(mod(blk, {t.oW, t.oB}), X + b + q2, A5, true);
    // the attention (no module): param_bf16_forms.hpp's instants
    // (--checkpoint attention: the core's forward again, its own save made anew)
    const i64 A6 = A5 - H;
    if (flash) {
      if (R > 0) {  // the re-run's output, then its lse
        w.at(X + b + q2, A5 + q2);
        w.at(X + b + q2, A5 + q2 + A);
      }
      w.at(X + b + 2 * q2 + 2 * c2, A5 + (R > 0 ? q2 + A : 0));
    } else {
      const i64 Am = A5 - q2 + R;  // the bf16 output freed (under R the probabilities made again)
      w.at(X + b + q2 + Q, Am - R);
      w.at(X + b + 2 * Q, Am - R);
      if (R > 0) w.at(X + b + Q, Am);  // the probabilities again (d out's upcast freed)
      w.at(X + b + Q + A, Am);
      w.at(X + b + 2 * Q + A, Am);
      w.at(X + b + 2 * Q + A, Am - Q - A);
      w.at(X + b + 3 * Q + A, Am - Q - A);
      w.at(X + b + 3 * Q + q2 + 2 * c2, A6);
    }
    // v: d y1 (b); then k and q add onto it; dq, dk, dv freed, y1 released
    const i64 T6 = X + b + q2 + 2 * c2;
    w.backward_begin(mod(blk, {t.vW, t.vB}), T6, A6);
    w.at(T6 + b, A6);
    w.backward_end(mod(blk, {t.vW, t.vB}), T6 + b, A6, true);
    w.backward_begin(mod(blk, {t.kW, t.kB}), T6 + b, A6);
    w.backward_end(mod(blk, {t.kW, t.kB}), T6 + b, A6, true);
    w.backward_begin(mod(blk, {t.qW, t.qB}), T6 + b, A6);
    w.backward_end(mod(blk, {t.qW, t.qB}), X + 2 * b, A6 - b, true);
    // input_layernorm: dx (b); d y1 freed, the upcast and rstd released
    w.backward_begin(mod(blk, {t.norm1}), X + 2 * b, A6 - b);
    w.at(X + 3 * b, A6 - b);
    w.backward_end(mod(blk, {t.norm1}), X + 2 * b, A6 - 3 * b - 4 * N, true);
  };
  // The loss on the logits upcast to fp32 (the final block's input freed), from S = SL + fh:
  // the upcast beside the logits, the scalar, the log-probabilities and total_weight; the
  // fp32 dlogits (the logits and the scalar freed), then the bf16 dlogits beside them.
  f.loss = [=](Stage3Walk& w, i64 S) {
    w.at(X + lam2 + 4 + lam, S + lam + 4);
    w.place(Phase::backward, layer(s.layers + 1));
    w.at(X + lam, S + lam + 4);
    w.at(X + lam + lam2, S);
  };
  return f;
}

}  // namespace

std::vector<Prediction> predict_deepspeed_stage3_transformer(const RunConfig& cfg, int world) {
  const ModelConfig& m = cfg.model;
  const std::vector<i64> tensors = model_tensor_elems(m);
  const Ds3Layout l = ds3_layout(tensors, world, cfg.param_persistence);
  const TransformerShape& s = m.transformer;
  const int L = s.layers, K = cfg.accumulate;
  const i64 C = l.flat;
  i64 P = 0;
  for (i64 n : tensors) P += n;
  // Bytes an element of the partitions, gathers, gradients and bucket: 4, or 2 under bf16
  // (the master weights and AdamW fp32).
  const bool bf16 = cfg.precision == PrecisionKind::bf16;
  const i64 e = bf16 ? 2 : 4;
  const i64 cap = ds_bucket_elems(cfg.bucket_mb, model_tensor_elems(cfg.model)), Bk = e * cap;
  const bool gpt2 = m.name == "gpt2";
  const Family f = bf16 ? (gpt2 ? gpt2_bf16_family(m) : llama_bf16_family(m)) : gpt2 ? gpt2_family(m) : llama_family(m);
  const TokenSizes z = token_sizes(s, m.batch);
  const i64 N = z.N, a = f.a, lambda = f.lambda, X = 16 * N;
  // --checkpoint full|every:K: model block b (1..L) is transformer block b - 1, wrapped when
  // the policy wraps it; it holds its output alone (a) from its forward to its backward.
  auto wrapped = [&](int b) { return m.checkpoint.wraps(b - 1); };
  std::vector<i64> held(static_cast<std::size_t>(L) + 1, f.base);  // held[b]: after block b's forward
  for (int b = 1; b <= L; ++b) held[b] = held[b - 1] + (wrapped(b) ? a : f.K);

  // What the gathers move: every module's non-persistent tensors, in forward and again in
  // backward (the tied table by the embedding and by the head, each way), each micro-step;
  // the persistent tensors once, after the step.
  std::vector<int> persistent;
  for (int t = 0; t < static_cast<int>(tensors.size()); ++t)
    if (l.persistent[t]) persistent.push_back(t);
  const Ds3Gather kept = ds3_gather(l, persistent, world, e);
  auto moved = [&](const std::vector<int>& module) {
    std::vector<int> set;
    for (int t : module)
      if (!l.persistent[t]) set.push_back(t);
    return ds3_gather(l, set, world, e).moved;
  };
  i64 step_moved = 0;
  for (const std::vector<int>& module : f.modules) step_moved += 2 * moved(module);
  // A wrapped block's re-run gathers each of its modules a third time but the first its
  // backward reaches (gathered by its pre-backward hook before the re-run, then kept).
  for (int b = 1; b <= L; ++b) {
    if (!wrapped(b)) continue;
    const std::vector<std::vector<int>> mods = f.block_modules(b);
    for (std::size_t i = 0; i + 1 < mods.size(); ++i) step_moved += moved(mods[i]);
  }
  std::vector<Prediction> ranks(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    Prediction& p = ranks[r];
    p.resting[Category::param] = e * C + (bf16 ? 0 : 4 * C) + kept.held;
    p.resting[Category::master] = bf16 ? 4 * C : 0;
    p.resting[Category::grad] = e * C;
    p.resting[Category::optim] = 8 * C + 4;
    p.resting[Category::comm] = Bk;
    p.model_states = p.resting.total() - Bk;
    p.comm_bytes[static_cast<int>(CollKind::all_reduce)] = e * P * K;
    p.comm_bytes[static_cast<int>(CollKind::all_gather)] = step_moved * K + kept.moved;

    Stage3Walk w(l, world, r, cap, e);
    // Every micro-step repeats the first's instants (nothing but the partitions is kept
    // across them): one is walked.
    // Forward: the embeddings (GPT-2's arange first), the blocks, the final norm and the
    // head, the loss (its scalar, log-probabilities and total_weight beside the logits).
    w.place(Phase::forward, layer(0));
    const i64 x0 = f.stream > 0 ? 0 : a;  // x0 an activation, or temp (stream) when nobody saves it
    const i64 pos = f.base - x0;         // GPT-2's arange (8T); none for Llama
    // A stream's x0 saved by block 1's checkpoint: an activation (counted in block 1's held).
    const i64 x0_saved = f.stream > 0 && wrapped(1) ? a : 0;
    w.forward_begin(f.tokens, X, pos);
    w.at(X + f.stream - x0_saved, pos + x0 + x0_saved);
    w.forward_end(f.tokens);
    if (!f.positions.empty()) {
      w.forward_begin(f.positions, X, pos + a);
      w.forward_end(f.positions);
    }
    for (int b = 1; b <= L; ++b) {
      w.place(Phase::forward, layer(b));
      f.forward(w, b, held[b - 1], false);
    }
    const i64 SL = held[L], fh = f.final_held, Xs = X + f.stream;  // (the final block's input, when temp)
    w.place(Phase::forward, layer(L + 1));
    w.forward_begin(f.final_norm, Xs, SL);
    w.at(Xs, SL + fh);
    w.forward_end(f.final_norm);
    w.forward_begin(f.head, Xs, SL + fh);
    w.at(Xs + lambda, SL + fh);
    w.forward_end(f.head);
    if (f.loss) {
      f.loss(w, SL + fh);
    } else {
      const i64 A_f = SL + fh + lambda + f.loss_weight;
      w.at(X + lambda + 4, A_f);
      // Backward: dlogits (the logits freed), then log-probabilities and total_weight released.
      w.place(Phase::backward, layer(L + 1));
      w.at(X + lambda, A_f);
    }
    // The head: d norm out (a); dlogits freed, the norm's output released.
    w.place(Phase::backward, layer(L + 1));
    const i64 A1 = SL + fh;
    w.backward_begin(f.head, X + lambda, A1);
    w.at(X + lambda + a, A1);
    w.backward_end(f.head, X + a, A1 - a, true);
    w.backward_begin(f.final_norm, X + a, A1 - a);
    w.at(X + 2 * a, A1 - a);
    w.backward_end(f.final_norm, X + a, A1 - fh, true);
    for (int b = L; b >= 1; --b) {
      if (wrapped(b)) {
        // Its output freed, dy = a: the first-backward module gathered, then the re-run
        // from its input (held[b - 1]), every save made again, its output temp.
        w.place(Phase::backward, "recompute of block " + std::to_string(b - 1));
        // (A stream's saved input is block b's own, above held[b - 1].)
        w.begin_rerun(f.block_modules(b).back(), X + a, held[b - 1] + (f.stream > 0 ? a : 0));
        f.forward(w, b, held[b - 1], true);
        w.end_rerun();
      }
      w.place(Phase::backward, layer(b));
      // Its output freed (an activation, but for a stream's, whose wrapped layer holds its input).
      f.backward(w, b, held[b - 1] + f.K - x0 + (f.stream > 0 && wrapped(b) ? a : 0));
    }
    // The embeddings (x0 freed; dy = a): GPT-2's positions first, then the tokens' table
    // (dy freed once its gradient is made); their ids take no gradient.
    w.place(Phase::backward, layer(0));
    if (!f.positions.empty()) {
      w.backward_begin(f.positions, X + a, pos);
      w.backward_end(f.positions, X + a, pos, false);
    }
    w.backward_begin(f.tokens, X + a, pos);
    w.backward_end(f.tokens, X, pos, false);
    w.epilogue();
    // The optimizer's flattened gradient (the persistent tensors released; bf16: flattened in
    // bf16 beside its fp32 cast), then their gather after it.
    w.place(Phase::optimizer, "-");
    CategoryBytes opt;
    opt[Category::grad] = (bf16 ? 2 * C : 0) + 4 * C;
    opt[Category::param] = -kept.held;
    w.peak.consider(opt, Phase::optimizer, "-");
    if (kept.flat > 0) {
      CategoryBytes after;
      after[Category::comm] = kept.flat;
      w.peak.consider(after, Phase::communication, "-");
    }

    p.peak_known = true;
    p.peak_by_category = p.resting;
    for (int c = 0; c < kCategoryCount; ++c) p.peak_by_category.bytes[c] += w.peak.bytes.bytes[c];
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = w.peak.phase;
    p.peak_where = w.peak.where;
    const SavedForm saved = bf16   ? param_bf16_saved_after_forward(m, m.checkpoint)
                            : gpt2 ? gpt2_saved_after_forward(s, m.batch, m.checkpoint)
                                   : llama_saved_after_forward(s, m.batch, m.checkpoint);
    p.saved_after_forward_bytes = saved.bytes;
    p.saved_after_forward_tensors = saved.tensors;
  }
  return ranks;
}

}  // namespace shardscope
