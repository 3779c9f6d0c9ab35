// What zero2 and zero3 share under both engines (fsdp.hpp: FSDP1's flat units; fsdp2.hpp:
// fully_shard's per-tensor shards): the units (fsdp_units) and when each is gathered,
// resharded and reduced around its blocks.
//   forward   a unit is gathered before its first block; zero3 reshards it after its
//             last block, except a root unit (the MLP's single unit, a transformer's unit
//             0), which torch never reshards after forward;
//   backward  when a unit's backward begins it is gathered (with --prefetch the next
//             unit in backward order too) and its full gradients are allocated; when it
//             ends they are reduce-scattered into the shard and the unit is resharded.
// --accumulate K: a micro-step that does not sync (--no-sync, all but the last) neither
// reduce-scatters nor frees a unit's full gradients: they are kept, unsharded, and the
// next micro-steps' backward adds onto them (FSDP1's no_sync, fully_shard's
// set_requires_gradient_sync(False)); the unit is resharded as usual, except where the
// engine keeps it gathered (FSDP1's SHARD_GRAD_OP). Without --no-sync every micro-step
// reduce-scatters fresh full gradients, adding onto the shard after the first.
// With --overlap on the prefetch (prefetch()) posts the all-gather and returns; the
// unit's gather() when its backward begins waits for it. An engine may post reduce_unit's
// reduce-scatter too and wait for it at the next unit's, or in reduce_gradients() after
// the backward (fsdp.hpp, fsdp2.hpp). Every block's hooks let posted collectives progress
// (Communicator::progress).
// A unit's range ("unit 3") spans its forward from the gather to the reshard and its
// backward from the gather to the reduce-scatter; its blocks' ranges nest inside (the
// model closes a block's range before the hooks run).
#pragma once

#include <vector>

#include "harness/strategies/data_parallel.hpp"
#include "harness/strategies/partition.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {

class UnitShardedStrategy : public DataParallelStrategy, private BlockAccess {
 public:
  UnitShardedStrategy(const StrategyContext& ctx, bool full_shard);
  // Units of `layers_per_unit` blocks (fsdp_units' K) in place of --units'.
  UnitShardedStrategy(const StrategyContext& ctx, bool full_shard, int layers_per_unit);
  int units() const override { return static_cast<int>(units_.size()); }

 protected:
  BlockAccess& access() override { return *this; }
  void reduce_gradients() override {}  // done per unit in backward

  // The engine's side: gathering a unit (nothing when it is gathered already), freeing
  // its gathered parameters, allocating its full gradients when its backward begins,
  // and reduce-scattering them into the shard (freeing them) when it ends.
  virtual void gather(int unit) = 0;
  // The BACKWARD_PRE prefetch of `unit`: allocates its gathered parameters now, as
  // gather() does; an engine that can, posts the all-gather without waiting (--overlap
  // on) and gather() waits for it. By default the gather itself.
  virtual void prefetch(int unit) { gather(unit); }
  virtual void reshard(int unit) = 0;
  virtual void begin_unit_gradient(int unit) = 0;
  // When the unit's backward ends, before its reduce-scatter (or, not syncing, its
  // reshard): by default nothing (fsdp2.hpp folds bf16 gradients into fp32 ones here).
  virtual void end_unit_gradient(int /*unit*/) {}
  virtual void reduce_unit(int unit) = 0;
  // Under --no-sync, whether a unit stays gathered after a backward that did not sync
  // (FSDP1 keeps SHARD_GRAD_OP's, a heuristic trading memory for fewer gathers).
  virtual bool keeps_gathered_unsynced() const { return false; }
  // Whether this micro-step's reduce-scatter adds onto the shard's gradient (through a
  // staging output) rather than writing it: every micro-step after the first, unless
  // --no-sync reduces only once.
  bool adds_to_shard() const { return !cfg_.no_sync && micro_step_index() > 0; }
  // A fresh full gradient every micro-step that reduces; kept ones (--no-sync) add.
  float backward_beta(int k) const override { return cfg_.no_sync && k > 0 ? 1.0f : 0.0f; }

  // Unit u's blocks, in the order its flat buffers concatenate them.
  std::vector<int> blocks_of(int unit) const { return units_[unit].block_list(); }

  bool full_shard_;  // zero3
  std::vector<Unit> units_;
  std::vector<int> unit_of_block_;

 private:
  // BlockAccess's hooks; param() and grad() are the engine's.
  // FSDP's root casts the model's input under MixedPrecision (cast_root_forward_inputs);
  // DeepSpeed's bf16 (DeepSpeedZero, on these units) does not.
  bool casts_input_at_root() const final {
    return cfg_.model.param_bf16 && effective_engine(cfg_.engine, cfg_.strategy, cfg_.precision) != EngineKind::deepspeed;
  }
  void before_forward(int block) final;
  void after_forward(int block) final;
  void before_backward(int block) final;
  void after_backward(int block) final;

  void begin_unit_range(int unit);  // closed by range_pop in the hooks
  bool reshard_after_forward(int unit) const;
};

}  // namespace shardscope
