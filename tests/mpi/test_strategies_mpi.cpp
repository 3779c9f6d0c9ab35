// Data parallelism over MPI at the world this binary was started with (W = 2, 3, 4
// from ctest): every strategy trains like one rank on the concatenated batch, its
// bytes equal the closed forms, and an emulated rank's bytes equal the real rank's.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "harness/comm/fake_comm.hpp"
#include "harness/predict/autocast_forms.hpp"
#include "shardscope/comm.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::any_nonzero;
using testing::worst_violation;

struct Setting {
  std::string strategy;
  int layers_per_unit;
  int prefetch;
  Activation act;
  Loss loss;
  int layers = 4;  // 1: two tensors, so at W = 3, 4 some zero1 ranks own nothing, as torch allows
};

TEST(StrategiesMpi, TrainLikeOneRankAndMatchTheClosedForms) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const std::vector<Setting> settings = {
      {"ddp", 0, 1, Activation::none, Loss::sum},   {"zero1", 0, 1, Activation::none, Loss::sum},
      {"zero2", 0, 1, Activation::none, Loss::sum}, {"zero3", 0, 1, Activation::none, Loss::sum},
      {"zero2", 1, 1, Activation::relu, Loss::mse}, {"zero3", 1, 1, Activation::relu, Loss::mse},
      {"zero3", 2, 0, Activation::relu, Loss::mse}, {"zero1", 0, 1, Activation::relu, Loss::mse},
      {"ddp", 0, 1, Activation::relu, Loss::mse},   {"zero1", 0, 1, Activation::relu, Loss::mse, 1}};
  for (const Setting& s : settings) {
    RunConfig cfg;
    cfg.model.layers = s.layers;
    cfg.model.width = 37;  // P not a multiple of W: padding is exercised
    cfg.model.batch = 6;
    cfg.model.activation = s.act;
    cfg.model.loss = s.loss;
    cfg.steps = 3;
    cfg.seed = 11;
    cfg.strategy = parse_strategy(s.strategy);
    cfg.layers_per_unit = s.layers_per_unit;
    cfg.prefetch = s.prefetch;
    SCOPED_TRACE(s.strategy + " layers=" + std::to_string(s.layers) + " units=" + std::to_string(s.layers_per_unit) +
                 " W=" + std::to_string(world) +
                 " rank " + std::to_string(rank));
    CpuBackend backend;
    auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, true);

    const HostState ref = testing::reference_training(cfg, world);
    ASSERT_TRUE(any_nonzero(ref.grads));
    ASSERT_TRUE(any_nonzero(r.state.exp_avg));
    std::size_t at = 0;
    EXPECT_EQ(worst_violation(r.state.params, ref.params, 1e-5, 1e-7, &at), 0.0) << "params at " << at;
    EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
    EXPECT_EQ(worst_violation(r.state.exp_avg, ref.exp_avg, 1e-5, 1e-7, &at), 0.0) << "exp_avg at " << at;
    EXPECT_EQ(worst_violation(r.state.exp_avg_sq, ref.exp_avg_sq, 1e-5, 1e-9, &at), 0.0) << "exp_avg_sq at " << at;

    const Prediction p = predict_data_parallel(cfg, world, rank);
    EXPECT_EQ(r.resting, p.resting);
    EXPECT_EQ(r.peak.total, p.peak_total);
    EXPECT_EQ(r.peak.by_category, p.peak_by_category);
    for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);

    // The same rank played alone with the fake communicator holds the same bytes.
    CpuBackend backend2;
    auto fake = make_fake_communicator(world, rank, &backend2);
    RunConfig quick = cfg;
    const auto e = testing::run_dp(quick, backend2, *fake, false);
    EXPECT_EQ(e.resting, r.resting);
    EXPECT_EQ(e.peak.total, r.peak.total);
    EXPECT_EQ(e.peak.by_category, r.peak.by_category);
  }
}

// --overlap on against off (docs/design.md, "Overlap"): ddp's and zero1's buckets posted
// in backward (small buckets, so that several are in flight: views and torch's copied
// bucket), zero2/zero3's prefetch and reduce-scatters posted and waited for, under the
// torch and fsdp2 engines, with --accumulate adding onto the shard through a staging
// output held in flight; the MLP and GPT-2 (whose tied head writes the embedding's
// gradient from the top). Both train like one rank, to the same bits (the same
// collectives on the same data), hold the closed forms' bytes (which differ: a
// reduce-scatter in flight holds its input, a prefetched fsdp2 unit its flat buffer), and
// every collective's exposed_ms is within its ms.
TEST(StrategiesMpi, OverlapOnAndOffTrainAlikeAndMatchTheClosedForms) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  struct OverlapSetting {
    const char* strategy;
    const char* bucket;
    double bucket_mb;
    int units;
    bool gpt2;
    EngineKind engine = EngineKind::torch;
    int accumulate = 1;
  };
  const TransformerShape t = testing::shape("gpt2", 2, 16, 2, 2, 64, 29, 6, AttentionMode::flash);
  for (const OverlapSetting& o : std::vector<OverlapSetting>{{"ddp", "view", 0.002, 0, false},
                                                             {"ddp", "copy", 0.002, 0, false},
                                                             {"zero1", "view", 0.002, 0, false},
                                                             {"zero3", "view", 0.0, 1, false},
                                                             {"zero2", "view", 0.0, 1, false},
                                                             {"ddp", "view", 0.004, 0, true},
                                                             {"zero3", "view", 0.0, 1, true},
                                                             {"zero3", "view", 0.0, 1, false, EngineKind::torch, 2},
                                                             {"zero2", "view", 0.0, 2, false, EngineKind::torch, 3},
                                                             {"zero3", "view", 0.0, 1, false, EngineKind::fsdp2},
                                                             {"zero2", "view", 0.0, 1, false, EngineKind::fsdp2},
                                                             {"zero3", "view", 0.0, 1, false, EngineKind::fsdp2, 2},
                                                             {"zero3", "view", 0.0, 1, true, EngineKind::fsdp2},
                                                             {"zero2", "view", 0.0, 1, true, EngineKind::fsdp2}}) {
    RunConfig cfg;
    if (o.gpt2) {
      cfg.model = testing::transformer_model("gpt2", t, 2);
    } else {
      cfg.model.layers = 4;
      cfg.model.width = 37;
      cfg.model.batch = 6;
      cfg.model.activation = Activation::relu;
      cfg.model.loss = Loss::mse;
    }
    cfg.steps = 2;
    cfg.seed = 13;
    cfg.strategy = parse_strategy(o.strategy);
    cfg.ddp_bucket = o.bucket;
    cfg.bucket_mb = o.bucket_mb;
    cfg.layers_per_unit = o.units;
    cfg.engine = o.engine;
    cfg.accumulate = o.accumulate;
    std::vector<HostState> states;
    for (bool overlap : {true, false}) {
      cfg.overlap = overlap;
      SCOPED_TRACE(std::string(o.gpt2 ? "gpt2 " : "mlp ") + o.strategy + " engine=" +
                   std::string(engine_name(o.engine)) + " accumulate=" + std::to_string(o.accumulate) + " bucket=" +
                   o.bucket + " units=" + std::to_string(o.units) + (overlap ? " overlap on" : " overlap off") + " W=" +
                   std::to_string(world) + " rank " + std::to_string(rank));
      CpuBackend backend;
      auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
      const auto r = testing::run_dp(cfg, backend, *comm, true);
      RunConfig whole = cfg;  // --accumulate K: one step on the K-fold batch
      whole.model.batch = o.accumulate * cfg.model.batch;
      whole.accumulate = 1;
      const HostState ref = testing::reference_training(whole, world);
      ASSERT_TRUE(any_nonzero(ref.grads));
      std::size_t at = 0;
      EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
      EXPECT_EQ(worst_violation(r.state.params, ref.params, 1e-5, 4e-4, &at), 0.0) << "params at " << at;
      const Prediction p = predict_data_parallel(cfg, world, rank);
      EXPECT_EQ(r.resting, p.resting);
      EXPECT_EQ(r.peak.total, p.peak_total);
      EXPECT_EQ(r.peak.by_category, p.peak_by_category);
      EXPECT_EQ(r.where, p.peak_where);
      // The rank played alone holds the same bytes: its calls complete when posted, and
      // the buffers in flight are held until their wait all the same.
      CpuBackend backend2;
      auto fake = make_fake_communicator(world, rank, &backend2);
      const auto e = testing::run_dp(cfg, backend2, *fake, false);
      EXPECT_EQ(e.peak.total, r.peak.total);
      EXPECT_EQ(e.peak.by_category, r.peak.by_category);
      for (int k = 0; k < kCollKindCount; ++k) {
        const CollStats& st = r.ledger.by_kind[k];
        EXPECT_EQ(st.bytes, p.comm_bytes[k]) << kCollKindNames[k];
        EXPECT_GE(st.exposed_ms, 0.0) << kCollKindNames[k];
        EXPECT_LE(st.exposed_ms, st.ms) << kCollKindNames[k];
        if (!overlap) {
          EXPECT_EQ(st.exposed_ms, st.ms) << kCollKindNames[k];
        }
      }
      states.push_back(r.state);
    }
    ASSERT_EQ(states.size(), 2u);
    EXPECT_EQ(states[0].params, states[1].params);
    EXPECT_EQ(states[0].grads, states[1].grads);
  }
}

// A transformer's run under MPI at this world: it trains like one rank on the
// concatenated batch, its bytes equal the closed forms, and an emulated rank holds what
// the real one does.
void expect_transformer_trains_like_one_rank(const RunConfig& cfg, int world, int rank) {
  CpuBackend backend;
  auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
  const auto r = testing::run_dp(cfg, backend, *comm, true);
  const HostState ref = testing::reference_training(cfg, world);
  ASSERT_TRUE(any_nonzero(ref.grads));
  std::size_t at = 0;
  EXPECT_EQ(worst_violation(r.state.grads, ref.grads, 1e-5, 1e-7, &at), 0.0) << "grads at " << at;
  EXPECT_EQ(worst_violation(r.state.exp_avg, ref.exp_avg, 1e-5, 1e-7, &at), 0.0) << "exp_avg at " << at;
  // The key bias's gradient is zero in exact arithmetic (softmax ignores a constant
  // added to a row of scores): its fp32 gradient is rounding noise of 1e-9, which
  // AdamW's step g / (sqrt(v) + 1e-8) turns into up to lr / 10 per step either way.
  EXPECT_EQ(worst_violation(r.state.params, ref.params, 1e-5, 4e-4, &at), 0.0) << "params at " << at;

  const Prediction p = predict_data_parallel(cfg, world, rank);
  ASSERT_TRUE(p.peak_known);
  EXPECT_EQ(r.resting, p.resting);
  EXPECT_EQ(r.peak.total, p.peak_total);
  EXPECT_EQ(r.peak.by_category, p.peak_by_category);
  for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
  EXPECT_EQ(r.saved.bytes, p.saved_after_forward_bytes);
  EXPECT_EQ(r.saved.tensors, p.saved_after_forward_tensors);

  CpuBackend backend2;
  auto fake = make_fake_communicator(world, rank, &backend2);
  const auto e = testing::run_dp(cfg, backend2, *fake, false);
  EXPECT_EQ(e.saved.bytes, r.saved.bytes);
  EXPECT_EQ(e.saved.tensors, r.saved.tensors);
  EXPECT_EQ(e.resting, r.resting);
  EXPECT_EQ(e.peak.total, r.peak.total);
}

// ddp, zero1 and zero2/zero3 (one root unit, or units of blocks after a root of the
// embeddings and the final block), in both attention modes: cfg's strategy, units and
// attention set in turn.
void expect_every_strategy_trains_like_one_rank(RunConfig cfg) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  struct TransformerSetting {
    const char* strategy;
    int units;  // transformer blocks per FSDP unit; 0: one root unit
  };
  for (const TransformerSetting& setting : std::vector<TransformerSetting>{
           {"ddp", 0}, {"zero1", 0}, {"zero2", 0}, {"zero3", 0}, {"zero2", 1}, {"zero3", 1}, {"zero3", 2}}) {
    for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math}) {
      cfg.model.transformer.attention = mode;
      cfg.strategy = parse_strategy(setting.strategy);
      cfg.layers_per_unit = setting.units;
      SCOPED_TRACE(cfg.model.name + " " + setting.strategy + " units=" + std::to_string(setting.units) +
                   (mode == AttentionMode::flash ? " flash" : " math") + " W=" + std::to_string(world) + " rank " +
                   std::to_string(rank));
      expect_transformer_trains_like_one_rank(cfg, world, rank);
    }
  }
}

// GPT-2: the head tied to the token embedding, one tensor all-reduced and partitioned once.
TEST(StrategiesMpi, Gpt2TrainsLikeOneRank) {
  TransformerShape t;
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
  RunConfig cfg;
  cfg.model = testing::transformer_model("gpt2", t, 2);
  cfg.steps = 3;
  cfg.seed = 5;
  expect_every_strategy_trains_like_one_rank(cfg);
}

// Llama: grouped-query attention (4 heads, 2 kv heads), qwen2's q, k, v biases, RoPE; the
// head untied, then tied.
TEST(StrategiesMpi, LlamaTrainsLikeOneRank) {
  for (bool tied : {false, true}) {
    TransformerShape t;
    t.model_type = "qwen2";
    t.layers = 2;
    t.hidden = 16;
    t.heads = 4;
    t.kv_heads = 2;
    t.head_dim = 4;
    t.ffn = 24;
    t.vocab = 29;
    t.seq = 6;
    t.positions = 8;
    t.qkv_bias = true;
    t.tied_embeddings = tied;
    RunConfig cfg;
    cfg.model = testing::transformer_model("llama", t, 2);
    cfg.steps = 3;
    cfg.seed = 5;
    expect_every_strategy_trains_like_one_rank(cfg);
  }
}

// --checkpoint under MPI: GPT-2 under full checkpointing (zero3 over units of one
// block, flash), Llama under every:2 (ddp, math), and both (math) under attention
// (GPT-2 ddp, Llama zero3 over units of one block) train like one rank, and their
// bytes, saves and the peak's place ("recompute of block c" among them) equal the
// closed forms.
TEST(StrategiesMpi, CheckpointedTransformersTrainLikeOneRank) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  TransformerShape g;
  g.model_type = "gpt2";
  g.layers = 3, g.hidden = 16, g.heads = g.kv_heads = 2, g.head_dim = 8, g.ffn = 64, g.vocab = 29, g.seq = 6;
  g.positions = 8;
  g.tied_embeddings = g.qkv_bias = g.out_bias = true;
  TransformerShape l;
  l.model_type = "llama";
  l.layers = 3, l.hidden = 16, l.heads = 4, l.kv_heads = 2, l.head_dim = 4, l.ffn = 24, l.vocab = 29, l.seq = 6;
  l.positions = 8;
  l.attention = AttentionMode::math;
  TransformerShape gm = g;  // math, for --checkpoint attention
  gm.attention = AttentionMode::math;
  struct Case {
    const char* family;
    TransformerShape shape;
    CheckpointPolicy checkpoint;
    const char* strategy;
    int units;
  };
  const CheckpointPolicy attention{CheckpointKind::attention, 1};
  for (const Case& c : {Case{"gpt2", g, {CheckpointKind::every, 1}, "zero3", 1},
                        Case{"llama", l, {CheckpointKind::every, 2}, "ddp", 0}, Case{"gpt2", gm, attention, "ddp", 0},
                        Case{"llama", l, attention, "zero3", 1}}) {
    RunConfig cfg;
    cfg.model = testing::transformer_model(c.family, c.shape, 2);
    cfg.model.checkpoint = c.checkpoint;
    cfg.steps = 3;
    cfg.seed = 5;
    cfg.strategy = parse_strategy(c.strategy);
    cfg.layers_per_unit = c.units;
    SCOPED_TRACE(std::string(c.family) + " checkpoint=" + cfg.model.checkpoint.text() + " " + c.strategy +
                 " W=" + std::to_string(world) + " rank " + std::to_string(rank));
    expect_transformer_trains_like_one_rank(cfg, world, rank);
    CpuBackend backend;
    auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.where, predict_data_parallel(cfg, world, rank).peak_where);
  }
}

// The norm of a - b over the norm of b.
double relative_norm(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0, n = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    d += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    n += b[i] * static_cast<double>(b[i]);
  }
  return std::sqrt(d / n);
}

// GPT-2 and Llama under autocast(bfloat16) (ModelConfig::autocast) through ddp and zero1
// over MPI: they train like one rank under autocast on the concatenated batch, each rank
// saves its autocast form, rests and communicates what the fp32 forms predict, peaks
// where and as high as the bf16 step's form says, and an emulated rank holds what the
// real one does, peak included. A rank's loss is scaled by
// 1 / its tokens, the reference's by 1 / all of them: at W = 2 and 4 a power of two
// apart, so every bf16 rounding of a gradient agrees and only the fp32 sums over ranks
// differ (a norm bound of 1e-4); at W = 3 each rounding moves, and the two agree to
// bf16's precision (measured 0.36 % on the gradients, 0.14 % on the parameters).
TEST(StrategiesMpi, AutocastTransformersTrainLikeOneRank) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  TransformerShape g;
  g.model_type = "gpt2";
  g.layers = 2, g.hidden = 16, g.heads = g.kv_heads = 2, g.head_dim = 8, g.ffn = 64, g.vocab = 29, g.seq = 6;
  g.positions = 8;
  g.tied_embeddings = g.qkv_bias = g.out_bias = true;
  TransformerShape l;
  l.model_type = "qwen2";
  l.layers = 2, l.hidden = 16, l.heads = 4, l.kv_heads = 2, l.head_dim = 4, l.ffn = 24, l.vocab = 29, l.seq = 6;
  l.positions = 8;
  l.qkv_bias = true;
  for (const auto& [family, shape] : {std::pair{"gpt2", g}, std::pair{"llama", l}})
    for (const char* strategy : {"ddp", "zero1"})
      for (AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
        for (bool recompute : {false, true}) {  // --checkpoint attention
          RunConfig cfg;
          cfg.model = testing::transformer_model(family, shape, 2);
          cfg.model.transformer.attention = mode;
          cfg.model.autocast = true;
          if (recompute) cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::attention, 1};
          cfg.steps = 3;
          cfg.seed = 5;
          cfg.strategy = parse_strategy(strategy);
          SCOPED_TRACE(std::string(family) + " " + strategy + (mode == AttentionMode::flash ? " flash" : " math") +
                       (recompute ? " --checkpoint attention" : "") + " W=" + std::to_string(world) + " rank " +
                       std::to_string(rank));
          CpuBackend backend;
          auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
          const auto r = testing::run_dp(cfg, backend, *comm, true);
          const HostState ref = testing::reference_training(cfg, world);
          ASSERT_TRUE(any_nonzero(ref.grads));
          const bool power_of_two = (world & (world - 1)) == 0;
          EXPECT_LT(relative_norm(r.state.grads, ref.grads), power_of_two ? 1e-4 : 1e-2);
          EXPECT_LT(relative_norm(r.state.params, ref.params), power_of_two ? 1e-5 : 5e-3);

          const CheckpointPolicy& ck = cfg.model.checkpoint;
          const AutocastSaved form = std::string(family) == "gpt2"
                                         ? gpt2_saved_after_forward_autocast(cfg.model.transformer, 2, ck)
                                         : llama_saved_after_forward_autocast(cfg.model.transformer, 2, ck);
          EXPECT_EQ(r.saved.bytes, form.total().bytes);
          EXPECT_EQ(r.saved.tensors, form.total().tensors);
          const Prediction p = predict_data_parallel(cfg, world, rank);
          EXPECT_EQ(r.resting, p.resting);
          for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
          // The bf16 step's peak (autocast_step.hpp): total, per category, phase and place.
          ASSERT_TRUE(p.peak_known);
          EXPECT_EQ(r.peak.total, p.peak_total);
          EXPECT_EQ(r.peak.by_category, p.peak_by_category);
          EXPECT_EQ(std::string(phase_name(r.peak.phase)), std::string(phase_name(p.peak_phase)));
          EXPECT_EQ(r.where, p.peak_where);

          CpuBackend backend2;
          auto fake = make_fake_communicator(world, rank, &backend2);
          const auto e = testing::run_dp(cfg, backend2, *fake, false);
          EXPECT_EQ(e.saved.bytes, r.saved.bytes);
          EXPECT_EQ(e.resting, r.resting);
          EXPECT_EQ(e.peak.total, r.peak.total);
          EXPECT_EQ(e.peak.by_category, r.peak.by_category);
        }
}

}  // namespace
}  // namespace shardscope
