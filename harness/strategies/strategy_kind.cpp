#include "shardscope/strategy_kind.hpp"

namespace shardscope {

std::string strategy_names_text() { return join_names(kStrategyNames, ", "); }

StrategyKind parse_strategy(const std::string& name, const std::string& flag) {
  return parse_named<StrategyKind>(kStrategyNames, name, flag);
}

}  // namespace shardscope
