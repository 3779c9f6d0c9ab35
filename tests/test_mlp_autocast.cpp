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
