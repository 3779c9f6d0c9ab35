// The MLP engine and single-rank training: gradients against a float64 reference,
// saved-tensor counting as autograd counts, and the seed model's resting bytes.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/comm/self_comm.hpp"
#include "support/dp_harness.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;

// float64 reference: forward and backward of the same MLP, returning dL/dparams.
std::vector<double> reference_grads(const ModelConfig& m, const std::vector<float>& params,
                                    const std::vector<float>& x, int rows, double scale) {
  const int w = m.width;
  const int L = m.layers;
  std::vector<std::vector<double>> act(L + 1);
  act[0].assign(x.begin(), x.end());
  for (int l = 0; l < L; ++l) {
    const float* W = params.data() + l * m.layer_elems();
    const float* b = W + m.weight_elems();
    act[l + 1].assign(static_cast<std::size_t>(rows) * w, 0.0);
    for (int r = 0; r < rows; ++r)
      for (int o = 0; o < w; ++o) {
        double s = b[o];
        for (int i = 0; i < w; ++i) s += act[l][r * w + i] * W[o * w + i];
        if (m.activation == Activation::relu && s < 0) s = 0;
        act[l + 1][r * w + o] = s;
      }
  }
  const double n = static_cast<double>(rows) * w;
  std::vector<double> dy(static_cast<std::size_t>(rows) * w);
  for (std::size_t i = 0; i < dy.size(); ++i)
    dy[i] = m.loss == Loss::sum ? scale : scale * 2.0 * (act[L][i] - 1.0) / n;
  std::vector<double> grads(static_cast<std::size_t>(m.params()));
  for (int l = L - 1; l >= 0; --l) {
    if (m.activation == Activation::relu)
      for (std::size_t i = 0; i < dy.size(); ++i)
        if (act[l + 1][i] <= 0) dy[i] = 0;
    double* gW = grads.data() + l * m.layer_elems();
    double* gb = gW + m.weight_elems();
    const float* W = params.data() + l * m.layer_elems();
    for (int o = 0; o < w; ++o)
      for (int r = 0; r < rows; ++r) {
        gb[o] += dy[r * w + o];
        for (int i = 0; i < w; ++i) gW[o * w + i] += dy[r * w + o] * act[l][r * w + i];
      }
    std::vector<double> dx(dy.size(), 0.0);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < w; ++i)
        for (int o = 0; o < w; ++o) dx[r * w + i] += dy[r * w + o] * W[o * w + i];
    dy.swap(dx);
  }
  return grads;
}

TEST(Mlp, GradientsMatchFloat64Reference) {
  for (auto act : {Activation::none, Activation::relu})
    for (auto loss : {Loss::sum, Loss::mse}) {
      RunConfig cfg;
      cfg.model.layers = 3;
      cfg.model.width = 12;
      cfg.model.batch = 5;
      cfg.model.activation = act;
      cfg.model.loss = loss;
      cfg.seed = 7;
      const ModelConfig& m = cfg.model;
      std::vector<float> params = init_flat_slice(cfg, 0, m.params());
      std::vector<float> grads(params.size(), 0.0f);
      const std::vector<float> x = batch_rows(cfg, 0, 0, 0, m.batch);
      std::vector<float> target(x.size(), 1.0f);
      ASSERT_TRUE(any_nonzero(params));
      ASSERT_TRUE(any_nonzero(x));
      CpuBackend backend;
      SavedTensors saved;
      Mlp mlp(backend, m, saved);
      FlatAccess access(m, params.data(), grads.data());
      Tape tape = mlp.forward(0, m.layers, x.data(), m.batch, false, access);
      mlp.loss_forward(tape, target.data(), 0.5f);
      mlp.backward(tape, Buffer{}, access, 0.0f);
      EXPECT_EQ(saved.live(), 0);
      EXPECT_EQ(backend.tracker().current_total(), 0);
      const std::vector<double> ref = reference_grads(m, params, x, m.batch, 0.5);
      ASSERT_TRUE(any_nonzero(grads));
      for (std::size_t i = 0; i < ref.size(); ++i)
        ASSERT_NEAR(grads[i], ref[i], 1e-5 + 1e-4 * std::fabs(ref[i])) << "grad " << i;
    }
}

// Autograd's count for 8 x 256 with ReLU after every layer and MSE: 8 Linear inputs,
// 7 weight references (the data needs no gradient), 8 ReLU outputs, MSE's input and
// target = 25 saves; distinct bytes: the batch, 8 outputs and the target.
TEST(Mlp, SavedTensorsFollowAutograd) {
  RunConfig cfg;
  cfg.model.activation = Activation::relu;
  cfg.model.loss = Loss::mse;
  const ModelConfig& m = cfg.model;
  std::vector<float> params = init_flat_slice(cfg, 0, m.params());
  std::vector<float> grads(params.size());
  const std::vector<float> x = batch_rows(cfg, 0, 0, 0, m.batch);
  std::vector<float> target(x.size(), 1.0f);
  CpuBackend backend;
  SavedTensors saved;
  Mlp mlp(backend, m, saved);
  FlatAccess access(m, params.data(), grads.data());
  Tape tape = mlp.forward(0, m.layers, x.data(), m.batch, false, access);
  mlp.loss_forward(tape, target.data(), 1.0f);
  const std::int64_t a = 32 * 256 * 4;
  EXPECT_EQ(saved.live(), 25);
  EXPECT_EQ(saved.live_bytes(), 10 * a);
  mlp.backward(tape, Buffer{}, access, 0.0f);
  EXPECT_EQ(saved.total(), 25);
  EXPECT_EQ(saved.before_first_backward(), 25);
  EXPECT_EQ(saved.peak_live(), 25);
  EXPECT_EQ(saved.peak_live_bytes(), 10 * a);
  EXPECT_EQ(saved.live(), 0);
  EXPECT_EQ(saved.live_bytes(), 0);
}

// The seed model on one rank (docs/design.md §2, issue "Foundation"): 8,421,440 bytes at rest.
TEST(SingleRank, SeedModelRestsAtTheSeedsBytes) {
  RunConfig cfg = testing::seed_config();
  CpuBackend backend;
  auto comm = make_self_communicator(&backend);
  const auto r = testing::run_dp(cfg, backend, *comm, true);
  EXPECT_EQ(r.resting.total(), 8421440);
  EXPECT_EQ(r.resting[Category::param], 2105344);
  EXPECT_EQ(r.resting[Category::grad], 2105344);
  EXPECT_EQ(r.resting[Category::optim], 4210752);
  const Prediction p = predict_data_parallel(cfg, 1, 0);
  EXPECT_EQ(r.peak.total, p.peak_total);
  EXPECT_GT(r.peak.total, r.resting.total());
  // Training is real: the loss changes and matches the reference.
  const HostState ref = testing::reference_training(cfg, 1);
  ASSERT_TRUE(any_nonzero(ref.grads));
  std::size_t where = 0;
  EXPECT_EQ(testing::worst_violation(r.state.params, ref.params, 1e-5, 1e-7, &where), 0.0) << where;
  EXPECT_EQ(testing::worst_violation(r.state.grads, ref.grads, 1e-5, 1e-7, &where), 0.0) << where;
  EXPECT_NE(r.losses.front(), r.losses.back());
}

}  // namespace
}  // namespace shardscope
