// Closed forms of the tensor-parallel MLP under ddp or zero1 along dp (docs/formulas.md,
// "Tensor parallelism").
//
// Symbols: w the width, T the tensor-parallel size, D the data-parallel size, B rows per
// rank, a = 4Bw bytes (a whole activation), o_i = a/T for a column Linear (even i) and a
// for a row Linear (odd i; L is even, so the last Linear is a row one), n_i its input
// (X = a for layer 0, a for a row... : n_i = o_{i-1}), t = a for mse's target, k = 1 when
// the model's output is saved (relu or mse).
//
// Collectives: the data-parallel group all-reduces the rank's 4P_s gradient bytes (and
// zero1 broadcasts them); the tensor-parallel group all-reduces each row Linear's output
// in forward (L/2 calls of a) and each column Linear's input gradient in backward, but
// layer 0's, whose input (the data) needs none ((L/2 - 1) calls of a).
//
// Peak: resting + the largest transient over the allocations of a step, in time order (the
// tracker keeps the first instant of the maximum): each layer's output in forward, the loss
// scalar, the loss gradient, and each layer's input gradient in backward (layer j > 0:
// its output, those below it, dy_j = o_j and dx_j = n_j live). All-reduces are in place.
#include "harness/predict/tensor_parallel_forms.hpp"

#include <algorithm>
#include <array>
#include <string>

#include "harness/predict/autocast_forms.hpp"
#include "harness/predict/autocast_step.hpp"
#include "harness/predict/gpt2_forms.hpp"
#include "harness/predict/llama_forms.hpp"
#include "harness/predict/micro_steps.hpp"
#include "harness/predict/transformer_forms.hpp"
#include "harness/strategies/partition.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

// Model states of the D ranks of a data-parallel group whose rank holds the tensors
// `sizes` (ddp or zero1 along dp, each tensor whole on its owner): 4P parameters, 4P
// gradients (+ 4P with --ddp-bucket copy), AdamW's 8 P_own + 4 T_own; the dp group
// all-reduces 4P (zero1 broadcasts 4P too), the tp group moves tp_bytes of all-reduces.
std::vector<Prediction> tensor_parallel_states(const RunConfig& cfg, const std::vector<std::int64_t>& sizes,
                                               int dp_world, std::int64_t tp_bytes) {
  SHARDSCOPE_REQUIRE(cfg.strategy == StrategyKind::ddp || cfg.strategy == StrategyKind::zero1,
                     "predict: these model states are ddp's or zero1's along dp");
  std::int64_t P = 0;
  for (std::int64_t e : sizes) P += e;
  const int tensors = static_cast<int>(sizes.size());
  Prediction p;
  p.resting[Category::param] = 4 * P;
  p.resting[Category::grad] = 4 * P + (cfg.ddp_bucket == "copy" ? 4 * P : 0);
  auto& comm = p.comm_bytes;
  comm[static_cast<int>(CollKind::all_reduce)] = 4 * P + tp_bytes;
  if (cfg.strategy == StrategyKind::zero1) comm[static_cast<int>(CollKind::broadcast)] = 4 * P;
  p.axis_comm_bytes[static_cast<int>(MeshAxis::dp)] = cfg.strategy == StrategyKind::zero1 ? 8 * P : 4 * P;
  p.axis_comm_bytes[static_cast<int>(MeshAxis::tp)] = tp_bytes;
  std::vector<std::int64_t> optim(dp_world, 0);
  if (cfg.strategy == StrategyKind::ddp) {
    std::fill(optim.begin(), optim.end(), 8 * P + 4 * tensors);
  } else {
    const std::vector<int> owner = zero1_owners(sizes, dp_world);
    for (int i = 0; i < tensors; ++i) optim[owner[i]] += 8 * sizes[i] + 4;
  }
  std::vector<Prediction> ranks(dp_world, p);
  for (int r = 0; r < dp_world; ++r) ranks[r].resting[Category::optim] = optim[r];
  return ranks;
}

}  // namespace

std::vector<std::int64_t> tensor_parallel_mlp_tensors(const ModelConfig& m, int tp) {
  const std::int64_t w = m.width;
  std::vector<std::int64_t> out;
  for (int i = 0; i < m.layers; ++i) {
    const bool column = tp > 1 && i % 2 == 0;
    out.push_back(w * w / tp);
    out.push_back(column ? w / tp : w);
  }
  if (tp == 1)
    for (int i = 0; i < m.layers; ++i) out[2 * i] = w * w;
  return out;
}

std::vector<Prediction> predict_tensor_parallel_mlp(const RunConfig& cfg, int dp_world) {
  const ModelConfig& m = cfg.model;
  const int T = cfg.mesh.tp;
  const int L = m.layers;
  SHARDSCOPE_REQUIRE(T > 1 && L % 2 == 0 && m.width % T == 0, "predict: the MLP does not split into tp");
  SHARDSCOPE_REQUIRE(cfg.strategy == StrategyKind::ddp || cfg.strategy == StrategyKind::zero1,
                     "predict: tensor parallelism runs ddp or zero1 along dp");
  const std::int64_t a = m.activation_bytes(m.batch);
  std::vector<Prediction> ranks = tensor_parallel_states(cfg, tensor_parallel_mlp_tensors(m, T), dp_world, (L - 1) * a);
  Prediction p;

  // ---- transient candidates, in time order ----
  auto o = [&](int i) { return i % 2 == 0 ? a / T : a; };
  auto n = [&](int i) { return i == 0 ? a : o(i - 1); };
  const std::int64_t X = a;
  const std::int64_t t = m.loss == Loss::mse ? a : 0;
  const bool relu = m.activation == Activation::relu;
  const std::int64_t k = (relu || m.loss == Loss::mse) ? 1 : 0;
  struct Candidate {
    std::int64_t temp = -1, activation = 0;
    Phase phase = Phase::setup;
    int layer = 0;
  } best;
  auto consider = [&](std::int64_t temp, std::int64_t activation, Phase phase, int layer) {
    if (temp + activation > best.temp + best.activation) best = {temp, activation, phase, layer};
  };
  std::int64_t below = 0;  // o_0 + ... + o_{i-1}
  for (int i = 0; i < L; ++i) {
    const std::int64_t unsaved = (i == L - 1 && k == 0) ? o(i) : 0;
    consider(X + t + unsaved, below + o(i) - unsaved, Phase::forward, i);
    below += o(i);
  }
  const std::int64_t under_last = below - o(L - 1);  // outputs 0 .. L-2
  const std::int64_t held = under_last + k * o(L - 1);
  consider(X + t + (k == 0 ? o(L - 1) : 0) + 4, held, Phase::forward, L - 1);  // the loss scalar
  consider(X + t + o(L - 1), held, Phase::backward, L - 1);                      // dy
  std::int64_t outs = held;  // outputs live while layer j's backward runs
  for (int j = L - 1; j > 0; --j) {
    consider(X + t + o(j) + n(j), outs, Phase::backward, j);  // dx_j beside dy_j
    outs -= (j == L - 1) ? k * o(j) : o(j);
  }
  p.peak_phase = best.phase;
  p.peak_where = "layer " + std::to_string(best.layer);
  const int mse = m.loss == Loss::mse ? 1 : 0;
  p.saved_after_forward_tensors = L + static_cast<int>(k) + mse;
  p.saved_after_forward_bytes = X + under_last + k * o(L - 1) + mse * a;

  for (Prediction& rank : ranks) {
    rank.peak_phase = p.peak_phase;
    rank.peak_where = p.peak_where;
    rank.saved_after_forward_tensors = p.saved_after_forward_tensors;
    rank.saved_after_forward_bytes = p.saved_after_forward_bytes;
    rank.peak_by_category = rank.resting;
    rank.peak_by_category[Category::temp] += best.temp;
    rank.peak_by_category[Category::activation] += best.activation;
    rank.peak_total = rank.peak_by_category.total();
  }
  return ranks;
}

std::vector<Prediction> predict_tensor_parallel_transformer(const RunConfig& cfg, int dp_world) {
  const ModelConfig& m = cfg.model;
  const TransformerShape& s = m.transformer;
  const int T = cfg.mesh.tp;
  SHARDSCOPE_REQUIRE(T > 1 && m.is_transformer(), "predict: the transformer does not split into tp");
  const TokenSizes z = token_sizes(s, m.batch);
  const std::int64_t L = s.layers, a = z.a;
  const bool gpt2 = m.name == "gpt2", sp = m.sequence_parallel;
  // The tp group's bytes a micro-step, by collective (docs/formulas.md, "Tensor
  // parallelism of the transformers" and "Sequence parallelism").
  std::array<std::int64_t, kCollKindCount> tp{};
  auto& all_reduce = tp[static_cast<int>(CollKind::all_reduce)];
  if (m.autocast) {
    // --precision bf16 (docs/formulas.md, "bf16 under tensor parallelism"): each block's
    // two row-parallel outputs are all-reduced in bf16 (a/2 each), its two column-parallel
    // input gradients in fp32 (a each); the embedding's output, the head's input gradient
    // and the loss's statistics and value in fp32 as without autocast. A wrapped block's
    // re-run all-reduces its two bf16 outputs again.
    const std::int64_t rerun = a * m.checkpoint.wrapped_of(s.layers);
    all_reduce = 2 * a + 3 * L * a + 8 * z.N + 4 + rerun;
  } else if (!sp) {
    // A block --checkpoint wraps runs its forward again in backward: its two row-parallel
    // all-reduces again (--checkpoint attention re-runs the attention core alone: none).
    const std::int64_t rerun = 2 * a * m.checkpoint.wrapped_of(s.layers);
    all_reduce = 2 * a + 4 * L * a + 8 * z.N + 4 + rerun;
  } else {
    // Each block all-gathers a in forward before its two column-parallel regions and
    // reduce-scatters a after its two row-parallel Linears; in backward it all-gathers
    // its output gradient and x_mid's (the reduce-scatters' backward) and ln_1's and
    // ln_2's saved tokens again, reduce-scatters its two column-parallel input gradients
    // and all-reduces its two norms' parts of their gradients (g each: LayerNorm's 2h
    // floats, RMSNorm's h). The final block gathers its norm's output for the head in
    // forward and again in backward, and reduce-scatters the head's input gradient;
    // the embedding all-reduces (GPT-2: the positions are added to the whole sum) or
    // reduce-scatters (Llama) its output and gathers its output gradient; the loss as
    // without --sp (8N + 4).
    const std::int64_t g = (gpt2 ? 8 : 4) * static_cast<std::int64_t>(s.hidden);
    all_reduce = (gpt2 ? a : 0) + 8 * z.N + 4 + (2 * L + 1) * g;
    // A block --checkpoint wraps runs its forward again in backward: its two gathers and
    // two reduce-scatters again.
    const std::int64_t rerun = 2 * a * m.checkpoint.wrapped_of(s.layers);
    tp[static_cast<int>(CollKind::reduce_scatter)] = 4 * L * a + a + (gpt2 ? 0 : a) + rerun;
    tp[static_cast<int>(CollKind::all_gather)] = 6 * L * a + 3 * a + rerun;
  }
  // Replicated kv heads (K < T): each layer's backward all-reduces its copies' gradients.
  all_reduce += L * kv_replica_all_reduce_bytes(s, T);
  // --accumulate K: every micro-step's forward and backward, each with its collectives.
  std::int64_t tp_bytes = 0;
  for (std::int64_t& b : tp) {
    b *= cfg.accumulate;
    tp_bytes += b;
  }
  std::vector<Prediction> ranks;
  if (shards_by_unit(cfg.strategy)) {
    // zero2/zero3 along dp: FSDP1's units of the rank's tensors (transformer_model_states
    // and step_units take them at cfg.mesh.tp), gathered and reduce-scattered over dp.
    SHARDSCOPE_REQUIRE(cfg.accumulate == 1 && !cfg.no_sync, "predict: accumulation of a tensor-parallel FSDP step");
    ranks = transformer_model_states(cfg, dp_world);
    for (Prediction& p : ranks) p.axis_comm_bytes[static_cast<int>(MeshAxis::dp)] = p.comm_total();
  } else {
    ranks = tensor_parallel_states(cfg, transformer_tensor_sizes(s, T), dp_world, 0);
    // ddp and zero1 all-reduce the gradients after each micro-step (once under --no-sync).
    for (Prediction& p : ranks) {
      const std::int64_t dp_reduce = p.comm_bytes[static_cast<int>(CollKind::all_reduce)];
      p.comm_bytes[static_cast<int>(CollKind::all_reduce)] = dp_reduce * reductions_per_step(cfg);
      p.axis_comm_bytes[static_cast<int>(MeshAxis::dp)] += dp_reduce * (reductions_per_step(cfg) - 1);
    }
  }
  for (Prediction& p : ranks) {
    p.axis_comm_bytes[static_cast<int>(MeshAxis::tp)] = tp_bytes;
    for (int k = 0; k < kCollKindCount; ++k) p.comm_bytes[k] += tp[k];
  }
  const StepUnits units = step_units(cfg, dp_world);
  if (m.autocast) {
    // autocast (ddp and zero1 along dp: autocast_step.hpp at tp).
    SHARDSCOPE_REQUIRE(units.bytes.empty() && !sp, "predict: a tensor-parallel autocast step under FSDP or --sp");
    const CheckpointPolicy& ck = m.checkpoint;
    complete_step(gpt2 ? gpt2_step_transient_autocast(s, m.batch, ck, T) : llama_step_transient_autocast(s, m.batch, ck, T),
                  (gpt2 ? gpt2_saved_after_forward_autocast(s, m.batch, ck, T)
                        : llama_saved_after_forward_autocast(s, m.batch, ck, T))
                      .total(),
                  ranks);
  } else if (gpt2)
    complete_step(gpt2_step_transient(s, m.batch, units, m.checkpoint, T, sp),
                  gpt2_saved_after_forward(s, m.batch, m.checkpoint, T, sp), ranks);
  else
    complete_step(llama_step_transient(s, m.batch, units, m.checkpoint, T, sp),
                  llama_saved_after_forward(s, m.batch, m.checkpoint, T, sp), ranks);
  return ranks;
}

}  // namespace shardscope
