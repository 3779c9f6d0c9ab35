// GPT-2's saved bytes and a data-parallel step's transient peak (gpt2_forms.hpp has
// the symbols). The walk below lists, in time order, every instant at which the step's
// live bytes can be highest, each as a formula; the tracker keeps the first instant of
// the maximum, and so does the walk (a later candidate replaces only a strictly larger).
//
// Live bytes by category (X = 16N: the batch's ids and the target, temp throughout):
//   per transformer block, activation  K = 8a + 2F + 16N + A (+ 2a: math with B or H 1) (ln_1's mean, rstd and
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

#include "harness/strategies/partition.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

struct Sizes {
  i64 N, a, F, lambda, A, T;
  i64 v;  // math: what saving v holds (a copy, a; with B = 1 or H = 1 the qkv it views, 3a)
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
  z.v = batch == 1 || s.heads == 1 ? 3 * z.a : z.a;
  z.L = s.layers;
  return z;
}

}  // namespace

SavedForm gpt2_block_saved(const TransformerShape& shape, int batch) {
  const Sizes z = sizes(shape, batch);
  return {8 * z.a + 2 * z.F + 16 * z.N + z.A + (z.flash ? 0 : z.v - z.a), z.flash ? 13 : 15};
}

SavedForm gpt2_saved_after_forward(const TransformerShape& shape, int batch) {
  const Sizes z = sizes(shape, batch);
  const SavedForm block = gpt2_block_saved(shape, batch);
  return {8 * z.N + 8 * z.T + z.L * block.bytes + z.a + 8 * z.N + z.a + z.lambda + 8 * z.N + 4,
          9 + z.L * block.tensors};
}

StepTransient gpt2_step_transient(const TransformerShape& shape, int batch, const Gpt2Units& units) {
  const Sizes z = sizes(shape, batch);
  const i64 a = z.a, F = z.F, A = z.A, lambda = z.lambda, N = z.N;
  const i64 X = 16 * N;
  const i64 V = z.v;
  const i64 K = gpt2_block_saved(shape, batch).bytes;
  const bool fsdp = !units.bytes.empty();
  const int U = static_cast<int>(units.bytes.size());
  auto f = [&](int u) { return units.bytes[u]; };
  i64 all_units = 0;  // Σ f_u over the units of blocks (u >= 1)
  for (int u = 1; u < U; ++u) all_units += f(u);
  const i64 f0 = fsdp ? f(0) : 0;
  auto unit = [](int u) { return "unit " + std::to_string(u); };
  auto layer = [](int b) { return "layer " + std::to_string(b); };

  StepTransient best;
  i64 best_total = -1;
  // One instant: temp and activation beyond the resting bytes, gathered parameters and
  // full gradients.
  auto consider = [&](i64 temp, i64 act, i64 gathered, i64 grad_full, Phase phase, const std::string& where) {
    const i64 total = temp + act + gathered + grad_full;
    if (total <= best_total) return;
    best_total = total;
    best.bytes = CategoryBytes{};
    best.bytes[Category::temp] = temp;
    best.bytes[Category::activation] = act;
    best.bytes[Category::param_unsharded] = gathered;
    best.bytes[Category::grad_unsharded] = grad_full;
    best.phase = phase;
    best.where = where;
  };
  // The activations when block b's backward begins (blocks 1..b with their outputs,
  // arange and x0): S_b = 8T + a + b·K.
  auto held_at = [&](int b) { return 8 * z.T + a + b * K; };
  // A top block's gradient buffers, from its output freed (A4 = S_b - a), dy = a.
  auto top_block = [&](int b, i64 pu, i64 gu, const std::string& where) {
    const i64 A4 = held_at(b) - a;
    consider(X + a + F, A4, pu, gu, Phase::backward, where);                   // d gelu
    consider(X + 2 * a + F, A4 - 2 * F, pu, gu, Phase::backward, where);       // d ln_2 out
    consider(X + 3 * a, A4 - 2 * F - a, pu, gu, Phase::backward, where);       // d x_mid
    const i64 A8 = A4 - 2 * F - 2 * a - 8 * N;
    consider(X + 2 * a, A8, pu, gu, Phase::backward, where);                   // d attention output
    if (z.flash) {
      consider(X + 5 * a, A8, pu, gu, Phase::backward, where);                 // d qkv
    } else {
      consider(X + 3 * a, A8 - a, pu, gu, Phase::backward, where);             // d out, head-major
      consider(X + 2 * a + A, A8 - a, pu, gu, Phase::backward, where);         // d probabilities
      consider(X + 3 * a + A, A8 - a, pu, gu, Phase::backward, where);         // d v
      consider(X + 3 * a + A, A8 - a - V - A, pu, gu, Phase::backward, where); // d q
      consider(X + 4 * a + A, A8 - a - V - A, pu, gu, Phase::backward, where); // d k
      consider(X + 7 * a, A8 - 3 * a - V - A, pu, gu, Phase::backward, where); // d qkv
    }
    const i64 A9 = z.flash ? A8 - 4 * a - A : A8 - 3 * a - V - A;
    consider(X + 5 * a, A9, pu, gu, Phase::backward, where);                   // d ln_1 out
    consider(X + 3 * a, A9 - a, pu, gu, Phase::backward, where);               // dx
  };

  // Forward: each unit of blocks at its top block's output (zero3 holds the root and
  // that unit, zero2 every unit so far).
  i64 so_far = 0;
  for (int u = 1; u < U; ++u) {
    so_far += f(u);
    consider(X, held_at(units.top_block[u]), f0 + (units.reshard ? f(u) : so_far), 0, Phase::forward, unit(u));
  }
  // Forward's end (the loss's total_weight made): every save, the logits, the loss scalar.
  const i64 after_forward = f0 + (units.reshard ? 0 : all_units);
  const i64 A_f = 8 * z.T + a + z.L * K + 8 * N + a + lambda + 4;
  consider(X + lambda + 4, A_f, after_forward, 0, Phase::forward, fsdp ? unit(0) : layer(z.L + 1));
  // The loss's gradient (before the root unit's backward hook), then the root's full
  // gradient (log-probabilities and total_weight released).
  consider(X + lambda, A_f, after_forward, 0, Phase::backward, layer(z.L + 1));
  const i64 A1 = A_f - lambda - 4;
  if (fsdp) consider(X + lambda, A1, after_forward, f0, Phase::backward, unit(0));
  const std::string fin = fsdp ? unit(0) : layer(z.L + 1);
  // The final block: d ln_f, then dx (dlogits and ln_f's output gone).
  consider(X + lambda + a, A1, after_forward, f0, Phase::backward, fin);
  consider(X + 2 * a, A1 - a, after_forward, f0, Phase::backward, fin);
  if (U <= 1) {
    // ddp, zero1, a root unit: the top transformer block; every lower block's instants
    // hold K less.
    top_block(z.L, f0, f0, fsdp ? unit(0) : layer(z.L));
    return best;
  }
  // Units of blocks, from the last: when its backward begins dy = a and S_b are held;
  // zero3 gathers it (unless the unit above prefetched it) and prefetches the next
  // (not the root, still gathered); its full gradient; its top block's buffers. Lower
  // blocks of a unit hold K less at each instant.
  i64 pu = after_forward;
  for (int u = U - 1; u >= 1; --u) {
    const int b = units.top_block[u];
    const i64 held = held_at(b);
    if (units.reshard) {
      const bool prefetched = units.prefetch && u + 1 < U;
      if (!prefetched) {
        pu += f(u);
        consider(X + a, held, pu, f0, Phase::backward, unit(u));
      }
      if (units.prefetch && u - 1 >= 1) {
        pu += f(u - 1);
        consider(X + a, held, pu, f0, Phase::backward, unit(u));
      }
    }
    consider(X + a, held, pu, f0 + f(u), Phase::backward, unit(u));  // the unit's full gradient
    top_block(b, pu, f0 + f(u), unit(u));
    pu -= f(u);  // resharded after its backward
  }
  return best;
}

void add_gpt2_step(const RunConfig& cfg, int world, std::vector<Prediction>& ranks) {
  const ModelConfig& model = cfg.model;
  Gpt2Units g;
  if (shards_by_unit(cfg.strategy)) {
    const std::vector<Unit> units = fsdp_units(model, cfg.layers_per_unit, world);
    for (const Unit& u : units) {
      g.bytes.push_back(4 * u.padded);
      g.top_block.push_back(u.last_block - 1);
    }
    g.reshard = cfg.strategy == StrategyKind::zero3 && units.size() > 1;
    g.prefetch = cfg.prefetch != 0;
  }
  const StepTransient t = gpt2_step_transient(model.transformer, model.batch, g);
  const SavedForm saved = gpt2_saved_after_forward(model.transformer, model.batch);
  for (Prediction& p : ranks) {
    p.peak_known = true;
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
