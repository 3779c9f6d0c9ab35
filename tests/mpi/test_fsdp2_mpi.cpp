// --engine fsdp2 over MPI at the world this binary was started with (W = 2, 3, 4 from
// ctest): zero2 and zero3 as fully_shard train like one rank on the concatenated batch,
// their bytes equal the closed forms (harness/predict/fsdp2_forms.hpp), and an emulated
// rank's bytes equal the real rank's. The MLP, GPT-2 and Llama (the transformers' step
// peaks too: harness/predict/transformer_step.hpp with fsdp2's buffers); the MLP
// checkpointed too (full, every:2, every:3).
#include <gtest/gtest.h>
#include <mpi.h>

#include "harness/comm/fake_comm.hpp"
#include "shardscope/comm.hpp"
#include "support/dp_harness.hpp"
#include "support/pipeline_configs.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

void check_against_one_rank(const RunConfig& cfg, double params_abs) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  CpuBackend backend;
  auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
  const auto r = testing::run_dp(cfg, backend, *comm, true);
  const HostState ref = testing::reference_training(cfg, world);
  ASSERT_TRUE(any_nonzero(ref.grads));
  ASSERT_TRUE(any_nonzero(r.state.exp_avg));
  std::size_t at = 0;
  EXPECT_EQ(worst_violation(r.state.params, ref.params, 1e-5, params_abs, &at), 0.0) << "params at " << at;
  EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
  EXPECT_EQ(worst_violation(r.state.exp_avg, ref.exp_avg, 1e-5, 1e-7, &at), 0.0) << "exp_avg at " << at;
  EXPECT_EQ(worst_violation(r.state.exp_avg_sq, ref.exp_avg_sq, 1e-5, 1e-9, &at), 0.0) << "exp_avg_sq at " << at;

  const Prediction p = predict_data_parallel(cfg, world, rank);
  EXPECT_EQ(r.resting, p.resting);
  for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
  EXPECT_TRUE(p.peak_known);
  EXPECT_EQ(r.peak.total, p.peak_total);
  EXPECT_EQ(r.peak.by_category, p.peak_by_category);
  EXPECT_EQ(r.where, p.peak_where);
  CpuBackend backend2;
  auto fake = make_fake_communicator(world, rank, &backend2);
  const auto e = testing::run_dp(cfg, backend2, *fake, false);
  EXPECT_EQ(e.resting, r.resting);
  EXPECT_EQ(e.peak.total, r.peak.total);
  EXPECT_EQ(e.peak.by_category, r.peak.by_category);
}

TEST(Fsdp2Mpi, MlpTrainsLikeOneRankAndMatchesTheClosedForms) {
  struct Setting {
    const char* strategy;
    int units;
    int prefetch;
    int checkpoint_every;  // 0: none
  };
  for (const Setting& s : std::vector<Setting>{{"zero2", 0, 1, 0},
                                               {"zero3", 0, 1, 0},
                                               {"zero2", 1, 1, 0},
                                               {"zero3", 1, 1, 0},
                                               {"zero3", 2, 0, 0},
                                               {"zero3", 1, 1, 1},
                                               {"zero2", 2, 1, 2},
                                               {"zero3", 2, 0, 3}}) {
    RunConfig cfg;
    cfg.model.layers = 4;
    cfg.model.width = 37;  // 37 rows: uneven chunks at W = 2, 3, 4
    cfg.model.batch = 6;
    cfg.model.activation = Activation::relu;
    cfg.model.loss = Loss::mse;
    cfg.steps = 3;
    cfg.seed = 11;
    cfg.strategy = parse_strategy(s.strategy);
    cfg.engine = EngineKind::fsdp2;
    cfg.layers_per_unit = s.units;
    cfg.prefetch = s.prefetch;
    if (s.checkpoint_every > 0) cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::every, s.checkpoint_every};
    SCOPED_TRACE(std::string(s.strategy) + " units=" + std::to_string(s.units) + " checkpoint=" +
                 cfg.model.checkpoint.text());
    check_against_one_rank(cfg, 1e-7);
  }
}

TEST(Fsdp2Mpi, Gpt2TrainsLikeOneRank) {
  for (const char* strategy : {"zero2", "zero3"})
    for (int units : {0, 1}) {
      RunConfig cfg;
      ModelConfig& m = cfg.model;
      m.name = "gpt2";
      m.layers = 2;
      m.width = 16;
      m.batch = 2;
      TransformerShape& t = m.transformer;
      t.model_type = "gpt2";
      t.layers = 2;
      t.hidden = 16;
      t.heads = t.kv_heads = 2;
      t.head_dim = 8;
      t.ffn = 64;
      t.vocab = 29;
      t.seq = 6;
      t.positions = 8;
      t.tied_embeddings = t.qkv_bias = t.out_bias = true;
      cfg.steps = 3;
      cfg.seed = 5;
      cfg.strategy = parse_strategy(strategy);
      cfg.engine = EngineKind::fsdp2;
      cfg.layers_per_unit = units;
      SCOPED_TRACE(std::string("gpt2 ") + strategy + " units=" + std::to_string(units));
      // The key bias's gradient is rounding noise (test_strategies_mpi.cpp says why).
      check_against_one_rank(cfg, 4e-4);
    }
}

TEST(Fsdp2Mpi, LlamaTrainsLikeOneRank) {
  struct Setting {
    const char* strategy;
    int units;
    int prefetch;
    bool tied;
    int checkpoint_every;  // 0: none
  };
  for (const Setting& s : std::vector<Setting>{
           {"zero2", 0, 1, false, 0}, {"zero3", 1, 1, false, 0}, {"zero3", 1, 0, true, 0}, {"zero3", 1, 1, false, 2}})
    for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
      RunConfig cfg;
      // Grouped-query (4 heads, 2 kv heads); 13 tokens and 24 ffn rows split unevenly.
      cfg.model = testing::llama_of(2, 16, 4, 2, 24, 13, 6, 2, mode, s.tied);
      cfg.steps = 3;
      cfg.seed = 5;
      cfg.strategy = parse_strategy(s.strategy);
      cfg.engine = EngineKind::fsdp2;
      cfg.layers_per_unit = s.units;
      cfg.prefetch = s.prefetch;
      if (s.checkpoint_every > 0) {
        cfg.model.checkpoint.kind = CheckpointKind::every;
        cfg.model.checkpoint.every = s.checkpoint_every;
      }
      SCOPED_TRACE(std::string("llama ") + cfg.model.checkpoint.text() + " " + s.strategy + " units=" + std::to_string(s.units) +
                   " prefetch=" + std::to_string(s.prefetch) + (s.tied ? " tied" : "") +
                   (mode == AttentionMode::flash ? " flash" : " math"));
      check_against_one_rank(cfg, 4e-4);
    }
}

}  // namespace
}  // namespace shardscope
