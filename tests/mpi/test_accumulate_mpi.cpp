// --accumulate K over MPI at the world this binary was started with (W = 2, 3, 4 from
// ctest): ddp, zero1, and zero2/zero3 under both engines, syncing every micro-step and
// under --no-sync, train like one rank on the ranks' K-fold batches concatenated
// (gradients, parameters and AdamW moments within 1e-6 relative), and their bytes and
// traffic equal the closed forms; GPT-2's and Llama's sharded steps too.
#include <gtest/gtest.h>
#include <mpi.h>

#include "harness/comm/fake_comm.hpp"
#include "shardscope/comm.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

struct Setting {
  const char* strategy;
  EngineKind engine;
  int units;
};
constexpr Setting kSettings[] = {{"ddp", EngineKind::torch, 0},   {"zero1", EngineKind::torch, 0},
                                 {"zero2", EngineKind::torch, 1}, {"zero3", EngineKind::torch, 1},
                                 {"zero3", EngineKind::torch, 0}, {"zero2", EngineKind::fsdp2, 1},
                                 {"zero3", EngineKind::fsdp2, 1}};

void expect_predicted(const RunConfig& cfg, const testing::DpResult& r, int world, int rank) {
  const Prediction p = predict_data_parallel(cfg, world, rank);
  EXPECT_EQ(r.resting, p.resting);
  for (int c = 0; c < kCollKindCount; ++c) {
    const CollStats& st = r.ledger.by_kind[c];
    EXPECT_EQ(st.bytes, p.comm_bytes[c]) << kCollKindNames[c];
    EXPECT_GE(st.exposed_ms, 0.0) << kCollKindNames[c];  // --overlap on (the default)
    EXPECT_LE(st.exposed_ms, st.ms) << kCollKindNames[c];
  }
  EXPECT_EQ(r.peak.total, p.peak_total);
  EXPECT_EQ(r.peak.by_category, p.peak_by_category);
  EXPECT_EQ(r.where, p.peak_where);
}

TEST(AccumulateMpi, MlpTrainsLikeOneStepOnTheKFoldBatch) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (const Setting& s : kSettings)
    for (int k : {2, 3})
      for (bool no_sync : {false, true}) {
        SCOPED_TRACE(std::string(s.strategy) + " engine=" + std::string(engine_name(s.engine)) + " units=" +
                     std::to_string(s.units) + " K=" + std::to_string(k) + (no_sync ? " no_sync" : ""));
        RunConfig cfg;
        cfg.model.layers = 3;
        cfg.model.width = 21;
        cfg.model.batch = 4;
        cfg.model.activation = Activation::relu;
        cfg.model.loss = Loss::mse;  // a mean: the K-fold batch's gradient is the mean of the micro-steps'
        cfg.steps = 2;
        cfg.seed = 7;
        cfg.strategy = parse_strategy(s.strategy);
        cfg.engine = s.engine;
        cfg.layers_per_unit = s.units;
        cfg.bucket_mb = 0.0005;  // ddp/zero1: a bucket a tensor, posted as backward goes (--overlap on)
        cfg.accumulate = k;
        cfg.no_sync = no_sync;
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        const auto r = testing::run_dp(cfg, backend, *comm, true);
        RunConfig whole = cfg;
        whole.model.batch = k * cfg.model.batch;
        whole.accumulate = 1;
        whole.no_sync = false;
        const HostState ref = testing::reference_training(whole, world);
        ASSERT_TRUE(any_nonzero(ref.grads));
        std::size_t at = 0;
        EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 1e-6, 1e-7, &at), 0.0) << "grads at " << at;
        EXPECT_EQ(worst_violation(r.state.params, ref.params, 1e-6, 1e-7, &at), 0.0) << "params at " << at;
        EXPECT_EQ(worst_violation(r.state.exp_avg, ref.exp_avg, 1e-6, 1e-7, &at), 0.0) << "exp_avg at " << at;
        expect_predicted(cfg, r, world, rank);
      }
}

// GPT-2 (math) and Llama (flash, grouped-query) under zero2/zero3, both engines, units
// of one block: every rank's bytes, place and traffic equal the closed forms.
TEST(AccumulateMpi, ShardedTransformersHoldTheirPredictions) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const TransformerShape shapes[] = {testing::shape("gpt2", 2, 16, 2, 2, 64, 29, 6, AttentionMode::math),
                                     testing::shape("llama", 2, 16, 4, 2, 24, 31, 6, AttentionMode::flash)};
  for (const TransformerShape& t : shapes)
    for (const Setting& s : kSettings)
      for (bool no_sync : {false, true}) {
        if (!shards_by_unit(parse_strategy(s.strategy))) continue;
        SCOPED_TRACE(t.model_type + " " + s.strategy + " engine=" + std::string(engine_name(s.engine)) +
                     (no_sync ? " no_sync" : ""));
        RunConfig cfg;
        cfg.model = testing::transformer_model(t.model_type, t, 2);
        cfg.steps = 2;
        cfg.strategy = parse_strategy(s.strategy);
        cfg.engine = s.engine;
        cfg.layers_per_unit = s.units;
        cfg.accumulate = 3;
        cfg.no_sync = no_sync;
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        expect_predicted(cfg, testing::run_dp(cfg, backend, *comm, false), world, rank);
      }
}

}  // namespace
}  // namespace shardscope
