// Closed forms for ddp, zero1, zero2 and zero3 (docs/formulas.md).
//
// Symbols: P parameters, T parameter tensors, a = B * width * 4 bytes (one layer's
// output), X = a (the batch), t = a for mse's target (else 0), k = 1 when the last
// layer's output is saved (relu or mse), L layers; for FSDP units u: f_u = 4 * padded_u
// bytes (a gathered flat parameter, or a full flat gradient), s_u = padded_u / W.
//
// Peak = resting + the largest transient over the instants where a step's live bytes
// can be highest, visited in time order (the tracker keeps the first instant of the
// maximum): each layer's output in forward, the loss scalar, the loss gradient, and
// for each unit in backward the moment its full gradient (and the first input
// gradient) is allocated.
#include <algorithm>
#include <string>
#include <vector>

#include "harness/predict/autocast_forms.hpp"
#include "harness/predict/autocast_step.hpp"
#include "harness/predict/deepspeed_forms.hpp"
#include "harness/predict/fsdp2_forms.hpp"
#include "harness/predict/gpt2_forms.hpp"
#include "harness/predict/llama_forms.hpp"
#include "harness/predict/micro_steps.hpp"
#include "harness/predict/mlp_autocast_forms.hpp"
#include "harness/predict/mlp_fsdp_bf16_forms.hpp"
#include "harness/predict/param_bf16_forms.hpp"
#include "harness/predict/tensor_parallel_forms.hpp"
#include "harness/predict/transformer_forms.hpp"
#include "harness/strategies/partition.hpp"
#include "shardscope/check.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {
namespace {

// What a step holds beyond its resting bytes at one instant, by category: the batch,
// mse's target, dy, dx, the loss scalar and unsaved outputs are temp; saved layer
// outputs activation; gathered units param_unsharded; a unit's full gradient
// grad_unsharded.
struct Transient {
  std::int64_t temp = 0, activation = 0, param_unsharded = 0, grad_unsharded = 0, comm = 0;
  std::int64_t total() const { return temp + activation + param_unsharded + grad_unsharded + comm; }
};

struct Candidate {
  Transient bytes;
  Phase phase;
  std::string where;
};

}  // namespace

namespace {

// The step's forward, backward and reduction (each distinct micro-step's under
// zero2/zero3), and the optimizer step; the communication of one micro-step.
std::vector<Prediction> one_reduction_ranks(const RunConfig& cfg, int world) {
  // zero2/zero3 under --engine fsdp2: per-tensor shards (fsdp2_forms.hpp).
  if (effective_engine(cfg.engine, cfg.strategy) == EngineKind::fsdp2) return predict_fsdp2_ranks(cfg, world);
  // zero1/zero2/zero3 under --engine deepspeed: DeepSpeed's flat group (deepspeed_forms.hpp).
  if (effective_engine(cfg.engine, cfg.strategy, cfg.precision) == EngineKind::deepspeed)
    return predict_deepspeed_ranks(cfg, world);
  // A transformer's model states (transformer_forms.hpp), and its step (gpt2_forms.hpp,
  // llama_forms.hpp).
  if (cfg.model.is_transformer()) {
    std::vector<Prediction> ranks = transformer_model_states(cfg, world);
    const TransformerShape& t = cfg.model.transformer;
    const int b = cfg.model.batch;
    const StepUnits units = step_units(cfg, world);
    const CheckpointPolicy& ck = cfg.model.checkpoint;
    // --precision bf16 under zero2/zero3/hsdp (FSDP1's MixedPrecision, GPT-2's or Llama's bf16
    // module: param_bf16_forms.hpp): fp32's resting bytes and reduce-scatter, the units gathered in bf16.
    if (cfg.model.param_bf16) {
      complete_step(transformer_step_transient(param_bf16_blocks(cfg.model, ck), units),
                    param_bf16_saved_after_forward(cfg.model, ck), ranks);
      for (Prediction& p : ranks) p.comm_bytes[static_cast<int>(CollKind::all_gather)] /= 2;
      return ranks;
    }
    // --precision bf16 (autocast, ddp and zero1: autocast_step.hpp); under zero2/zero3 its
    // peak has no form (the CLI refuses them).
    if (cfg.model.autocast) {
      if (units.bytes.empty()) {
        const bool gpt2 = cfg.model.name == "gpt2";
        complete_step(gpt2 ? gpt2_step_transient_autocast(t, b, ck) : llama_step_transient_autocast(t, b, ck),
                      (gpt2 ? gpt2_saved_after_forward_autocast(t, b, ck) : llama_saved_after_forward_autocast(t, b, ck))
                          .total(),
                      ranks);
      }
      return ranks;
    }
    if (cfg.model.name == "gpt2")
      complete_step(gpt2_step_transient(t, b, units, ck), gpt2_saved_after_forward(t, b, ck), ranks);
    else
      complete_step(llama_step_transient(t, b, units, ck), llama_saved_after_forward(t, b, ck), ranks);
    return ranks;
  }
  const ModelConfig& m = cfg.model;
  const StrategyKind s = cfg.strategy;
  const bool fsdp = shards_by_unit(s);
  const std::int64_t P = m.params();
  const int L = m.layers;
  // What every rank holds alike; only zero1's optimizer state differs by rank.
  Prediction p;
  std::vector<std::int64_t> optim(world, 0);  // per rank

  // ---- resting ----
  if (!fsdp) {
    p.resting[Category::param] = 4 * P;
    p.resting[Category::grad] = 4 * P + (cfg.ddp_bucket == "copy" ? 4 * P : 0);
    if (s == StrategyKind::ddp) {
      std::fill(optim.begin(), optim.end(), 8 * P + 4 * m.param_tensors());  // exp_avg, exp_avg_sq, step
    } else {
      const std::vector<int> owner = zero1_owners(m, world);
      for (int t = 0; t < m.param_tensors(); ++t) optim[owner[t]] += 8 * m.tensor_elems(t) + 4;
    }
    p.comm_bytes[static_cast<int>(CollKind::all_reduce)] = 4 * P;
    if (s == StrategyKind::zero1) p.comm_bytes[static_cast<int>(CollKind::broadcast)] = 4 * P;
  }
  const std::vector<Unit> units = fsdp_units(m, cfg.layers_per_unit, world);
  const int U = fsdp ? static_cast<int>(units.size()) : 1;
  std::vector<std::int64_t> f(U, 0);
  std::vector<std::int64_t> f_upto(U, 0);  // f_0 + ... + f_u
  if (fsdp) {
    std::int64_t unit_optim = 0;
    for (int u = 0; u < U; ++u) {
      f[u] = 4 * units[u].padded;
      f_upto[u] = f[u] + (u > 0 ? f_upto[u - 1] : 0);
      p.resting[Category::param] += 4 * units[u].shard;
      p.resting[Category::grad] += 4 * units[u].shard;
      unit_optim += 8 * units[u].shard + 4;
    }
    std::fill(optim.begin(), optim.end(), unit_optim);
    const std::int64_t sum_f = f_upto[U - 1];
    const bool reshard = s == StrategyKind::zero3 && U > 1;
    p.comm_bytes[static_cast<int>(CollKind::all_gather)] = reshard ? 2 * sum_f : sum_f;
    p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)] = sum_f;
  }

  // ---- transient candidates, in time order (the same on every rank) ----
  // With --checkpoint, c_i says whether layer i is wrapped: its forward is the same
  // (a Linear's input is saved either way), only the last layer's own save of its
  // output (relu) is dropped; its backward frees its forward's output, then re-runs
  // the layer (the re-run output: activation when relu saves it, else temp, freed
  // at once), then the usual backward.
  const CheckpointPolicy& ck = m.checkpoint;
  const std::int64_t a = m.activation_bytes(m.batch);
  const std::int64_t X = a;
  const std::int64_t t = m.loss == Loss::mse ? a : 0;
  const bool relu = m.activation == Activation::relu;
  const std::int64_t k = ((relu && !ck.wraps(L - 1)) || m.loss == Loss::mse) ? 1 : 0;
  const bool zero3_multi = s == StrategyKind::zero3 && U > 1;
  // Units hold K layers each (the last what is left): a layer's unit is a division.
  const int per_unit = fsdp ? units[0].last_block - units[0].first_block : L;
  auto unit_of = [&](int layer) { return std::min(layer / per_unit, U - 1); };
  auto where = [&](int layer) {
    return fsdp ? "unit " + std::to_string(unit_of(layer)) : "layer " + std::to_string(layer);
  };
  Candidate best{{-1, 0, 0, 0, 0}, Phase::setup, ""};
  auto consider = [&](const Transient& bytes, Phase phase, const std::string& at) {
    if (bytes.total() > best.bytes.total()) best = {bytes, phase, at};  // the first instant of the maximum
  };
  // --accumulate under zero2/zero3 (micro_steps.hpp): the walk runs once per distinct
  // micro-step. kept(u) = the full gradients held besides unit u's while u's backward
  // runs (u = U: before any unit's backward): the units above when the micro-step does
  // not reduce, the units below when they were kept from the micro-step before.
  const std::vector<MicroStep> micros = fsdp ? micro_steps(cfg) : std::vector<MicroStep>{MicroStep{}};
  for (const MicroStep& ms : micros) {
    auto kept = [&](int u) {
      std::int64_t held = 0;
      for (int v = 0; v < U; ++v)
        if (v != u && (v > u ? !ms.reduces : ms.grads_held)) held += f[v];
      return fsdp ? held : 0;
    };
    // zero2 gathers units as forward reaches them and holds them to their backward's end
    // (FSDP1 under --no-sync: every unit from the first micro-step's gather on).
    auto gathered_fwd = [&](int u) { return ms.params_held ? f_upto[U - 1] : f_upto[u]; };
    auto gathered_bwd = [&](int u) { return ms.keeps_params ? f_upto[U - 1] : f_upto[u]; };
    // Forward: gathered params while layer i's output is allocated; the model's last
    // output is saved only when k = 1.
    for (int i = 0; i < L; ++i) {
      const int u = unit_of(i);
      const std::int64_t gathered = !fsdp ? 0 : zero3_multi ? f[u] : gathered_fwd(u);
      const std::int64_t unsaved = (i == L - 1 && k == 0) ? a : 0;
      consider({X + t + unsaved, (i + 1) * a - unsaved, gathered, kept(U)}, Phase::forward, where(i));
    }
    const std::int64_t gathered_end = fsdp && !zero3_multi ? f_upto[U - 1] : 0;  // still gathered after forward
    const std::int64_t last_unsaved = k == 0 ? a : 0;
    consider({X + t + last_unsaved + 4, (L - 1 + k) * a, gathered_end, kept(U)}, Phase::forward, where(L - 1));  // loss scalar
    consider({X + t + a, (L - 1 + k) * a, gathered_end, kept(U)}, Phase::backward, where(L - 1));                // dy
    // Backward, per unit from the last: its top layer j still holds its output (the
    // model's last layer only when k), plus dy, the gathered params (and the prefetched
    // unit below), the full gradient and, when j > 0, the input gradient dx. A wrapped
    // top layer holds j outputs when its hook has run, then the re-run output; a lower
    // layer of the unit never holds more. A reduce-scatter adding onto the shard holds its
    // staging output (4·shard_u) beside the full gradient once the unit's first layer is
    // done (its dx, when it has a layer below, and the outputs below it live).
    // --overlap on: the unit above's reduce-scatter is in flight through this unit's
    // backward, its full gradient (f_{u+1}) and staging output (4·shard_{u+1}, when it adds
    // onto the shard) held until this unit's own is posted (fsdp.hpp).
    for (int u = U - 1; u >= 0; --u) {
      const bool above_in_flight = fsdp && cfg.overlap && ms.reduces && u + 1 < U;
      const std::int64_t flight_grad = above_in_flight ? f[u + 1] : 0;
      const std::int64_t flight_comm = above_in_flight && ms.adds_to_shard ? 4 * units[u + 1].shard : 0;
      const int j = fsdp ? units[u].last_block - 1 : L - 1;
      const bool wrapped = ck.wraps(j);
      const std::int64_t outs = wrapped ? j : (j == L - 1) ? (L - 1 + k) : (j + 1);
      Transient at{X + t + a, outs * a, 0, 0, flight_comm};
      if (fsdp) {
        at.param_unsharded = zero3_multi ? f[u] + (cfg.prefetch && u > 0 ? f[u - 1] : 0) : gathered_bwd(u);
        at.grad_unsharded = f[u] + kept(u) + flight_grad;  // the unit's full flat gradient
      }
      consider(at, Phase::backward, where(j));
      if (wrapped) {
        (relu ? at.activation : at.temp) += a;  // the re-run output
        consider(at, Phase::backward, "recompute of block " + std::to_string(j));
        if (!relu) at.temp -= a;  // freed at once
      }
      at.temp += a;  // dx
      if (j > 0) consider(at, Phase::backward, where(j));
      if (fsdp && ms.adds_to_shard) {
        const int first = units[u].first_block;
        // The unit above's reduce-scatter was waited for just before (--overlap on).
        consider({X + t + (first > 0 ? a : 0), first * a, at.param_unsharded, at.grad_unsharded - flight_grad,
                  4 * units[u].shard},
                 Phase::backward, where(first));
      }
    }
  }
  p.peak_phase = best.phase;
  p.peak_where = best.where;
  // Saved after forward: every Linear's input (the batch and the first L - 1 outputs;
  // a wrapped layer's checkpoint saves the same input), the last output when relu
  // (unless the last layer is wrapped) or mse saves it, and mse's target.
  const int mse = m.loss == Loss::mse ? 1 : 0;
  p.saved_after_forward_tensors = L + static_cast<int>(k) + mse;
  p.saved_after_forward_bytes = p.saved_after_forward_tensors * a;

  std::vector<Prediction> ranks(world, p);
  for (int r = 0; r < world; ++r) {
    Prediction& rank = ranks[r];
    rank.resting[Category::optim] = optim[r];
    rank.peak_by_category = rank.resting;
    rank.peak_by_category[Category::temp] += best.bytes.temp;
    rank.peak_by_category[Category::activation] += best.bytes.activation;
    rank.peak_by_category[Category::param_unsharded] += best.bytes.param_unsharded;
    rank.peak_by_category[Category::grad_unsharded] += best.bytes.grad_unsharded;
    rank.peak_by_category[Category::comm] += best.bytes.comm;
    rank.peak_total = rank.peak_by_category.total();
  }
  // bf16 (autocast, ddp and zero1): the same resting bytes and communication, autocast's step.
  if (m.autocast) apply_mlp_autocast_step(cfg, ranks);
  // bf16 under zero2/zero3 (FSDP1's MixedPrecision): fp32's resting bytes and reduce-scatter,
  // bf16 gathers and the bf16 step.
  if (m.param_bf16) apply_mlp_fsdp_bf16_step(cfg, units, ranks);
  return ranks;
}

}  // namespace

namespace {

// --accumulate K: ddp and zero1 run every micro-step forward and backward again on the
// same resting state (the full gradients are allocated throughout), each the first's
// bytes at the same places, so the step's peak, its place and the saves after a forward
// are one micro-step's; the all-reduce runs after every micro-step (K times its bytes),
// or after the last only under --no-sync; zero1's broadcast follows the optimizer, once.
// zero2/zero3's micro-steps differ (micro_steps.hpp: the walks take each); their
// gathers and reduce-scatters repeat as gathers_per_step and reductions_per_step say.
// DeepSpeed's forms count the whole step's (deepspeed_forms.hpp).
std::vector<Prediction> group_ranks(const RunConfig& cfg, int world) {
  std::vector<Prediction> ranks = one_reduction_ranks(cfg, world);
  const bool whole_step = effective_engine(cfg.engine, cfg.strategy, cfg.precision) == EngineKind::deepspeed;
  const std::int64_t reductions = whole_step ? 1 : reductions_per_step(cfg);
  const std::int64_t gathers = whole_step ? 1 : gathers_per_step(cfg);
  for (Prediction& p : ranks) {
    p.comm_bytes[static_cast<int>(CollKind::all_reduce)] *= reductions;
    p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)] *= reductions;
    p.comm_bytes[static_cast<int>(CollKind::all_gather)] *= gathers;
    p.axis_comm_bytes[static_cast<int>(MeshAxis::dp)] = p.comm_total();
  }
  return ranks;
}

}  // namespace

// Under --mesh a rank is its data-parallel group's rank coord.dp: the group's forms (its
// D ranks; the tensor-parallel MLP's when tp > 1), the same along tp.
std::vector<Prediction> predict_data_parallel_ranks(const RunConfig& cfg, int world) {
  if (cfg.hybrid()) {
    // HSDP: zero3 over each shard group of G consecutive ranks; after each unit's
    // reduce-scatter the W/G replicas all-reduce its gradient shard (4 bytes an element
    // of the rank's shards: its resting gradient bytes), as often as it reduce-scatters
    // (--accumulate: every micro-step, or the last under --no-sync).
    const int G = cfg.shard_group;
    if (world % G != 0)
      throw UsageError("--shard-group " + std::to_string(G) + ": it must divide the world, " + std::to_string(world) +
                       " ranks");
    std::vector<Prediction> group = group_ranks(cfg, G);
    for (Prediction& p : group) {
      p.replicate_comm_bytes = world / G > 1 ? p.resting[Category::grad] * reductions_per_step(cfg) : 0;
      p.comm_bytes[static_cast<int>(CollKind::all_reduce)] += p.replicate_comm_bytes;
    }
    std::vector<Prediction> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(group[r % G]);
    return ranks;
  }
  if (!cfg.mesh.given) return group_ranks(cfg, world);
  const MeshShape& mesh = cfg.mesh;
  // A plan's or sweep's --worlds may name other worlds than the mesh's: each is refused.
  check_mesh_world(mesh, world, "--worlds");
  SHARDSCOPE_REQUIRE(mesh.pp == 1, "predict: the mesh is not a data-parallel world");
  const std::vector<Prediction> group =
      mesh.tp == 1                  ? group_ranks(cfg, mesh.dp)
      : cfg.model.is_transformer() ? predict_tensor_parallel_transformer(cfg, mesh.dp)
                                    : predict_tensor_parallel_mlp(cfg, mesh.dp);
  std::vector<Prediction> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(group[mesh.coord(r).dp]);
  return ranks;
}

Prediction predict_data_parallel(const RunConfig& cfg, int world, int rank) {
  return predict_data_parallel_ranks(cfg, world).at(rank);
}

}  // namespace shardscope
