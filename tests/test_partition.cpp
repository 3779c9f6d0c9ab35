// How the sharded strategies split the model, and the per-rank closed forms at the
// sizes `shardscope plan` accepts (docs/design.md §3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "harness/strategies/partition.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {
namespace {

// torch's ZeroRedundancyOptimizer partition written the plain way: tensors by size,
// descending (stable), each to the first least-loaded rank found by a scan.
std::vector<int> owners_by_scan(const ModelConfig& m, int world) {
  std::vector<int> order(m.param_tensors());
  for (int t = 0; t < m.param_tensors(); ++t) order[t] = t;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return m.tensor_elems(a) > m.tensor_elems(b); });
  std::vector<std::int64_t> load(world, 0);
  std::vector<int> owner(m.param_tensors(), 0);
  for (int t : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[t] = r;
    load[r] += m.tensor_elems(t);
  }
  return owner;
}

TEST(Partition, Zero1OwnersAreTorchsGreedyPartition) {
  // Width 1 makes weight and bias the same size: every choice is a tie.
  for (int width : {1, 3, 256}) {
    for (int layers : {1, 2, 5, 8, 13}) {
      ModelConfig m;
      m.layers = layers;
      m.width = width;
      for (int world = 1; world <= m.param_tensors(); ++world)
        EXPECT_EQ(zero1_owners(m, world), owners_by_scan(m, world))
            << layers << " x " << width << ", world " << world;
    }
  }
}

TEST(Partition, Zero1RanksTogetherHoldTheWholeOptimizerState) {
  // 100,000 layers over 65,536 ranks: the largest zero1 job a run or a plan accepts.
  RunConfig cfg;
  cfg.model.layers = 100'000;
  cfg.model.width = 1'000;
  cfg.strategy = StrategyKind::zero1;
  const int world = 65'536;
  const std::vector<Prediction> ranks = predict_data_parallel_ranks(cfg, world);
  ASSERT_EQ(ranks.size(), static_cast<std::size_t>(world));
  const std::int64_t P = cfg.model.params(), T = cfg.model.param_tensors();
  std::int64_t optim = 0, least = INT64_MAX, most = 0;
  for (const Prediction& p : ranks) {
    optim += p.resting[Category::optim];
    least = std::min(least, p.resting[Category::optim]);
    most = std::max(most, p.resting[Category::optim]);
    EXPECT_EQ(p.resting[Category::param], 4 * P);
    EXPECT_EQ(p.peak_total - p.resting.total(), ranks[0].peak_total - ranks[0].resting.total());
  }
  EXPECT_EQ(optim, 8 * P + 4 * T);  // each tensor's exp_avg, exp_avg_sq and step, once
  // Greedy by size: no rank holds more than one weight (and its step) beyond another.
  EXPECT_LE(most - least, 8 * cfg.model.weight_elems() + 4 * 3);
  EXPECT_EQ(predict_data_parallel(cfg, world, 12'345).resting.total(), ranks[12'345].resting.total());
}

TEST(Partition, OneLayerUnitsOfAHundredThousandLayers) {
  // zero2 keeps every unit gathered until its backward: as the last unit's backward (the
  // first to run) makes its input gradient, the rank holds all L gathered units, that
  // unit's full gradient, and L + 2 activations (the batch, the outputs of layers 0 to
  // L-2 that the Linears saved, dy and dx; no activation, `sum` loss).
  RunConfig cfg;
  cfg.model.layers = 100'000;
  cfg.model.width = 100;
  cfg.model.batch = 10;
  cfg.strategy = StrategyKind::zero2;
  cfg.layers_per_unit = 1;
  const int world = 4;
  const Prediction p = predict_data_parallel(cfg, world, 3);
  const std::int64_t L = cfg.model.layers;
  const std::int64_t f = 4 * ((cfg.model.layer_elems() + world - 1) / world * world);  // a gathered unit
  const std::int64_t a = cfg.model.activation_bytes(cfg.model.batch);
  EXPECT_EQ(p.resting.total(), L * (4 * f / world + 4));
  EXPECT_EQ(p.peak_total - p.resting.total(), (L + 1) * f + (L + 2) * a);
  EXPECT_EQ(std::string(phase_name(p.peak_phase)), "backward");
  EXPECT_EQ(p.peak_where, "unit 99999");
}

}  // namespace
}  // namespace shardscope
