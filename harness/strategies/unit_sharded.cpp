#include "harness/strategies/unit_sharded.hpp"

#include <cstdio>

namespace shardscope {

UnitShardedStrategy::UnitShardedStrategy(const StrategyContext& ctx, bool full_shard)
    : UnitShardedStrategy(ctx, full_shard, ctx.cfg.layers_per_unit) {}

UnitShardedStrategy::UnitShardedStrategy(const StrategyContext& ctx, bool full_shard, int layers_per_unit)
    : DataParallelStrategy(ctx),
      full_shard_(full_shard),
      units_(fsdp_units(ctx.cfg.model, layers_per_unit, ctx.comm.world(), ctx.tp ? ctx.tp->world() : 1)) {
  unit_of_block_.assign(static_cast<std::size_t>(model_->blocks()), -1);
  for (int u = 0; u < static_cast<int>(units_.size()); ++u)
    for (int b : blocks_of(u)) unit_of_block_[b] = u;
}

bool UnitShardedStrategy::reshard_after_forward(int u) const { return full_shard_ && !units_[u].root; }

void UnitShardedStrategy::begin_unit_range(int u) {
  char name[32];
  std::snprintf(name, sizeof(name), "unit %d", u);
  backend_.range_push(name);
}

void UnitShardedStrategy::before_forward(int block) {
  const int u = unit_of_block_[block];
  if (block == units_[u].first_block) {
    begin_unit_range(u);
    gather(u);
  }
  backend_.tracker().mark(Phase::forward, {PlaceKind::unit, u});
}

void UnitShardedStrategy::after_forward(int block) {
  const int u = unit_of_block_[block];
  if (block + 1 != units_[u].last_block) return;
  if (reshard_after_forward(u)) reshard(u);
  backend_.range_pop();
}

void UnitShardedStrategy::before_backward(int block) {
  const int u = unit_of_block_[block];
  backend_.tracker().mark(Phase::backward, {PlaceKind::unit, u});
  comm_.progress();
  if (block + 1 != units_[u].last_block) return;  // only when the unit's backward begins
  begin_unit_range(u);
  gather(u);
  // BACKWARD_PRE prefetch: the next unit in backward order is gathered now, while
  // this one computes, so both are held at once.
  if (cfg_.prefetch && u > 0) {
    prefetch(u - 1);
    backend_.tracker().mark(Phase::backward, {PlaceKind::unit, u});
  }
  begin_unit_gradient(u);
}

void UnitShardedStrategy::after_backward(int block) {
  const int u = unit_of_block_[block];
  comm_.progress();
  if (block != units_[u].first_block) return;  // only when the unit's backward ends
  end_unit_gradient(u);
  if (syncs()) {
    reduce_unit(u);
    reshard(u);  // every unit is resharded after its backward
  } else if (!keeps_gathered_unsynced()) {
    reshard(u);  // its full gradients kept for the next micro-step
  }
  backend_.range_pop();
}

}  // namespace shardscope
