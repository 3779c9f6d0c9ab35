// GPT-2 under autocast(bfloat16) (harness/model/gpt2_autocast.cpp): what it saves equals
// what torch's CPU autocast saves (bench/torch_saved.py --precision bf16) and the closed
// form; its loss and gradients are the fp32 model's within bf16's precision.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "harness/predict/autocast_forms.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::mode_name;
using testing::Pass;

struct Shape {
  int layers, hidden, heads, vocab, seq, batch;
};

ModelConfig gpt2_model(const Shape& s, AttentionMode mode, bool autocast) {
  const TransformerShape t =
      testing::shape("gpt2", s.layers, s.hidden, s.heads, s.heads, 4 * s.hidden, s.vocab, s.seq, mode);
  ModelConfig m = testing::transformer_model("gpt2", t, s.batch);
  m.autocast = autocast;
  return m;
}

// torch 2.15's figures under torch.autocast("cpu", dtype=torch.bfloat16), unique storages
// saved for backward after forward + loss, parameters excluded (the weights' bf16 casts
// among them), measured by bench/torch_saved.py --precision bf16:
//   --layers 2 --hidden 64 --heads 4 --vocab 100 --seq 16 --batch 2
//     bf16 math torch 424836 B in 48 storages / bf16 flash torch 384900 B in 44 storages
//   --layers 3 --hidden 96 --heads 6 --vocab 257 --seq 24 --batch 3
//     bf16 math torch 1829092 B in 67 storages / bf16 flash torch 1585444 B in 61 storages
//   --layers 2 --hidden 48 --heads 3 --vocab 50 --seq 12 --batch 1
//     bf16 math torch 173860 B in 48 storages / bf16 flash torch 163780 B in 44 storages
struct TorchSaved {
  Shape shape;
  AttentionMode mode;
  std::int64_t bytes;
  int storages;
};
const TorchSaved kTorchAutocast[] = {
    {{2, 64, 4, 100, 16, 2}, AttentionMode::math, 424836, 48},
    {{2, 64, 4, 100, 16, 2}, AttentionMode::flash, 384900, 44},
    {{3, 96, 6, 257, 24, 3}, AttentionMode::math, 1829092, 67},
    {{3, 96, 6, 257, 24, 3}, AttentionMode::flash, 1585444, 61},
    {{2, 48, 3, 50, 12, 1}, AttentionMode::math, 173860, 48},
    {{2, 48, 3, 50, 12, 1}, AttentionMode::flash, 163780, 44},
};

TEST(Gpt2Autocast, SavesWhatTorchAutocastSavesAfterForwardAndReleasesItInBackward) {
  for (const TorchSaved& c : kTorchAutocast) {
    const ModelConfig m = gpt2_model(c.shape, c.mode, true);
    SCOPED_TRACE(std::string(mode_name(c.mode)) + " L=" + std::to_string(c.shape.layers) + " h=" +
                 std::to_string(c.shape.hidden) + " B=" + std::to_string(c.shape.batch));
    const auto r = testing::run_one_step(m);  // through the engine, as a strategy runs it
    EXPECT_EQ(r.saved.bytes, c.bytes);
    EXPECT_EQ(r.saved.tensors, c.storages);
    const AutocastSaved form = gpt2_saved_after_forward_autocast(m.transformer, c.shape.batch);
    EXPECT_EQ(r.saved.bytes, form.total().bytes);
    EXPECT_EQ(r.saved.tensors, form.total().tensors);
    testing::expect_one_step_near_uniform_and_clean(r, c.shape.vocab);
  }
}

// Under --checkpoint a wrapped block saves its input alone and no cast outlives its forward:
//   bench/torch_saved.py --precision bf16 --layers 3 --checkpoint every:2 (h 64, 4 heads,
//   vocab 100, 16 tokens, 2 sequences): bf16 math 248196 B in 31 / flash 228228 B in 29
TEST(Gpt2Autocast, CheckpointedBlocksSaveTheirInputAloneAsTorchsDo) {
  for (auto [mode, bytes, storages] : {std::tuple{AttentionMode::math, 248196, 31},
                                       std::tuple{AttentionMode::flash, 228228, 29}}) {
    SCOPED_TRACE(mode_name(mode));
    ModelConfig m = gpt2_model({3, 64, 4, 100, 16, 2}, mode, true);
    m.checkpoint = CheckpointPolicy{CheckpointKind::every, 2};
    const auto r = testing::run_one_step(m);
    EXPECT_EQ(r.saved.bytes, bytes);
    EXPECT_EQ(r.saved.tensors, storages);
    testing::expect_one_step_near_uniform_and_clean(r, 100);
  }
}

// The same parameters and batch through the fp32 model and the autocast one: the losses
// agree to bf16's precision and the gradients within a few bf16 roundings of their norm
// (a wrong backward, a missed cast or a gradient not rounded where it should be would be
// off by far more, or by nothing).
TEST(Gpt2Autocast, LossAndGradientsAreTheFp32ModelsWithinBf16Precision) {
  for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash}) {
    SCOPED_TRACE(mode_name(mode));
    const Shape shape{2, 32, 4, 37, 8, 2};
    const auto model = make_model(gpt2_model(shape, mode, false));
    std::vector<float> params = model->init_flat_slice(3, 0, model->params());
    for (std::size_t i = 0; i < params.size(); ++i) params[i] += 0.2f * hashed_uniform(41, 1, i);
    Pass fp32, bf16;
    testing::forward(fp32, gpt2_model(shape, mode, false), params, 5);
    testing::backward(fp32, params);
    testing::forward(bf16, gpt2_model(shape, mode, true), params, 5);
    testing::backward(bf16, params);
    EXPECT_EQ(bf16.saved.live(), 0);
    ASSERT_TRUE(any_nonzero(fp32.grads));
    EXPECT_NEAR(bf16.loss, fp32.loss, 2e-2 * std::fabs(fp32.loss));
    EXPECT_NE(bf16.loss, fp32.loss);  // it did compute in bf16
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < fp32.grads.size(); ++i) {
      diff += (bf16.grads[i] - fp32.grads[i]) * static_cast<double>(bf16.grads[i] - fp32.grads[i]);
      norm += fp32.grads[i] * static_cast<double>(fp32.grads[i]);
    }
    EXPECT_LT(std::sqrt(diff / norm), 3e-2);
    EXPECT_GT(std::sqrt(diff / norm), 1e-5);
  }
}

// --checkpoint attention under autocast (both families, both attentions): the forward
// saves each block's attention core's own save (flash's lse, math's probabilities) less,
// in one storage less, and the recompute in backward makes them again in bf16 exactly as
// the forward made them: the loss and every gradient equal the plain bf16 pass's bit for
// bit, and nothing stays saved.
TEST(Gpt2Autocast, AttentionRecomputeSavesTheCoresSaveLessAndTrainsTheSame) {
  for (const char* family : {"gpt2", "llama"})
    for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash}) {
      SCOPED_TRACE(std::string(family) + " " + mode_name(mode));
      const int layers = 2, heads = 2, seq = 6, batch = 2;
      ModelConfig m = testing::transformer_model(
          family, testing::shape(family, layers, 16, heads, heads, 32, 11, seq, mode), batch);
      m.autocast = true;
      ModelConfig r = m;
      r.checkpoint = CheckpointPolicy{CheckpointKind::attention, 1};
      const auto model = make_model(m);
      std::vector<float> params = model->init_flat_slice(3, 0, model->params());
      for (std::size_t i = 0; i < params.size(); ++i) params[i] += 0.2f * hashed_uniform(43, 1, i);
      Pass plain, recompute;
      testing::forward(plain, m, params, 7);
      testing::forward(recompute, r, params, 7);
      // A = 4BHT (flash's lse) or 4BHT^2 (math's probabilities), per block
      const std::int64_t A = 4LL * batch * heads * seq * (mode == AttentionMode::flash ? 1 : seq);
      EXPECT_EQ(plain.saved.live_bytes() - recompute.saved.live_bytes(), layers * A);
      EXPECT_EQ(plain.saved.live_storages() - recompute.saved.live_storages(), layers);
      const AutocastSaved form = std::string(family) == "gpt2"
                                     ? gpt2_saved_after_forward_autocast(r.transformer, batch, r.checkpoint)
                                     : llama_saved_after_forward_autocast(r.transformer, batch, r.checkpoint);
      EXPECT_EQ(recompute.saved.live_bytes(), form.total().bytes);
      EXPECT_EQ(recompute.saved.live_storages(), form.total().tensors);
      testing::backward(plain, params);
      testing::backward(recompute, params);
      EXPECT_EQ(recompute.saved.live(), 0);
      ASSERT_TRUE(any_nonzero(plain.grads));
      EXPECT_EQ(recompute.loss, plain.loss);
      EXPECT_EQ(recompute.grads, plain.grads);
    }
}

}  // namespace
}  // namespace shardscope
