// Strategies that keep full parameters and full gradients on every rank: ddp and
// zero1. Gradients are one flat buffer (torch DDP's gradient_as_bucket_view=True),
// all-reduced in buckets that are views of it; `--ddp-bucket copy` keeps a separate
// flat bucket from step to step (category grad) as torch's default DDP does.
#pragma once

#include <vector>

#include "harness/model/adam_state.hpp"
#include "harness/strategies/data_parallel.hpp"

namespace shardscope {

class ReplicatedStrategy : public DataParallelStrategy {
 public:
  explicit ReplicatedStrategy(const StrategyContext& ctx);
  void setup() override;
  HostState gather_state() override;

 protected:
  BlockAccess& access() override { return access_; }
  void reduce_gradients() override;
  // Which tensors this rank keeps optimizer state for and updates.
  virtual bool owns(int tensor) const = 0;
  // Runs AdamW on the owned tensors.
  void update_owned(int step);
  // Rank that holds tensor t's optimizer state (for gather_state).
  virtual int owner(int tensor) const = 0;

  float* param(int t) const;
  float* grad(int t) const;

  Buffer params_;  // (P) flat, param
  Buffer grads_;   // (P) flat, grad
  Buffer bucket_;  // (P) flat, grad: only with --ddp-bucket copy
  std::vector<AdamState> state_;  // per tensor; empty buffers where not owned
  FlatAccess access_;

 private:
  std::vector<std::pair<std::int64_t, std::int64_t>> buckets_;  // (offset, count) in reduce order
};

// (offset, count) of each bucket in the flat vector, in reduce order.
std::vector<std::pair<std::int64_t, std::int64_t>> ddp_buckets(const Model& m, double bucket_mb);

}  // namespace shardscope
