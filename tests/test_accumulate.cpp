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

}  // namespace
}  // namespace shardscope
