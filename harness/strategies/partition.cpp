#include "harness/strategies/partition.hpp"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

#include "harness/predict/transformer_forms.hpp"
#include "shardscope/check.hpp"

namespace shardscope {

std::vector<int> zero1_owners(const std::vector<std::int64_t>& elems, int world) {
  const int t_count = static_cast<int>(elems.size());
  std::vector<int> order(t_count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return elems[a] > elems[b];
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
    least.push({load + elems[t], r});
  }
  return owner;
}

std::vector<int> zero1_owners(const ModelConfig& model, int world) {
  if (model.is_transformer()) return zero1_owners(transformer_tensor_sizes(model.transformer), world);
  std::vector<std::int64_t> elems;
  for (int t = 0; t < model.param_tensors(); ++t) elems.push_back(model.tensor_elems(t));
  return zero1_owners(elems, world);
}

std::vector<Unit> fsdp_units(const std::vector<std::int64_t>& block_elems, int blocks_per_unit, int world) {
  const int n = static_cast<int>(block_elems.size());
  const int k = blocks_per_unit <= 0 ? n : blocks_per_unit;
  std::vector<Unit> units;
  std::int64_t offset = 0;
  for (int first = 0; first < n; first += k) {
    Unit u;
    u.first_block = first;
    u.last_block = std::min(n, first + k);
    u.flat_offset = offset;
    for (int b = u.first_block; b < u.last_block; ++b) u.elems += block_elems[b];
    u.shard = (u.elems + world - 1) / world;
    u.padded = u.shard * world;
    offset += u.elems;
    units.push_back(u);
  }
  // One unit of the whole model is the root (torch's only FSDP module).
  if (units.size() == 1) units.front().root = true;
  return units;
}

std::vector<Unit> fsdp_units(const std::vector<std::int64_t>& block_elems, const std::vector<std::vector<int>>& groups,
                             int world) {
  // Each block's offset in the model's flat vector.
  std::vector<std::int64_t> offset(block_elems.size() + 1, 0);
  for (std::size_t b = 0; b < block_elems.size(); ++b) offset[b + 1] = offset[b] + block_elems[b];
  std::vector<Unit> units;
  units.reserve(groups.size());
  for (const std::vector<int>& group : groups) {
    Unit u;
    u.first_block = group.front();
    u.last_block = group.back() + 1;
    bool contiguous = true;
    for (std::size_t i = 0; i < group.size(); ++i) {
      u.elems += block_elems[group[i]];
      if (group[i] != group.front() + static_cast<int>(i)) contiguous = false;
    }
    if (!contiguous) u.blocks = group;
    u.flat_offset = offset[group.front()];
    u.shard = (u.elems + world - 1) / world;
    u.padded = u.shard * world;
    units.push_back(std::move(u));
  }
  return units;
}

std::vector<Unit> fsdp_units(const ModelConfig& model, int layers_per_unit, int world, int tp) {
  if (model.is_transformer()) {
    std::vector<Unit> units = fsdp_units(transformer_block_sizes(model.transformer, tp),
                                         transformer_unit_blocks(model.transformer, layers_per_unit), world);
    units.front().root = true;  // transformer_unit_blocks puts the root first
    return units;
  }
  SHARDSCOPE_REQUIRE(tp == 1, "fsdp units: the tensor-parallel MLP is not unit-sharded");
  return fsdp_units(std::vector<std::int64_t>(model.layers, model.layer_elems()), layers_per_unit, world);
}

std::vector<int> Unit::block_list() const {
  if (!blocks.empty()) return blocks;
  std::vector<int> out;
  for (int b = first_block; b < last_block; ++b) out.push_back(b);
  return out;
}

std::int64_t Dim0Shard::local_rows(int rank) const {
  const std::int64_t begin = chunk_rows * rank;
  return std::max<std::int64_t>(0, std::min(chunk_rows, rows - begin));
}

Dim0Shard dim0_shard(const std::vector<std::int64_t>& shape, int world) {
  Dim0Shard s;
  s.rows = shape.empty() ? 1 : shape.front();
  for (std::size_t d = 1; d < shape.size(); ++d) s.row_elems *= shape[d];
  s.chunk_rows = (s.rows + world - 1) / world;
  return s;
}

}  // namespace shardscope
