// The strategies, one factory each (one line per strategy in registry.cpp).
#pragma once

#include <memory>

#include "shardscope/strategy.hpp"

namespace shardscope {

std::unique_ptr<Strategy> make_ddp(const StrategyContext& ctx);
std::unique_ptr<Strategy> make_zero1(const StrategyContext& ctx);
std::unique_ptr<Strategy> make_zero2(const StrategyContext& ctx);
std::unique_ptr<Strategy> make_zero3(const StrategyContext& ctx);
// zero2 (full_shard false) or zero3 under --engine fsdp2 (fsdp2.hpp).
std::unique_ptr<Strategy> make_fsdp2(const StrategyContext& ctx, bool full_shard);
// ddp under bf16 (stage 0, deepspeed_stage0.hpp), zero1 (stage 1), zero2 (stage 2) or zero3
// (stage 3, deepspeed_zero3.hpp) under --engine deepspeed (deepspeed.hpp).
std::unique_ptr<Strategy> make_deepspeed(const StrategyContext& ctx, int stage);

}  // namespace shardscope
