// The GPT-2 model (harness/model/gpt2.cpp): what it saves equals what torch saves, its
// gradients equal the loss's finite differences, it trains, and data parallelism at one
// rank (and emulated ranks) runs it with the tied head seen once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "harness/comm/fake_comm.hpp"
#include "support/dp_harness.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;

struct Shape {
  int layers, hidden, heads, vocab, seq, batch;
};

ModelConfig gpt2_model(const Shape& s, AttentionMode mode) {
  ModelConfig m;
  m.name = "gpt2";
  m.layers = s.layers;
  m.width = s.hidden;
  m.batch = s.batch;
  TransformerShape& t = m.transformer;
  t.model_type = "gpt2";
  t.layers = s.layers;
  t.hidden = s.hidden;
  t.heads = t.kv_heads = s.heads;
  t.head_dim = s.hidden / s.heads;
  t.ffn = 4 * s.hidden;
  t.vocab = s.vocab;
  t.seq = s.seq;
  t.positions = s.seq;
  t.tied_embeddings = t.qkv_bias = t.out_bias = true;
  t.attention = mode;
  return m;
}

const char* mode_name(AttentionMode m) { return m == AttentionMode::flash ? "flash" : "math"; }

// One forward and loss of the model on the slice's batch, with `params` (host memory on
// the cpu backend); returns the loss, leaving the tape for a backward when asked.
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

void forward(Pass& p, const ModelConfig& m, std::vector<float>& params, std::uint64_t seed) {
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

float loss_of(const ModelConfig& m, std::vector<float>& params, std::uint64_t seed) {
  Pass p;
  forward(p, m, params, seed);
  FlatAccess access(*p.model, params.data(), p.grads.data());
  ModelContext mc{p.backend, p.saved, access};
  p.model->backward(mc, p.tape, Buffer{}, 0.0f);  // releases what the forward saved
  return p.loss;
}

// torch 2.15's figures, measured by bench/torch_saved.py (unique storages saved for
// backward after forward + loss, parameters excluded):
//   bench/torch_saved.py --layers 2 --hidden 64 --heads 4 --vocab 100 --seq 16 --batch 2
//     math torch 309636 B in 39 storages / flash torch 294276 B in 35 storages
//   bench/torch_saved.py --layers 3 --hidden 96 --heads 6 --vocab 257 --seq 24 --batch 3
//     math torch 1586212 B in 54 storages / flash torch 1466980 B in 48 storages
// and where torch's math attention saves v as a view of the qkv output (one sequence,
// or one head: its reshape needs no copy):
//   bench/torch_saved.py --layers 2 --hidden 48 --heads 3 --vocab 50 --seq 12 --batch 1
//     math torch 94180 B in 39 storages / flash torch 81796 B in 35 storages
//   bench/torch_saved.py --layers 1 --hidden 16 --heads 1 --vocab 7 --seq 5 --batch 2
//     math torch 13724 B in 24 storages / flash torch 12284 B in 22 storages
struct TorchSaved {
  Shape shape;
  AttentionMode mode;
  std::int64_t bytes;
  int storages;
};
const TorchSaved kTorchSaved[] = {
    {{2, 64, 4, 100, 16, 2}, AttentionMode::math, 309636, 39},
    {{2, 64, 4, 100, 16, 2}, AttentionMode::flash, 294276, 35},
    {{3, 96, 6, 257, 24, 3}, AttentionMode::math, 1586212, 54},
    {{3, 96, 6, 257, 24, 3}, AttentionMode::flash, 1466980, 48},
    {{2, 48, 3, 50, 12, 1}, AttentionMode::math, 94180, 39},
    {{2, 48, 3, 50, 12, 1}, AttentionMode::flash, 81796, 35},
    {{1, 16, 1, 7, 5, 2}, AttentionMode::math, 13724, 24},
    {{1, 16, 1, 7, 5, 2}, AttentionMode::flash, 12284, 22},
};

TEST(Gpt2, SavesWhatTorchSavesAfterForwardAndReleasesItInBackward) {
  for (const TorchSaved& c : kTorchSaved) {
    const ModelConfig m = gpt2_model(c.shape, c.mode);
    SCOPED_TRACE(std::string(mode_name(c.mode)) + " L=" + std::to_string(c.shape.layers) + " h=" +
                 std::to_string(c.shape.hidden));
    // Through the engine, as a strategy runs it.
    RunConfig cfg;
    cfg.model = m;
    cfg.steps = 1;
    cfg.strategy = StrategyKind::ddp;
    CpuBackend backend;
    auto comm = make_fake_communicator(1, 0, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.saved.bytes, c.bytes);
    EXPECT_EQ(r.saved.tensors, c.storages);
    ASSERT_EQ(r.losses.size(), 1u);
    EXPECT_NEAR(r.losses[0], std::log(static_cast<float>(c.shape.vocab)), 0.1f);  // small init: near uniform
    // Nothing the forward made outlives the step: no activation, no temp at rest.
    EXPECT_EQ(r.resting[Category::activation], 0);
    EXPECT_EQ(r.resting[Category::temp], 0);
  }
}

TEST(Gpt2, TheParameterCountCountsTheTiedHeadOnce) {
  Shape gpt2{12, 768, 12, 50257, 1024, 1};
  ModelConfig m = gpt2_model(gpt2, AttentionMode::flash);
  const auto model = make_model(m);
  EXPECT_EQ(model->params(), 124'439'808);
  EXPECT_EQ(model->blocks(), 14);  // embeddings, 12 blocks, final
  EXPECT_EQ(model->param_tensors(), 2 + 12 * 12 + 2);
  EXPECT_EQ(model->tensor(0).name, "transformer.wte.weight");
  EXPECT_EQ(model->tensor(2).name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(model->tensor(5).name, "transformer.h.0.attn.c_attn.bias");
  EXPECT_EQ(model->tensor(model->param_tensors() - 1).name, "transformer.ln_f.bias");
}

// Central differences of the fp32 loss against the backward's gradient, on a tiny model
// with parameters drawn large enough that every path carries signal.
void check_gradients(const Shape& shape, AttentionMode mode) {
  SCOPED_TRACE(std::string(mode_name(mode)) + " B=" + std::to_string(shape.batch) + " H=" +
               std::to_string(shape.heads));
  const ModelConfig m = gpt2_model(shape, mode);
  const auto model = make_model(m);
  std::vector<float> params = model->init_flat_slice(7, 0, model->params());
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i] += 0.3f * hashed_uniform(99, 1, i);  // biases and norms off their zeros and ones

  Pass p;
  forward(p, m, params, 5);
  {
    FlatAccess access(*p.model, params.data(), p.grads.data());
    ModelContext mc{p.backend, p.saved, access};
    p.model->backward(mc, p.tape, Buffer{}, 0.0f);
  }
  EXPECT_EQ(p.saved.live(), 0);
  ASSERT_TRUE(any_nonzero(p.grads));
  const std::vector<float> grads = p.grads;
  // Every tensor: its first elements and one in the middle.
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

TEST(Gpt2, GradientsEqualFiniteDifferencesOfTheLoss) {
  // Two sequences of two heads; one sequence, and one head (math's v is then a view).
  for (const Shape& shape : {Shape{1, 8, 2, 11, 4, 2}, Shape{1, 8, 2, 11, 4, 1}, Shape{1, 8, 1, 11, 4, 2}})
    for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash}) check_gradients(shape, mode);
}

// The head's gradient and the embedding's both land in wte: a backward with beta 1
// adds both onto what was there (twice the one-pass gradient after two passes).
TEST(Gpt2, TheTiedWeightsGradientAccumulatesBothUses) {
  const ModelConfig m = gpt2_model({1, 8, 2, 11, 4, 2}, AttentionMode::flash);
  const auto model = make_model(m);
  std::vector<float> params = model->init_flat_slice(3, 0, model->params());
  Pass p;
  forward(p, m, params, 1);
  std::vector<float> once;
  {
    FlatAccess access(*p.model, params.data(), p.grads.data());
    ModelContext mc{p.backend, p.saved, access};
    p.model->backward(mc, p.tape, Buffer{}, 0.0f);
    once = p.grads;
    p.tape = p.model->forward(mc, 0, p.model->blocks(), p.x.data(), m.batch, false);
    p.model->loss_forward(mc, p.tape, p.target.data(), 1.0f);
    p.model->backward(mc, p.tape, Buffer{}, 1.0f);
  }
  const std::int64_t wte = model->tensor_elems(0);
  ASSERT_TRUE(any_nonzero(std::vector<float>(once.begin(), once.begin() + wte)));
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(p.grads[i], 2.0f * once[i], 1e-6f + 1e-5f * std::fabs(once[i])) << i;
}

// AdamW on one fixed batch: the loss is finite and falls.
TEST(Gpt2, LossFallsOverAdamWStepsOnOneBatch) {
  for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash}) {
    SCOPED_TRACE(mode_name(mode));
    const ModelConfig m = gpt2_model({2, 16, 2, 13, 8, 2}, mode);
    const auto model = make_model(m);
    std::vector<float> params = model->init_flat_slice(0, 0, model->params());
    std::vector<float> exp_avg(params.size(), 0.0f), exp_avg_sq(params.size(), 0.0f);
    AdamWHyper hyper;
    hyper.lr = 1e-2;
    std::vector<float> losses;
    for (int step = 1; step <= 6; ++step) {
      Pass p;
      forward(p, m, params, 4);
      FlatAccess access(*p.model, params.data(), p.grads.data());
      ModelContext mc{p.backend, p.saved, access};
      p.model->backward(mc, p.tape, Buffer{}, 0.0f);
      ASSERT_TRUE(std::isfinite(p.loss));
      losses.push_back(p.loss);
      std::vector<AdamWTensor> list;
      for (int t = 0; t < model->param_tensors(); ++t) {
        const std::int64_t off = model->tensor_offset(t);
        list.push_back({params.data() + off, p.grads.data() + off, exp_avg.data() + off, exp_avg_sq.data() + off,
                        static_cast<std::size_t>(model->tensor_elems(t)), step});
      }
      host::adamw(hyper, list);
    }
    for (std::size_t i = 1; i < losses.size(); ++i) EXPECT_LT(losses[i], losses[i - 1]) << "step " << i;
  }
}

// ddp and zero1 (and zero2/zero3 with one root unit) at one rank train like the
// single-rank reference; emulated at W = 2 every rank holds the same saves.
TEST(Gpt2, DataParallelAtOneRankTrainsLikeTheReference) {
  for (const char* strategy : {"ddp", "zero1", "zero2", "zero3"}) {
    SCOPED_TRACE(strategy);
    RunConfig cfg;
    cfg.model = gpt2_model({2, 16, 2, 13, 8, 2}, AttentionMode::flash);
    cfg.steps = 2;
    cfg.seed = 9;
    cfg.strategy = parse_strategy(strategy);
    CpuBackend backend;
    auto comm = make_fake_communicator(1, 0, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, true);
    const HostState ref = testing::reference_training(cfg, 1);
    ASSERT_TRUE(any_nonzero(ref.grads));
    std::size_t at = 0;
    EXPECT_EQ(testing::worst_violation(r.state.grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
    EXPECT_EQ(testing::worst_violation(r.state.params, ref.params, 1e-5, 1e-7, &at), 0.0) << "params at " << at;
    for (int rank = 0; rank < 2; ++rank) {
      CpuBackend b2;
      auto fake = make_fake_communicator(2, rank, &b2);
      const auto e = testing::run_dp(cfg, b2, *fake, false);
      EXPECT_EQ(e.saved.bytes, r.saved.bytes);
      EXPECT_EQ(e.saved.tensors, r.saved.tensors);
    }
  }
}

// The closed forms (predict_data_parallel: transformer_forms.hpp's model states and
// gpt2_forms.hpp's step) against every emulated rank: resting and peak bytes per
// category, the peak's phase and place, the bytes handed to collectives and the saves
// after forward; shapes where the logits dominate and where they do not, FSDP's root
// unit alone and units of one and two blocks, with and without prefetch.
TEST(Gpt2, MeasuredEqualsPredictedOnEveryRank) {
  const Shape shapes[] = {{2, 64, 4, 100, 16, 2}, {3, 96, 6, 257, 24, 3}, {2, 32, 2, 5, 8, 2},
                          {3, 16, 4, 3, 32, 1},   {2, 48, 3, 50, 12, 1},  {1, 16, 1, 7, 5, 2}};
  struct Setting {
    const char* strategy;
    int units, prefetch;
  };
  const Setting settings[] = {{"ddp", 0, 1},   {"zero1", 0, 1}, {"zero2", 0, 1}, {"zero3", 0, 1}, {"zero2", 1, 1},
                              {"zero3", 1, 1}, {"zero3", 1, 0}, {"zero3", 2, 1}, {"zero2", 2, 0}};
  int checked = 0;
  for (const Shape& shape : shapes)
    for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash})
      for (const Setting& setting : settings)
        for (int world : {1, 2, 3, 4})
          for (int rank = 0; rank < world; ++rank) {
            RunConfig cfg;
            cfg.model = gpt2_model(shape, mode);
            cfg.steps = 2;
            cfg.strategy = parse_strategy(setting.strategy);
            cfg.layers_per_unit = setting.units;
            cfg.prefetch = setting.prefetch;
            SCOPED_TRACE(std::string(setting.strategy) + " units=" + std::to_string(setting.units) + " prefetch=" +
                         std::to_string(setting.prefetch) + " " + mode_name(mode) + " h=" +
                         std::to_string(shape.hidden) + " V=" + std::to_string(shape.vocab) + " W=" +
                         std::to_string(world) + " r=" + std::to_string(rank));
            CpuBackend backend;
            auto comm = make_fake_communicator(world, rank, &backend);
            const auto r = testing::run_dp(cfg, backend, *comm, false);
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
            for (int k = 0; k < kCollKindCount; ++k)
              EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]) << kCollKindNames[k];
            ++checked;
          }
  EXPECT_EQ(checked, 6 * 2 * 9 * 10);
}

// Drawn shapes (any ffn, positions beyond the sequence, one token or one head among
// them), strategies, units, prefetch, worlds and ranks: every drawn rank measures what
// its closed forms predict.
TEST(Gpt2, DrawnShapesAndStrategiesMeasureWhatTheyPredict) {
  std::mt19937 draw(20261201);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(draw); };
  const char* strategies[] = {"ddp", "zero1", "zero2", "zero3"};
  for (int i = 0; i < 400; ++i) {
    const int heads = pick(1, 4);
    Shape shape{pick(1, 4), heads * pick(1, 6), heads, pick(2, 300), pick(1, 24), pick(1, 4)};
    RunConfig cfg;
    cfg.model = gpt2_model(shape, pick(0, 1) ? AttentionMode::flash : AttentionMode::math);
    cfg.model.transformer.ffn = pick(1, 5 * shape.hidden);
    cfg.model.transformer.positions = shape.seq + pick(0, 3);
    cfg.steps = 2;
    cfg.seed = static_cast<std::uint64_t>(i);
    cfg.strategy = parse_strategy(strategies[pick(0, 3)]);
    cfg.layers_per_unit = pick(0, shape.layers);
    cfg.prefetch = pick(0, 1);
    const int world = pick(1, 4), rank = pick(0, world - 1);
    SCOPED_TRACE("draw " + std::to_string(i) + ": " + strategy_name(cfg.strategy).data() + " units=" +
                 std::to_string(cfg.layers_per_unit) + " L=" + std::to_string(shape.layers) + " h=" +
                 std::to_string(shape.hidden) + " H=" + std::to_string(heads) + " f=" +
                 std::to_string(cfg.model.transformer.ffn) + " V=" + std::to_string(shape.vocab) + " T=" +
                 std::to_string(shape.seq) + " B=" + std::to_string(shape.batch) + " W=" + std::to_string(world) +
                 " r=" + std::to_string(rank));
    CpuBackend backend;
    auto comm = make_fake_communicator(world, rank, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    const Prediction p = predict_data_parallel(cfg, world, rank);
    ASSERT_TRUE(p.peak_known);
    EXPECT_EQ(r.saved.bytes, p.saved_after_forward_bytes);
    EXPECT_EQ(r.saved.tensors, p.saved_after_forward_tensors);
    EXPECT_EQ(r.resting, p.resting);
    EXPECT_EQ(r.peak.by_category, p.peak_by_category);
    EXPECT_EQ(std::string(phase_name(r.peak.phase)), std::string(phase_name(p.peak_phase)));
    EXPECT_EQ(r.where, p.peak_where);
    for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
  }
}

}  // namespace
}  // namespace shardscope
