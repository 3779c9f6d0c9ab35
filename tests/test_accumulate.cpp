// --accumulate K (harness/strategies/data_parallel.cpp): K micro-steps per optimizer
// step, each on the rank's whole batch, the loss scaled by 1/K, gradients accumulated;
// the all-reduce after every micro-step, or after the last only under --no-sync. Every
// emulated rank measures what the closed forms predict, the all-reduce's bytes are K (or
// one) times the model's 4P, and K micro-steps train exactly like one step on the
// K-fold batch.
#include <gtest/gtest.h>

#include <string>

#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::shape;

ModelConfig mlp(Activation activation, Loss loss) {
  ModelConfig m;
  m.layers = 4;
  m.width = 19;
  m.batch = 3;
  m.activation = activation;
  m.loss = loss;
  return m;
}

struct Replicated {
  const char* strategy;
  const char* ddp_bucket;
  double bucket_mb;
};
constexpr Replicated kReplicated[] = {{"ddp", "view", 0.0}, {"ddp", "copy", 0.0}, {"ddp", "view", 0.002},
                                      {"zero1", "view", 0.0}};

RunConfig accumulating(const ModelConfig& model, const Replicated& s, int k, bool no_sync) {
  RunConfig cfg;
  cfg.model = model;
  cfg.steps = 2;
  cfg.seed = 3;
  cfg.strategy = parse_strategy(s.strategy);
  cfg.ddp_bucket = s.ddp_bucket;
  cfg.bucket_mb = s.bucket_mb;
  cfg.accumulate = k;
  cfg.no_sync = no_sync;
  return cfg;
}

// The MLP (both activations, both losses), ddp (one bucket, a copied bucket, buckets of
// 2 kB) and zero1, K = 1, 2, 3, with and without --no-sync: every rank of W = 1 to 4.
TEST(Accumulate, MlpMeasuredEqualsPredictedOnEveryRank) {
  int checked = 0;
  for (Activation act : {Activation::none, Activation::relu})
    for (Loss loss : {Loss::sum, Loss::mse})
      for (const Replicated& s : kReplicated)
        for (int k : {1, 2, 3})
          for (bool no_sync : {false, true})
            for (int world : {1, 2, 3, 4})
              for (int rank = 0; rank < world; ++rank) {
                const RunConfig cfg = accumulating(mlp(act, loss), s, k, no_sync);
                SCOPED_TRACE(std::string(s.strategy) + " bucket=" + s.ddp_bucket + "/" + std::to_string(s.bucket_mb) +
                             " K=" + std::to_string(k) + (no_sync ? " no_sync" : "") +
                             " W=" + std::to_string(world) + " r=" + std::to_string(rank));
                testing::expect_rank_measured_equals_predicted(cfg, world, rank);
                // The all-reduce in closed form: 4P bytes per reduction.
                const std::int64_t P = cfg.model.params();
                const Prediction p = predict_data_parallel(cfg, world, rank);
                EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_reduce)], 4 * P * (no_sync ? 1 : k));
                ++checked;
              }
  EXPECT_EQ(checked, 2 * 2 * 4 * 3 * 2 * 10);
}

// K micro-steps of batch b on one rank train as one step on the K-fold batch (a mean
// loss: mse): gradients, parameters and AdamW moments after two optimizer steps within
// 1e-6 relative (plus 1e-7 of the largest magnitude, for sums that cancel).
TEST(Accumulate, MicroStepsEqualOneStepOnTheKFoldBatch) {
  for (const Replicated& s : kReplicated)
    for (int k : {2, 3})
      for (bool no_sync : {false, true}) {
        SCOPED_TRACE(std::string(s.strategy) + " K=" + std::to_string(k) + (no_sync ? " no_sync" : ""));
        const RunConfig cfg = accumulating(mlp(Activation::relu, Loss::mse), s, k, no_sync);
        CpuBackend backend;
        auto comm = make_fake_communicator(1, 0, &backend);  // the whole state is this rank's
        const auto r = testing::run_dp(cfg, backend, *comm, true);
        RunConfig whole = cfg;
        whole.model.batch = k * cfg.model.batch;
        whole.accumulate = 1;
        const HostState ref = testing::reference_training(whole, 1);
        ASSERT_TRUE(testing::any_nonzero(ref.grads));
        std::size_t at = 0;
        EXPECT_EQ(testing::worst_violation(r.state.grads, ref.grads, 1e-6, 1e-7, &at), 0.0) << "grads at " << at;
        EXPECT_EQ(testing::worst_violation(r.state.params, ref.params, 1e-6, 1e-7, &at), 0.0) << "params at " << at;
        EXPECT_EQ(testing::worst_violation(r.state.exp_avg, ref.exp_avg, 1e-6, 1e-7, &at), 0.0) << "exp_avg at " << at;
      }
}


const TransformerShape kShapes[] = {
    shape("gpt2", 2, 16, 2, 2, 64, 29, 6, AttentionMode::flash),
    shape("gpt2", 2, 16, 2, 2, 64, 29, 6, AttentionMode::math),
    shape("llama", 2, 16, 4, 2, 24, 31, 6, AttentionMode::flash),
    shape("llama", 2, 16, 4, 2, 24, 31, 6, AttentionMode::math),
};

std::string shape_label(const TransformerShape& t) {
  return t.model_type + (t.attention == AttentionMode::flash ? " flash" : " math");
}

// GPT-2 and Llama (flash and math), ddp and zero1, K = 2 and 3, both sync settings:
// every rank of W = 1 to 4.
TEST(Accumulate, TransformersMeasuredEqualsPredictedOnEveryRank) {
  int checked = 0;
  for (const TransformerShape& t : kShapes)
    for (const Replicated& s : {kReplicated[0], kReplicated[3]})
      for (int k : {2, 3})
        for (bool no_sync : {false, true})
          for (int world : {1, 2, 3, 4})
            for (int rank = 0; rank < world; ++rank) {
              const RunConfig cfg = accumulating(testing::transformer_model(t.model_type, t, 2), s, k, no_sync);
              SCOPED_TRACE(shape_label(t) + " " + s.strategy + " K=" + std::to_string(k) +
                           (no_sync ? " no_sync" : "") + " W=" + std::to_string(world) + " r=" + std::to_string(rank));
              testing::expect_rank_measured_equals_predicted(cfg, world, rank);
              ++checked;
            }
  EXPECT_EQ(checked, 4 * 2 * 2 * 2 * 10);
}

// K micro-steps of b sequences train as one step on K·b sequences (cross-entropy: a
// mean over tokens), GPT-2 and Llama, one rank.
TEST(Accumulate, TransformerMicroStepsEqualOneStepOnTheKFoldBatch) {
  for (const TransformerShape& t : kShapes)
    for (int k : {2, 3})
      for (bool no_sync : {false, true}) {
        SCOPED_TRACE(shape_label(t) + " K=" + std::to_string(k) + (no_sync ? " no_sync" : ""));
        const RunConfig cfg = accumulating(testing::transformer_model(t.model_type, t, 2), kReplicated[0], k, no_sync);
        CpuBackend backend;
        auto comm = make_fake_communicator(1, 0, &backend);
        const auto r = testing::run_dp(cfg, backend, *comm, true);
        RunConfig whole = cfg;
        whole.model.batch = k * cfg.model.batch;
        whole.accumulate = 1;
        const HostState ref = testing::reference_training(whole, 1);
        ASSERT_TRUE(testing::any_nonzero(ref.grads));
        std::size_t at = 0;
        EXPECT_EQ(testing::worst_violation(r.state.grads, ref.grads, 1e-6, 1e-7, &at), 0.0) << "grads at " << at;
        // AdamW divides each moment by its root (plus eps 1e-8): a gradient near eps, as a
        // few positions' and biases' are here, turns its rounding into a step's, up to lr;
        // parameters within 1e-5 relative and 1e-6 absolute (fsdp2's GPT-2 test allows 4e-4).
        EXPECT_EQ(testing::worst_violation(r.state.params, ref.params, 1e-5, 1e-6, &at), 0.0) << "params at " << at;
      }
}

// zero2 and zero3 under both engines: FSDP1's flat units and fully_shard's per-tensor
// shards, a root unit, units of one and two layers (blocks), prefetch on and off.
struct Sharded {
  const char* strategy;
  EngineKind engine;
  int units, prefetch;
};
constexpr Sharded kSharded[] = {
    {"zero2", EngineKind::torch, 0, 1}, {"zero3", EngineKind::torch, 0, 1}, {"zero2", EngineKind::torch, 1, 1},
    {"zero3", EngineKind::torch, 1, 1}, {"zero3", EngineKind::torch, 2, 0}, {"zero2", EngineKind::fsdp2, 1, 1},
    {"zero3", EngineKind::fsdp2, 1, 1}, {"zero3", EngineKind::fsdp2, 0, 1}, {"zero3", EngineKind::fsdp2, 2, 0}};

RunConfig sharded(const ModelConfig& model, const Sharded& s, int k, bool no_sync) {
  RunConfig cfg = accumulating(model, kReplicated[0], k, no_sync);
  cfg.strategy = parse_strategy(s.strategy);
  cfg.engine = s.engine;
  cfg.layers_per_unit = s.units;
  cfg.prefetch = s.prefetch;
  return cfg;
}

std::string sharded_label(const Sharded& s, int k, bool no_sync, int world, int rank) {
  return std::string(s.strategy) + " engine=" + std::string(engine_name(s.engine)) + " units=" +
         std::to_string(s.units) + " prefetch=" + std::to_string(s.prefetch) + " K=" + std::to_string(k) +
         (no_sync ? " no_sync" : "") + " W=" + std::to_string(world) + " r=" + std::to_string(rank);
}

// The MLP under zero2/zero3 (both engines), K = 1 to 4, both sync settings: every rank
// of W = 1 to 4 measures the predicted resting, peak (bytes by category, phase, place),
// saves and the communication: all-gathers K times a micro-step's (FSDP1's zero2 under
// --no-sync once: its units stay gathered), reduce-scatters K times, or once under
// --no-sync.
TEST(Accumulate, ShardedMlpMeasuredEqualsPredictedOnEveryRank) {
  int checked = 0;
  for (Activation act : {Activation::none, Activation::relu})
    for (Loss loss : {Loss::sum, Loss::mse})
      for (const Sharded& s : kSharded)
        for (int k : {1, 2, 3, 4})
          for (bool no_sync : {false, true})
            for (int world : {1, 2, 3, 4})
              for (int rank = 0; rank < world; ++rank) {
                const RunConfig cfg = sharded(mlp(act, loss), s, k, no_sync);
                SCOPED_TRACE(sharded_label(s, k, no_sync, world, rank));
                testing::expect_rank_measured_equals_predicted(cfg, world, rank);
                // The traffic against one micro-step's (K = 1).
                RunConfig once = cfg;
                once.accumulate = 1;
                once.no_sync = false;
                const Prediction p = predict_data_parallel(cfg, world, rank);
                const Prediction p1 = predict_data_parallel(once, world, rank);
                const int rs = static_cast<int>(CollKind::reduce_scatter), ag = static_cast<int>(CollKind::all_gather);
                ASSERT_GT(p1.comm_bytes[rs], 0);
                EXPECT_EQ(p.comm_bytes[rs], p1.comm_bytes[rs] * (no_sync ? 1 : k));
                const bool gathered_once = no_sync && s.engine == EngineKind::torch && std::string(s.strategy) == "zero2";
                EXPECT_EQ(p.comm_bytes[ag], p1.comm_bytes[ag] * (gathered_once ? 1 : k));
                ++checked;
              }
  EXPECT_EQ(checked, 2 * 2 * 9 * 4 * 2 * 10);
}

// Accumulating raises the peak only through what is kept or staged: under --no-sync the
// full gradients (every unit's from the second micro-step on), without it the staging
// shard; K = 1 is the plain step. (A root unit alone holds its full gradient at the plain
// step's peak already.)
TEST(Accumulate, ShardedPeakGrowsByWhatIsKept) {
  for (const Sharded& s : kSharded) {
    if (s.units == 0) continue;
    SCOPED_TRACE(s.strategy + std::string(" ") + std::string(engine_name(s.engine)));
    const ModelConfig m = mlp(Activation::relu, Loss::mse);
    // --overlap off: with it on, a plain step also holds the unit above's full gradient in
    // flight through each unit's backward, as much as --no-sync keeps on this small model.
    auto blocking = [](RunConfig c) {
      c.overlap = false;
      return c;
    };
    const Prediction plain = predict_data_parallel(blocking(sharded(m, s, 1, false)), 2, 0);
    const Prediction synced = predict_data_parallel(blocking(sharded(m, s, 3, false)), 2, 0);
    const Prediction kept = predict_data_parallel(blocking(sharded(m, s, 3, true)), 2, 0);
    EXPECT_EQ(synced.resting, plain.resting);
    EXPECT_GE(synced.peak_total, plain.peak_total);
    EXPECT_GT(kept.peak_total, plain.peak_total);
    EXPECT_GT(kept.peak_by_category[Category::grad_unsharded], plain.peak_by_category[Category::grad_unsharded]);
  }
}

// K micro-steps under zero2/zero3 train as one step on the K-fold batch: one rank, and
// every rank of W = 2 and 3 through the fake communicator's single-process world is
// not numeric, so one rank here (mpirun holds W = 2..4: test_accumulate_mpi).
TEST(Accumulate, ShardedMicroStepsEqualOneStepOnTheKFoldBatch) {
  for (const Sharded& s : kSharded)
    for (int k : {2, 3})
      for (bool no_sync : {false, true}) {
        SCOPED_TRACE(sharded_label(s, k, no_sync, 1, 0));
        const RunConfig cfg = sharded(mlp(Activation::relu, Loss::mse), s, k, no_sync);
        CpuBackend backend;
        auto comm = make_fake_communicator(1, 0, &backend);
        const auto r = testing::run_dp(cfg, backend, *comm, true);
        RunConfig whole = cfg;
        whole.model.batch = k * cfg.model.batch;
        whole.accumulate = 1;
        whole.no_sync = false;
        const HostState ref = testing::reference_training(whole, 1);
        ASSERT_TRUE(testing::any_nonzero(ref.grads));
        std::size_t at = 0;
        EXPECT_EQ(testing::worst_violation(r.state.grads, ref.grads, 1e-6, 1e-7, &at), 0.0) << "grads at " << at;
        EXPECT_EQ(testing::worst_violation(r.state.params, ref.params, 1e-6, 1e-7, &at), 0.0) << "params at " << at;
        EXPECT_EQ(testing::worst_violation(r.state.exp_avg, ref.exp_avg, 1e-6, 1e-7, &at), 0.0) << "exp_avg at " << at;
      }
}

// GPT-2 and Llama (flash and math) under zero2/zero3, both engines, K = 2 and 3, both
// sync settings: every rank of W = 1 to 4.
TEST(Accumulate, ShardedTransformersMeasuredEqualsPredictedOnEveryRank) {
  int checked = 0;
  for (const TransformerShape& t : kShapes)
    for (const Sharded& s : kSharded)
      for (int k : {2, 3})
        for (bool no_sync : {false, true})
          for (int world : {1, 2, 3, 4})
            for (int rank = 0; rank < world; ++rank) {
              const RunConfig cfg = sharded(testing::transformer_model(t.model_type, t, 2), s, k, no_sync);
              SCOPED_TRACE(shape_label(t) + " " + sharded_label(s, k, no_sync, world, rank));
              testing::expect_rank_measured_equals_predicted(cfg, world, rank);
              ++checked;
            }
  EXPECT_EQ(checked, 4 * 9 * 2 * 2 * 10);
}

}  // namespace
}  // namespace shardscope
