// zero1: torch ZeroRedundancyOptimizer under DDP. Gradients are all-reduced as in
// ddp; each rank keeps AdamW state for the tensors it owns, updates them, and the
// owners broadcast the updated parameters.
#include "harness/strategies/partition.hpp"
#include "harness/strategies/registry.hpp"
#include "harness/strategies/replicated.hpp"

namespace shardscope {
namespace {

class Zero1 final : public ReplicatedStrategy {
 public:
  explicit Zero1(const StrategyContext& ctx)
      : ReplicatedStrategy(ctx), owners_(zero1_owners(model_->tensor_sizes(), ctx.comm.world())) {}

 protected:
  bool owns(int t) const override { return owners_[t] == comm_.rank(); }
  int owner(int t) const override { return owners_[t]; }
  void optimizer_step(int step) override {
    update_owned(step);
    backend_.tracker().mark(Phase::communication);
    for (int t = 0; t < model_->param_tensors(); ++t) {
      backend_.tracker().mark(Phase::communication, {PlaceKind::tensor, t});
      comm_.broadcast(param(t), static_cast<std::size_t>(model_->tensor_elems(t)), owners_[t]);
    }
  }

 private:
  std::vector<int> owners_;
};

}  // namespace

std::unique_ptr<Strategy> make_zero1(const StrategyContext& ctx) {
  return std::make_unique<Zero1>(ctx);
}

}  // namespace shardscope
