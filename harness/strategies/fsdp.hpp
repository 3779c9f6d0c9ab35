// zero2 and zero3 as torch FSDP1 with use_orig_params=False: one flat parameter per
// unit, padded to a multiple of W; rank r owns the r-th contiguous slice of each.
// Forward all-gathers a unit before its first layer; zero3 frees it after the unit's
// forward (except a single root unit, which torch never reshards after forward) and
// gathers it again in backward; zero2 keeps it until the unit's backward ends.
// Backward gives each unit a full flat gradient, reduce-scattered into the shard.
#pragma once

#include <vector>

#include "harness/strategies/data_parallel.hpp"
#include "harness/strategies/partition.hpp"
#include "harness/strategies/replicated.hpp"

namespace shardscope {

class FsdpStrategy : public DataParallelStrategy, private LayerAccess {
 public:
  FsdpStrategy(const StrategyContext& ctx, bool full_shard);
  void setup() override;
  HostState gather_state() override;
  int units() const override { return static_cast<int>(units_.size()); }

 protected:
  LayerAccess& access() override { return *this; }
  void reduce_gradients() override {}  // done per unit in backward
  void optimizer_step(int step) override;

 private:
  // LayerAccess
  const float* weight(int layer) override;
  const float* bias(int layer) override;
  float* weight_grad(int layer) override;
  float* bias_grad(int layer) override;
  void before_forward(int layer) override;
  void after_forward(int layer) override;
  void before_backward(int layer) override;
  void after_backward(int layer) override;

  void gather(int unit);
  void begin_unit_range(int unit);  // "unit 3"; closed by range_pop in the hooks
  bool reshard_after_forward() const { return full_shard_ && units_.size() > 1; }
  std::int64_t layer_offset(int layer) const;  // in the unit's flat vector

  bool full_shard_;  // zero3
  std::vector<Unit> units_;
  std::vector<int> unit_of_layer_;
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
