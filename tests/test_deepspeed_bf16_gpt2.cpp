// --engine deepspeed --precision bf16 on GPT-2 and Llama beyond one plain micro-step
// (harness/strategies/deepspeed.hpp; harness/predict/deepspeed_forms.hpp,
// bf16_transformer_ranks): --accumulate K under
// stages 1 and 2 (grad_accum_dtype the parameters' bf16: the bf16 module adds each later
// micro-step's gradient onto autograd's bf16 one, stage 2 the averaged partition onto the
// first micro-step's) and --checkpoint full|every:K (the bf16 module's wrapped blocks re-run at
// the start of their backward) and attention (the module's attention core re-run on its saved
// bf16 q, k, v). Every emulated rank at W = 1 to 4 measures what the closed
// forms predict.
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

RunConfig bf16_gpt2(const ModelConfig& m, const char* strategy, double bucket_mb) {
  RunConfig cfg = ds_config(m, strategy, bucket_mb);
  cfg.precision = PrecisionKind::bf16;
  cfg.model.param_bf16 = true;
  return cfg;
}

// flash and math; none, full, every:2 and attention (the bf16 module's attention recompute,
// as under FSDP's bf16); K = 1, 2, 3 (stage 1 with and without --no-sync,
// which changes nothing there); one bucket and several. Two shapes: the DeepSpeed GPT-2 tests'
// and one whose MLP is narrower than h (f = 8 < h = 16) with activations above the
// parameters, so that a peak in a re-run shows.
TEST(DeepSpeedBf16Gpt2, AccumulationAndCheckpointMeasuredEqualPredictedEveryRank) {
  std::set<std::string> places;
  int checked = 0;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const ModelConfig& m : {testing::gpt2_of(2, 16, 2, 29, 6, 2, mode), testing::gpt2_of(3, 16, 2, 11, 32, 4, mode, 8)})
      for (const CheckpointPolicy& ck :
           {CheckpointPolicy{}, every(1), every(2), CheckpointPolicy{CheckpointKind::attention, 1}})
        for (const char* s : {"zero1", "zero2"})
          for (int k : {1, 2, 3})
            for (bool no_sync : {false, true})
              for (double bucket : {0.0, 0.005})  // one bucket; 1,310 elements, several
                for (int world = 1; world <= 4; ++world)
                  for (int rank = 0; rank < world; ++rank) {
                    if (no_sync && (k == 1 || std::string(s) == "zero2")) continue;
                    RunConfig cfg = bf16_gpt2(m, s, bucket);
                    cfg.model.checkpoint = ck;
                    cfg.accumulate = k;
                    cfg.no_sync = no_sync;
                    places.insert(check_deepspeed_rank(
                        cfg, world, rank,
                        std::string(s) + " bf16 gpt2 " + (mode == AttentionMode::flash ? "flash " : "math ") +
                            "h16 f" + std::to_string(m.transformer.ffn) + " " + ck.text() + " K=" +
                            std::to_string(k) + (no_sync ? " no-sync" : "") + " bucket " + std::to_string(bucket)));
                    ++checked;
                  }
  EXPECT_EQ(checked, 2 * 2 * 4 * (3 + 2 + 3) * 2 * 10);
  bool recompute = false, backward = false;
  for (const std::string& p : places) {
    recompute = recompute || p.find("recompute") != std::string::npos;
    backward = backward || p.rfind("backward", 0) == 0;
  }
  EXPECT_TRUE(recompute) << ::testing::PrintToString(places);
  EXPECT_TRUE(backward) << ::testing::PrintToString(places);
}

// Llama's bf16 module (GQA untied, MHA tied, qwen2's biases), flash and math, under the same
// grid and stage 0 (ddp): K = 1, 2, 3 (stages 0 and 1 with and without --no-sync), none,
// full, every:2 and attention (the module's attention recompute), one bucket and several.
TEST(DeepSpeedBf16Llama, AccumulationAndCheckpointMeasuredEqualPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("llama" + how, testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, mode, false));
    models.emplace_back("llama tied" + how, testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, mode, true));
  }
  ModelConfig biased = testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::flash, false);
  biased.transformer.qkv_bias = biased.transformer.out_bias = true;
  models.emplace_back("llama biased flash", biased);
  std::set<std::string> places;
  int checked = 0;
  for (const auto& [name, m] : models)
    for (const CheckpointPolicy& ck :
         {CheckpointPolicy{}, every(1), every(2), CheckpointPolicy{CheckpointKind::attention, 1}})
      for (const char* s : {"ddp", "zero1", "zero2"})
        for (int k : {1, 2, 3})
          for (bool no_sync : {false, true})
            for (double bucket : {0.0, 0.002})  // one bucket; 524 elements, several
              for (int world = 1; world <= 4; ++world)
                for (int rank = 0; rank < world; ++rank) {
                  if (no_sync && (k == 1 || std::string(s) == "zero2")) continue;
                  RunConfig cfg = bf16_gpt2(m, s, bucket);
                  cfg.model.checkpoint = ck;
                  cfg.accumulate = k;
                  cfg.no_sync = no_sync;
                  places.insert(check_deepspeed_rank(cfg, world, rank,
                                                     std::string(s) + " bf16 " + name + " " + ck.text() + " K=" +
                                                         std::to_string(k) + (no_sync ? " no-sync" : "") +
                                                         " bucket " + std::to_string(bucket)));
                  ++checked;
                }
  EXPECT_EQ(checked, 5 * 4 * (5 + 5 + 3) * 2 * 10);
  bool backward = false;
  for (const std::string& p : places) backward = backward || p.rfind("backward", 0) == 0;
  EXPECT_TRUE(backward) << ::testing::PrintToString(places);
}

// K = 2 against K = 1 on one shape at W = 2, rank 0, one bucket, by what each holds: stage 1
// all-reduces 2P once (the boundary's), stage 2 twice; both all-gather the bf16 group once;
// the resting bytes are K = 1's. Stage 1's autograd gradients (2P, grad_unsharded) are the
// same buffer added onto, stage 2's peak is K = 1's plus the first micro-step's accumulated
// partition (2 × the elements touching it) when both peak in a backward.
TEST(DeepSpeedBf16Gpt2, AccumulationAgainstOneMicroStep) {
  const ModelConfig m = testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::flash);
  const std::vector<DsPartition> parts = ds_partitions(model_tensor_elems(m), 2);
  const std::int64_t P = parts[0].elems, G2 = 2 * parts[0].touching;
  for (const char* strategy : {"zero1", "zero2"}) {
    SCOPED_TRACE(strategy);
    RunConfig one = bf16_gpt2(m, strategy, 0);
    RunConfig two = one;
    two.accumulate = 2;
    CpuBackend b1, b2;
    auto c1 = make_fake_communicator(2, 0, &b1);
    auto c2 = make_fake_communicator(2, 0, &b2);
    const auto r1 = testing::run_dp(one, b1, *c1, false);
    const auto r2 = testing::run_dp(two, b2, *c2, false);
    const bool stage2 = std::string(strategy) == "zero2";
    const int reduce = static_cast<int>(CollKind::all_reduce), gather = static_cast<int>(CollKind::all_gather);
    EXPECT_EQ(r2.ledger.by_kind[reduce].bytes, (stage2 ? 2 : 1) * 2 * P);
    EXPECT_EQ(r2.ledger.by_kind[reduce].calls, stage2 ? 2 : 1);
    EXPECT_EQ(r2.ledger.by_kind[gather].bytes, 2 * parts[0].padded);
    EXPECT_EQ(r2.resting, r1.resting);
    if (stage2) {
      ASSERT_EQ(std::string(phase_name(r1.peak.phase)), "backward");
      EXPECT_EQ(r2.peak.total, r1.peak.total + G2);
      EXPECT_EQ(r2.peak.by_category[Category::grad], r1.peak.by_category[Category::grad] + G2);
    } else {
      EXPECT_EQ(r2.peak.by_category[Category::grad_unsharded], 2 * P);
    }
  }
}

// The bf16 module's saves under --checkpoint do not depend on who holds its parameters:
// DeepSpeed's bf16 (the flat group's views) saves what FSDP1's MixedPrecision (gathered
// bf16 units) saves, measured on both, for full and every:2, flash and math.
TEST(DeepSpeedBf16Gpt2, CheckpointSavesAreFsdpBf16Modules) {
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const CheckpointPolicy& ck : {every(1), every(2)}) {
      SCOPED_TRACE(std::string(mode == AttentionMode::flash ? "flash " : "math ") + ck.text());
      RunConfig ds = bf16_gpt2(testing::gpt2_of(3, 16, 2, 29, 6, 2, mode), "zero1", 0);
      ds.model.checkpoint = ck;
      RunConfig fsdp = ds;
      fsdp.engine = EngineKind::torch;
      fsdp.strategy = StrategyKind::zero3;
      fsdp.layers_per_unit = 1;
      CpuBackend b1, b2;
      auto c1 = make_fake_communicator(2, 1, &b1);
      auto c2 = make_fake_communicator(2, 1, &b2);
      const auto r_ds = testing::run_dp(ds, b1, *c1, false);
      const auto r_fsdp = testing::run_dp(fsdp, b2, *c2, false);
      EXPECT_GT(r_ds.saved.bytes, 0);
      EXPECT_EQ(r_ds.saved.bytes, r_fsdp.saved.bytes);
      EXPECT_EQ(r_ds.saved.tensors, r_fsdp.saved.tensors);
      RunConfig plain = ds;
      plain.model.checkpoint = {};
      CpuBackend b3;
      auto c3 = make_fake_communicator(2, 1, &b3);
      EXPECT_LT(r_ds.saved.bytes, testing::run_dp(plain, b3, *c3, false).saved.bytes);
    }
}

// --checkpoint attention under stages 0, 1 and 2: the bf16 module's recompute gives the
// unchecked bf16 step's loss and gradients bit for bit, saves less than it, and moves the same
// collectives (the core has no parameters: nothing reduced or gathered again), flash and math.
TEST(DeepSpeedBf16Gpt2, AttentionRecomputeIsThePlainStepBitForBit) {
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const char* s : {"ddp", "zero1", "zero2"})
      for (int k : {1, 2}) {
        SCOPED_TRACE(std::string(s) + (mode == AttentionMode::flash ? " flash" : " math") + " K=" + std::to_string(k));
        RunConfig cfg = bf16_gpt2(testing::gpt2_of(3, 16, 2, 11, 32, 4, mode, 8), s, 0);
        cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::attention, 1};
        cfg.accumulate = k;
        cfg.steps = 2;
        RunConfig plain = cfg;
        plain.model.checkpoint = CheckpointPolicy{};
        // One rank (the whole state its own): parameters, gradients and AdamW's state after
        // two steps; rank 1 of 2: its losses, saves and collectives.
        for (int world : {1, 2}) {
          CpuBackend b1, b2;
          auto c1 = make_fake_communicator(world, world - 1, &b1);
          auto c2 = make_fake_communicator(world, world - 1, &b2);
          const auto r = testing::run_dp(cfg, b1, *c1, world == 1);
          const auto p = testing::run_dp(plain, b2, *c2, world == 1);
          if (world == 1) {
            ASSERT_TRUE(testing::any_nonzero(p.state.grads));
            EXPECT_EQ(r.state.grads, p.state.grads);
            EXPECT_EQ(r.state.params, p.state.params);
            EXPECT_EQ(r.state.exp_avg_sq, p.state.exp_avg_sq);
          }
          EXPECT_EQ(r.losses, p.losses);
          EXPECT_LT(r.saved.bytes, p.saved.bytes);
          for (int c = 0; c < static_cast<int>(r.ledger.by_kind.size()); ++c) {
            EXPECT_EQ(r.ledger.by_kind[c].bytes, p.ledger.by_kind[c].bytes);
            EXPECT_EQ(r.ledger.by_kind[c].calls, p.ledger.by_kind[c].calls);
          }
        }
      }
}

}  // namespace
}  // namespace shardscope
