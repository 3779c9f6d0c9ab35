#include "shardscope/strategy_kind.hpp"

namespace shardscope {

std::string strategy_names_text() { return join_names(kStrategyNames, ", "); }

StrategyKind parse_strategy(const std::string& name, const std::string& flag) {
  return parse_named<StrategyKind>(kStrategyNames, name, flag);
}

EngineKind parse_engine(const std::string& name) {
  const std::optional<EngineKind> e = find_named<EngineKind>(kEngineNames, name);
  if (!e) throw UsageError("--engine: unknown '" + name + "'; allowed: " + join_names(kEngineNames, ", "));
  return *e;
}

PrecisionKind parse_precision(const std::string& name) {
  return parse_named<PrecisionKind>(kPrecisionNames, name, "--precision");
}

}  // namespace shardscope
