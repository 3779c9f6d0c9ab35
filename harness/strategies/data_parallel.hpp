// What every data-parallel strategy shares: the step (batch, forward, loss,
// backward, gradient communication, optimizer) with hooks for what differs.
#pragma once

#include <vector>

#include "harness/model/mlp.hpp"
#include "harness/model/saved_tensors.hpp"
#include "shardscope/strategy.hpp"

namespace shardscope {

class DataParallelStrategy : public Strategy {
 public:
  explicit DataParallelStrategy(const StrategyContext& ctx);
  void prepare_batch(int index) override;
  float step() override;
  const SavedTensors& saved() const { return saved_; }

 protected:
  // The layer access the engine uses (gathers for ZeRO-2/3 happen in its hooks).
  virtual LayerAccess& access() = 0;
  // After backward: make gradients the average over ranks (all-reduce, ...).
  virtual void reduce_gradients() = 0;
  // The optimizer on what this rank owns; `step` counts from 1.
  virtual void optimizer_step(int step) = 0;

  // Allocates and initialises a tensor (category param) from the flat slice.
  Buffer init_params(std::int64_t flat_begin, std::int64_t count);
  Buffer zeros(Category c, std::size_t count);
  std::vector<float> download(const Buffer& b) const;
  std::vector<float> download(const float* p, std::size_t n) const;

  const RunConfig& cfg_;
  Backend& backend_;
  Communicator& comm_;
  SavedTensors saved_;
  Mlp mlp_;
  AdamWHyper hyper_;
  int steps_done_ = 0;

 private:
  std::vector<float> host_batch_;
};

// Plain pointers into full (unsharded) flat parameter and gradient vectors.
class FlatAccess : public LayerAccess {
 public:
  FlatAccess(const ModelConfig& m, float* params, float* grads) : m_(m), p_(params), g_(grads) {}
  const float* weight(int l) override { return p_ + l * m_.layer_elems(); }
  const float* bias(int l) override { return p_ + l * m_.layer_elems() + m_.weight_elems(); }
  float* weight_grad(int l) override { return g_ + l * m_.layer_elems(); }
  float* bias_grad(int l) override { return g_ + l * m_.layer_elems() + m_.weight_elems(); }

 private:
  ModelConfig m_;
  float* p_;
  float* g_;
};

}  // namespace shardscope
