// --engine deepspeed (harness/strategies/deepspeed.hpp, harness/predict/deepspeed_forms.hpp):
// DeepSpeed's partition of the flat group, worked by hand; the seed model's ranks rest at
// the figure its layout gives by hand; every emulated rank measures what the closed forms
// predict (every category at rest and at the peak, its phase and place, the saves and the
// bytes each collective moves), for the MLP, GPT-2 and Llama at W = 1 to 4, one bucket or
// several; stage 3's model states by hand.
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

// Tensors of 10, 3, 10 and 3 elements (P = 26) over 4 ranks: padded to a multiple of 2·4,
// Ppad = 32, s = 8. Rank 0 holds [0, 8) of tensor 0; rank 1 [8, 16): the end of tensor 0,
// tensor 1 and the start of tensor 2; rank 2 [16, 24): the rest of tensor 2 and the first
// element of tensor 3; rank 3 [24, 32): tensor 3's last two elements and 6 of padding.
TEST(DeepSpeed, PartitionsAreEvenPaddedToTwiceTheWorld) {
  const std::vector<std::int64_t> tensors = {10, 3, 10, 3};
  const std::vector<DsPartition> parts = ds_partitions(tensors, 4);
  ASSERT_EQ(parts.size(), 4u);
  for (const DsPartition& p : parts) {
    EXPECT_EQ(p.elems, 26);
    EXPECT_EQ(p.padded, 32);
    EXPECT_EQ(p.size, 8);
  }
  struct Want {
    int first, end;
    std::int64_t touching, offset, real;
  };
  const Want want[] = {{0, 1, 10, 0, 8}, {0, 3, 23, 8, 8}, {2, 4, 13, 3, 8}, {3, 4, 3, 1, 2}};
  for (int r = 0; r < 4; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_EQ(parts[r].first_tensor, want[r].first);
    EXPECT_EQ(parts[r].end_tensor, want[r].end);
    EXPECT_EQ(parts[r].touching, want[r].touching);
    EXPECT_EQ(parts[r].offset, want[r].offset);
    EXPECT_EQ(parts[r].real, want[r].real);
    EXPECT_EQ(ds_partition(tensors, 4, r).touching, want[r].touching);
  }
  EXPECT_EQ(parts[3].pad(), 6);
  // A world larger than the model: the last ranks' partitions are all padding.
  const std::vector<DsPartition> wide = ds_partitions({3}, 4);
  EXPECT_EQ(wide[0].padded, 8);
  EXPECT_EQ(wide[1].real, 1);
  EXPECT_EQ(wide[2].real, 0);
  EXPECT_EQ(wide[2].touching, 0);
  EXPECT_EQ(wide[3].pad(), 2);
}

// The seed model (8 x 256: P = 526,336, a multiple of 2·4) at W = 4: s = 131,584; at rest
// the flat group 4P = 2,105,344, the optimizer's copy 4s = 526,336, exp_avg and exp_avg_sq
// 8s = 1,052,672 and one step: 3,684,356 B on every rank, under both stages; no gradient.
TEST(DeepSpeed, TheSeedModelRestsAtItsLayoutByHand) {
  for (const char* strategy : {"zero1", "zero2"})
    for (int rank = 0; rank < 4; ++rank) {
      const RunConfig cfg = ds_config(ModelConfig{}, strategy, 0);
      CpuBackend backend;
      auto comm = make_fake_communicator(4, rank, &backend);
      const auto r = run_dp(cfg, backend, *comm, false);
      SCOPED_TRACE(std::string(strategy) + " r=" + std::to_string(rank));
      EXPECT_EQ(r.resting.total(), 3'684'356);
      EXPECT_EQ(r.resting[Category::param], 2'105'344 + 526'336);
      EXPECT_EQ(r.resting[Category::grad], 0);
      EXPECT_EQ(r.resting[Category::optim], 1'052'676);
      EXPECT_EQ(predict_data_parallel(cfg, 4, rank).resting.total(), 3'684'356);
    }
}

TEST(DeepSpeed, MlpMeasuredEqualsPredictedEveryRank) {
  ModelConfig seed;  // 8 x 256, none, sum, batch 32
  ModelConfig small;
  small.layers = 5;
  small.width = 24;
  small.batch = 3;
  small.activation = Activation::relu;
  small.loss = Loss::mse;
  ModelConfig odd;  // P = 168: padding at W = 3 (174) and W = 4 (168 is a multiple of 8: none)
  odd.layers = 3;
  odd.width = 7;
  odd.batch = 2;
  odd.loss = Loss::mse;
  ModelConfig tiny;  // P = 12: at W = 4 (Ppad 16) the last rank's partition is mostly padding
  tiny.layers = 2;
  tiny.width = 2;
  tiny.batch = 5;
  tiny.activation = Activation::relu;
  ModelConfig wide_batch;  // activations above the gradients
  wide_batch.layers = 4;
  wide_batch.width = 16;
  wide_batch.batch = 512;
  std::set<std::string> places;
  for (const ModelConfig& m : {seed, small, odd, tiny, wide_batch})
    for (const char* s : {"zero1", "zero2"})
      for (double bucket : {0.0, 1.0, 0.25})  // one bucket; 1 MiB; 0.25 MiB (the seed's 256 KiB weight)
        for (int world = 1; world <= 4; ++world)
          for (int rank = 0; rank < world; ++rank) {
            if (bucket > 0 && bucket * 1024 * 1024 / 4 < m.weight_elems()) continue;
            const RunConfig cfg = ds_config(m, s, bucket);
            places.insert(check_deepspeed_rank(cfg, world, rank,
                                     std::string(s) + " " + std::to_string(m.layers) + "x" + std::to_string(m.width) +
                                         " bucket " + std::to_string(bucket)));
          }
  // The peak falls in backward (a block's gradients), in the reduction after it and in the
  // optimizer's flattened gradient, each somewhere.
  EXPECT_TRUE(places.count("communication -")) << ::testing::PrintToString(places);
  EXPECT_TRUE(places.count("optimizer -")) << ::testing::PrintToString(places);
  bool backward = false;
  for (const std::string& p : places) backward = backward || p.rfind("backward", 0) == 0;
  EXPECT_TRUE(backward) << ::testing::PrintToString(places);
}

TEST(DeepSpeed, TransformersMeasuredEqualPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("gpt2" + how, testing::gpt2_of(2, 16, 2, 29, 6, 2, mode));
    models.emplace_back("llama" + how, testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, mode, false));
    models.emplace_back("llama tied" + how, testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, mode, true));
  }
  std::set<std::string> phases;
  for (const auto& [name, m] : models)
    for (const char* s : {"zero1", "zero2"})
      for (double bucket : {0.0, 0.005})  // one bucket; 1,310 elements, several buckets
        for (int world = 1; world <= 4; ++world)
          for (int rank = 0; rank < world; ++rank) {
            std::int64_t largest = 0;
            for (std::int64_t n : model_tensor_elems(m)) largest = std::max(largest, n);
            if (bucket > 0 && ds_bucket_elems(bucket, {}) < largest) continue;
            const std::string at = check_deepspeed_rank(ds_config(m, s, bucket), world, rank,
                                              name + " " + s + " bucket " + std::to_string(bucket));
            phases.insert(at.substr(0, at.find(' ')));
          }
  EXPECT_TRUE(phases.count("backward")) << ::testing::PrintToString(phases);
}

// Stage 3 of GPT-2 and Llama (deepspeed_zero3.hpp): each module gathered on its own (every
// Linear and norm of a block, each embedding, the final norm, the head), its gradients made
// in its backward and copied into the bucket as it ends, the embeddings kept gathered to the
// last bucket's reduction. Every emulated rank at W = 1 to 4 measures what the closed forms
// predict (deepspeed_stage3_transformer_forms.cpp): GPT-2 (tied head) and Llama (untied,
// tied, with q/k/v and o biases, grouped-query), flash and math; every tensor gathered
// (threshold 0), the weights gathered and the norms, biases and small tables kept (100),
// every tensor kept (100,000); one bucket and buckets of about a weight (reductions inside
// the backward, beside their zero tensors); one micro-step and two.
TEST(DeepSpeed, StageThreeTransformersMeasuredEqualPredictedEveryRank) {
  std::vector<std::pair<std::string, ModelConfig>> models;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
    const std::string how = mode == AttentionMode::flash ? " flash" : " math";
    models.emplace_back("gpt2" + how, testing::gpt2_of(2, 16, 2, 29, 6, 2, mode));
    models.emplace_back("llama" + how, testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, mode, false));
    models.emplace_back("llama tied" + how, testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, mode, true));
  }
  ModelConfig biased = testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::flash, false);
  biased.transformer.qkv_bias = biased.transformer.out_bias = true;
  models.emplace_back("llama biased flash", biased);
  models.emplace_back("gpt2 one sequence math", testing::gpt2_of(2, 16, 2, 29, 6, 1, AttentionMode::math));
  // Weights above the activations (each block's modules set the peak), and a vocabulary
  // above both (the head's and the embeddings').
  models.emplace_back("gpt2 wide", testing::gpt2_of(2, 64, 4, 37, 2, 1, AttentionMode::flash));
  models.emplace_back("llama wide math", testing::llama_of(2, 64, 4, 2, 96, 37, 2, 1, AttentionMode::math, false));
  models.emplace_back("llama wide tied", testing::llama_of(2, 64, 4, 1, 96, 37, 3, 1, AttentionMode::flash, true));
  models.emplace_back("gpt2 vocabulary", testing::gpt2_of(1, 16, 2, 2001, 4, 1, AttentionMode::math));
  models.emplace_back("llama vocabulary", testing::llama_of(1, 16, 4, 2, 24, 2001, 4, 1, AttentionMode::flash, false));
  // Sizes no world divides: short slices, whose zero tensors a reduction holds.
  models.emplace_back("gpt2 odd", testing::gpt2_of(3, 18, 3, 41, 3, 1, AttentionMode::flash));
  models.emplace_back("llama odd", testing::llama_of(3, 18, 3, 1, 30, 41, 3, 1, AttentionMode::flash, false));
  std::set<std::string> places;
  for (const auto& [name, m] : models)
    for (std::int64_t threshold : {0, 100, 5'000, 100'000})
      for (int buckets : {0, 1, 2})  // one bucket; buckets of 1.05 and 2.2 times the largest tensor
        for (int k : {1, 2})
          for (int world = 1; world <= 4; ++world)
            for (int rank = 0; rank < world; ++rank) {
              std::int64_t largest = 0;
              for (std::int64_t n : model_tensor_elems(m)) largest = std::max(largest, n);
              const double times = buckets == 0 ? 0.0 : buckets == 1 ? 1.05 : 2.2;
              const double bucket = times * 4.0 * static_cast<double>(largest) / (1 << 20);
              RunConfig cfg = ds_config(m, "zero3", bucket);
              cfg.param_persistence = threshold;
              cfg.accumulate = k;
              const std::string at = check_deepspeed_rank(
                  cfg, world, rank,
                  name + " threshold " + std::to_string(threshold) + " bucket " + std::to_string(bucket) + " K=" +
                      std::to_string(k));
              places.insert(at.substr(0, at.find(' ')));
              // A peak inside the backward at a bucket's reduction: its zero tensors (grad) beside it.
              const Prediction p = predict_data_parallel(cfg, world, rank);
              if (p.peak_phase == Phase::backward && p.peak_by_category[Category::grad] > p.resting[Category::grad])
                places.insert("a reduction");
            }
  // Peaks in a block's backward (a module gathered beside its gradients), at a reduction
  // inside it, in the optimizer (the flattened gradient) and in the persistent tensors'
  // gather after it.
  for (const char* p : {"backward", "a reduction", "optimizer", "communication"})
    EXPECT_TRUE(places.count(p)) << p << " in " << ::testing::PrintToString(places);
}

// Stage 3 of a one-block GPT-2 (h 16, 2 heads, vocabulary 29, 6 tokens) at W = 2, every
// tensor gathered (threshold 0), by hand: P = 464 (wte) + 96 (wpe) + 3,280 (the block) + 32
// (ln_f) = 3,872, every tensor even: C = P/2 = 1,936. At rest param 8C = 15,488, grad
// 4C = 7,744, optim 8C + 4 = 15,492, the bucket 4P = 15,488: 54,212 B. A step all-reduces
// 4P = 15,488 B and gathers each of its ten modules (wte, wpe, ln_1, c_attn, attn.c_proj,
// ln_2, c_fc, mlp.c_proj, ln_f, the head) in forward and in backward, 20 calls, each
// moving 4W·Σc of its tensors: every tensor once and the tied table a second time (the
// head's), twice: 2 × (4P + 4 × 464) = 34,688 B.
TEST(DeepSpeed, StageThreeGpt2RestsAndMovesByHand) {
  RunConfig cfg = ds_config(testing::gpt2_of(1, 16, 2, 29, 6, 1, AttentionMode::flash), "zero3", 0);
  cfg.param_persistence = 0;
  for (int rank = 0; rank < 2; ++rank) {
    CpuBackend backend;
    auto comm = make_fake_communicator(2, rank, &backend);
    const auto r = run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.resting.total(), 54'212);
    EXPECT_EQ(r.resting[Category::param], 15'488);
    EXPECT_EQ(r.resting[Category::grad], 7'744);
    EXPECT_EQ(r.resting[Category::optim], 15'492);
    EXPECT_EQ(r.resting[Category::comm], 15'488);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_reduce)].bytes, 15'488);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_gather)].bytes, 34'688);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_gather)].calls, 20);
    // The head's backward holds wte gathered (4W·c = 1,856) and its gradient (4 × 464).
    EXPECT_GE(r.peak.by_category[Category::param_unsharded], 1'856);
  }
}

// --accumulate K (deepspeed.hpp): stage 1 reduces at the boundary alone (autograd's
// gradients and the bucket held from the first backward on), stage 2 every micro-step (its
// accumulated grads_in_partition held beside each later one); --no-sync under stage 1 is
// the same step. Every emulated rank measures what the closed forms predict.
TEST(DeepSpeed, AccumulationMeasuredEqualsPredictedEveryRank) {
  ModelConfig small;
  small.layers = 5;
  small.width = 24;
  small.batch = 3;
  small.activation = Activation::relu;
  small.loss = Loss::mse;
  ModelConfig odd;  // padding at W = 3
  odd.layers = 3;
  odd.width = 7;
  odd.batch = 2;
  odd.loss = Loss::mse;
  ModelConfig tiny;  // the last rank's partition mostly padding at W = 4
  tiny.layers = 2;
  tiny.width = 2;
  tiny.batch = 5;
  tiny.activation = Activation::relu;
  ModelConfig wide_batch;  // activations above the gradients
  wide_batch.layers = 4;
  wide_batch.width = 16;
  wide_batch.batch = 512;
  std::set<std::string> phases;
  for (const ModelConfig& m : {small, odd, tiny, wide_batch})
    for (const char* s : {"zero1", "zero2"})
      for (int k : {2, 3})
        for (bool no_sync : {false, true})
          for (double bucket : {0.0, 0.0005})
            for (int world = 1; world <= 4; ++world)
              for (int rank = 0; rank < world; ++rank) {
                if (no_sync && std::string(s) == "zero2") continue;  // refused (DeepSpeed asserts)
                if (bucket > 0 && bucket * 1024 * 1024 / 4 < m.weight_elems()) continue;
                RunConfig cfg = ds_config(m, s, bucket);
                cfg.accumulate = k;
                cfg.no_sync = no_sync;
                const std::string at =
                    check_deepspeed_rank(cfg, world, rank,
                               std::string(s) + " " + std::to_string(m.layers) + "x" + std::to_string(m.width) +
                                   " K=" + std::to_string(k) + (no_sync ? " no-sync" : "") + " bucket " +
                                   std::to_string(bucket));
                phases.insert(at.substr(0, at.find(' ')));
              }
  // Peaks in backward and, stage 2's two gradients beside the padding, at the boundary.
  EXPECT_TRUE(phases.count("backward")) << ::testing::PrintToString(phases);
  EXPECT_TRUE(phases.count("communication")) << ::testing::PrintToString(phases);
  std::vector<std::pair<std::string, ModelConfig>> models = {
      {"gpt2 flash", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::flash)},
      {"llama math", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::math, false)},
      {"llama tied flash", testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, AttentionMode::flash, true)}};
  for (const auto& [name, m] : models)
    for (const char* s : {"zero1", "zero2"})
      for (int k : {2, 3})
        for (int world = 1; world <= 4; ++world)
          for (int rank = 0; rank < world; ++rank) {
            RunConfig cfg = ds_config(m, s, 0.005);
            cfg.accumulate = k;
            check_deepspeed_rank(cfg, world, rank, name + " " + s + " K=" + std::to_string(k));
          }
}

// The seed model at W = 4 (s = 131,584: rank 0's partition is layers 0 and 1 exactly, G_0 =
// 4s = 526,336 B), one bucket, K = 2, by hand: stage 1 all-reduces 4P = 2,105,344 B once,
// stage 2 twice (4,210,688); both all-gather the group once (2,105,344). Stage 2's peak is
// its one-micro-step peak plus the accumulated G_0 held beside the second micro-step's
// backward; the parameters after the step equal --accumulate 1's on the same micro-batches
// only through the gradient's sum, so they are checked under mpirun (test_deepspeed_mpi.cpp).
TEST(DeepSpeed, AccumulationOnTheSeedModelByHand) {
  for (const char* strategy : {"zero1", "zero2"}) {
    SCOPED_TRACE(strategy);
    RunConfig one = ds_config(ModelConfig{}, strategy, 0);
    RunConfig two = one;
    two.accumulate = 2;
    CpuBackend b1, b2;
    auto c1 = make_fake_communicator(4, 0, &b1);
    auto c2 = make_fake_communicator(4, 0, &b2);
    const auto r1 = run_dp(one, b1, *c1, false);
    const auto r2 = run_dp(two, b2, *c2, false);
    const bool stage2 = std::string(strategy) == "zero2";
    EXPECT_EQ(r2.ledger.by_kind[static_cast<int>(CollKind::all_reduce)].bytes, stage2 ? 4'210'688 : 2'105'344);
    EXPECT_EQ(r2.ledger.by_kind[static_cast<int>(CollKind::all_gather)].bytes, 2'105'344);
    EXPECT_EQ(r2.ledger.by_kind[static_cast<int>(CollKind::all_reduce)].calls, stage2 ? 2 : 1);
    EXPECT_EQ(r2.resting, r1.resting);
    if (stage2) {
      EXPECT_EQ(r2.peak.total, r1.peak.total + 526'336);
      EXPECT_EQ(r2.peak.by_category[Category::grad], r1.peak.by_category[Category::grad] + 526'336);
      EXPECT_EQ(r2.where, r1.where);
    } else {
      // Stage 1 holds autograd's 4P and the 4P bucket from the first backward to the
      // boundary: never less than one micro-step's peak, the same gradients at it.
      EXPECT_GE(r2.peak.total, r1.peak.total);
      EXPECT_EQ(r2.peak.by_category[Category::grad_unsharded], 2'105'344);
    }
  }
}

// Stage 3 runs the MLP (deepspeed_zero3.hpp): every emulated rank at W = 1 to 4 measures what
// the closed forms predict, on MLPs whose weights are gathered alone (above the persistence
// threshold) or with their biases (threshold 0), whose biases stay gathered (persistent:
// several gathered together after the step, or one alone in its gather buffer), whose
// tensors do not divide by the world (zero tensors in the reduction), with one bucket and
// buckets of about one weight (reductions in backward), and --accumulate 2.
TEST(DeepSpeed, StageThreeMeasuredEqualsPredictedEveryRank) {
  struct Case {
    const char* name;
    ModelConfig m;
    std::int64_t threshold;
    double bucket;  // MiB; one weight fits
  };
  ModelConfig wide;  // 320 x 320: a weight of 102,400 elements, above DeepSpeed's default threshold
  wide.layers = 3;
  wide.width = 320;
  wide.batch = 2;
  wide.activation = Activation::relu;
  wide.loss = Loss::mse;
  ModelConfig narrow;  // 5 x 24: a weight of 576
  narrow.layers = 5;
  narrow.width = 24;
  narrow.batch = 3;
  narrow.activation = Activation::relu;
  ModelConfig odd;  // 3 x 7: a weight of 49, a bias of 7 (short partitions at W = 2, 3, 4)
  odd.layers = 3;
  odd.width = 7;
  odd.batch = 2;
  odd.loss = Loss::mse;
  ModelConfig one = odd;  // one layer: its bias the only persistent tensor
  one.layers = 1;
  ModelConfig big_batch;  // activations above the parameters
  big_batch.layers = 4;
  big_batch.width = 16;
  big_batch.batch = 256;
  const Case cases[] = {
      {"wide", wide, 100'000, 0.0},          {"wide buckets", wide, 100'000, 0.4},
      {"narrow all gathered", narrow, 0, 0.0}, {"narrow buckets", narrow, 0, 0.0023},
      {"narrow biases kept", narrow, 30, 0.0023}, {"odd", odd, 7, 0.0},
      {"odd all gathered", odd, 0, 0.0002},   {"odd all kept", odd, 100'000, 0.0},
      {"one layer", one, 7, 0.0},             {"big batch", big_batch, 0, 0.0},
  };
  std::set<std::string> phases;
  for (const Case& c : cases)
    for (int k : {1, 2})
      for (int world = 1; world <= 4; ++world)
        for (int rank = 0; rank < world; ++rank) {
          RunConfig cfg = ds_config(c.m, "zero3", c.bucket);
          cfg.param_persistence = c.threshold;
          cfg.accumulate = k;
          const std::string at = check_deepspeed_rank(cfg, world, rank, std::string(c.name) + " K=" + std::to_string(k));
          phases.insert(at.substr(0, at.find(' ')));
        }
  // The peak falls in forward or backward (a gathered layer beside its gradients), in the
  // optimizer (the flattened gradient) and in the persistent tensors' gather after it.
  EXPECT_TRUE(phases.count("backward")) << ::testing::PrintToString(phases);
  EXPECT_TRUE(phases.count("communication")) << ::testing::PrintToString(phases);
}

// Stage 3 of a 5 x 24 MLP at W = 4, every tensor gathered (threshold 0), by hand: c = 144
// a weight, 6 a bias, C = 5 × 150 = 750; at rest param 8C = 6,000 (the partitions and the
// optimizer's copy), grad 4C = 3,000 (the gradient partitions), optim 8C + 4 = 6,004, comm
// the one bucket 4P = 12,000: 27,004 B. A step all-reduces 4P = 12,000 B and gathers each
// layer twice (forward and backward) through a flat buffer of 4 × 4 × 150 = 2,400 B: 24,000.
TEST(DeepSpeed, StageThreeRestsAndMovesByHand) {
  ModelConfig m;
  m.layers = 5;
  m.width = 24;
  m.batch = 3;
  RunConfig cfg = ds_config(m, "zero3", 0);
  cfg.param_persistence = 0;
  for (int rank = 0; rank < 4; ++rank) {
    CpuBackend backend;
    auto comm = make_fake_communicator(4, rank, &backend);
    const auto r = run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.resting.total(), 27'004);
    EXPECT_EQ(r.resting[Category::param], 6'000);
    EXPECT_EQ(r.resting[Category::grad], 3'000);
    EXPECT_EQ(r.resting[Category::optim], 6'004);
    EXPECT_EQ(r.resting[Category::comm], 12'000);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_reduce)].bytes, 12'000);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_gather)].bytes, 24'000);
    EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_gather)].calls, 10);
    // A layer's gather holds its flat buffer (2,400) beside its two tensors (4 × 600).
    EXPECT_GE(r.peak.by_category[Category::param_unsharded], 2'400);
  }
}

// Stage 3's resting bytes of an MLP of two 4 x 4 layers over 3 ranks. Each
// weight (16) is partitioned in 6, each bias (4) in 2: C = 16. Every tensor is persistent
// (at most 100,000 elements: kept gathered, 40 elements, by one coalesced gather). param
// 4C + 4C + 4·40 = 288, grad 4C = 64, optim 8C + 4 (one sub-group) = 132, comm the bucket
// (4P = 160); the MLP's step is predicted too.
TEST(DeepSpeed, StageThreeModelStatesByHand) {
  ModelConfig m;
  m.layers = 2;
  m.width = 4;
  const RunConfig cfg = ds_config(m, "zero3", 0);
  for (int rank = 0; rank < 3; ++rank) {
    const Prediction p = predict_data_parallel(cfg, 3, rank);
    EXPECT_EQ(p.resting[Category::param], 288);
    EXPECT_EQ(p.resting[Category::grad], 64);
    EXPECT_EQ(p.resting[Category::optim], 132);
    EXPECT_EQ(p.resting[Category::comm], 160);
    EXPECT_EQ(*p.model_states, 288 + 64 + 132);
    EXPECT_TRUE(p.peak_known);
  }
}

// --precision bf16 (deepspeed.hpp): the MLP's stages 1 and 2 in DeepSpeed's bf16 regime (the
// flat group, gradients, bucket and grads_in_partition bf16; the master weights and AdamW
// fp32): every emulated rank at W = 1 to 4 measures what the closed forms predict.
TEST(DeepSpeed, Bf16MeasuredEqualsPredictedEveryRank) {
  ModelConfig seed;  // 8 x 256, none, sum, batch 32
  ModelConfig small;
  small.layers = 5;
  small.width = 24;
  small.batch = 3;
  small.activation = Activation::relu;
  small.loss = Loss::mse;
  ModelConfig odd;  // padding at W = 3
  odd.layers = 3;
  odd.width = 7;
  odd.batch = 2;
  odd.loss = Loss::mse;
  ModelConfig tiny;  // the last rank's partition mostly padding at W = 4
  tiny.layers = 2;
  tiny.width = 2;
  tiny.batch = 5;
  tiny.activation = Activation::relu;
  ModelConfig wide_batch;  // activations above the gradients
  wide_batch.layers = 4;
  wide_batch.width = 16;
  wide_batch.batch = 512;
  std::set<std::string> places;
  for (const ModelConfig& m : {seed, small, odd, tiny, wide_batch})
    for (const char* s : {"zero1", "zero2"})
      for (double bucket : {0.0, 0.25})
        for (int world = 1; world <= 4; ++world)
          for (int rank = 0; rank < world; ++rank) {
            if (bucket > 0 && bucket * 1024 * 1024 / 4 < m.weight_elems()) continue;
            RunConfig cfg = ds_config(m, s, bucket);
            cfg.precision = PrecisionKind::bf16;
            cfg.model.param_bf16 = true;
            places.insert(check_deepspeed_rank(cfg, world, rank,
                                     std::string(s) + " bf16 " + std::to_string(m.layers) + "x" +
                                         std::to_string(m.width) + " bucket " + std::to_string(bucket)));
          }
  bool backward = false;
  for (const std::string& p : places) backward = backward || p.rfind("backward", 0) == 0;
  EXPECT_TRUE(backward) << ::testing::PrintToString(places);
  EXPECT_TRUE(places.count("optimizer -")) << ::testing::PrintToString(places);
}

// --precision bf16 on GPT-2 (the bf16 module of harness/model/gpt2_param_bf16.cpp on the bf16
// flat group's views: DeepSpeed's bf16 casts the module to bf16): every emulated rank of stages
// 1 and 2 at W = 1 to 4, one bucket and several, flash and math, measures what the closed
// forms predict (deepspeed_forms.cpp's bf16_transformer_ranks), the saves torch's bf16 module's; the
// resting bytes are the bf16 group, the master weights and AdamW's state, and the buckets
// and the group's all-gather move 2 B an element.
TEST(DeepSpeed, Bf16Gpt2MeasuredEqualsPredictedEveryRank) {
  std::set<std::string> places;
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const char* s : {"zero1", "zero2"})
      for (double bucket : {0.0, 0.005})  // one bucket; 1,310 elements, several buckets
        for (int world = 1; world <= 4; ++world)
          for (int rank = 0; rank < world; ++rank) {
            const ModelConfig m = testing::gpt2_of(2, 16, 2, 29, 6, 2, mode);
            RunConfig cfg = ds_config(m, s, bucket);
            cfg.precision = PrecisionKind::bf16;
            cfg.model.param_bf16 = true;
            places.insert(check_deepspeed_rank(cfg, world, rank,
                                               std::string(s) + " bf16 gpt2 " + (mode == AttentionMode::flash ? "flash" : "math") + " bucket " +
                                                   std::to_string(bucket)));
            const Prediction p = predict_data_parallel(cfg, world, rank);
            const std::vector<DsPartition> parts = ds_partitions(model_tensor_elems(cfg.model), world);
            EXPECT_EQ(p.resting[Category::param], 2 * parts[0].padded);
            EXPECT_EQ(p.resting[Category::master], 4 * parts[0].size);
            EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_reduce)], 2 * parts[0].elems);
            EXPECT_EQ(p.saved_after_forward_bytes,
                      gpt2_saved_after_forward_param_bf16(cfg.model.transformer, cfg.model.batch).bytes);
          }
  bool backward = false;
  for (const std::string& p : places) backward = backward || p.rfind("backward", 0) == 0;
  EXPECT_TRUE(backward) << ::testing::PrintToString(places);
}

// The seed model (P = 526,336, s = 131,584 at W = 4) under bf16, by hand: at rest the bf16
// group 2P = 1,052,672 (param), the master weights 4s = 526,336 (master), AdamW 8s + 4 =
// 1,052,676: 2,631,684 B on every rank, both stages; plus the gradients the stage keeps
// (stage 1 autograd's 2P, stage 2 the partition's 2s) they are the plan's model states, the
// ZeRO paper's 4Ψ + 12Ψ/N (3,684,352) and 2Ψ + 14Ψ/N (2,894,848) with AdamW's step (4 B).
// The buckets are all-reduced in bf16 (2P) and the group all-gathered in bf16 (2·Ppad).
TEST(DeepSpeed, Bf16RestingBytesAreThePlansModelStates) {
  for (const char* strategy : {"zero1", "zero2"})
    for (int rank = 0; rank < 4; ++rank) {
      RunConfig cfg = ds_config(ModelConfig{}, strategy, 0);
      cfg.precision = PrecisionKind::bf16;
      cfg.model.param_bf16 = true;
      CpuBackend backend;
      auto comm = make_fake_communicator(4, rank, &backend);
      const auto r = run_dp(cfg, backend, *comm, false);
      SCOPED_TRACE(std::string(strategy) + " r=" + std::to_string(rank));
      EXPECT_EQ(r.resting.total(), 2'631'684);
      EXPECT_EQ(r.resting[Category::param], 1'052'672);
      EXPECT_EQ(r.resting[Category::master], 526'336);
      EXPECT_EQ(r.resting[Category::optim], 1'052'676);
      const bool stage1 = std::string(strategy) == "zero1";
      RunConfig planned = cfg;
      planned.model.param_bf16 = false;  // plan's configuration: the forms read the precision
      const Prediction p = predict_data_parallel(planned, 4, rank);
      ASSERT_TRUE(p.model_states.has_value());
      EXPECT_EQ(*p.model_states, r.resting.total() + (stage1 ? 1'052'672 : 263'168));
      EXPECT_EQ(*p.model_states, stage1 ? 3'684'356 : 2'894'852);
      EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_reduce)].bytes, 1'052'672);
      EXPECT_EQ(r.ledger.by_kind[static_cast<int>(CollKind::all_gather)].bytes, 1'052'672);
    }
}

// The ZeRO paper's Figure 1 (Ψ = 7.5B, N = 64; bf16 parameters and gradients, fp32 master
// weights and AdamW): a Llama of 38 layers, hidden 3840 (30 heads), ffn 11452 and vocab
// 31920 (untied) has P = 7,500,000,000 exactly, every tensor a multiple of 64 (and of
// 2·64: no padding), s = P/64 = 117,187,500. Per rank, by hand:
//   ddp     2P + 2P + 4P + 8P + 4 (one step)        = 120,000,000,004  (120 GB)
//   zero1   2P + 2P (autograd's) + 12s + 4          =  31,406,250,004  (31.4)
//   zero2   2P + 2s (the partition's) + 12s + 4     =  16,640,625,004  (16.6)
//   zero3   16s + 2 × 295,680 (the persistent norms) + 4 = 1,875,591,364 (1.9)
TEST(DeepSpeed, FigureOneModelStatesByHand) {
  RunConfig cfg;
  cfg.model = testing::llama_of(38, 3840, 30, 30, 11452, 31920, 1024, 1, AttentionMode::flash, false);
  cfg.engine = EngineKind::deepspeed;
  cfg.precision = PrecisionKind::bf16;
  std::int64_t P = 0;
  for (std::int64_t n : model_tensor_elems(cfg.model)) P += n;
  ASSERT_EQ(P, 7'500'000'000);
  const struct {
    const char* strategy;
    std::int64_t bytes;
  } want[] = {{"ddp", 120'000'000'004},
              {"zero1", 31'406'250'004},
              {"zero2", 16'640'625'004},
              {"zero3", 1'875'591'364}};
  for (const auto& w : want) {
    cfg.strategy = parse_strategy(w.strategy);
    for (int rank : {0, 31, 63}) {
      const Prediction p = predict_data_parallel(cfg, 64, rank);
      ASSERT_TRUE(p.model_states.has_value()) << w.strategy;
      EXPECT_EQ(*p.model_states, w.bytes) << w.strategy << " rank " << rank;
      // Every stage of Llama's bf16 runs (the bf16 module), its peak predicted.
      EXPECT_TRUE(p.peak_known) << w.strategy;
    }
  }
  // fp32 (no bf16 copies): stage 2 holds 4P + 4s + 4s + 8s + 4, its resting bytes plus the
  // partition's gradient, and is predicted through its step.
  cfg.precision = PrecisionKind::fp32;
  cfg.strategy = StrategyKind::zero2;
  const Prediction fp32 = predict_data_parallel(cfg, 64, 0);
  EXPECT_EQ(*fp32.model_states, 4 * P + 16 * (P / 64) + 4);
  EXPECT_EQ(*fp32.model_states, fp32.resting.total() + 4 * (P / 64));
  EXPECT_TRUE(fp32.peak_known);
}

}  // namespace
}  // namespace shardscope

// --bucket-mb 0 under --engine deepspeed: DeepSpeed's default reduce_bucket_size (5e8
// elements), never above the model's P and never below its largest tensor.
TEST(DeepSpeed, DefaultBucketIsDeepSpeedsReduceBucketSize) {
  EXPECT_EQ(shardscope::ds_bucket_elems(0.0, {1'000, 24}), 1'024);                          // a small model: P
  EXPECT_EQ(shardscope::ds_bucket_elems(0.0, {400'000'000, 400'000'000}), 500'000'000);     // DeepSpeed's default
  EXPECT_EQ(shardscope::ds_bucket_elems(0.0, {525'336'576, 400'000'000}), 525'336'576);     // Llama-3-8B's embedding
  EXPECT_EQ(shardscope::ds_bucket_elems(1.0, {400'000'000, 400'000'000}), 262'144);        // 1 MiB of fp32
}
