// zero2 and zero3 as torch FSDP1 with use_orig_params=False: one flat parameter per
// unit, padded to a multiple of W; rank r owns the r-th contiguous slice of each.
// A unit is K consecutive blocks of the model (--units K); a transformer's units are K
// transformer blocks each after a root unit of the embeddings and the final block
// (blocks {0, L + 1}, not contiguous: fsdp_units), whose flat parameter concatenates
// the two blocks' parameters.
// When units are gathered, resharded and reduced: unit_sharded.hpp. Backward gives each
// unit a full flat gradient, reduce-scattered into the shard.
// --overlap on: a unit's reduce-scatter is posted when its backward ends and backward goes
// on; its full gradient (and, adding onto the shard, its staging output) is held until it
// is waited for: when the next unit's reduce-scatter is about to be posted, or after the
// backward (reduce_gradients) for the last one. One reduce-scatter is in flight at a time,
// as FSDP2's reduce_scatter_state keeps it; FSDP1 frees the input at once under
// record_stream, so the caching allocator reuses it only once the reduce-scatter has run:
// we take the wait as that moment, so that the bytes stay a closed form.
#pragma once

#include <vector>

#include "harness/model/adam_state.hpp"
#include "harness/strategies/unit_sharded.hpp"

namespace shardscope {

class FsdpStrategy : public UnitShardedStrategy {
 public:
  FsdpStrategy(const StrategyContext& ctx, bool full_shard);
  void setup() override;
  HostState gather_state() override;

 protected:
  void optimizer_step(int step) override;
  void gather(int unit) override;
  void prefetch(int unit) override;
  void reshard(int unit) override {
    comm_.wait(state_[unit].gathering);  // freed only after its all-gather completed
    state_[unit].full.reset();
  }
  void begin_unit_gradient(int unit) override;
  void reduce_unit(int unit) override;
  void reduce_gradients() override { finish_reduce(); }
  // FSDP1 frees an unsharded flat parameter after a backward without sync only under
  // strategies that reshard after forward (_should_free_in_backward): zero3's.
  bool keeps_gathered_unsynced() const override { return !full_shard_; }

 private:
  // BlockAccess
  const float* param(int block, int tensor) override;
  float* grad(int block, int tensor) override;

  // Where tensor `tensor` of block `block` starts in its unit's flat vector.
  std::int64_t offset_in_unit(int block, int tensor) const;
  // Elements [begin, begin + count) of unit u's flat parameter at initialisation (past
  // its end: padding, zero).
  std::vector<float> init_unit_slice(int unit, std::int64_t begin, std::int64_t count) const;

  std::vector<std::int64_t> block_offset_in_unit_;  // where each block starts in its unit's flat vector
  struct UnitState {
    Buffer shard;       // (shard) param
    Buffer grad_shard;  // (shard) grad
    AdamState adam;     // (shard) optim, one step scalar per flat parameter
    Buffer full;        // (padded) param_unsharded while gathered
    CommTicket gathering;  // full's all-gather, posted by prefetch and not yet waited for
    Buffer full_grad;   // (padded) grad_unsharded during the unit's backward
  };
  std::vector<UnitState> state_;

  // The reduce-scatter in flight (--overlap on): its unit, ticket and staging output.
  struct Reducing {
    int unit = -1;
    CommTicket ticket;
    Buffer out;  // (shard) comm: the output when it adds onto the shard, else empty
  };
  Reducing reducing_;
  // Waits for the reduce-scatter in flight, if any, averages it into the shard's gradient
  // and frees its full gradient and staging output.
  void finish_reduce();
};

}  // namespace shardscope
