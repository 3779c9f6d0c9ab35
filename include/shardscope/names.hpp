// A kind's table of names (kScheduleNames, kStrategyNames: entry i spells the kind whose
// value is i): the kind a name spells, the names a refusal lists as allowed, and the refusal.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "shardscope/check.hpp"

namespace shardscope {

// The kind named `name`, or nothing.
template <class Kind, std::size_t N>
constexpr std::optional<Kind> find_named(const std::array<std::string_view, N>& names, std::string_view name) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == name) return static_cast<Kind>(i);
  return std::nullopt;
}

// Every name in order, `separator` between.
template <std::size_t N>
std::string join_names(const std::array<std::string_view, N>& names, const std::string& separator) {
  std::string text;
  for (const std::string_view name : names) {
    if (!text.empty()) text += separator;
    text += name;
  }
  return text;
}

// The kind named `name`; throws UsageError("<flag>: unknown '<name>'; allowed: <the names>")
// for any other name.
template <class Kind, std::size_t N>
Kind parse_named(const std::array<std::string_view, N>& names, const std::string& name, const std::string& flag) {
  if (const std::optional<Kind> kind = find_named<Kind>(names, name)) return *kind;
  throw UsageError(flag + ": unknown '" + name + "'; allowed: " + join_names(names, ", "));
}

}  // namespace shardscope
