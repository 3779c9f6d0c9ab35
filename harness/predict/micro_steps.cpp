#include "harness/predict/micro_steps.hpp"

#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

// FSDP1's SHARD_GRAD_OP: a unit is not freed after a backward that does not sync.
bool keeps_gathered(const RunConfig& cfg) {
  return cfg.strategy == StrategyKind::zero2 && effective_engine(cfg.engine, cfg.strategy) == EngineKind::torch;
}

}  // namespace

std::vector<MicroStep> micro_steps(const RunConfig& cfg) {
  const int K = cfg.accumulate;
  if (K <= 1) return {MicroStep{}};
  if (!cfg.no_sync) {
    MicroStep later;
    later.adds_to_shard = true;
    return {MicroStep{}, later};
  }
  const bool keep = keeps_gathered(cfg);
  MicroStep first, middle, last;
  first.reduces = false;
  first.keeps_params = keep;
  middle.grads_held = true;
  middle.reduces = false;
  middle.params_held = keep;
  middle.keeps_params = keep;
  last.grads_held = true;
  last.params_held = keep;
  if (K == 2) return {first, last};
  return {first, middle, last};
}

int gathers_per_step(const RunConfig& cfg) { return cfg.no_sync && keeps_gathered(cfg) ? 1 : cfg.accumulate; }

int reductions_per_step(const RunConfig& cfg) { return cfg.no_sync ? 1 : cfg.accumulate; }

}  // namespace shardscope
