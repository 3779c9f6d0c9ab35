// --precision bf16 under zero2/zero3 (FSDP1's MixedPrecision: bf16 gathers, fp32
// reduce-scatters; with --checkpoint, and --accumulate --no-sync) over MPI at the world this binary was started with (W = 2, 3, 4 from
// ctest): the MLP trains like one fp32 rank on the concatenated batch within bf16's
// rounding (the all-gathers move bf16 words between ranks: a wrong slot would be far off),
// every real rank's bytes equal the closed forms (harness/predict/mlp_fsdp_bf16_forms.hpp),
// and an emulated rank's equal the real rank's.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "harness/comm/mpi_comm.hpp"
#include "shardscope/comm.hpp"
#include "support/dp_harness.hpp"
#include "support/mesh_harness.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

// The norm of a - b over the norm of b.
double relative_norm(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0, n = 0.0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    d += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    n += b[i] * static_cast<double>(b[i]);
  }
  return std::sqrt(d / n);
}

// The bf16 all-gather: rank r's words land in slot r on every rank, blocking, posted and
// in place, in one MPI call and in pieces of 7 words (the path past MPI's int count); the ledger
// counts 2 B an element of the whole output.
TEST(FsdpBf16Mpi, Bf16AllGatherConcatenatesInRankOrder) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (std::size_t max_count : {std::size_t{1} << 30, std::size_t{7}}) {
    CpuBackend backend;
    auto comm = make_mpi_communicator(&backend, max_count);
    for (std::size_t sc : {std::size_t{1}, std::size_t{5}, std::size_t{33}}) {
      auto word = [](int r, std::size_t i) { return Bf16{static_cast<std::uint16_t>(0x3f80 + 97 * r + i)}; };
      std::vector<Bf16> mine(sc);
      for (std::size_t i = 0; i < sc; ++i) mine[i] = word(rank, i);
      for (int mode = 0; mode < 3; ++mode) {  // blocking, posted, in place (send: this rank's slot)
        std::vector<Bf16> recv(sc * world, Bf16{0xffff});
        const Bf16* send = mine.data();
        if (mode == 2) {
          std::copy(mine.begin(), mine.end(), recv.begin() + rank * sc);
          send = recv.data() + rank * sc;
        }
        comm->reset_ledger();
        if (mode == 1) {
          CommTicket t = comm->start_all_gather_bf16(send, recv.data(), sc);
          comm->wait(t);
        } else {
          comm->all_gather_bf16(send, recv.data(), sc);
        }
        for (int r = 0; r < world; ++r)
          for (std::size_t i = 0; i < sc; ++i)
            ASSERT_EQ(recv[r * sc + i].bits, word(r, i).bits)
                << "slot " << r << " word " << i << " sc=" << sc << " max_count=" << max_count;
        EXPECT_EQ(comm->ledger()[CollKind::all_gather].bytes, static_cast<std::int64_t>(2 * sc * world));
      }
    }
  }
}

TEST(FsdpBf16Mpi, MlpTrainsNearOneFp32RankAndMatchesTheClosedForms) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  struct Setting {
    const char* strategy;
    int units, prefetch;
    bool overlap;
    EngineKind engine;
    CheckpointPolicy checkpoint{};
  };
  const EngineKind torch = EngineKind::torch, fsdp2 = EngineKind::fsdp2;
  const CheckpointPolicy full{CheckpointKind::every, 1}, every2{CheckpointKind::every, 2};
  for (const Setting& s : std::vector<Setting>{{"zero3", 1, 1, true, torch},
                                               {"zero3", 1, 1, false, torch},
                                               {"zero2", 1, 1, true, torch},
                                               {"zero3", 0, 1, true, torch},
                                               {"zero3", 2, 0, false, torch},
                                               {"zero3", 1, 1, true, fsdp2},
                                               {"zero3", 1, 1, false, fsdp2},
                                               {"zero2", 2, 1, true, fsdp2},
                                               {"zero3", 1, 1, true, torch, full},
                                               {"zero2", 1, 1, false, torch, every2},
                                               {"zero3", 2, 1, true, fsdp2, full},
                                               {"zero2", 1, 0, false, fsdp2, every2}}) {
    RunConfig cfg;
    cfg.model.layers = 4;
    cfg.model.width = 37;  // units pad at W = 3 and 4
    cfg.model.batch = 6;
    cfg.model.activation = Activation::relu;
    cfg.model.loss = Loss::mse;
    cfg.model.param_bf16 = true;
    cfg.precision = PrecisionKind::bf16;
    cfg.steps = 3;
    cfg.seed = 11;
    cfg.strategy = parse_strategy(s.strategy);
    cfg.layers_per_unit = s.units;
    cfg.prefetch = s.prefetch;
    cfg.overlap = s.overlap;
    cfg.engine = s.engine;
    cfg.model.checkpoint = s.checkpoint;
    SCOPED_TRACE(std::string(engine_name(s.engine)) + " " + s.checkpoint.text() + " " + s.strategy + " units=" + std::to_string(s.units) + " prefetch=" +
                 std::to_string(s.prefetch) + (s.overlap ? " overlap" : "") + " W=" + std::to_string(world) +
                 " rank " + std::to_string(rank));
    CpuBackend backend;
    auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, true);
    RunConfig fp32 = cfg;
    fp32.precision = PrecisionKind::fp32;
    fp32.model.param_bf16 = false;
    const HostState ref = testing::reference_training(fp32, world);
    ASSERT_TRUE(testing::any_nonzero(ref.grads));
    ASSERT_TRUE(testing::any_nonzero(r.state.grads));
    const double grads = relative_norm(r.state.grads, ref.grads);
    // bf16's rounding after three steps (measured 3.2 % on the gradients, 0.18 % on the
    // parameters at W = 2); a unit gathered into the wrong slots would be off by its whole norm.
    EXPECT_LT(grads, 0.06);
    EXPECT_GT(grads, 0.0);  // and bf16's arithmetic
    EXPECT_LT(relative_norm(r.state.params, ref.params), 5e-3);

    const Prediction p = predict_data_parallel(cfg, world, rank);
    EXPECT_EQ(r.saved.bytes, p.saved_after_forward_bytes);
    EXPECT_EQ(r.resting, p.resting);
    for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
    ASSERT_TRUE(p.peak_known);
    EXPECT_EQ(r.peak.total, p.peak_total);
    EXPECT_EQ(r.peak.by_category, p.peak_by_category);
    EXPECT_EQ(std::string(phase_name(r.peak.phase)), std::string(phase_name(p.peak_phase)));
    EXPECT_EQ(r.where, p.peak_where);
    CpuBackend backend2;
    auto fake = make_fake_communicator(world, rank, &backend2);
    const auto e = testing::run_dp(cfg, backend2, *fake, false);
    EXPECT_EQ(e.resting, r.resting);
    EXPECT_EQ(e.peak.total, r.peak.total);
    EXPECT_EQ(e.peak.by_category, r.peak.by_category);
  }
}

// GPT-2's bf16 module (harness/model/gpt2_param_bf16.cpp) under FSDP1's MixedPrecision and
// fully_shard's MixedPrecisionPolicy: trains like one fp32 rank on the concatenated batch
// within bf16's rounding, and every real rank's bytes and communication equal the closed
// forms (harness/predict/param_bf16_forms.hpp).
TEST(FsdpBf16Mpi, Gpt2TrainsNearOneFp32RankAndMatchesTheClosedForms) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  struct Setting {
    const char* strategy;
    int units, prefetch;
    bool overlap;
    AttentionMode attention;
    EngineKind engine;
    CheckpointPolicy checkpoint{};
  };
  const CheckpointPolicy full{CheckpointKind::every, 1}, attention{CheckpointKind::attention, 0};
  const EngineKind torch = EngineKind::torch, fsdp2 = EngineKind::fsdp2;
  for (const Setting& s : std::vector<Setting>{{"zero3", 1, 1, true, AttentionMode::flash, torch},
                                               {"zero3", 1, 1, true, AttentionMode::math, torch, attention},
                                               {"zero2", 2, 1, false, AttentionMode::flash, fsdp2, attention},
                                               {"zero3", 1, 1, false, AttentionMode::math, torch},
                                               {"zero2", 1, 1, true, AttentionMode::flash, torch},
                                               {"zero3", 0, 1, true, AttentionMode::flash, torch},
                                               {"zero3", 2, 0, false, AttentionMode::flash, torch},
                                               {"zero3", 1, 1, true, AttentionMode::flash, fsdp2},
                                               {"zero2", 1, 1, false, AttentionMode::math, fsdp2},
                                               {"zero3", 1, 1, true, AttentionMode::flash, torch, full},
                                               {"zero3", 1, 1, true, AttentionMode::math, fsdp2, full}}) {
    RunConfig cfg;
    TransformerShape& t = cfg.model.transformer;
    t.model_type = "gpt2";
    t.layers = 2;
    t.hidden = 24;
    t.heads = 2;
    t.kv_heads = 2;
    t.head_dim = 12;
    t.ffn = 96;
    t.vocab = 37;  // units pad at W = 3 and 4
    t.seq = 6;
    t.positions = 6;
    t.tied_embeddings = t.qkv_bias = t.out_bias = true;
    t.attention = s.attention;
    cfg.model.name = "gpt2";
    cfg.model.layers = t.layers;
    cfg.model.width = t.hidden;
    cfg.model.batch = 2;
    cfg.model.param_bf16 = true;
    cfg.precision = PrecisionKind::bf16;
    cfg.steps = 3;
    cfg.seed = 11;
    cfg.strategy = parse_strategy(s.strategy);
    cfg.layers_per_unit = s.units;
    cfg.prefetch = s.prefetch;
    cfg.overlap = s.overlap;
    cfg.engine = s.engine;
    cfg.model.checkpoint = s.checkpoint;
    SCOPED_TRACE(std::string(engine_name(s.engine)) + " " + s.checkpoint.text() + " " + s.strategy + " units=" +
                 std::to_string(s.units) + " prefetch=" + std::to_string(s.prefetch) + (s.overlap ? " overlap" : "") + " W=" + std::to_string(world) +
                 " rank " + std::to_string(rank));
    CpuBackend backend;
    auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, true);
    RunConfig fp32 = cfg;
    fp32.precision = PrecisionKind::fp32;
    fp32.model.param_bf16 = false;
    const HostState ref = testing::reference_training(fp32, world);
    ASSERT_TRUE(testing::any_nonzero(ref.grads));
    ASSERT_TRUE(testing::any_nonzero(r.state.grads));
    const double grads = relative_norm(r.state.grads, ref.grads);
    // bf16's rounding after three steps; a unit gathered into the wrong slots would be off by
    // its whole norm.
    EXPECT_LT(grads, 0.08);
    EXPECT_GT(grads, 0.0);  // and bf16's arithmetic
    EXPECT_LT(relative_norm(r.state.params, ref.params), 5e-3);

    const Prediction p = predict_data_parallel(cfg, world, rank);
    EXPECT_EQ(r.saved.bytes, p.saved_after_forward_bytes);
    EXPECT_EQ(r.resting, p.resting);
    for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
    ASSERT_TRUE(p.peak_known);
    EXPECT_EQ(r.peak.total, p.peak_total);
    EXPECT_EQ(r.peak.by_category, p.peak_by_category);
    EXPECT_EQ(r.where, p.peak_where);
  }
}

// Llama's bf16 module (harness/model/llama_param_bf16.cpp: Hugging Face's module cast to bf16)
// under FSDP1's MixedPrecision and fully_shard's MixedPrecisionPolicy: grouped-query and
// multi-head attention, tied and untied, checkpointed (layers, attention cores): trains like one fp32 rank on the
// concatenated batch within bf16's rounding, and every real rank's bytes and communication
// equal the closed forms (harness/predict/llama_param_bf16_forms.cpp).
TEST(FsdpBf16Mpi, LlamaTrainsNearOneFp32RankAndMatchesTheClosedForms) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  struct Setting {
    const char* strategy;
    int units;
    bool overlap;
    AttentionMode attention;
    EngineKind engine;
    int kv_heads;
    bool tied;
    CheckpointPolicy checkpoint{};
  };
  const CheckpointPolicy full{CheckpointKind::every, 1}, core{CheckpointKind::attention, 1};
  const EngineKind torch = EngineKind::torch, fsdp2 = EngineKind::fsdp2;
  const AttentionMode flash = AttentionMode::flash, math = AttentionMode::math;
  for (const Setting& s : std::vector<Setting>{{"zero3", 1, true, flash, torch, 2, false},
                                               {"zero3", 1, false, math, torch, 4, true},
                                               {"zero2", 1, true, flash, torch, 4, false},
                                               {"zero3", 0, true, math, torch, 2, false},
                                               {"zero3", 1, true, flash, fsdp2, 2, true},
                                               {"zero2", 2, false, math, fsdp2, 2, false},
                                               {"zero3", 1, true, flash, torch, 2, false, full},
                                               {"zero3", 1, true, math, fsdp2, 4, true, full},
                                               {"zero3", 1, true, math, torch, 2, false, core},
                                               {"zero2", 1, false, flash, fsdp2, 2, true, core}}) {
    RunConfig cfg;
    TransformerShape& t = cfg.model.transformer;
    t.model_type = "llama";
    t.layers = 2;
    t.hidden = 24;
    t.heads = 4;
    t.kv_heads = s.kv_heads;
    t.head_dim = 6;
    t.ffn = 40;
    t.vocab = 37;  // units pad at W = 3 and 4
    t.seq = 6;
    t.positions = 6;
    t.tied_embeddings = s.tied;
    t.norm_eps = 1e-6f;
    t.attention = s.attention;
    cfg.model.name = "llama";
    cfg.model.layers = t.layers;
    cfg.model.width = t.hidden;
    cfg.model.batch = 2;
    cfg.model.param_bf16 = true;
    cfg.precision = PrecisionKind::bf16;
    cfg.steps = 3;
    cfg.seed = 11;
    cfg.strategy = parse_strategy(s.strategy);
    cfg.layers_per_unit = s.units;
    cfg.overlap = s.overlap;
    cfg.engine = s.engine;
    cfg.model.checkpoint = s.checkpoint;
    SCOPED_TRACE(std::string(engine_name(s.engine)) + " " + s.checkpoint.text() + " " + s.strategy + " units=" +
                 std::to_string(s.units) + (s.overlap ? " overlap" : "") + " K=" + std::to_string(s.kv_heads) +
                 (s.tied ? " tied" : "") + " W=" + std::to_string(world) + " rank " + std::to_string(rank));
    CpuBackend backend;
    auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, true);
    RunConfig fp32 = cfg;
    fp32.precision = PrecisionKind::fp32;
    fp32.model.param_bf16 = false;
    const HostState ref = testing::reference_training(fp32, world);
    ASSERT_TRUE(testing::any_nonzero(ref.grads));
    ASSERT_TRUE(testing::any_nonzero(r.state.grads));
    const double grads = relative_norm(r.state.grads, ref.grads);
    // bf16's rounding after three steps; a unit gathered into the wrong slots would be off by
    // its whole norm.
    EXPECT_LT(grads, 0.08);
    EXPECT_GT(grads, 0.0);  // and bf16's arithmetic
    EXPECT_LT(relative_norm(r.state.params, ref.params), 5e-3);

    const Prediction p = predict_data_parallel(cfg, world, rank);
    EXPECT_EQ(r.saved.bytes, p.saved_after_forward_bytes);
    EXPECT_EQ(r.resting, p.resting);
    for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
    ASSERT_TRUE(p.peak_known);
    EXPECT_EQ(r.peak.total, p.peak_total);
    EXPECT_EQ(r.peak.by_category, p.peak_by_category);
    EXPECT_EQ(r.where, p.peak_where);
  }
}

// --accumulate K --no-sync under bf16, both engines, the MLP, GPT-2 (math) and Llama (flash,
// grouped-query): FSDP1 keeps each
// unit's bf16 gradient across the micro-steps, fully_shard each tensor's in fp32, and the last
// micro-step reduce-scatters once in fp32; each trains like one fp32 rank on the ranks' K-fold
// batches concatenated within bf16's rounding, and every real rank's bytes, place and traffic
// equal the closed forms.
TEST(FsdpBf16Mpi, NoSyncTrainsNearOneFp32RankOnTheKFoldBatch) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (const char* family : {"mlp", "gpt2", "llama"})
    for (EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
      for (const char* strategy : {"zero2", "zero3"})
        for (int K : {2, 3}) {
          RunConfig cfg;
          const bool gpt2 = std::string(family) != "mlp";  // a transformer
          if (std::string(family) == "gpt2") {
            cfg.model = testing::transformer_model(
                "gpt2", testing::shape("gpt2", 2, 24, 2, 2, 96, 37, 6, AttentionMode::math), 2);
          } else if (gpt2) {
            cfg.model = testing::transformer_model(
                "llama", testing::shape("llama", 2, 16, 4, 2, 24, 31, 6, AttentionMode::flash), 2);
          } else {
            cfg.model.layers = 4;
            cfg.model.width = 37;  // units pad at W = 3 and 4
            cfg.model.batch = 6;
            cfg.model.activation = Activation::relu;
            cfg.model.loss = Loss::mse;  // a mean: the K-fold batch's gradient is the micro-steps' mean
          }
          cfg.model.param_bf16 = true;
          cfg.precision = PrecisionKind::bf16;
          cfg.steps = 3;
          cfg.seed = 13;
          cfg.strategy = parse_strategy(strategy);
          cfg.layers_per_unit = 1;
          cfg.engine = engine;
          cfg.accumulate = K;
          cfg.no_sync = true;
          SCOPED_TRACE(std::string(family) + " " + std::string(engine_name(engine)) + " " + strategy + " K=" +
                       std::to_string(K) + " W=" + std::to_string(world) + " rank " + std::to_string(rank));
          CpuBackend backend;
          auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
          const auto r = testing::run_dp(cfg, backend, *comm, true);
          RunConfig whole = cfg;
          whole.model.batch = K * cfg.model.batch;
          whole.accumulate = 1;
          whole.no_sync = false;
          whole.precision = PrecisionKind::fp32;
          whole.model.param_bf16 = false;
          const HostState ref = testing::reference_training(whole, world);
          ASSERT_TRUE(testing::any_nonzero(ref.grads));
          ASSERT_TRUE(testing::any_nonzero(r.state.grads));
          const double grads = relative_norm(r.state.grads, ref.grads);
          EXPECT_LT(grads, gpt2 ? 0.08 : 0.06);  // bf16's rounding; a lost micro-step is off by 1/K of the norm
          EXPECT_GT(grads, 0.0);
          EXPECT_LT(relative_norm(r.state.params, ref.params), 5e-3);
          const Prediction p = predict_data_parallel(cfg, world, rank);
          EXPECT_EQ(r.saved.bytes, p.saved_after_forward_bytes);
          EXPECT_EQ(r.resting, p.resting);
          for (int k = 0; k < kCollKindCount; ++k) EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]);
          ASSERT_TRUE(p.peak_known);
          EXPECT_EQ(r.peak.total, p.peak_total);
          EXPECT_EQ(r.peak.by_category, p.peak_by_category);
          EXPECT_EQ(r.where, p.peak_where);
        }
}

// HSDP under bf16 with every shard group that divides the world, both engines: trains near
// one fp32 rank, and each rank's bytes and both groups' communication are its forms.
TEST(FsdpBf16Mpi, HsdpTrainsNearOneFp32RankWithEveryShardGroup) {
  int world = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  for (int G = 1; G <= world; ++G)
    for (EngineKind engine : {EngineKind::torch, EngineKind::fsdp2}) {
      if (world % G != 0) continue;
      RunConfig cfg;
      cfg.model.layers = 4;
      cfg.model.width = 37;
      cfg.model.batch = 6;
      cfg.model.activation = Activation::relu;
      cfg.model.loss = Loss::mse;
      cfg.model.param_bf16 = true;
      cfg.precision = PrecisionKind::bf16;
      cfg.engine = engine;
      cfg.steps = 3;
      cfg.seed = 5;
      cfg.strategy = StrategyKind::zero3;
      cfg.layers_per_unit = 1;
      cfg.shard_group = G;
      SCOPED_TRACE("hsdp G=" + std::to_string(G) + " W=" + std::to_string(world) + " engine=" +
                   std::string(engine_name(engine)) + " rank " + std::to_string(rank));
      CpuBackend backend;
      auto comm = make_communicator(CommOptions{"mpi", 0, 0}, &backend);
      const testing::HsdpResult r = testing::run_hsdp(cfg, backend, *comm, true);
      RunConfig fp32 = cfg;
      fp32.shard_group = 0;
      fp32.precision = PrecisionKind::fp32;
      fp32.model.param_bf16 = false;
      const HostState ref = testing::reference_training(fp32, world);
      ASSERT_TRUE(testing::any_nonzero(ref.grads));
      const double grads = relative_norm(r.dp.state.grads, ref.grads);
      EXPECT_LT(grads, 0.06);
      EXPECT_GT(grads, 0.0);
      EXPECT_LT(relative_norm(r.dp.state.params, ref.params), 5e-3);
      const Prediction p = predict_data_parallel(cfg, world, rank);
      EXPECT_EQ(r.dp.resting, p.resting);
      EXPECT_EQ(r.dp.peak.total, p.peak_total);
      EXPECT_EQ(r.dp.peak.by_category, p.peak_by_category);
      EXPECT_EQ(r.replicate_ledger.total_bytes(), p.replicate_comm_bytes);
      for (int k = 0; k < kCollKindCount; ++k)
        EXPECT_EQ(r.dp.ledger.by_kind[k].bytes + r.replicate_ledger.by_kind[k].bytes, p.comm_bytes[k]);
    }
}

}  // namespace
}  // namespace shardscope
