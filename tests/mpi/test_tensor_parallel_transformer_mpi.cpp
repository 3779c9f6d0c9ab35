// Tensor-parallel GPT-2 and Llama (grouped-query, untied, q/k/v biases) over MPI at the
// world this binary was started with (W = 2, 3, 4 from ctest): every mesh of that world
// with tp = 2 or 4 (the heads and kv heads divide by it), ddp, zero1 (with --checkpoint
// full: each block's forward and its all-reduces run again in backward) or zero3 (one
// block a unit) along dp, flash
// and math attention, trains like one rank on the
// data-parallel group's concatenated batch: each step's loss (the one-rank model's on the
// rank's batch), and each rank's slice of the
// parameters, gradients and AdamW state against the one-rank model's elements, within
// fp32's tolerance (the sums over the group run in another order); its bytes and each
// group's communication equal the closed forms, and the rank played alone (--emulate)
// holds the same bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include "harness/comm/fake_comm.hpp"
#include "support/mesh_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::pick;
using testing::worst_violation;

// Runs cfg's mesh over MPI_COMM_WORLD: each step's loss, and the rank's slice of the
// parameters, gradients and AdamW state, equal the one-rank model's on the
// data-parallel group's batches within fp32's tolerance; its bytes and each group's
// communication equal the closed forms; the rank played alone holds the same bytes.
void expect_trains_like_one_rank(const RunConfig& cfg, int world, int rank) {
  const MeshShape& mesh = cfg.mesh;
  CpuBackend backend;
  auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
  const testing::MeshResult r = testing::run_mesh(cfg, backend, *comm, true);

  // One rank on the data-parallel group's batches, the whole model.
  RunConfig one = cfg;
  one.mesh = MeshShape{};
  std::vector<std::vector<float>> losses;
  const HostState ref = testing::reference_training(one, mesh.dp, &losses);
  ASSERT_EQ(r.dp.losses.size(), losses.size());
  for (std::size_t s = 0; s < losses.size(); ++s) {
    const float want = losses[s][static_cast<std::size_t>(r.coord.dp)];
    ASSERT_GT(want, 0.0f);
    EXPECT_NEAR(r.dp.losses[s], want, 1e-5 * want) << "step " << s;
  }
  const std::vector<std::int64_t> at = testing::full_indices(cfg.model, mesh.tp, r.coord.tp);
  ASSERT_EQ(at.size(), r.dp.state.params.size());
  ASSERT_TRUE(any_nonzero(r.dp.state.grads));
  std::size_t i = 0;
  // A parameter's AdamW step, lr m / sqrt(v), carries its gradient's relative error:
  // near-zero gradients (summed over the group in another order) move a step by up
  // to 1e-3 of lr (measured 1.2e-6); atol is 1 % of lr.
  EXPECT_EQ(worst_violation(r.dp.state.params, pick(ref.params, at), 1e-5, 1e-5, &i), 0.0) << "params at " << i;
  EXPECT_EQ(worst_violation(r.dp.state.grads, pick(ref.grads, at), 1e-3, 1e-6, &i), 0.0) << "grads at " << i;
  EXPECT_EQ(worst_violation(r.dp.state.exp_avg, pick(ref.exp_avg, at), 1e-3, 1e-7, &i), 0.0) << "exp_avg at " << i;
  EXPECT_EQ(worst_violation(r.dp.state.exp_avg_sq, pick(ref.exp_avg_sq, at), 1e-3, 1e-12, &i), 0.0)
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

TEST(TensorParallelTransformerMpi, Gpt2AndLlamaMeshesTrainLikeOneRank) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<MeshShape> meshes;
  for (int tp : {2, 4})
    if (world % tp == 0) meshes.push_back(MeshShape{world / tp, tp, 1, true});
  if (meshes.empty()) GTEST_SKIP() << "no tp of 2 or 4 divides W = " << world;
  for (const MeshShape& mesh : meshes)
    for (const char* family : {"gpt2", "llama"})
      for (const char* strategy : {"ddp", "zero1", "zero3"})
        for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
          RunConfig cfg;
          cfg.mesh = mesh;
          if (std::string(family) == "gpt2") {
            cfg.model = testing::gpt2_of(2, 16, 4, 24, 6, 2, mode, 0, 8);
          } else {
            cfg.model = testing::llama_of(2, 32, 8, 4, 24, 24, 6, 2, mode, false);
            cfg.model.transformer.qkv_bias = true;
          }
          cfg.steps = 3;
          cfg.seed = 5;
          cfg.strategy = parse_strategy(strategy);
          cfg.layers_per_unit = 1;
          if (std::string(strategy) == "zero1") cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::every, 1};
          SCOPED_TRACE(std::string(family) + " --mesh " + mesh.text() + " " + strategy +
                       (mode == AttentionMode::flash ? " flash" : " math") + " rank " + std::to_string(rank));
          expect_trains_like_one_rank(cfg, world, rank);
        }
}

// --sp (Megatron's sequence parallelism): every mesh of the world with tp = 2 or 4,
// GPT-2 and Llama, ddp, zero1 (with --checkpoint full: each block's gathers and
// reduce-scatters again) and zero3 along dp, flash and math: the norms and residuals on
// each rank's seq/T tokens train like one rank (so like tp without --sp), and every
// figure is predicted.
TEST(TensorParallelTransformerMpi, SequenceParallelMeshesTrainLikeOneRank) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<MeshShape> meshes;
  for (int tp : {2, 4})
    if (world % tp == 0) meshes.push_back(MeshShape{world / tp, tp, 1, true});
  if (meshes.empty()) GTEST_SKIP() << "no tp of 2 or 4 divides W = " << world;
  for (const MeshShape& mesh : meshes)
    for (const char* family : {"gpt2", "llama"})
      for (const char* strategy : {"ddp", "zero1", "zero3"})
        for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
          RunConfig cfg;
          cfg.mesh = mesh;
          if (std::string(family) == "gpt2") {
            cfg.model = testing::gpt2_of(2, 16, 4, 24, 8, 2, mode, 0, 8);
          } else {
            cfg.model = testing::llama_of(2, 32, 8, 4, 24, 24, 8, 2, mode, false);
            cfg.model.transformer.qkv_bias = cfg.model.transformer.out_bias = true;
          }
          cfg.model.sequence_parallel = true;
          cfg.steps = 3;
          cfg.seed = 5;
          cfg.strategy = parse_strategy(strategy);
          cfg.layers_per_unit = 1;
          if (std::string(strategy) == "zero1") cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::every, 1};
          SCOPED_TRACE(std::string(family) + " --mesh " + mesh.text() + " --sp " + strategy +
                       (mode == AttentionMode::flash ? " flash" : " math") + " rank " + std::to_string(rank));
          expect_trains_like_one_rank(cfg, world, rank);
        }
}

// Llama's kv heads replicated when fewer than tp (--kv-heads 1 at tp = 2 and 4, 2 at tp =
// 4): ddp and zero3 along dp, flash and math, q/k/v biases: trains like one rank (each
// copy's gradient the sum over its T/K ranks: the one-rank model's head's), every figure
// predicted, and after the steps the T/K copies of each kv head are equal to the bit.
TEST(TensorParallelTransformerMpi, ReplicatedKvHeadsTrainLikeOneRankAndStayEqual) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  struct Case {
    int tp, kv;
  };
  std::vector<Case> cases;
  for (const Case& k : {Case{2, 1}, Case{4, 2}, Case{4, 1}})
    if (world % k.tp == 0) cases.push_back(k);
  if (cases.empty()) GTEST_SKIP() << "no tp of 2 or 4 divides W = " << world;
  for (const Case& k : cases)
    for (const char* strategy : {"ddp", "zero3"})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
        RunConfig cfg;
        cfg.mesh = MeshShape{world / k.tp, k.tp, 1, true};
        cfg.model = testing::llama_of(2, 32, 8, k.kv, 24, 24, 6, 2, mode, false);
        cfg.model.transformer.qkv_bias = true;
        cfg.steps = 3;
        cfg.seed = 5;
        cfg.strategy = parse_strategy(strategy);
        cfg.layers_per_unit = 1;
        SCOPED_TRACE("llama --kv-heads " + std::to_string(k.kv) + " --mesh " + cfg.mesh.text() + " " + strategy +
                     (mode == AttentionMode::flash ? " flash" : " math") + " rank " + std::to_string(rank));
        expect_trains_like_one_rank(cfg, world, rank);

        // Every rank's k_proj and v_proj (weights and biases) after the steps, gathered.
        CpuBackend backend;
        auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
        const testing::MeshResult r = testing::run_mesh(cfg, backend, *comm, true);
        const auto slice = make_model(cfg.model, TensorParallel{k.tp, r.coord.tp});
        std::vector<float> mine;
        for (int t = 0; t < slice->param_tensors(); ++t)
          if (slice->tensor(t).name.find("k_proj") != std::string::npos ||
              slice->tensor(t).name.find("v_proj") != std::string::npos)
            for (std::int64_t e = 0; e < slice->tensor_elems(t); ++e)
              mine.push_back(r.dp.state.params[static_cast<std::size_t>(slice->tensor_offset(t) + e)]);
        ASSERT_TRUE(any_nonzero(mine));
        const int n = static_cast<int>(mine.size());
        std::vector<float> all(static_cast<std::size_t>(n) * world);
        MPI_Allgather(mine.data(), n, MPI_FLOAT, all.data(), n, MPI_FLOAT, MPI_COMM_WORLD);
        // A rank's copy equals, bit for bit, that of every rank holding the same kv head.
        const int replicas = k.tp / k.kv;
        for (int other = 0; other < world; ++other) {
          const MeshCoord o = cfg.mesh.coord(other);
          if (o.tp / replicas != r.coord.tp / replicas) continue;
          EXPECT_EQ(std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(other) * n,
                                       all.begin() + static_cast<std::ptrdiff_t>(other + 1) * n),
                    mine)
              << "rank " << other << "'s copy";
        }
      }
}

}  // namespace
}  // namespace shardscope
