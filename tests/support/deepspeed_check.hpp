// --engine deepspeed's test bench (tests/test_deepspeed*.cpp): a configuration, and one
// emulated rank measured against its closed forms (every category at rest and at the peak,
// its phase and place, the saves and the bytes each collective moves).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness/comm/fake_comm.hpp"
#include "support/dp_harness.hpp"

namespace shardscope::testing {

inline RunConfig ds_config(const ModelConfig& m, const char* strategy, double bucket_mb) {
  RunConfig cfg;
  cfg.model = m;
  cfg.steps = 2;
  cfg.strategy = parse_strategy(strategy);
  cfg.engine = EngineKind::deepspeed;
  cfg.bucket_mb = bucket_mb;
  return cfg;
}

inline CheckpointPolicy every(int k) { return {CheckpointKind::every, k}; }

// Four MLPs the DeepSpeed checkpoint and bf16 tests share: padding, a tiny partition, a
// batch whose activations outweigh the gradients.
inline std::vector<ModelConfig> ds_test_mlps() {
  ModelConfig small;  // relu, mse
  small.layers = 5;
  small.width = 24;
  small.batch = 3;
  small.activation = Activation::relu;
  small.loss = Loss::mse;
  ModelConfig odd;  // none, mse; padding at W = 3
  odd.layers = 3;
  odd.width = 7;
  odd.batch = 2;
  odd.loss = Loss::mse;
  ModelConfig tiny;  // relu, sum; the last rank's partition mostly padding at W = 4
  tiny.layers = 2;
  tiny.width = 2;
  tiny.batch = 5;
  tiny.activation = Activation::relu;
  ModelConfig wide_batch;  // none, sum; activations above the gradients
  wide_batch.layers = 4;
  wide_batch.width = 16;
  wide_batch.batch = 512;
  return {small, odd, tiny, wide_batch};
}

inline std::string mlp_name(const ModelConfig& m) { return std::to_string(m.layers) + "x" + std::to_string(m.width); }

// One emulated rank against its prediction; returns the peak's phase and place.
inline std::string check_deepspeed_rank(const RunConfig& cfg, int world, int rank, const std::string& what) {
  CpuBackend backend;
  auto comm = make_fake_communicator(world, rank, &backend);
  const auto r = run_dp(cfg, backend, *comm, false);
  const Prediction p = predict_data_parallel(cfg, world, rank);
  SCOPED_TRACE(what + " W=" + std::to_string(world) + " r=" + std::to_string(rank));
  EXPECT_GT(r.resting.total(), 0);
  for (int k = 0; k < kCategoryCount; ++k)
    EXPECT_EQ(r.resting.bytes[k], p.resting.bytes[k]) << "resting " << kCategoryNames[k];
  for (int k = 0; k < kCollKindCount; ++k)
    EXPECT_EQ(r.ledger.by_kind[k].bytes, p.comm_bytes[k]) << "comm " << kCollKindNames[k];
  EXPECT_TRUE(p.peak_known);
  EXPECT_EQ(r.peak.total, p.peak_total);
  for (int k = 0; k < kCategoryCount; ++k)
    EXPECT_EQ(r.peak.by_category.bytes[k], p.peak_by_category.bytes[k]) << "at the peak " << kCategoryNames[k];
  EXPECT_EQ(std::string(phase_name(r.peak.phase)), std::string(phase_name(p.peak_phase)));
  EXPECT_EQ(r.where, p.peak_where);
  EXPECT_EQ(r.saved.bytes, p.saved_after_forward_bytes);
  EXPECT_EQ(r.saved.tensors, p.saved_after_forward_tensors);
  return std::string(phase_name(r.peak.phase)) + " " + r.where;
}

}  // namespace shardscope::testing
