// The MLP's step under FSDP1's MixedPrecision in closed form (mlp_fsdp_bf16_forms.hpp).
//
// Symbols: B rows, w width, L layers; a2 = 2Bw (a bf16 activation), a4 = 4Bw (the fp32
// batch X, mse's fp32 target t, and mse's fp32 temporaries); r = 1 with relu, m = 1 with
// mse, k = 1 when the last output is saved (relu or mse); for unit u: g_u = 2 padded_u (its
// bf16 gathered parameters, or its bf16 full gradient), f_u = 4 padded_u (the gradient's
// fp32 cast for the reduce-scatter), c_u = 2 shard_u (the shard's bf16 cast).
// "Every unit resharded after forward" is zero3 with more than one unit.
//
// Each instant where the live total can be highest is visited in time order; the first
// instant of the highest total is the peak (the tracker keeps the first):
//   forward   each unit's gather (its cast c_u and the bf16 unit g_u, beside what is still
//             gathered: nothing when resharded, else units 0..u-1), and each layer's
//             output (the batch's cast a2 is made by layer 0);
//   loss      its scalar (4 B), and under mse the fp32 cast of the output (a4);
//   loss grad sum: dy (a2); mse: the output's fp32 cast and mse's fp32 gradient (2 a4);
//   backward  per unit from the last: a fresh gather (the top unit, or every unit without
//             --prefetch), the prefetch of the unit below (its cast c_{u-1} held until
//             its own gather's wait under --overlap on), the bf16 full gradient g_u, each
//             layer's dx (a2, below layer 0), and the reduction's fp32 cast f_u beside
//             g_u. Under --overlap on the unit above's fp32 gradient f_{u+1} is in flight
//             through the unit's backward, and waited for just before the cast.
// The batch's cast a2 lives until layer 0's backward; a layer j's output until its own
// backward (the last only when k).
//
// Under --engine fsdp2 (fully_shard's MixedPrecisionPolicy) the same walk with its buffers,
// for unit u (A_u a rank's padded shards, E_u the unit's elements): the shards' bf16 casts
// C_u = 2 A_u (all live before the flat buffer), the flat bf16 buffer F_u = 2 W A_u (comm)
// and the gathered bf16 tensors G_u = 2 W A_u, instants at the casts beside the flat
// buffer and at the copy-out; the bf16 gradients D_u = 2 E_u; foreach_reduce's fp32 input
// R_u = 4 W A_u beside them (the copy-in casts), held in flight under --overlap on until
// the next unit's reduce; a prefetch under --overlap on holds the unit below's flat buffer
// from its post to that unit's copy-out.
#include "harness/predict/mlp_fsdp_bf16_forms.hpp"

#include <string>

#include "harness/predict/micro_steps.hpp"

namespace shardscope {
namespace {

struct Instant {
  std::int64_t temp = 0, activation = 0, param_unsharded = 0, param_cast = 0, grad_unsharded = 0, comm = 0;
  std::int64_t total() const { return temp + activation + param_unsharded + param_cast + grad_unsharded + comm; }
};

// The walk's highest instant: the first of the maximum (the tracker keeps the first).
struct Highest {
  Instant best{-1, 0, 0, 0, 0, 0};
  Phase phase = Phase::setup;
  std::string where;
  void consider(const Instant& at, Phase ph, const std::string& place) {
    if (at.total() > best.total()) {
      best = at;
      phase = ph;
      where = place;
    }
  }
};

std::string unit_place(int u) { return "unit " + std::to_string(u); }

// Whether the last layer's output outlives its forward: ReLU saves it (unless the layer is
// checkpointed: its saves are dropped), mse saves its input.
bool last_output_saved(const ModelConfig& model) {
  return (model.activation == Activation::relu && !model.checkpoint.wraps(model.layers - 1)) ||
         model.loss == Loss::mse;
}

// One layer's backward instants from its start (temp dy, activation `act` with its own
// output freed first when it is wrapped): a wrapped layer's re-run output (ReLU saves it,
// activation; else temp, freed at once), place "recompute of block j"; beta 1's bias
// gradient (temp bias_add beside dy); its dx (j > 0). `at(temp, act, place)` takes each.
template <class At>
void layer_backward(At at, int j, bool wrapped, bool relu, std::int64_t dy, std::int64_t act, std::int64_t a2,
                    std::int64_t bias_add, const std::string& place) {
  if (wrapped) {
    at(dy + (relu ? 0 : a2), act + (relu ? a2 : 0), "recompute of block " + std::to_string(j));
    if (relu) act += a2;
  }
  if (bias_add > 0) at(dy + bias_add, act, place);
  if (j > 0) at(dy + a2, act, place);
}

// Each rank's peak from the walk's highest instant above its resting bytes, and the saves
// after forward (the same under both engines): the batch's bf16 cast, outputs 0..L-2, the
// last when k (bf16), and mse's fp32 target; the weights are views of the gathered unit.
void complete(const ModelConfig& model, const Highest& h, std::vector<Prediction>& ranks) {
  const std::int64_t a2 = 2 * static_cast<std::int64_t>(model.batch) * model.width;
  const std::int64_t m = model.loss == Loss::mse ? 1 : 0;
  const std::int64_t k = last_output_saved(model) ? 1 : 0;
  for (Prediction& p : ranks) {
    p.peak_by_category = p.resting;
    p.peak_by_category[Category::temp] += h.best.temp;
    p.peak_by_category[Category::activation] += h.best.activation;
    p.peak_by_category[Category::param_unsharded] += h.best.param_unsharded;
    p.peak_by_category[Category::param_cast] += h.best.param_cast;
    p.peak_by_category[Category::grad_unsharded] += h.best.grad_unsharded;
    p.peak_by_category[Category::comm] += h.best.comm;
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = h.phase;
    p.peak_where = h.where;
    p.saved_after_forward_tensors = static_cast<int>(model.layers + k + m);
    p.saved_after_forward_bytes = (model.layers + k) * a2 + m * 2 * a2;
  }
}

}  // namespace

void apply_mlp_fsdp_bf16_step(const RunConfig& cfg, const std::vector<Unit>& units, std::vector<Prediction>& ranks) {
  const ModelConfig& model = cfg.model;
  const std::int64_t B = model.batch, w = model.width;
  const int L = model.layers;
  const std::int64_t a2 = 2 * B * w, a4 = 4 * B * w;
  const std::int64_t m = model.loss == Loss::mse ? 1 : 0;
  const std::int64_t k = last_output_saved(model) ? 1 : 0;
  const std::int64_t X = a4, t = m * a4;
  const int U = static_cast<int>(units.size());
  const bool reshard = cfg.strategy == StrategyKind::zero3 && U > 1;
  const bool prefetch = cfg.prefetch != 0;
  std::vector<std::int64_t> g(U), f(U), c(U), g_upto(U);
  for (int u = 0; u < U; ++u) {
    g[u] = 2 * units[u].padded;
    f[u] = 4 * units[u].padded;
    c[u] = 2 * units[u].shard;
    g_upto[u] = g[u] + (u > 0 ? g_upto[u - 1] : 0);
  }
  auto gathered_below = [&](int u) { return u > 0 ? g_upto[u - 1] : std::int64_t{0}; };
  // Outputs alive when layer j's backward begins: 0..j, the last only when saved; a wrapped
  // layer's own freed first (--checkpoint: its re-run makes it again).
  const CheckpointPolicy& ck = model.checkpoint;
  const bool relu = model.activation == Activation::relu;
  auto held_outputs = [&](int j) {
    return static_cast<std::int64_t>(ck.wraps(j) ? j : j == L - 1 ? L - 1 + k : j + 1);
  };

  Highest h;
  auto consider = [&](const Instant& at, Phase ph, const std::string& place) { h.consider(at, ph, place); };
  auto unit = unit_place;

  // --accumulate K (micro_steps.hpp). Every micro-step reducing: a later micro-step's
  // reduce-scatter writes a staging shard (comm, 4 shard_u), added onto the gradient.
  // --no-sync: a unit's bf16 full gradient g_u, made in the first micro-step, is kept to
  // the last one's reduction (kept(u): the units above while they do not reduce, those
  // below once kept from the micro-step before); a later micro-step's backward adds onto
  // it (the weight's in its GEMM, the bias's through a bf16 temp of 2w beside dy); FSDP1's
  // zero2 keeps every unit gathered from its first gather to the last micro-step's backward.
  for (const MicroStep& ms : micro_steps(cfg)) {
    auto kept = [&](int u) {
      std::int64_t held = 0;
      for (int v = 0; v < U; ++v)
        if (v != u && (v > u ? !ms.reduces : ms.grads_held)) held += g[v];
      return held;
    };
    const std::int64_t bias_add = ms.grads_held ? 2 * w : 0;  // beta 1: the bias's fresh bf16 gradient
    // ---- forward ----
    for (int u = 0; u < U; ++u) {
      const int first = units[u].first_block;
      const std::int64_t held = reshard ? 0 : ms.params_held ? g_upto[U - 1] - g[u] : gathered_below(u);
      // The gather: the shard's cast and the bf16 unit; the batch's cast and outputs 0..first-1.
      if (!ms.params_held)
        consider({X + t, first > 0 ? (first + 1) * a2 : 0, held + g[u], c[u], kept(U)}, Phase::forward, unit(u));
      for (int i = first; i < units[u].last_block; ++i) {
        const bool saved = i < L - 1 || k == 1;
        consider({X + t + (saved ? 0 : a2), a2 + i * a2 + (saved ? a2 : 0), held + g[u], 0, kept(U)}, Phase::forward,
                 unit(u));
      }
    }
    const std::int64_t gathered_end = reshard ? 0 : g_upto[U - 1];
    const std::int64_t saved_outputs = a2 + (L - 1 + k) * a2;  // the batch's cast, outputs 0..L-2, the last when k
    // The loss scalar; under mse beside the output's fp32 cast.
    consider({X + t + 4 + (m ? a4 : (k ? 0 : a2)), saved_outputs, gathered_end, 0, kept(U)}, Phase::forward,
             unit(U - 1));
    // The loss gradient: dy (sum) or the output's fp32 cast and mse's fp32 gradient.
    consider({X + t + (m ? 2 * a4 : a2), saved_outputs, gathered_end, 0, kept(U)}, Phase::backward,
             "layer " + std::to_string(L - 1));

    // ---- backward ----
    std::int64_t cast_held = 0;  // a prefetched unit's cast, until its gather's wait (--overlap on)
    for (int u = U - 1; u >= 0; --u) {
      const int first = units[u].first_block, top = units[u].last_block - 1;
      const bool above = cfg.overlap && ms.reduces && u + 1 < U;
      const std::int64_t flight = above ? f[u + 1] : 0;
      const std::int64_t flight_out = above && ms.adds_to_shard ? 4 * units[u + 1].shard : 0;
      const std::int64_t dy = X + t + a2;
      const std::int64_t act_top = a2 + held_outputs(top) * a2;
      std::int64_t params = reshard ? g[u] : ms.keeps_params ? g_upto[U - 1] : g_upto[u];
      // Before the unit's full gradient is made: those kept, its own among them when kept.
      const std::int64_t before = kept(u) + (ms.grads_held ? g[u] : 0) + flight;
      cast_held = 0;  // u's own gather waited for its all-gather
      if (reshard) {
        if (u == U - 1 || !prefetch) consider({dy, act_top, g[u], c[u], before, flight_out}, Phase::backward, unit(u));
        if (prefetch && u > 0) {
          consider({dy, act_top, g[u] + g[u - 1], c[u - 1], before, flight_out}, Phase::backward, unit(u - 1));
          params += g[u - 1];
          if (cfg.overlap) cast_held = c[u - 1];
        }
      }
      const std::int64_t grad = g[u] + kept(u) + flight;
      consider({dy, act_top, params, cast_held, grad, flight_out}, Phase::backward, unit(u));  // the bf16 full gradient
      for (int j = top; j >= first; --j)
        layer_backward(
            [&](std::int64_t temp, std::int64_t act, const std::string& place) {
              consider({temp, act, params, cast_held, grad, flight_out}, Phase::backward, place);
            },
            j, ck.wraps(j), relu, dy, a2 + held_outputs(j) * a2, a2, bias_add, unit(u));
      if (!ms.reduces) continue;
      // The reduction: the fp32 cast beside the bf16 gradient; dx and outputs 0..first-1 (and
      // the batch's cast) when the unit has layers below.
      consider({X + t + (first > 0 ? a2 : 0), first > 0 ? (first + 1) * a2 : 0, params, cast_held,
                g[u] + f[u] + kept(u)},
               Phase::backward, unit(u));
      // A later micro-step: the staging shard beside the fp32 gradient, the bf16 one freed.
      if (ms.adds_to_shard)
        consider({X + t + (first > 0 ? a2 : 0), first > 0 ? (first + 1) * a2 : 0, params, cast_held, f[u],
                  4 * units[u].shard},
                 Phase::backward, unit(u));
    }
  }
  complete(model, h, ranks);
  const std::int64_t gathers = reshard ? 2 : 1;
  for (Prediction& p : ranks) p.comm_bytes[static_cast<int>(CollKind::all_gather)] = gathers * g_upto[U - 1];
}

void apply_mlp_fsdp2_bf16_step(const RunConfig& cfg, const std::vector<Unit>& units, const std::vector<std::int64_t>& A,
                               const std::vector<std::int64_t>& E, std::vector<Prediction>& ranks) {
  const ModelConfig& model = cfg.model;
  const std::int64_t B = model.batch, w = model.width;
  const int L = model.layers;
  const int world = static_cast<int>(ranks.size());
  const std::int64_t a2 = 2 * B * w, a4 = 4 * B * w;
  const std::int64_t m = model.loss == Loss::mse ? 1 : 0;
  const std::int64_t k = last_output_saved(model) ? 1 : 0;
  const std::int64_t X = a4, t = m * a4;
  const int U = static_cast<int>(units.size());
  const bool reshard = cfg.strategy == StrategyKind::zero3 && U > 1;
  const bool prefetch = cfg.prefetch != 0;
  const bool accumulates = cfg.no_sync && cfg.accumulate > 1;  // fp32 gradients kept across micro-steps
  // Per unit: C the shards' casts (2 A), F the flat bf16 buffer and G the gathered bf16
  // tensors (2 W A each), R the fp32 reduce-scatter input (4 W A), D the bf16 gradients (2 E).
  std::vector<std::int64_t> C(U), F(U), G(U), R(U), D(U), G_upto(U);
  for (int u = 0; u < U; ++u) {
    C[u] = 2 * A[u];
    F[u] = G[u] = 2 * world * A[u];
    R[u] = 4 * world * A[u];
    D[u] = 2 * E[u];
    G_upto[u] = G[u] + (u > 0 ? G_upto[u - 1] : 0);
  }
  auto gathered_below = [&](int u) { return u > 0 ? G_upto[u - 1] : std::int64_t{0}; };
  const CheckpointPolicy& ck = model.checkpoint;
  const bool relu = model.activation == Activation::relu;
  auto held_outputs = [&](int j) {
    return static_cast<std::int64_t>(ck.wraps(j) ? j : j == L - 1 ? L - 1 + k : j + 1);
  };
  Highest h;
  auto consider = [&](const Instant& at, Phase ph, int u) { h.consider(at, ph, unit_place(u)); };

  // --no-sync (micro_steps.hpp): each unit's gradients are kept in fp32 (Q_u = 4 E_u) from
  // the first micro-step to the last one's reduce-scatter; every micro-step makes fresh bf16
  // ones (D_u) and folds them in when the unit's backward ends: the first casts them tensor
  // by tensor into new fp32 gradients (highest at the unit's last tensor, its layer's bias:
  // Q_u + 2w beside the rest), later ones add in place; the last copies Q_u into R_u.
  std::vector<std::int64_t> Q(U);
  for (int u = 0; u < U; ++u) Q[u] = 4 * E[u];
  for (const MicroStep& ms : micro_steps(cfg)) {
    auto kept = [&](int u) {
      std::int64_t held = 0;
      for (int v = 0; v < U; ++v)
        if (v != u && (v > u ? !ms.reduces : ms.grads_held)) held += Q[v];
      return held;
    };
    // ---- forward: each gather (the casts beside the flat buffer, then its copy-out), each output ----
    for (int u = 0; u < U; ++u) {
      const int first = units[u].first_block;
      const std::int64_t held = reshard ? 0 : gathered_below(u);
      const std::int64_t below = first > 0 ? (first + 1) * a2 : 0;
      consider({X + t, below, held, C[u], kept(U), F[u]}, Phase::forward, u);
      consider({X + t, below, held + G[u], 0, kept(U), F[u]}, Phase::forward, u);
      for (int i = first; i < units[u].last_block; ++i) {
        const bool saved = i < L - 1 || k == 1;
        consider({X + t + (saved ? 0 : a2), a2 + i * a2 + (saved ? a2 : 0), held + G[u], 0, kept(U), 0},
                 Phase::forward, u);
      }
    }
    const std::int64_t gathered_end = reshard ? 0 : G_upto[U - 1];
    const std::int64_t saved_outputs = a2 + (L - 1 + k) * a2;
    h.consider({X + t + 4 + (m ? a4 : (k ? 0 : a2)), saved_outputs, gathered_end, 0, kept(U), 0}, Phase::forward,
               unit_place(U - 1));
    h.consider({X + t + (m ? 2 * a4 : a2), saved_outputs, gathered_end, 0, kept(U), 0}, Phase::backward,
               "layer " + std::to_string(L - 1));

    // ---- backward, per unit from the last ----
    for (int u = U - 1; u >= 0; --u) {
      const int first = units[u].first_block, top = units[u].last_block - 1;
      // The unit above's input (and, in a later micro-step, its staging output) in flight.
      const std::int64_t flight =
          cfg.overlap && ms.reduces && u + 1 < U ? R[u + 1] + (ms.adds_to_shard ? 4 * A[u + 1] : 0) : 0;
      const std::int64_t dy = X + t + a2;
      const std::int64_t act_top = a2 + held_outputs(top) * a2;
      // The fp32 gradients kept: the other units' and, when kept from before, the unit's own.
      const std::int64_t held_grads = kept(u) + (ms.grads_held ? Q[u] : 0);
      std::int64_t params = reshard ? G[u] : G_upto[u];
      std::int64_t prefetching = 0;  // --overlap on: the unit below's flat buffer, its all-gather posted
      if (reshard) {
        if (u == U - 1 || !prefetch) consider({dy, act_top, 0, C[u], held_grads, F[u] + flight}, Phase::backward, u);
        // The copy-out: after its own all-gather, or after the wait for the one the unit above
        // posted (a blocking prefetch copied it out there).
        if (u == U - 1 || !prefetch || cfg.overlap)
          consider({dy, act_top, G[u], 0, held_grads, F[u] + flight}, Phase::backward, u);
        if (prefetch && u > 0) {
          consider({dy, act_top, G[u], C[u - 1], held_grads, F[u - 1] + flight}, Phase::backward, u - 1);
          if (cfg.overlap) {
            prefetching = F[u - 1];
          } else {
            consider({dy, act_top, G[u] + G[u - 1], 0, held_grads, F[u - 1] + flight}, Phase::backward, u - 1);
            params += G[u - 1];
          }
        }
      }
      const std::int64_t grads = D[u] + held_grads;  // the bf16 gradients made
      consider({dy, act_top, params, 0, grads, prefetching + flight}, Phase::backward, u);
      for (int j = top; j >= first; --j)
        layer_backward(
            [&](std::int64_t temp, std::int64_t act, const std::string& place) {
              h.consider({temp, act, params, 0, grads, prefetching + flight}, Phase::backward, place);
            },
            j, ck.wraps(j), relu, dy, a2 + held_outputs(j) * a2, a2, 0, unit_place(u));
      const std::int64_t done_temp = X + t + (first > 0 ? a2 : 0), done_act = first > 0 ? (first + 1) * a2 : 0;
      // --no-sync, the first micro-step: the fold's last tensor (the bias, w elements) cast
      // beside its bf16 gradient, every other one already fp32.
      if (accumulates && !ms.grads_held)
        consider({done_temp, done_act, params, 0, kept(u) + Q[u] + 2 * w, prefetching + flight}, Phase::backward, u);
      if (!ms.reduces) continue;
      // foreach_reduce's fp32 input beside the gradients (bf16, or the fp32 ones kept; the
      // unit above's waited for).
      const std::int64_t reduced = accumulates ? Q[u] : D[u];
      consider({done_temp, done_act, params, 0, kept(u) + reduced, R[u] + prefetching}, Phase::backward, u);
      // A later micro-step: the staging output beside the input, the gradients copied in and freed.
      if (ms.adds_to_shard)
        consider({done_temp, done_act, params, 0, kept(u), R[u] + 4 * A[u] + prefetching}, Phase::backward, u);
    }
  }
  complete(model, h, ranks);
  std::int64_t gathered = 0;
  for (int u = 0; u < U; ++u) gathered += (cfg.strategy == StrategyKind::zero3 && !units[u].root ? 2 : 1) * G[u];
  for (Prediction& p : ranks) p.comm_bytes[static_cast<int>(CollKind::all_gather)] = gathered;
}

}  // namespace shardscope
