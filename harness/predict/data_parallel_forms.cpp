// Closed forms for ddp, zero1, zero2 and zero3 (see README "Formulas").
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
#include <vector>

#include "harness/strategies/partition.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {
namespace {

struct Candidate {
  std::int64_t bytes;
  Phase phase;
  std::string where;
};

}  // namespace

Prediction predict_data_parallel(const RunConfig& cfg, int world, int rank) {
  const ModelConfig& m = cfg.model;
  const std::string& s = cfg.strategy;
  const bool fsdp = s == "zero2" || s == "zero3";
  const std::int64_t P = m.params();
  const int L = m.layers;
  Prediction p;

  // ---- resting ----
  if (!fsdp) {
    p.resting[Category::param] = 4 * P;
    p.resting[Category::grad] = 4 * P + (cfg.ddp_bucket == "copy" ? 4 * P : 0);
    std::int64_t own_elems = 0;
    int own_tensors = 0;
    const std::vector<int> owner = zero1_owners(m, world);
    for (int t = 0; t < m.param_tensors(); ++t)
      if (s == "ddp" || owner[t] == rank) {
        own_elems += m.tensor_elems(t);
        ++own_tensors;
      }
    p.resting[Category::optim] = 8 * own_elems + 4 * own_tensors;  // exp_avg, exp_avg_sq, step
    p.comm_bytes[static_cast<int>(CollKind::all_reduce)] = 4 * P;
    if (s == "zero1") p.comm_bytes[static_cast<int>(CollKind::broadcast)] = 4 * P;
  }
  const std::vector<Unit> units = fsdp_units(m, cfg.layers_per_unit, world);
  const int U = fsdp ? static_cast<int>(units.size()) : 1;
  std::vector<std::int64_t> f(U, 0);
  if (fsdp) {
    for (int u = 0; u < U; ++u) {
      f[u] = 4 * units[u].padded;
      p.resting[Category::param] += 4 * units[u].shard;
      p.resting[Category::grad] += 4 * units[u].shard;
      p.resting[Category::optim] += 8 * units[u].shard + 4;
    }
    std::int64_t sum_f = 0;
    for (auto b : f) sum_f += b;
    const bool reshard = s == "zero3" && U > 1;
    p.comm_bytes[static_cast<int>(CollKind::all_gather)] = reshard ? 2 * sum_f : sum_f;
    p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)] = sum_f;
  }
  const std::int64_t R = p.resting.total();

  // ---- transient candidates, in time order ----
  const std::int64_t a = m.activation_bytes(m.batch);
  const std::int64_t X = a;
  const std::int64_t t = m.loss == Loss::mse ? a : 0;
  const std::int64_t k = (m.activation == Activation::relu || m.loss == Loss::mse) ? 1 : 0;
  const bool zero3_multi = s == "zero3" && U > 1;
  auto unit_of = [&](int layer) {
    if (!fsdp) return 0;
    for (int u = 0; u < U; ++u)
      if (layer < units[u].last_layer) return u;
    return U - 1;
  };
  auto where = [&](int layer) {
    return fsdp ? "unit " + std::to_string(unit_of(layer)) : "layer " + std::to_string(layer);
  };
  std::vector<Candidate> c;
  // Forward: gathered params while layer i's output is allocated.
  for (int i = 0; i < L; ++i) {
    const int u = unit_of(i);
    std::int64_t gathered = 0;
    if (fsdp) {
      if (zero3_multi) {
        gathered = f[u];
      } else {
        for (int v = 0; v <= u; ++v) gathered += f[v];
      }
    }
    c.push_back({X + t + (i + 1) * a + gathered, Phase::forward, where(i)});
  }
  std::int64_t gathered_end = 0;  // still gathered once forward is done
  if (fsdp && !zero3_multi)
    for (auto b : f) gathered_end += b;
  c.push_back({X + t + L * a + gathered_end + 4, Phase::forward, where(L - 1)});  // loss scalar
  c.push_back({X + t + (L - 1 + k) * a + a + gathered_end, Phase::backward, where(L - 1)});  // dy
  // Backward, per unit from the last: its top layer j still holds its output (the
  // model's last layer only when k), plus dy, the gathered params, the full gradient
  // and, when j > 0, the input gradient dx.
  for (int u = U - 1; u >= 0; --u) {
    const int j = fsdp ? units[u].last_layer - 1 : L - 1;
    const std::int64_t outs = (j == L - 1) ? (L - 1 + k) : (j + 1);
    std::int64_t g = 0;
    if (fsdp) {
      if (zero3_multi) {
        g = f[u] + (cfg.prefetch && u > 0 ? f[u - 1] : 0);
      } else {
        for (int v = 0; v <= u; ++v) g += f[v];
      }
      g += f[u];  // the unit's full flat gradient
    }
    const std::int64_t base = X + t + outs * a + a + g;
    c.push_back({base, Phase::backward, where(j)});
    if (j > 0) c.push_back({base + a, Phase::backward, where(j)});
  }
  Candidate best{-1, Phase::setup, ""};
  for (const Candidate& cand : c)
    if (cand.bytes > best.bytes) best = cand;
  p.peak_total = R + best.bytes;
  p.peak_phase = best.phase;
  p.peak_where = best.where;
  return p;
}

}  // namespace shardscope
