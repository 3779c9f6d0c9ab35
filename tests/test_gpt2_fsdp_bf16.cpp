// GPT-2 under --precision bf16 with zero2/zero3/hsdp: FSDP1's MixedPrecision(param_dtype=bf16,
// reduce_dtype=fp32) (harness/strategies/fsdp.hpp), and fully_shard's MixedPrecisionPolicy
// under --engine fsdp2 (fsdp2.hpp), on nanoGPT's module in bf16
// (harness/model/gpt2_param_bf16.cpp). What it saves equals what torch 2.15 saves on the
// module cast to bf16 (bench/torch_saved.py --precision module) and the closed form; every
// emulated rank measures what the closed forms predict (harness/predict/param_bf16_forms.cpp
// and the transformer step's walk); its gradients are fp32's within bf16's rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "harness/comm/fake_comm.hpp"
#include "harness/predict/param_bf16_forms.hpp"
#include "support/mesh_harness.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

using testing::mode_name;

struct Shape {
  int layers, hidden, heads, vocab, seq, batch;
};

// ffn 0: nanoGPT's 4h.
ModelConfig gpt2_model(const Shape& s, AttentionMode mode, int ffn = 0) {
  const TransformerShape t =
      testing::shape("gpt2", s.layers, s.hidden, s.heads, s.heads, ffn > 0 ? ffn : 4 * s.hidden, s.vocab, s.seq, mode);
  return testing::transformer_model("gpt2", t, s.batch);
}

RunConfig fsdp_bf16(const ModelConfig& model, const char* strategy, int units, EngineKind engine = EngineKind::torch) {
  RunConfig cfg;
  cfg.engine = engine;
  cfg.model = model;
  cfg.steps = 2;
  cfg.seed = 5;
  cfg.strategy = parse_strategy(strategy);
  cfg.layers_per_unit = units;
  cfg.precision = PrecisionKind::bf16;
  cfg.model.param_bf16 = true;  // FSDP's MixedPrecision (the CLI's to_config sets it)
  return cfg;
}

// torch 2.15's figures on nanoGPT's module after module.to(torch.bfloat16) (FSDP's
// MixedPrecision gathers bf16 parameters and runs no autocast): unique storages saved for
// backward after forward + loss, parameters excluded, by bench/torch_saved.py --precision module:
//   --layers 2 --hidden 64 --heads 4 --vocab 100 --seq 16 --batch 2
//     module math torch 187906 B in 39 storages / module flash torch 147970 B in 35 storages
//   --layers 3 --hidden 96 --heads 6 --vocab 257 --seq 24 --batch 3
//     module math torch 980402 B in 54 storages / module flash torch 736754 B in 48 storages
//   --layers 2 --hidden 48 --heads 3 --vocab 50 --seq 12 --batch 1
//     module math torch 51266 B in 39 storages / module flash torch 41186 B in 35 storages
struct TorchSaved {
  Shape shape;
  AttentionMode mode;
  std::int64_t bytes;
  int storages;
};
const TorchSaved kTorchModule[] = {
    {{2, 64, 4, 100, 16, 2}, AttentionMode::math, 187906, 39},
    {{2, 64, 4, 100, 16, 2}, AttentionMode::flash, 147970, 35},
    {{3, 96, 6, 257, 24, 3}, AttentionMode::math, 980402, 54},
    {{3, 96, 6, 257, 24, 3}, AttentionMode::flash, 736754, 48},
    {{2, 48, 3, 50, 12, 1}, AttentionMode::math, 51266, 39},
    {{2, 48, 3, 50, 12, 1}, AttentionMode::flash, 41186, 35},
};

TEST(Gpt2FsdpBf16, SavesWhatTorchsBf16ModuleSavesAfterForward) {
  for (const TorchSaved& c : kTorchModule) {
    SCOPED_TRACE(std::string(mode_name(c.mode)) + " L=" + std::to_string(c.shape.layers) + " h=" +
                 std::to_string(c.shape.hidden) + " B=" + std::to_string(c.shape.batch));
    RunConfig cfg = fsdp_bf16(gpt2_model(c.shape, c.mode), "zero3", 1);
    cfg.steps = 1;
    CpuBackend backend;
    auto comm = make_fake_communicator(2, 1, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.saved.bytes, c.bytes);
    EXPECT_EQ(r.saved.tensors, c.storages);
    const SavedForm form = gpt2_saved_after_forward_param_bf16(cfg.model.transformer, c.shape.batch);
    EXPECT_EQ(form.bytes, c.bytes);
    EXPECT_EQ(form.tensors, c.storages);
    ASSERT_EQ(r.losses.size(), 1u);
    EXPECT_NEAR(r.losses[0], std::log(static_cast<float>(c.shape.vocab)), 0.1f);
    EXPECT_EQ(r.resting[Category::activation], 0);
    EXPECT_EQ(r.resting[Category::temp], 0);
  }
}

// Both engines (FSDP1's MixedPrecision, fully_shard's MixedPrecisionPolicy); zero2 and zero3;
// the root unit alone, units of one and two blocks; prefetch and overlap on and off; flash and
// math: every rank of W = 1 to 4, on a vocabulary and widths whose units pad at W = 3 and 4.
TEST(Gpt2FsdpBf16, MeasuredEqualsPredictedOnEveryRank) {
  int checked = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const char* strategy : {"zero2", "zero3"})
      for (int units : {0, 1, 2})
        for (int setting = 0; setting < 3; ++setting)  // prefetch + overlap, prefetch blocking, neither
          for (int world : {1, 2, 3, 4})
            for (int rank = 0; rank < world; ++rank) {
              RunConfig cfg = fsdp_bf16(gpt2_model({3, 24, 2, 37, 6, 2}, mode), strategy, units, engine);
              cfg.prefetch = setting < 2 ? 1 : 0;
              cfg.overlap = setting == 0;
              SCOPED_TRACE(std::string(engine_name(engine)) + " " + mode_name(mode) + " " + strategy + " units=" + std::to_string(units) +
                           " setting=" + std::to_string(setting) + " W=" + std::to_string(world) + " r=" +
                           std::to_string(rank));
              testing::expect_rank_measured_equals_predicted(cfg, world, rank);
              ++checked;
            }
  EXPECT_EQ(checked, 2 * 2 * 2 * 3 * 3 * 10);
}

// --accumulate K, every micro-step reducing: a later micro-step's reduce-scatter writes a
// staging shard added onto the gradient; every rank of W = 1 to 4, the gathers and
// reduce-scatters K times one micro-step's.
TEST(Gpt2FsdpBf16, AccumulationReducesEveryMicroStepAsPredicted) {
  int checked = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
  for (const char* strategy : {"zero2", "zero3"})
    for (int K : {2, 3})
      for (bool overlap : {true, false})
        for (int world : {1, 2, 3, 4})
          for (int rank = 0; rank < world; ++rank) {
            RunConfig cfg = fsdp_bf16(gpt2_model({2, 16, 2, 29, 4, 1}, AttentionMode::flash), strategy, 1, engine);
            cfg.accumulate = K;
            cfg.overlap = overlap;
            SCOPED_TRACE(std::string(engine_name(engine)) + " " + strategy + " K=" + std::to_string(K) + (overlap ? " overlap" : "") + " W=" +
                         std::to_string(world) + " r=" + std::to_string(rank));
            testing::expect_rank_measured_equals_predicted(cfg, world, rank);
            RunConfig one = cfg;
            one.accumulate = 1;
            const Prediction pk = predict_data_parallel(cfg, world, rank), p1 = predict_data_parallel(one, world, rank);
            for (CollKind kind : {CollKind::all_gather, CollKind::reduce_scatter})
              EXPECT_EQ(pk.comm_bytes[static_cast<int>(kind)], K * p1.comm_bytes[static_cast<int>(kind)]);
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 2 * 2 * 2 * 10);
}

// --accumulate K --no-sync: FSDP1 keeps each unit's bf16 full gradient across the
// micro-steps (later backwards adding onto it; zero2 keeping the units gathered) and reduces
// its fp32 cast once; fully_shard keeps each tensor's gradient in fp32, each micro-step's bf16
// ones folded in when the unit's backward ends. Both engines, flash and math, units of one and
// two blocks, overlap on and off, every rank of W = 1 to 4; the reduce-scatters one
// micro-step's bytes, the all-gathers as often as the units are gathered.
TEST(Gpt2FsdpBf16, NoSyncKeepsGradientsAsPredicted) {
  int checked = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
    for (const char* strategy : {"zero2", "zero3"})
      for (int K : {2, 3})
        for (int units : {1, 2})
          for (bool overlap : {true, false})
            for (int world : {1, 2, 3, 4})
              for (int rank = 0; rank < world; ++rank) {
                const AttentionMode mode = overlap ? AttentionMode::flash : AttentionMode::math;
                RunConfig cfg = fsdp_bf16(gpt2_model({3, 16, 2, 29, 4, 1}, mode), strategy, units, engine);
                cfg.accumulate = K;
                cfg.no_sync = true;
                cfg.overlap = overlap;
                SCOPED_TRACE(std::string(engine_name(engine)) + " " + strategy + " K=" + std::to_string(K) +
                             " units=" + std::to_string(units) + (overlap ? " overlap flash" : " math") + " W=" +
                             std::to_string(world) + " r=" + std::to_string(rank));
                testing::expect_rank_measured_equals_predicted(cfg, world, rank);
                RunConfig one = cfg;
                one.accumulate = 1;
                one.no_sync = false;
                const Prediction pk = predict_data_parallel(cfg, world, rank), p1 = predict_data_parallel(one, world, rank);
                const bool gathered_once = engine == EngineKind::torch && std::string(strategy) == "zero2";
                EXPECT_EQ(pk.comm_bytes[static_cast<int>(CollKind::all_gather)],
                          (gathered_once ? 1 : K) * p1.comm_bytes[static_cast<int>(CollKind::all_gather)]);
                EXPECT_EQ(pk.comm_bytes[static_cast<int>(CollKind::reduce_scatter)],
                          p1.comm_bytes[static_cast<int>(CollKind::reduce_scatter)]);
                ++checked;
              }
  EXPECT_EQ(checked, 2 * 2 * 2 * 2 * 2 * 10);
}

// torch 2.15 under --accumulate 2 --no-sync (bench/torch_fsdp_mp.py --accumulate 2 --no-sync,
// the GPT-2 above, each Block then the root): after the first micro-step FSDP1 holds each
// unit's flat gradient in bf16 (7,552 / 49,984 / 49,984 elements, unpadded) and fully_shard
// each tensor's in fp32 (107,520 elements, 430,080 B); the last micro-step reduce-scatters
// once in fp32. Step 3's collectives: FSDP1 zero3 gathers twice a micro-step, zero2 once a
// step; fully_shard's zero2 gathers every micro-step (zero3's differ by the root's re-gather,
// as without --no-sync: 2 x 15,104 B at W = 2).
TEST(Gpt2FsdpBf16, NoSyncEqualsTorchsCollectives) {
  const struct {
    EngineKind engine;
    const char* strategy;
    int world;
    std::int64_t all_gather, reduce_scatter;
  } torch215[] = {
      {EngineKind::torch, "zero3", 2, 829952, 430080}, {EngineKind::torch, "zero3", 3, 829992, 430104},
      {EngineKind::torch, "zero2", 2, 215040, 430080}, {EngineKind::torch, "zero2", 3, 215052, 430104},
      {EngineKind::fsdp2, "zero3", 2, 860160 - 2 * 15104, 430080}, {EngineKind::fsdp2, "zero2", 2, 430080, 430080},
      {EngineKind::fsdp2, "zero2", 3, 437376, 437376},
  };
  for (const auto& t : torch215) {
    RunConfig cfg = fsdp_bf16(gpt2_model({2, 64, 4, 100, 16, 2}, AttentionMode::flash), t.strategy, 1, t.engine);
    cfg.accumulate = 2;
    cfg.no_sync = true;
    cfg.steps = 1;
    const std::string what = std::string(engine_name(t.engine)) + " " + t.strategy + " W=" + std::to_string(t.world);
    CpuBackend backend;
    auto comm = make_fake_communicator(t.world, 0, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.ledger[CollKind::all_gather].bytes, t.all_gather) << what;
    EXPECT_EQ(r.ledger[CollKind::reduce_scatter].bytes, t.reduce_scatter) << what;
    EXPECT_EQ(r.saved.bytes, 147970) << what;
    const Prediction p = predict_data_parallel(cfg, t.world, 0);
    EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_gather)], t.all_gather) << what;
    EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)], t.reduce_scatter) << what;
    EXPECT_EQ(r.resting, p.resting) << what;
  }
}

// --strategy hsdp under bf16: zero3's bf16 step in each shard group, the replicas
// all-reducing the fp32 gradient shard: every rank of W = 4 with groups of 1, 2 and 4.
TEST(Gpt2FsdpBf16, HsdpEveryRankAsPredicted) {
  int checked = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
  for (int G : {1, 2, 4})
    for (int units : {0, 1})
      for (int rank = 0; rank < 4; ++rank) {
        RunConfig cfg = fsdp_bf16(gpt2_model({2, 24, 3, 41, 6, 1}, AttentionMode::math), "zero3", units, engine);
        cfg.shard_group = G;
        SCOPED_TRACE(std::string(engine_name(engine)) + " G=" + std::to_string(G) + " units=" + std::to_string(units) + " rank " + std::to_string(rank));
        CpuBackend backend;
        auto fake = make_fake_communicator(4, rank, &backend);
        const testing::HsdpResult r = testing::run_hsdp(cfg, backend, *fake, false);
        const Prediction p = predict_data_parallel(cfg, 4, rank);
        ASSERT_TRUE(p.peak_known);
        EXPECT_EQ(r.dp.resting, p.resting);
        EXPECT_EQ(r.dp.peak.total, p.peak_total);
        EXPECT_EQ(r.dp.peak.by_category, p.peak_by_category);
        EXPECT_EQ(r.dp.where, p.peak_where);
        EXPECT_EQ(r.dp.saved.bytes, p.saved_after_forward_bytes);
        EXPECT_EQ(r.replicate_ledger.total_bytes(), p.replicate_comm_bytes);
        EXPECT_EQ(r.replicate_ledger.total_bytes(), G < 4 ? p.resting[Category::grad] : 0);  // fp32 shards
        for (int k = 0; k < kCollKindCount; ++k)
          EXPECT_EQ(r.dp.ledger.by_kind[k].bytes + r.replicate_ledger.by_kind[k].bytes, p.comm_bytes[k])
              << kCollKindNames[k];
        ++checked;
      }
  EXPECT_EQ(checked, 2 * 3 * 2 * 4);
}

// --checkpoint full|every:K under both engines: a wrapped block saves its bf16 input alone,
// as torch's non-reentrant checkpoint does on the bf16 module (bench/torch_saved.py --precision
// module --layers 3, h 64, 4 heads, V 100, T 16, B 2: every:2 saves 109,826 B in 26 storages
// (math) and 89,858 B in 24 (flash), full 27,650 B in 12), and re-runs at the start of its
// backward; every rank of W = 1 to 4 measures what the forms predict, a peak in a re-run
// among them.
TEST(Gpt2FsdpBf16, CheckpointedBlocksAsTorchsAndAsPredicted) {
  for (auto [mode, ck, bytes, storages] :
       {std::tuple{AttentionMode::math, CheckpointPolicy{CheckpointKind::every, 2}, 109826, 26},
        std::tuple{AttentionMode::flash, CheckpointPolicy{CheckpointKind::every, 2}, 89858, 24},
        std::tuple{AttentionMode::flash, CheckpointPolicy{CheckpointKind::every, 1}, 27650, 12}}) {
    RunConfig cfg = fsdp_bf16(gpt2_model({3, 64, 4, 100, 16, 2}, mode), "zero3", 1);
    cfg.model.checkpoint = ck;
    cfg.steps = 1;
    SCOPED_TRACE(std::string(mode_name(mode)) + " " + ck.text());
    const SavedForm form = gpt2_saved_after_forward_param_bf16(cfg.model.transformer, 2, ck);
    EXPECT_EQ(form.bytes, bytes);
    EXPECT_EQ(form.tensors, storages);
    CpuBackend backend;
    auto comm = make_fake_communicator(2, 0, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.saved.bytes, bytes);
    EXPECT_EQ(r.saved.tensors, storages);
  }
  int checked = 0, recompute = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
    for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
      for (const CheckpointPolicy ck : {CheckpointPolicy{CheckpointKind::every, 1}, CheckpointPolicy{CheckpointKind::every, 2}})
        for (const char* strategy : {"zero2", "zero3"})
          for (int units : {1, 2})
            for (int world : {1, 2, 3, 4})
              for (int rank = 0; rank < world; ++rank) {
                // Activations above the parameters, and an MLP narrower than h (f = 8 < h = 16: the
                // re-run's output beside dy outweighs the block's first gradient buffers), so that
                // a peak in a re-run shows.
                RunConfig cfg = fsdp_bf16(gpt2_model({3, 16, 2, 11, 32, 4}, mode, 8), strategy, units, engine);
                cfg.model.checkpoint = ck;
                cfg.overlap = units == 1;
                SCOPED_TRACE(std::string(engine_name(engine)) + " " + mode_name(mode) + " " + ck.text() + " " +
                             strategy + " units=" + std::to_string(units) + " W=" + std::to_string(world) + " r=" +
                             std::to_string(rank));
                testing::expect_rank_measured_equals_predicted(cfg, world, rank);
                recompute += predict_data_parallel(cfg, world, rank).peak_where.rfind("recompute", 0) == 0;
                ++checked;
              }
  EXPECT_EQ(checked, 2 * 2 * 2 * 2 * 2 * 10);
  EXPECT_GT(recompute, 0);
}

// --checkpoint attention under FSDP's bf16: the core runs under torch's checkpoint, its inputs
// (q, k, v: c_attn's bf16 output) its checkpoint's save, its own saves not kept, its output
// c_proj's save. torch 2.15 on the bf16 module (bench/torch_saved.py --precision module
// --checkpoint attention): 146,946 B in 33 storages at L = 2, h = 64, 4 heads, V = 100, T = 16,
// B = 2, flash and math alike (flash 147,970 B in 35 without: the log-sum-exp; math 187,906 in
// 39: its fp32 q, k, v and probabilities in place of qkv), 731,570 B in 45 at L = 3, h = 96,
// 6 heads, V = 257, T = 24, B = 3 (flash and math). The re-run gives the plain pass's loss and
// gradients bit for bit.
TEST(Gpt2FsdpBf16, AttentionRecomputeSavesWhatTorchSaves) {
  const CheckpointPolicy attention{CheckpointKind::attention, 0};
  for (auto [shape, mode, bytes, storages] :
       {std::tuple{Shape{2, 64, 4, 100, 16, 2}, AttentionMode::flash, 146946, 33},
        std::tuple{Shape{2, 64, 4, 100, 16, 2}, AttentionMode::math, 146946, 33},
        std::tuple{Shape{3, 96, 6, 257, 24, 3}, AttentionMode::flash, 731570, 45},
        std::tuple{Shape{3, 96, 6, 257, 24, 3}, AttentionMode::math, 731570, 45}}) {
    SCOPED_TRACE(std::string(mode_name(mode)) + " L=" + std::to_string(shape.layers));
    RunConfig cfg = fsdp_bf16(gpt2_model(shape, mode), "zero3", 1);
    cfg.model.checkpoint = attention;
    cfg.steps = 1;
    const SavedForm form = gpt2_saved_after_forward_param_bf16(cfg.model.transformer, shape.batch, attention);
    EXPECT_EQ(form.bytes, bytes);
    EXPECT_EQ(form.tensors, storages);
    RunConfig plain = cfg;
    plain.model.checkpoint = CheckpointPolicy{};
    CpuBackend b1, b2;
    auto c1 = make_fake_communicator(1, 0, &b1);
    auto c2 = make_fake_communicator(1, 0, &b2);
    const auto r = testing::run_dp(cfg, b1, *c1, true);
    const auto p = testing::run_dp(plain, b2, *c2, true);
    EXPECT_EQ(r.saved.bytes, bytes);
    EXPECT_EQ(r.saved.tensors, storages);
    ASSERT_TRUE(testing::any_nonzero(p.state.grads));
    EXPECT_EQ(r.state.grads, p.state.grads);
    EXPECT_EQ(r.losses, p.losses);
  }
}

// --checkpoint attention under both engines, flash and math, zero2/zero3, units of one and two
// blocks, --accumulate 1, 2 (reducing every micro-step) and 3 --no-sync: every rank of W = 1 to
// 4 measures what the forms predict; long sequences against a narrow MLP make math's re-run
// (qkv and its fp32 q, k, v held at once) the peak of a one-block model, above the plain step's.
TEST(Gpt2FsdpBf16, AttentionRecomputeMeasuredEqualsPredictedOnEveryRank) {
  int checked = 0, higher = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
    for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
      for (const char* strategy : {"zero2", "zero3"})
        for (int units : {1, 2})
          for (int K : {1, 2, 3})
            for (int world : {1, 2, 3, 4})
              for (int rank = 0; rank < world; ++rank) {
                // One block at K = 1 (math's re-run then peaks 3b = 6Nh above the plain step), three else.
                RunConfig cfg = fsdp_bf16(gpt2_model({K == 1 ? 1 : 3, 16, 2, 11, 32, 2}, mode, 8), strategy, units, engine);
                cfg.model.checkpoint = CheckpointPolicy{CheckpointKind::attention, 0};
                cfg.accumulate = K;
                cfg.no_sync = K == 3;
                cfg.overlap = units == 1;
                SCOPED_TRACE(std::string(engine_name(engine)) + " " + mode_name(mode) + " " + strategy + " units=" +
                             std::to_string(units) + " K=" + std::to_string(K) + " W=" + std::to_string(world) +
                             " r=" + std::to_string(rank));
                testing::expect_rank_measured_equals_predicted(cfg, world, rank);
                const Prediction p = predict_data_parallel(cfg, world, rank);
                RunConfig plain = cfg;
                plain.model.checkpoint = CheckpointPolicy{};
                const Prediction q = predict_data_parallel(plain, world, rank);
                EXPECT_LT(p.saved_after_forward_bytes, q.saved_after_forward_bytes);
                higher += p.peak_total > q.peak_total;  // math's re-run holds qkv and its fp32 q, k, v at once
                ++checked;
              }
  EXPECT_EQ(checked, 2 * 2 * 2 * 2 * 3 * 10);
  EXPECT_GT(higher, 0);
}

// The bf16 gather shows in the categories: the gathered units are half fp32's, the
// all-gather carries 2 B an element (half fp32's bytes) and the reduce-scatter fp32's; the
// resting bytes are fp32's.
TEST(Gpt2FsdpBf16, GathersInBf16AndReducesInFp32) {
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
  for (const char* strategy : {"zero2", "zero3"})
    for (int world : {2, 3}) {
      RunConfig cfg = fsdp_bf16(gpt2_model({2, 32, 2, 50, 8, 2}, AttentionMode::flash), strategy, 1, engine);
      RunConfig fp32 = cfg;
      fp32.precision = PrecisionKind::fp32;
      fp32.model.param_bf16 = false;
      SCOPED_TRACE(std::string(strategy) + " W=" + std::to_string(world));
      const Prediction p16 = predict_data_parallel(cfg, world, 0), p32 = predict_data_parallel(fp32, world, 0);
      EXPECT_EQ(p16.resting, p32.resting);
      EXPECT_EQ(2 * p16.comm_bytes[static_cast<int>(CollKind::all_gather)],
                p32.comm_bytes[static_cast<int>(CollKind::all_gather)]);
      EXPECT_EQ(p16.comm_bytes[static_cast<int>(CollKind::reduce_scatter)],
                p32.comm_bytes[static_cast<int>(CollKind::reduce_scatter)]);
      EXPECT_GT(p16.comm_bytes[static_cast<int>(CollKind::all_gather)], 0);
      EXPECT_LT(p16.peak_total, p32.peak_total);
    }
}

// torch 2.15's FSDP1 with MixedPrecision(param_dtype=bfloat16, reduce_dtype=float32) on nanoGPT's
// GPT-2 (2 blocks, hidden 64, 4 heads, vocabulary 100, 16 tokens, 2 sequences a rank, flash),
// each Block wrapped, then the root, on CPU over gloo (bench/torch_fsdp_mp.py --configs
// gpt2-fsdp1-zero3-block,gpt2-fsdp1-zero2-block): the storages of the sharded parameters,
// gradients and AdamW state after step 3, the bf16 all-gathers' and fp32 reduce-scatters'
// bytes at nccl-tests' sizes, and the storages saved in the forward other than the gathered
// units (147,970 B: bench/torch_saved.py --precision module's).
TEST(Gpt2FsdpBf16, EqualsTorchFsdp1MixedPrecision) {
  const struct {
    const char* strategy;
    int world;
    std::int64_t resting, all_gather, reduce_scatter;
  } torch215[] = {
      {"zero3", 2, 860172, 414976, 430080}, {"zero3", 3, 573484, 414996, 430104},
      {"zero3", 4, 430092, 414976, 430080}, {"zero2", 2, 860172, 215040, 430080},
      {"zero2", 3, 573484, 215052, 430104}, {"zero2", 4, 430092, 215040, 430080},
  };
  for (const auto& t : torch215) {
    RunConfig cfg = fsdp_bf16(gpt2_model({2, 64, 4, 100, 16, 2}, AttentionMode::flash), t.strategy, 1);
    cfg.steps = 1;
    const std::string what = std::string(t.strategy) + " W=" + std::to_string(t.world);
    for (int rank = 0; rank < t.world; ++rank) {
      const Prediction p = predict_data_parallel(cfg, t.world, rank);
      EXPECT_EQ(p.resting.total(), t.resting) << what;
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_gather)], t.all_gather) << what;
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)], t.reduce_scatter) << what;
      EXPECT_EQ(p.saved_after_forward_bytes, 147970) << what;
    }
    CpuBackend backend;
    auto comm = make_fake_communicator(t.world, t.world - 1, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.resting.total(), t.resting) << what;
    EXPECT_EQ(r.ledger[CollKind::all_gather].bytes, t.all_gather) << what;
    EXPECT_EQ(r.ledger[CollKind::reduce_scatter].bytes, t.reduce_scatter) << what;
    EXPECT_EQ(r.saved.bytes, 147970) << what;
  }
}

// torch 2.15's fully_shard with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)
// on the same GPT-2, fully_shard on each Block then the root (bench/torch_fsdp_mp.py --configs
// gpt2-fsdp2-zero3-block,gpt2-fsdp2-zero2-block): the storages of the sharded parameters,
// gradients and AdamW state after step 3 (the last rank's shorter at W = 3), the fp32
// reduce-scatters' and zero2's bf16 all-gathers' bytes, equal to ours. zero3's all-gathers
// differ by the root's: torch 2.15 reshards the root after forward and gathers it again when
// backward begins (430,080 / 437,376 / 430,080 B in 6 calls, fp32 the same way), where the
// fsdp2 engine keeps the root gathered, as torch's FSDP1 does (the root's 15,104 / 15,624 /
// 15,104 B fewer).
TEST(Gpt2FsdpBf16, EqualsTorchFullyShardMixedPrecision) {
  const struct {
    const char* strategy;
    int world;
    std::int64_t resting, resting_last, all_gather, reduce_scatter;
  } torch215[] = {
      {"zero3", 2, 860272, 860272, 430080 - 15104, 430080}, {"zero3", 3, 583280, 568688, 437376 - 15624, 437376},
      {"zero3", 4, 430192, 430192, 430080 - 15104, 430080}, {"zero2", 2, 860272, 860272, 215040, 430080},
      {"zero2", 3, 583280, 568688, 218688, 437376},         {"zero2", 4, 430192, 430192, 215040, 430080},
  };
  for (const auto& t : torch215) {
    RunConfig cfg =
        fsdp_bf16(gpt2_model({2, 64, 4, 100, 16, 2}, AttentionMode::flash), t.strategy, 1, EngineKind::fsdp2);
    cfg.steps = 1;
    const std::string what = std::string(t.strategy) + " W=" + std::to_string(t.world);
    for (int rank = 0; rank < t.world; ++rank) {
      const Prediction p = predict_data_parallel(cfg, t.world, rank);
      EXPECT_EQ(p.resting.total(), rank == t.world - 1 ? t.resting_last : t.resting) << what << " rank " << rank;
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_gather)], t.all_gather) << what;
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)], t.reduce_scatter) << what;
      EXPECT_EQ(p.saved_after_forward_bytes, 147970) << what;
    }
    CpuBackend backend;
    auto comm = make_fake_communicator(t.world, t.world - 1, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.resting.total(), t.resting_last) << what;
    EXPECT_EQ(r.ledger[CollKind::all_gather].bytes, t.all_gather) << what;
    EXPECT_EQ(r.ledger[CollKind::reduce_scatter].bytes, t.reduce_scatter) << what;
    EXPECT_EQ(r.saved.bytes, 147970) << what;
  }
}

// One rank, one step on the same data and parameters: the bf16 module's gradients (reduced
// in fp32) are the fp32 step's within bf16's rounding, and not equal to them.
TEST(Gpt2FsdpBf16, GradientsAreFp32sWithinBf16Rounding) {
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
  for (const AttentionMode mode : {AttentionMode::flash, AttentionMode::math})
    for (const char* strategy : {"zero2", "zero3"}) {
      SCOPED_TRACE(std::string(engine_name(engine)) + " " + mode_name(mode) + " " + strategy);
      RunConfig cfg = fsdp_bf16(gpt2_model({2, 32, 4, 37, 8, 2}, mode), strategy, 1, engine);
      cfg.steps = 1;
      RunConfig fp32 = cfg;
      fp32.precision = PrecisionKind::fp32;
      fp32.model.param_bf16 = false;
      CpuBackend b16, b32;
      auto c16 = make_fake_communicator(1, 0, &b16);
      auto c32 = make_fake_communicator(1, 0, &b32);
      const auto r16 = testing::run_dp(cfg, b16, *c16, true);
      const auto r32 = testing::run_dp(fp32, b32, *c32, true);
      const std::vector<float>& g16 = r16.state.grads;
      const std::vector<float>& g32 = r32.state.grads;
      ASSERT_EQ(g16.size(), g32.size());
      double norm = 0.0, diff = 0.0;
      int differ = 0;
      for (std::size_t i = 0; i < g32.size(); ++i) {
        norm += static_cast<double>(g32[i]) * g32[i];
        diff += (static_cast<double>(g16[i]) - g32[i]) * (static_cast<double>(g16[i]) - g32[i]);
        differ += g16[i] != g32[i];
      }
      ASSERT_GT(norm, 0.0);
      EXPECT_LE(std::sqrt(diff / norm), 0.05);
      EXPECT_GT(differ, static_cast<int>(g32.size()) / 2) << "bf16 arithmetic left the gradients as fp32's";
      EXPECT_NEAR(r16.losses[0], r32.losses[0], 0.02 * std::fabs(r32.losses[0]) + 1e-3);
    }
}

}  // namespace
}  // namespace shardscope
