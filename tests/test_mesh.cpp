// --mesh: its parsing and rank order, the group communicators the fake world splits
// into, and every rank of tensor-parallel MLP meshes played alone (--emulate) at W = 4
// and 8 against the closed forms, byte for byte and group by group.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "harness/comm/fake_comm.hpp"
#include "harness/model/models.hpp"
#include "harness/predict/tensor_parallel_forms.hpp"
#include "shardscope/check.hpp"
#include "support/mesh_harness.hpp"

namespace shardscope {
namespace {

TEST(Mesh, ParsesAnySubsetAndRefusesBadAxes) {
  const MeshShape m = parse_mesh("tp=2,dp=3");
  EXPECT_TRUE(m.given);
  EXPECT_EQ(m.dp, 3);
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.pp, 1);
  EXPECT_EQ(m.world(), 6);
  EXPECT_EQ(parse_mesh("pp=4").pp, 4);
  for (const char* bad : {"", "dq=2", "dp=0", "dp=", "dp", "dp=2,dp=2", "tp=-1", "dp=2,", "dp=x"}) {
    SCOPED_TRACE(bad);
    try {
      parse_mesh(bad);
      ADD_FAILURE() << "accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--mesh"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(check_mesh_world(parse_mesh("dp=2,tp=2"), 8, "--emulate 8:0"), UsageError);
  EXPECT_NO_THROW(check_mesh_world(parse_mesh("dp=2,tp=2,pp=2"), 8, "--emulate 8:0"));
}

// Megatron's order: tp fastest, then dp, then pp; each group holds the ranks that differ
// in its coordinate only, and the groups of an axis partition the world.
TEST(Mesh, RanksAreOrderedTensorFastestThenDataThenPipeline) {
  const MeshShape m{2, 2, 2, true};
  EXPECT_EQ(m.group(0, MeshAxis::tp), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.group(0, MeshAxis::dp), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.group(0, MeshAxis::pp), (std::vector<int>{0, 4}));
  EXPECT_EQ(m.group(7, MeshAxis::dp), (std::vector<int>{5, 7}));
  const MeshShape big{3, 4, 5, true};
  for (int a = 0; a < kMeshAxes; ++a) {
    std::set<int> seen;
    for (int r = 0; r < big.world(); ++r) {
      EXPECT_EQ(big.rank_of(big.coord(r)), r);
      const std::vector<int> g = big.group(r, static_cast<MeshAxis>(a));
      EXPECT_EQ(static_cast<int>(g.size()), big.size(static_cast<MeshAxis>(a)));
      EXPECT_EQ(g[big.coord(r).at(static_cast<MeshAxis>(a))], r);
      seen.insert(*std::min_element(g.begin(), g.end()));
    }
    EXPECT_EQ(static_cast<int>(seen.size()), big.world() / big.size(static_cast<MeshAxis>(a)));
  }
}

// The fake world splits into the groups a real one would: each group's size and this
// rank's place in it, and a ledger of its own.
TEST(Mesh, FakeWorldSplitsIntoGroupCommunicators) {
  const MeshShape m{2, 4, 1, true};
  for (int r = 0; r < 8; ++r) {
    auto world = make_fake_communicator(8, r, nullptr);
    MeshComms c = make_mesh_comms(*world, m);
    EXPECT_EQ(c.group(MeshAxis::tp).world(), 4);
    EXPECT_EQ(c.group(MeshAxis::tp).rank(), r % 4);
    EXPECT_EQ(c.group(MeshAxis::dp).world(), 2);
    EXPECT_EQ(c.group(MeshAxis::dp).rank(), r / 4);
    EXPECT_EQ(c.group(MeshAxis::pp).world(), 1);
    EXPECT_TRUE(c.group(MeshAxis::tp).emulated());
    float x = 0.0f;
    c.group(MeshAxis::tp).all_reduce_sum(&x, 1);
    EXPECT_EQ(c.group(MeshAxis::tp).ledger().total_bytes(), 4);
    EXPECT_EQ(c.group(MeshAxis::dp).ledger().total_bytes(), 0);
    EXPECT_EQ(world->ledger().total_bytes(), 0);
  }
}

// Megatron's MLP split in two holds half the Linears' weights and the row Linears' whole
// biases: at most 0.6 of the one-rank model's parameters on each rank.
TEST(Mesh, TensorParallelHalvesTheParameters) {
  ModelConfig m;
  m.layers = 8;
  m.width = 256;
  const std::int64_t whole = make_model(m)->params();
  for (int r = 0; r < 2; ++r) {
    const std::int64_t slice = make_model(m, TensorParallel{2, r})->params();
    EXPECT_LE(static_cast<double>(slice), 0.6 * static_cast<double>(whole));
    std::int64_t forms = 0;
    for (std::int64_t e : tensor_parallel_mlp_tensors(m, 2)) forms += e;
    EXPECT_EQ(slice, forms);
  }
  // A slice starts as the one-rank model's elements.
  const auto whole_model = make_model(m);
  const std::vector<float> all = whole_model->init_flat_slice(3, 0, whole_model->params());
  for (int r = 0; r < 2; ++r) {
    const auto slice = make_model(m, TensorParallel{2, r});
    EXPECT_EQ(slice->init_flat_slice(3, 0, slice->params()), testing::pick(all, testing::full_indices(m, 2, r)));
  }
  m.layers = 3;
  EXPECT_THROW(check_mlp_tensor_parallel(m, 2), UsageError);
  m.layers = 4;
  m.width = 30;
  EXPECT_THROW(check_mlp_tensor_parallel(m, 4), UsageError);
}

void expect_every_rank_as_predicted(const RunConfig& cfg) {
  const int world = cfg.mesh.world();
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("--mesh " + cfg.mesh.text() + " " + std::string(strategy_name(cfg.strategy)) + " rank " +
                 std::to_string(rank));
    CpuBackend backend;
    auto fake = make_fake_communicator(world, rank, &backend);
    const testing::MeshResult r = testing::run_mesh(cfg, backend, *fake, false);
    const Prediction p = predict_data_parallel(cfg, world, rank);
    EXPECT_EQ(r.dp.resting, p.resting);
    EXPECT_EQ(r.dp.peak.total, p.peak_total);
    EXPECT_EQ(r.dp.peak.by_category, p.peak_by_category);
    EXPECT_EQ(std::string(phase_name(r.dp.peak.phase)), std::string(phase_name(p.peak_phase)));
    EXPECT_EQ(r.dp.where, p.peak_where);
    ASSERT_GT(r.dp.saved.bytes, 0);
    EXPECT_EQ(r.dp.saved.bytes, p.saved_after_forward_bytes);
    EXPECT_EQ(r.dp.saved.tensors, p.saved_after_forward_tensors);
    EXPECT_EQ(r.dp.ledger.total_bytes(), p.axis_comm_bytes[static_cast<int>(MeshAxis::dp)]);
    EXPECT_EQ(r.tp_ledger.total_bytes(), p.axis_comm_bytes[static_cast<int>(MeshAxis::tp)]);
    if (cfg.mesh.tp > 1) {
      EXPECT_GT(r.tp_ledger.total_bytes(), 0);
    }
    for (int k = 0; k < kCollKindCount; ++k)
      EXPECT_EQ(r.dp.ledger.by_kind[k].bytes + r.tp_ledger.by_kind[k].bytes, p.comm_bytes[k]) << kCollKindNames[k];
  }
}

TEST(Mesh, EveryEmulatedRankOfATensorParallelMlpIsPredicted) {
  const std::vector<MeshShape> meshes = {{2, 2, 1, true}, {1, 4, 1, true}, {4, 1, 1, true},
                                         {2, 4, 1, true}, {4, 2, 1, true}, {1, 8, 1, true}};
  for (const MeshShape& mesh : meshes)
    for (const char* strategy : {"ddp", "zero1"})
      for (int shape = 0; shape < 3; ++shape) {
        RunConfig cfg;
        cfg.mesh = mesh;
        cfg.steps = 2;
        cfg.strategy = parse_strategy(strategy);
        cfg.model.layers = shape == 2 ? 2 : 6;
        cfg.model.width = 64;
        cfg.model.batch = shape == 1 ? 3 : 8;
        cfg.model.activation = shape == 1 ? Activation::relu : Activation::none;
        cfg.model.loss = shape == 0 ? Loss::sum : Loss::mse;
        if (shape == 2) cfg.ddp_bucket = "copy";
        expect_every_rank_as_predicted(cfg);
      }
}

}  // namespace
}  // namespace shardscope
