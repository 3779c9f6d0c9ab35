// --engine deepspeed --precision bf16 on the MLP beyond one plain micro-step
// (harness/strategies/deepspeed.hpp, deepspeed_zero3.hpp; harness/predict/deepspeed_forms.hpp):
// --checkpoint and --accumulate under stages 1 and 2 (DeepSpeed's grad_accum_dtype, the
// parameters' bf16: autograd's gradients and the accumulated partition added in bf16), and
// stage 3 in bf16 (with both). Every emulated rank at W = 1 to 4 measures what the closed
// forms predict.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "harness/comm/fake_comm.hpp"
#include "support/deepspeed_check.hpp"

namespace shardscope {
namespace {

using testing::check_deepspeed_rank;
using testing::ds_config;
using testing::every;
using testing::mlp_name;

RunConfig bf16_config(const ModelConfig& m, const char* strategy, double bucket_mb) {
  RunConfig cfg = ds_config(m, strategy, bucket_mb);
  cfg.precision = PrecisionKind::bf16;
  cfg.model.param_bf16 = true;
  return cfg;
}


// Stages 1 and 2: none, full, every:2 and every:3; K = 1, 2, 3 (stage 1 with and without
// --no-sync); one bucket and several.
TEST(DeepSpeedBf16, StagesOneTwoCheckpointAndAccumulationMeasuredEqualPredictedEveryRank) {
  std::set<std::string> places;
  for (const ModelConfig& m : testing::ds_test_mlps())
    for (const CheckpointPolicy& ck : {CheckpointPolicy{}, every(1), every(2), every(3)})
      for (const char* s : {"zero1", "zero2"})
        for (int k : {1, 2, 3})
          for (bool no_sync : {false, true})
            for (double bucket : {0.0, 0.0005})
              for (int world = 1; world <= 4; ++world)
                for (int rank = 0; rank < world; ++rank) {
                  if (no_sync && (k == 1 || std::string(s) == "zero2")) continue;
                  if (bucket > 0 && bucket * 1024 * 1024 / 4 < m.weight_elems()) continue;
                  RunConfig cfg = bf16_config(m, s, bucket);
                  cfg.model.checkpoint = ck;
                  cfg.accumulate = k;
                  cfg.no_sync = no_sync;
                  places.insert(check_deepspeed_rank(
                      cfg, world, rank,
                      std::string(s) + " bf16 " + mlp_name(m) + " " + ck.text() + " K=" + std::to_string(k) +
                          (no_sync ? " no-sync" : "") + " bucket " + std::to_string(bucket)));
                }
  bool recompute = false, backward = false;
  for (const std::string& p : places) {
    recompute = recompute || p.find("recompute") != std::string::npos;
    backward = backward || p.rfind("backward", 0) == 0;
  }
  EXPECT_TRUE(recompute) << ::testing::PrintToString(places);
  EXPECT_TRUE(backward) << ::testing::PrintToString(places);
  EXPECT_TRUE(places.count("communication -")) << ::testing::PrintToString(places);
}

// The seed model (P = 526,336, s = 131,584 at W = 4, rank 0's partition layers 0 and 1
// exactly: G2 = 2s = 263,168 B), one bucket, K = 2, by hand: stage 1 all-reduces 2P =
// 1,052,672 B once, stage 2 twice (2,105,344); both all-gather the bf16 group once
// (1,052,672); stage 2's peak is its one-micro-step peak plus the accumulated G2 held beside
// the second micro-step's backward.
TEST(DeepSpeedBf16, AccumulationOnTheSeedModelByHand) {
  for (const char* strategy : {"zero1", "zero2"}) {
    SCOPED_TRACE(strategy);
    RunConfig one = bf16_config(ModelConfig{}, strategy, 0);
    RunConfig two = one;
    two.accumulate = 2;
    CpuBackend b1, b2;
    auto c1 = make_fake_communicator(4, 0, &b1);
    auto c2 = make_fake_communicator(4, 0, &b2);
    const auto r1 = testing::run_dp(one, b1, *c1, false);
    const auto r2 = testing::run_dp(two, b2, *c2, false);
    const bool stage2 = std::string(strategy) == "zero2";
    const int reduce = static_cast<int>(CollKind::all_reduce), gather = static_cast<int>(CollKind::all_gather);
    EXPECT_EQ(r2.ledger.by_kind[reduce].bytes, stage2 ? 2'105'344 : 1'052'672);
    EXPECT_EQ(r2.ledger.by_kind[reduce].calls, stage2 ? 2 : 1);
    EXPECT_EQ(r2.ledger.by_kind[gather].bytes, 1'052'672);
    EXPECT_EQ(r2.resting, r1.resting);
    if (stage2) {
      EXPECT_EQ(r2.peak.total, r1.peak.total + 263'168);
      EXPECT_EQ(r2.where, r1.where);
    } else {
      EXPECT_EQ(r2.peak.by_category[Category::grad_unsharded], 1'052'672);  // autograd's 2P, added onto
    }
  }
}

// Stage 3 in bf16: weights gathered alone (their biases persistent) or with their biases
// (threshold 0), every tensor persistent, short partitions, one bucket and several, K = 1, 2,
// --checkpoint none, full and every:2 (a wrapped layer 0's re-run casts the batch again), both
// activations.
TEST(DeepSpeedBf16, StageThreeMeasuredEqualsPredictedEveryRank) {
  struct Case {
    const char* name;
    ModelConfig m;
    std::int64_t threshold;
    double bucket;
  };
  ModelConfig wide;  // 320 x 320: a weight above DeepSpeed's default threshold
  wide.layers = 3;
  wide.width = 320;
  wide.batch = 2;
  wide.activation = Activation::relu;
  wide.loss = Loss::mse;
  ModelConfig narrow;  // 5 x 24
  narrow.layers = 5;
  narrow.width = 24;
  narrow.batch = 3;
  narrow.activation = Activation::relu;
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
      {"odd all kept", odd, 100'000, 0.0},    {"big batch", big_batch, 0, 0.0},
  };
  std::set<std::string> places;
  for (const Case& c : cases)
    for (Activation act : {Activation::relu, Activation::none})
      for (const CheckpointPolicy& ck : {CheckpointPolicy{}, every(1), every(2)})
        for (int k : {1, 2})
          for (int world = 1; world <= 4; ++world)
            for (int rank = 0; rank < world; ++rank) {
              RunConfig cfg = bf16_config(c.m, "zero3", c.bucket);
              cfg.model.activation = act;
              cfg.model.checkpoint = ck;
              cfg.param_persistence = c.threshold;
              cfg.accumulate = k;
              places.insert(check_deepspeed_rank(cfg, world, rank,
                                                 std::string(c.name) + (act == Activation::relu ? " relu " : " none ") +
                                                     ck.text() + " K=" + std::to_string(k)));
            }
  bool backward = false, recompute = false;
  for (const std::string& p : places) {
    backward = backward || p.rfind("backward", 0) == 0;
    recompute = recompute || p.find("recompute") != std::string::npos;
  }
  EXPECT_TRUE(backward) << ::testing::PrintToString(places);
  EXPECT_TRUE(recompute) << ::testing::PrintToString(places);
}

// Stage 3 of a 5 x 24 MLP at W = 4 in bf16, every tensor gathered (threshold 0), by hand: c =
// 144 a weight, 6 a bias, C = 750; at rest param 2C = 1,500 (the bf16 partitions), master 4C
// = 3,000, grad 2C = 1,500 (the bf16 gradient partitions), optim 8C + 4 = 6,004, comm the bf16
// bucket 2P = 6,000: 18,004 B; its model states (less the bucket) are 16C + 4, the ZeRO
// paper's 16Ψ/N with the padding. A step all-reduces 2P = 6,000 B and gathers each layer
// twice in bf16 (2 × 4 × 150 = 1,200 B a gather): 12,000.
TEST(DeepSpeedBf16, StageThreeRestsAndMovesByHand) {
  ModelConfig m;
  m.layers = 5;
  m.width = 24;
  m.batch = 3;
  RunConfig cfg = bf16_config(m, "zero3", 0);
  cfg.param_persistence = 0;
  for (int rank = 0; rank < 4; ++rank) {
    CpuBackend backend;
    auto comm = make_fake_communicator(4, rank, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.resting.total(), 18'004);
    EXPECT_EQ(r.resting[Category::param], 1'500);
    EXPECT_EQ(r.resting[Category::master], 3'000);
    EXPECT_EQ(r.resting[Category::grad], 1'500);
    EXPECT_EQ(r.resting[Category::optim], 6'004);
    EXPECT_EQ(r.resting[Category::comm], 6'000);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_reduce)].bytes, 6'000);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_gather)].bytes, 12'000);
    RunConfig planned = cfg;
    planned.model.param_bf16 = false;  // plan's configuration: the forms read the precision
    EXPECT_EQ(*predict_data_parallel(planned, 4, rank).model_states, 16 * 750 + 4);
  }
}

}  // namespace
}  // namespace shardscope
