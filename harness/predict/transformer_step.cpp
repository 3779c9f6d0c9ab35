// The walk of a transformer's data-parallel step (transformer_step.hpp). Live bytes by
// category, beside the resting ones:
//   forward's end (the loss's total_weight made): activation
//     A_f = base + L·K + final_held + Λ + 4, temp X + Λ (the logits) + 4 (the loss scalar)
//   the backward's instants: the loss's dlogits (Λ); the final block's d norm (a) and
//   dx (a); in the top transformer block (the first one backward reaches: every later
//   block's instants hold less, its saves and the blocks above it released) each
//   gradient buffer as it is made (the family's). A lower block's instant holds K less
//   than the same instant of the block above; the activations when block b's backward
//   begins are S_b = base + b·K.
#include "harness/predict/transformer_step.hpp"

#include <vector>

#include "harness/strategies/partition.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

std::string unit(int u) { return "unit " + std::to_string(u); }
std::string layer(int b) { return "layer " + std::to_string(b); }

}  // namespace

void PeakWalk::consider(i64 temp, i64 act, i64 gathered, i64 grad_full, Phase phase, const std::string& where,
                        bool dy_live, i64 comm) {
  if (record_) record_->push_back({temp, act, dy_live});
  const i64 total = temp + act + gathered + grad_full + comm;
  if (total <= best_total_) return;
  best_total_ = total;
  best_.bytes = CategoryBytes{};
  best_.bytes[Category::temp] = temp;
  best_.bytes[Category::activation] = act;
  best_.bytes[Category::param_unsharded] = gathered;
  best_.bytes[Category::grad_unsharded] = grad_full;
  best_.bytes[Category::comm] = comm;
  best_.phase = phase;
  best_.where = where;
}

TokenSizes token_sizes(const TransformerShape& s, int batch) {
  TokenSizes z;
  z.N = static_cast<i64>(batch) * s.seq;
  z.T = s.seq;
  z.a = 4 * z.N * s.hidden;
  z.F = 4 * z.N * s.ffn;
  z.lambda = 4 * z.N * s.vocab;
  z.flash = s.attention == AttentionMode::flash;
  const i64 bht = static_cast<i64>(batch) * s.heads * s.seq;
  z.A = z.flash ? 4 * bht : 4 * bht * s.seq;
  z.L = s.layers;
  return z;
}

StepUnits step_units(const RunConfig& cfg, int world) {
  StepUnits g;
  if (!shards_by_unit(cfg.strategy)) return g;
  const std::vector<Unit> units = fsdp_units(cfg.model, cfg.layers_per_unit, world);
  for (const Unit& u : units) {
    g.bytes.push_back(4 * u.padded);
    g.grad_bytes.push_back(4 * u.padded);
    g.top_block.push_back(u.last_block - 1);
  }
  g.reshard = cfg.strategy == StrategyKind::zero3 && units.size() > 1;
  g.prefetch = cfg.prefetch != 0;
  return g;
}

StepTransient transformer_step_transient(const StepBlocks& z, const StepUnits& units) {
  const i64 a = z.a, lambda = z.lambda, X = 16 * z.N, K = z.K;
  const bool fsdp = !units.bytes.empty();
  const bool flat = fsdp && units.flat_comm;
  const int U = static_cast<int>(units.bytes.size());
  auto f = [&](int u) { return units.bytes[u]; };
  auto e = [&](int u) { return units.grad_bytes[u]; };
  i64 all_units = 0;  // Σ f_u over the units of blocks (u >= 1)
  for (int u = 1; u < U; ++u) all_units += f(u);
  const i64 f0 = fsdp ? f(0) : 0;
  const i64 e0 = fsdp ? e(0) : 0;
  // Model block b (1..L) is transformer block b - 1; a wrapped one holds a, else K.
  auto wrapped = [&](int b) { return z.checkpoint.wraps(b - 1); };
  std::vector<i64> held(z.L + 1, z.base);  // held[b] = S_{b+1}: after block b's forward
  for (int b = 1; b <= z.L; ++b) held[b] = held[b - 1] + (wrapped(b) ? a : K);
  auto held_at = [&](int b) { return held[b]; };
  auto recompute_of = [](int b) { return "recompute of block " + std::to_string(b - 1); };
  PeakWalk walk;

  // Forward: each unit of blocks at its top block's output (zero3 holds the root and
  // that unit, zero2 every unit so far); a wrapped block's saves are freed only after.
  // (fsdp2's gather of a unit in forward, its flat buffer beside the unit's gathered
  // tensors, holds less than the unit's reduce-scatter in backward: the same
  // activations, flat buffer and gathered units or fewer, without dx and the full
  // gradients.)
  i64 so_far = 0;
  for (int u = 1; u < U; ++u) {
    so_far += f(u);
    const int b = units.top_block[u];
    walk.consider(X, held_at(b - 1) + K, f0 + (units.reshard ? f(u) : so_far), 0, Phase::forward, unit(u));
  }
  // Forward's end (the loss's total_weight made): every save, the logits, the loss scalar.
  const i64 after_forward = f0 + (units.reshard ? 0 : all_units);
  const i64 A_f = held_at(z.L) + z.final_held + lambda + 4;
  walk.consider(X + lambda + 4, A_f, after_forward, 0, Phase::forward, fsdp ? unit(0) : layer(z.L + 1));
  // The loss's gradient (before the root unit's backward hook), then the root's full
  // gradient (log-probabilities and total_weight released).
  walk.consider(X + lambda, A_f, after_forward, 0, Phase::backward, layer(z.L + 1));
  const i64 A1 = A_f - lambda - 4;
  if (fsdp) walk.consider(X + lambda, A1, after_forward, e0, Phase::backward, unit(0));
  const std::string fin = fsdp ? unit(0) : layer(z.L + 1);
  // The final block: d norm, then dx (dlogits and the norm's output gone).
  walk.consider(X + lambda + a, A1, after_forward, e0, Phase::backward, fin);
  walk.consider(X + 2 * a, A1 - a, after_forward, e0, Phase::backward, fin);
  // Blocks [lo, hi] backward, from hi, in one unit's gathered parameters and full
  // gradient: a wrapped block's re-run, then its gradient buffers from A4 = S_b + K - a
  // (its output freed). Lower blocks hold less at each instant than the unit's top
  // one; walked all the same, since a re-run's instants can meet a later block's.
  auto blocks_backward = [&](int hi, int lo, i64 pu, i64 gu, const std::string& where) {
    for (int b = hi; b >= lo; --b) {
      if (wrapped(b)) z.recompute(walk, held_at(b - 1), pu, gu, recompute_of(b));
      z.backward(walk, held_at(b - 1) + K - a, pu, gu, fsdp ? where : layer(b));
    }
  };
  // fsdp2: the root's reduce-scatter once the embeddings' backward is done (no dx, every
  // save released), its flat input beside the root's full gradients.
  auto root_reduce = [&] {
    if (flat) walk.consider(X, 0, f0, e0, Phase::backward, unit(0), false, f0);
  };
  if (U <= 1) {
    // ddp, zero1, a root unit: every transformer block from the top.
    blocks_backward(z.L, 1, f0, e0, unit(0));
    root_reduce();
    return walk.best();
  }
  // Units of blocks, from the last: when its backward begins dy = a and S_b are held
  // (S_b less a wrapped top block's output, freed first); zero3 gathers it (unless the
  // unit above prefetched it) and prefetches the next (not the root, still gathered);
  // its full gradient; its blocks' buffers; fsdp2's reduce-scatter once its first block
  // is done (dx and S_{first} held).
  i64 pu = after_forward;
  for (int u = U - 1; u >= 1; --u) {
    const int b = units.top_block[u];
    const int first = u == 1 ? 1 : units.top_block[u - 1] + 1;
    const i64 S = wrapped(b) ? held_at(b - 1) : held_at(b);
    if (units.reshard) {
      const bool prefetched = units.prefetch && u + 1 < U;
      if (!prefetched) {
        pu += f(u);
        if (flat) walk.consider(X + a, S, pu, e0, Phase::backward, unit(u), false, f(u));
        walk.consider(X + a, S, pu, e0, Phase::backward, unit(u));
      }
      if (units.prefetch && u - 1 >= 1) {
        pu += f(u - 1);
        if (flat) walk.consider(X + a, S, pu, e0, Phase::backward, unit(u - 1), false, f(u - 1));
        walk.consider(X + a, S, pu, e0, Phase::backward, unit(u));
      }
    }
    walk.consider(X + a, S, pu, e0 + e(u), Phase::backward, unit(u));  // the unit's full gradient
    blocks_backward(b, first, pu, e0 + e(u), unit(u));
    if (flat) walk.consider(X + a, held_at(first - 1), pu, e0 + e(u), Phase::backward, unit(u), false, f(u));
    pu -= f(u);  // resharded after its backward
  }
  root_reduce();
  return walk.best();
}

void complete_step(const StepTransient& t, const SavedForm& saved, std::vector<Prediction>& ranks) {
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
