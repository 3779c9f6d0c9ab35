// The MLP's autocast step in closed form (mlp_autocast_forms.hpp).
//
// Symbols: B rows, w width, L layers; a2 = 2Bw (a bf16 activation), a4 = 4Bw (the fp32
// batch X; mse's fp32 target t, its fp32 cast of the output and its fp32 gradient),
// c = 2w^2 (a weight's bf16 cast), cb = 2w (a bias's), r = 1 with relu, m = 1 with mse;
// --checkpoint: ω_i = 1 when layer i is wrapped, r' = r(1 - ω_{L-1}) (the last output is
// saved only by an unwrapped relu), n = #{1 <= i < L: not ω_i} weight casts autograd saves.
//
// Forward, layer i, at its output (the last allocation of its forward): X + t, the
// batch's cast a2 (unless ω_0 and i > 0: a wrapped first layer's dropped save frees it),
// outputs 0..i (the last temp unless r'), and every cast so far (i + 1)(c + cb) (cached
// or saved: all live until the loss ends the region). The loss: + 4 (sum's scalar) or
// + 4 and mse's fp32 cast a4. The region then ends: the cache lets go of the bias casts,
// layer 0's weight cast and the wrapped layers' weight casts, and the unsaved last output.
// Backward holds X + t and dy (a2); at layer j, the batch's cast (unless ω_0, until
// layer 0 re-runs), outputs 0..j-1, its own output (unwrapped: held, the last only when
// r'; wrapped: freed when its backward begins, the re-run's held under relu) and the
// saved weight casts of the unwrapped layers 1..j-1 and of layer j:
//   loss gradient  sum: dy; mse: its fp32 gradient a4 beside its fp32 input a4;
//   re-run of j    (ω_j) from the held bytes less its output: the batch's cast again for
//                  j = 0, c + cb, its output a2 (activation under relu, else temp, freed
//                  at once): "recompute of block j"; its region's exit frees cb (and c
//                  for j = 0, whose input needs no gradient);
//   layer j        dW in bf16 (2w^2) and its fp32 cast (4w^2); then dx (a2) for j > 0.
// The first instant of the highest total is the peak (the tracker keeps the first).
#include "harness/predict/mlp_autocast_forms.hpp"

#include <string>

namespace shardscope {
namespace {

struct Instant {
  std::int64_t temp = 0, activation = 0, param_cast = 0;
  std::int64_t total() const { return temp + activation + param_cast; }
};

}  // namespace

void apply_mlp_autocast_step(const RunConfig& cfg, std::vector<Prediction>& ranks) {
  const ModelConfig& model = cfg.model;
  const CheckpointPolicy& ck = model.checkpoint;
  const std::int64_t B = model.batch, w = model.width;
  const int L = model.layers;
  const std::int64_t a2 = 2 * B * w, a4 = 4 * B * w, c = 2 * w * w, cb = 2 * w;
  const std::int64_t r = model.activation == Activation::relu ? 1 : 0;
  const std::int64_t m = model.loss == Loss::mse ? 1 : 0;
  const std::int64_t X = a4, t = m * a4;
  const bool wrapped0 = ck.wraps(0);
  const std::int64_t r_last = (r == 1 && !ck.wraps(L - 1)) ? 1 : 0;  // r'
  // Saved weight casts of the unwrapped layers 1..j-1.
  auto saved_casts_below = [&](int j) {
    std::int64_t n = 0;
    for (int i = 1; i < j; ++i) n += ck.wraps(i) ? 0 : 1;
    return n;
  };

  Instant best{-1, 0, 0};
  Phase phase = Phase::setup;
  std::string where;
  auto consider_at = [&](const Instant& at, Phase ph, const std::string& place) {
    if (at.total() > best.total()) {
      best = at;
      phase = ph;
      where = place;
    }
  };
  auto consider = [&](const Instant& at, Phase ph, int layer) { consider_at(at, ph, "layer " + std::to_string(layer)); };
  // Forward: each layer's output.
  for (int i = 0; i < L; ++i) {
    const std::int64_t batch_cast = (i == 0 || !wrapped0) ? a2 : 0;
    const std::int64_t last_unsaved = (i == L - 1 && r_last == 0) ? a2 : 0;
    consider({X + t + last_unsaved, batch_cast + (i + 1) * a2 - last_unsaved, (i + 1) * (c + cb)}, Phase::forward, i);
  }
  // The end of forward: the loss scalar (sum) or mse's fp32 cast of the output.
  const std::int64_t batch_cast = wrapped0 ? 0 : a2;
  consider({X + t + 4 + (1 - r_last) * a2, batch_cast + (L - 1 + r_last) * a2 + m * a4, L * (c + cb)}, Phase::forward,
           L - 1);
  // The loss gradient: dy (sum), or mse's fp32 gradient beside its fp32 input.
  const std::int64_t top_outputs = (L - 1 + r_last) * a2;  // outputs 0..L-2, and the last when r'
  const std::int64_t top_casts = saved_casts_below(L) * c;
  if (m == 0) consider({X + t + a2, batch_cast + top_outputs, top_casts}, Phase::backward, L - 1);
  else consider({X + t + a4, batch_cast + top_outputs + a4, top_casts}, Phase::backward, L - 1);
  // Layer j's backward: a wrapped layer's re-run, its dW (bf16, then its fp32 cast), then dx.
  for (int j = L - 1; j >= 0; --j) {
    const bool wrapped = ck.wraps(j);
    const std::int64_t below = (j > 0 && !wrapped0 ? a2 : 0) + j * a2;  // the batch's cast, outputs 0..j-1
    const std::int64_t casts_below = saved_casts_below(j) * c;
    if (wrapped) {
      // The re-run: the batch's cast again (j = 0), the weight's and bias's casts, its output.
      Instant re{X + t + a2 + (r == 1 ? 0 : a2), below + (j == 0 ? a2 : 0) + (r == 1 ? a2 : 0), casts_below + c + cb};
      consider_at(re, Phase::backward, "recompute of block " + std::to_string(j));
    }
    const std::int64_t own = wrapped ? r * a2 : (j < L - 1 ? a2 : r_last * a2);
    Instant at{X + t + a2, below + (j == 0 ? a2 : 0) + own, casts_below + (j > 0 ? c : 0)};
    at.temp += 2 * w * w + 4 * w * w;
    consider(at, Phase::backward, j);
    at.temp -= 6 * w * w;
    if (j > 0) {
      at.temp += a2;
      consider(at, Phase::backward, j);
    }
  }
  // Saved after forward: layer 0's input (the batch's cast a2; wrapped, the fp32 batch a4
  // its checkpoint saves), outputs 0..L-2 (layers 1..L-1's inputs), the weight casts of the
  // unwrapped layers 1..L-1, the last output when r'; mse's fp32 input and target.
  const std::int64_t n = saved_casts_below(L);
  for (Prediction& p : ranks) {
    p.peak_by_category = p.resting;
    p.peak_by_category[Category::temp] += best.temp;
    p.peak_by_category[Category::activation] += best.activation;
    p.peak_by_category[Category::param_cast] += best.param_cast;
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = phase;
    p.peak_where = where;
    p.saved_after_forward_tensors = static_cast<int>(L + n + r_last + 2 * m);
    p.saved_after_forward_bytes = (wrapped0 ? a4 : a2) + (L - 1 + r_last) * a2 + n * c + m * 2 * a4;
  }
}

}  // namespace shardscope
