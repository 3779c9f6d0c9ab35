// Closed forms for what a run should measure, all in one place (DESIGN §3, §4).
// The README's "Formulas" section writes out the same expressions.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "shardscope/category.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

struct Prediction {
  CategoryBytes resting;  // per category, bytes
  std::int64_t peak_total = 0;
  Phase peak_phase = Phase::setup;
  std::string peak_where;
  std::array<std::int64_t, kCollKindCount> comm_bytes{};  // per step, nccl-tests' sizes
  std::int64_t comm_total() const {
    std::int64_t t = 0;
    for (auto b : comm_bytes) t += b;
    return t;
  }
};

// A data-parallel rank `rank` of `world` running cfg.strategy.
Prediction predict_data_parallel(const RunConfig& cfg, int world, int rank);

}  // namespace shardscope
