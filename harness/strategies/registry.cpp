#include "harness/strategies/registry.hpp"

#include <utility>

#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using Factory = std::unique_ptr<Strategy> (*)(const StrategyContext&);

const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> r = {
      {"ddp", make_ddp},
      {"zero1", make_zero1},
      {"zero2", make_zero2},
      {"zero3", make_zero3},
  };
  return r;
}

}  // namespace

const std::vector<std::string>& strategy_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [name, f] : registry()) n.push_back(name);
    return n;
  }();
  return names;
}

std::unique_ptr<Strategy> make_strategy(const StrategyContext& ctx) {
  for (const auto& [name, factory] : registry())
    if (name == ctx.cfg.strategy) return factory(ctx);
  throw UsageError("--strategy: unknown '" + ctx.cfg.strategy + "'; allowed: ddp, zero1, zero2, zero3");
}

}  // namespace shardscope
