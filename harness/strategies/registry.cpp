#include "harness/strategies/registry.hpp"

#include <array>

namespace shardscope {
namespace {

using Factory = std::unique_ptr<Strategy> (*)(const StrategyContext&);

// One factory per strategy, in StrategyKind's order.
constexpr std::array<Factory, kStrategyCount> kFactories = {make_ddp, make_zero1, make_zero2, make_zero3};

}  // namespace

std::unique_ptr<Strategy> make_strategy(const StrategyContext& ctx) {
  // ddp under --engine deepspeed is the torch engine's, but under bf16 DeepSpeed's stage 0.
  const EngineKind engine = effective_engine(ctx.cfg.engine, ctx.cfg.strategy, ctx.cfg.precision);
  if (engine == EngineKind::fsdp2) return make_fsdp2(ctx, ctx.cfg.strategy == StrategyKind::zero3);
  if (engine == EngineKind::deepspeed) return make_deepspeed(ctx, static_cast<int>(ctx.cfg.strategy));
  return kFactories[static_cast<int>(ctx.cfg.strategy)](ctx);
}

}  // namespace shardscope
