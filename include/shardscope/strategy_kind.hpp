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

}  // namespace shardscope
