#include "harness/strategies/partition.hpp"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

namespace shardscope {

std::vector<int> zero1_owners(const ModelConfig& model, int world) {
  const int t_count = model.param_tensors();
  std::vector<int> order(t_count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return model.tensor_elems(a) > model.tensor_elems(b);
  });
  // The least-loaded rank, ties to the lowest: the top of a min-heap on (load, rank),
  // so that a world of 65,536 ranks costs log W per tensor, not W.
  using Load = std::pair<std::int64_t, int>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> least;
  for (int r = 0; r < world; ++r) least.push({0, r});
  std::vector<int> owner(t_count, 0);
  for (int t : order) {
    auto [load, r] = least.top();
    least.pop();
    owner[t] = r;
    least.push({load + model.tensor_elems(t), r});
  }
  return owner;
}

std::vector<Unit> fsdp_units(const ModelConfig& model, int layers_per_unit, int world) {
  const int k = layers_per_unit <= 0 ? model.layers : layers_per_unit;
  std::vector<Unit> units;
  for (int first = 0; first < model.layers; first += k) {
    Unit u;
    u.first_layer = first;
    u.last_layer = std::min(model.layers, first + k);
    u.flat_offset = first * model.layer_elems();
    u.elems = (u.last_layer - u.first_layer) * model.layer_elems();
    u.shard = (u.elems + world - 1) / world;
    u.padded = u.shard * world;
    units.push_back(u);
  }
  return units;
}

}  // namespace shardscope
