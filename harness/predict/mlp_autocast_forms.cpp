// The MLP's autocast step in closed form (mlp_autocast_forms.hpp).
//
// Symbols: B rows, w width, L layers; a2 = 2Bw (a bf16 activation), a4 = 4Bw (the fp32
// batch X; mse's fp32 target t, its fp32 cast of the output and its fp32 gradient),
// c = 2w^2 (a weight's bf16 cast), cb = 2w (a bias's), r = 1 with relu (the last output is
// then saved), m = 1 with mse.
//
// Forward only allocates, so its highest instant is its last allocation (the loss's):
//   temp X + t + 4 + (1 - r) a2, activation (L + r) a2 + m a4, param_cast L (c + cb).
// The autocast region then ends: the bias casts and layer 0's weight cast (which
// autograd does not save: its input needs no gradient) are freed, and the unsaved last
// output. Backward holds X + t, the batch's cast a2 and, at layer j, outputs 0..j-1 and
// its own (the last only with relu), the weight casts of layers 1..j, and dy (a2):
//   loss gradient  sum: dy; mse: its fp32 gradient a4 beside its fp32 input a4;
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
  const std::int64_t B = model.batch, w = model.width;
  const int L = model.layers;
  const std::int64_t a2 = 2 * B * w, a4 = 4 * B * w, c = 2 * w * w, cb = 2 * w;
  const std::int64_t r = model.activation == Activation::relu ? 1 : 0;
  const std::int64_t m = model.loss == Loss::mse ? 1 : 0;
  const std::int64_t X = a4, t = m * a4;

  Instant best{-1, 0, 0};
  Phase phase = Phase::setup;
  std::string where;
  auto consider = [&](const Instant& at, Phase ph, int layer) {
    if (at.total() > best.total()) {
      best = at;
      phase = ph;
      where = "layer " + std::to_string(layer);
    }
  };
  // The end of forward: the loss scalar (sum) or mse's fp32 cast of the output.
  consider({X + t + 4 + (1 - r) * a2, (L + r) * a2 + m * a4, L * (c + cb)}, Phase::forward, L - 1);
  // The loss gradient: dy (sum), or mse's fp32 gradient beside its fp32 input.
  const std::int64_t top_outputs = (L - 1 + r) * a2;  // outputs 0..L-2, and the last with relu
  if (m == 0) consider({X + t + a2, a2 + top_outputs, (L - 1) * c}, Phase::backward, L - 1);
  else consider({X + t + a4, a2 + top_outputs + a4, (L - 1) * c}, Phase::backward, L - 1);
  // Layer j's backward: its dW (bf16, then its fp32 cast), then dx.
  for (int j = L - 1; j >= 0; --j) {
    const std::int64_t outputs = (j + (j < L - 1 ? 1 : r)) * a2;
    Instant at{X + t + a2, a2 + outputs, j * c};
    at.temp += 2 * w * w + 4 * w * w;
    consider(at, Phase::backward, j);
    at.temp -= 6 * w * w;
    if (j > 0) {
      at.temp += a2;
      consider(at, Phase::backward, j);
    }
  }
  for (Prediction& p : ranks) {
    p.peak_by_category = p.resting;
    p.peak_by_category[Category::temp] += best.temp;
    p.peak_by_category[Category::activation] += best.activation;
    p.peak_by_category[Category::param_cast] += best.param_cast;
    p.peak_total = p.peak_by_category.total();
    p.peak_phase = phase;
    p.peak_where = where;
    // Saved after forward: the batch's cast, outputs 0..L-2 (layers 1..L-1's inputs), the
    // weight casts of layers 1..L-1, the last output with relu; mse's fp32 input and target.
    p.saved_after_forward_tensors = static_cast<int>(2 * L - 1 + r + 2 * m);
    p.saved_after_forward_bytes = (L + r) * a2 + (L - 1) * c + m * 2 * a4;
  }
}

}  // namespace shardscope
