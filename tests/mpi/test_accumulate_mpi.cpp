// --accumulate K over MPI at the world this binary was started with (W = 2, 3, 4 from
// ctest): ddp and zero1, syncing every micro-step and under --no-sync, train like one
// rank on the ranks' K-fold batches concatenated (gradients, parameters and AdamW moments
// within 1e-6 relative), and their bytes and traffic equal the closed forms.
#include <gtest/gtest.h>
#include <mpi.h>

#include "harness/comm/fake_comm.hpp"
#include "shardscope/comm.hpp"
#include "support/dp_harness.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

TEST(AccumulateMpi, MlpTrainsLikeOneStepOnTheKFoldBatch) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (const char* strategy : {"ddp", "zero1"})
    for (int k : {2, 3})
      for (bool no_sync : {false, true}) {
        SCOPED_TRACE(std::string(strategy) + " K=" + std::to_string(k) + (no_sync ? " no_sync" : ""));
        RunConfig cfg;
        cfg.model.layers = 3;
        cfg.model.width = 21;
        cfg.model.batch = 4;
        cfg.model.activation = Activation::relu;
        cfg.model.loss = Loss::mse;  // a mean: the K-fold batch's gradient is the mean of the micro-steps'
        cfg.steps = 2;
        cfg.seed = 7;
        cfg.strategy = parse_strategy(strategy);
        cfg.accumulate = k;
        cfg.no_sync = no_sync;
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        const auto r = testing::run_dp(cfg, backend, *comm, true);
        RunConfig whole = cfg;
        whole.model.batch = k * cfg.model.batch;
        whole.accumulate = 1;
        const HostState ref = testing::reference_training(whole, world);
        ASSERT_TRUE(any_nonzero(ref.grads));
        std::size_t at = 0;
        EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 1e-6, 1e-7, &at), 0.0) << "grads at " << at;
        EXPECT_EQ(worst_violation(r.state.params, ref.params, 1e-6, 1e-7, &at), 0.0) << "params at " << at;
        EXPECT_EQ(worst_violation(r.state.exp_avg, ref.exp_avg, 1e-6, 1e-7, &at), 0.0) << "exp_avg at " << at;

        const Prediction p = predict_data_parallel(cfg, world, rank);
        EXPECT_EQ(r.resting, p.resting);
        for (int c = 0; c < kCollKindCount; ++c) EXPECT_EQ(r.ledger.by_kind[c].bytes, p.comm_bytes[c]);
        EXPECT_EQ(r.peak.total, p.peak_total);
        EXPECT_EQ(r.peak.by_category, p.peak_by_category);
      }
}

}  // namespace
}  // namespace shardscope
