// Closed forms of zero3 under --engine deepspeed (DeepSpeed's stage 3) for the MLP's run
// (deepspeed_forms.hpp; the step: harness/strategies/deepspeed_zero3.hpp; docs/formulas.md,
// "DeepSpeed: stage 3").
#include <string>
#include <vector>

#include "harness/predict/deepspeed_forms.hpp"
#include "harness/strategies/deepspeed_layout.hpp"

namespace shardscope {

Ds3Gather ds3_gather(const Ds3Layout& l, const std::vector<int>& tensors, int world, std::int64_t e) {
  Ds3Gather g;
  if (tensors.empty() || world == 1) return g;  // one rank: each tensor views its partition
  std::int64_t parts = 0, elems = 0;
  for (int t : tensors) {
    parts += l.part[t];
    elems += l.elems[t];
  }
  g.moved = e * world * parts;
  if (tensors.size() == 1) {
    g.held = e * world * parts;
  } else {
    g.held = e * elems;
    g.flat = e * world * parts;
  }
  return g;
}

namespace {

using i64 = std::int64_t;
using Gather = Ds3Gather;

Gather gather_of(const Ds3Layout& l, const std::vector<int>& tensors, int world, i64 e) {
  return ds3_gather(l, tensors, world, e);
}

// Stage 3's instants name seven categories (DeepSpeedPeak keeps the first of the largest).
struct Walk {
  DeepSpeedPeak peak;
  void consider(i64 temp, i64 act, i64 gathered, i64 grads, i64 comm, i64 grad, i64 param, Phase ph,
                const std::string& at) {
    CategoryBytes b;
    b[Category::temp] = temp;
    b[Category::activation] = act;
    b[Category::param_unsharded] = gathered;
    b[Category::grad_unsharded] = grads;
    b[Category::comm] = comm;
    b[Category::grad] = grad;
    b[Category::param] = param;
    peak.consider(b, ph, at);
  }
};

}  // namespace

std::vector<Prediction> predict_deepspeed_stage3_mlp(const RunConfig& cfg, int world) {
  const ModelConfig& m = cfg.model;
  const Ds3Layout l = ds3_layout(model_tensor_elems(m), world, cfg.param_persistence);
  const int L = m.layers, T = m.param_tensors(), K = cfg.accumulate;
  const i64 C = l.flat, P = m.params();
  // Bytes an element of the partitions, gathers, gradients and bucket: 4, or 2 under bf16
  // (the master weights and AdamW fp32).
  const bool bf16 = cfg.precision == PrecisionKind::bf16;
  const i64 e = bf16 ? 2 : 4;
  const i64 cap = ds_bucket_elems(cfg.bucket_mb, model_tensor_elems(cfg.model)), Bk = e * cap;
  // Layer i's tensors: weight 2i, bias 2i + 1; those not persistent are gathered around it.
  std::vector<int> persistent;
  std::vector<Gather> layer(static_cast<std::size_t>(L));
  for (int i = 0; i < L; ++i) {
    std::vector<int> gathered;
    for (int t = 2 * i; t < 2 * i + 2; ++t) (l.persistent[t] ? persistent : gathered).push_back(t);
    layer[i] = gather_of(l, gathered, world, e);
  }
  const Gather kept = gather_of(l, persistent, world, e);
  // --checkpoint: a wrapped layer under ReLU gathers again for its re-run (its output is the
  // ReLU's, whose backward unpacks before the Linear's pre-backward hook fires); the re-run's
  // saves keep the layer's gathered bytes (LinearFunctionForZeroStage3 saves weight and bias,
  // every layer): H_j = h_j, all it gathers.
  const CheckpointPolicy& ck = m.checkpoint;
  const bool relu = m.activation == Activation::relu;
  std::vector<i64> kept_by_rerun(static_cast<std::size_t>(L), 0);
  i64 moved = 0, rerun_moved = 0;
  for (int i = 0; i < L; ++i) {
    moved += layer[i].moved;
    if (ck.wraps(i) && relu) rerun_moved += layer[i].moved;
    kept_by_rerun[i] = layer[i].held;
  }

  // The MLP's activations (data_parallel_forms.cpp's walk): a = one layer's output, X the
  // batch, t_ mse's target, k = 1 when the last output is saved. bf16 (the bf16 module,
  // deepspeed_forms.cpp's bf16_mlp_ranks): a = 2Bw, the batch and mse's target fp32 (a4 =
  // 4Bw each), the batch's bf16 cast (cast = a, activation) made by layer 0's forward and
  // held to its backward; mse's loss adds an fp32 cast of the output (a4) at its scalar
  // and two fp32 temporaries at its gradient.
  const bool mse = m.loss == Loss::mse;
  const i64 a4 = m.activation_bytes(m.batch), a = bf16 ? a4 / 2 : a4, X = a4, t_ = mse ? a4 : 0;
  const i64 cast = bf16 ? a : 0;
  // The cast past layer 0's forward: a wrapped layer 0 drops it (its checkpoint saves the
  // fp32 batch) and its re-run casts the batch again.
  const i64 cast_kept = ck.wraps(0) ? 0 : cast;
  const i64 k = ((relu && !ck.wraps(L - 1)) || mse) ? 1 : 0;
  auto where = [](int i) { return "layer " + std::to_string(i); };
  auto rerun = [](int i) { return "recompute of block " + std::to_string(i); };

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
    p.comm_bytes[static_cast<int>(CollKind::all_gather)] = (2 * moved + rerun_moved) * K + kept.moved;

    // The zero tensors a bucket's reduction holds: 4·c_t for each of its tensors whose
    // slice of rank r is short of c_t. The buckets fill in backward order (tensor T - 1
    // first); a tensor that would overflow one reduces it first, in its layer's hook.
    auto zeros_of = [&](const std::vector<int>& bucket) {
      i64 z = 0;
      for (int t : bucket)
        if (l.real(t, r) < l.part[t]) z += e * l.part[t];
      return z;
    };
    std::vector<std::vector<i64>> reductions_in(static_cast<std::size_t>(L));  // each's zeros, by layer
    std::vector<int> bucket;
    i64 used = 0;
    for (int t = T - 1; t >= 0; --t) {
      if (used + l.elems[t] > cap && used > 0) {
        reductions_in[t / 2].push_back(zeros_of(bucket));
        bucket.clear();
        used = 0;
      }
      bucket.push_back(t);
      used += l.elems[t];
    }
    const i64 epilogue = zeros_of(bucket);

    Walk w;
    // Forward: layer i's gather (the flat buffer beside its tensors), then its output; the
    // loss scalar; the loss's gradient.
    for (int i = 0; i < L; ++i) {
      const i64 below = (i > 0 ? cast_kept : 0) + i * a;  // the batch's cast and the outputs below
      if (layer[i].flat > 0) w.consider(X + t_, below, layer[i].held, 0, layer[i].flat, 0, 0, Phase::forward, where(i));
      const bool saved = i < L - 1 || k == 1;
      w.consider(X + t_ + (saved ? 0 : a), (i == 0 ? cast : 0) + below + (saved ? a : 0), layer[i].held, 0, 0, 0, 0,
                 Phase::forward, where(i));
    }
    const i64 outputs_kept = cast_kept + (L - 1 + k) * a;
    w.consider(X + t_ + 4 + (bf16 && mse ? a4 : k == 0 ? a : 0), outputs_kept, 0, 0, 0, 0, 0, Phase::forward,
               where(L - 1));
    w.consider(X + t_ + (bf16 && mse ? 2 * a4 : a), outputs_kept, 0, 0, 0, 0, 0, Phase::backward, where(L - 1));
    // Backward, layer j from the top: its gather, its gradients E_j, its dx (j > 0); in its
    // hook (its dy and output gone, dx kept) each bucket it reduces, with its zero tensors.
    // A wrapped layer (its forward's output freed: j outputs held) under ReLU: the re-run's
    // gather and output (activation, kept), the release keeping H_j, the backward's gather
    // beside it, its gradients and dx; without ReLU: the backward's gather and gradients,
    // the re-run's output (temp, freed at once), its release keeping H_j alone through dx.
    // H_j is freed when the layer's backward has run, before its hook's reductions.
    for (int j = L - 1; j >= 0; --j) {
      const bool wrapped = ck.wraps(j);
      const i64 outs = wrapped ? j : j == L - 1 ? L - 1 + k : j + 1;
      const i64 acts = cast_kept + outs * a;  // held as the layer's backward starts
      const i64 recast = wrapped && j == 0 ? cast : 0;  // layer 0's re-run casts the batch again
      const i64 E = e * (l.elems[2 * j] + l.elems[2 * j + 1]);
      const Gather& g = layer[j];
      const i64 H = kept_by_rerun[j], dy = X + t_ + a;
      i64 after = g.held;  // gathered when the hook's reductions run
      if (wrapped && relu) {
        if (g.flat > 0) w.consider(dy, acts, g.held, 0, g.flat, 0, 0, Phase::backward, rerun(j));
        w.consider(dy, acts + recast + a, g.held, 0, 0, 0, 0, Phase::backward, rerun(j));
        if (g.flat > 0) w.consider(dy, acts + recast + a, H + g.held, 0, g.flat, 0, 0, Phase::backward, where(j));
        w.consider(dy, acts + recast + a, H + g.held, E, 0, 0, 0, Phase::backward, where(j));
        if (j > 0) w.consider(dy + a, acts + a, H + g.held, E, 0, 0, 0, Phase::backward, where(j));
      } else {
        if (g.flat > 0) w.consider(dy, acts, g.held, 0, g.flat, 0, 0, Phase::backward, where(j));
        w.consider(dy, acts, g.held, E, 0, 0, 0, Phase::backward, where(j));
        if (wrapped) {
          w.consider(dy + a, acts + recast, g.held, E, 0, 0, 0, Phase::backward, rerun(j));
          after = 0;
        }
        if (j > 0) w.consider(dy + a, acts, wrapped ? H : g.held, E, 0, 0, 0, Phase::backward, where(j));
      }
      for (i64 z : reductions_in[j])
        w.consider(X + t_ + (j > 0 ? a : 0), (j > 0 ? cast_kept : 0) + j * a, after, E, 0, z, 0, Phase::backward,
                   where(j));
    }
    // The epilogue's reduction (the batch freed), the optimizer's flattened gradient (every
    // gathered tensor released), the persistent tensors' gather after it.
    if (epilogue > 0) w.consider(0, 0, 0, 0, 0, epilogue, 0, Phase::communication, "-");
    // bf16: the flattened partitions in bf16 beside their fp32 cast.
    w.consider(0, 0, 0, 0, 0, (bf16 ? 2 * C : 0) + 4 * C, -kept.held, Phase::optimizer, "-");
    if (kept.flat > 0) w.consider(0, 0, 0, 0, kept.flat, 0, 0, Phase::communication, "-");

    p.peak_known = true;
    p.peak_by_category = p.resting;
    for (int c = 0; c < kCategoryCount; ++c) p.peak_by_category.bytes[c] += w.peak.bytes.bytes[c];
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = w.peak.phase;
    p.peak_where = w.peak.where;
    p.saved_after_forward_tensors = L + static_cast<int>(k) + (mse ? 1 : 0);
    // Layer 0's save: the batch's bf16 cast, or under its checkpoint the fp32 batch.
    p.saved_after_forward_bytes = (ck.wraps(0) ? a4 : a) + (L - 1 + k) * a + (mse ? a4 : 0);
  }
  return ranks;
}

}  // namespace shardscope
