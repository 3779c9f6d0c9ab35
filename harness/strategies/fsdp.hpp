// zero2 and zero3 as torch FSDP1 with use_orig_params=False: one flat parameter per
// unit, padded to a multiple of W; rank r owns the r-th contiguous slice of each.
// A unit is K consecutive blocks of the model (--units K); a transformer's units are K
// transformer blocks each after a root unit of the embeddings and the final block
// (blocks {0, L + 1}, not contiguous: fsdp_units), whose flat parameter concatenates
// the two blocks' parameters.
// Forward all-gathers a unit before its first block; zero3 frees it after the unit's
// forward (except a root unit, which torch never reshards after forward: the MLP's
// single unit, a transformer's unit 0) and gathers it again in backward; zero2 keeps it
// until the unit's backward ends.
// Backward gives each unit a full flat gradient, reduce-scattered into the shard.
#pragma once

#include <vector>

#include "harness/model/adam_state.hpp"
#include "harness/strategies/data_parallel.hpp"
#include "harness/strategies/partition.hpp"

namespace shardscope {

class FsdpStrategy : public DataParallelStrategy, private BlockAccess {
 public:
  FsdpStrategy(const StrategyContext& ctx, bool full_shard);
  void setup() override;
  HostState gather_state() override;
  int units() const override { return static_cast<int>(units_.size()); }

 protected:
  BlockAccess& access() override { return *this; }
  void reduce_gradients() override {}  // done per unit in backward
  void optimizer_step(int step) override;

 private:
  // BlockAccess
  const float* param(int block, int tensor) override;
  float* grad(int block, int tensor) override;
  void before_forward(int block) override;
  void after_forward(int block) override;
  void before_backward(int block) override;
  void after_backward(int block) override;

  void gather(int unit);
  void begin_unit_range(int unit);  // "unit 3"; closed by range_pop in the hooks
  bool reshard_after_forward(int unit) const;
  // Where tensor `tensor` of block `block` starts in its unit's flat vector.
  std::int64_t offset_in_unit(int block, int tensor) const;
  // Unit u's blocks, in the order its flat parameter concatenates them.
  std::vector<int> blocks_of(int unit) const;
  // Elements [begin, begin + count) of unit u's flat parameter at initialisation (past
  // its end: padding, zero).
  std::vector<float> init_unit_slice(int unit, std::int64_t begin, std::int64_t count) const;

  bool full_shard_;  // zero3
  std::vector<Unit> units_;
  std::vector<int> unit_of_block_;
  std::vector<std::int64_t> block_offset_in_unit_;  // where each block starts in its unit's flat vector
  struct UnitState {
    Buffer shard;       // (shard) param
    Buffer grad_shard;  // (shard) grad
    AdamState adam;     // (shard) optim, one step scalar per flat parameter
    Buffer full;        // (padded) param_unsharded while gathered
    Buffer full_grad;   // (padded) grad_unsharded during the unit's backward
  };
  std::vector<UnitState> state_;
};

}  // namespace shardscope
