// Megatron's tensor parallelism of GPT-2 and Llama under --precision bf16 (the torch engine's
// autocast; docs/design.md, "Tensor parallelism under bf16"): every rank of dp=2,tp=2,
// tp=4 and dp=2,tp=4 meshes played alone (--emulate) against the closed forms
// (harness/predict/autocast_step.hpp and autocast_forms.hpp at tp), byte for byte and
// group by group: ddp and zero1 along dp, flash and math, --checkpoint full|every:2,
// --accumulate 3 with and without --no-sync; the row-parallel outputs all-reduced in bf16
// (the tp group moves fewer bytes than in fp32). tests/mpi/test_tensor_parallel_autocast_mpi.cpp
// trains the ranks together against the one-rank bf16 model.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "harness/comm/fake_comm.hpp"
#include "harness/model/models.hpp"
#include "shardscope/check.hpp"
#include "support/mesh_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::gpt2_of;
using testing::llama_of;

RunConfig bf16_mesh(const MeshShape& mesh, const char* strategy, const ModelConfig& model) {
  RunConfig cfg;
  cfg.mesh = mesh;
  cfg.steps = 2;
  cfg.strategy = parse_strategy(strategy);
  cfg.precision = PrecisionKind::bf16;
  cfg.model = model;
  cfg.model.autocast = true;
  return cfg;
}

void expect_every_rank_as_predicted(const RunConfig& cfg) {
  const int world = cfg.mesh.world();
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("--mesh " + cfg.mesh.text() + " " + std::string(strategy_name(cfg.strategy)) + " " +
                 cfg.model.name + " batch " + std::to_string(cfg.model.batch) + " " +
                 (cfg.model.transformer.attention == AttentionMode::flash ? "flash" : "math") + " --checkpoint " +
                 cfg.model.checkpoint.text() + " --accumulate " + std::to_string(cfg.accumulate) +
                 (cfg.no_sync ? " --no-sync" : "") + " rank " + std::to_string(rank));
    CpuBackend backend;
    auto fake = make_fake_communicator(world, rank, &backend);
    const testing::MeshResult r = testing::run_mesh(cfg, backend, *fake, false);
    const Prediction p = predict_data_parallel(cfg, world, rank);
    ASSERT_GT(r.dp.peak.by_category[Category::param_cast], 0);
    EXPECT_EQ(r.dp.resting, p.resting);
    EXPECT_EQ(r.dp.peak.total, p.peak_total);
    EXPECT_EQ(r.dp.peak.by_category, p.peak_by_category);
    EXPECT_EQ(std::string(phase_name(r.dp.peak.phase)), std::string(phase_name(p.peak_phase)));
    EXPECT_EQ(r.dp.where, p.peak_where);
    ASSERT_GT(r.dp.saved.bytes, 0);
    EXPECT_EQ(r.dp.saved.bytes, p.saved_after_forward_bytes);
    EXPECT_EQ(r.dp.saved.tensors, p.saved_after_forward_tensors);
    EXPECT_EQ(r.dp.ledger.total_bytes(), p.axis_comm_bytes[static_cast<int>(MeshAxis::dp)]);
    EXPECT_GT(r.tp_ledger.total_bytes(), 0);
    EXPECT_EQ(r.tp_ledger.total_bytes(), p.axis_comm_bytes[static_cast<int>(MeshAxis::tp)]);
    for (int k = 0; k < kCollKindCount; ++k)
      EXPECT_EQ(r.dp.ledger.by_kind[k].bytes + r.tp_ledger.by_kind[k].bytes, p.comm_bytes[k]) << kCollKindNames[k];
  }
}

const std::vector<MeshShape>& meshes() {
  static const std::vector<MeshShape> m = {{2, 2, 1, true}, {1, 4, 1, true}, {2, 4, 1, true}};
  return m;
}

// GPT-2: one sequence and several, a wide vocabulary (the head's widened weight), a narrow
// MLP (f < h), long sequences (math's probabilities), a narrow model over a wide
// vocabulary and long sequences (the loss's statistics beside the log-probabilities).
TEST(TensorParallelAutocast, EveryEmulatedRankOfAGpt2MeshIsPredicted) {
  const std::vector<ModelConfig> shapes = {
      gpt2_of(2, 32, 4, 64, 8, 1, AttentionMode::flash, 0, 12), gpt2_of(2, 32, 4, 64, 8, 3, AttentionMode::flash, 0, 12),
      gpt2_of(2, 32, 4, 1024, 8, 2, AttentionMode::flash, 0, 12), gpt2_of(2, 32, 4, 64, 8, 2, AttentionMode::flash, 16, 12),
      gpt2_of(2, 16, 4, 32, 48, 2, AttentionMode::flash, 0, 48), gpt2_of(2, 16, 4, 256, 32, 2, AttentionMode::flash, 0, 32)};
  for (const MeshShape& mesh : meshes())
    for (const char* strategy : {"ddp", "zero1"})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
        for (ModelConfig m : shapes) {
          m.transformer.attention = mode;
          expect_every_rank_as_predicted(bf16_mesh(mesh, strategy, m));
        }
}

// Llama: grouped-query attention split by heads, tied and untied heads, q/k/v and o_proj
// biases (o_proj's added in fp32 after the bf16 sum), a wide vocabulary, flash and math;
// a narrow layer over a wide vocabulary and long sequences.
TEST(TensorParallelAutocast, EveryEmulatedRankOfALlamaMeshIsPredicted) {
  for (const MeshShape& mesh : meshes())
    for (const char* strategy : {"ddp", "zero1"})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
        for (int variant = 0; variant < 3; ++variant) {
          ModelConfig m = llama_of(2, 32, 8, 4, 48, variant == 2 ? 960 : 64, 8, variant == 0 ? 1 : 3, mode,
                                   variant == 1);
          m.transformer.qkv_bias = m.transformer.out_bias = variant == 0;
          expect_every_rank_as_predicted(bf16_mesh(mesh, strategy, m));
        }
  for (const MeshShape& mesh : meshes())
    for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
      expect_every_rank_as_predicted(bf16_mesh(mesh, "ddp", llama_of(2, 16, 4, 4, 32, 256, 32, 2, mode, false)));
}

// --checkpoint full and every:2 (a wrapped block's casts held to the loss's end, its re-run
// all-reducing its bf16 outputs again), attention (each rank's heads' core recomputed in
// bf16), --accumulate 3 with and without --no-sync.
TEST(TensorParallelAutocast, EveryEmulatedRankOfACheckpointedOrAccumulatingMeshIsPredicted) {
  for (const MeshShape& mesh : {MeshShape{2, 2, 1, true}, MeshShape{1, 4, 1, true}})
    for (const char* strategy : {"ddp", "zero1"})
      for (const CheckpointPolicy& policy :
           {CheckpointPolicy{CheckpointKind::every, 1}, CheckpointPolicy{CheckpointKind::every, 2},
            CheckpointPolicy{CheckpointKind::attention, 1}})
        for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
          for (bool llama : {false, true}) {
            RunConfig cfg = bf16_mesh(mesh, strategy,
                                      llama ? llama_of(3, 32, 8, 4, 48, 64, 8, 2, mode, false)
                                            : gpt2_of(3, 32, 4, 64, 8, 2, mode, 0, 12));
            cfg.model.checkpoint = policy;
            expect_every_rank_as_predicted(cfg);
          }
  for (const char* strategy : {"ddp", "zero1"})
    for (bool no_sync : {false, true})
      for (bool llama : {false, true}) {
        RunConfig cfg = bf16_mesh(MeshShape{2, 2, 1, true}, strategy,
                                  llama ? llama_of(2, 32, 8, 4, 48, 64, 8, 3, AttentionMode::math, false)
                                        : gpt2_of(2, 32, 4, 64, 8, 3, AttentionMode::flash, 0, 12));
        cfg.accumulate = 3;
        cfg.no_sync = no_sync;
        expect_every_rank_as_predicted(cfg);
      }
}

// The row-parallel outputs go over the tp group in bf16 (2 B an element), the input
// gradients in fp32: a step of the same mesh moves a fewer bytes per block over tp than in
// fp32 (two (N, h) outputs at 2 B an element instead of 4), in as many calls.
TEST(TensorParallelAutocast, RowParallelOutputsAreAllReducedInBf16) {
  for (bool llama : {false, true}) {
    const ModelConfig m = llama ? llama_of(2, 32, 8, 4, 48, 64, 8, 2, AttentionMode::flash, false)
                                : gpt2_of(2, 32, 4, 64, 8, 2, AttentionMode::flash, 0, 12);
    RunConfig bf16 = bf16_mesh(MeshShape{1, 2, 1, true}, "ddp", m);
    RunConfig fp32 = bf16;
    fp32.precision = PrecisionKind::fp32;
    fp32.model.autocast = false;
    CpuBackend b1, b2;
    auto f1 = make_fake_communicator(2, 0, &b1);
    auto f2 = make_fake_communicator(2, 0, &b2);
    const testing::MeshResult half = testing::run_mesh(bf16, b1, *f1, false);
    const testing::MeshResult full = testing::run_mesh(fp32, b2, *f2, false);
    const std::int64_t a = 4 * static_cast<std::int64_t>(m.batch) * m.transformer.seq * m.transformer.hidden;
    ASSERT_GT(half.tp_ledger.total_bytes(), 0);
    EXPECT_EQ(full.tp_ledger.total_bytes() - half.tp_ledger.total_bytes(), a * m.transformer.layers);  // a step's ledger
    EXPECT_EQ(half.tp_ledger[CollKind::all_reduce].calls, full.tp_ledger[CollKind::all_reduce].calls);
  }
}

// Fewer kv heads than tp, replicated (one kv head a rank, its copies' k and v gradients
// all-reduced over tp in fp32): --kv-heads 2 at tp=4, 1 at tp=2 and tp=4 (with and without
// q/k/v biases), ddp and zero1, flash and math; a wide layer whose peak is the k and v
// gradients' temp beside k_proj's backward.
TEST(TensorParallelAutocast, EveryEmulatedRankWithReplicatedKvHeadsIsPredicted) {
  for (const MeshShape& mesh : {MeshShape{1, 4, 1, true}, MeshShape{2, 2, 1, true}, MeshShape{2, 4, 1, true}})
    for (int kv : {1, 2})
      for (const char* strategy : {"ddp", "zero1"})
        for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
          if (kv >= mesh.tp) continue;
          ModelConfig m = llama_of(2, 32, 8, kv, 48, 64, 8, 2, mode, kv == 1);
          m.transformer.qkv_bias = m.transformer.out_bias = std::string(strategy) == "ddp";
          expect_every_rank_as_predicted(bf16_mesh(mesh, strategy, m));
        }
  expect_every_rank_as_predicted(
      bf16_mesh(MeshShape{1, 4, 1, true}, "ddp", llama_of(2, 256, 4, 1, 16, 16, 2, 1, AttentionMode::flash, false)));
}

}  // namespace
}  // namespace shardscope
