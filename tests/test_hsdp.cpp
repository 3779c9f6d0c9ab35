// --strategy hsdp --shard-group G: every rank played alone (--emulate) at W = 4 and 8 with
// shard groups of 1, 2 and 4, on the MLP, GPT-2 and Llama, under the torch engine (FSDP1's
// flat units) and fsdp2 (fully_shard's per-tensor shards), holds the closed forms to the
// byte, the shard group's and the replicate group's communication apart.
#include <gtest/gtest.h>

#include "harness/comm/fake_comm.hpp"
#include "support/mesh_harness.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

void expect_every_rank_as_predicted(RunConfig cfg, int world, const std::string& label) {
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE(label + " W=" + std::to_string(world) + " G=" + std::to_string(cfg.shard_group) + " units=" +
                 std::to_string(cfg.layers_per_unit) + " rank " + std::to_string(rank));
    CpuBackend backend;
    auto fake = make_fake_communicator(world, rank, &backend);
    const testing::HsdpResult r = testing::run_hsdp(cfg, backend, *fake, false);
    const Prediction p = predict_data_parallel(cfg, world, rank);
    ASSERT_TRUE(p.peak_known);
    EXPECT_EQ(r.dp.resting, p.resting);
    EXPECT_EQ(r.dp.peak.total, p.peak_total);
    EXPECT_EQ(r.dp.peak.by_category, p.peak_by_category);
    EXPECT_EQ(r.dp.where, p.peak_where);
    EXPECT_EQ(r.dp.saved.bytes, p.saved_after_forward_bytes);
    EXPECT_EQ(r.replicate_ledger.total_bytes(), p.replicate_comm_bytes);
    if (world / cfg.shard_group > 1) {
      EXPECT_GT(r.replicate_ledger.total_bytes(), 0);
    }
    for (int k = 0; k < kCollKindCount; ++k)
      EXPECT_EQ(r.dp.ledger.by_kind[k].bytes + r.replicate_ledger.by_kind[k].bytes, p.comm_bytes[k])
          << kCollKindNames[k];
  }
}

std::vector<RunConfig> models() {
  std::vector<RunConfig> out;
  RunConfig mlp;
  mlp.model.layers = 4;
  mlp.model.width = 37;
  mlp.model.batch = 6;
  mlp.model.activation = Activation::relu;
  mlp.model.loss = Loss::mse;
  out.push_back(mlp);
  RunConfig gpt2;
  gpt2.model = testing::transformer_model("gpt2", testing::shape("gpt2", 2, 16, 2, 2, 64, 29, 6, AttentionMode::flash), 2);
  out.push_back(gpt2);
  RunConfig llama;
  llama.model =
      testing::transformer_model("llama", testing::shape("llama", 2, 16, 4, 2, 24, 29, 6, AttentionMode::math), 2);
  out.push_back(llama);
  return out;
}

TEST(Hsdp, EveryEmulatedRankIsPredicted) {
  for (RunConfig cfg : models())
    for (EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
      for (int world : {4, 8})
        for (int G : {1, 2, 4})
          for (int units : {0, 1}) {
            cfg.steps = 2;
            cfg.strategy = StrategyKind::zero3;
            cfg.engine = engine;
            cfg.shard_group = G;
            cfg.layers_per_unit = units;
            expect_every_rank_as_predicted(cfg, world, cfg.model.name + " engine=" + std::string(engine_name(engine)));
          }
}

// --accumulate K (syncing every micro-step, or the last under --no-sync) and --checkpoint
// (full, every:2, attention on the transformers) under HSDP: every emulated rank of W = 4
// and 8 with groups of 2 and 4 holds its forms; the replicas all-reduce once per
// reduce-scatter (K times, or once under --no-sync).
TEST(Hsdp, AccumulationAndCheckpointingHoldTheirForms) {
  const CheckpointPolicy policies[] = {{CheckpointKind::every, 1}, {CheckpointKind::every, 2},
                                       {CheckpointKind::attention, 1}};
  for (RunConfig cfg : models())
    for (int world : {4, 8})
      for (int G : {2, 4}) {
        cfg.steps = 2;
        cfg.strategy = StrategyKind::zero3;
        cfg.shard_group = G;
        cfg.layers_per_unit = 1;
        for (bool no_sync : {false, true}) {
          RunConfig fsdp2 = cfg;
          fsdp2.engine = EngineKind::fsdp2;
          fsdp2.accumulate = 2;
          fsdp2.no_sync = no_sync;
          expect_every_rank_as_predicted(fsdp2, world, cfg.model.name + " engine=fsdp2 K=2");
          RunConfig acc = cfg;
          acc.accumulate = 2;
          acc.no_sync = no_sync;
          expect_every_rank_as_predicted(acc, world, acc.model.name + (no_sync ? " K=2 no_sync" : " K=2"));
          RunConfig once = acc;
          once.accumulate = 1;
          once.no_sync = false;
          if (world / G > 1) {
            EXPECT_EQ(predict_data_parallel(acc, world, 0).replicate_comm_bytes,
                      (no_sync ? 1 : 2) * predict_data_parallel(once, world, 0).replicate_comm_bytes);
          }
        }
        for (const CheckpointPolicy& ck : policies) {
          if (ck.attention() && !cfg.model.is_transformer()) continue;
          RunConfig c = cfg;
          c.model.checkpoint = ck;
          expect_every_rank_as_predicted(c, world, c.model.name + " checkpoint=" + ck.text());
        }
      }
}

// HSDP at one shard group of the whole world is zero3; with groups of one it holds ddp's
// model states less nothing: the full model, its gradient and AdamW state, all-reduced.
TEST(Hsdp, ItsExtremesAreZero3AndReplication) {
  RunConfig cfg = models()[0];
  cfg.strategy = StrategyKind::zero3;
  cfg.layers_per_unit = 1;
  RunConfig z3 = cfg;
  cfg.shard_group = 4;
  EXPECT_EQ(predict_data_parallel(cfg, 4, 1).resting, predict_data_parallel(z3, 4, 1).resting);
  EXPECT_EQ(predict_data_parallel(cfg, 4, 1).comm_bytes, predict_data_parallel(z3, 4, 1).comm_bytes);
  cfg.shard_group = 1;
  const Prediction one = predict_data_parallel(cfg, 4, 3);
  EXPECT_EQ(one.replicate_comm_bytes, 4 * cfg.model.params());
  EXPECT_EQ(one.resting[Category::param], 4 * cfg.model.params());
}

}  // namespace
}  // namespace shardscope
