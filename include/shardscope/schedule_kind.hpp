// The pipeline schedules (docs/design.md §4), each named once: the command line, the JSON
// ("schedule") and every table spell them as kScheduleNames does.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shardscope/names.hpp"

namespace shardscope {

enum class ScheduleKind : std::uint8_t {
  gpipe,             // every forward, then every backward
  one_f_one_b,       // one forward, one backward in the steady state
  interleaved_1f1b,  // 1F1B over --chunks pieces per stage (Megatron's interleaving)
  zb_h1,             // zero-bubble H1: the backward split into B and a later W
};

inline constexpr int kScheduleCount = 4;

inline constexpr std::array<std::string_view, kScheduleCount> kScheduleNames = {"gpipe", "1f1b", "interleaved-1f1b",
                                                                                "zb-h1"};

inline constexpr std::string_view schedule_name(ScheduleKind s) { return kScheduleNames[static_cast<int>(s)]; }

// The schedule named `name`, or nothing.
inline constexpr std::optional<ScheduleKind> find_schedule(std::string_view name) { return find_named<ScheduleKind>(kScheduleNames, name); }

// "gpipe, 1f1b, interleaved-1f1b, zb-h1" (or with " | " between): what a refusal lists as
// allowed, and --help.
std::string schedule_names_text(const std::string& separator = ", ");

// The schedule named `name`; throws UsageError("<flag>: unknown '<name>'; allowed: gpipe,
// 1f1b, interleaved-1f1b, zb-h1") for any other name.
ScheduleKind parse_schedule(const std::string& name, const std::string& flag = "--schedule");

}  // namespace shardscope
