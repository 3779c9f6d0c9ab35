// ddp under --engine deepspeed --precision bf16: DeepSpeed's ZeRO stage 0 in bf16, its
// FP16_Optimizer over FusedAdam (harness/strategies/deepspeed_stage0.hpp; the closed forms:
// harness/predict/deepspeed_forms.cpp, stage 0 of bf16_mlp_ranks, bf16_transformer_ranks and
// bf16_tail). Every emulated rank at W = 1 to 4 measures what the closed forms predict; the
// seed model and the buckets by hand.
#include <gtest/gtest.h>

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

RunConfig stage0(const ModelConfig& m, double bucket_mb) {
  RunConfig cfg = ds_config(m, "ddp", bucket_mb);
  cfg.precision = PrecisionKind::bf16;
  cfg.model.param_bf16 = true;
  return cfg;
}

// The MLPs of the DeepSpeed tests and the seed, GPT-2 flash and math on two shapes (one with
// an MLP narrower than h and activations above the parameters), Llama (GQA untied, MHA
// tied) flash and math; none, full and every:2 (GPT-2's attention too: its bf16 module's
// recompute);
// K = 1, 2, 3 with and without --no-sync; one bucket and buckets of about a weight (several).
TEST(DeepSpeedStage0, MeasuredEqualsPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (const ModelConfig& m : testing::ds_test_mlps()) models.emplace_back("mlp " + mlp_name(m), m);
  models.emplace_back("seed", ModelConfig{});
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string attn = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("gpt2 h16" + attn, testing::gpt2_of(2, 16, 2, 29, 6, 2, mode));
    models.emplace_back("gpt2 h16 f8 T32" + attn, testing::gpt2_of(3, 16, 2, 11, 32, 4, mode, 8));
    models.emplace_back("llama" + attn, testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, mode, false));
    models.emplace_back("llama tied" + attn, testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, mode, true));
  }
  std::set<std::string> places;
  int checked = 0;
  for (const auto& [name, m] : models)
    for (const CheckpointPolicy& ck :
         {CheckpointPolicy{}, every(1), every(2), CheckpointPolicy{CheckpointKind::attention, 1}})
      for (int k : {1, 2, 3})
        for (bool no_sync : {false, true})
          for (double bucket : {0.0, 0.0005})  // 131 elements: a bucket closes past it
            for (int world = 1; world <= 4; ++world)
              for (int rank = 0; rank < world; ++rank) {
                if (no_sync && k == 1) continue;
                if (name == "seed" && (k == 3 || world == 3 || bucket > 0)) continue;  // the large one: fewer
                if (ck.attention() && name.rfind("gpt2", 0) != 0) continue;  // GPT-2's; Llama's in its own test
                RunConfig cfg = stage0(m, bucket);
                cfg.model.checkpoint = ck;
                cfg.accumulate = k;
                cfg.no_sync = no_sync;
                places.insert(check_deepspeed_rank(cfg, world, rank,
                                                   "ddp bf16 " + name + " " + ck.text() + " K=" + std::to_string(k) +
                                                       (no_sync ? " no-sync" : "") + " bucket " +
                                                       std::to_string(bucket)));
                ++checked;
              }
  EXPECT_EQ(checked, 12 * 3 * 5 * 2 * 10 + 3 * 3 * 7 + 4 * 5 * 2 * 10);
  EXPECT_TRUE(places.count("optimizer -")) << ::testing::PrintToString(places);
  bool recompute = false, backward = false;
  for (const std::string& p : places) {
    recompute = recompute || p.find("recompute") != std::string::npos;
    backward = backward || p.rfind("backward", 0) == 0;
  }
  EXPECT_TRUE(recompute) << ::testing::PrintToString(places);
  EXPECT_TRUE(backward) << ::testing::PrintToString(places);
}

// The seed model (8 x 256, P = 526,336) at W = 4, by hand. At rest on every rank: the bf16
// group 2P = 1,052,672 (param), the master 4P = 2,105,344 (master), AdamW 8P + 4 = 4,210,692
// (optim), no gradient: 7,368,708 B; with the gradients the step keeps (2P) the ZeRO paper's
// baseline 16P + 4 = 8,421,380. Traffic: 2P all-reduced once (one bucket), nothing gathered.
// The peak is the step's flattening: autograd's 2P, every gradient's fp32 cast 4P and the
// master's gradient 4P beside the resting bytes, 24P + 4 = 12,632,068 B. --accumulate 2
// changes none of it (one reduction at the boundary).
TEST(DeepSpeedStage0, SeedModelByHand) {
  for (int k : {1, 2})
    for (int rank = 0; rank < 4; ++rank) {
      SCOPED_TRACE("K=" + std::to_string(k) + " r=" + std::to_string(rank));
      RunConfig cfg = stage0(ModelConfig{}, 0);
      cfg.accumulate = k;
      CpuBackend backend;
      auto comm = make_fake_communicator(4, rank, &backend);
      const auto r = testing::run_dp(cfg, backend, *comm, false);
      EXPECT_EQ(r.resting[Category::param], 1'052'672);
      EXPECT_EQ(r.resting[Category::master], 2'105'344);
      EXPECT_EQ(r.resting[Category::optim], 4'210'692);
      EXPECT_EQ(r.resting[Category::grad], 0);
      EXPECT_EQ(r.resting.total(), 7'368'708);
      EXPECT_EQ(r.peak.total, 12'632'068);
      EXPECT_EQ(std::string(phase_name(r.peak.phase)), "optimizer");
      EXPECT_EQ(r.peak.by_category[Category::grad_unsharded], 1'052'672);
      EXPECT_EQ(r.peak.by_category[Category::temp], 2'105'344);
      EXPECT_EQ(r.peak.by_category[Category::grad], 2'105'344);
      const int reduce = static_cast<int>(CollKind::all_reduce), gather = static_cast<int>(CollKind::all_gather);
      EXPECT_EQ(r.ledger.by_kind[reduce].bytes, 1'052'672);
      EXPECT_EQ(r.ledger.by_kind[reduce].calls, 1);
      EXPECT_EQ(r.ledger.by_kind[gather].bytes, 0);
      RunConfig planned = cfg;
      planned.model.param_bf16 = false;  // plan's configuration: the forms read the precision
      const Prediction p = predict_data_parallel(planned, 4, rank);
      ASSERT_TRUE(p.model_states.has_value());
      EXPECT_EQ(*p.model_states, 8'421'380);
      EXPECT_EQ(p.peak_total, r.peak.total);
    }
}

// allreduce_no_retain's buckets: a bucket closes once it holds more than the cap (after the
// tensor that crosses it), the rest one last bucket; a cap of 25 elements over tensors of
// 10, 20, 30 and 40 gives [10, 20], [30], [40]; the default (5e8) one bucket of all.
TEST(DeepSpeedStage0, BucketsCloseAfterTheTensorThatCrossesTheCap) {
  const std::vector<std::int64_t> tensors = {10, 20, 30, 40};
  const double cap25 = 25.0 * 4.0 / (1024.0 * 1024.0);
  const std::vector<DsStage0Bucket> b = ds_stage0_buckets(tensors, cap25);
  ASSERT_EQ(b.size(), 3U);
  EXPECT_EQ(b[0].first, 0);
  EXPECT_EQ(b[0].end, 2);
  EXPECT_EQ(b[0].elems, 30);
  EXPECT_EQ(b[1].first, 2);
  EXPECT_EQ(b[1].elems, 30);
  EXPECT_EQ(b[2].first, 3);
  EXPECT_EQ(b[2].end, 4);
  EXPECT_EQ(b[2].elems, 40);
  const std::vector<DsStage0Bucket> one = ds_stage0_buckets(tensors, 0.0);
  ASSERT_EQ(one.size(), 1U);
  EXPECT_EQ(one[0].elems, 100);
  // The run flattens each bucket on its own: its peak's comm is the largest bucket's 2·n_b,
  // one all-reduce call a bucket, 2P in all.
  RunConfig cfg = stage0(testing::ds_test_mlps()[0], 0.0005);  // 5 x 24: 576 + 24 a layer
  CpuBackend backend;
  auto comm = make_fake_communicator(2, 1, &backend);
  const auto r = testing::run_dp(cfg, backend, *comm, false);
  const std::vector<DsStage0Bucket> buckets = ds_stage0_buckets(model_tensor_elems(cfg.model), 0.0005);
  // Each weight crosses 131 elements: [w0], [b0, w1], [b1, w2], [b2, w3], [b3, w4], [b4].
  ASSERT_EQ(buckets.size(), 6U);
  EXPECT_EQ(buckets[1].elems, 600);
  EXPECT_EQ(buckets[5].elems, 24);
  EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_reduce)].calls, 6);
  EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_reduce)].bytes, 2 * cfg.model.params());
}

}  // namespace
}  // namespace shardscope
