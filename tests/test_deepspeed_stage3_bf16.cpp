// --engine deepspeed --strategy zero3 --precision bf16 on GPT-2 and Llama (harness/strategies/
// deepspeed_zero3.hpp: DeepSpeed's stage 3 under bf16, the bf16 modules of
// harness/model/gpt2_param_bf16.cpp and llama_param_bf16.cpp gathered module by module; closed
// forms: harness/predict/deepspeed_stage3_transformer_forms.cpp). Every emulated rank at W = 1
// to 4 measures what the closed forms predict (every category at rest and at the peak, its
// phase and place, the saves and the bytes each collective moves); a one-block GPT-2 by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "harness/comm/fake_comm.hpp"
#include "harness/predict/param_bf16_forms.hpp"
#include "harness/strategies/deepspeed_layout.hpp"
#include "support/deepspeed_check.hpp"
#include "support/dp_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::check_deepspeed_rank;
using testing::ds_config;
using testing::run_dp;

RunConfig bf16_stage3(const ModelConfig& m, double bucket_mb) {
  RunConfig cfg = ds_config(m, "zero3", bucket_mb);
  cfg.precision = PrecisionKind::bf16;
  cfg.model.param_bf16 = true;
  return cfg;
}

// Flash and math (one sequence: math's v a view of qkv), weights above the activations (c_fc
// and mlp.c_proj set the peak), a vocabulary above both (the head's and the embeddings'),
// sizes no world divides (short slices, whose zero tensors a reduction holds); every tensor
// gathered (threshold 0), the weights gathered and the norms, biases and small tables kept
// (100), the weights alone gathered (5,000), every tensor kept (100,000); one bucket and
// buckets of 1.05 and 2.2 times the largest tensor (reductions inside the backward); one
// micro-step and two (the gradient partitions added in bf16).
// Every rank of `models` at W = 1 to 4: every tensor gathered (threshold 0), the weights
// gathered and the norms, biases and small tables kept (100), the weights alone gathered
// (5,000), every tensor kept (100,000); one bucket and buckets of 1.05 and 2.2 times the
// largest tensor (reductions inside the backward); one micro-step and two (the gradient
// partitions added in bf16). Returns the peaks' places (and "a reduction").
std::set<std::string> check_every_rank(const std::vector<std::pair<std::string, ModelConfig>>& models) {
  std::set<std::string> places;
  for (const auto& [name, m] : models)
    for (std::int64_t threshold : {0, 100, 5'000, 100'000})
      for (int buckets : {0, 1, 2})
        for (int k : {1, 2})
          for (int world = 1; world <= 4; ++world)
            for (int rank = 0; rank < world; ++rank) {
              std::int64_t largest = 0;
              for (std::int64_t n : model_tensor_elems(m)) largest = std::max(largest, n);
              const double times = buckets == 0 ? 0.0 : buckets == 1 ? 1.05 : 2.2;
              const double bucket = times * 4.0 * static_cast<double>(largest) / (1 << 20);
              RunConfig cfg = bf16_stage3(m, bucket);
              cfg.param_persistence = threshold;
              cfg.accumulate = k;
              const std::string at = check_deepspeed_rank(
                  cfg, world, rank,
                  name + " threshold " + std::to_string(threshold) + " bucket " + std::to_string(bucket) + " K=" +
                      std::to_string(k));
              places.insert(at.substr(0, at.find(' ')));
              const Prediction p = predict_data_parallel(cfg, world, rank);
              if (p.peak_phase == Phase::backward && p.peak_by_category[Category::grad] > p.resting[Category::grad])
                places.insert("a reduction");
              // bf16 throughout but the master weights and AdamW: 2 B an element of the
              // partitions, the gradient partitions and the bucket's all-reduce.
              const Ds3Layout l = ds3_layout(model_tensor_elems(cfg.model), world, threshold);
              EXPECT_EQ(p.resting[Category::master], 4 * l.flat);
              EXPECT_EQ(p.resting[Category::grad], 2 * l.flat);
              std::int64_t P = 0;
              for (std::int64_t n : model_tensor_elems(cfg.model)) P += n;
              EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_reduce)], 2 * P * k);
              EXPECT_EQ(p.saved_after_forward_bytes, param_bf16_saved_after_forward(cfg.model, cfg.model.checkpoint).bytes);
            }
  return places;
}

// GPT-2: flash and math (one sequence: math's v a view of qkv), weights above the activations
// (c_fc and mlp.c_proj set the peak), a vocabulary above both (the head's and the
// embeddings'), sizes no world divides (short slices, whose zero tensors a reduction holds).
TEST(DeepSpeedStage3Bf16, Gpt2MeasuredEqualsPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  models.emplace_back("gpt2 flash", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::flash));
  models.emplace_back("gpt2 math", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::math));
  models.emplace_back("gpt2 one sequence math", testing::gpt2_of(2, 16, 2, 29, 6, 1, AttentionMode::math));
  models.emplace_back("gpt2 wide", testing::gpt2_of(2, 64, 4, 37, 2, 1, AttentionMode::flash));
  // Its peak at a reduction inside c_fc's backward (threshold 5,000, buckets of 1.05 times the
  // largest tensor, W = 3, rank 2: the zero tensors of its short slices beside c_fc's).
  models.emplace_back("gpt2 wide math", testing::gpt2_of(1, 64, 2, 29, 6, 1, AttentionMode::math));
  models.emplace_back("gpt2 vocabulary", testing::gpt2_of(1, 16, 2, 2001, 4, 1, AttentionMode::math));
  models.emplace_back("gpt2 odd", testing::gpt2_of(3, 18, 3, 41, 3, 1, AttentionMode::flash));
  const std::set<std::string> places = check_every_rank(models);
  // Peaks in a block's backward, at a reduction inside it, in the optimizer (the flattened
  // bf16 gradient beside its fp32 cast) and in the persistent tensors' gather after it.
  for (const char* p : {"backward", "a reduction", "optimizer", "communication"})
    EXPECT_TRUE(places.count(p)) << p << " in " << ::testing::PrintToString(places);
}

// Llama (Hugging Face's module cast to bf16: each norm saves its fp32 upcast, no block saves
// the bf16 stream, the loss upcasts the logits): grouped-query untied, tied with four kv
// heads, q/k/v and o biases, flash and math; weights above the activations; a vocabulary
// above both; sizes no world divides.
TEST(DeepSpeedStage3Bf16, LlamaMeasuredEqualsPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("llama" + how, testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, mode, false));
    models.emplace_back("llama tied" + how, testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, mode, true));
  }
  ModelConfig biased = testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::math, false);
  biased.transformer.qkv_bias = biased.transformer.out_bias = true;
  models.emplace_back("llama biased math", biased);
  models.emplace_back("llama wide math", testing::llama_of(2, 64, 4, 2, 96, 37, 2, 1, AttentionMode::math, false));
  models.emplace_back("llama wide tied", testing::llama_of(2, 64, 4, 1, 96, 37, 3, 1, AttentionMode::flash, true));
  models.emplace_back("llama vocabulary", testing::llama_of(1, 16, 4, 2, 24, 2001, 4, 1, AttentionMode::flash, false));
  models.emplace_back("llama odd", testing::llama_of(3, 18, 3, 1, 30, 41, 3, 1, AttentionMode::flash, false));
  const std::set<std::string> places = check_every_rank(models);
  for (const char* p : {"forward", "backward", "optimizer", "communication"})
    EXPECT_TRUE(places.count(p)) << p << " in " << ::testing::PrintToString(places);
}

// Stage 3 of a one-block GPT-2 (h 16, 2 heads, vocabulary 29, 6 tokens) at W = 2 in bf16,
// every tensor gathered (threshold 0), by hand: P = 464 (wte) + 96 (wpe) + 3,280 (the block)
// + 32 (ln_f) = 3,872, every tensor even: C = P/2 = 1,936. At rest param 2C = 3,872 (the
// bf16 partitions), master 4C = 7,744, grad 2C = 3,872 (the bf16 gradient partitions),
// optim 8C + 4 = 15,492, the bf16 bucket 2P = 7,744: 38,724 B; less the bucket, 16C + 4 =
// 30,980 (the ZeRO paper's 16Ψ/N and AdamW's step). A step all-reduces 2P = 7,744 B and
// gathers each of its ten modules in forward and in backward, 20 calls, each moving 2W·Σc
// of its tensors: every tensor once and the tied table a second time (the head's), twice:
// 2 × (2P + 2 × 464) = 17,344 B, half of fp32's 34,688. The step peaks in the optimizer.
TEST(DeepSpeedStage3Bf16, OneBlockGpt2RestsAndMovesByHand) {
  RunConfig cfg = bf16_stage3(testing::gpt2_of(1, 16, 2, 29, 6, 1, AttentionMode::flash), 0);
  cfg.param_persistence = 0;
  for (int rank = 0; rank < 2; ++rank) {
    CpuBackend backend;
    auto comm = make_fake_communicator(2, rank, &backend);
    const auto r = run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.resting.total(), 38'724);
    EXPECT_EQ(r.resting[Category::param], 3'872);
    EXPECT_EQ(r.resting[Category::master], 7'744);
    EXPECT_EQ(r.resting[Category::grad], 3'872);
    EXPECT_EQ(r.resting[Category::optim], 15'492);
    EXPECT_EQ(r.resting[Category::comm], 7'744);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_reduce)].bytes, 7'744);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_gather)].bytes, 17'344);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_gather)].calls, 20);
    const Prediction p = predict_data_parallel(cfg, 2, rank);
    ASSERT_TRUE(p.model_states.has_value());
    EXPECT_EQ(*p.model_states, 30'980);
    // The peak is the optimizer's: the gradient partitions flattened in bf16 (2C) beside
    // their fp32 cast (4C): grad 2C + 2C + 4C = 15,488, 50,340 B in all.
    EXPECT_EQ(r.peak.total, 50'340);
    EXPECT_EQ(r.peak.by_category[Category::grad], 15'488);
    EXPECT_EQ(r.peak.phase, Phase::optimizer);
  }
}

// --checkpoint full|every:K under stage 3 in bf16 (deepspeed_zero3.hpp): a wrapped block of
// the bf16 module saves its bf16 input alone; its backward begins with mlp.c_proj's gather,
// then its re-run gathers and releases every other module again, their bf16 storages kept
// by the re-run's saves to each module's backward. Flash and math, a wide model (its
// weights above the activations) and an MLP narrower than the stream (the re-run's output
// beside dy above the backward's instants); thresholds 0, 100, 100,000; one bucket and
// buckets of 1.05 times the largest tensor; K = 1, 2: every emulated rank at W = 1 to 4, the
// peak in a re-run, a block's backward and the optimizer somewhere.
TEST(DeepSpeedStage3Bf16, CheckpointedGpt2MeasuredEqualsPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("gpt2" + how, testing::gpt2_of(2, 16, 2, 29, 6, 2, mode));
    models.emplace_back("gpt2 wide" + how, testing::gpt2_of(2, 64, 4, 37, 2, 1, mode));
    models.emplace_back("gpt2 narrow mlp" + how, testing::gpt2_of(2, 32, 4, 5, 24, 2, mode, 8));
  }
  models.emplace_back("gpt2 odd", testing::gpt2_of(3, 18, 3, 41, 3, 1, AttentionMode::flash));
  std::set<std::string> places;
  for (const auto& [name, m] : models)
    for (const CheckpointPolicy& ck : {testing::every(1), testing::every(2)})
      for (std::int64_t threshold : {0, 100, 100'000})
        for (int buckets : {0, 1})
          for (int k : {1, 2})
            for (int world = 1; world <= 4; ++world)
              for (int rank = 0; rank < world; ++rank) {
                std::int64_t largest = 0;
                for (std::int64_t n : model_tensor_elems(m)) largest = std::max(largest, n);
                const double bucket = buckets == 0 ? 0.0 : 1.05 * 4.0 * static_cast<double>(largest) / (1 << 20);
                RunConfig cfg = bf16_stage3(m, bucket);
                cfg.model.checkpoint = ck;
                cfg.param_persistence = threshold;
                cfg.accumulate = k;
                const std::string at = check_deepspeed_rank(
                    cfg, world, rank,
                    name + " " + ck.text() + " threshold " + std::to_string(threshold) + " bucket " +
                        std::to_string(bucket) + " K=" + std::to_string(k));
                places.insert(at.substr(0, at.find(' ')) +
                              (at.find("recompute") != std::string::npos ? " recompute" : ""));
              }
  for (const char* p : {"backward recompute", "backward", "optimizer"})
    EXPECT_TRUE(places.count(p)) << p << " in " << ::testing::PrintToString(places);
}

// Every emulated rank of `models` under --checkpoint attention (thresholds 0 and 100,000; one
// bucket and buckets of 1.05 times the largest tensor; K = 1, 2; W = 1 to 4) measured ==
// predicted, and each model's step the unchecked one's: loss, parameters, gradients and
// AdamW state bit for bit (W = 1), collectives the same and fewer bytes saved (W = 3, rank 1).
void check_attention_recompute(const std::vector<std::pair<std::string, ModelConfig>>& models) {
  const CheckpointPolicy attention{CheckpointKind::attention, 1};
  int checked = 0;
  for (const auto& [name, m] : models) {
    for (std::int64_t threshold : {0, 100'000})
      for (int buckets : {0, 1})
        for (int k : {1, 2})
          for (int world = 1; world <= 4; ++world)
            for (int rank = 0; rank < world; ++rank) {
              std::int64_t largest = 0;
              for (std::int64_t n : model_tensor_elems(m)) largest = std::max(largest, n);
              const double bucket = buckets == 0 ? 0.0 : 1.05 * 4.0 * static_cast<double>(largest) / (1 << 20);
              RunConfig cfg = bf16_stage3(m, bucket);
              cfg.model.checkpoint = attention;
              cfg.param_persistence = threshold;
              cfg.accumulate = k;
              check_deepspeed_rank(cfg, world, rank,
                                   name + " attention threshold " + std::to_string(threshold) + " bucket " +
                                       std::to_string(bucket) + " K=" + std::to_string(k));
              ++checked;
            }
    SCOPED_TRACE(name);
    for (int world : {1, 3}) {
      RunConfig cfg = bf16_stage3(m, 0);
      cfg.model.checkpoint = attention;
      RunConfig plain = cfg;
      plain.model.checkpoint = CheckpointPolicy{};
      CpuBackend b1, b2;
      auto c1 = make_fake_communicator(world, world == 1 ? 0 : 1, &b1);
      auto c2 = make_fake_communicator(world, world == 1 ? 0 : 1, &b2);
      const auto r = testing::run_dp(cfg, b1, *c1, world == 1);
      const auto p = testing::run_dp(plain, b2, *c2, world == 1);
      if (world == 1) {
        ASSERT_TRUE(testing::any_nonzero(p.state.params));
        EXPECT_EQ(r.state.params, p.state.params);
        EXPECT_EQ(r.state.grads, p.state.grads);
        EXPECT_EQ(r.state.exp_avg_sq, p.state.exp_avg_sq);
      }
      EXPECT_EQ(r.losses, p.losses);
      EXPECT_LT(r.saved.bytes, p.saved.bytes);
      for (int c = 0; c < kCollKindCount; ++c) {
        EXPECT_EQ(r.ledger.by_kind[c].bytes, p.ledger.by_kind[c].bytes);
        EXPECT_EQ(r.ledger.by_kind[c].calls, p.ledger.by_kind[c].calls);
      }
    }
  }
  EXPECT_EQ(checked, static_cast<int>(models.size()) * 2 * 2 * 2 * 10);
}

// --checkpoint attention under stage 3 in bf16, GPT-2: the bf16 module's attention core (no
// module, no hook) not saved but re-run on its saved bf16 q, k, v between attn.c_proj's and
// c_attn's backward; nothing gathered again. Flash and math, the shapes above and a long
// sequence against a narrow MLP (math's re-run above the plain backward); thresholds 0 and
// 100,000; one bucket and buckets of 1.05 times the largest tensor; K = 1, 2: every emulated
// rank at W = 1 to 4; the loss, parameters and AdamW state the unchecked step's bit for bit
// (W = 1) and its collectives the same (W = 3, rank 1).
TEST(DeepSpeedStage3Bf16, AttentionRecomputeGpt2MeasuredEqualsPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("gpt2" + how, testing::gpt2_of(2, 16, 2, 29, 6, 2, mode));
    models.emplace_back("gpt2 wide" + how, testing::gpt2_of(2, 64, 4, 37, 2, 1, mode));
    models.emplace_back("gpt2 long" + how, testing::gpt2_of(1, 16, 2, 11, 32, 2, mode, 8));
  }
  check_attention_recompute(models);
}

// The same on Llama's bf16 module (GQA untied, MHA tied, a long sequence against a narrow
// MLP), flash and math: the core's own save (flash's lse, math's probabilities) not kept,
// made again between o's and v's backward; nothing gathered again.
TEST(DeepSpeedStage3Bf16, AttentionRecomputeLlamaMeasuredEqualsPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("llama" + how, testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, mode, false));
    models.emplace_back("llama tied" + how, testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, mode, true));
    models.emplace_back("llama long" + how, testing::llama_of(1, 16, 4, 2, 8, 11, 32, 2, mode, false));
  }
  check_attention_recompute(models);
}

// --checkpoint full|every:K under stage 3 in bf16 on Llama (its bf16 module: no layer saves
// the bf16 stream, so a wrapped layer's input is its checkpoint's save and the output of the
// layer below it an activation): down_proj gathered first, the re-run gathering every other
// module again, their bf16 storages kept by the re-run's saves to each module's backward.
// GQA untied and MHA tied with biases, flash and math, a wide model and an MLP narrower than
// the stream; full, every:2; thresholds 0, 100, 100,000; one bucket and buckets of 1.05 times
// the largest tensor; K = 1, 2: every emulated rank at W = 1 to 4, the peak in a re-run, a
// block's backward and the optimizer somewhere.
TEST(DeepSpeedStage3Bf16, CheckpointedLlamaMeasuredEqualsPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("llama" + how, testing::llama_of(3, 16, 4, 2, 24, 13, 6, 2, mode, false));
    models.emplace_back("llama wide" + how, testing::llama_of(2, 64, 4, 2, 96, 37, 2, 1, mode, false));
    models.emplace_back("llama narrow mlp" + how, testing::llama_of(2, 32, 4, 2, 8, 5, 24, 2, mode, false));
  }
  ModelConfig biased = testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, AttentionMode::math, true);
  biased.transformer.qkv_bias = true;
  models.emplace_back("llama tied biased math", biased);
  std::set<std::string> places;
  for (const auto& [name, m] : models)
    for (const CheckpointPolicy& ck : {testing::every(1), testing::every(2)})
      for (std::int64_t threshold : {0, 100, 100'000})
        for (int buckets : {0, 1})
          for (int k : {1, 2})
            for (int world = 1; world <= 4; ++world)
              for (int rank = 0; rank < world; ++rank) {
                std::int64_t largest = 0;
                for (std::int64_t n : model_tensor_elems(m)) largest = std::max(largest, n);
                const double bucket = buckets == 0 ? 0.0 : 1.05 * 4.0 * static_cast<double>(largest) / (1 << 20);
                RunConfig cfg = bf16_stage3(m, bucket);
                cfg.model.checkpoint = ck;
                cfg.param_persistence = threshold;
                cfg.accumulate = k;
                const std::string at = check_deepspeed_rank(
                    cfg, world, rank,
                    name + " " + ck.text() + " threshold " + std::to_string(threshold) + " bucket " +
                        std::to_string(bucket) + " K=" + std::to_string(k));
                places.insert(at.substr(0, at.find(' ')) +
                              (at.find("recompute") != std::string::npos ? " recompute" : ""));
              }
  for (const char* p : {"backward recompute", "backward", "optimizer"})
    EXPECT_TRUE(places.count(p)) << p << " in " << ::testing::PrintToString(places);
}

}  // namespace
}  // namespace shardscope
