#include "harness/strategies/deepspeed.hpp"

#include <algorithm>

#include "harness/strategies/deepspeed_zero3.hpp"
#include "harness/strategies/registry.hpp"
#include "shardscope/check.hpp"

namespace shardscope {

DeepSpeedZero::DeepSpeedZero(const StrategyContext& ctx, int stage)
    // Stage 1 gives every gradient to one root unit (autograd's whole flat gradient); stage 2
    // one unit a block (the transformer's embeddings and final block one root unit).
    : UnitShardedStrategy(ctx, false, stage == 1 ? 0 : 1),
      stage_(stage),
      part_(ds_partition(model_->tensor_sizes(), ctx.comm.world(), ctx.comm.rank())),
      bucket_cap_(ds_bucket_elems(ctx.cfg.bucket_mb, model_->params())) {
  gip_offset_.assign(static_cast<std::size_t>(model_->param_tensors()), -1);
  std::int64_t at = 0;
  for (int t = part_.first_tensor; t < part_.end_tensor; ++t) {
    gip_offset_[t] = at;
    at += model_->tensor_elems(t);
  }
  block_offset_in_unit_.assign(static_cast<std::size_t>(model_->blocks()), 0);
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    std::int64_t in_unit = 0;
    for (int b : blocks_of(u)) {
      block_offset_in_unit_[b] = in_unit;
      in_unit += model_->block_elems(b);
    }
  }
  unit_grad_.resize(units_.size());
}

void DeepSpeedZero::setup() {
  backend_.tracker().mark(Phase::setup);
  // The flat group: the model's parameters, then zeros up to Ppad.
  flat_ = backend_.alloc(Category::param, static_cast<std::size_t>(part_.padded));
  std::vector<float> host = model_->init_flat_slice(cfg_.seed, 0, model_->params());
  host.resize(static_cast<std::size_t>(part_.padded), 0.0f);
  backend_.upload(flat_.data(), host.data(), host.size());
  const std::size_t s = static_cast<std::size_t>(part_.size);
  master_ = backend_.alloc(Category::param, s);
  backend_.copy(master_.data(), flat_.data() + part_.size * comm_.rank(), s);
  adam_ = make_adam_state(backend_, s);
}

std::int64_t DeepSpeedZero::tensor_offset(int block, int tensor) const {
  return model_->tensor_offset(model_->first_tensor(block) + tensor);
}

const float* DeepSpeedZero::param(int block, int tensor) { return flat_.data() + tensor_offset(block, tensor); }

float* DeepSpeedZero::grad(int block, int tensor) {
  if (stage_ == 1) return autograd_.data() + tensor_offset(block, tensor);
  const std::int64_t in_block = tensor_offset(block, tensor) - model_->block_offset(block);
  return unit_grad_[unit_of_block_[block]].data() + block_offset_in_unit_[block] + in_block;
}

void DeepSpeedZero::begin_unit_gradient(int u) {
  if (!bucket_) {
    // The backward's first unit: DeepSpeed's backward() makes the ipg bucket first.
    bucket_ = backend_.alloc(Category::comm, static_cast<std::size_t>(bucket_cap_));
    bucket_used_ = 0;
    in_bucket_.clear();
    if (stage_ == 2 && part_.touching > 0) gip_ = backend_.alloc(Category::grad, static_cast<std::size_t>(part_.touching));
    if (stage_ == 1) {
      autograd_ = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(model_->params()));
      return;
    }
  }
  if (stage_ == 2) {
    std::int64_t n = 0;
    for (int b : blocks_of(u)) n += model_->block_elems(b);
    unit_grad_[u] = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(n));
  }
}

void DeepSpeedZero::reduce_unit(int u) {
  if (stage_ == 1) return;  // stage 1 reduces after the whole backward
  // The unit's tensors as its hooks fire: last first.
  std::vector<std::pair<int, int>> tensors;  // (block, tensor of the model)
  for (int b : blocks_of(u))
    for (int t = model_->first_tensor(b); t < model_->first_tensor(b + 1); ++t) tensors.emplace_back(b, t);
  for (auto it = tensors.rbegin(); it != tensors.rend(); ++it)
    add_to_bucket(it->second, grad(it->first, it->second - model_->first_tensor(it->first)));
  unit_grad_[u].reset();
}

void DeepSpeedZero::add_to_bucket(int t, const float* src) {
  const std::int64_t n = model_->tensor_elems(t);
  if (bucket_used_ + n > bucket_cap_) reduce_bucket();
  backend_.copy(bucket_.data() + bucket_used_, src, static_cast<std::size_t>(n));
  in_bucket_.emplace_back(t, bucket_used_);
  bucket_used_ += n;
}

void DeepSpeedZero::reduce_bucket() {
  if (bucket_used_ == 0) return;
  const std::size_t n = static_cast<std::size_t>(bucket_used_);
  // DeepSpeed pre-divides by the world, then all-reduces.
  if (comm_.world() > 1) backend_.scale(bucket_.data(), 1.0f / static_cast<float>(comm_.world()), n);
  comm_.all_reduce_sum(bucket_.data(), n);
  for (const auto& [t, at] : in_bucket_) {
    if (!part_.touches(t)) continue;
    if (!gip_) gip_ = backend_.alloc(Category::grad, static_cast<std::size_t>(part_.touching));
    backend_.copy(gip_.data() + gip_offset_[t], bucket_.data() + at, static_cast<std::size_t>(model_->tensor_elems(t)));
  }
  in_bucket_.clear();
  bucket_used_ = 0;
}

void DeepSpeedZero::reduce_gradients() {
  if (stage_ == 1)
    for (int t = 0; t < model_->param_tensors(); ++t) add_to_bucket(t, autograd_.data() + model_->tensor_offset(t));
  reduce_bucket();
  // The epilogue: the first reduction's grads_in_partition is the accumulated gradient; a
  // later micro-step's (stage 2) is added onto it, and freed at the epilogue's end.
  if (!acc_)
    acc_ = std::move(gip_);
  else if (gip_)
    backend_.add(acc_.data(), gip_.data(), static_cast<std::size_t>(part_.touching));
  // At the boundary the partition's averaged gradient is its slice of the accumulated one
  // and, past P, a zero tensor (made here, with the bucket, stage 1's gradients and this
  // micro-step's grads_in_partition still held).
  if (last_micro_step() && part_.pad() > 0) pad_ = zeros(Category::grad, static_cast<std::size_t>(part_.pad()));
  bucket_.reset();
  autograd_.reset();
  gip_.reset();
}

void DeepSpeedZero::optimizer_step(int step) {
  const std::size_t s = static_cast<std::size_t>(part_.size), real = static_cast<std::size_t>(part_.real);
  // single_grad_partition: the averaged gradient flattened.
  Buffer g = backend_.alloc(Category::grad, s);
  if (real > 0) backend_.copy(g.data(), acc_.data() + part_.offset, real);
  if (s > real) backend_.copy(g.data() + real, pad_.data(), s - real);
  acc_.reset();
  pad_.reset();
  last_grad_ = download(g);
  backend_.fill(adam_.step.data(), static_cast<float>(step), 1);
  backend_.adamw(hyper_, {{master_.data(), g.data(), adam_.exp_avg.data(), adam_.exp_avg_sq.data(), s, step}});
  g.reset();
  // The updated partition into the flat group, then every rank's gathered in place.
  float* own = flat_.data() + part_.size * comm_.rank();
  backend_.copy(own, master_.data(), s);
  backend_.tracker().mark(Phase::communication);
  comm_.all_gather(own, flat_.data(), s);
}

HostState DeepSpeedZero::gather_state() {
  const std::size_t P = static_cast<std::size_t>(model_->params()), s = static_cast<std::size_t>(part_.size);
  HostState h;
  h.params = download(flat_.data(), P);
  Buffer grad = backend_.alloc(Category::temp, s);
  std::vector<float> last = last_grad_;
  last.resize(s, 0.0f);
  backend_.upload(grad.data(), last.data(), s);
  const float* sources[3] = {grad.data(), adam_.exp_avg.data(), adam_.exp_avg_sq.data()};
  std::vector<float>* targets[3] = {&h.grads, &h.exp_avg, &h.exp_avg_sq};
  for (int k = 0; k < 3; ++k) {
    Buffer full = backend_.alloc(Category::temp, static_cast<std::size_t>(part_.padded));
    comm_.all_gather(sources[k], full.data(), s);
    *targets[k] = download(full.data(), P);
  }
  return h;
}

std::unique_ptr<Strategy> make_deepspeed(const StrategyContext& ctx, int stage) {
  SHARDSCOPE_REQUIRE(stage >= 1 && stage <= 3, "deepspeed: ZeRO stages 1, 2 and 3");
  if (stage == 3) return std::make_unique<DeepSpeedZero3>(ctx);
  return std::make_unique<DeepSpeedZero>(ctx, stage);
}

}  // namespace shardscope
