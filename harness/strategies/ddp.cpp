// ddp: torch DistributedDataParallel (gradient_as_bucket_view=True by default here;
// --ddp-bucket copy for torch's default). Every rank updates every tensor.
#include "harness/strategies/registry.hpp"
#include "harness/strategies/replicated.hpp"

namespace shardscope {
namespace {

class Ddp final : public ReplicatedStrategy {
 public:
  using ReplicatedStrategy::ReplicatedStrategy;

 protected:
  bool owns(int) const override { return true; }
  int owner(int) const override { return 0; }  // every rank holds it; rank 0 speaks for all
  void optimizer_step(int step) override { update_owned(step); }
};

}  // namespace

std::unique_ptr<Strategy> make_ddp(const StrategyContext& ctx) { return std::make_unique<Ddp>(ctx); }

}  // namespace shardscope
