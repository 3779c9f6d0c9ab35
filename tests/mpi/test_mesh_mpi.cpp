// Meshes over MPI at the world this binary was started with (W = 2, 3, 4 from ctest):
// every mesh of that world with ddp or zero1 along dp and the MLP split along tp trains
// like one rank on the data-parallel group's concatenated batch (each rank's slice equals
// the one-rank model's elements), its bytes and each group's communication equal the
// closed forms, and the rank played alone (--emulate) holds the same bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include "harness/comm/fake_comm.hpp"
#include "support/mesh_harness.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::pick;
using testing::worst_violation;

std::vector<MeshShape> meshes_of(int world) {
  std::vector<MeshShape> out;
  for (int tp = 1; tp <= world; ++tp)
    if (world % tp == 0) out.push_back(MeshShape{world / tp, tp, 1, true});
  return out;
}

TEST(MeshMpi, TensorAndDataParallelTrainLikeOneRank) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (const MeshShape& mesh : meshes_of(world))
    for (const char* strategy : {"ddp", "zero1"})
      for (const bool relu_mse : {false, true}) {
        RunConfig cfg;
        cfg.mesh = mesh;
        cfg.model.layers = 4;
        cfg.model.width = 24;  // divides by 2, 3 and 4
        cfg.model.batch = 5;
        cfg.model.activation = relu_mse ? Activation::relu : Activation::none;
        cfg.model.loss = relu_mse ? Loss::mse : Loss::sum;
        cfg.steps = 3;
        cfg.seed = 5;
        cfg.strategy = parse_strategy(strategy);
        // --overlap on (the default): with relu and mse each tensor its own bucket, posted
        // on the dp group as backward reaches it while the tp group's all-reduces block.
        cfg.bucket_mb = relu_mse ? 0.001 : 0.0;
        ASSERT_TRUE(cfg.overlap);
        SCOPED_TRACE("--mesh " + mesh.text() + " " + strategy + (relu_mse ? " relu mse" : " none sum") + " rank " +
                     std::to_string(rank));
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        const testing::MeshResult r = testing::run_mesh(cfg, backend, *comm, true);

        // One rank on the data-parallel group's batches, the whole model.
        RunConfig one = cfg;
        one.mesh = MeshShape{};
        const HostState ref = testing::reference_training(one, mesh.dp);
        const std::vector<std::int64_t> at = testing::full_indices(cfg.model, mesh.tp, r.coord.tp);
        ASSERT_EQ(at.size(), r.dp.state.params.size());
        ASSERT_TRUE(any_nonzero(r.dp.state.grads));
        std::size_t i = 0;
        EXPECT_EQ(worst_violation(r.dp.state.params, pick(ref.params, at), 1e-5, 1e-7, &i), 0.0) << "params at " << i;
        EXPECT_EQ(worst_violation(r.dp.state.grads, pick(ref.grads, at), 1e-5, 1e-7, &i), 0.0) << "grads at " << i;
        EXPECT_EQ(worst_violation(r.dp.state.exp_avg, pick(ref.exp_avg, at), 1e-5, 1e-7, &i), 0.0) << "exp_avg at " << i;
        EXPECT_EQ(worst_violation(r.dp.state.exp_avg_sq, pick(ref.exp_avg_sq, at), 1e-5, 1e-9, &i), 0.0)
            << "exp_avg_sq at " << i;

        const Prediction p = predict_data_parallel(cfg, world, rank);
        EXPECT_EQ(r.dp.resting, p.resting);
        EXPECT_EQ(r.dp.peak.total, p.peak_total);
        EXPECT_EQ(r.dp.peak.by_category, p.peak_by_category);
        EXPECT_EQ(r.dp.where, p.peak_where);
        EXPECT_EQ(r.dp.saved.bytes, p.saved_after_forward_bytes);
        EXPECT_EQ(r.dp.ledger.total_bytes(), p.axis_comm_bytes[static_cast<int>(MeshAxis::dp)]);
        EXPECT_EQ(r.tp_ledger.total_bytes(), p.axis_comm_bytes[static_cast<int>(MeshAxis::tp)]);
        for (int k = 0; k < kCollKindCount; ++k)
          EXPECT_EQ(r.dp.ledger.by_kind[k].bytes + r.tp_ledger.by_kind[k].bytes, p.comm_bytes[k]);
        for (const CommLedger* l : {&r.dp.ledger, &r.tp_ledger})
          for (int k = 0; k < kCollKindCount; ++k) {
            EXPECT_GE(l->by_kind[k].exposed_ms, 0.0) << kCollKindNames[k];
            EXPECT_LE(l->by_kind[k].exposed_ms, l->by_kind[k].ms) << kCollKindNames[k];
          }
        // The tensor-parallel all-reduces sit between a block's kernels: they block.
        for (const CollStats& st : r.tp_ledger.by_kind) EXPECT_EQ(st.exposed_ms, st.ms);

        // The same rank played alone: the fake world's groups shape every call alike.
        CpuBackend backend2;
        auto fake = make_fake_communicator(world, rank, &backend2);
        const testing::MeshResult e = testing::run_mesh(cfg, backend2, *fake, false);
        EXPECT_EQ(e.dp.resting, r.dp.resting);
        EXPECT_EQ(e.dp.peak.total, r.dp.peak.total);
        EXPECT_EQ(e.dp.peak.by_category, r.dp.peak.by_category);
        EXPECT_EQ(e.tp_ledger.total_bytes(), r.tp_ledger.total_bytes());
        EXPECT_EQ(e.dp.ledger.total_bytes(), r.dp.ledger.total_bytes());
      }
}

}  // namespace
}  // namespace shardscope
