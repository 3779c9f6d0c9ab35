// The zero-bubble split of a transformer's blocks (gpt2, llama; zb-h1's B and W): B then
// W writes the whole backward's parameter gradients and input gradient to the bit, over
// two passes (beta 0, then 1: the accumulation a pipeline's micro-batches make), on a
// model cut in two segments as a pipeline cuts it (the embeddings alone, after a
// transformer block, the final block alone); every save is released and nothing the
// forward or backward made outlives them.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::mode_name;

struct Outcome {
  std::vector<float> grads;
  std::vector<std::vector<float>> dx;  // the gradient at the cut, each pass
  std::vector<float> losses;
  std::int64_t live_saves = -1;
  CategoryBytes left;
};

// Two passes of forward and backward of segments [0, cut) and [cut, blocks): whole, or
// each segment's B then its W (the second's B, its W, the first's B, its W).
Outcome run(const ModelConfig& m, int cut, bool split) {
  const auto model = make_model(m);
  std::vector<float> params = model->init_flat_slice(11, 0, model->params());
  Outcome o;
  o.grads.assign(params.size(), -3.0f);  // beta 0 must overwrite
  CpuBackend backend;
  SavedTensors saved;
  FlatAccess access(*model, params.data(), o.grads.data());
  ModelContext mc{backend, saved, access};
  for (int pass = 0; pass < 2; ++pass) {
    const float beta = pass == 0 ? 0.0f : 1.0f;
    const DataSlice at{5, pass, 0, 0, m.batch};
    const std::vector<float> x = model->host_input(at);
    Buffer target = model->make_target(backend, at);
    Tape low = model->forward(mc, 0, cut, x.data(), m.batch, false);
    Tape high = model->forward(mc, cut, model->blocks(), low.output(), m.batch, true);
    o.losses.push_back(model->loss_forward(mc, high, target.data(), 1.0f));
    Buffer dx = split ? model->backward_input(mc, high, Buffer{}) : model->backward(mc, high, Buffer{}, beta);
    if (split) model->backward_weight(mc, high, beta);
    EXPECT_TRUE(dx);
    if (!dx) return o;
    std::vector<float> host(dx.count());
    backend.download(host.data(), dx.data(), host.size());
    o.dx.push_back(std::move(host));
    if (split) {
      EXPECT_FALSE(model->backward_input(mc, low, std::move(dx)));
      model->backward_weight(mc, low, beta);
    } else {
      EXPECT_FALSE(model->backward(mc, low, std::move(dx), beta));
    }
  }
  o.live_saves = saved.live();
  o.left = backend.tracker().current();
  return o;
}

void expect_split_equals_whole(const ModelConfig& m, const std::string& label) {
  const int blocks = make_model(m)->blocks();
  for (int cut : {1, 2, blocks - 1}) {
    SCOPED_TRACE(label + " cut at block " + std::to_string(cut));
    const Outcome whole = run(m, cut, false), split = run(m, cut, true);
    ASSERT_EQ(whole.dx.size(), 2u);
    ASSERT_EQ(split.dx.size(), 2u);
    EXPECT_EQ(split.losses, whole.losses);
    for (int pass = 0; pass < 2; ++pass) {
      ASSERT_EQ(split.dx[pass].size(), whole.dx[pass].size());
      EXPECT_EQ(std::memcmp(split.dx[pass].data(), whole.dx[pass].data(), 4 * whole.dx[pass].size()), 0)
          << "dx, pass " << pass;
    }
    ASSERT_EQ(split.grads.size(), whole.grads.size());
    std::size_t differ = 0, first = 0;
    for (std::size_t i = split.grads.size(); i-- > 0;)
      if (std::memcmp(&split.grads[i], &whole.grads[i], 4) != 0) ++differ, first = i;
    EXPECT_EQ(differ, 0u) << "first at " << first << ": " << split.grads[first] << " vs " << whole.grads[first];
    EXPECT_TRUE(testing::any_nonzero(whole.grads));
    EXPECT_EQ(split.live_saves, 0);
    EXPECT_EQ(whole.live_saves, 0);
    EXPECT_EQ(split.left[Category::activation], 0);
    EXPECT_EQ(split.left[Category::temp], 0);
  }
}

ModelConfig transformer(const std::string& family, int layers, int hidden, int heads, int kv_heads, int vocab, int seq,
                        int batch, AttentionMode mode, bool tied, bool bias) {
  TransformerShape t;
  t.model_type = family;
  t.layers = layers;
  t.hidden = hidden;
  t.heads = heads;
  t.kv_heads = kv_heads;
  t.head_dim = hidden / heads;
  t.ffn = family == "gpt2" ? 4 * hidden : 3 * hidden;
  t.vocab = vocab;
  t.seq = seq;
  t.positions = seq;
  t.tied_embeddings = tied;
  t.qkv_bias = t.out_bias = bias;
  t.norm_eps = family == "gpt2" ? 1e-5f : 1e-6f;
  t.attention = mode;
  return testing::transformer_model(family, t, batch);
}

TEST(TransformerSplit, Gpt2BThenWIsTheWholeBackwardToTheBit) {
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (int batch : {1, 2}) {  // one sequence: math's v is a view of qkv
      const ModelConfig m = transformer("gpt2", 2, 32, 4, 4, 37, 8, batch, mode, true, true);
      expect_split_equals_whole(m, std::string("gpt2 ") + mode_name(mode) + " B=" + std::to_string(batch));
    }
}

TEST(TransformerSplit, LlamaBThenWIsTheWholeBackwardToTheBit) {
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (bool tied : {false, true})
      for (bool bias : {false, true}) {
        // grouped-query: 4 heads over 2 kv heads
        const ModelConfig m = transformer("llama", 2, 32, 4, 2, 37, 8, 2, mode, tied, bias);
        expect_split_equals_whole(m, std::string("llama ") + mode_name(mode) + (tied ? " tied" : " untied") +
                                         (bias ? " bias" : ""));
      }
}

}  // namespace
}  // namespace shardscope
