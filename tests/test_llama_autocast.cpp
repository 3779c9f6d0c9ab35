// Llama under autocast(bfloat16) (harness/model/llama_autocast.cpp): what it saves equals
// Hugging Face's LlamaForCausalLM under torch's CPU autocast less the composite norm's
// x·rstd and the rotary tables (as in fp32), and the closed form; its loss and gradients
// are the fp32 model's within bf16's precision.
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
  int layers, hidden, heads, kv_heads, ffn, vocab, seq, batch;
};

ModelConfig llama_model(const Shape& s, AttentionMode mode, bool autocast, bool tied = false, bool bias = false) {
  TransformerShape t =
      testing::shape("llama", s.layers, s.hidden, s.heads, s.kv_heads, s.ffn, s.vocab, s.seq, mode);
  t.tied_embeddings = tied;
  t.qkv_bias = bias;
  ModelConfig m = testing::transformer_model("llama", t, s.batch);
  m.autocast = autocast;
  return m;
}

// bench/hf_llama_saved.py --precision bf16 (transformers 5.24's LlamaForCausalLM under
// torch.autocast("cpu", dtype=torch.bfloat16); sdpa beside flash, sdpa-math beside math):
//   --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 160 --vocab 100 --seq 16 --batch 2
//     bf16 sdpa hf 435332 B in 65 storages / bf16 sdpa-math hf 483460 B in 65 storages
//   --layers 3 --hidden 96 --heads 6 --kv-heads 2 --ffn 256 --vocab 257 --seq 24 --batch 3
//     bf16 sdpa hf 1885828 B in 92 storages / bf16 sdpa-math hf 2184772 B in 92 storages
// Ours saves less by each RMSNorm's x·rstd (fp32, 2L + 1 storages of 4Nh) and cos and sin
// ((1, 1, T, d) fp32 each).
struct HfSaved {
  Shape shape;
  AttentionMode mode;
  std::int64_t bytes;
  int storages;
};
const HfSaved kHfAutocast[] = {
    {{2, 64, 4, 2, 160, 100, 16, 2}, AttentionMode::math, 483460, 65},
    {{2, 64, 4, 2, 160, 100, 16, 2}, AttentionMode::flash, 435332, 65},
    {{3, 96, 6, 2, 256, 257, 24, 3}, AttentionMode::math, 2184772, 92},
    {{3, 96, 6, 2, 256, 257, 24, 3}, AttentionMode::flash, 1885828, 92},
};

TEST(LlamaAutocast, SavesHuggingFacesAutocastFigureLessItsNormProductsAndRotaryTables) {
  for (const HfSaved& c : kHfAutocast) {
    SCOPED_TRACE(std::string(mode_name(c.mode)) + " L=" + std::to_string(c.shape.layers));
    const ModelConfig m = llama_model(c.shape, c.mode, true);
    const auto r = testing::run_one_step(m);
    const std::int64_t N = static_cast<std::int64_t>(c.shape.batch) * c.shape.seq;
    const std::int64_t norm_products = (2 * c.shape.layers + 1) * 4 * N * c.shape.hidden;
    const std::int64_t rotary = 2 * 4 * static_cast<std::int64_t>(c.shape.seq) * (c.shape.hidden / c.shape.heads);
    EXPECT_EQ(r.saved.bytes, c.bytes - norm_products - rotary);
    EXPECT_EQ(r.saved.tensors, c.storages - (2 * c.shape.layers + 1) - 2);
    const AutocastSaved form = llama_saved_after_forward_autocast(m.transformer, c.shape.batch);
    EXPECT_EQ(r.saved.bytes, form.total().bytes);
    EXPECT_EQ(r.saved.tensors, form.total().tensors);
    testing::expect_one_step_near_uniform_and_clean(r, c.shape.vocab);
  }
}

// A tied head with q, k, v biases (qwen2's layout) and a checkpointed layer: the form holds.
TEST(LlamaAutocast, TiedBiasedAndCheckpointedShapesSaveTheirForm) {
  for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash}) {
    SCOPED_TRACE(mode_name(mode));
    ModelConfig m = llama_model({3, 32, 4, 1, 48, 29, 8, 2}, mode, true, /*tied*/ true, /*bias*/ true);
    m.checkpoint = CheckpointPolicy{CheckpointKind::every, 2};
    const auto r = testing::run_one_step(m);
    const AutocastSaved form = llama_saved_after_forward_autocast(m.transformer, 2, m.checkpoint);
    EXPECT_EQ(r.saved.bytes, form.total().bytes);
    EXPECT_EQ(r.saved.tensors, form.total().tensors);
    testing::expect_one_step_near_uniform_and_clean(r, 29);
  }
}

// The same parameters and batch through the fp32 model and the autocast one.
TEST(LlamaAutocast, LossAndGradientsAreTheFp32ModelsWithinBf16Precision) {
  for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash}) {
    SCOPED_TRACE(mode_name(mode));
    const Shape shape{2, 32, 4, 2, 48, 37, 8, 2};
    const auto model = make_model(llama_model(shape, mode, false, false, true));
    std::vector<float> params = model->init_flat_slice(3, 0, model->params());
    for (std::size_t i = 0; i < params.size(); ++i) params[i] += 0.2f * hashed_uniform(41, 1, i);
    Pass fp32, bf16;
    testing::forward(fp32, llama_model(shape, mode, false, false, true), params, 5);
    testing::backward(fp32, params);
    testing::forward(bf16, llama_model(shape, mode, true, false, true), params, 5);
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

}  // namespace
}  // namespace shardscope
