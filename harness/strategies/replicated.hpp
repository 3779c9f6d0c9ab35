// Strategies that keep full parameters and full gradients on every rank: ddp and
// zero1. Gradients are one flat buffer (torch DDP's gradient_as_bucket_view=True),
// all-reduced in buckets that are views of it; `--ddp-bucket copy` keeps a separate
// flat bucket from step to step (category grad) as torch's default DDP does.
// With --overlap on, as torch's Reducer: a bucket's all-reduce is posted as soon as the
// last of its gradients is written (when the backward of the lowest block it covers has
// ended) and backward goes on; reduce_gradients waits for each in turn, then averages.
// Buckets are views of memory held all step, so overlap allocates nothing.
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

 private:
  // FlatAccess with the backward hooks that post buckets (--overlap on).
  class Access final : public FlatAccess {
   public:
    Access(const Model& model, float* params, float* grads, ReplicatedStrategy* owner)
        : FlatAccess(model, params, grads), owner_(owner) {}
    void before_backward(int) override { owner_->comm_.progress(); }
    void after_backward(int block) override { owner_->block_backward_done(block); }

   private:
    ReplicatedStrategy* owner_;
  };
  // Posts the buckets whose gradients are all written once `block`'s backward is done.
  void block_backward_done(int block);
  void post_bucket(std::size_t i);       // copies into the bucket (copy mode), posts
  void finish_bucket(std::size_t i);     // averages (and copies back): after its all-reduce
  std::vector<std::pair<std::int64_t, std::int64_t>> buckets_;  // (offset, count) in reduce order
  std::vector<CommTicket> in_flight_;    // per bucket, posted in backward (--overlap on)
  std::size_t next_bucket_ = 0;          // the first bucket not yet posted this backward

 protected:
  std::vector<AdamState> state_;  // per tensor; empty buffers where not owned
  Access access_;
};

// (offset, count) of each bucket in the flat vector, in reduce order.
std::vector<std::pair<std::int64_t, std::int64_t>> ddp_buckets(const Model& m, double bucket_mb);

}  // namespace shardscope
