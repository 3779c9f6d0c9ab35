// How the sharded strategies split the model (docs/design.md §3), shared by the strategies
// and by the closed-form predictions.
#pragma once

#include <cstdint>
#include <vector>

#include "shardscope/config.hpp"

namespace shardscope {

// ZeRO-1 as torch's ZeroRedundancyOptimizer: whole tensors, sorted by size
// descending (stable), each to the least-loaded rank (ties to the lowest rank).
// Takes each parameter tensor's elements, in torch order; returns each one's owner.
std::vector<int> zero1_owners(const std::vector<std::int64_t>& tensor_elems, int world);
// The same for the model `model` describes (the MLP's tensors: weight, bias, weight, ...;
// a transformer's: transformer_tensor_sizes).
std::vector<int> zero1_owners(const ModelConfig& model, int world);

// One FSDP flat parameter: blocks [first_block, last_block), `elems` parameters
// starting at `flat_offset` of the model's flat vector, padded to `padded`
// (a multiple of world); each rank owns `shard` = padded / world of them.
// A unit of blocks that are not contiguous (a transformer's root unit: the embeddings
// and the final norm and head, blocks {0, L + 1}) lists them in `blocks`, in the order
// its flat parameter concatenates them; first_block is then blocks.front(), last_block
// blocks.back() + 1, and flat_offset the offset of its first block. `blocks` is empty
// for a contiguous unit.
struct Unit {
  int first_block = 0;
  int last_block = 0;
  std::vector<int> blocks;  // only when not contiguous
  bool root = false;        // the root unit, which torch never reshards after forward
  std::int64_t flat_offset = 0;
  std::int64_t elems = 0;
  std::int64_t padded = 0;
  std::int64_t shard = 0;

  // The unit's blocks, in the order its flat parameter concatenates them.
  std::vector<int> block_list() const;
};

// K blocks per unit (the last takes what is left); K = 0 means one root unit. Takes
// each block's parameter elements, in order.
std::vector<Unit> fsdp_units(const std::vector<std::int64_t>& block_elems, int blocks_per_unit, int world);
// The same for the model `model` describes (the MLP's blocks: one Linear layer each; a
// transformer's: transformer_unit_blocks, a root unit and K transformer blocks a unit);
// tp > 1: a tensor-parallel transformer rank's blocks (transformer_block_sizes at tp).
std::vector<Unit> fsdp_units(const ModelConfig& model, int layers_per_unit, int world, int tp = 1);
// Units of the given groups of blocks, each group a unit (its blocks in flat order, not
// necessarily contiguous: transformer_unit_blocks in harness/predict/transformer_forms.hpp).
std::vector<Unit> fsdp_units(const std::vector<std::int64_t>& block_elems, const std::vector<std::vector<int>>& groups,
                             int world);

// One parameter tensor under torch's fully_shard (--engine fsdp2): `rows` rows along dim 0
// of `row_elems` elements each, split in torch.chunk sizes: every rank's shard is
// `chunk_rows` = ceil(rows / W) rows, rank r holding rows [r chunk_rows, r chunk_rows +
// local_rows(r)): the full chunk, the rows left, or none (the last ranks may get fewer
// rows or none). The sharded storage is padded to chunk_rows rows on every rank.
struct Dim0Shard {
  std::int64_t rows = 0;
  std::int64_t row_elems = 1;
  std::int64_t chunk_rows = 0;

  std::int64_t elems() const { return rows * row_elems; }
  std::int64_t padded() const { return chunk_rows * row_elems; }  // elements of every rank's storage
  std::int64_t local_rows(int rank) const;
  std::int64_t local(int rank) const { return local_rows(rank) * row_elems; }  // unpadded elements
};

// The shard of a tensor of `shape` (dim 0 first; a scalar is one row) over `world` ranks.
Dim0Shard dim0_shard(const std::vector<std::int64_t>& shape, int world);

}  // namespace shardscope
