// --strategy hsdp over MPI at the world this binary was started with (W = 2, 3, 4): with
// every shard group size that divides the world and both engines (torch, fsdp2), the MLP,
// GPT-2 and Llama train like one rank on the world's concatenated batch, their bytes and
// each group's communication equal the closed forms, and the rank played alone holds the
// same bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include "harness/comm/fake_comm.hpp"
#include "support/mesh_harness.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

TEST(HsdpMpi, TrainsLikeOneRankWithEveryShardGroup) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<RunConfig> cfgs(3);
  cfgs[0].model.layers = 4;
  cfgs[0].model.width = 37;
  cfgs[0].model.batch = 6;
  cfgs[0].model.activation = Activation::relu;
  cfgs[0].model.loss = Loss::mse;
  cfgs[1].model = testing::transformer_model("gpt2", testing::shape("gpt2", 2, 16, 2, 2, 64, 29, 6, AttentionMode::flash), 2);
  cfgs[2].model =
      testing::transformer_model("llama", testing::shape("llama", 2, 16, 4, 2, 24, 29, 6, AttentionMode::math), 2);
  for (RunConfig cfg : cfgs)
    for (int G = 1; G <= world; ++G)
      for (EngineKind engine : {EngineKind::torch, EngineKind::fsdp2}) {
        if (world % G != 0) continue;
        cfg.engine = engine;
        cfg.steps = 3;
        cfg.seed = 5;
        cfg.strategy = StrategyKind::zero3;
        cfg.layers_per_unit = 1;
        cfg.shard_group = G;
        SCOPED_TRACE(cfg.model.name + " hsdp G=" + std::to_string(G) + " W=" + std::to_string(world) + " engine=" +
                     std::string(engine_name(engine)) + " rank " + std::to_string(rank));
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        const testing::HsdpResult r = testing::run_hsdp(cfg, backend, *comm, true);
        RunConfig one = cfg;
        one.shard_group = 0;
        const HostState ref = testing::reference_training(one, world);
        ASSERT_TRUE(any_nonzero(ref.grads));
        std::size_t at = 0;
        EXPECT_EQ(worst_violation(r.dp.state.grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
        EXPECT_EQ(worst_violation(r.dp.state.exp_avg, ref.exp_avg, 1e-5, 1e-7, &at), 0.0) << "exp_avg at " << at;
        // A transformer's key-bias gradient is rounding noise that AdamW's step amplifies
        // (see test_strategies_mpi): the parameters within lr / 10 per step.
        EXPECT_EQ(worst_violation(r.dp.state.params, ref.params, 1e-5, 4e-4, &at), 0.0) << "params at " << at;

        const Prediction p = predict_data_parallel(cfg, world, rank);
        EXPECT_EQ(r.dp.resting, p.resting);
        EXPECT_EQ(r.dp.peak.total, p.peak_total);
        EXPECT_EQ(r.dp.peak.by_category, p.peak_by_category);
        EXPECT_EQ(r.replicate_ledger.total_bytes(), p.replicate_comm_bytes);
        for (int k = 0; k < kCollKindCount; ++k)
          EXPECT_EQ(r.dp.ledger.by_kind[k].bytes + r.replicate_ledger.by_kind[k].bytes, p.comm_bytes[k]);

        CpuBackend backend2;
        auto fake = make_fake_communicator(world, rank, &backend2);
        const testing::HsdpResult e = testing::run_hsdp(cfg, backend2, *fake, false);
        EXPECT_EQ(e.dp.resting, r.dp.resting);
        EXPECT_EQ(e.dp.peak.total, r.dp.peak.total);
        EXPECT_EQ(e.replicate_ledger.total_bytes(), r.replicate_ledger.total_bytes());
      }
}

// --accumulate 2, syncing every micro-step and under --no-sync, both engines: the MLP
// trains like one rank on the ranks' two-fold batches concatenated, with every shard group
// dividing the world, and its bytes and each group's traffic equal the closed forms.
TEST(HsdpMpi, AccumulationTrainsLikeOneStepOnTheTwoFoldBatch) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int G = 1; G <= world; ++G)
    for (int setting = 0; setting < 4; ++setting) {
      if (world % G != 0) continue;
      const bool no_sync = setting % 2 == 1;
      const EngineKind engine = setting < 2 ? EngineKind::torch : EngineKind::fsdp2;
      SCOPED_TRACE("hsdp G=" + std::to_string(G) + " W=" + std::to_string(world) + " engine=" +
                   std::string(engine_name(engine)) + (no_sync ? " no_sync" : ""));
      RunConfig cfg;
      cfg.model.layers = 3;
      cfg.model.width = 21;
      cfg.model.batch = 4;
      cfg.model.activation = Activation::relu;
      cfg.model.loss = Loss::mse;  // a mean: the two-fold batch's gradient is the micro-steps' mean
      cfg.steps = 2;
      cfg.seed = 7;
      cfg.strategy = StrategyKind::zero3;
      cfg.layers_per_unit = 1;
      cfg.shard_group = G;
      cfg.engine = engine;
      cfg.accumulate = 2;
      cfg.no_sync = no_sync;
      CpuBackend backend;
      auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
      const testing::HsdpResult r = testing::run_hsdp(cfg, backend, *comm, true);
      RunConfig whole = cfg;
      whole.shard_group = 0;
      whole.model.batch = 2 * cfg.model.batch;
      whole.accumulate = 1;
      whole.no_sync = false;
      const HostState ref = testing::reference_training(whole, world);
      ASSERT_TRUE(any_nonzero(ref.grads));
      std::size_t at = 0;
      EXPECT_EQ(worst_violation(r.dp.state.grads, ref.grads, 1e-6, 1e-7, &at), 0.0) << "grads at " << at;
      EXPECT_EQ(worst_violation(r.dp.state.params, ref.params, 1e-6, 1e-7, &at), 0.0) << "params at " << at;
      EXPECT_EQ(worst_violation(r.dp.state.exp_avg, ref.exp_avg, 1e-6, 1e-7, &at), 0.0) << "exp_avg at " << at;
      const Prediction p = predict_data_parallel(cfg, world, rank);
      EXPECT_EQ(r.dp.resting, p.resting);
      EXPECT_EQ(r.dp.peak.total, p.peak_total);
      EXPECT_EQ(r.dp.peak.by_category, p.peak_by_category);
      EXPECT_EQ(r.dp.where, p.peak_where);
      EXPECT_EQ(r.replicate_ledger.total_bytes(), p.replicate_comm_bytes);
      for (int k = 0; k < kCollKindCount; ++k)
        EXPECT_EQ(r.dp.ledger.by_kind[k].bytes + r.replicate_ledger.by_kind[k].bytes, p.comm_bytes[k]);
    }
}

}  // namespace
}  // namespace shardscope
