// Shared test bench for the transformer families (test_gpt2.cpp, test_llama.cpp): one
// forward and backward of a model on the cpu backend with host parameters, the
// gradients against central finite differences of the loss, AdamW on one batch, and
// every emulated rank's figures against predict_data_parallel.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "support/dp_harness.hpp"

namespace shardscope::testing {

// A small transformer of `family` ("gpt2": tied head and biases; "llama": neither), head_dim
// hidden / heads, positions = seq.
inline TransformerShape shape(const char* family, int layers, int hidden, int heads, int kv_heads, int ffn, int vocab,
                       int seq, AttentionMode mode) {
  TransformerShape t;
  t.model_type = family;
  t.layers = layers;
  t.hidden = hidden;
  t.heads = heads;
  t.kv_heads = kv_heads;
  t.head_dim = hidden / heads;
  t.ffn = ffn;
  t.vocab = vocab;
  t.seq = seq;
  t.positions = seq;
  const bool gpt2 = std::string(family) == "gpt2";
  t.tied_embeddings = t.qkv_bias = t.out_bias = gpt2;
  t.attention = mode;
  return t;
}


inline const char* mode_name(AttentionMode m) { return m == AttentionMode::flash ? "flash" : "math"; }

// The model config of a transformer family (`family`: the registry's name) of this shape,
// `batch` sequences per rank.
inline ModelConfig transformer_model(const std::string& family, const TransformerShape& shape, int batch) {
  ModelConfig m;
  m.name = family;
  m.layers = shape.layers;
  m.width = shape.hidden;
  m.batch = batch;
  m.transformer = shape;
  return m;
}

// One step of the model under ddp at one rank (its saves after forward, its loss, its
// resting bytes).
inline DpResult run_one_step(const ModelConfig& m) {
  RunConfig cfg;
  cfg.model = m;
  cfg.steps = 1;
  cfg.strategy = StrategyKind::ddp;
  CpuBackend backend;
  auto comm = make_fake_communicator(1, 0, &backend);
  return run_dp(cfg, backend, *comm, false);
}

// One forward and loss of the model on the slice's batch, with `params` (host memory on
// the cpu backend), leaving the tape for a backward.
struct Pass {
  CpuBackend backend;
  SavedTensors saved;
  std::unique_ptr<Model> model;
  std::vector<float> grads;
  std::vector<float> x;
  Buffer target;
  Tape tape;
  float loss = 0.0f;
};

inline void forward(Pass& p, const ModelConfig& m, std::vector<float>& params, std::uint64_t seed) {
  p.model = make_model(m);
  p.grads.assign(params.size(), -3.0f);  // beta 0 must overwrite
  const DataSlice at{seed, 0, 0, 0, m.batch};
  p.x = p.model->host_input(at);
  p.target = p.model->make_target(p.backend, at);
  FlatAccess access(*p.model, params.data(), p.grads.data());
  ModelContext mc{p.backend, p.saved, access};
  p.tape = p.model->forward(mc, 0, p.model->blocks(), p.x.data(), m.batch, false);
  p.loss = p.model->loss_forward(mc, p.tape, p.target.data(), 1.0f);
}

// The backward of the pass's tape, gradients overwritten into p.grads.
inline void backward(Pass& p, std::vector<float>& params) {
  FlatAccess access(*p.model, params.data(), p.grads.data());
  ModelContext mc{p.backend, p.saved, access};
  p.model->backward(mc, p.tape, Buffer{}, 0.0f);  // releases what the forward saved
}

inline float loss_of(const ModelConfig& m, std::vector<float>& params, std::uint64_t seed) {
  Pass p;
  forward(p, m, params, seed);
  backward(p, params);
  return p.loss;
}

// What one step at one rank leaves: the loss near log V (a small init predicts nearly
// uniformly) and nothing the forward made outlives the step (no activation, no temp at rest).
inline void expect_one_step_near_uniform_and_clean(const DpResult& r, int vocab) {
  ASSERT_EQ(r.losses.size(), 1u);
  EXPECT_NEAR(r.losses[0], std::log(static_cast<float>(vocab)), 0.1f);
  EXPECT_EQ(r.resting[Category::activation], 0);
  EXPECT_EQ(r.resting[Category::temp], 0);
}

// cfg's strategy at one rank trains like the single-rank reference (gradients and
// parameters after cfg.steps); emulated at W = 2 every rank holds the same saves.
inline void expect_one_rank_trains_like_the_reference(const RunConfig& cfg) {
  CpuBackend backend;
  auto comm = make_fake_communicator(1, 0, &backend);
  const auto r = run_dp(cfg, backend, *comm, true);
  const HostState ref = reference_training(cfg, 1);
  ASSERT_TRUE(any_nonzero(ref.grads));
  std::size_t at = 0;
  EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
  EXPECT_EQ(worst_violation(r.state.params, ref.params, 1e-5, 1e-7, &at), 0.0) << "params at " << at;
  for (int rank = 0; rank < 2; ++rank) {
    CpuBackend b2;
    auto fake = make_fake_communicator(2, rank, &b2);
    const auto e = run_dp(cfg, b2, *fake, false);
    EXPECT_EQ(e.saved.bytes, r.saved.bytes);
    EXPECT_EQ(e.saved.tensors, r.saved.tensors);
  }
}

// Central differences of the fp32 loss against the backward's gradient, on a tiny model
// with parameters drawn large enough that every path carries signal: every tensor's
// first two elements, its middle one and its last.
inline void expect_gradients_equal_finite_differences(const ModelConfig& m) {
  const auto model = make_model(m);
  std::vector<float> params = model->init_flat_slice(7, 0, model->params());
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i] += 0.3f * hashed_uniform(99, 1, i);  // biases and norms off their zeros and ones

  Pass p;
  forward(p, m, params, 5);
  backward(p, params);
  EXPECT_EQ(p.saved.live(), 0);
  ASSERT_TRUE(any_nonzero(p.grads));
  const std::vector<float> grads = p.grads;
  int checked = 0;
  for (int t = 0; t < model->param_tensors(); ++t) {
    const std::int64_t off = model->tensor_offset(t), n = model->tensor_elems(t);
    for (std::int64_t e : {std::int64_t{0}, std::int64_t{1}, n / 2, n - 1}) {
      const std::size_t i = static_cast<std::size_t>(off + e);
      const float keep = params[i], h = 1e-2f;
      params[i] = keep + h;
      const double up = loss_of(m, params, 5);
      params[i] = keep - h;
      const double down = loss_of(m, params, 5);
      params[i] = keep;
      const double fd = (up - down) / (2.0 * h);
      EXPECT_NEAR(grads[i], fd, 2e-3 + 2e-2 * std::fabs(fd)) << model->tensor(t).name << "[" << e << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * model->param_tensors());
}

// The losses of `steps` AdamW steps (lr 1e-2) on one fixed batch.
inline std::vector<float> adamw_losses(const ModelConfig& m, int steps) {
  const auto model = make_model(m);
  std::vector<float> params = model->init_flat_slice(0, 0, model->params());
  std::vector<float> exp_avg(params.size(), 0.0f), exp_avg_sq(params.size(), 0.0f);
  AdamWHyper hyper;
  hyper.lr = 1e-2;
  std::vector<float> losses;
  for (int step = 1; step <= steps; ++step) {
    Pass p;
    forward(p, m, params, 4);
    backward(p, params);
    losses.push_back(p.loss);
    std::vector<AdamWTensor> list;
    for (int t = 0; t < model->param_tensors(); ++t) {
      const std::int64_t off = model->tensor_offset(t);
      list.push_back({params.data() + off, p.grads.data() + off, exp_avg.data() + off, exp_avg_sq.data() + off,
                      static_cast<std::size_t>(model->tensor_elems(t)), step});
    }
    host::adamw(hyper, list);
  }
  return losses;
}

// One emulated rank of cfg against predict_data_parallel: resting and peak bytes per
// category, the peak's phase and place, the bytes handed to collectives and the saves
// after forward.
inline void expect_rank_measured_equals_predicted(const RunConfig& cfg, int world, int rank) {
  CpuBackend backend;
  auto comm = make_fake_communicator(world, rank, &backend);
  const auto r = run_dp(cfg, backend, *comm, false);
  const Prediction p = predict_data_parallel(cfg, world, rank);
  ASSERT_TRUE(p.peak_known);
  EXPECT_EQ(r.saved.bytes, p.saved_after_forward_bytes);
  EXPECT_EQ(r.saved.tensors, p.saved_after_forward_tensors);
  EXPECT_EQ(r.resting, p.resting);
  EXPECT_EQ(r.peak.total, p.peak_total);
  for (int k = 0; k < kCategoryCount; ++k)
    EXPECT_EQ(r.peak.by_category.bytes[k], p.peak_by_category.bytes[k]) << kCategoryNames[k];
  EXPECT_EQ(std::string(phase_name(r.peak.phase)), std::string(phase_name(p.peak_phase)));
  EXPECT_EQ(r.where, p.peak_where);
  for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]) << kCollKindNames[k];
}

// The data-parallel settings the families' tests run: every strategy, FSDP's root unit
// alone and units of one and two blocks, with and without prefetch.
struct DpSetting {
  const char* strategy;
  int units, prefetch;
};
inline constexpr DpSetting kDpSettings[] = {{"ddp", 0, 1},   {"zero1", 0, 1}, {"zero2", 0, 1},
                                            {"zero3", 0, 1}, {"zero2", 1, 1}, {"zero3", 1, 1},
                                            {"zero3", 1, 0}, {"zero3", 2, 1}, {"zero2", 2, 0}};

// Every emulated rank of W = 1 to 4 under every setting, for a model; returns how many
// ranks were checked.
inline int expect_measured_equals_predicted_everywhere(const ModelConfig& model, const std::string& label) {
  int checked = 0;
  for (const DpSetting& setting : kDpSettings)
    for (int world : {1, 2, 3, 4})
      for (int rank = 0; rank < world; ++rank) {
        RunConfig cfg;
        cfg.model = model;
        cfg.steps = 2;
        cfg.strategy = parse_strategy(setting.strategy);
        cfg.layers_per_unit = setting.units;
        cfg.prefetch = setting.prefetch;
        SCOPED_TRACE(label + " " + setting.strategy + " units=" + std::to_string(setting.units) +
                     " prefetch=" + std::to_string(setting.prefetch) + " W=" + std::to_string(world) +
                     " r=" + std::to_string(rank));
        expect_rank_measured_equals_predicted(cfg, world, rank);
        ++checked;
      }
  return checked;
}

// A drawn strategy, FSDP units, prefetch, world and rank of the model (`pick(lo, hi)`
// draws an int in [lo, hi]), and --checkpoint none, full, every:2, every:3 or attention
// (drawn last, so the earlier draws are those made before checkpointing existed): the
// rank measures what its closed forms predict.
template <typename Pick>
void expect_drawn_rank_measures_its_prediction(const ModelConfig& model, std::uint64_t seed, Pick&& pick) {
  const char* strategies[] = {"ddp", "zero1", "zero2", "zero3"};
  RunConfig cfg;
  cfg.model = model;
  cfg.steps = 2;
  cfg.seed = seed;
  cfg.strategy = parse_strategy(strategies[pick(0, 3)]);
  cfg.layers_per_unit = pick(0, model.transformer.layers);
  cfg.prefetch = pick(0, 1);
  const int world = pick(1, 4), rank = pick(0, world - 1);
  const int every = pick(0, 4);
  if (every == 4)
    cfg.model.checkpoint = {CheckpointKind::attention, 1};
  else if (every > 0)
    cfg.model.checkpoint = {CheckpointKind::every, every};
  SCOPED_TRACE(std::string(strategy_name(cfg.strategy)) + " checkpoint=" + cfg.model.checkpoint.text() +
               " units=" + std::to_string(cfg.layers_per_unit) +
               " prefetch=" + std::to_string(cfg.prefetch) + " " + mode_name(model.transformer.attention) +
               " W=" + std::to_string(world) + " r=" + std::to_string(rank));
  expect_rank_measured_equals_predicted(cfg, world, rank);
}

}  // namespace shardscope::testing
