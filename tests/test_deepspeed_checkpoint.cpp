// --checkpoint under --engine deepspeed (harness/predict/deepspeed_forms.hpp): torch's
// non-reentrant checkpoint per layer or block, as users checkpoint under DeepSpeed
// (gradient_checkpointing_enable), on ZeRO's stages: every emulated rank at W = 1 to 4
// measures what the closed forms predict (every category at rest and at the peak, its phase
// and place, the saves and the bytes each collective moves), for the MLP, GPT-2 and Llama.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "harness/strategies/deepspeed_layout.hpp"
#include "support/deepspeed_check.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::check_deepspeed_rank;
using testing::ds_config;

CheckpointPolicy every(int k) { return {CheckpointKind::every, k}; }

std::vector<ModelConfig> mlps() {
  ModelConfig small;  // relu, mse
  small.layers = 5;
  small.width = 24;
  small.batch = 3;
  small.activation = Activation::relu;
  small.loss = Loss::mse;
  ModelConfig odd;  // none, mse; padding at W = 3
  odd.layers = 3;
  odd.width = 7;
  odd.batch = 2;
  odd.loss = Loss::mse;
  ModelConfig tiny;  // relu, sum; the last rank's partition mostly padding at W = 4
  tiny.layers = 2;
  tiny.width = 2;
  tiny.batch = 5;
  tiny.activation = Activation::relu;
  ModelConfig wide_batch;  // none, sum; activations above the gradients
  wide_batch.layers = 4;
  wide_batch.width = 16;
  wide_batch.batch = 512;
  return {small, odd, tiny, wide_batch};
}

std::string mlp_name(const ModelConfig& m) { return std::to_string(m.layers) + "x" + std::to_string(m.width); }

// Stages 1 and 2 of the MLP, full, every:2 and every:3, one bucket and several, --accumulate
// 1 and 2: the peak falls in a re-run somewhere.
TEST(DeepSpeedCheckpoint, MlpStagesOneTwoMeasuredEqualPredictedEveryRank) {
  std::set<std::string> places;
  for (const ModelConfig& base : mlps())
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
                if (bucket > 0 && ds_bucket_elems(bucket, 0) < largest) continue;
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

}  // namespace
}  // namespace shardscope
