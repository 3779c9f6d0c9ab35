// What every data-parallel strategy shares: the step (batch, forward, loss,
// backward, gradient communication, optimizer) with hooks for what differs.
#pragma once

#include <memory>
#include <vector>

#include "harness/model/model.hpp"
#include "harness/model/saved_tensors.hpp"
#include "shardscope/strategy.hpp"

namespace shardscope {

class DataParallelStrategy : public Strategy {
 public:
  explicit DataParallelStrategy(const StrategyContext& ctx);
  void prepare_batch(int index) override;
  float step() override;
  const SavedTensors& saved() const { return saved_; }
  SavedAfterForward saved_after_forward() const override { return saved_after_forward_; }

 protected:
  // The block access the engine uses (gathers for ZeRO-2/3 happen in its hooks).
  virtual BlockAccess& access() = 0;
  // After backward: make gradients the average over ranks (all-reduce, ...).
  virtual void reduce_gradients() = 0;
  // The optimizer on what this rank owns; `step` counts from 1.
  virtual void optimizer_step(int step) = 0;
  // The backward's beta for micro-step k (0 overwrites the gradients its access gives,
  // 1 adds onto them): the full gradients accumulate from the second micro-step on.
  virtual float backward_beta(int k) const { return k == 0 ? 0.0f : 1.0f; }

  // --accumulate: which micro-step runs (0 to K - 1), and whether it reduces the
  // gradients (every micro-step, or only the last under --no-sync; an engine may say
  // otherwise: DeepSpeed's stage 1 reduces only at the accumulation boundary).
  int micro_step_index() const { return micro_; }
  bool last_micro_step() const { return micro_ + 1 == cfg_.accumulate; }
  virtual bool syncs() const { return !cfg_.no_sync || last_micro_step(); }

  // HSDP: a gradient shard the shard group has reduced, averaged across the replicate
  // group in place (nothing without one); before it is added to what earlier micro-steps
  // left, as FSDP1 and fully_shard all-reduce the reduce-scatter's output.
  void average_replicas(float* shard, std::size_t n);

  // Allocates and initialises a tensor (category param) from the flat slice.
  Buffer init_params(std::int64_t flat_begin, std::int64_t count);
  Buffer zeros(Category c, std::size_t count);
  std::vector<float> download(const Buffer& b) const;
  std::vector<float> download(const float* p, std::size_t n) const;

  const RunConfig& cfg_;
  Backend& backend_;
  Communicator& comm_;
  Communicator* tp_;  // the tensor-parallel group's (null: none)
  Communicator* replicate_;  // HSDP's replicate group (null: none)
  SavedTensors saved_;
  std::unique_ptr<Model> model_;  // the blocks and the loss cfg.model names
  AdamWHyper hyper_;
  int steps_done_ = 0;
  SavedAfterForward saved_after_forward_;

 private:
  // The rank's rows of micro-step k's batch (rows k x batch on of the K-fold batch).
  DataSlice batch_slice(int k) const;
  // One micro-step: forward of micro-batch k, the loss scaled by 1/K, backward with
  // beta 0 on the first micro-step and 1 after; returns the scaled loss.
  float micro_step(int k);
  std::vector<std::vector<float>> host_batches_;  // one per micro-step
  int data_rank_;  // whose rows this rank draws
  int batch_index_ = 0;
  int micro_ = 0;
};

// Plain pointers into full (unsharded) flat parameter and gradient vectors, laid out
// as the model's flat vector.
class FlatAccess : public BlockAccess {
 public:
  FlatAccess(const Model& model, float* params, float* grads) : model_(&model), p_(params), g_(grads) {}
  const float* param(int block, int tensor) override { return p_ + offset(block, tensor); }
  float* grad(int block, int tensor) override { return g_ + offset(block, tensor); }

 private:
  std::int64_t offset(int block, int tensor) const {
    return model_->tensor_offset(model_->first_tensor(block) + tensor);
  }
  const Model* model_;
  float* p_;
  float* g_;
};

}  // namespace shardscope
