// The zero-bubble split of a transformer's blocks (gpt2, llama; zb-h1's B and W): B then
// W writes the whole backward's parameter gradients and input gradient to the bit, over
// two passes (beta 0, then 1: the accumulation a pipeline's micro-batches make), on a
// model cut in two segments as a pipeline cuts it (the embeddings alone, after a
// transformer block, the final block alone); every save is released and nothing the
// forward or backward made outlives them. What a pipeline piece holds between its B and
// its W equals its closed form (gpt2_piece, llama_piece: PieceForms' half figures).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness/predict/gpt2_forms.hpp"
#include "harness/predict/llama_forms.hpp"
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

// One micro-batch of `rows` sequences through a piece of n transformer blocks, as a
// pipeline stage runs it: its input received (activation) unless first, its unsaved
// output sent (freed) unless last, the received dy (comm) unless last, its dx sent
// (freed) unless first. Between its B and its W the bytes beyond those before its F,
// and the saves, equal the piece's closed form; after W nothing is left.
void expect_half_equals_form(const ModelConfig& m, int rows, const PiecePlace& place) {
  const auto model = make_model(m);
  const TransformerShape& ts = m.transformer;
  const PieceForms form = m.name == "gpt2" ? gpt2_piece(ts, rows, place) : llama_piece(ts, rows, place);
  std::vector<float> params = model->init_flat_slice(3, 0, model->params()), grads(params.size(), 0.0f);
  CpuBackend backend;
  SavedTensors saved;
  FlatAccess access(*model, params.data(), grads.data());
  ModelContext mc{backend, saved, access};
  const int lo = place.first ? 0 : 2, hi = place.last ? model->blocks() : 1 + (place.first ? 0 : 1) + place.blocks;
  ASSERT_EQ(hi - lo, place.blocks + (place.first ? 1 : 0) + (place.last ? 1 : 0));
  const DataSlice at{9, 0, 0, 0, rows};
  const std::vector<float> ids = model->host_input(at);
  Buffer target = model->make_target(backend, at);
  const CategoryBytes before = backend.tracker().current();
  Buffer in;
  if (!place.first) {
    in = backend.alloc(Category::activation, static_cast<std::size_t>(model->output_elems(lo - 1, rows)));
    backend.fill(in.data(), 0.25f, in.count());
  }
  Tape tape = model->forward(mc, lo, hi, place.first ? ids.data() : in.data(), rows, !place.first);
  Buffer dy;
  if (place.last) {
    model->loss_forward(mc, tape, target.data(), 1.0f);
  } else {
    tape.outputs.back().reset();  // sent
    dy = backend.alloc(Category::comm, static_cast<std::size_t>(model->output_elems(hi - 1, rows)));
    backend.fill(dy.data(), 0.01f, dy.count());
  }
  Buffer dx = model->backward_input(mc, tape, std::move(dy));
  EXPECT_EQ(static_cast<bool>(dx), !place.first);
  dx.reset();  // sent
  const CategoryBytes& now = backend.tracker().current();
  EXPECT_EQ(now[Category::activation] - before[Category::activation], form.half_act);
  EXPECT_EQ(now[Category::temp] - before[Category::temp], form.half_temp);
  EXPECT_EQ(now[Category::comm] - before[Category::comm], form.half_comm);
  EXPECT_EQ(saved.live(), form.half_saves);
  EXPECT_EQ(saved.live_bytes(), form.half_saved_bytes);
  EXPECT_GT(form.half_act, 0);
  model->backward_weight(mc, tape, 0.0f);
  in.reset();
  EXPECT_EQ(saved.live(), 0);
  for (Category c : {Category::activation, Category::temp, Category::comm})
    EXPECT_EQ(backend.tracker().current()[c], before[c]) << category_name(c);
}

TEST(TransformerSplit, WhatBKeepsForWIsThePiecesClosedForm) {
  int checked = 0;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (int rows : {1, 2})
      for (const ModelConfig& m : {transformer("gpt2", 3, 16, 2, 2, 23, 6, rows, mode, true, true),
                                   transformer("llama", 3, 16, 4, 2, 23, 6, rows, mode, false, false),
                                   transformer("llama", 3, 16, 4, 2, 23, 6, rows, mode, true, true)})
        for (const PiecePlace& place :
             {PiecePlace{3, true, true, false, false, {}, 0}, PiecePlace{2, true, false, false, true, {}, 0},
              PiecePlace{1, false, false, true, true, {}, 0}, PiecePlace{2, false, true, true, false, {}, 0}}) {
          SCOPED_TRACE(m.name + " " + mode_name(mode) + " rows=" + std::to_string(rows) + " n=" +
                       std::to_string(place.blocks) + (place.first ? " first" : "") + (place.last ? " last" : "") +
                       (m.transformer.tied_embeddings ? " tied" : ""));
          expect_half_equals_form(m, rows, place);
          ++checked;
        }
  EXPECT_EQ(checked, 48);
}

}  // namespace
}  // namespace shardscope
