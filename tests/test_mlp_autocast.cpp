// --precision bf16 on the MLP under ddp and zero1 (torch.autocast(bfloat16) semantics,
// harness/model/mlp.cpp): every emulated rank measures what the closed forms predict
// (harness/predict/mlp_autocast_forms.cpp), the saves after forward are torch 2.15's
// (bench/torch_autocast_mlp.py), and the bf16 step trains: its gradients are fp32's
// within bf16's rounding, and not fp32's bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

ModelConfig mlp(int layers, int width, int batch, Activation activation, Loss loss) {
  ModelConfig m;
  m.layers = layers;
  m.width = width;
  m.batch = batch;
  m.activation = activation;
  m.loss = loss;
  return m;
}

RunConfig bf16_run(const ModelConfig& model, const char* strategy) {
  RunConfig cfg;
  cfg.model = model;
  cfg.steps = 2;
  cfg.seed = 5;
  cfg.strategy = parse_strategy(strategy);
  cfg.precision = PrecisionKind::bf16;
  cfg.model.autocast = true;  // the torch engine's bf16 (the CLI's to_config sets it)
  return cfg;
}

// Both activations and losses, ddp (one bucket, a copied bucket, 2 kB buckets) and zero1,
// --accumulate 1 and 2 (with and without --no-sync): every rank of W = 1 to 4.
TEST(MlpAutocast, MeasuredEqualsPredictedOnEveryRank) {
  struct Setting {
    const char* strategy;
    const char* bucket;
    double bucket_mb;
    int accumulate;
    bool no_sync;
  };
  const Setting settings[] = {{"ddp", "view", 0.0, 1, false},   {"ddp", "copy", 0.0, 1, false},
                              {"ddp", "view", 0.002, 1, false}, {"zero1", "view", 0.0, 1, false},
                              {"ddp", "view", 0.0, 2, false},   {"zero1", "view", 0.0, 2, true}};
  int checked = 0;
  for (const Activation act : {Activation::none, Activation::relu})
    for (const Loss loss : {Loss::sum, Loss::mse})
      for (const Setting& s : settings)
        for (int world : {1, 2, 3, 4})
          for (int rank = 0; rank < world; ++rank) {
            RunConfig cfg = bf16_run(mlp(4, 19, 3, act, loss), s.strategy);
            cfg.ddp_bucket = s.bucket;
            cfg.bucket_mb = s.bucket_mb;
            cfg.accumulate = s.accumulate;
            cfg.no_sync = s.no_sync;
            SCOPED_TRACE(std::string(s.strategy) + " bucket=" + s.bucket + " K=" + std::to_string(s.accumulate) +
                         (act == Activation::relu ? " relu" : " none") + (loss == Loss::mse ? " mse" : " sum") +
                         " W=" + std::to_string(world) + " r=" + std::to_string(rank));
            testing::expect_rank_measured_equals_predicted(cfg, world, rank);
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 2 * 6 * 10);
}

// Shapes whose peak falls at the end of forward (mse's fp32 cast beside every cast), at
// mse's fp32 gradient, at a weight gradient's bf16 and fp32 copies, and at a dx: each rank
// as predicted, and the places differ (the forms choose between instants).
TEST(MlpAutocast, PeaksInForwardAndBackwardAsPredicted) {
  std::vector<std::string> places;
  for (const ModelConfig& m : {mlp(2, 8, 8, Activation::none, Loss::mse), mlp(2, 8, 64, Activation::relu, Loss::mse),
                               mlp(3, 64, 1, Activation::none, Loss::sum), mlp(2, 16, 64, Activation::relu, Loss::sum),
                               mlp(1, 5, 2, Activation::none, Loss::mse)}) {
    for (const char* strategy : {"ddp", "zero1"}) {
      const RunConfig cfg = bf16_run(m, strategy);
      testing::expect_rank_measured_equals_predicted(cfg, 2, 1);
      const Prediction p = predict_data_parallel(cfg, 2, 1);
      places.push_back(std::string(phase_name(p.peak_phase)) + " " + p.peak_where);
      // A weight cast is live at each of these peaks but the one-layer model's (its only
      // cast, unsaved, went when the autocast region ended).
      if (m.layers > 1) {
        EXPECT_GT(p.peak_by_category[Category::param_cast], 0) << places.back();
      }
    }
  }
  EXPECT_EQ(places.front(), "forward layer 1");
  EXPECT_EQ(places[2], "backward layer 1");  // mse's fp32 gradient
  EXPECT_EQ(places[4], "backward layer 2");  // the top layer's weight gradient
  std::sort(places.begin(), places.end());
  EXPECT_GE(std::unique(places.begin(), places.end()) - places.begin(), 3);
}

// torch 2.15's saves after forward and loss under CPU autocast(bfloat16), measured by
// bench/torch_autocast_mlp.py (unique storages, parameters excluded): bytes, storages.
TEST(MlpAutocast, SavedAfterForwardEqualsTorchAutocast) {
  const struct {
    int layers, width, batch;
    Activation act;
    Loss loss;
    std::int64_t bytes;
    int storages;
  } torch215[] = {
      {3, 8, 4, Activation::none, Loss::sum, 448, 5},         {3, 8, 4, Activation::none, Loss::mse, 704, 7},
      {3, 8, 4, Activation::relu, Loss::sum, 512, 6},         {3, 8, 4, Activation::relu, Loss::mse, 768, 8},
      {4, 37, 6, Activation::none, Loss::sum, 9990, 7},       {4, 37, 6, Activation::none, Loss::mse, 11766, 9},
      {4, 37, 6, Activation::relu, Loss::sum, 10434, 8},      {4, 37, 6, Activation::relu, Loss::mse, 12210, 10},
      {8, 256, 32, Activation::none, Loss::sum, 1048576, 15}, {8, 256, 32, Activation::relu, Loss::mse, 1130496, 18},
  };
  for (const auto& t : torch215) {
    const RunConfig cfg = bf16_run(mlp(t.layers, t.width, t.batch, t.act, t.loss), "ddp");
    CpuBackend backend;
    auto comm = make_fake_communicator(1, 0, &backend);
    RunConfig one = cfg;
    one.steps = 1;
    const auto r = testing::run_dp(one, backend, *comm, false);
    const std::string what = std::to_string(t.layers) + "x" + std::to_string(t.width) + " B=" + std::to_string(t.batch);
    EXPECT_EQ(r.saved.bytes, t.bytes) << what;
    EXPECT_EQ(r.saved.tensors, t.storages) << what;
    const Prediction p = predict_data_parallel(cfg, 1, 0);
    EXPECT_EQ(p.saved_after_forward_bytes, t.bytes) << what;
    EXPECT_EQ(p.saved_after_forward_tensors, t.storages) << what;
  }
}

CheckpointPolicy every(int k) { return {CheckpointKind::every, k}; }

// --checkpoint full, every:2 and every:3 under autocast (torch's non-reentrant checkpoint
// around a layer; its re-run under the autocast state it restores): three shapes (a wide
// batch, a narrow one, one layer), both activations and losses, ddp (one bucket, a copied
// bucket), zero1, --accumulate 2 (zero1 with --no-sync): every rank of W = 1 to 4; some
// peaks fall in a re-run, some in forward (a wrapped one-layer model: the batch's cast
// beside its output, freed before the loss).
TEST(MlpAutocast, CheckpointedMeasuredEqualsPredictedOnEveryRank) {
  struct Setting {
    const char* strategy;
    const char* bucket;
    int accumulate;
    bool no_sync;
  };
  const Setting settings[] = {
      {"ddp", "view", 1, false}, {"ddp", "copy", 1, false}, {"zero1", "view", 1, false}, {"ddp", "view", 2, false},
      {"zero1", "view", 2, true}};
  int checked = 0, recompute = 0, forward = 0;
  for (const ModelConfig& shape : {mlp(4, 19, 3, Activation::none, Loss::sum), mlp(3, 8, 64, Activation::none, Loss::sum),
                                   mlp(1, 5, 2, Activation::none, Loss::sum)})
    for (const CheckpointPolicy ck : {every(1), every(2), every(3)})
      for (const Activation act : {Activation::none, Activation::relu})
        for (const Loss loss : {Loss::sum, Loss::mse})
          for (const Setting& s : settings)
            for (int world : {1, 2, 3, 4})
              for (int rank = 0; rank < world; ++rank) {
                ModelConfig m = mlp(shape.layers, shape.width, shape.batch, act, loss);
                m.checkpoint = ck;
                RunConfig cfg = bf16_run(m, s.strategy);
                cfg.ddp_bucket = s.bucket;
                cfg.accumulate = s.accumulate;
                cfg.no_sync = s.no_sync;
                SCOPED_TRACE(std::to_string(m.layers) + "x" + std::to_string(m.width) + " B=" +
                             std::to_string(m.batch) + " checkpoint=" + ck.text() + " " + s.strategy + " bucket=" +
                             s.bucket + " K=" + std::to_string(s.accumulate) +
                             (act == Activation::relu ? " relu" : " none") + (loss == Loss::mse ? " mse" : " sum") +
                             " W=" + std::to_string(world) + " r=" + std::to_string(rank));
                testing::expect_rank_measured_equals_predicted(cfg, world, rank);
                const Prediction p = predict_data_parallel(cfg, world, rank);
                recompute += p.peak_where.rfind("recompute", 0) == 0 ? 1 : 0;
                forward += p.peak_phase == Phase::forward ? 1 : 0;
                ++checked;
              }
  EXPECT_EQ(checked, 3 * 3 * 2 * 2 * 5 * 10);
  EXPECT_GT(recompute, 0);
  EXPECT_GT(forward, 0);
  EXPECT_LT(recompute + forward, checked);
}

// torch 2.15's saves after forward and loss with each (every K-th) layer inside
// torch.utils.checkpoint(use_reentrant=False) under CPU autocast(bfloat16), measured by
// bench/torch_autocast_mlp.py --checkpoint full|every:2: the checkpoint saves a wrapped
// layer's input (the fp32 batch for layer 0, else the bf16 output below) and nothing of
// what runs inside it, so no weight cast of a wrapped layer and no last ReLU output.
TEST(MlpAutocast, CheckpointedSavedAfterForwardEqualsTorchAutocast) {
  const struct {
    int layers, width, batch;
    int every;
    Activation act;
    Loss loss;
    std::int64_t bytes;
    int storages;
  } torch215[] = {
      {3, 8, 4, 1, Activation::none, Loss::sum, 256, 3},      {3, 8, 4, 1, Activation::relu, Loss::mse, 512, 5},
      {3, 8, 4, 2, Activation::none, Loss::sum, 384, 4},      {3, 8, 4, 2, Activation::relu, Loss::mse, 640, 6},
      {4, 37, 6, 1, Activation::none, Loss::sum, 2220, 4},    {4, 37, 6, 1, Activation::relu, Loss::mse, 3996, 6},
      {4, 37, 6, 2, Activation::none, Loss::sum, 7696, 6},    {4, 37, 6, 2, Activation::none, Loss::mse, 9472, 8},
      {4, 37, 6, 2, Activation::relu, Loss::sum, 8140, 7},    {4, 37, 6, 2, Activation::relu, Loss::mse, 9916, 9},
  };
  for (const auto& t : torch215) {
    ModelConfig m = mlp(t.layers, t.width, t.batch, t.act, t.loss);
    m.checkpoint = every(t.every);
    RunConfig cfg = bf16_run(m, "ddp");
    cfg.steps = 1;
    CpuBackend backend;
    auto comm = make_fake_communicator(1, 0, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    const std::string what = std::to_string(t.layers) + "x" + std::to_string(t.width) + " B=" + std::to_string(t.batch) +
                             " checkpoint=" + m.checkpoint.text();
    EXPECT_EQ(r.saved.bytes, t.bytes) << what;
    EXPECT_EQ(r.saved.tensors, t.storages) << what;
    const Prediction p = predict_data_parallel(cfg, 1, 0);
    EXPECT_EQ(p.saved_after_forward_bytes, t.bytes) << what;
    EXPECT_EQ(p.saved_after_forward_tensors, t.storages) << what;
  }
}

// A checkpointed bf16 run trains bit for bit as the unchecked one (the re-run makes the
// same casts and the same bf16 GEMMs): losses, parameters, gradients, AdamW's moments.
TEST(MlpAutocast, CheckpointedTrainsBitForBitAsUnchecked) {
  for (const Activation act : {Activation::none, Activation::relu})
    for (const Loss loss : {Loss::sum, Loss::mse})
      for (const CheckpointPolicy ck : {every(1), every(2)}) {
        auto run = [&](const CheckpointPolicy& policy) {
          ModelConfig m = mlp(3, 16, 8, act, loss);
          m.checkpoint = policy;
          RunConfig cfg = bf16_run(m, "ddp");
          CpuBackend backend;
          auto comm = make_fake_communicator(1, 0, &backend);
          return testing::run_dp(cfg, backend, *comm, true);
        };
        const auto plain = run(CheckpointPolicy{});
        const auto checked = run(ck);
        SCOPED_TRACE(ck.text());
        ASSERT_TRUE(testing::any_nonzero(plain.state.grads));
        EXPECT_EQ(plain.losses, checked.losses);
        EXPECT_EQ(plain.state.params, checked.state.params);
        EXPECT_EQ(plain.state.grads, checked.state.grads);
        EXPECT_EQ(plain.state.exp_avg, checked.state.exp_avg);
        EXPECT_EQ(plain.state.exp_avg_sq, checked.state.exp_avg_sq);
      }
}

// One rank, one step on the same data and parameters: bf16's gradients are fp32's within
// what bf16 rounding allows (the difference's norm a few parts in 256 of theirs: a ReLU
// whose input is near 0 may switch, so single elements can differ more), and differ from them.
TEST(MlpAutocast, GradientsAreFp32sWithinBf16Rounding) {
  for (const Loss loss : {Loss::sum, Loss::mse}) {
    RunConfig cfg = bf16_run(mlp(3, 32, 16, Activation::relu, loss), "ddp");
    cfg.steps = 1;
    RunConfig fp32 = cfg;
    fp32.precision = PrecisionKind::fp32;
    fp32.model.autocast = false;
    CpuBackend b16, b32;
    auto c16 = make_fake_communicator(1, 0, &b16);
    auto c32 = make_fake_communicator(1, 0, &b32);
    const auto r16 = testing::run_dp(cfg, b16, *c16, true);
    const auto r32 = testing::run_dp(fp32, b32, *c32, true);
    const std::vector<float>& g16 = r16.state.grads;
    const std::vector<float>& g32 = r32.state.grads;
    ASSERT_EQ(g16.size(), g32.size());
    double norm = 0.0, diff = 0.0;
    int differ = 0;
    for (std::size_t i = 0; i < g32.size(); ++i) {
      norm += static_cast<double>(g32[i]) * g32[i];
      diff += (static_cast<double>(g16[i]) - g32[i]) * (static_cast<double>(g16[i]) - g32[i]);
      differ += g16[i] != g32[i];
    }
    ASSERT_GT(norm, 0.0);
    EXPECT_LE(std::sqrt(diff / norm), 0.03) << (loss == Loss::mse ? "mse" : "sum");
    EXPECT_GT(differ, static_cast<int>(g32.size()) / 2) << "bf16 arithmetic left the gradients as fp32's";
    EXPECT_NEAR(r16.losses[0], r32.losses[0], 0.02 * std::fabs(r32.losses[0]) + 1e-3);
  }
}

}  // namespace
}  // namespace shardscope
