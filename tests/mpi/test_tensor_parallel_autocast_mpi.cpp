// Tensor-parallel GPT-2 and Llama under --precision bf16 (autocast) over MPI at the world
// this binary was started with (W = 2, 3, 4 from ctest): every mesh of that world with
// tp = 2 or 4, ddp and zero1 (with --checkpoint full) along dp, flash and math, Llama with
// 4 kv heads and with one (replicated on every tp rank). Each
// step's loss is the one-rank bf16 model's on the rank's batch within bf16's rounding (a
// row-parallel output is each rank's partial product rounded to bf16, then summed in
// bf16: other roundings than the whole product's; measured within 1e-4 of the loss, held
// to 1e-3, a quarter of bf16's relative step); its bytes and each group's
// communication equal the closed forms, and the rank played alone (--emulate) holds and
// moves the same bytes.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "harness/comm/fake_comm.hpp"
#include "support/mesh_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

void expect_close_to_one_rank(const RunConfig& cfg, int world, int rank) {
  CpuBackend backend;
  auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
  const testing::MeshResult r = testing::run_mesh(cfg, backend, *comm, false);

  // The one-rank bf16 model on the data-parallel group's batches.
  RunConfig one = cfg;
  one.mesh = MeshShape{};
  std::vector<std::vector<float>> losses;
  testing::reference_training(one, cfg.mesh.dp, &losses);
  ASSERT_EQ(r.dp.losses.size(), losses.size());
  for (std::size_t s = 0; s < losses.size(); ++s) {
    const float want = losses[s][static_cast<std::size_t>(r.coord.dp)];
    ASSERT_GT(want, 0.0f);
    EXPECT_NEAR(r.dp.losses[s], want, 1e-3 * want) << "step " << s;
  }

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

  CpuBackend backend2;
  auto fake = make_fake_communicator(world, rank, &backend2);
  const testing::MeshResult e = testing::run_mesh(cfg, backend2, *fake, false);
  EXPECT_EQ(e.dp.peak.by_category, r.dp.peak.by_category);
  EXPECT_EQ(e.tp_ledger.total_bytes(), r.tp_ledger.total_bytes());
  EXPECT_EQ(e.dp.ledger.total_bytes(), r.dp.ledger.total_bytes());
}

TEST(TensorParallelAutocastMpi, Gpt2AndLlamaLossesAreTheOneRankBf16Models) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<MeshShape> meshes;
  for (int tp : {2, 4})
    if (world % tp == 0) meshes.push_back(MeshShape{world / tp, tp, 1, true});
  if (meshes.empty()) GTEST_SKIP() << "no tp of 2 or 4 divides W = " << world;
  for (const MeshShape& mesh : meshes)
    for (const char* family : {"gpt2", "llama", "llama mqa"})
      for (const char* strategy : {"ddp", "zero1"})
        for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
          RunConfig cfg;
          cfg.mesh = mesh;
          if (std::string(family) == "gpt2") {
            cfg.model = testing::gpt2_of(2, 16, 4, 24, 6, 2, mode, 0, 8);
          } else {
            // "llama mqa": one kv head, replicated on every tp rank.
            const bool mqa = std::string(family) == "llama mqa";
            cfg.model = testing::llama_of(2, 32, 8, mqa ? 1 : 4, 24, 24, 6, 2, mode, false);
            cfg.model.transformer.qkv_bias = cfg.model.transformer.out_bias = true;
          }
          cfg.model.autocast = true;
          cfg.precision = PrecisionKind::bf16;
          cfg.steps = 3;
          cfg.seed = 5;
          cfg.strategy = parse_strategy(strategy);
          if (std::string(strategy) == "zero1") cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::every, 1};
          SCOPED_TRACE(std::string(family) + " --mesh " + mesh.text() + " --precision bf16 " + strategy +
                       (mode == AttentionMode::flash ? " flash" : " math") + " rank " + std::to_string(rank));
          expect_close_to_one_rank(cfg, world, rank);
        }
}

}  // namespace
}  // namespace shardscope
