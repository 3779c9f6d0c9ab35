// How the sharded strategies split the model (docs/design.md §3), shared by the strategies
// and by the closed-form predictions.
#pragma once

#include <cstdint>
#include <vector>

#include "shardscope/config.hpp"

namespace shardscope {

// ZeRO-1 as torch's ZeroRedundancyOptimizer: whole tensors, sorted by size
// descending (stable), each to the least-loaded rank (ties to the lowest rank).
// Returns the owner of each parameter tensor, in torch order.
std::vector<int> zero1_owners(const ModelConfig& model, int world);

// One FSDP flat parameter: layers [first_layer, last_layer), `elems` parameters
// starting at `flat_offset` of the model's flat vector, padded to `padded`
// (a multiple of world); each rank owns `shard` = padded / world of them.
struct Unit {
  int first_layer = 0;
  int last_layer = 0;
  std::int64_t flat_offset = 0;
  std::int64_t elems = 0;
  std::int64_t padded = 0;
  std::int64_t shard = 0;
};

// K layers per unit (the last takes what is left); K = 0 means one root unit.
std::vector<Unit> fsdp_units(const ModelConfig& model, int layers_per_unit, int world);

}  // namespace shardscope
