// Activation checkpointing (--checkpoint, harness/model/model.cpp): a checkpointed
// block saves only its input in forward and re-runs its forward at the start of its
// backward; under attention only the attention core is recomputed. Every emulated rank of every strategy measures what the closed forms
// predict (its saves after forward, its peak and the peak's place, "recompute of block
// N" among them), and the step's gradients are bit for bit those of the unchecked run.
#include <gtest/gtest.h>

#include <string>

#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::shape;

using testing::DpSetting;
using testing::kDpSettings;

CheckpointPolicy every(int k) { return {CheckpointKind::every, k}; }
const CheckpointPolicy kAttention{CheckpointKind::attention, 1};

ModelConfig mlp(int layers, Activation activation, Loss loss, CheckpointPolicy checkpoint) {
  ModelConfig m;
  m.layers = layers;
  m.width = 24;
  m.batch = 5;
  m.activation = activation;
  m.loss = loss;
  m.checkpoint = checkpoint;
  return m;
}

std::string mlp_label(const ModelConfig& m) {
  return std::string("L=") + std::to_string(m.layers) + (m.activation == Activation::relu ? " relu" : " none") +
         (m.loss == Loss::mse ? " mse" : " sum") + " checkpoint=" + m.checkpoint.text();
}

TEST(Checkpoint, PolicyWrapsEveryKthCheckpointableBlock) {
  EXPECT_FALSE(CheckpointPolicy{}.wraps(0));
  EXPECT_TRUE(every(1).wraps(3));
  EXPECT_TRUE(every(3).wraps(0));
  EXPECT_FALSE(every(3).wraps(1));
  EXPECT_TRUE(every(3).wraps(6));
  EXPECT_EQ(every(1).text(), "full");
  EXPECT_EQ(every(4).text(), "every:4");
  // attention wraps no block: only the attention core recomputes.
  EXPECT_TRUE(kAttention.any());
  EXPECT_TRUE(kAttention.attention());
  EXPECT_FALSE(kAttention.wraps(0));
  EXPECT_EQ(kAttention.wrapped_of(12), 0);
  EXPECT_EQ(kAttention.text(), "attention");
  EXPECT_EQ(CheckpointPolicy{}.text(), "none");
  // A transformer's embedding and final blocks are never wrapped: its blocks h.0, h.1,
  // ... are model blocks 1, 2, ... and checkpointable blocks 0, 1, ...
  TransformerShape t;
  t.model_type = "gpt2";
  t.layers = 3, t.hidden = 8, t.heads = t.kv_heads = 2, t.head_dim = 4, t.ffn = 32, t.vocab = 11, t.seq = 4;
  t.positions = 4;
  t.tied_embeddings = t.qkv_bias = t.out_bias = true;
  ModelConfig m = testing::transformer_model("gpt2", t, 1);
  m.checkpoint = every(2);
  const auto model = make_model(m);
  ASSERT_EQ(model->blocks(), 5);
  EXPECT_FALSE(model->checkpointed(0));
  EXPECT_TRUE(model->checkpointed(1));
  EXPECT_FALSE(model->checkpointed(2));
  EXPECT_TRUE(model->checkpointed(3));
  EXPECT_FALSE(model->checkpointed(4));
  EXPECT_EQ(model->checkpoint_ordinal(0), -1);
  EXPECT_EQ(model->checkpoint_ordinal(3), 2);
}

// The MLP under none, full, every:2 and every:3, both activations, both losses: every
// rank of W = 1 to 4 of every strategy setting.
TEST(Checkpoint, MlpMeasuredEqualsPredictedOnEveryRank) {
  int checked = 0, recompute_peaks = 0;
  for (const CheckpointPolicy ck : {CheckpointPolicy{}, every(1), every(2), every(3)})
    for (Activation act : {Activation::none, Activation::relu})
      for (Loss loss : {Loss::sum, Loss::mse})
        for (const DpSetting& setting : kDpSettings)
          for (int world : {1, 2, 3, 4})
            for (int rank = 0; rank < world; ++rank) {
              RunConfig cfg;
              cfg.model = mlp(5, act, loss, ck);
              cfg.steps = 2;
              cfg.strategy = parse_strategy(setting.strategy);
              cfg.layers_per_unit = setting.units;
              cfg.prefetch = setting.prefetch;
              SCOPED_TRACE(mlp_label(cfg.model) + " " + setting.strategy + " units=" +
                           std::to_string(setting.units) + " prefetch=" + std::to_string(setting.prefetch) +
                           " W=" + std::to_string(world) + " r=" + std::to_string(rank));
              testing::expect_rank_measured_equals_predicted(cfg, world, rank);
              const Prediction p = predict_data_parallel(cfg, world, rank);
              recompute_peaks += p.peak_where.rfind("recompute", 0) == 0 ? 1 : 0;
              ++checked;
            }
  EXPECT_EQ(checked, 4 * 2 * 2 * 9 * 10);
  EXPECT_GT(recompute_peaks, 0);  // some peaks do fall in a recompute
}

// A checkpointed run's losses, parameters, gradients and AdamW moments after two steps
// are bit for bit the unchecked run's (the recompute is the same arithmetic).
void expect_same_training(const ModelConfig& model, const std::string& label) {
  for (const char* strategy : {"ddp", "zero1", "zero2", "zero3"})
    for (const CheckpointPolicy ck : {every(1), every(2), kAttention}) {
      if (ck.attention() && !model.is_transformer()) continue;
      SCOPED_TRACE(label + " " + strategy + " checkpoint=" + ck.text());
      auto run = [&](const CheckpointPolicy& policy) {
        RunConfig cfg;
        cfg.model = model;
        cfg.model.checkpoint = policy;
        cfg.steps = 2;
        cfg.seed = 5;
        cfg.strategy = parse_strategy(strategy);
        cfg.layers_per_unit = 1;
        CpuBackend backend;
        auto comm = make_fake_communicator(1, 0, &backend);  // the whole state is this rank's
        return testing::run_dp(cfg, backend, *comm, true);
      };
      const auto plain = run(CheckpointPolicy{});
      const auto checked = run(ck);
      EXPECT_EQ(plain.losses, checked.losses);
      EXPECT_EQ(plain.state.params, checked.state.params);
      EXPECT_EQ(plain.state.grads, checked.state.grads);
      EXPECT_EQ(plain.state.exp_avg, checked.state.exp_avg);
      EXPECT_EQ(plain.state.exp_avg_sq, checked.state.exp_avg_sq);
      ASSERT_TRUE(testing::any_nonzero(plain.state.grads));
    }
}

std::string family_of(const TransformerShape& t) { return t.model_type == "gpt2" ? "gpt2" : "llama"; }

// GPT-2 and Llama shapes, both attention modes, under full, every:2, every:3 and
// attention: every rank of W = 1 to 4 of every strategy setting (the root unit alone,
// units of one and two blocks, prefetch on and off).
TEST(Checkpoint, TransformersMeasuredEqualsPredictedOnEveryRank) {
  const TransformerShape shapes[] = {
      shape("gpt2", 3, 32, 4, 4, 128, 50, 8, AttentionMode::flash),
      shape("gpt2", 4, 16, 2, 2, 4, 7, 12, AttentionMode::flash),  // ffn below h: the re-run's output sets peaks
      shape("llama", 3, 32, 4, 2, 48, 50, 8, AttentionMode::flash),
      shape("llama", 4, 16, 4, 1, 8, 9, 12, AttentionMode::flash),
  };
  int checked = 0;
  for (const TransformerShape& base : shapes)
    for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
      for (const CheckpointPolicy ck : {every(1), every(2), every(3), kAttention}) {
        TransformerShape t = base;
        t.attention = mode;
        ModelConfig m = testing::transformer_model(family_of(t), t, 2);
        m.checkpoint = ck;
        checked += testing::expect_measured_equals_predicted_everywhere(
            m, family_of(t) + " " + testing::mode_name(mode) + " h=" + std::to_string(t.hidden) +
                   " checkpoint=" + ck.text());
      }
  EXPECT_EQ(checked, 4 * 2 * 4 * 9 * 10);
}

// --checkpoint attention (Korthikanti et al.'s selective recompute; torch's checkpoint
// around SDPA): each block keeps its attention's own save less from forward to backward
// (A = 4·B·H·T² under math, the probabilities; 4·B·H·T under flash, the log-sum-exp, one
// storage either way) and makes it again in its attention's backward (math: q k^T and the
// softmax; flash: the whole flash forward, its output too). Long sequences over narrow
// heads (T/d = 8 and 16), where math's probabilities outweigh a block's other saves, and
// a short one: every rank measures the prediction, the saves are the plain run's less
// L·A, and math's peak falls below the plain run's (the blocks below the one in backward
// no longer hold theirs) where flash's can rise (the re-run's output beside d qkv).
TEST(Checkpoint, AttentionRecomputeDropsTheAttentionsSave) {
  struct Case {
    TransformerShape t;
    bool long_seq;
  };
  const Case cases[] = {
      {shape("gpt2", 2, 16, 4, 4, 8, 7, 32, AttentionMode::math), true},
      {shape("llama", 2, 16, 4, 2, 8, 7, 64, AttentionMode::math), true},
      {shape("gpt2", 3, 16, 2, 2, 64, 13, 6, AttentionMode::math), false},
  };
  int checked = 0;
  for (const Case& c : cases)
    for (AttentionMode mode : {AttentionMode::math, AttentionMode::flash}) {
      TransformerShape t = c.t;
      t.attention = mode;
      ModelConfig m = testing::transformer_model(family_of(t), t, 2);
      m.checkpoint = kAttention;
      const std::string label = family_of(t) + " " + testing::mode_name(mode) + " T=" + std::to_string(t.seq) +
                                " checkpoint=attention";
      checked += testing::expect_measured_equals_predicted_everywhere(m, label);
      const bool math = mode == AttentionMode::math;
      const std::int64_t A = 4LL * 2 * t.heads * t.seq * (math ? t.seq : 1);
      for (const DpSetting& s : kDpSettings) {
        RunConfig cfg;
        cfg.model = m;
        cfg.strategy = parse_strategy(s.strategy);
        cfg.layers_per_unit = s.units;
        cfg.prefetch = s.prefetch;
        RunConfig plain = cfg;
        plain.model.checkpoint = CheckpointPolicy{};
        const Prediction p = predict_data_parallel(cfg, 2, 0), q = predict_data_parallel(plain, 2, 0);
        EXPECT_EQ(p.saved_after_forward_bytes, q.saved_after_forward_bytes - t.layers * A) << label;
        EXPECT_EQ(p.saved_after_forward_tensors, q.saved_after_forward_tensors - t.layers) << label;
        if (math && c.long_seq) {
          EXPECT_LT(p.peak_total, q.peak_total) << label << " " << s.strategy;
        } else if (math) {
          EXPECT_LE(p.peak_total, q.peak_total) << label << " " << s.strategy;
        }
      }
    }
  EXPECT_EQ(checked, 3 * 2 * 9 * 10);
}

// torch 2.15's figures under torch.utils.checkpoint.checkpoint(block, x,
// use_reentrant=False) on every block (bench/torch_saved.py --checkpoint full):
//   bench/torch_saved.py --layers 2 --hidden 64 --heads 4 --vocab 100 --seq 16 --batch 2 --checkpoint full
//     math torch 46468 B in 11 storages / flash torch 46468 B in 11 storages
//   bench/torch_saved.py --layers 3 --hidden 96 --heads 6 --vocab 257 --seq 24 --batch 3 --checkpoint full
//     flash torch 214180 B in 12 storages
//   ... --layers 2 --hidden 64 --heads 4 --vocab 100 --seq 16 --batch 2 --checkpoint every:2
//     math torch 178052 B in 25 storages / flash torch 170372 B in 23 storages
TEST(Checkpoint, Gpt2SavesWhatTorchsCheckpointSaves) {
  struct Case {
    int layers, hidden, heads, vocab, seq, batch;
    AttentionMode mode;
    CheckpointPolicy ck;
    std::int64_t bytes;
    int storages;
  };
  const Case cases[] = {
      {2, 64, 4, 100, 16, 2, AttentionMode::math, every(1), 46468, 11},
      {2, 64, 4, 100, 16, 2, AttentionMode::flash, every(1), 46468, 11},
      {3, 96, 6, 257, 24, 3, AttentionMode::flash, every(1), 214180, 12},
      {2, 64, 4, 100, 16, 2, AttentionMode::math, every(2), 178052, 25},
      {2, 64, 4, 100, 16, 2, AttentionMode::flash, every(2), 170372, 23},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(testing::mode_name(c.mode)) + " L=" + std::to_string(c.layers) +
                 " checkpoint=" + c.ck.text());
    ModelConfig m = testing::transformer_model(
        "gpt2", shape("gpt2", c.layers, c.hidden, c.heads, c.heads, 4 * c.hidden, c.vocab, c.seq, c.mode), c.batch);
    m.checkpoint = c.ck;
    const auto r = testing::run_one_step(m);
    EXPECT_EQ(r.saved.bytes, c.bytes);
    EXPECT_EQ(r.saved.tensors, c.storages);
  }
}

// Hugging Face's LlamaForCausalLM under gradient_checkpointing_enable(use_reentrant=False)
// (bench/hf_llama_saved.py --checkpoint; every:2 unwraps layers 1, 3, ... again):
//   --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 160 --vocab 100 --seq 16 --batch 2
//     full: eager and sdpa hf 54404 B in 10 storages
//     every:2: eager hf 220548 B in 28 storages / sdpa hf 204676 B in 28 storages
//   --layers 3 --hidden 96 --heads 6 --kv-heads 2 --ffn 256 --vocab 257 --seq 24 --batch 3
//     full: sdpa hf 241348 B in 11 storages
//     every:2: eager hf 830212 B in 29 storages / sdpa hf 753604 B in 29 storages
// Ours saves less by what it does unwrapped (test_llama.cpp): the x·rstd of each norm
// still saved (2 per unwrapped layer, and the final norm's), a = 4Nh each, and the
// rotary cos and sin while any layer is unwrapped (a wrapped layer's RoPE saves them
// into the checkpoint's holders).
TEST(Checkpoint, LlamaSavesHuggingFacesCheckpointedFigureLessItsNormProductsAndRotaryTables) {
  struct Case {
    int layers, hidden, heads, kv_heads, ffn, vocab, seq, batch;
    AttentionMode mode;
    CheckpointPolicy ck;
    std::int64_t hf_bytes;
    int hf_storages;
  };
  const Case cases[] = {
      {2, 64, 4, 2, 160, 100, 16, 2, AttentionMode::math, every(1), 54404, 10},
      {2, 64, 4, 2, 160, 100, 16, 2, AttentionMode::flash, every(1), 54404, 10},
      {2, 64, 4, 2, 160, 100, 16, 2, AttentionMode::math, every(2), 220548, 28},
      {2, 64, 4, 2, 160, 100, 16, 2, AttentionMode::flash, every(2), 204676, 28},
      {3, 96, 6, 2, 256, 257, 24, 3, AttentionMode::flash, every(1), 241348, 11},
      {3, 96, 6, 2, 256, 257, 24, 3, AttentionMode::math, every(2), 830212, 29},
      {3, 96, 6, 2, 256, 257, 24, 3, AttentionMode::flash, every(2), 753604, 29},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(testing::mode_name(c.mode)) + " L=" + std::to_string(c.layers) +
                 " checkpoint=" + c.ck.text());
    ModelConfig m = testing::transformer_model(
        "llama", shape("llama", c.layers, c.hidden, c.heads, c.kv_heads, c.ffn, c.vocab, c.seq, c.mode), c.batch);
    m.checkpoint = c.ck;
    const auto r = testing::run_one_step(m);
    const int unwrapped = c.layers - c.ck.wrapped_of(c.layers);
    const std::int64_t a = 4 * static_cast<std::int64_t>(c.batch) * c.seq * c.hidden;
    const std::int64_t rotary = unwrapped > 0 ? 2 * 4 * static_cast<std::int64_t>(c.seq) * (c.hidden / c.heads) : 0;
    EXPECT_EQ(r.saved.bytes, c.hf_bytes - (2 * unwrapped + 1) * a - rotary);
    EXPECT_EQ(r.saved.tensors, c.hf_storages - (2 * unwrapped + 1) - (unwrapped > 0 ? 2 : 0));
  }
}

// torch 2.15's figures with each block's F.scaled_dot_product_attention(q, k, v) in
// torch.utils.checkpoint.checkpoint(use_reentrant=False) (bench/torch_saved.py
// --checkpoint attention):
//   --layers 2 --hidden 64 --heads 4 --vocab 100 --seq 16 --batch 2
//     math torch 293252 B in 33 storages / flash torch 293252 B in 33 storages
//   --layers 3 --hidden 96 --heads 6 --vocab 257 --seq 24 --batch 3
//     math torch 1461796 B in 45 storages / flash torch 1461796 B in 45 storages
// Flash is equal; math's bytes are equal, its storages two a block more: torch's
// checkpoint saves q, k, v as its inputs, views of c_attn's one output, where shardscope's
// core keeps the head-major copies SDPA's math makes of them (the same 3a bytes).
TEST(Checkpoint, Gpt2AttentionSavesWhatTorchsCheckpointAroundSdpaSaves) {
  struct Case {
    int layers, hidden, heads, vocab, seq, batch;
    AttentionMode mode;
    std::int64_t bytes;
    int storages;
  };
  const Case cases[] = {
      {2, 64, 4, 100, 16, 2, AttentionMode::math, 293252, 33},
      {2, 64, 4, 100, 16, 2, AttentionMode::flash, 293252, 33},
      {3, 96, 6, 257, 24, 3, AttentionMode::math, 1461796, 45},
      {3, 96, 6, 257, 24, 3, AttentionMode::flash, 1461796, 45},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(testing::mode_name(c.mode)) + " L=" + std::to_string(c.layers));
    ModelConfig m = testing::transformer_model(
        "gpt2", shape("gpt2", c.layers, c.hidden, c.heads, c.heads, 4 * c.hidden, c.vocab, c.seq, c.mode), c.batch);
    m.checkpoint = kAttention;
    const auto r = testing::run_one_step(m);
    EXPECT_EQ(r.saved.bytes, c.bytes);
    EXPECT_EQ(r.saved.tensors, c.storages + (c.mode == AttentionMode::math ? 2 * c.layers : 0));
  }
}

// (attention too: the recomputed probabilities are the same arithmetic.)
TEST(Checkpoint, TransformersTrainBitForBitLikeTheUncheckedRun) {
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const TransformerShape g = shape("gpt2", 3, 16, 2, 2, 64, 13, 6, mode);
    expect_same_training(testing::transformer_model("gpt2", g, 2), std::string("gpt2 ") + testing::mode_name(mode));
    const TransformerShape l = shape("llama", 3, 16, 4, 2, 24, 13, 6, mode);
    expect_same_training(testing::transformer_model("llama", l, 2), std::string("llama ") + testing::mode_name(mode));
  }
}

TEST(Checkpoint, MlpTrainsBitForBitLikeTheUncheckedRun) {
  expect_same_training(mlp(4, Activation::relu, Loss::mse, {}), "mlp relu mse");
  expect_same_training(mlp(3, Activation::none, Loss::sum, {}), "mlp none sum");
}

}  // namespace
}  // namespace shardscope
