#include "shardscope/strategy_kind.hpp"

#include "shardscope/check.hpp"

namespace shardscope {

std::string strategy_names_text() {
  std::string text;
  for (const std::string_view name : kStrategyNames) {
    if (!text.empty()) text += ", ";
    text += name;
  }
  return text;
}

StrategyKind parse_strategy(const std::string& name, const std::string& flag) {
  if (const std::optional<StrategyKind> s = find_strategy(name)) return *s;
  throw UsageError(flag + ": unknown '" + name + "'; allowed: " + strategy_names_text());
}

}  // namespace shardscope
