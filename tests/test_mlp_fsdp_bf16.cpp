// --precision bf16 on the MLP under zero2/zero3 (FSDP1's MixedPrecision(param_dtype=bf16,
// reduce_dtype=fp32): harness/strategies/fsdp.hpp; under --engine fsdp2 fully_shard's
// MixedPrecisionPolicy: fsdp2.hpp; the param_bf16 Linears of harness/model/mlp.cpp): every emulated rank measures what the closed forms predict
// (harness/predict/mlp_fsdp_bf16_forms.cpp); the resting bytes, the all-gathers' and
// reduce-scatters' bytes and the saves after forward are torch 2.15's
// (bench/torch_fsdp_mp.py); the step trains near fp32's.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "harness/comm/fake_comm.hpp"
#include "support/mesh_harness.hpp"
#include "support/transformer_testbed.hpp"

namespace shardscope {
namespace {

ModelConfig mlp(int layers, int width, int batch, Activation activation, Loss loss) {
  ModelConfig m;
  m.layers = layers;
  m.width = width;
  m.batch = batch;
  m.activation = activation;
  m.loss = loss;
  return m;
}

RunConfig fsdp_bf16(const ModelConfig& model, const char* strategy, int units,
                    EngineKind engine = EngineKind::torch) {
  RunConfig cfg;
  cfg.engine = engine;
  cfg.model = model;
  cfg.steps = 2;
  cfg.seed = 3;
  cfg.strategy = parse_strategy(strategy);
  cfg.layers_per_unit = units;
  cfg.precision = PrecisionKind::bf16;
  cfg.model.param_bf16 = true;  // FSDP's MixedPrecision (the CLI's to_config sets it)
  return cfg;
}

// zero2 and zero3; the root unit alone, units of one and two layers (the last unit
// shorter); prefetch and overlap on and off; both activations and losses: every rank of
// W = 1 to 4, on a width whose units pad at W = 3 and 4.
TEST(MlpFsdpBf16, MeasuredEqualsPredictedOnEveryRank) {
  int checked = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
  for (const char* strategy : {"zero2", "zero3"})
    for (int units : {0, 1, 2})
      for (const Activation act : {Activation::none, Activation::relu})
        for (const Loss loss : {Loss::sum, Loss::mse})
          for (int mode = 0; mode < 3; ++mode)  // prefetch + overlap, prefetch blocking, neither
            for (int world : {1, 2, 3, 4})
              for (int rank = 0; rank < world; ++rank) {
                RunConfig cfg = fsdp_bf16(mlp(5, 19, 3, act, loss), strategy, units, engine);
                cfg.prefetch = mode < 2 ? 1 : 0;
                cfg.overlap = mode == 0;
                SCOPED_TRACE(std::string(engine_name(engine)) + " " + strategy + " units=" + std::to_string(units) + " mode=" +
                             std::to_string(mode) + (act == Activation::relu ? " relu" : " none") +
                             (loss == Loss::mse ? " mse" : " sum") + " W=" + std::to_string(world) + " r=" +
                             std::to_string(rank));
                testing::expect_rank_measured_equals_predicted(cfg, world, rank);
                ++checked;
              }
  EXPECT_EQ(checked, 2 * 2 * 3 * 2 * 2 * 3 * 10);
}

// --strategy hsdp under bf16 (both engines): zero3's bf16 step within each shard group, the
// replicas all-reducing the fp32 gradient shard (reduce_dtype): every rank of W = 4 with
// groups of 1, 2 and 4 holds the forms, each group's bytes apart.
TEST(MlpFsdpBf16, HsdpEveryRankAsPredicted) {
  int checked = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
    for (int G : {1, 2, 4})
      for (int units : {0, 1})
        for (int rank = 0; rank < 4; ++rank) {
          RunConfig cfg = fsdp_bf16(mlp(4, 37, 6, Activation::relu, Loss::mse), "zero3", units, engine);
          cfg.shard_group = G;
          SCOPED_TRACE(std::string(engine_name(engine)) + " G=" + std::to_string(G) + " units=" +
                       std::to_string(units) + " rank " + std::to_string(rank));
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

// --accumulate K, every micro-step reducing (torch's accumulation without no_sync): a later
// micro-step's reduce-scatter writes a staging shard added onto the gradient; both engines,
// every rank of W = 1 to 4, the gathers and reduce-scatters K times one micro-step's.
TEST(MlpFsdpBf16, AccumulationReducesEveryMicroStepAsPredicted) {
  int checked = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
    for (const char* strategy : {"zero2", "zero3"})
      for (int K : {2, 3})
        for (bool overlap : {true, false})
          for (int world : {1, 2, 3, 4})
            for (int rank = 0; rank < world; ++rank) {
              RunConfig cfg = fsdp_bf16(mlp(4, 19, 3, Activation::relu, Loss::mse), strategy, 1, engine);
              cfg.accumulate = K;
              cfg.overlap = overlap;
              SCOPED_TRACE(std::string(engine_name(engine)) + " " + strategy + " K=" + std::to_string(K) +
                           (overlap ? " overlap" : "") + " W=" + std::to_string(world) + " r=" + std::to_string(rank));
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

// --accumulate K --no-sync (FSDP1's no_sync(), fully_shard's set_requires_gradient_sync(False)):
// FSDP1 keeps each unit's bf16 full gradient across the micro-steps (the later ones adding
// onto it) and reduces its fp32 cast once, zero2 keeping the units gathered; fully_shard
// keeps each tensor's gradient in fp32, folding every micro-step's bf16 ones in. Both
// engines, units of one and two layers, overlap on and off, every rank of W = 1 to 4: the
// reduce-scatters one micro-step's bytes, the all-gathers as often as the units are gathered.
TEST(MlpFsdpBf16, NoSyncKeepsGradientsAsPredicted) {
  int checked = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
    for (const char* strategy : {"zero2", "zero3"})
      for (int K : {2, 3})
        for (int units : {1, 2})
          for (bool overlap : {true, false})
            for (int world : {1, 2, 3, 4})
              for (int rank = 0; rank < world; ++rank) {
                RunConfig cfg = fsdp_bf16(mlp(5, 19, 3, Activation::relu, Loss::mse), strategy, units, engine);
                cfg.accumulate = K;
                cfg.no_sync = true;
                cfg.overlap = overlap;
                SCOPED_TRACE(std::string(engine_name(engine)) + " " + strategy + " K=" + std::to_string(K) + " units=" +
                             std::to_string(units) + (overlap ? " overlap" : "") + " W=" + std::to_string(world) +
                             " r=" + std::to_string(rank));
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

// The peak under --no-sync: fully_shard's fp32 gradients (4 B an element) where FSDP1 keeps
// bf16 ones, above one micro-step's with a unit a layer (a single root unit's gradient can
// peak where one micro-step's does); the sum and relu-less shapes and --units all.
TEST(MlpFsdpBf16, NoSyncPeaksAsPredicted) {
  for (const ModelConfig& m : {mlp(4, 64, 2, Activation::none, Loss::sum), mlp(2, 8, 64, Activation::relu, Loss::mse),
                               mlp(6, 32, 1, Activation::relu, Loss::sum)})
    for (int units : {0, 1})
      for (const char* strategy : {"zero2", "zero3"})
        for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2}) {
          RunConfig cfg = fsdp_bf16(m, strategy, units, engine);
          cfg.accumulate = 3;
          cfg.no_sync = true;
          SCOPED_TRACE(std::string(engine_name(engine)) + " " + strategy + " units=" + std::to_string(units) + " width " +
                       std::to_string(m.width));
          testing::expect_rank_measured_equals_predicted(cfg, 4, 3);
          RunConfig one = cfg;
          one.accumulate = 1;
          one.no_sync = false;
          const std::int64_t pk = predict_data_parallel(cfg, 4, 3).peak_total, p1 = predict_data_parallel(one, 4, 3).peak_total;
          if (units == 1)
            EXPECT_GT(pk, p1);
          else
            EXPECT_GE(pk, p1);
        }
}

// --checkpoint full|every:K under FSDP's bf16 (both engines): a wrapped layer saves its bf16
// input alone (the first layer's, the root's bf16 cast of the batch, kept for its re-run) and
// re-runs after its unit is gathered, as torch's non-reentrant checkpoint inside an FSDP unit
// does; with --accumulate K (every micro-step reducing, or --no-sync) too. Every rank of W = 1
// to 4; a batch wide against the width puts peaks in a re-run among them.
TEST(MlpFsdpBf16, CheckpointedLayersMeasureWhatTheyPredict) {
  int checked = 0, recompute = 0;
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
    for (const char* strategy : {"zero2", "zero3"})
      for (const CheckpointPolicy ck : {CheckpointPolicy{CheckpointKind::every, 1}, CheckpointPolicy{CheckpointKind::every, 2},
                                        CheckpointPolicy{CheckpointKind::every, 3}})
        for (int setting = 0; setting < 4; ++setting)  // relu mse units 1; none sum units 2; K = 2; K = 3 --no-sync
          for (int world : {1, 2, 3, 4})
            for (int rank = 0; rank < world; ++rank) {
              const bool relu = setting != 1;
              RunConfig cfg = fsdp_bf16(mlp(5, 12, 24, relu ? Activation::relu : Activation::none,
                                            relu ? Loss::mse : Loss::sum),
                                        strategy, setting == 1 ? 2 : 1, engine);
              cfg.model.checkpoint = ck;
              cfg.accumulate = setting >= 2 ? setting : 1;
              cfg.no_sync = setting == 3;
              cfg.overlap = setting != 2;
              SCOPED_TRACE(std::string(engine_name(engine)) + " " + strategy + " " + ck.text() + " setting " +
                           std::to_string(setting) + " W=" + std::to_string(world) + " r=" + std::to_string(rank));
              testing::expect_rank_measured_equals_predicted(cfg, world, rank);
              recompute += predict_data_parallel(cfg, world, rank).peak_where.rfind("recompute", 0) == 0;
              ++checked;
            }
  EXPECT_EQ(checked, 2 * 2 * 3 * 4 * 10);
  EXPECT_GT(recompute, 0);
}

// What a checkpointed layer saves and gathers under FSDP's bf16, as torch 2.15's FSDP1 and
// fully_shard do (bench/torch_fsdp_mp.py --checkpoint full|every:2 on the seed model, each Layer
// (Linear + ReLU) a unit, its body under torch.utils.checkpoint, step 3): a wrapped layer saves
// its bf16 input alone (the first layer's, the root's cast of the batch), so --checkpoint full
// with the sum loss saves the eight bf16 inputs, 131,072 B in 8 storages (the last ReLU output
// no longer), and every:2 with mse the nine bf16 activations and the fp32 target, 180,224 B;
// the re-run gathers nothing (the unit is gathered when its backward begins, before autograd
// unpacks the checkpoint): the all-gathers and reduce-scatters are the plain step's, at rest
// its states. W = 2, zero3, a unit a layer.
TEST(MlpFsdpBf16, CheckpointedSeedModelSavesAndGathersWhatTorchDoes) {
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
    for (const auto& [ck, loss, bytes, storages] :
         {std::tuple{CheckpointPolicy{CheckpointKind::every, 1}, Loss::sum, 131072, 8},
          std::tuple{CheckpointPolicy{CheckpointKind::every, 2}, Loss::mse, 180224, 10}}) {
      RunConfig cfg = fsdp_bf16(mlp(8, 256, 32, Activation::relu, loss), "zero3", 1, engine);
      cfg.model.checkpoint = ck;
      cfg.steps = 1;
      SCOPED_TRACE(std::string(engine_name(engine)) + " " + ck.text());
      const Prediction p = predict_data_parallel(cfg, 2, 1);
      EXPECT_EQ(p.saved_after_forward_bytes, bytes);
      EXPECT_EQ(p.saved_after_forward_tensors, storages);
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_gather)], 2105344);
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)], 2105344);
      EXPECT_EQ(p.resting.total(), engine == EngineKind::torch ? 4210720 : 4210752);
      CpuBackend backend;
      auto comm = make_fake_communicator(2, 1, &backend);
      const auto r = testing::run_dp(cfg, backend, *comm, false);
      EXPECT_EQ(r.saved.bytes, bytes);
      EXPECT_EQ(r.saved.tensors, storages);
      EXPECT_EQ(r.ledger[CollKind::all_gather].bytes, 2105344);
      EXPECT_EQ(r.ledger[CollKind::reduce_scatter].bytes, 2105344);
      EXPECT_EQ(r.resting, p.resting);
    }
}

// Where the peak falls moves with the shape (a gather's cast, a gradient's fp32 cast beside
// its bf16 one, mse's fp32 temporaries), each as predicted; the bf16 gather shows in the
// categories: param_cast at a zero3 peak with prefetch under overlap, param_unsharded
// half of fp32's.
TEST(MlpFsdpBf16, PeaksAsPredictedAndGathersInBf16) {
  for (const ModelConfig& m : {mlp(4, 64, 2, Activation::none, Loss::sum), mlp(2, 8, 64, Activation::relu, Loss::mse),
                               mlp(6, 32, 8, Activation::relu, Loss::sum)}) {
    for (const char* strategy : {"zero2", "zero3"})
    for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2}) {
      const RunConfig cfg = fsdp_bf16(m, strategy, 1, engine);
      testing::expect_rank_measured_equals_predicted(cfg, 4, 3);
      RunConfig fp32 = cfg;
      fp32.precision = PrecisionKind::fp32;
      fp32.model.param_bf16 = false;
      const Prediction p16 = predict_data_parallel(cfg, 4, 3), p32 = predict_data_parallel(fp32, 4, 3);
      EXPECT_EQ(p16.resting, p32.resting);
      EXPECT_EQ(2 * p16.comm_bytes[static_cast<int>(CollKind::all_gather)],
                p32.comm_bytes[static_cast<int>(CollKind::all_gather)]);
      EXPECT_EQ(p16.comm_bytes[static_cast<int>(CollKind::reduce_scatter)],
                p32.comm_bytes[static_cast<int>(CollKind::reduce_scatter)]);
    }
  }
  const Prediction wide = predict_data_parallel(fsdp_bf16(mlp(4, 64, 2, Activation::none, Loss::sum), "zero3", 1), 4, 3);
  EXPECT_GT(wide.peak_by_category[Category::param_cast], 0);  // unit below's cast, held until its wait
  EXPECT_EQ(wide.peak_by_category[Category::param_unsharded], 2 * 2 * (64 * 64 + 64));  // two bf16 units
}

// torch 2.15, bench/torch_fsdp_mp.py on the seed model (8 x 256, ReLU, MSE, batch 32 a rank,
// AdamW, step 3; CPU, gloo): FSDP1 with MixedPrecision(param_dtype=bfloat16,
// reduce_dtype=float32, buffer_dtype=float32), each Linear wrapped (FULL_SHARD, SHARD_GRAD_OP)
// or the root alone (FULL_SHARD). Every rank gave these: c10's allocator after the step, the
// bytes of step 3's all-gathers (bfloat16) and reduce-scatters (float32) at nccl-tests' sizes,
// and the storages autograd saved in the forward other than the gathered parameters (nine
// bf16 activations and MSE's fp32 target).
TEST(MlpFsdpBf16, SeedModelEqualsTorchFsdp1MixedPrecision) {
  const struct {
    const char* strategy;
    int units, world;
    std::int64_t resting, all_gather, reduce_scatter;
  } torch215[] = {
      {"zero3", 1, 2, 4210720, 2105344, 2105344}, {"zero3", 1, 3, 2807200, 2105376, 2105376},
      {"zero3", 1, 4, 2105376, 2105344, 2105344}, {"zero2", 1, 2, 4210720, 1052672, 2105344},
      {"zero2", 1, 3, 2807200, 1052688, 2105376}, {"zero2", 1, 4, 2105376, 1052672, 2105344},
      {"zero3", 0, 2, 4210692, 1052672, 2105344}, {"zero3", 0, 3, 2807140, 1052676, 2105352},
      {"zero3", 0, 4, 2105348, 1052672, 2105344},
  };
  constexpr std::int64_t kTorchSaved = 9 * 16384 + 32768;
  for (const auto& t : torch215) {
    RunConfig cfg = fsdp_bf16(mlp(8, 256, 32, Activation::relu, Loss::mse), t.strategy, t.units);
    cfg.steps = 1;
    const std::string what = std::string(t.strategy) + " units=" + std::to_string(t.units) + " W=" +
                             std::to_string(t.world);
    for (int rank = 0; rank < t.world; ++rank) {
      const Prediction p = predict_data_parallel(cfg, t.world, rank);
      EXPECT_EQ(p.resting.total(), t.resting) << what;
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_gather)], t.all_gather) << what;
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)], t.reduce_scatter) << what;
      EXPECT_EQ(p.saved_after_forward_bytes, kTorchSaved) << what;
    }
    // The last rank measured: the same figures from the run.
    CpuBackend backend;
    auto comm = make_fake_communicator(t.world, t.world - 1, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.resting.total(), t.resting) << what;
    EXPECT_EQ(r.ledger[CollKind::all_gather].bytes, t.all_gather) << what;
    EXPECT_EQ(r.ledger[CollKind::reduce_scatter].bytes, t.reduce_scatter) << what;
    EXPECT_EQ(r.saved.bytes, kTorchSaved) << what;
  }
}

// torch 2.15's fully_shard on the seed model with MixedPrecisionPolicy(param_dtype=bfloat16,
// reduce_dtype=float32), each Linear then the root (bench/torch_fsdp_mp.py, as above): the
// storages of the sharded parameters, gradients and AdamW state after step 3 (the
// allocator adds 4·W bytes a group, not modelled), the bf16 all-gathers' and fp32
// reduce-scatters' bytes, and the saves (nine bf16 activations and the fp32 target).
TEST(MlpFsdpBf16, SeedModelEqualsTorchFullyShardMixedPrecision) {
  const struct {
    const char* strategy;
    int world;
    std::int64_t resting, resting_last, all_gather, reduce_scatter;
  } torch215[] = {
      {"zero3", 2, 4210752, 4210752, 2105344, 2105344}, {"zero3", 3, 2829120, 2796224, 2121792, 2121792},
      {"zero3", 4, 2105408, 2105408, 2105344, 2105344}, {"zero2", 2, 4210752, 4210752, 1052672, 2105344},
      {"zero2", 3, 2829120, 2796224, 1060896, 2121792}, {"zero2", 4, 2105408, 2105408, 1052672, 2105344},
  };
  for (const auto& t : torch215) {
    RunConfig cfg = fsdp_bf16(mlp(8, 256, 32, Activation::relu, Loss::mse), t.strategy, 1, EngineKind::fsdp2);
    cfg.steps = 1;
    const std::string what = std::string(t.strategy) + " W=" + std::to_string(t.world);
    for (int rank = 0; rank < t.world; ++rank) {
      const Prediction p = predict_data_parallel(cfg, t.world, rank);
      EXPECT_EQ(p.resting.total(), rank == t.world - 1 ? t.resting_last : t.resting) << what << " rank " << rank;
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_gather)], t.all_gather) << what;
      EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)], t.reduce_scatter) << what;
      EXPECT_EQ(p.saved_after_forward_bytes, 9 * 16384 + 32768) << what;
    }
    CpuBackend backend;
    auto comm = make_fake_communicator(t.world, t.world - 1, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.resting.total(), t.resting_last) << what;
    EXPECT_EQ(r.ledger[CollKind::all_gather].bytes, t.all_gather) << what;
    EXPECT_EQ(r.ledger[CollKind::reduce_scatter].bytes, t.reduce_scatter) << what;
  }
}

// torch 2.15 under --accumulate 2 --no-sync on the seed model (bench/torch_fsdp_mp.py
// --accumulate 2 --no-sync, each Linear a unit, step 3): FSDP1 keeps each unit's flat gradient
// in bf16 after the first micro-step (65,792 elements, unpadded), fully_shard each tensor's in
// fp32 (65,536 + 256 elements a unit); the last micro-step reduce-scatters once in fp32. The
// states' storages are one micro-step's; the all-gathers K times a micro-step's but FSDP1
// zero2's (kept gathered: once a step). Every rank gave these; ours predicted and measured
// (the last rank) the same.
TEST(MlpFsdpBf16, NoSyncSeedModelEqualsTorch) {
  const struct {
    EngineKind engine;
    const char* strategy;
    int world;
    std::int64_t resting_last, all_gather, reduce_scatter;
  } torch215[] = {
      {EngineKind::torch, "zero3", 2, 4210720, 4210688, 2105344}, {EngineKind::torch, "zero3", 3, 2807200, 4210752, 2105376},
      {EngineKind::torch, "zero3", 4, 2105376, 4210688, 2105344}, {EngineKind::torch, "zero2", 2, 4210720, 1052672, 2105344},
      {EngineKind::torch, "zero2", 3, 2807200, 1052688, 2105376}, {EngineKind::torch, "zero2", 4, 2105376, 1052672, 2105344},
      {EngineKind::fsdp2, "zero3", 2, 4210752, 4210688, 2105344}, {EngineKind::fsdp2, "zero3", 3, 2796224, 4243584, 2121792},
      {EngineKind::fsdp2, "zero3", 4, 2105408, 4210688, 2105344}, {EngineKind::fsdp2, "zero2", 2, 4210752, 2105344, 2105344},
      {EngineKind::fsdp2, "zero2", 3, 2796224, 2121792, 2121792}, {EngineKind::fsdp2, "zero2", 4, 2105408, 2105344, 2105344},
  };
  for (const auto& t : torch215) {
    RunConfig cfg = fsdp_bf16(mlp(8, 256, 32, Activation::relu, Loss::mse), t.strategy, 1, t.engine);
    cfg.accumulate = 2;
    cfg.no_sync = true;
    cfg.steps = 1;
    const std::string what = std::string(engine_name(t.engine)) + " " + t.strategy + " W=" + std::to_string(t.world);
    const Prediction p = predict_data_parallel(cfg, t.world, t.world - 1);
    EXPECT_EQ(p.resting.total(), t.resting_last) << what;
    EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::all_gather)], t.all_gather) << what;
    EXPECT_EQ(p.comm_bytes[static_cast<int>(CollKind::reduce_scatter)], t.reduce_scatter) << what;
    CpuBackend backend;
    auto comm = make_fake_communicator(t.world, t.world - 1, &backend);
    const auto r = testing::run_dp(cfg, backend, *comm, false);
    EXPECT_EQ(r.resting.total(), t.resting_last) << what;
    EXPECT_EQ(r.ledger[CollKind::all_gather].bytes, t.all_gather) << what;
    EXPECT_EQ(r.ledger[CollKind::reduce_scatter].bytes, t.reduce_scatter) << what;
    EXPECT_EQ(r.saved.bytes, 9 * 16384 + 32768) << what;
  }
}

// One rank, one step on the same data and parameters: the bf16 step's gradients are the
// fp32 step's within bf16's rounding, and not equal to them (the arithmetic is bf16's).
TEST(MlpFsdpBf16, GradientsAreFp32sWithinBf16Rounding) {
  for (const EngineKind engine : {EngineKind::torch, EngineKind::fsdp2})
  for (const char* strategy : {"zero2", "zero3"})
    for (const Loss loss : {Loss::sum, Loss::mse}) {
      RunConfig cfg = fsdp_bf16(mlp(3, 32, 16, Activation::relu, loss), strategy, 1, engine);
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
      EXPECT_LE(std::sqrt(diff / norm), 0.03) << strategy;
      EXPECT_GT(differ, static_cast<int>(g32.size()) / 2) << "bf16 arithmetic left the gradients as fp32's";
      EXPECT_NEAR(r16.losses[0], r32.losses[0], 0.02 * std::fabs(r32.losses[0]) + 1e-3);
    }
}

}  // namespace
}  // namespace shardscope
