// The model interface and the MLP behind it, and single-rank training: the registry,
// the MLP's blocks against the closed forms the predictions use, gradients against a
// float64 reference (whole and zero-bubble backward), saved-tensor counting as autograd
// counts, and the seed model's resting bytes.
#include <gtest/gtest.h>

#include <cmath>

#include "harness/comm/self_comm.hpp"
#include "harness/strategies/partition.hpp"
#include "shardscope/check.hpp"
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

// A model of blocks unlike the MLP's, built from the interface alone: y = x + b (a
// parameter, nothing saved) and y = 2x (no parameter), under a sum loss.
class ShiftBlock final : public Block {
 public:
  explicit ShiftBlock(int width) : width_(width), params_{{"bias", {width}, 0.5f}} {}
  std::string name() const override { return "shift"; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  std::int64_t input_elems(int rows) const override { return std::int64_t{rows} * width_; }
  std::int64_t output_elems(int rows) const override { return std::int64_t{rows} * width_; }
  bool saves_input() const override { return false; }
  bool saves_output() const override { return false; }
  Buffer forward(const BlockCall& c, const float* in, bool, bool output_saved, BlockTape&) override {
    Buffer out = c.backend.alloc(output_saved ? Category::activation : Category::temp, output_elems(c.rows));
    c.backend.copy(out.data(), in, out.count());
    c.backend.bias_activation(out.data(), c.access.param(c.index, 0), c.rows, width_, Activation::none);
    return out;
  }
  Buffer backward(const BlockCall& c, const float*, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape&) override {
    c.backend.bias_grad(c.access.grad(c.index, 0), dy.data(), c.rows, width_, beta);
    Buffer dx = needs_dx ? pass(c, dy) : Buffer{};
    dy.reset();
    out.reset();
    return dx;
  }
  Buffer backward_input(const BlockCall& c, const float*, Buffer& out, Buffer dy, bool needs_dx, bool free_output,
                        BlockTape& tape) override {
    if (free_output) out.reset();
    Buffer dx = needs_dx ? pass(c, dy) : Buffer{};
    tape.held.push_back(std::move(dy));
    return dx;
  }
  void backward_weight(const BlockCall& c, const float*, float beta, BlockTape& tape) override {
    c.backend.bias_grad(c.access.grad(c.index, 0), tape.held.at(0).data(), c.rows, width_, beta);
    tape.held.clear();
  }

 private:
  static Buffer pass(const BlockCall& c, const Buffer& dy) {
    Buffer dx = c.backend.alloc(Category::temp, dy.count());
    c.backend.copy(dx.data(), dy.data(), dy.count());
    return dx;
  }
  int width_;
  std::vector<ParamSpec> params_;
};

class DoubleBlock final : public Block {
 public:
  explicit DoubleBlock(int width) : width_(width) {}
  std::string name() const override { return "double"; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  std::int64_t input_elems(int rows) const override { return std::int64_t{rows} * width_; }
  std::int64_t output_elems(int rows) const override { return std::int64_t{rows} * width_; }
  bool saves_input() const override { return false; }
  bool saves_output() const override { return false; }
  Buffer forward(const BlockCall& c, const float* in, bool, bool output_saved, BlockTape&) override {
    Buffer out = c.backend.alloc(output_saved ? Category::activation : Category::temp, output_elems(c.rows));
    c.backend.copy(out.data(), in, out.count());
    c.backend.scale(out.data(), 2.0f, out.count());
    return out;
  }
  Buffer backward(const BlockCall& c, const float*, Buffer& out, Buffer dy, bool needs_dx, float,
                  BlockTape&) override {
    Buffer dx = needs_dx ? twice(c, dy) : Buffer{};
    dy.reset();
    out.reset();
    return dx;
  }
  Buffer backward_input(const BlockCall& c, const float*, Buffer& out, Buffer dy, bool needs_dx, bool free_output,
                        BlockTape&) override {
    if (free_output) out.reset();
    return needs_dx ? twice(c, dy) : Buffer{};
  }
  void backward_weight(const BlockCall&, const float*, float, BlockTape&) override {}

 private:
  static Buffer twice(const BlockCall& c, const Buffer& dy) {
    Buffer dx = c.backend.alloc(Category::temp, dy.count());
    c.backend.copy(dx.data(), dy.data(), dy.count());
    c.backend.scale(dx.data(), 2.0f, dx.count());
    return dx;
  }
  int width_;
  std::vector<ParamSpec> params_;
};

class SumLoss final : public ModelLoss {
 public:
  explicit SumLoss(int width) : width_(width) {}
  bool saves_input() const override { return false; }
  bool is_mean() const override { return false; }
  std::int64_t target_elems(int) const override { return 0; }
  void fill_target(Backend&, float*, const DataSlice&) const override {}
  void forward(Backend& backend, SavedTensors&, const float* y, const float*, int rows, float scale,
               float* value) override {
    backend.loss(Loss::sum, y, nullptr, nullptr, value, rows, width_, scale);
  }
  Buffer backward(Backend& backend, SavedTensors&, const float* y, const float*, int rows, float scale) override {
    Buffer dy = backend.alloc(Category::temp, static_cast<std::size_t>(rows) * width_);
    backend.loss(Loss::sum, y, nullptr, dy.data(), nullptr, rows, width_, scale);
    return dy;
  }

 private:
  int width_;
};

TEST(Model, RunsBlocksOtherThanTheMlpsWithAndWithoutParameters) {
  const int w = 4, rows = 3;
  std::vector<std::unique_ptr<Block>> blocks;
  blocks.push_back(std::make_unique<ShiftBlock>(w));
  blocks.push_back(std::make_unique<DoubleBlock>(w));
  blocks.push_back(std::make_unique<ShiftBlock>(w));
  Model model(std::move(blocks), std::make_unique<SumLoss>(w));
  // Layout: the parameterless block owns no tensor and no elements.
  ASSERT_EQ(model.param_tensors(), 2);
  EXPECT_EQ(model.params(), 2 * w);
  EXPECT_EQ(model.first_tensor(1), 1);
  EXPECT_EQ(model.first_tensor(2), 1);
  EXPECT_EQ(model.first_tensor(3), 2);
  EXPECT_EQ(model.block_sizes(), (std::vector<std::int64_t>{w, 0, w}));
  EXPECT_EQ(model.tensor_offset(1), w);
  for (int b = 0; b < 3; ++b) EXPECT_FALSE(model.output_saved(b, 3)) << b;  // nobody saves

  std::vector<float> params = model.init_flat_slice(5, 0, model.params());
  ASSERT_TRUE(any_nonzero(params));
  for (float p : params) ASSERT_LE(std::fabs(p), 0.5f);
  std::vector<float> x(static_cast<std::size_t>(rows) * w);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i) - 1.0f;
  double expected = 0.0;  // sum(2 (x + b0) + b1)
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < w; ++c) expected += 2.0 * (x[r * w + c] + params[c]) + params[w + c];
  for (bool split : {false, true}) {
    CpuBackend backend;
    SavedTensors saved;
    std::vector<float> grads(params.size(), -7.0f);
    FlatAccess access(model, params.data(), grads.data());
    ModelContext mc{backend, saved, access};
    Tape tape = model.forward(mc, 0, model.blocks(), x.data(), rows, false);
    EXPECT_EQ(backend.tracker().current()[Category::activation], 0);
    EXPECT_NEAR(model.loss_forward(mc, tape, nullptr, 1.0f), expected, 1e-4);
    if (split) {
      EXPECT_FALSE(model.backward_input(mc, tape, Buffer{}));
      model.backward_weight(mc, tape, 0.0f);
    } else {
      EXPECT_FALSE(model.backward(mc, tape, Buffer{}, 0.0f));
    }
    tape = Tape{};
    EXPECT_EQ(saved.total(), 0);
    EXPECT_EQ(backend.tracker().current_total(), 0);
    for (int c = 0; c < w; ++c) {
      EXPECT_EQ(grads[c], 2.0f * rows) << "b0[" << c << "]";  // through the doubling
      EXPECT_EQ(grads[w + c], 1.0f * rows) << "b1[" << c << "]";
    }
  }
}

TEST(ModelRegistry, BuildsTheNamedModelAndRefusesOthersNamingTheFlag) {
  ModelConfig m;
  EXPECT_EQ(make_model(m)->blocks(), m.layers);
  EXPECT_EQ(model_names_text(), "mlp, gpt2, llama");
  m.name = "gpt3";
  try {
    make_model(m);
    FAIL() << "an unknown model was built";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--model: unknown 'gpt3'; allowed: mlp, gpt2, llama"), std::string::npos)
        << e.what();
  }
}

// The engine's layout of the MLP (blocks, tensors, offsets, partitions) is the one the
// closed forms take from ModelConfig, so measured and predicted bytes describe the
// same split of the same parameters.
TEST(Mlp, BlocksAreLayersAsTheClosedFormsCountThem) {
  for (int width : {1, 3, 256})
    for (int layers : {1, 2, 7}) {
      ModelConfig m;
      m.layers = layers;
      m.width = width;
      const std::unique_ptr<Model> model = make_model(m);
      ASSERT_EQ(model->blocks(), layers);
      ASSERT_EQ(model->param_tensors(), m.param_tensors());
      EXPECT_EQ(model->params(), m.params());
      for (int t = 0; t < m.param_tensors(); ++t) {
        EXPECT_EQ(model->tensor_elems(t), m.tensor_elems(t)) << t;
        EXPECT_EQ(model->tensor_offset(t), tensor_offset(m, t)) << t;
      }
      for (int b = 0; b < layers; ++b) {
        EXPECT_EQ(model->first_tensor(b), 2 * b);
        EXPECT_EQ(model->block_elems(b), m.layer_elems());
        EXPECT_EQ(model->block(b).name(), "layer " + std::to_string(b));
        const std::vector<ParamSpec>& p = model->block(b).params();
        ASSERT_EQ(p.size(), 2u);
        EXPECT_EQ(p[0].name, "weight");
        EXPECT_EQ(p[0].shape, (std::vector<std::int64_t>{width, width}));
        EXPECT_EQ(p[1].name, "bias");
        EXPECT_EQ(p[1].shape, (std::vector<std::int64_t>{width}));
      }
      for (int world : {1, 2, 3, 5}) {
        EXPECT_EQ(zero1_owners(model->tensor_sizes(), world), zero1_owners(m, world));
        for (int k : {0, 1, 2, 3}) {
          const std::vector<Unit> a = fsdp_units(model->block_sizes(), k, world), b = fsdp_units(m, k, world);
          ASSERT_EQ(a.size(), b.size());
          for (std::size_t u = 0; u < a.size(); ++u) {
            EXPECT_EQ(a[u].first_block, b[u].first_block);
            EXPECT_EQ(a[u].last_block, b[u].last_block);
            EXPECT_EQ(a[u].flat_offset, b[u].flat_offset);
            EXPECT_EQ(a[u].padded, b[u].padded);
          }
        }
      }
    }
}

// A slice of the flat vector is the same numbers however it is cut (FSDP shards and
// pipeline chunks start anywhere), zero past the end.
TEST(Mlp, InitialParametersDoNotDependOnTheSlice) {
  RunConfig cfg;
  cfg.model.layers = 3;
  cfg.model.width = 5;
  cfg.seed = 11;
  const std::unique_ptr<Model> model = make_model(cfg.model);
  const std::int64_t P = model->params();
  const std::vector<float> whole = model->init_flat_slice(cfg.seed, 0, P);
  ASSERT_TRUE(any_nonzero(whole));
  const float bound = 1.0f / std::sqrt(5.0f);
  for (float x : whole) ASSERT_LE(std::fabs(x), bound);
  for (std::int64_t begin : {0, 1, 29, 30, 31, 89}) {
    const std::vector<float> part = model->init_flat_slice(cfg.seed, begin, 13);
    for (std::int64_t i = 0; i < 13; ++i)
      EXPECT_EQ(part[i], begin + i < P ? whole[begin + i] : 0.0f) << begin << " + " << i;
  }
}

// The zero-bubble halves (B for every block, then W) give the whole backward's
// gradients, and release every save and buffer.
TEST(Mlp, SplitBackwardEqualsWholeBackward) {
  for (auto act : {Activation::none, Activation::relu}) {
    RunConfig cfg;
    cfg.model.layers = 3;
    cfg.model.width = 12;
    cfg.model.batch = 5;
    cfg.model.activation = act;
    cfg.model.loss = Loss::mse;
    const ModelConfig& m = cfg.model;
    const std::unique_ptr<Model> model = make_model(m);
    const std::vector<float> params = model->init_flat_slice(cfg.seed, 0, model->params());
    const std::vector<float> x = batch_rows(cfg, 0, 0, 0, m.batch);
    const std::vector<float> target(x.size(), 1.0f);
    std::vector<float> whole(params.size()), split(params.size());
    for (std::vector<float>* grads : {&whole, &split}) {
      CpuBackend backend;
      SavedTensors saved;
      FlatAccess access(*model, const_cast<float*>(params.data()), grads->data());
      ModelContext mc{backend, saved, access};
      Tape tape = model->forward(mc, 0, model->blocks(), x.data(), m.batch, false);
      model->loss_forward(mc, tape, target.data(), 1.0f);
      if (grads == &whole) {
        EXPECT_FALSE(model->backward(mc, tape, Buffer{}, 0.0f));
      } else {
        EXPECT_FALSE(model->backward_input(mc, tape, Buffer{}));
        EXPECT_GT(saved.live(), 0);  // the Linear inputs wait for W
        model->backward_weight(mc, tape, 0.0f);
      }
      tape = Tape{};
      EXPECT_EQ(saved.live(), 0);
      EXPECT_EQ(backend.tracker().current_total(), 0);
    }
    ASSERT_TRUE(any_nonzero(whole));
    EXPECT_EQ(split, whole);
  }
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
      const std::unique_ptr<Model> mlp = make_model(m);
      FlatAccess access(*mlp, params.data(), grads.data());
      ModelContext mc{backend, saved, access};
      Tape tape = mlp->forward(mc, 0, mlp->blocks(), x.data(), m.batch, false);
      mlp->loss_forward(mc, tape, target.data(), 0.5f);
      mlp->backward(mc, tape, Buffer{}, 0.0f);
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
  const std::unique_ptr<Model> mlp = make_model(m);
  FlatAccess access(*mlp, params.data(), grads.data());
  ModelContext mc{backend, saved, access};
  Tape tape = mlp->forward(mc, 0, mlp->blocks(), x.data(), m.batch, false);
  mlp->loss_forward(mc, tape, target.data(), 1.0f);
  const std::int64_t a = 32 * 256 * 4;
  EXPECT_EQ(saved.live(), 25);
  EXPECT_EQ(saved.live_bytes(), 10 * a);
  mlp->backward(mc, tape, Buffer{}, 0.0f);
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
