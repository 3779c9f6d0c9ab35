// The GPT-2 model (harness/model/gpt2.cpp): what it saves equals what torch saves, its
// gradients equal the loss's finite differences, it trains, and data parallelism at one
// rank (and emulated ranks) runs it with the tied head seen once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::backward;
using testing::forward;
using testing::mode_name;
using testing::Pass;

struct Shape {
  int layers, hidden, heads, vocab, seq, batch;
};

ModelConfig gpt2_model(const Shape& s, AttentionMode mode) {
  TransformerShape t;
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
  return testing::transformer_model("gpt2", t, s.batch);
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
    const auto r = testing::run_one_step(m);  // through the engine, as a strategy runs it
    EXPECT_EQ(r.saved.bytes, c.bytes);
    EXPECT_EQ(r.saved.tensors, c.storages);
    testing::expect_one_step_near_uniform_and_clean(r, c.shape.vocab);
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

// Central differences of the fp32 loss against the backward's gradient, on a tiny model.
void check_gradients(const Shape& shape, AttentionMode mode) {
  SCOPED_TRACE(std::string(mode_name(mode)) + " B=" + std::to_string(shape.batch) + " H=" +
               std::to_string(shape.heads));
  testing::expect_gradients_equal_finite_differences(gpt2_model(shape, mode));
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
    const std::vector<float> losses = testing::adamw_losses(gpt2_model({2, 16, 2, 13, 8, 2}, mode), 6);
    for (std::size_t i = 0; i < losses.size(); ++i) ASSERT_TRUE(std::isfinite(losses[i])) << "step " << i;
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
    testing::expect_one_rank_trains_like_the_reference(cfg);
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
  int checked = 0;
  for (const Shape& shape : shapes)
    for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash})
      checked += testing::expect_measured_equals_predicted_everywhere(
          gpt2_model(shape, mode),
          std::string(mode_name(mode)) + " h=" + std::to_string(shape.hidden) + " V=" + std::to_string(shape.vocab));
  EXPECT_EQ(checked, 6 * 2 * 9 * 10);
}

// Drawn shapes (any ffn, positions beyond the sequence, one token or one head among
// them), strategies, units, prefetch, worlds and ranks: every drawn rank measures what
// its closed forms predict.
TEST(Gpt2, DrawnShapesAndStrategiesMeasureWhatTheyPredict) {
  std::mt19937 draw(20261201);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(draw); };
  for (int i = 0; i < 400; ++i) {
    const int heads = pick(1, 4);
    Shape shape{pick(1, 4), heads * pick(1, 6), heads, pick(2, 300), pick(1, 24), pick(1, 4)};
    ModelConfig m = gpt2_model(shape, pick(0, 1) ? AttentionMode::flash : AttentionMode::math);
    m.transformer.ffn = pick(1, 5 * shape.hidden);
    m.transformer.positions = shape.seq + pick(0, 3);
    SCOPED_TRACE("draw " + std::to_string(i) + ": L=" + std::to_string(shape.layers) + " h=" +
                 std::to_string(shape.hidden) + " H=" + std::to_string(heads) + " f=" +
                 std::to_string(m.transformer.ffn) + " V=" + std::to_string(shape.vocab) + " T=" +
                 std::to_string(shape.seq) + " B=" + std::to_string(shape.batch));
    testing::expect_drawn_rank_measures_its_prediction(m, static_cast<std::uint64_t>(i), pick);
  }
}

}  // namespace
}  // namespace shardscope
