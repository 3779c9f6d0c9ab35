// --checkpoint under --engine deepspeed (harness/predict/deepspeed_forms.hpp): torch's
// non-reentrant checkpoint per layer or block, as users checkpoint under DeepSpeed
// (gradient_checkpointing_enable), on ZeRO's stages: every emulated rank at W = 1 to 4
// measures what the closed forms predict (every category at rest and at the peak, its phase
// and place, the saves and the bytes each collective moves), for the MLP, GPT-2 and Llama.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "harness/comm/fake_comm.hpp"
#include "harness/strategies/deepspeed_layout.hpp"
#include "support/deepspeed_check.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::check_deepspeed_rank;
using testing::ds_config;
using testing::every;
using testing::mlp_name;


// Stages 1 and 2 of the MLP, full, every:2 and every:3, one bucket and several, --accumulate
// 1 and 2: the peak falls in a re-run somewhere.
TEST(DeepSpeedCheckpoint, MlpStagesOneTwoMeasuredEqualPredictedEveryRank) {
  std::set<std::string> places;
  for (const ModelConfig& base : testing::ds_test_mlps())
    for (const CheckpointPolicy& ck : {every(1), every(2), every(3)})
      for (const char* s : {"zero1", "zero2"})
        for (int k : {1, 2})
          for (double bucket : {0.0, 0.0005})
            for (int world = 1; world <= 4; ++world)
              for (int rank = 0; rank < world; ++rank) {
                if (bucket > 0 && bucket * 1024 * 1024 / 4 < base.weight_elems()) continue;
                RunConfig cfg = ds_config(base, s, bucket);
                cfg.model.checkpoint = ck;
                cfg.accumulate = k;
                places.insert(check_deepspeed_rank(cfg, world, rank,
                                                   std::string(s) + " " + mlp_name(base) + " " + ck.text() +
                                                       " K=" + std::to_string(k) + " bucket " + std::to_string(bucket)));
              }
  bool recompute = false;
  for (const std::string& p : places) recompute = recompute || p.find("recompute") != std::string::npos;
  EXPECT_TRUE(recompute) << ::testing::PrintToString(places);
}

// Stage 3 of the MLP (deepspeed_zero3.hpp): under ReLU a wrapped layer's re-run gathers it
// again before its backward's gather, without ReLU its backward's gather serves the re-run;
// the re-run's saves keep the layer's gathered bytes to its backward end. Weights
// gathered alone (their biases persistent) or with their biases (threshold 0), short
// partitions, one bucket and buckets of about a weight, K = 1, 2, both activations: every
// emulated rank at W = 1 to 4; the peak falls in a re-run somewhere.
TEST(DeepSpeedCheckpoint, MlpStageThreeMeasuredEqualsPredictedEveryRank) {
  struct Case {
    const char* name;
    ModelConfig m;
    std::int64_t threshold;
    double bucket;
  };
  ModelConfig wide;  // 320 x 320: a weight above DeepSpeed's default threshold, gathered alone
  wide.layers = 3;
  wide.width = 320;
  wide.batch = 2;
  wide.loss = Loss::mse;
  ModelConfig narrow;  // 5 x 24
  narrow.layers = 5;
  narrow.width = 24;
  narrow.batch = 3;
  ModelConfig odd;  // 3 x 7: short partitions at W = 2, 3, 4
  odd.layers = 3;
  odd.width = 7;
  odd.batch = 2;
  odd.loss = Loss::mse;
  ModelConfig big_batch;  // activations above the parameters
  big_batch.layers = 4;
  big_batch.width = 16;
  big_batch.batch = 256;
  const Case cases[] = {
      {"wide", wide, 100'000, 0.0},           {"narrow all gathered", narrow, 0, 0.0},
      {"narrow buckets", narrow, 0, 0.0023},  {"narrow biases kept", narrow, 30, 0.0023},
      {"odd", odd, 7, 0.0},                   {"odd all gathered", odd, 0, 0.0002},
      {"big batch", big_batch, 0, 0.0},
  };
  std::set<std::string> places;
  for (const Case& c : cases)
    for (Activation act : {Activation::relu, Activation::none})
      for (const CheckpointPolicy& ck : {every(1), every(2)})
        for (int k : {1, 2})
          for (int world = 1; world <= 4; ++world)
            for (int rank = 0; rank < world; ++rank) {
              RunConfig cfg = ds_config(c.m, "zero3", c.bucket);
              cfg.model.activation = act;
              cfg.model.checkpoint = ck;
              cfg.param_persistence = c.threshold;
              cfg.accumulate = k;
              places.insert(check_deepspeed_rank(cfg, world, rank,
                                                 std::string(c.name) + (act == Activation::relu ? " relu " : " none ") +
                                                     ck.text() + " K=" + std::to_string(k)));
            }
  bool recompute = false;
  for (const std::string& p : places) recompute = recompute || p.find("recompute") != std::string::npos;
  EXPECT_TRUE(recompute) << ::testing::PrintToString(places);
}

// Stage 3 of a 3 x 24 MLP under ReLU, every tensor gathered (threshold 0), --checkpoint full
// at W = 4, by hand: c = 144 a weight, 6 a bias; a layer's gather moves 4 × 4 × 150 = 2,400 B.
// The unchecked step gathers each layer twice (14,400 B); the re-runs gather each layer once
// more (7,200 B: 21,600 in all). A layer's re-run saves keep its weight and bias (576 + 24
// elements, 2,400 B: LinearFunctionForZeroStage3 saves both) beside the backward's gather:
// two copies of the layer at once.
TEST(DeepSpeedCheckpoint, StageThreeReRunGathersAgainByHand) {
  ModelConfig m;
  m.layers = 3;
  m.width = 24;
  m.batch = 3;
  m.activation = Activation::relu;
  RunConfig cfg = ds_config(m, "zero3", 0);
  cfg.param_persistence = 0;
  cfg.model.checkpoint = every(1);
  RunConfig plain = cfg;
  plain.model.checkpoint = CheckpointPolicy{};
  CpuBackend b1, b2;
  auto c1 = make_fake_communicator(4, 0, &b1);
  auto c2 = make_fake_communicator(4, 0, &b2);
  const auto r = testing::run_dp(cfg, b1, *c1, false);
  const auto u = testing::run_dp(plain, b2, *c2, false);
  const int gather = static_cast<int>(CollKind::all_gather);
  EXPECT_EQ(u.ledger.by_kind[gather].bytes, 14'400);
  EXPECT_EQ(r.ledger.by_kind[gather].bytes, 21'600);
  EXPECT_EQ(r.ledger.by_kind[gather].calls, 9);
  // The backward's gather of a layer (2 × 4 × (576 + 24) = 4,800 B: its flat buffer's 2,400
  // beside its tensors' 2,400) with the re-run's weight and bias (2,400) kept.
  EXPECT_EQ(r.peak.by_category[Category::param_unsharded] - u.peak.by_category[Category::param_unsharded], 2'400)
      << describe_place(r.peak.place);
}

// GPT-2 and Llama (flash and math, Llama tied and untied) under stages 1 and 2: full,
// every:2 and attention (Korthikanti's selective recompute), one bucket and several,
// --accumulate 1 and 2.
TEST(DeepSpeedCheckpoint, TransformerStagesOneTwoMeasuredEqualPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("gpt2" + how, testing::gpt2_of(2, 16, 2, 29, 6, 2, mode));
    models.emplace_back("llama" + how, testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, mode, false));
    models.emplace_back("llama tied" + how, testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, mode, true));
    // Long sequences over a small vocabulary: activations above the gradients.
    models.emplace_back("gpt2 long" + how, testing::gpt2_of(3, 8, 2, 5, 48, 3, mode));
    models.emplace_back("llama long" + how, testing::llama_of(3, 8, 2, 1, 12, 5, 48, 3, mode, false));
  }
  const CheckpointPolicy attention{CheckpointKind::attention, 1};
  int lower = 0;  // configurations whose peak checkpointing lowers
  for (const auto& [name, m] : models)
    for (const CheckpointPolicy& ck : {every(1), every(2), attention})
      for (const char* s : {"zero1", "zero2"})
        for (int k : {1, 2})
          for (double bucket : {0.0, 0.005})
            for (int world = 1; world <= 4; ++world)
              for (int rank = 0; rank < world; ++rank) {
                std::int64_t largest = 0;
                for (std::int64_t n : model_tensor_elems(m)) largest = std::max(largest, n);
                if (bucket > 0 && ds_bucket_elems(bucket, {}) < largest) continue;
                RunConfig cfg = ds_config(m, s, bucket);
                cfg.model.checkpoint = ck;
                cfg.accumulate = k;
                check_deepspeed_rank(cfg, world, rank,
                                     name + " " + s + " " + ck.text() + " K=" + std::to_string(k) + " bucket " +
                                         std::to_string(bucket));
                RunConfig unwrapped = cfg;
                unwrapped.model.checkpoint = CheckpointPolicy{};
                lower += predict_data_parallel(cfg, world, rank).peak_total <
                         predict_data_parallel(unwrapped, world, rank).peak_total;
              }
  EXPECT_GT(lower, 0);
}

// Stage 3 of a one-block GPT-2 (h 16, 2 heads, vocabulary 29, 6 tokens) at W = 2, every
// tensor gathered (threshold 0), --checkpoint full, by hand: unchecked, each of its ten
// modules is gathered in forward and in backward (20 calls, 34,688 B: test_deepspeed.cpp's
// StageThreeGpt2RestsAndMovesByHand). The block's re-run gathers ln_1 (32 elements), c_attn
// (816), attn.c_proj (272), ln_2 (32) and c_fc (1,088) once more, each moving 4 × its
// elements at W = 2: 5 calls, 8,960 B; mlp.c_proj, gathered by its pre-backward hook before
// the re-run, is not gathered again; the closed forms move the same.
TEST(DeepSpeedCheckpoint, StageThreeTransformerReRunGathersAgainByHand) {
  RunConfig cfg = ds_config(testing::gpt2_of(1, 16, 2, 29, 6, 1, AttentionMode::flash), "zero3", 0);
  cfg.param_persistence = 0;
  cfg.model.checkpoint = every(1);
  RunConfig plain = cfg;
  plain.model.checkpoint = CheckpointPolicy{};
  CpuBackend b1, b2;
  auto c1 = make_fake_communicator(2, 0, &b1);
  auto c2 = make_fake_communicator(2, 0, &b2);
  const auto r = testing::run_dp(cfg, b1, *c1, false);
  const auto u = testing::run_dp(plain, b2, *c2, false);
  const int gather = static_cast<int>(CollKind::all_gather);
  EXPECT_EQ(u.ledger.by_kind[gather].bytes, 34'688);
  EXPECT_EQ(u.ledger.by_kind[gather].calls, 20);
  EXPECT_EQ(r.ledger.by_kind[gather].bytes, 34'688 + 8'960);
  EXPECT_EQ(r.ledger.by_kind[gather].calls, 25);
  const Prediction p = predict_data_parallel(cfg, 2, 0);
  EXPECT_EQ(p.comm_bytes[gather], 43'648);
}

// Stage 3 of GPT-2 and Llama (deepspeed_zero3.hpp): a wrapped block's backward begins with
// its first-backward module's gather (mlp.c_proj, down_proj), then its re-run gathers and
// releases every other module again, their saves keeping the gathered storages to each
// module's backward, which gathers it a third time beside them. GPT-2 (tied) and Llama
// (untied, tied, biased, grouped-query), flash and math, full, every:2 and attention; every
// tensor gathered (threshold 0), the weights alone (100), every tensor kept (100,000); one
// bucket and buckets of about a weight; K = 1, 2: every emulated rank at W = 1 to 4, the
// peak in a re-run, in a block's backward and in the optimizer somewhere.
TEST(DeepSpeedCheckpoint, TransformerStageThreeMeasuredEqualPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("gpt2" + how, testing::gpt2_of(2, 16, 2, 29, 6, 2, mode));
    models.emplace_back("llama" + how, testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, mode, false));
    models.emplace_back("llama tied" + how, testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, mode, true));
    // Long sequences over a small vocabulary: activations above the gradients.
    models.emplace_back("gpt2 long" + how, testing::gpt2_of(3, 8, 2, 5, 48, 3, mode));
    models.emplace_back("llama long" + how, testing::llama_of(3, 8, 2, 1, 12, 5, 48, 3, mode, false));
    // Weights above the activations: a re-run's kept storages set the peak.
    models.emplace_back("gpt2 wide" + how, testing::gpt2_of(2, 64, 4, 37, 2, 1, mode));
    models.emplace_back("llama wide" + how, testing::llama_of(2, 64, 4, 2, 96, 37, 2, 1, mode, false));
    // An MLP narrower than the stream (f < h): the re-run's output, beside dy, above the
    // block's backward instants.
    models.emplace_back("gpt2 narrow mlp" + how, testing::gpt2_of(2, 32, 4, 5, 24, 2, mode, 8));
    models.emplace_back("llama narrow mlp" + how, testing::llama_of(2, 32, 4, 2, 8, 5, 24, 2, mode, false));
  }
  ModelConfig biased = testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::math, false);
  biased.transformer.qkv_bias = biased.transformer.out_bias = true;
  models.emplace_back("llama biased math", biased);
  models.emplace_back("gpt2 odd", testing::gpt2_of(3, 18, 3, 41, 3, 1, AttentionMode::flash));
  const CheckpointPolicy attention{CheckpointKind::attention, 1};
  std::set<std::string> places;
  for (const auto& [name, m] : models)
    for (const CheckpointPolicy& ck : {every(1), every(2), attention})
      for (std::int64_t threshold : {0, 100, 100'000})
        for (int buckets : {0, 1})  // one bucket; buckets of 1.05 times the largest tensor
          for (int k : {1, 2})
            for (int world = 1; world <= 4; ++world)
              for (int rank = 0; rank < world; ++rank) {
                std::int64_t largest = 0;
                for (std::int64_t n : model_tensor_elems(m)) largest = std::max(largest, n);
                const double bucket = buckets == 0 ? 0.0 : 1.05 * 4.0 * static_cast<double>(largest) / (1 << 20);
                RunConfig cfg = ds_config(m, "zero3", bucket);
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
