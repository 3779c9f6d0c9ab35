// --engine deepspeed over MPI at the world this binary was started with (W = 2, 3, 4 from
// ctest): DeepSpeed's ZeRO stages 1, 2 and 3 train like one rank on the concatenated batch
// (parameters, the last step's averaged gradients and AdamW's state), their bytes equal the
// closed forms (harness/predict/deepspeed_forms.hpp), and an emulated rank's bytes equal the
// real rank's. The MLP, GPT-2 and Llama; one bucket and several; --accumulate K.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>

#include "harness/comm/fake_comm.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/dtype.hpp"
#include "support/dp_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

// `whole`: the one-rank training it equals (cfg itself, or under --accumulate K the
// K-fold batch in one micro-step).
// `grads_abs`: the gradients' absolute tolerance (a transformer's K micro-steps, averaged
// apart and added, round apart from the K-fold batch's sums: up to 4e-7 here).
void check_against_one_rank(const RunConfig& cfg, double params_abs, const RunConfig& whole,
                            double grads_abs = 1e-7) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CpuBackend backend;
  auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
  const auto r = testing::run_dp(cfg, backend, *comm, true);
  const HostState ref = testing::reference_training(whole, world);
  ASSERT_TRUE(any_nonzero(ref.grads));
  ASSERT_TRUE(any_nonzero(r.state.grads));
  ASSERT_TRUE(any_nonzero(r.state.exp_avg));
  ASSERT_EQ(r.state.params.size(), ref.params.size());
  ASSERT_EQ(r.state.grads.size(), ref.grads.size());
  std::size_t at = 0;
  EXPECT_EQ(worst_violation(r.state.params, ref.params, 1e-5, params_abs, &at), 0.0) << "params at " << at;
  EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 1e-5, grads_abs, &at), 0.0) << "grads at " << at;
  EXPECT_EQ(worst_violation(r.state.exp_avg, ref.exp_avg, 1e-5, 1e-7, &at), 0.0) << "exp_avg at " << at;
  EXPECT_EQ(worst_violation(r.state.exp_avg_sq, ref.exp_avg_sq, 1e-5, 1e-9, &at), 0.0) << "exp_avg_sq at " << at;

  const Prediction p = predict_data_parallel(cfg, world, rank);
  EXPECT_EQ(r.resting, p.resting);
  for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
  // DeepSpeed's overlap_comm is off (docs/design.md, "Overlap"): every call blocks, even
  // under the default --overlap on, so the step waits for all of each.
  ASSERT_TRUE(cfg.overlap);
  for (const CollStats& st : r.ledger.by_kind) EXPECT_EQ(st.exposed_ms, st.ms);
  EXPECT_TRUE(p.peak_known);
  EXPECT_EQ(r.peak.total, p.peak_total);
  EXPECT_EQ(r.peak.by_category, p.peak_by_category);
  EXPECT_EQ(r.where, p.peak_where);
  CpuBackend backend2;
  auto fake = make_fake_communicator(world, rank, &backend2);
  const auto e = testing::run_dp(cfg, backend2, *fake, false);
  EXPECT_EQ(e.resting, r.resting);
  EXPECT_EQ(e.peak.total, r.peak.total);
  EXPECT_EQ(e.peak.by_category, r.peak.by_category);
}

void check_against_one_rank(const RunConfig& cfg, double params_abs) { check_against_one_rank(cfg, params_abs, cfg); }

// A bf16 run's averaged gradient against fp32's: within bf16's rounding by norm (a wrong slot
// or scale would be far off), and not equal (bf16's arithmetic).
void expect_bf16_close(const std::vector<float>& got, const std::vector<float>& ref) {
  ASSERT_TRUE(any_nonzero(ref));
  ASSERT_EQ(got.size(), ref.size());
  double d = 0.0, n = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    d += (got[i] - ref[i]) * static_cast<double>(got[i] - ref[i]);
    n += ref[i] * static_cast<double>(ref[i]);
  }
  EXPECT_LT(std::sqrt(d / n), 0.05);
  EXPECT_GT(d, 0.0);
}

RunConfig ds_config(const ModelConfig& m, const char* strategy, double bucket_mb) {
  RunConfig cfg;
  cfg.model = m;
  cfg.steps = 3;
  cfg.seed = 11;
  cfg.strategy = parse_strategy(strategy);
  cfg.engine = EngineKind::deepspeed;
  cfg.bucket_mb = bucket_mb;
  return cfg;
}

TEST(DeepSpeedMpi, MlpTrainsLikeOneRankAndMatchesTheClosedForms) {
  // 4 x 37: P = 5,624, padded at W = 3 (5,628) and W = 4 (5,632); partitions cut tensors.
  const ModelConfig m = testing::model_of(4, 37, 6, Activation::relu, Loss::mse);
  for (const char* strategy : {"zero1", "zero2"})
    for (double bucket : {0.0, 0.006}) {  // one bucket; 1,572 elements (a weight is 1,369)
      SCOPED_TRACE(std::string(strategy) + " bucket " + std::to_string(bucket));
      check_against_one_rank(ds_config(m, strategy, bucket), 1e-7);
    }
}

// --accumulate K: stage 1 reducing at the boundary alone (with and without --no-sync),
// stage 2 every micro-step, both train like one rank on the ranks' K-fold batches (the loss
// a mean: the K-fold batch's gradient is the mean of the micro-steps').
TEST(DeepSpeedMpi, AccumulationTrainsLikeOneStepOnTheKFoldBatch) {
  const ModelConfig m = testing::model_of(4, 37, 3, Activation::relu, Loss::mse);
  const struct {
    const char* strategy;
    bool no_sync;
  } cases[] = {{"zero1", false}, {"zero1", true}, {"zero2", false}};
  for (const auto& c : cases)
    for (int k : {2, 3})
      for (double bucket : {0.0, 0.006}) {
        SCOPED_TRACE(std::string(c.strategy) + (c.no_sync ? " no-sync" : "") + " K=" + std::to_string(k) +
                     " bucket " + std::to_string(bucket));
        RunConfig cfg = ds_config(m, c.strategy, bucket);
        cfg.accumulate = k;
        cfg.no_sync = c.no_sync;
        RunConfig whole = cfg;
        whole.model.batch = k * m.batch;
        whole.accumulate = 1;
        whole.no_sync = false;
        check_against_one_rank(cfg, 1e-7, whole);
      }
}

// Stage 3 (the MLP): every tensor gathered (threshold 0), the weights alone (the biases
// persistent) and every tensor persistent; one bucket and buckets of about a weight;
// --accumulate 2 on the 2-fold batch.
TEST(DeepSpeedMpi, StageThreeTrainsLikeOneRank) {
  const ModelConfig m = testing::model_of(3, 37, 4, Activation::relu, Loss::mse);
  for (std::int64_t threshold : {std::int64_t{0}, std::int64_t{37}, std::int64_t{100'000}})
    for (double bucket : {0.0, 0.006})
      for (int k : {1, 2}) {
        SCOPED_TRACE("threshold " + std::to_string(threshold) + " bucket " + std::to_string(bucket) + " K=" +
                     std::to_string(k));
        RunConfig cfg = ds_config(m, "zero3", bucket);
        cfg.param_persistence = threshold;
        cfg.accumulate = k;
        RunConfig whole = cfg;
        whole.model.batch = k * m.batch;
        whole.accumulate = 1;
        check_against_one_rank(cfg, 1e-7, whole);
      }
}

// --precision bf16 (the MLP, stages 1 and 2): every rank's bytes and traffic equal the closed
// forms and an emulated rank's; the averaged gradient after one step is the fp32 one-rank
// training's within bf16's rounding (the buckets are divided and all-reduced in bf16).
TEST(DeepSpeedMpi, Bf16HoldsItsPredictionsAndAveragesTheGradients) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const ModelConfig m = testing::model_of(4, 37, 6, Activation::relu, Loss::mse);
  for (const char* strategy : {"zero1", "zero2"})
    for (double bucket : {0.0, 0.006}) {
      SCOPED_TRACE(std::string(strategy) + " bucket " + std::to_string(bucket));
      RunConfig cfg = ds_config(m, strategy, bucket);
      cfg.steps = 1;
      cfg.precision = PrecisionKind::bf16;
      cfg.model.param_bf16 = true;
      CpuBackend backend;
      auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
      const auto r = testing::run_dp(cfg, backend, *comm, true);
      const Prediction p = predict_data_parallel(cfg, world, rank);
      EXPECT_EQ(r.resting, p.resting);
      for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
      EXPECT_EQ(r.peak.total, p.peak_total);
      EXPECT_EQ(r.peak.by_category, p.peak_by_category);
      EXPECT_EQ(r.where, p.peak_where);
      CpuBackend backend2;
      auto fake = make_fake_communicator(world, rank, &backend2);
      const auto e = testing::run_dp(cfg, backend2, *fake, false);
      EXPECT_EQ(e.resting, r.resting);
      EXPECT_EQ(e.peak.by_category, r.peak.by_category);
      RunConfig fp32 = cfg;
      fp32.precision = PrecisionKind::fp32;
      fp32.model.param_bf16 = false;
      const HostState ref = testing::reference_training(fp32, world);
      ASSERT_TRUE(any_nonzero(ref.grads));
      ASSERT_TRUE(any_nonzero(r.state.grads));
      ASSERT_EQ(r.state.grads.size(), ref.grads.size());
      double largest = 0.0;
      for (float g : ref.grads) largest = std::max(largest, static_cast<double>(std::fabs(g)));
      std::size_t at = 0;
      // bf16 keeps 8 bits of mantissa: each gradient within 5% of fp32's, or 2% of the largest.
      EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 5e-2, 2e-2 * largest, &at), 0.0) << "grads at " << at;
    }
}

// --precision bf16 on GPT-2 (its bf16 module on the bf16 flat group), stages 1 and 2: every
// rank's bytes and traffic equal the closed forms; the averaged gradient after one step is the
// fp32 one-rank training's within bf16's rounding (by norm: a wrong slot would be far off).
TEST(DeepSpeedMpi, Bf16Gpt2HoldsItsPredictionsAndAveragesTheGradients) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const ModelConfig m = testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::flash);
  for (const char* strategy : {"zero1", "zero2"})
    for (double bucket : {0.0, 0.005}) {
      SCOPED_TRACE(std::string(strategy) + " bucket " + std::to_string(bucket));
      RunConfig cfg = ds_config(m, strategy, bucket);
      cfg.steps = 1;
      cfg.precision = PrecisionKind::bf16;
      cfg.model.param_bf16 = true;
      CpuBackend backend;
      auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
      const auto r = testing::run_dp(cfg, backend, *comm, true);
      const Prediction p = predict_data_parallel(cfg, world, rank);
      EXPECT_EQ(r.resting, p.resting);
      for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
      EXPECT_EQ(r.peak.total, p.peak_total);
      EXPECT_EQ(r.peak.by_category, p.peak_by_category);
      EXPECT_EQ(r.where, p.peak_where);
      RunConfig fp32 = cfg;
      fp32.precision = PrecisionKind::fp32;
      fp32.model.param_bf16 = false;
      const HostState ref = testing::reference_training(fp32, world);
      ASSERT_TRUE(any_nonzero(ref.grads));
      ASSERT_EQ(r.state.grads.size(), ref.grads.size());
      double d = 0.0, n = 0.0;
      for (std::size_t i = 0; i < ref.grads.size(); ++i) {
        d += (r.state.grads[i] - ref.grads[i]) * static_cast<double>(r.state.grads[i] - ref.grads[i]);
        n += ref.grads[i] * static_cast<double>(ref.grads[i]);
      }
      EXPECT_LT(std::sqrt(d / n), 0.05);
      EXPECT_GT(d, 0.0);  // bf16's arithmetic
    }
}

// --precision bf16 on Llama (its bf16 module, Hugging Face's cast to bf16, on the bf16 flat
// group), stages 1 and 2, GQA untied and MHA tied: every rank's bytes and traffic equal the
// closed forms; the averaged gradient after one step is the fp32 one-rank training's within
// bf16's rounding.
TEST(DeepSpeedMpi, Bf16LlamaHoldsItsPredictionsAndAveragesTheGradients) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (const ModelConfig& m : {testing::llama_of(2, 16, 4, 2, 24, 29, 6, 2, AttentionMode::flash, false),
                               testing::llama_of(2, 16, 2, 2, 24, 29, 6, 2, AttentionMode::math, true)})
    for (const char* strategy : {"zero1", "zero2"})
      for (double bucket : {0.0, 0.005}) {
        SCOPED_TRACE(std::string(strategy) + " bucket " + std::to_string(bucket) +
                     (m.transformer.tied_embeddings ? " tied math" : " flash"));
        RunConfig cfg = ds_config(m, strategy, bucket);
        cfg.steps = 1;
        cfg.precision = PrecisionKind::bf16;
        cfg.model.param_bf16 = true;
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        const auto r = testing::run_dp(cfg, backend, *comm, true);
        const Prediction p = predict_data_parallel(cfg, world, rank);
        EXPECT_EQ(r.resting, p.resting);
        for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
        EXPECT_EQ(r.peak.total, p.peak_total);
        EXPECT_EQ(r.peak.by_category, p.peak_by_category);
        EXPECT_EQ(r.where, p.peak_where);
        RunConfig fp32 = cfg;
        fp32.precision = PrecisionKind::fp32;
        fp32.model.param_bf16 = false;
        const HostState ref = testing::reference_training(fp32, world);
        ASSERT_TRUE(any_nonzero(ref.grads));
        ASSERT_EQ(r.state.grads.size(), ref.grads.size());
        double d = 0.0, n = 0.0;
        for (std::size_t i = 0; i < ref.grads.size(); ++i) {
          d += (r.state.grads[i] - ref.grads[i]) * static_cast<double>(r.state.grads[i] - ref.grads[i]);
          n += ref.grads[i] * static_cast<double>(ref.grads[i]);
        }
        EXPECT_LT(std::sqrt(d / n), 0.05);
        EXPECT_GT(d, 0.0);  // bf16's arithmetic
      }
}

// --checkpoint (torch's non-reentrant checkpoint per layer or block) under stages 1 and 2
// (and stage 3 of the MLP):
// the re-run is the forward's arithmetic, so a checkpointed step trains like one rank as the
// unchecked one does; its bytes equal the closed forms and an emulated rank's.
TEST(DeepSpeedMpi, CheckpointedStagesTrainLikeOneRank) {
  const ModelConfig mlp = testing::model_of(4, 37, 6, Activation::relu, Loss::mse);
  for (const char* strategy : {"zero1", "zero2"})
    for (const CheckpointPolicy ck : {CheckpointPolicy{CheckpointKind::every, 1}, CheckpointPolicy{CheckpointKind::every, 2}}) {
      SCOPED_TRACE(std::string("mlp ") + strategy + " " + ck.text());
      RunConfig cfg = ds_config(mlp, strategy, 0.006);
      cfg.model.checkpoint = ck;
      check_against_one_rank(cfg, 1e-7);
    }
  // Stage 3: the re-run's gathers (under ReLU) and the weights its saves keep.
  for (Activation act : {Activation::relu, Activation::none})
    for (std::int64_t threshold : {std::int64_t{0}, std::int64_t{37}}) {
      SCOPED_TRACE(std::string("mlp zero3 ") + (act == Activation::relu ? "relu" : "none") + " threshold " +
                   std::to_string(threshold));
      RunConfig cfg = ds_config(testing::model_of(3, 37, 4, act, Loss::mse), "zero3", 0.006);
      cfg.param_persistence = threshold;
      cfg.model.checkpoint = {CheckpointKind::every, 1};
      check_against_one_rank(cfg, 1e-7);
    }
  const std::pair<const char*, ModelConfig> models[] = {
      {"gpt2", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::math)},
      {"llama", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::flash, false)},
  };
  for (const auto& [name, m] : models)
    for (const char* strategy : {"zero1", "zero2"})
      for (const CheckpointPolicy ck : {CheckpointPolicy{CheckpointKind::every, 1}, CheckpointPolicy{CheckpointKind::attention, 1}}) {
        SCOPED_TRACE(std::string(name) + " " + strategy + " " + ck.text());
        RunConfig cfg = ds_config(m, strategy, 0.005);
        cfg.model.checkpoint = ck;
        check_against_one_rank(cfg, 4e-4);
      }
}

// --precision bf16 with --accumulate 2 (gradients added in bf16) and --checkpoint under
// stages 1 and 2, and stage 3 in bf16 (with --accumulate 2): every rank's bytes and traffic
// equal the closed forms and an emulated rank's; the last averaged gradient is fp32 one-rank
// training's on the 2-fold batch (one step) within bf16's rounding.
TEST(DeepSpeedMpi, Bf16AccumulationAndCheckpointHoldTheirPredictions) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const ModelConfig m = testing::model_of(4, 37, 3, Activation::relu, Loss::mse);
  const struct {
    const char* strategy;
    int k;
    CheckpointPolicy ck;
    std::int64_t threshold;
  } cases[] = {{"zero1", 2, {CheckpointKind::every, 1}, 100'000},
               {"zero2", 2, {CheckpointKind::every, 2}, 100'000},
               {"zero3", 1, {}, 0},
               {"zero3", 2, {CheckpointKind::every, 1}, 37}};
  for (const auto& c : cases)
    for (double bucket : {0.0, 0.006}) {
      SCOPED_TRACE(std::string(c.strategy) + " K=" + std::to_string(c.k) + " " + c.ck.text() + " bucket " +
                   std::to_string(bucket));
      RunConfig cfg = ds_config(m, c.strategy, bucket);
      cfg.steps = 1;
      cfg.precision = PrecisionKind::bf16;
      cfg.model.param_bf16 = true;
      cfg.model.checkpoint = c.ck;
      cfg.accumulate = c.k;
      cfg.param_persistence = c.threshold;
      CpuBackend backend;
      auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
      const auto r = testing::run_dp(cfg, backend, *comm, true);
      const Prediction p = predict_data_parallel(cfg, world, rank);
      EXPECT_EQ(r.resting, p.resting);
      for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
      EXPECT_EQ(r.peak.total, p.peak_total);
      EXPECT_EQ(r.peak.by_category, p.peak_by_category);
      EXPECT_EQ(r.where, p.peak_where);
      CpuBackend backend2;
      auto fake = make_fake_communicator(world, rank, &backend2);
      const auto e = testing::run_dp(cfg, backend2, *fake, false);
      EXPECT_EQ(e.resting, r.resting);
      EXPECT_EQ(e.peak.by_category, r.peak.by_category);
      RunConfig fp32 = cfg;
      fp32.precision = PrecisionKind::fp32;
      fp32.model.param_bf16 = false;
      fp32.model.batch = c.k * m.batch;
      fp32.accumulate = 1;
      const HostState ref = testing::reference_training(fp32, world);
      ASSERT_TRUE(any_nonzero(ref.grads));
      ASSERT_TRUE(any_nonzero(r.state.grads));
      ASSERT_EQ(r.state.grads.size(), ref.grads.size());
      double largest = 0.0;
      for (float g : ref.grads) largest = std::max(largest, static_cast<double>(std::fabs(g)));
      std::size_t at = 0;
      // bf16 keeps 8 bits of mantissa: each gradient within 5% of fp32's, or 2% of the largest.
      EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 5e-2, 2e-2 * largest, &at), 0.0) << "grads at " << at;
    }
}

// Stage 3 of GPT-2 and Llama in bf16 (the bf16 module gathered module by module, its gradients bf16,
// the buckets divided and all-reduced in bf16, the gradient partitions added in bf16 under
// --accumulate): every rank's bytes and traffic equal the closed forms and an emulated rank's;
// one micro-step trains as DeepSpeed's bf16 stage 2 does, bit for bit (the same bf16
// arithmetic, element by element: only where the bytes live differs; the master weights
// rounded are stage 2's bf16 group), and the averaged
// gradient of one step, one micro-step or two, is fp32 one-rank training's on the K-fold
// batch within bf16's rounding.
TEST(DeepSpeedMpi, Bf16StageThreeTrainsLikeOneRank) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::pair<const char*, ModelConfig> models[] = {
      {"gpt2 flash", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::flash)},
      {"gpt2 math", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::math)},
      {"llama math", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::math, false)},
      {"llama tied", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::flash, true)},
  };
  for (const auto& [name, m] : models)
    for (std::int64_t threshold : {std::int64_t{0}, std::int64_t{100}, std::int64_t{100'000}})
      for (double bucket : {0.0, 0.005})
        for (int k : {1, 2}) {
          SCOPED_TRACE(std::string(name) + " threshold " + std::to_string(threshold) + " bucket " +
                       std::to_string(bucket) + " K=" + std::to_string(k));
          RunConfig cfg = ds_config(m, "zero3", bucket);
          cfg.steps = k == 1 ? 3 : 1;
          cfg.precision = PrecisionKind::bf16;
          cfg.model.param_bf16 = true;
          cfg.param_persistence = threshold;
          cfg.accumulate = k;
          CpuBackend backend;
          auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
          const auto r = testing::run_dp(cfg, backend, *comm, true);
          const Prediction p = predict_data_parallel(cfg, world, rank);
          EXPECT_EQ(r.resting, p.resting);
          for (int c = 0; c < kCollKindCount; ++c) EXPECT_EQ(r.ledger.by_kind[c].bytes, p.comm_bytes[c]);
          EXPECT_EQ(r.peak.total, p.peak_total);
          EXPECT_EQ(r.peak.by_category, p.peak_by_category);
          EXPECT_EQ(r.where, p.peak_where);
          CpuBackend backend2;
          auto fake = make_fake_communicator(world, rank, &backend2);
          const auto e = testing::run_dp(cfg, backend2, *fake, false);
          EXPECT_EQ(e.resting, r.resting);
          EXPECT_EQ(e.peak.by_category, r.peak.by_category);
          ASSERT_TRUE(any_nonzero(r.state.grads));
          if (k == 1) {
            RunConfig stage2 = cfg;
            stage2.strategy = StrategyKind::zero2;
            CpuBackend backend3;
            auto comm2 = make_communicator(CommOptions{"mpi", 0, 0}, &backend3);
            const auto two = testing::run_dp(stage2, backend3, *comm2, true);
            // Stage 2 reports its bf16 group, stage 3 its master weights: rounded, the same.
            std::vector<float> rounded = r.state.params;
            for (float& v : rounded) v = from_bf16(to_bf16(v));
            EXPECT_EQ(rounded, two.state.params);
            EXPECT_NE(r.state.params, two.state.params);
            EXPECT_EQ(r.state.grads, two.state.grads);
            EXPECT_EQ(r.state.exp_avg, two.state.exp_avg);
            EXPECT_EQ(r.state.exp_avg_sq, two.state.exp_avg_sq);
          }
          RunConfig fp32 = cfg;
          fp32.steps = 1;
          fp32.precision = PrecisionKind::fp32;
          fp32.model.param_bf16 = false;
          fp32.model.batch = k * m.batch;
          fp32.accumulate = 1;
          const HostState ref = testing::reference_training(fp32, world);
          if (k == 1) {
            RunConfig one = cfg;
            one.steps = 1;
            CpuBackend backend4;
            auto comm1 = make_communicator(CommOptions{"mpi", 0, 0}, &backend4);
            const auto first = testing::run_dp(one, backend4, *comm1, true);
            expect_bf16_close(first.state.grads, ref.grads);
          } else {
            expect_bf16_close(r.state.grads, ref.grads);
          }
        }
}

// --precision bf16 on GPT-2 and Llama with --accumulate K (autograd's bf16 gradients added onto, stage
// 2's averaged partition onto the first micro-step's) and --checkpoint full|every:2|attention
// (the bf16 module's re-runs), stages 0, 1 and 2, flash and math: every rank's bytes and traffic equal the
// closed forms and an emulated rank's; the last averaged gradient is fp32 one-rank training's
// on the K-fold batch (one step) within bf16's rounding (by norm, as the one-micro-step test).
TEST(DeepSpeedMpi, Bf16Gpt2AccumulationAndCheckpointHoldTheirPredictions) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const struct {
    const char* strategy;
    int k;
    bool no_sync;
    CheckpointPolicy ck;
    AttentionMode mode;
    bool llama;
  } cases[] = {{"zero1", 2, false, {}, AttentionMode::flash, false},
               {"zero1", 3, true, {CheckpointKind::every, 1}, AttentionMode::math, false},
               {"zero2", 2, false, {CheckpointKind::every, 2}, AttentionMode::flash, false},
               {"zero2", 3, false, {}, AttentionMode::math, false},
               {"zero2", 1, false, {CheckpointKind::every, 1}, AttentionMode::math, false},
               {"zero1", 2, false, {CheckpointKind::every, 1}, AttentionMode::flash, true},
               {"zero2", 3, false, {CheckpointKind::every, 2}, AttentionMode::math, true},
               {"zero1", 2, false, {CheckpointKind::attention, 1}, AttentionMode::math, true},
               {"ddp", 2, false, {CheckpointKind::attention, 1}, AttentionMode::flash, true},
               {"zero2", 2, false, {CheckpointKind::attention, 1}, AttentionMode::flash, false},
               {"ddp", 1, false, {CheckpointKind::attention, 1}, AttentionMode::math, false}};
  for (const auto& c : cases)
    for (double bucket : {0.0, 0.005}) {
      SCOPED_TRACE(std::string(c.strategy) + " K=" + std::to_string(c.k) + (c.no_sync ? " no-sync " : " ") +
                   c.ck.text() + (c.mode == AttentionMode::flash ? " flash" : " math") + (c.llama ? " llama" : " gpt2") +
                   " bucket " +
                   std::to_string(bucket));
      const ModelConfig m = c.llama ? testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, c.mode, false)
                                    : testing::gpt2_of(2, 16, 2, 29, 6, 2, c.mode);
      RunConfig cfg = ds_config(m, c.strategy, bucket);
      cfg.steps = 1;
      cfg.precision = PrecisionKind::bf16;
      cfg.model.param_bf16 = true;
      cfg.model.checkpoint = c.ck;
      cfg.accumulate = c.k;
      cfg.no_sync = c.no_sync;
      CpuBackend backend;
      auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
      const auto r = testing::run_dp(cfg, backend, *comm, true);
      const Prediction p = predict_data_parallel(cfg, world, rank);
      EXPECT_EQ(r.resting, p.resting);
      for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
      EXPECT_EQ(r.peak.total, p.peak_total);
      EXPECT_EQ(r.peak.by_category, p.peak_by_category);
      EXPECT_EQ(r.where, p.peak_where);
      CpuBackend backend2;
      auto fake = make_fake_communicator(world, rank, &backend2);
      const auto e = testing::run_dp(cfg, backend2, *fake, false);
      EXPECT_EQ(e.resting, r.resting);
      EXPECT_EQ(e.peak.by_category, r.peak.by_category);
      RunConfig fp32 = cfg;
      fp32.precision = PrecisionKind::fp32;
      fp32.model.param_bf16 = false;
      fp32.model.checkpoint = {};
      fp32.model.batch = c.k * m.batch;
      fp32.accumulate = 1;
      fp32.no_sync = false;
      expect_bf16_close(r.state.grads, testing::reference_training(fp32, world).grads);
    }
}

// ddp under --precision bf16 (DeepSpeed's stage 0: FP16_Optimizer in bf16), the MLP, GPT-2
// (flash, math) and Llama (untied, tied), one bucket and several, --accumulate 1, 2, 3 (--no-sync at 2), --checkpoint:
// every rank's bytes and traffic equal the closed forms and an emulated rank's; the averaged
// gradient of one step is fp32 one-rank training's on the K-fold batch within bf16's rounding
// (the bf16 sums over the ranks, then the division by W), the same on every rank.
TEST(DeepSpeedMpi, Bf16StageZeroHoldsItsPredictionsAndAveragesTheGradients) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const struct {
    const char* name;
    ModelConfig m;
    int k;
    bool no_sync;
    CheckpointPolicy ck;
  } cases[] = {
      {"mlp", testing::model_of(4, 37, 3, Activation::relu, Loss::mse), 1, false, {}},
      {"mlp", testing::model_of(4, 37, 3, Activation::relu, Loss::mse), 2, true, {CheckpointKind::every, 1}},
      {"gpt2 flash", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::flash), 1, false, {}},
      {"gpt2 math", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::math), 2, false, {CheckpointKind::every, 2}},
      {"gpt2 flash", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::flash), 3, false, {CheckpointKind::every, 1}},
      {"llama math", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::math, false), 1, false, {}},
      {"llama tied", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::flash, true), 2, true,
       {CheckpointKind::every, 1}},
  };
  for (const auto& c : cases)
    for (double bucket : {0.0, 0.001}) {
      SCOPED_TRACE(std::string(c.name) + " K=" + std::to_string(c.k) + (c.no_sync ? " no-sync " : " ") +
                   c.ck.text() + " bucket " + std::to_string(bucket));
      RunConfig cfg = ds_config(c.m, "ddp", bucket);
      cfg.steps = 1;
      cfg.precision = PrecisionKind::bf16;
      cfg.model.param_bf16 = true;
      cfg.model.checkpoint = c.ck;
      cfg.accumulate = c.k;
      cfg.no_sync = c.no_sync;
      CpuBackend backend;
      auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
      const auto r = testing::run_dp(cfg, backend, *comm, true);
      const Prediction p = predict_data_parallel(cfg, world, rank);
      EXPECT_EQ(r.resting, p.resting);
      for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
      EXPECT_EQ(r.peak.total, p.peak_total);
      EXPECT_EQ(r.peak.by_category, p.peak_by_category);
      EXPECT_EQ(r.where, p.peak_where);
      CpuBackend backend2;
      auto fake = make_fake_communicator(world, rank, &backend2);
      const auto e = testing::run_dp(cfg, backend2, *fake, false);
      EXPECT_EQ(e.resting, r.resting);
      EXPECT_EQ(e.peak.by_category, r.peak.by_category);
      RunConfig fp32 = cfg;
      fp32.precision = PrecisionKind::fp32;
      fp32.model.param_bf16 = false;
      fp32.model.checkpoint = {};
      fp32.model.batch = c.k * c.m.batch;
      fp32.accumulate = 1;
      fp32.no_sync = false;
      expect_bf16_close(r.state.grads, testing::reference_training(fp32, world).grads);
      // Every rank holds the same averaged gradient (the all-reduce's result).
      std::vector<float> root = r.state.grads;
      MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
      EXPECT_EQ(root, r.state.grads);
    }
}

TEST(DeepSpeedMpi, TransformersTrainLikeOneRank) {
  const std::pair<const char*, ModelConfig> models[] = {
      {"gpt2", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::flash)},
      {"llama", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::math, false)},
      {"llama tied", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::flash, true)},
  };
  for (const auto& [name, m] : models)
    for (const char* strategy : {"zero1", "zero2"})
      for (double bucket : {0.0, 0.005}) {
        SCOPED_TRACE(std::string(name) + " " + strategy + " bucket " + std::to_string(bucket));
        // The key bias's gradient is rounding noise (test_strategies_mpi.cpp says why).
        check_against_one_rank(ds_config(m, strategy, bucket), 4e-4);
      }
}

// Stage 3 of GPT-2 and Llama (each module gathered on its own, the tied table by the
// embedding and by the head, its gradient copied once both are done): every tensor
// gathered (threshold 0), the weights alone (100) and none (100,000); one bucket and
// buckets of about a weight; one micro-step and two (the K-fold batch in one).
TEST(DeepSpeedMpi, StageThreeTransformersTrainLikeOneRank) {
  const std::pair<const char*, ModelConfig> models[] = {
      {"gpt2 flash", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::flash)},
      {"gpt2 math", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::math)},
      {"llama math", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::math, false)},
      {"llama tied", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::flash, true)},
  };
  for (const auto& [name, m] : models)
    for (std::int64_t threshold : {std::int64_t{0}, std::int64_t{100}, std::int64_t{100'000}})
      for (double bucket : {0.0, 0.005})
        for (int k : {1, 2}) {
          SCOPED_TRACE(std::string(name) + " threshold " + std::to_string(threshold) + " bucket " +
                       std::to_string(bucket) + " K=" + std::to_string(k));
          RunConfig cfg = ds_config(m, "zero3", bucket);
          cfg.param_persistence = threshold;
          cfg.accumulate = k;
          RunConfig whole = cfg;
          whole.model.batch = k * m.batch;
          whole.accumulate = 1;
          // The key bias's gradient is rounding noise (test_strategies_mpi.cpp says why).
          check_against_one_rank(cfg, 4e-4, whole, k > 1 ? 1e-6 : 1e-7);
        }
}

// One bf16 stage-3 configuration checkpointed under `ck` beside the same step unchecked,
// both under mpirun: master weights, gradients and AdamW state equal bit for bit (the
// re-run is the forward's arithmetic), the checkpointed rank's bytes the closed forms' and
// an emulated rank's.
void expect_bf16_stage3_checkpointed_as_unchecked(RunConfig cfg, const CheckpointPolicy& ck, std::int64_t threshold,
                                                  int k) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  cfg.precision = PrecisionKind::bf16;
  cfg.model.param_bf16 = true;
  cfg.param_persistence = threshold;
  cfg.accumulate = k;
  RunConfig plain = cfg;
  cfg.model.checkpoint = ck;
  CpuBackend backend, backend2, backend3;
  auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
  const auto r = testing::run_dp(cfg, backend, *comm, true);
  auto comm2 = make_communicator(CommOptions{"mpi", 0, 0}, &backend2);
  const auto u = testing::run_dp(plain, backend2, *comm2, true);
  ASSERT_TRUE(any_nonzero(r.state.grads));
  EXPECT_EQ(r.state.params, u.state.params);
  EXPECT_EQ(r.state.grads, u.state.grads);
  EXPECT_EQ(r.state.exp_avg, u.state.exp_avg);
  EXPECT_EQ(r.state.exp_avg_sq, u.state.exp_avg_sq);
  const Prediction p = predict_data_parallel(cfg, world, rank);
  EXPECT_EQ(r.resting, p.resting);
  for (int c = 0; c < kCollKindCount; ++c) EXPECT_EQ(r.ledger.by_kind[c].bytes, p.comm_bytes[c]);
  EXPECT_EQ(r.peak.total, p.peak_total);
  EXPECT_EQ(r.peak.by_category, p.peak_by_category);
  EXPECT_EQ(r.where, p.peak_where);
  auto fake = make_fake_communicator(world, rank, &backend3);
  const auto e = testing::run_dp(cfg, backend3, *fake, false);
  EXPECT_EQ(e.resting, r.resting);
  EXPECT_EQ(e.peak.by_category, r.peak.by_category);
}

// --checkpoint full|every:K|attention under stage 3 in bf16 (GPT-2's bf16 module): the
// re-run (a block's, or the attention core's) is the forward's arithmetic, so a checkpointed step trains as the unchecked one does, bit for bit
// (its master weights, gradients and AdamW state; that one trains as stage 2 and within
// bf16's rounding of fp32, Bf16Gpt2StageThreeTrainsLikeOneRank); its bytes are the closed
// forms' and an emulated rank's. Every tensor gathered (0) and the weights alone (100),
// one micro-step and two.
TEST(DeepSpeedMpi, Bf16Gpt2StageThreeCheckpointedTrainsAsUnchecked) {
  const CheckpointPolicy policies[] = {
      {CheckpointKind::every, 1}, {CheckpointKind::every, 2}, {CheckpointKind::attention, 1}};
  for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const CheckpointPolicy& ck : policies)
      for (std::int64_t threshold : {std::int64_t{0}, std::int64_t{100}})
        for (int k : {1, 2}) {
          SCOPED_TRACE(std::string(mode == AttentionMode::flash ? "flash " : "math ") + ck.text() + " threshold " +
                       std::to_string(threshold) + " K=" + std::to_string(k));
          RunConfig cfg = ds_config(testing::gpt2_of(2, 16, 2, 29, 6, 2, mode), "zero3", 0.005);
          expect_bf16_stage3_checkpointed_as_unchecked(cfg, ck, threshold, k);
        }
}

// The same on Llama's bf16 module (GQA untied flash, MHA tied math with biases; full, every:2
// and attention): the checkpointed step trains as the unchecked one does, bit for bit; bytes the forms' and an
// emulated rank's.
TEST(DeepSpeedMpi, Bf16LlamaStageThreeCheckpointedTrainsAsUnchecked) {
  ModelConfig tied = testing::llama_of(3, 16, 4, 4, 20, 11, 5, 3, AttentionMode::math, true);
  tied.transformer.qkv_bias = true;
  const std::pair<const char*, ModelConfig> models[] = {
      {"llama flash", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::flash, false)},
      {"llama tied biased math", tied},
  };
  const CheckpointPolicy policies[] = {
      {CheckpointKind::every, 1}, {CheckpointKind::every, 2}, {CheckpointKind::attention, 1}};
  for (const auto& [name, m] : models)
    for (const CheckpointPolicy& ck : policies)
      for (std::int64_t threshold : {std::int64_t{0}, std::int64_t{100}})
        for (int k : {1, 2}) {
          SCOPED_TRACE(std::string(name) + " " + ck.text() + " threshold " + std::to_string(threshold) + " K=" +
                       std::to_string(k));
          RunConfig cfg = ds_config(m, "zero3", 0.005);
          expect_bf16_stage3_checkpointed_as_unchecked(cfg, ck, threshold, k);
        }
}

// --checkpoint under stage 3 of GPT-2 and Llama: a wrapped block's re-run gathers its
// modules again (the first-backward one gathered before it) and its saves keep their
// gathered storages to each module's backward; --checkpoint attention recomputes the core.
// Full, every:2 and attention, every tensor gathered (0) and the weights alone (100),
// one micro-step and two: each trains like one rank (the K-fold batch in one), its bytes
// the closed forms' and an emulated rank's.
TEST(DeepSpeedMpi, StageThreeCheckpointedTransformersTrainLikeOneRank) {
  const std::pair<const char*, ModelConfig> models[] = {
      {"gpt2 math", testing::gpt2_of(2, 16, 2, 29, 6, 2, AttentionMode::math)},
      {"llama flash", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::flash, false)},
      {"llama tied math", testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, AttentionMode::math, true)},
  };
  const CheckpointPolicy policies[] = {{CheckpointKind::every, 1}, {CheckpointKind::every, 2},
                                       {CheckpointKind::attention, 1}};
  for (const auto& [name, m] : models)
    for (const CheckpointPolicy& ck : policies)
      for (std::int64_t threshold : {std::int64_t{0}, std::int64_t{100}})
        for (int k : {1, 2}) {
          SCOPED_TRACE(std::string(name) + " " + ck.text() + " threshold " + std::to_string(threshold) + " K=" +
                       std::to_string(k));
          RunConfig cfg = ds_config(m, "zero3", 0.005);
          cfg.model.checkpoint = ck;
          cfg.param_persistence = threshold;
          cfg.accumulate = k;
          RunConfig whole = cfg;
          whole.model.batch = k * m.batch;
          whole.accumulate = 1;
          check_against_one_rank(cfg, 4e-4, whole, k > 1 ? 1e-6 : 1e-7);
        }
}

}  // namespace
}  // namespace shardscope
