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
// --precision bf16 (ModelConfig::param_bf16): FSDP1's MixedPrecision(param_dtype=bf16,
// reduce_dtype=fp32), measured with torch 2.15 (bench/torch_fsdp_mp.py). Shards, their
// gradients and AdamW's state stay fp32. A gather casts the shard to bf16 (param_cast,
// FSDP1's _mp_shard), all-gathers it into a bf16 unit (param_unsharded, 2 B an element)
// and frees the cast once the all-gather has completed; the blocks compute on views of it
// and write their gradients into a bf16 full gradient (grad_unsharded), which the unit's
// reduction first casts to an fp32 one (FSDP1's post-backward flat_param.grad.to(fp32),
// the bf16 freed after) and reduce-scatters in fp32, as without bf16.
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
    state_[unit].cast.reset();
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
    Buffer full;        // (padded) param_unsharded while gathered; bf16 under --precision bf16
    Buffer cast;        // (shard) bf16 param_cast of the shard until its all-gather completed (bf16)
    CommTicket gathering;  // full's all-gather, posted by prefetch and not yet waited for
    Buffer full_grad;   // (padded) grad_unsharded during the unit's backward (bf16 until its reduction's cast)
  };
  std::vector<UnitState> state_;
  bool bf16_ = false;  // --precision bf16: MixedPrecision(param_dtype=bf16, reduce_dtype=fp32)
  // Posts (or runs, when blocking) unit u's all-gather into a new s.full: fp32, or the bf16
  // cast of the shard into a bf16 unit.
  CommTicket gather_into_full(int u, bool blocking);
  // reduce_dtype=fp32: replaces unit u's bf16 full gradient by its fp32 cast (no-op in fp32).
  void cast_gradient_for_reduce(int u);

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
