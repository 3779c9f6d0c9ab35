// Closed forms for zero2/zero3 under --engine fsdp2 (fsdp2_forms.hpp; docs/formulas.md, "FSDP2").
//
// The MLP's peak: as the torch engine's walk (data_parallel_forms.cpp), with a unit's
// gathered bytes G_u = 4·W·A_u, its full gradients E_u = 4·Σ_{t∈u} d_t·e_t (unpadded,
// one per tensor) and two instants more per gather and per reduce-scatter, where the
// flat comm buffer (4·W·A_u) is live beside them: the copy-out of a gather (the flat
// buffer and every gathered tensor of the unit) and the copy-in of a reduce-scatter
// (the flat input beside the unit's full gradients). Under --checkpoint a wrapped top
// layer of a unit drops its forward's output when its backward begins and re-runs after
// the unit is gathered (FSDP2's pre-backward hook fires on the block's output gradient,
// before autograd unpacks the checkpoint's saves and recomputes): the re-run output is
// one instant more, beside the gathered unit, its full gradients and any prefetch.
// A transformer's peak: the torch engine's transformer walk (transformer_step.hpp) given
// G_u as each unit's gathered bytes, 4·E_u as its full gradient and the flat buffers.
#include "harness/predict/fsdp2_forms.hpp"

#include <algorithm>
#include <string>

#include "harness/predict/gpt2_forms.hpp"
#include "harness/predict/llama_forms.hpp"
#include "harness/predict/micro_steps.hpp"
#include "harness/predict/mlp_fsdp_bf16_forms.hpp"
#include "harness/predict/param_bf16_forms.hpp"
#include "harness/predict/transformer_forms.hpp"
#include "harness/predict/transformer_step.hpp"
#include "harness/strategies/partition.hpp"

namespace shardscope {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Elements of one dim-0 row of the transformer tensor `name` (1 for a 1-D tensor).
std::int64_t transformer_row_elems(const TransformerShape& s, const std::string& name) {
  const std::int64_t h = s.hidden, f = s.ffn, q = static_cast<std::int64_t>(s.heads) * s.head_dim;
  if (ends_with(name, ".bias") || ends_with(name, "ln_1.weight") || ends_with(name, "ln_2.weight") ||
      ends_with(name, "ln_f.weight") || ends_with(name, "layernorm.weight") || name == "model.norm.weight")
    return 1;
  if (ends_with(name, "mlp.c_proj.weight") || ends_with(name, "mlp.down_proj.weight")) return f;  // (h, f)
  if (ends_with(name, "self_attn.o_proj.weight")) return q;                                        // (h, q)
  return h;  // embeddings (num, h), the head (V, h) and every other Linear (out, h)
}

struct Transient {
  std::int64_t temp = 0, activation = 0, param_unsharded = 0, grad_unsharded = 0, comm = 0;
  std::int64_t total() const { return temp + activation + param_unsharded + grad_unsharded + comm; }
};

}  // namespace

std::vector<std::pair<std::int64_t, std::int64_t>> fsdp2_tensor_rows(const ModelConfig& model) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  if (!model.is_transformer()) {
    for (int l = 0; l < model.layers; ++l) {
      out.push_back({model.width, model.width});  // weight (w, w)
      out.push_back({model.width, 1});            // bias (w)
    }
    return out;
  }
  for (const TransformerTensor& t : transformer_tensors(model.transformer)) {
    const std::int64_t e = transformer_row_elems(model.transformer, t.name);
    out.push_back({t.elems / e, e});
  }
  return out;
}

std::vector<Prediction> predict_fsdp2_ranks(const RunConfig& cfg, int world) {
  const ModelConfig& m = cfg.model;
  const std::vector<Unit> units = fsdp_units(m, cfg.layers_per_unit, world);
  const int U = static_cast<int>(units.size());
  const std::vector<std::pair<std::int64_t, std::int64_t>> rows = fsdp2_tensor_rows(m);
  // Each tensor's block: the MLP's two a layer; a transformer's as its forms list them.
  std::vector<int> block_of(rows.size(), 0);
  if (m.is_transformer()) {
    const std::vector<TransformerTensor> tensors = transformer_tensors(m.transformer);
    for (std::size_t t = 0; t < tensors.size(); ++t) block_of[t] = tensors[t].block;
  } else {
    for (std::size_t t = 0; t < rows.size(); ++t) block_of[t] = static_cast<int>(t / 2);
  }
  std::vector<int> unit_of_block;
  for (int u = 0; u < U; ++u) {
    for (int b : units[u].block_list()) {
      if (b >= static_cast<int>(unit_of_block.size())) unit_of_block.resize(b + 1, 0);
      unit_of_block[b] = u;
    }
  }
  std::vector<std::int64_t> A(U, 0), E(U, 0);  // padded shards a rank, full gradient elements
  std::vector<std::int64_t> last(U, 0);         // elements of each unit's last tensor (a root's: its last block's)
  std::vector<std::int64_t> optim(world, 0);
  for (std::size_t t = 0; t < rows.size(); ++t) {
    const auto [d, e] = rows[t];
    const std::int64_t c = (d + world - 1) / world;
    const int u = unit_of_block[block_of[t]];
    A[u] += c * e;
    E[u] += d * e;
    last[u] = d * e;
    for (int r = 0; r < world; ++r) {
      const std::int64_t n = std::max<std::int64_t>(0, std::min(c, d - c * r));
      optim[r] += 8 * n * e + 4;
    }
  }
  Prediction p;
  std::vector<std::int64_t> G(U), G_upto(U);  // gathered bytes of unit u, of units 0..u
  std::int64_t sum_g = 0;
  for (int u = 0; u < U; ++u) {
    p.resting[Category::param] += 4 * A[u];
    p.resting[Category::grad] += 4 * A[u];
    G[u] = 4 * world * A[u];
    G_upto[u] = G[u] + (u > 0 ? G_upto[u - 1] : 0);
    sum_g += G[u];
  }
  // Units resharded after forward are gathered again in backward: zero3's, but a root's.
  const bool zero3_multi = cfg.strategy == StrategyKind::zero3 && U > 1;
  std::int64_t regathered = 0;
  for (int u = 0; u < U; ++u)
    if (cfg.strategy == StrategyKind::zero3 && !units[u].root) regathered += G[u];
  p.comm_bytes[static_cast<int>(CollKind::all_gather)] = sum_g + regathered;
  p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)] = sum_g;

  std::vector<Prediction> ranks(world, p);
  if (m.is_transformer()) {
    for (int r = 0; r < world; ++r) ranks[r].resting[Category::optim] = optim[r];
    // The torch engine's walk (transformer_step.hpp) with fsdp2's per-unit buffers: the
    // gathered tensors G_u, the full gradients 4·E_u, the flat comm buffer G_u.
    StepUnits su = step_units(cfg, world);
    for (int u = 0; u < U; ++u) {
      su.bytes[u] = G[u];
      su.grad_bytes[u] = 4 * E[u];
      su.shard_bytes[u] = 4 * A[u];
    }
    su.flat_comm = true;
    const TransformerShape& t = m.transformer;
    const CheckpointPolicy& ck = m.checkpoint;
    // bf16 (MixedPrecisionPolicy, GPT-2's or Llama's bf16 module: param_bf16_forms.hpp): the gathered
    // tensors and the flat buffer 2·W·A_u, the shards' casts 2·A_u, the bf16 gradients 2·E_u,
    // the fp32 flat input 4·W·A_u; the all-gathers carry bf16.
    if (m.param_bf16) {
      su.bf16 = true;
      su.cast_bytes.assign(U, 0);
      su.reduce_bytes.assign(U, 0);
      for (int u = 0; u < U; ++u) {
        su.bytes[u] = G[u] / 2;
        su.grad_bytes[u] = 2 * E[u];
        su.cast_bytes[u] = 2 * A[u];
        su.reduce_bytes[u] = G[u];
      }
      // --no-sync: the gradients kept in fp32 across micro-steps (fsdp2.hpp).
      if (cfg.no_sync && cfg.accumulate > 1)
        for (int u = 0; u < U; ++u) {
          su.accum_bytes.push_back(4 * E[u]);
          su.fold_bytes.push_back(2 * last[u]);
        }
      complete_step(transformer_step_transient(param_bf16_blocks(m, ck), su), param_bf16_saved_after_forward(m, ck),
                    ranks);
      for (Prediction& rank : ranks) rank.comm_bytes[static_cast<int>(CollKind::all_gather)] /= 2;
      return ranks;
    }
    if (m.name == "gpt2")
      complete_step(gpt2_step_transient(t, m.batch, su, ck), gpt2_saved_after_forward(t, m.batch, ck), ranks);
    else
      complete_step(llama_step_transient(t, m.batch, su, ck), llama_saved_after_forward(t, m.batch, ck), ranks);
    return ranks;
  }

  // bf16 (MixedPrecisionPolicy): fp32's resting bytes and reduce-scatter, bf16 gathers and step.
  if (m.param_bf16) {
    for (int r = 0; r < world; ++r) ranks[r].resting[Category::optim] = optim[r];
    apply_mlp_fsdp2_bf16_step(cfg, units, A, E, ranks);
    return ranks;
  }

  // ---- the MLP's transient candidates, in time order (the same on every rank) ----
  const int L = m.layers;
  const std::int64_t a = m.activation_bytes(m.batch);
  const std::int64_t X = a;
  const std::int64_t t = m.loss == Loss::mse ? a : 0;
  // --checkpoint: the last layer wrapped saves no output of its own (relu's is re-run).
  const CheckpointPolicy& ck = m.checkpoint;
  const bool relu = m.activation == Activation::relu;
  const std::int64_t k = ((relu && !ck.wraps(L - 1)) || m.loss == Loss::mse) ? 1 : 0;
  struct Best {
    Transient bytes{-1, 0, 0, 0, 0};
    Phase phase = Phase::setup;
    std::string where;
  } best;
  auto consider_at = [&](const Transient& bytes, Phase phase, const std::string& where) {
    if (bytes.total() > best.bytes.total()) best = {bytes, phase, where};  // the first instant of the maximum
  };
  auto consider = [&](const Transient& bytes, Phase phase, int unit) {
    consider_at(bytes, phase, "unit " + std::to_string(unit));
  };
  // --accumulate (micro_steps.hpp): one walk per distinct micro-step; kept(u) = the full
  // gradients held besides unit u's while u's backward runs (u = U: before any unit's),
  // and a reduce-scatter adding onto the shard holds its output (4·A_u) beside the flat
  // input once the unit's full gradients are copied in and freed.
  for (const MicroStep& ms : micro_steps(cfg)) {
    auto kept = [&](int u) {
      std::int64_t held = 0;
      for (int v = 0; v < U; ++v)
        if (v != u && (v > u ? !ms.reduces : ms.grads_held)) held += 4 * E[v];
      return held;
    };
    // Forward: a unit's gather at its first layer (the flat buffer beside every gathered
    // tensor of the unit, and the units still gathered), then each layer's output.
    for (int u = 0; u < U; ++u) {
      const std::int64_t held = zero3_multi || u == 0 ? 0 : G_upto[u - 1];
      const int first = units[u].first_block;
      consider({X + t, first * a, held + G[u], kept(U), G[u]}, Phase::forward, u);
      for (int i = first; i < units[u].last_block; ++i) {
        const std::int64_t gathered = zero3_multi ? G[u] : G_upto[u];
        const std::int64_t unsaved = (i == L - 1 && k == 0) ? a : 0;
        consider({X + t + unsaved, (i + 1) * a - unsaved, gathered, kept(U), 0}, Phase::forward, u);
      }
    }
    const std::int64_t gathered_end = zero3_multi ? 0 : G_upto[U - 1];
    const std::int64_t last_unsaved = k == 0 ? a : 0;
    consider({X + t + last_unsaved + 4, (L - 1 + k) * a, gathered_end, kept(U), 0}, Phase::forward, U - 1);  // loss
    consider({X + t + a, (L - 1 + k) * a, gathered_end, kept(U), 0}, Phase::backward, U - 1);                // dy
    // Backward, per unit from the last. --overlap on: the unit above's reduce-scatter is in
    // flight through this unit's backward, its flat input (G_{u+1}) and, adding onto the
    // shard, its output (4·A_{u+1}) held (FSDP2's reduce_scatter_state) until this unit's
    // reduce begins.
    for (int u = U - 1; u >= 0; --u) {
      const int j = units[u].last_block - 1, first = units[u].first_block;
      // A wrapped top layer's forward output is gone (the outputs below it stay).
      const bool wrapped = ck.wraps(j);
      const std::int64_t outs = wrapped ? j : (j == L - 1) ? (L - 1 + k) : (j + 1);
      const bool above_in_flight = cfg.overlap && ms.reduces && u + 1 < U;
      const std::int64_t flight = above_in_flight ? G[u + 1] + (ms.adds_to_shard ? 4 * A[u + 1] : 0) : 0;
      const Transient base{X + t + a, outs * a, 0, 0, flight};
      // Before the unit's full gradients are made: those kept, its own among them when
      // they were kept from the micro-step before.
      const std::int64_t before = kept(u) + (ms.grads_held ? 4 * E[u] : 0);
      std::int64_t gathered = G_upto[u];
      std::int64_t prefetching = 0;  // --overlap on: the unit below's flat buffer, its all-gather posted
      if (zero3_multi && cfg.overlap) {
        // The unit's copy-out here, after its own all-gather or the wait for the one the
        // unit above posted; then the next unit's all-gather is posted into its flat buffer,
        // copied out only when that unit's backward begins.
        consider({base.temp, base.activation, G[u], before, G[u] + flight}, Phase::backward, u);
        gathered = G[u];
        if (cfg.prefetch && u > 0) {
          prefetching = G[u - 1];
          consider({base.temp, base.activation, G[u], before, prefetching + flight}, Phase::backward, u - 1);
        }
      } else if (zero3_multi) {
        // The unit is gathered here unless the unit above prefetched it.
        const bool own_gather = u == U - 1 || !cfg.prefetch;
        if (own_gather) consider({base.temp, base.activation, G[u], before, G[u] + flight}, Phase::backward, u);
        gathered = G[u];
        if (cfg.prefetch && u > 0) {
          consider({base.temp, base.activation, G[u] + G[u - 1], before, G[u - 1] + flight}, Phase::backward, u - 1);
          gathered += G[u - 1];
        }
      }
      Transient at = base;
      at.comm += prefetching;
      at.param_unsharded = gathered;
      at.grad_unsharded = 4 * E[u] + kept(u);  // each tensor's full gradient
      consider(at, Phase::backward, u);
      if (wrapped) {
        // The re-run output (relu saves it: activation until the layer's backward ends;
        // else temp, freed at once). A lower wrapped layer of the unit never holds more.
        (relu ? at.activation : at.temp) += a;
        consider_at(at, Phase::backward, "recompute of block " + std::to_string(j));
        if (!relu) at.temp -= a;
      }
      at.temp += a;  // dx
      if (j > 0) consider(at, Phase::backward, u);
      if (!ms.reduces) continue;
      // The reduce-scatter's copy-in: the unit's first layer done, its dx (when it has a
      // layer below) and the outputs below it live.
      const Transient done{X + t + (first > 0 ? a : 0), first * a, gathered, 4 * E[u] + kept(u), G[u] + prefetching};
      consider(done, Phase::backward, u);
      if (ms.adds_to_shard)
        consider({done.temp, done.activation, gathered, kept(u), G[u] + 4 * A[u] + prefetching}, Phase::backward, u);
    }
  }
  p.peak_phase = best.phase;
  p.peak_where = best.where;
  const int mse = m.loss == Loss::mse ? 1 : 0;
  p.saved_after_forward_tensors = L + static_cast<int>(k) + mse;
  p.saved_after_forward_bytes = p.saved_after_forward_tensors * a;
  for (int r = 0; r < world; ++r) {
    Prediction& rank = ranks[r];
    rank.peak_phase = p.peak_phase;
    rank.peak_where = p.peak_where;
    rank.saved_after_forward_tensors = p.saved_after_forward_tensors;
    rank.saved_after_forward_bytes = p.saved_after_forward_bytes;
    rank.resting[Category::optim] = optim[r];
    rank.peak_by_category = rank.resting;
    rank.peak_by_category[Category::temp] += best.bytes.temp;
    rank.peak_by_category[Category::activation] += best.bytes.activation;
    rank.peak_by_category[Category::param_unsharded] += best.bytes.param_unsharded;
    rank.peak_by_category[Category::grad_unsharded] += best.bytes.grad_unsharded;
    rank.peak_by_category[Category::comm] += best.bytes.comm;
    rank.peak_total = rank.peak_by_category.total();
  }
  return ranks;
}

}  // namespace shardscope
