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

#include "harness/predict/param_bf16_forms.hpp"
#include "harness/strategies/partition.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

std::string unit(int u) { return "unit " + std::to_string(u); }
std::string layer(int b) { return "layer " + std::to_string(b); }

}  // namespace

void PeakWalk::consider(i64 temp, i64 act, i64 gathered, i64 grad_full, Phase phase, const std::string& where,
                        bool dy_live, i64 comm, i64 cast) {
  if (record_) record_->push_back({temp, act, dy_live});
  grad_full += held_grad_;
  comm += held_comm_;
  cast += held_cast_;
  const i64 total = temp + act + gathered + grad_full + comm + cast;
  if (total <= best_total_) return;
  best_total_ = total;
  best_.bytes = CategoryBytes{};
  best_.bytes[Category::temp] = temp;
  best_.bytes[Category::activation] = act;
  best_.bytes[Category::param_unsharded] = gathered;
  best_.bytes[Category::grad_unsharded] = grad_full;
  best_.bytes[Category::comm] = comm;
  best_.bytes[Category::param_cast] = cast;
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
  const std::vector<Unit> units = fsdp_units(cfg.model, cfg.layers_per_unit, world, cfg.mesh.tp);
  for (const Unit& u : units) {
    g.bytes.push_back(4 * u.padded);
    g.grad_bytes.push_back(4 * u.padded);
    g.shard_bytes.push_back(4 * u.shard);
    g.top_block.push_back(u.last_block - 1);
  }
  g.reshard = cfg.strategy == StrategyKind::zero3 && units.size() > 1;
  g.prefetch = cfg.prefetch != 0;
  g.overlap = cfg.overlap;
  g.micro = micro_steps(cfg);
  make_units_bf16(g, cfg, world);
  return g;
}

StepTransient transformer_step_transient(const StepBlocks& z, const StepUnits& units) {
  const i64 a = z.a, lambda = z.lambda, X = 16 * z.N, K = z.K;
  const bool fsdp = !units.bytes.empty();
  const bool flat = fsdp && units.flat_comm;
  const int U = static_cast<int>(units.bytes.size());
  auto f = [&](int u) { return units.bytes[u]; };
  auto e = [&](int u) { return units.grad_bytes[u]; };
  auto s = [&](int u) { return units.shard_bytes[u]; };
  i64 all_units = 0;  // Σ f_u over the units of blocks (u >= 1)
  for (int u = 1; u < U; ++u) all_units += f(u);
  const i64 f0 = fsdp ? f(0) : 0;
  const i64 e0 = fsdp ? e(0) : 0;
  // --precision bf16: each gather's shard casts, and what is reduce-scattered: FSDP1's full
  // gradient (its fp32 cast; fp32's own without bf16), fsdp2's flat input (the gradients'
  // fp32 copy-in; fp32's flat buffer f without bf16).
  const bool bf16 = fsdp && units.bf16;
  auto c = [&](int u) { return bf16 ? units.cast_bytes[u] : i64{0}; };
  auto r = [&](int u) { return bf16 ? units.reduce_bytes[u] : flat ? f(u) : e(u); };
  // Model block b (1..L) is transformer block b - 1; a wrapped one holds a, else K.
  auto wrapped = [&](int b) { return z.checkpoint.wraps(b - 1); };
  std::vector<i64> held(z.L + 1, z.base);  // held[b] = S_{b+1}: after block b's forward
  for (int b = 1; b <= z.L; ++b) held[b] = held[b - 1] + (wrapped(b) ? a : K);
  auto held_at = [&](int b) { return held[b]; };
  // stream_temp: block b's input before its forward, temp (or saved by its checkpoint,
  // activation); below(b): the activations beneath block b's saves, a wrapped block's
  // saved input among them (held_at(b - 1) when the blocks save the stream).
  auto in_temp = [&](int b) { return z.stream_temp && !wrapped(b) ? a : 0; };
  auto in_act = [&](int b) { return z.stream_temp && wrapped(b) ? a : 0; };
  auto below = [&](int b) { return held_at(b - 1) + in_act(b); };
  auto recompute_of = [](int b) { return "recompute of block " + std::to_string(b - 1); };
  PeakWalk walk;

  // One micro-step (micro_steps.hpp); kept(u) = the full gradients of units of blocks
  // held besides unit u's while u's backward runs (u = U: before any of theirs): the
  // units above when the micro-step does not reduce, those below when kept from the
  // micro-step before. The root's (e_0) is held from the start when kept.
  // What a unit keeps across micro-steps (--no-sync): its full gradient, or fsdp2's fp32
  // accumulators under bf16, beside which each micro-step makes fresh bf16 gradients.
  const bool accum = fsdp && !units.accum_bytes.empty();
  auto q = [&](int u) { return accum ? units.accum_bytes[u] : e(u); };
  auto micro_step = [&](const MicroStep& ms) {
    auto kept = [&](int u) {
      i64 sum = 0;
      for (int v = 1; v < U; ++v)
        if (v != u && (v > u ? !ms.reduces : ms.grads_held)) sum += q(v);
      return sum;
    };
    // A unit's own accumulators beside its fresh gradients (kept from the micro-step before).
    auto own_kept = [&](int u) { return accum && ms.grads_held ? q(u) : i64{0}; };
    const i64 fwd_grads = (ms.grads_held && fsdp ? q(0) : 0) + kept(U);
    const i64 root_live = e0 + own_kept(0);  // the root's gradients through the blocks' backward
    // Forward: each unit of blocks at its top block's output (zero3 holds the root and
    // that unit, zero2 every unit so far, or every unit when FSDP1 kept them gathered);
    // a wrapped block's saves are freed only after.
    // fsdp2's gathers in forward, the flat buffer beside the unit's gathered tensors: the
    // root's before the embeddings, each unit's before its first block (below the
    // unit's reduce-scatter in backward, unless the full gradients kept from the
    // micro-step before outweigh what backward adds).
    // bf16: FSDP1's cast beside the gathered unit; fsdp2's casts beside the flat buffer first.
    if (flat && bf16) walk.consider(X, 0, 0, fwd_grads, Phase::forward, unit(0), false, f0, c(0));
    if (flat) walk.consider(X, 0, f0, fwd_grads, Phase::forward, unit(0), false, f0);
    if (bf16 && !flat) walk.consider(X, 0, f0, fwd_grads, Phase::forward, unit(0), false, 0, c(0));
    // --checkpoint attention: each block's attention instants, its unit gathered (a
    // transformer block b of unit u: top_block[u - 1] < b <= top_block[u]).
    if (z.forward_attention) {
      int u = U > 1 ? 1 : 0;
      i64 gathered_to = U > 1 ? f(1) : 0;  // units 1..u
      for (int b = 1; b <= z.L; ++b) {
        while (U > 1 && b > units.top_block[u]) gathered_to += f(++u);
        const i64 gathered = U <= 1 ? f0 : f0 + (units.reshard ? f(u) : ms.params_held ? all_units : gathered_to);
        z.forward_attention(walk, held_at(b - 1), gathered, fwd_grads, fsdp ? unit(u) : layer(b));
      }
    }
    if (z.forward_block && U <= 1)
      for (int b = 1; b <= z.L; ++b) z.forward_block(walk, b, held_at(b - 1), f0, fwd_grads, fsdp ? unit(0) : layer(b));
    i64 so_far = 0;
    for (int u = 1; u < U; ++u) {
      const int first = u == 1 ? 1 : units.top_block[u - 1] + 1;
      const i64 tx = X + in_temp(first), S_in = held_at(first - 1) + in_act(first);  // its input held
      if (flat) {
        const i64 gathered_below = f0 + (units.reshard ? 0 : so_far);
        if (bf16) walk.consider(tx, S_in, gathered_below, fwd_grads, Phase::forward, unit(u), false, f(u), c(u));
        walk.consider(tx, S_in, gathered_below + f(u), fwd_grads, Phase::forward, unit(u), false, f(u));
      }
      if (bf16 && !flat)
        walk.consider(tx, S_in, f0 + (units.reshard ? 0 : so_far) + f(u), fwd_grads, Phase::forward, unit(u), false, 0,
                      c(u));
      so_far += f(u);
      const int b = units.top_block[u];
      const i64 gathered = units.reshard ? f(u) : ms.params_held ? all_units : so_far;
      if (z.forward_block)
        for (int j = first; j <= b; ++j) z.forward_block(walk, j, held_at(j - 1), f0 + gathered, fwd_grads, unit(u));
      walk.consider(X, held_at(b - 1) + K, f0 + gathered, fwd_grads, Phase::forward, unit(u));
    }
    // Forward's end (the loss's total_weight made): every save, the logits, the loss scalar.
    const i64 after_forward = f0 + (units.reshard ? 0 : all_units);
    const i64 A_f = held_at(z.L) + z.final_held + lambda + z.loss_weight;
    if (z.loss) z.loss(walk, held_at(z.L), after_forward, fwd_grads, fsdp ? unit(0) : layer(z.L + 1), layer(z.L + 1));
    if (z.head_gather > 0 && !z.loss)
      walk.consider(X + lambda + z.head_gather, A_f - lambda - z.loss_weight, after_forward, fwd_grads, Phase::forward,
                    fsdp ? unit(0) : layer(z.L + 1));
    if (!z.loss)
      walk.consider(X + lambda + 4, A_f, after_forward, fwd_grads, Phase::forward, fsdp ? unit(0) : layer(z.L + 1));
    if (z.loss_stats > 0 && !z.loss)
      walk.consider(X + lambda + 4 + z.loss_stats, A_f, after_forward, fwd_grads, Phase::forward,
                    fsdp ? unit(0) : layer(z.L + 1));
    // The loss's gradient (before the root unit's backward hook), then the root's full
    // gradient (log-probabilities and total_weight released).
    if (!z.loss) walk.consider(X + lambda, A_f, after_forward, fwd_grads, Phase::backward, layer(z.L + 1));
    const i64 A1 = A_f - lambda - z.loss_weight;
    const i64 root_grads = root_live + kept(U);
    if (fsdp) walk.consider(X + lambda, A1, after_forward, root_grads, Phase::backward, unit(0));
    const std::string fin = fsdp ? unit(0) : layer(z.L + 1);
    // The final block: d norm, then dx (dlogits and the norm's output gone).
    if (z.final_backward) {
      z.final_backward(walk, A1, after_forward, root_grads, fin);
    } else {
      walk.consider(X + lambda + a, A1, after_forward, root_grads, Phase::backward, fin);
      walk.consider(X + 2 * a, A1 - a, after_forward, root_grads, Phase::backward, fin);
    }
    // Blocks [lo, hi] backward, from hi, in one unit's gathered parameters and full
    // gradient: a wrapped block's re-run, then its gradient buffers from A4 = S_b + K - a
    // (its output freed). Lower blocks hold less at each instant than the unit's top
    // one; walked all the same, since a re-run's instants can meet a later block's.
    auto blocks_backward = [&](int hi, int lo, i64 pu, i64 gu, const std::string& where) {
      for (int b = hi; b >= lo; --b) {
        if (wrapped(b)) z.recompute(walk, below(b), pu, gu, recompute_of(b));
        z.backward(walk, below(b) + K - (z.stream_temp ? 0 : a), pu, gu, fsdp ? where : layer(b));
      }
    };
    // The root's reduce-scatter once the embeddings' backward is done (no dx, every save
    // released): fsdp2's flat input beside the root's full gradients, then (adding onto
    // the shard) its output beside the input, the full gradients freed; FSDP1's staging
    // shard beside the full gradient.
    auto root_reduce = [&] {
      // fsdp2's first fold under --no-sync: the root's last tensor cast beside its bf16 gradient.
      if (accum && !ms.grads_held) walk.consider(X, 0, f0, kept(0) + q(0) + units.fold_bytes[0], Phase::backward, unit(0));
      if (!fsdp || !ms.reduces) return;
      if (bf16 && !flat) {  // the fp32 cast beside the bf16 gradient, then (adding) the staging shard beside it
        walk.consider(X, 0, f0, e0 + r(0), Phase::backward, unit(0));
        if (ms.adds_to_shard) walk.consider(X, 0, f0, r(0), Phase::backward, unit(0), false, s(0));
        return;
      }
      if (flat) walk.consider(X, 0, f0, accum ? q(0) : e0, Phase::backward, unit(0), false, r(0));
      if (ms.adds_to_shard) {
        if (flat)
          walk.consider(X, 0, f0, 0, Phase::backward, unit(0), false, r(0) + s(0));
        else
          walk.consider(X, 0, f0, e0, Phase::backward, unit(0), false, s(0));
      }
    };
    if (U <= 1) {
      // ddp, zero1, a root unit: every transformer block from the top.
      blocks_backward(z.L, 1, f0, e0, unit(0));
      root_reduce();
      return;
    }
    // Units of blocks, from the last: when its backward begins dy = a and S_b are held
    // (S_b less a wrapped top block's output, freed first); zero3 gathers it (unless the
    // unit above prefetched it) and prefetches the next (not the root, still gathered);
    // its full gradient; its blocks' buffers; its reduce-scatter once its first block is
    // done (dx and S_{first} held): fsdp2's copy-in, and a staging output when it adds
    // onto the shard.
    // --overlap on: the unit above's reduce-scatter is in flight through this unit's
    // backward (held until this unit's reduce begins): FSDP1's full gradient e_{u+1},
    // fsdp2's flat input f_{u+1}, and the staging output s_{u+1} when it adds onto the shard.
    i64 pu = after_forward;
    for (int u = U - 1; u >= 1; --u) {
      const int b = units.top_block[u];
      const int first = u == 1 ? 1 : units.top_block[u - 1] + 1;
      const bool above_in_flight = units.overlap && ms.reduces && u + 1 < U;
      const i64 flight_grad = above_in_flight && !flat ? r(u + 1) : 0;
      const i64 flight_comm = above_in_flight ? (flat ? r(u + 1) : 0) + (ms.adds_to_shard ? s(u + 1) : 0) : 0;
      walk.hold(flight_grad, flight_comm);
      i64 prefetching = 0;  // fsdp2 under --overlap on: the unit below's flat buffer, its all-gather posted
      i64 cast_held = 0;    // bf16 under --overlap on: the unit below's shard cast, its all-gather posted
      const i64 S = wrapped(b) && !z.stream_temp ? held_at(b - 1) : held_at(b);
      const i64 before = root_live + kept(u) + (ms.grads_held ? q(u) : 0);  // before its full gradient is made
      if (units.reshard && flat && units.overlap) {
        // fsdp2 under --overlap on: the unit's copy-out here, after its own all-gather or
        // the wait for the one the unit above posted; then the next unit's all-gather is
        // posted into its flat buffer (held), copied out when that unit's backward begins.
        // bf16: a gather of its own casts the shards beside the flat buffer first (a posted
        // one did so at its post).
        if (bf16 && !(units.prefetch && u + 1 < U))
          walk.consider(X + a, S, pu, before, Phase::backward, unit(u), false, f(u), c(u));
        pu += f(u);
        walk.consider(X + a, S, pu, before, Phase::backward, unit(u), false, f(u));
        walk.consider(X + a, S, pu, before, Phase::backward, unit(u));
        if (units.prefetch && u - 1 >= 1) {
          prefetching = f(u - 1);
          walk.hold(flight_grad, flight_comm + prefetching);
          walk.consider(X + a, S, pu, before, Phase::backward, unit(u - 1), false, 0, c(u - 1));
        }
      } else if (units.reshard) {
        const bool prefetched = units.prefetch && u + 1 < U;
        // bf16: FSDP1's cast beside the gathered unit; fsdp2's casts beside the flat buffer
        // before the copy-out.
        if (!prefetched) {
          if (flat && bf16) walk.consider(X + a, S, pu, before, Phase::backward, unit(u), false, f(u), c(u));
          pu += f(u);
          if (flat) walk.consider(X + a, S, pu, before, Phase::backward, unit(u), false, f(u));
          walk.consider(X + a, S, pu, before, Phase::backward, unit(u), false, 0, flat ? 0 : c(u));
        }
        if (units.prefetch && u - 1 >= 1) {
          if (flat && bf16)
            walk.consider(X + a, S, pu, before, Phase::backward, unit(u - 1), false, f(u - 1), c(u - 1));
          pu += f(u - 1);
          if (flat) walk.consider(X + a, S, pu, before, Phase::backward, unit(u - 1), false, f(u - 1));
          // FSDP1's gather of the unit below allocates at its place (fsdp2's copy-out is freed past it).
          walk.consider(X + a, S, pu, before, Phase::backward, unit(u - 1), false, 0, flat ? 0 : c(u - 1));
          // FSDP1 under --overlap on: the posted gather's cast lives until that unit's wait.
          if (units.overlap && !flat) cast_held = c(u - 1);
          walk.hold(flight_grad, flight_comm, cast_held);
        }
      }
      const i64 gu = root_live + e(u) + kept(u) + own_kept(u);
      walk.consider(X + a, S, pu, gu, Phase::backward, unit(u));  // the unit's full gradient
      blocks_backward(b, first, pu, gu, unit(u));
      // fsdp2's fold under --no-sync (its first: the last tensor cast beside its bf16 gradient).
      if (accum && !ms.grads_held)
        walk.consider(X + a, below(first), pu, root_live + kept(u) + q(u) + units.fold_bytes[u],
                      Phase::backward, unit(u));
      walk.hold(0, prefetching, cast_held);  // the unit above's waited for as this unit's reduce begins
      if (ms.reduces && bf16 && !flat) {
        // FSDP1's reduce_dtype=fp32: the fp32 cast beside the bf16 gradient, then (adding
        // onto the shard) the staging shard beside the fp32 one, the bf16 freed.
        const i64 S_first = below(first);
        walk.consider(X + a, S_first, pu, gu + r(u), Phase::backward, unit(u));
        if (ms.adds_to_shard)
          walk.consider(X + a, S_first, pu, gu - e(u) + r(u), Phase::backward, unit(u), false, s(u));
      } else if (ms.reduces) {
        const i64 S_first = below(first);
        // fsdp2's copy-in: from the fp32 accumulators under --no-sync (the bf16 ones folded and freed).
        if (flat) walk.consider(X + a, S_first, pu, accum ? gu - e(u) : gu, Phase::backward, unit(u), false, r(u));
        if (ms.adds_to_shard) {
          if (flat)
            walk.consider(X + a, S_first, pu, gu - e(u), Phase::backward, unit(u), false, r(u) + s(u));
          else
            walk.consider(X + a, S_first, pu, gu, Phase::backward, unit(u), false, s(u));
        }
      }
      if (!ms.keeps_params) pu -= f(u);  // resharded after its backward
      walk.hold(0, 0);
    }
    root_reduce();
  };
  for (const MicroStep& ms : units.micro) micro_step(ms);
  return walk.best();
}

void sequence_parallel_final(StepBlocks& blocks, i64 w, i64 g) {
  blocks.head_gather = w;
  const i64 X = 16 * blocks.N, a = blocks.a, lambda = blocks.lambda;
  blocks.final_backward = [=](PeakWalk& walk, i64 A1, i64 pu, i64 gu, const std::string& where) {
    auto consider = [&](i64 temp, i64 act) { walk.consider(temp, act, pu, gu, Phase::backward, where); };
    consider(X + lambda + w, A1);
    consider(X + lambda + 2 * w, A1);
    consider(X + w + a, A1);
    consider(X + 2 * a, A1 - a);
    consider(X + 2 * a + g, A1 - a);
  };
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
