// Shared test bench for data-parallel strategies: runs one rank in-process and
// trains the single-rank reference (the concatenated global batch, averaged
// gradients) that every strategy must match.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "harness/model/data.hpp"
#include "harness/model/model.hpp"
#include "harness/strategies/data_parallel.hpp"
#include "kernels/host_ops.hpp"
#include "shardscope/predict.hpp"
#include "shardscope/strategy.hpp"

namespace shardscope::testing {

struct DpResult {
  CategoryBytes resting;
  PeakRecord peak;
  std::string where;
  CommLedger ledger;
  HostState state;
  std::vector<float> losses;
  SavedAfterForward saved;  // the last step's
};

inline DpResult run_dp(const RunConfig& cfg, Backend& backend, Communicator& comm, bool gather) {
  StrategyContext ctx{cfg, backend, comm};
  auto strategy = make_strategy(ctx);
  strategy->setup();
  DpResult r;
  for (int s = 0; s < cfg.steps; ++s) {
    strategy->prepare_batch(s);
    r.losses.push_back(strategy->step());
  }
  r.saved = strategy->saved_after_forward();
  r.resting = backend.tracker().current();
  r.peak = backend.tracker().peak();
  r.where = describe_place(r.peak.place);
  r.ledger = comm.ledger();
  if (gather) r.state = strategy->gather_state();
  return r;
}

// One rank trained on the W ranks' batches concatenated, gradients averaged over
// ranks (a sum loss scaled by 1/W; a mean, mse's or cross-entropy's, already averages).
// Each rank's rows and target come from the model's own data hook (host_input,
// make_target), so any model cfg.model names trains here.
// With `losses`: before each step's update, each rank's own loss on its batch under the
// step's parameters (losses[step][rank], scaled as a rank's step scales it), what every
// rank of a mesh whose data-parallel index is that rank reports.
inline HostState reference_training(const RunConfig& cfg, int world,
                                    std::vector<std::vector<float>>* losses = nullptr) {
  const ModelConfig& m = cfg.model;
  CpuBackend backend;
  SavedTensors saved;
  const std::unique_ptr<Model> model = make_model(m);
  HostState h;
  h.params = init_flat_slice(cfg, 0, model->params());
  h.grads.assign(static_cast<std::size_t>(model->params()), 0.0f);
  h.exp_avg.assign(h.grads.size(), 0.0f);
  h.exp_avg_sq.assign(h.grads.size(), 0.0f);
  FlatAccess access(*model, h.params.data(), h.grads.data());
  ModelContext mc{backend, saved, access};
  const int rows = m.batch * world;
  const float scale = model->loss_is_mean() ? 1.0f : 1.0f / static_cast<float>(world);
  for (int s = 0; s < cfg.steps; ++s) {
    if (losses) {
      losses->emplace_back();
      for (int r = 0; r < world; ++r) {
        const DataSlice at{cfg.seed, s, r, 0, m.batch};
        const std::vector<float> part = model->host_input(at);
        const Buffer t = model->make_target(backend, at);
        saved.reset();
        Tape tape = model->forward(mc, 0, model->blocks(), part.data(), m.batch, false);
        losses->back().push_back(model->loss_forward(mc, tape, t.data(), scale));
        // Its backward releases the saves; the step's backward below overwrites the gradients.
        model->backward(mc, tape, Buffer{}, 0.0f);
      }
    }
    std::vector<float> x, target;
    for (int r = 0; r < world; ++r) {
      const DataSlice at{cfg.seed, s, r, 0, m.batch};
      const std::vector<float> part = model->host_input(at);
      x.insert(x.end(), part.begin(), part.end());
      const Buffer t = model->make_target(backend, at);  // host memory on the cpu backend
      target.insert(target.end(), t.data(), t.data() + t.count());
    }
    saved.reset();
    Tape tape = model->forward(mc, 0, model->blocks(), x.data(), rows, false);
    model->loss_forward(mc, tape, target.data(), scale);
    model->backward(mc, tape, Buffer{}, 0.0f);
    std::vector<AdamWTensor> list;
    for (int t = 0; t < model->param_tensors(); ++t) {
      const std::int64_t off = model->tensor_offset(t);
      list.push_back({h.params.data() + off, h.grads.data() + off, h.exp_avg.data() + off,
                      h.exp_avg_sq.data() + off, static_cast<std::size_t>(model->tensor_elems(t)), s + 1});
    }
    host::adamw(AdamWHyper{}, list);
  }
  return h;
}

// Largest violation of |a - b| <= atol + rtol * |b| (0 when all close), and the index.
// atol is taken relative to the vector's largest magnitude when that exceeds 1: fp32
// sums of O(10) terms (a sum loss over a batch) that cancel to near zero carry an
// absolute error of ~1e-7 of the terms, whichever order computes them.
inline double worst_violation(const std::vector<float>& a, const std::vector<float>& b, double rtol,
                              double atol, std::size_t* where) {
  double largest = 1.0;
  for (float x : b) largest = std::max(largest, static_cast<double>(std::fabs(x)));
  atol *= largest;
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]) - (atol + rtol * std::fabs(b[i]));
    if (d > worst) {
      worst = d;
      *where = i;
    }
  }
  return worst;
}

inline bool any_nonzero(const std::vector<float>& v) {
  for (float x : v)
    if (x != 0.0f) return true;
  return false;
}

inline RunConfig seed_config() {
  RunConfig c;
  c.model = ModelConfig{};  // 8 x 256, none, sum, batch 32
  c.steps = 3;
  return c;
}

}  // namespace shardscope::testing
