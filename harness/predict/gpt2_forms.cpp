// GPT-2's saved bytes and a data-parallel step's transient peak (gpt2_forms.hpp has
// the symbols). The walk below lists, in time order, every instant at which the step's
// live bytes can be highest, each as a formula; the tracker keeps the first instant of
// the maximum, and so does the walk (a later candidate replaces only a strictly larger).
//
// Live bytes by category (X = 16N: the batch's ids and the target, temp throughout):
//   per transformer block, activation  K = 8a + 2F + 16N + A   (ln_1's mean, rstd and
//     output; qkv and the output (flash) or q, k, v and y (math): 4a; the lse or the
//     probabilities; x_mid; ln_2's mean, rstd, output; c_fc's and GELU's outputs; and
//     the block's output, which the next block saves)
//   the embeddings: arange(T) 8T and x0 a; ln_f: mean and rstd 8N, output a
//   forward's end (the loss's total_weight made): activation
//     A_f = 8T + a + L·K + 8N + a + Λ + 4, temp X + Λ (the logits) + 4 (the loss scalar)
// The backward's instants: the loss's dlogits (Λ); the final block's d ln_f (a) and dx
// (a); in the top transformer block (the first one backward reaches: every later
// block's instants hold less, its saves and the blocks above it released) each
// gradient buffer as it is made. A lower block's instant holds K less than the same
// instant of the block above.
#include "harness/predict/gpt2_forms.hpp"

#include <vector>

namespace shardscope {
namespace {

using i64 = std::int64_t;

struct Sizes {
  i64 N, a, F, lambda, A, T;
  int L;
  bool flash;
};

Sizes sizes(const TransformerShape& s, int batch) {
  Sizes z;
  z.N = static_cast<i64>(batch) * s.seq;
  z.a = 4 * z.N * s.hidden;
  z.F = 4 * z.N * s.ffn;
  z.lambda = 4 * z.N * s.vocab;
  z.flash = s.attention == AttentionMode::flash;
  const i64 bht = static_cast<i64>(batch) * s.heads * s.seq;
  z.A = z.flash ? 4 * bht : 4 * bht * s.seq;
  z.T = s.seq;
  z.L = s.layers;
  return z;
}

}  // namespace

SavedForm gpt2_block_saved(const TransformerShape& shape, int batch) {
  const Sizes z = sizes(shape, batch);
  return {8 * z.a + 2 * z.F + 16 * z.N + z.A, z.flash ? 13 : 15};
}

SavedForm gpt2_saved_after_forward(const TransformerShape& shape, int batch) {
  const Sizes z = sizes(shape, batch);
  const SavedForm block = gpt2_block_saved(shape, batch);
  return {8 * z.N + 8 * z.T + z.L * block.bytes + z.a + 8 * z.N + z.a + z.lambda + 8 * z.N + 4,
          9 + z.L * block.tensors};
}

StepTransient gpt2_step_transient(const TransformerShape& shape, int batch, std::int64_t gathered) {
  const Sizes z = sizes(shape, batch);
  const i64 a = z.a, F = z.F, A = z.A, lambda = z.lambda, N = z.N;
  const i64 X = 16 * N;
  const i64 f = gathered;
  const bool fsdp = gathered > 0;
  const i64 K = 8 * a + 2 * F + 16 * N + A;
  const std::string final_block = "layer " + std::to_string(z.L + 1);
  const std::string top_block = "layer " + std::to_string(z.L);
  const std::string unit = "unit 0";

  StepTransient best;
  i64 best_total = -1;
  // One instant: temp and activation beyond the resting bytes; gathered parameters (f
  // while a root unit is gathered) and its full gradient (from the backward's first
  // block).
  auto consider = [&](i64 temp, i64 act, i64 grad_full, Phase phase, const std::string& where) {
    const i64 total = temp + act + f + grad_full;
    if (total <= best_total) return;
    best_total = total;
    best.bytes = CategoryBytes{};
    best.bytes[Category::temp] = temp;
    best.bytes[Category::activation] = act;
    best.bytes[Category::param_unsharded] = f;
    best.bytes[Category::grad_unsharded] = grad_full;
    best.phase = phase;
    best.where = where;
  };
  const i64 g = f;  // the root unit's full gradient, once made

  // Forward's end: every save, the logits, the loss scalar.
  const i64 A_f = 8 * z.T + a + z.L * K + 8 * N + a + lambda + 4;
  consider(X + lambda + 4, A_f, 0, Phase::forward, fsdp ? unit : final_block);
  // The loss's gradient (the scalar and the logits freed), before the root unit's
  // backward hook; then the unit's full gradient.
  consider(X + lambda, A_f, 0, Phase::backward, final_block);
  const i64 A1 = A_f - lambda - 4;  // log-probabilities and total_weight released
  if (fsdp) consider(X + lambda, A1, g, Phase::backward, unit);
  const std::string& fin = fsdp ? unit : final_block;
  const std::string& top = fsdp ? unit : top_block;
  const i64 gu = fsdp ? g : 0;
  // The final block: d ln_f, then dx (dlogits and ln_f's output gone).
  consider(X + lambda + a, A1, gu, Phase::backward, fin);
  consider(X + 2 * a, A1 - a, gu, Phase::backward, fin);
  // The top transformer block: its output (x_L) freed, dy = a.
  const i64 A4 = A1 - a - 8 * N - a;
  consider(X + a + F, A4, gu, Phase::backward, top);                   // d gelu
  consider(X + 2 * a + F, A4 - 2 * F, gu, Phase::backward, top);       // d ln_2 out
  consider(X + 3 * a, A4 - 2 * F - a, gu, Phase::backward, top);       // d x_mid
  const i64 A8 = A4 - 2 * F - 2 * a - 8 * N;
  consider(X + 2 * a, A8, gu, Phase::backward, top);                   // d attention output
  if (z.flash) {
    consider(X + 5 * a, A8, gu, Phase::backward, top);                 // d qkv
  } else {
    consider(X + 3 * a, A8 - a, gu, Phase::backward, top);             // d out, head-major
    consider(X + 2 * a + A, A8 - a, gu, Phase::backward, top);         // d probabilities
    consider(X + 3 * a + A, A8 - a, gu, Phase::backward, top);         // d v
    consider(X + 3 * a + A, A8 - 2 * a - A, gu, Phase::backward, top); // d q
    consider(X + 4 * a + A, A8 - 2 * a - A, gu, Phase::backward, top); // d k
    consider(X + 7 * a, A8 - 4 * a - A, gu, Phase::backward, top);     // d qkv
  }
  const i64 A9 = A8 - 4 * a - A;
  consider(X + 5 * a, A9, gu, Phase::backward, top);                   // d ln_1 out
  consider(X + 3 * a, A9 - a, gu, Phase::backward, top);               // dx
  return best;
}

void add_gpt2_step(const ModelConfig& model, std::int64_t gathered, std::vector<Prediction>& ranks) {
  const StepTransient t = gpt2_step_transient(model.transformer, model.batch, gathered);
  const SavedForm saved = gpt2_saved_after_forward(model.transformer, model.batch);
  for (Prediction& p : ranks) {
    p.peak_by_category = p.resting;
    for (int k = 0; k < kCategoryCount; ++k) p.peak_by_category.bytes[k] += t.bytes.bytes[k];
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = t.phase;
    p.peak_where = t.where;
    p.saved_after_forward_bytes = saved.bytes;
    p.saved_after_forward_tensors = saved.tensors;
  }
}

}  // namespace shardscope
