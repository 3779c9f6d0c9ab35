// Closed forms of zero3 under --engine deepspeed (DeepSpeed's stage 3) for the MLP's run
// (deepspeed_forms.hpp; the step: harness/strategies/deepspeed_zero3.hpp; docs/formulas.md,
// "DeepSpeed: stage 3").
#include <string>
#include <vector>

#include "harness/predict/deepspeed_forms.hpp"
#include "harness/strategies/deepspeed_layout.hpp"

namespace shardscope {

Ds3Gather ds3_gather(const Ds3Layout& l, const std::vector<int>& tensors, int world) {
  Ds3Gather g;
  if (tensors.empty() || world == 1) return g;  // one rank: each tensor views its partition
  std::int64_t parts = 0, elems = 0;
  for (int t : tensors) {
    parts += l.part[t];
    elems += l.elems[t];
  }
  g.moved = 4 * world * parts;
  if (tensors.size() == 1) {
    g.held = 4 * world * parts;
  } else {
    g.held = 4 * elems;
    g.flat = 4 * world * parts;
  }
  return g;
}

namespace {

using i64 = std::int64_t;
using Gather = Ds3Gather;

Gather gather_of(const Ds3Layout& l, const std::vector<int>& tensors, int world) {
  return ds3_gather(l, tensors, world);
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
  const i64 cap = ds_bucket_elems(cfg.bucket_mb, P), Bk = 4 * cap;
  // Layer i's tensors: weight 2i, bias 2i + 1; those not persistent are gathered around it.
  std::vector<int> persistent;
  std::vector<Gather> layer(static_cast<std::size_t>(L));
  for (int i = 0; i < L; ++i) {
    std::vector<int> gathered;
    for (int t = 2 * i; t < 2 * i + 2; ++t) (l.persistent[t] ? persistent : gathered).push_back(t);
    layer[i] = gather_of(l, gathered, world);
  }
  const Gather kept = gather_of(l, persistent, world);
  // --checkpoint: a wrapped layer under ReLU gathers again for its re-run (its output is the
  // ReLU's, whose backward unpacks before the Linear's pre-backward hook fires); the re-run's
  // saves keep the weight's gathered bytes (layer j > 0, its input requiring a gradient):
  // 4·n_w when gathered with its bias, its buffer of 4W·c_w alone.
  const CheckpointPolicy& ck = m.checkpoint;
  const bool relu = m.activation == Activation::relu;
  std::vector<i64> kept_by_rerun(static_cast<std::size_t>(L), 0);
  i64 moved = 0, rerun_moved = 0;
  for (int i = 0; i < L; ++i) {
    moved += layer[i].moved;
    if (ck.wraps(i) && relu) rerun_moved += layer[i].moved;
    const int w = 2 * i;
    if (i > 0 && world > 1 && !l.persistent[w])
      kept_by_rerun[i] = l.persistent[w + 1] ? 4 * world * l.part[w] : 4 * l.elems[w];
  }

  // The MLP's activations (data_parallel_forms.cpp's walk): a = one layer's output, X the
  // batch, t_ mse's target, k = 1 when the last output is saved.
  const i64 a = m.activation_bytes(m.batch), X = a, t_ = m.loss == Loss::mse ? a : 0;
  const i64 k = ((relu && !ck.wraps(L - 1)) || m.loss == Loss::mse) ? 1 : 0;
  auto where = [](int i) { return "layer " + std::to_string(i); };
  auto rerun = [](int i) { return "recompute of block " + std::to_string(i); };

  std::vector<Prediction> ranks(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    Prediction& p = ranks[r];
    p.resting[Category::param] = 4 * C + 4 * C + kept.held;
    p.resting[Category::grad] = 4 * C;
    p.resting[Category::optim] = 8 * C + 4;
    p.resting[Category::comm] = Bk;
    p.model_states = p.resting.total() - Bk;
    p.comm_bytes[static_cast<int>(CollKind::all_reduce)] = 4 * P * K;
    p.comm_bytes[static_cast<int>(CollKind::all_gather)] = (2 * moved + rerun_moved) * K + kept.moved;

    // The zero tensors a bucket's reduction holds: 4·c_t for each of its tensors whose
    // slice of rank r is short of c_t. The buckets fill in backward order (tensor T - 1
    // first); a tensor that would overflow one reduces it first, in its layer's hook.
    auto zeros_of = [&](const std::vector<int>& bucket) {
      i64 z = 0;
      for (int t : bucket)
        if (l.real(t, r) < l.part[t]) z += 4 * l.part[t];
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
      if (layer[i].flat > 0) w.consider(X + t_, i * a, layer[i].held, 0, layer[i].flat, 0, 0, Phase::forward, where(i));
      const i64 unsaved = (i == L - 1 && k == 0) ? a : 0;
      w.consider(X + t_ + unsaved, (i + 1) * a - unsaved, layer[i].held, 0, 0, 0, 0, Phase::forward, where(i));
    }
    const i64 last_unsaved = k == 0 ? a : 0;
    w.consider(X + t_ + last_unsaved + 4, (L - 1 + k) * a, 0, 0, 0, 0, 0, Phase::forward, where(L - 1));
    w.consider(X + t_ + a, (L - 1 + k) * a, 0, 0, 0, 0, 0, Phase::backward, where(L - 1));
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
      const i64 E = 4 * (l.elems[2 * j] + l.elems[2 * j + 1]);
      const Gather& g = layer[j];
      const i64 H = kept_by_rerun[j], dy = X + t_ + a;
      i64 after = g.held;  // gathered when the hook's reductions run
      if (wrapped && relu) {
        if (g.flat > 0) w.consider(dy, outs * a, g.held, 0, g.flat, 0, 0, Phase::backward, rerun(j));
        w.consider(dy, (outs + 1) * a, g.held, 0, 0, 0, 0, Phase::backward, rerun(j));
        if (g.flat > 0) w.consider(dy, (outs + 1) * a, H + g.held, 0, g.flat, 0, 0, Phase::backward, where(j));
        w.consider(dy, (outs + 1) * a, H + g.held, E, 0, 0, 0, Phase::backward, where(j));
        if (j > 0) w.consider(dy + a, (outs + 1) * a, H + g.held, E, 0, 0, 0, Phase::backward, where(j));
      } else {
        if (g.flat > 0) w.consider(dy, outs * a, g.held, 0, g.flat, 0, 0, Phase::backward, where(j));
        w.consider(dy, outs * a, g.held, E, 0, 0, 0, Phase::backward, where(j));
        if (wrapped) {
          w.consider(dy + a, outs * a, g.held, E, 0, 0, 0, Phase::backward, rerun(j));
          after = 0;
        }
        if (j > 0) w.consider(dy + a, outs * a, wrapped ? H : g.held, E, 0, 0, 0, Phase::backward, where(j));
      }
      for (i64 z : reductions_in[j])
        w.consider(X + t_ + (j > 0 ? a : 0), j * a, after, E, 0, z, 0, Phase::backward, where(j));
    }
    // The epilogue's reduction (the batch freed), the optimizer's flattened gradient (every
    // gathered tensor released), the persistent tensors' gather after it.
    if (epilogue > 0) w.consider(0, 0, 0, 0, 0, epilogue, 0, Phase::communication, "-");
    w.consider(0, 0, 0, 0, 0, 4 * C, -kept.held, Phase::optimizer, "-");
    if (kept.flat > 0) w.consider(0, 0, 0, 0, kept.flat, 0, 0, Phase::communication, "-");

    p.peak_known = true;
    p.peak_by_category = p.resting;
    for (int c = 0; c < kCategoryCount; ++c) p.peak_by_category.bytes[c] += w.peak.bytes.bytes[c];
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = w.peak.phase;
    p.peak_where = w.peak.where;
    p.saved_after_forward_tensors = L + static_cast<int>(k) + (m.loss == Loss::mse ? 1 : 0);
    p.saved_after_forward_bytes = p.saved_after_forward_tensors * a;
  }
  return ranks;
}

}  // namespace shardscope
