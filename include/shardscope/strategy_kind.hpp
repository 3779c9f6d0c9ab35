// The data-parallel strategies (docs/design.md §3), each named once: the command line, the JSON
// ("strategy") and every table spell them as kStrategyNames does.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shardscope/names.hpp"

namespace shardscope {

enum class StrategyKind : std::uint8_t {
  ddp,    // replicated parameters, gradients and optimizer state; gradients all-reduced
  zero1,  // optimizer state partitioned by parameter tensor
  zero2,  // FSDP units; parameters gathered per unit and kept until the step ends
  zero3,  // FSDP units; parameters gathered per unit and freed after its use
};

inline constexpr int kStrategyCount = 4;

inline constexpr std::array<std::string_view, kStrategyCount> kStrategyNames = {"ddp", "zero1", "zero2", "zero3"};

inline constexpr std::string_view strategy_name(StrategyKind s) { return kStrategyNames[static_cast<int>(s)]; }

// The strategy named `name`, or nothing.
inline constexpr std::optional<StrategyKind> find_strategy(std::string_view name) { return find_named<StrategyKind>(kStrategyNames, name); }

// zero2 and zero3 gather and shard the model unit by unit (--units shapes them); ddp and
// zero1 hold the whole model as their one unit.
inline constexpr bool shards_by_unit(StrategyKind s) { return s == StrategyKind::zero2 || s == StrategyKind::zero3; }

// "ddp, zero1, zero2, zero3": what a refusal lists as allowed.
std::string strategy_names_text();

// The strategy named `name`; throws UsageError("<flag>: unknown '<name>'; allowed: ddp,
// zero1, zero2, zero3") for any other name.
StrategyKind parse_strategy(const std::string& name, const std::string& flag = "--strategy");

// Whose layout the sharded strategies take (--engine, docs/design.md §3):
//   torch  DDP, ZeroRedundancyOptimizer and FSDP1 flat parameters (one per unit);
//   fsdp2  zero2/zero3 as torch's fully_shard: every parameter tensor its own shard along
//          dim 0 (torch.chunk sizes); ddp and zero1 stay the torch engine's.
//   deepspeed  zero1/zero2/zero3 as DeepSpeed's ZeRO stages 1-3 (one flat parameter group
//          padded to the world, the ipg bucket; docs/design.md, "DeepSpeed"); ddp stays
//          torch's. Stage 3 is planned (its model states), not run.
enum class EngineKind : std::uint8_t { torch, fsdp2, deepspeed };

inline constexpr int kEngineCount = 3;

inline constexpr std::array<std::string_view, kEngineCount> kEngineNames = {"torch", "fsdp2", "deepspeed"};

inline constexpr std::string_view engine_name(EngineKind e) { return kEngineNames[static_cast<int>(e)]; }

// The engine a run of strategy `s` under --engine `e` actually lays out: fsdp2 changes
// zero2 and zero3 only, deepspeed zero1, zero2 and zero3 (its ddp is torch's).
inline constexpr EngineKind effective_engine(EngineKind e, StrategyKind s) {
  if (e == EngineKind::deepspeed) return s == StrategyKind::ddp ? EngineKind::torch : e;
  return shards_by_unit(s) ? e : EngineKind::torch;
}

// The engine named `name`; throws UsageError naming --engine for an unknown name
// ("allowed: torch, fsdp2, deepspeed").
EngineKind parse_engine(const std::string& name);

// The arithmetic a run trains in (--precision, docs/design.md §2):
//   fp32  every tensor fp32 (the seed's semantics);
//   bf16  each engine's own mixed-precision regime: the torch engine's autocast (ddp,
//         zero1) or FSDP MixedPrecision(param_dtype=bf16, reduce_dtype=fp32) (zero2,
//         zero3); fsdp2's MixedPrecisionPolicy of the same dtypes.
enum class PrecisionKind : std::uint8_t { fp32, bf16 };

inline constexpr int kPrecisionCount = 2;

inline constexpr std::array<std::string_view, kPrecisionCount> kPrecisionNames = {"fp32", "bf16"};

inline constexpr std::string_view precision_name(PrecisionKind p) { return kPrecisionNames[static_cast<int>(p)]; }

// The precision named `name`; throws UsageError("--precision: unknown '<name>'; allowed:
// fp32, bf16") for any other name. Whether a configuration runs it is the CLI's check.
PrecisionKind parse_precision(const std::string& name);

// The engine a run of strategy `s` in precision `p` lays out: effective_engine(e, s), but
// DeepSpeed's bf16 regime takes ddp too (the ZeRO paper's baseline: bf16 parameters and
// gradients, fp32 master weights and AdamW state on every rank).
inline constexpr EngineKind effective_engine(EngineKind e, StrategyKind s, PrecisionKind p) {
  return e == EngineKind::deepspeed && p == PrecisionKind::bf16 ? e : effective_engine(e, s);
}

}  // namespace shardscope
