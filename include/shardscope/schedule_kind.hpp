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
  zbv,               // zero-bubble V: two chunks per stage in a V, the backward split (torch's ScheduleZBVZeroBubble)
};

inline constexpr int kScheduleCount = 5;

inline constexpr std::array<std::string_view, kScheduleCount> kScheduleNames = {"gpipe", "1f1b", "interleaved-1f1b",
                                                                                "zb-h1", "zbv"};

inline constexpr std::string_view schedule_name(ScheduleKind s) { return kScheduleNames[static_cast<int>(s)]; }

// The schedule named `name`, or nothing.
inline constexpr std::optional<ScheduleKind> find_schedule(std::string_view name) { return find_named<ScheduleKind>(kScheduleNames, name); }

// "gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv" (or with " | " between): what a refusal lists as
// allowed, and --help.
std::string schedule_names_text(const std::string& separator = ", ");

// The schedule named `name`; throws UsageError("<flag>: unknown '<name>'; allowed: gpipe,
// 1f1b, interleaved-1f1b, zb-h1, zbv") for any other name.
ScheduleKind parse_schedule(const std::string& name, const std::string& flag = "--schedule");

// Chunks per stage a schedule takes when --chunks is not given: zbv's V is two, every
// other schedule one (interleaved-1f1b then refuses: it needs --chunks >= 2).
inline constexpr int default_chunks(ScheduleKind kind) { return kind == ScheduleKind::zbv ? 2 : 1; }

// Where the V = S·v virtual stages live. Megatron's interleaving (and one chunk): virtual
// stage k on stage k % S as its chunk k / S. zbv's V (torch's "v" stage-to-rank
// mapping): chunk 0 of stage s is virtual stage s and chunk 1 is 2S-1-s, so stage 0 holds
// both ends of the model and stage S-1 the V's bottom, two neighbours that pass their
// activation and gradient without a message.
inline constexpr bool v_placement(ScheduleKind kind) { return kind == ScheduleKind::zbv; }
inline constexpr int placed_vstage(ScheduleKind kind, int stages, int stage, int chunk) {
  return v_placement(kind) ? (chunk == 0 ? stage : 2 * stages - 1 - stage) : chunk * stages + stage;
}
inline constexpr int placed_stage(ScheduleKind kind, int stages, int vstage) {
  return v_placement(kind) ? (vstage < stages ? vstage : 2 * stages - 1 - vstage) : vstage % stages;
}
inline constexpr int placed_chunk(ScheduleKind kind, int stages, int vstage) {
  return v_placement(kind) ? (vstage < stages ? 0 : 1) : vstage / stages;
}

}  // namespace shardscope
