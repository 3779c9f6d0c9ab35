#include "harness/strategies/deepspeed.hpp"

#include <algorithm>

#include "harness/strategies/deepspeed_stage0.hpp"
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
      bucket_cap_(ds_bucket_elems(ctx.cfg.bucket_mb, model_->tensor_sizes())),
      lp_(ctx.cfg.precision == PrecisionKind::bf16 ? DType::bf16 : DType::f32) {
  SHARDSCOPE_REQUIRE(lp_ == DType::f32 || ctx.cfg.model.param_bf16,
                     "deepspeed bf16: the model's bf16 module (the CLI refuses the rest)");
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
  // The flat group: the model's parameters, then zeros up to Ppad (bf16: rounded, as the
  // engine's module.bfloat16() rounds them).
  const std::size_t Ppad = static_cast<std::size_t>(part_.padded), s = static_cast<std::size_t>(part_.size);
  flat_ = backend_.alloc(Category::param, Ppad, lp_);
  std::vector<float> host = model_->init_flat_slice(cfg_.seed, 0, model_->params());
  host.resize(Ppad, 0.0f);
  if (lp_ == DType::bf16) {
    std::vector<Bf16> rounded(Ppad);
    for (std::size_t i = 0; i < Ppad; ++i) rounded[i] = to_bf16(host[i]);
    backend_.upload_bytes(flat_.raw(), rounded.data(), Ppad * sizeof(Bf16));
  } else {
    backend_.upload(flat_.data(), host.data(), Ppad);
  }
  // The optimizer's fp32 copy of the partition (bf16: the master weights, category master).
  float* own = at(flat_, part_.size * comm_.rank());
  if (lp_ == DType::bf16) {
    master_ = backend_.alloc(Category::master, s);
    backend_.cast_from_bf16(master_.data(), as_bf16(own), s, 0.0f);
  } else {
    master_ = backend_.alloc(Category::param, s);
    backend_.copy(master_.data(), own, s);
  }
  adam_ = make_adam_state(backend_, s);
}

std::int64_t DeepSpeedZero::tensor_offset(int block, int tensor) const {
  return model_->tensor_offset(model_->first_tensor(block) + tensor);
}

float* DeepSpeedZero::at(const Buffer& b, std::int64_t elem) const {
  return reinterpret_cast<float*>(static_cast<char*>(b.raw()) + elem * dtype_bytes(lp_));
}

void DeepSpeedZero::copy_lp(float* dst, const float* src, std::size_t n) {
  if (lp_ == DType::bf16)
    backend_.copy_bf16(as_bf16(dst), as_bf16(src), n);
  else
    backend_.copy(dst, src, n);
}

const float* DeepSpeedZero::param(int block, int tensor) { return at(flat_, tensor_offset(block, tensor)); }

float* DeepSpeedZero::grad(int block, int tensor) {
  if (stage_ == 1) return at(autograd_, tensor_offset(block, tensor));
  const std::int64_t in_block = tensor_offset(block, tensor) - model_->block_offset(block);
  return at(unit_grad_[unit_of_block_[block]], block_offset_in_unit_[block] + in_block);
}

void DeepSpeedZero::begin_unit_gradient(int u) {
  if (!bucket_) {
    // The backward's first unit: DeepSpeed's backward() makes the ipg bucket first.
    bucket_ = backend_.alloc(Category::comm, static_cast<std::size_t>(bucket_cap_), lp_);
    bucket_used_ = 0;
    in_bucket_.clear();
    if (stage_ == 2 && part_.touching > 0)
      gip_ = backend_.alloc(Category::grad, static_cast<std::size_t>(part_.touching), lp_);
    if (stage_ == 1) {
      autograd_ = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(model_->params()), lp_);
      return;
    }
  }
  if (stage_ == 2) {
    std::int64_t n = 0;
    for (int b : blocks_of(u)) n += model_->block_elems(b);
    unit_grad_[u] = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(n), lp_);
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
  copy_lp(at(bucket_, bucket_used_), src, static_cast<std::size_t>(n));
  in_bucket_.emplace_back(t, bucket_used_);
  bucket_used_ += n;
}

void DeepSpeedZero::reduce_bucket() {
  if (bucket_used_ == 0) return;
  const std::size_t n = static_cast<std::size_t>(bucket_used_);
  // DeepSpeed pre-divides by the world, then all-reduces (bf16: in bf16, its
  // communication_data_type under bf16).
  const float inv = 1.0f / static_cast<float>(comm_.world());
  if (lp_ == DType::bf16) {
    if (comm_.world() > 1) backend_.scale_bf16(bucket_.bf16(), inv, n);
    comm_.all_reduce_sum_bf16(bucket_.bf16(), n);
  } else {
    if (comm_.world() > 1) backend_.scale(bucket_.data(), inv, n);
    comm_.all_reduce_sum(bucket_.data(), n);
  }
  for (const auto& [t, off] : in_bucket_) {
    if (!part_.touches(t)) continue;
    if (!gip_) gip_ = backend_.alloc(Category::grad, static_cast<std::size_t>(part_.touching), lp_);
    copy_lp(at(gip_, gip_offset_[t]), at(bucket_, off), static_cast<std::size_t>(model_->tensor_elems(t)));
  }
  in_bucket_.clear();
  bucket_used_ = 0;
}

void DeepSpeedZero::reduce_gradients() {
  if (stage_ == 1)
    for (int t = 0; t < model_->param_tensors(); ++t) add_to_bucket(t, at(autograd_, model_->tensor_offset(t)));
  reduce_bucket();
  // The epilogue: the first reduction's grads_in_partition is the accumulated gradient; a
  // later micro-step's (stage 2) is added onto it, and freed at the epilogue's end.
  if (!acc_)
    acc_ = std::move(gip_);
  else if (gip_ && lp_ == DType::bf16)
    backend_.add_bf16(acc_.bf16(), gip_.bf16(), static_cast<std::size_t>(part_.touching));  // grad_accum_dtype bf16
  else if (gip_)
    backend_.add(acc_.data(), gip_.data(), static_cast<std::size_t>(part_.touching));
  // At the boundary the partition's averaged gradient is its slice of the accumulated one
  // and, past P, a zero tensor (made here, with the bucket, stage 1's gradients and this
  // micro-step's grads_in_partition still held).
  if (last_micro_step() && part_.pad() > 0) {
    if (lp_ == DType::bf16) {
      pad_ = backend_.alloc(Category::grad, static_cast<std::size_t>(part_.pad()), DType::bf16);
      backend_.fill_bf16(pad_.bf16(), 0.0f, pad_.count());
    } else {
      pad_ = zeros(Category::grad, static_cast<std::size_t>(part_.pad()));
    }
  }
  bucket_.reset();
  autograd_.reset();
  gip_.reset();
}

void DeepSpeedZero::optimizer_step(int step) {
  const std::size_t s = static_cast<std::size_t>(part_.size), real = static_cast<std::size_t>(part_.real);
  // single_grad_partition: the averaged gradient flattened (bf16: flattened in bf16, then
  // `.to(fp32)` into a new fp32 buffer and the bf16 one deleted).
  Buffer flat = backend_.alloc(Category::grad, s, lp_);
  if (real > 0) copy_lp(flat.data(), at(acc_, part_.offset), real);
  if (s > real) copy_lp(at(flat, static_cast<std::int64_t>(real)), pad_.data(), s - real);
  Buffer g;
  if (lp_ == DType::bf16) {
    g = backend_.alloc(Category::grad, s);
    backend_.cast_from_bf16(g.data(), flat.bf16(), s, 0.0f);
    flat.reset();
  } else {
    g = std::move(flat);
  }
  acc_.reset();
  pad_.reset();
  last_grad_ = download(g);
  backend_.fill(adam_.step.data(), static_cast<float>(step), 1);
  backend_.adamw(hyper_, {{master_.data(), g.data(), adam_.exp_avg.data(), adam_.exp_avg_sq.data(), s, step}});
  g.reset();
  // The updated partition into the flat group (bf16: rounded), then every rank's gathered
  // in place.
  float* own = at(flat_, part_.size * comm_.rank());
  backend_.tracker().mark(Phase::communication);
  if (lp_ == DType::bf16) {
    backend_.cast_to_bf16(as_bf16(own), master_.data(), s);
    comm_.all_gather_bf16(as_bf16(own), flat_.bf16(), s);
  } else {
    backend_.copy(own, master_.data(), s);
    comm_.all_gather(own, flat_.data(), s);
  }
}

HostState DeepSpeedZero::gather_state() {
  const std::size_t P = static_cast<std::size_t>(model_->params()), s = static_cast<std::size_t>(part_.size);
  HostState h;
  if (lp_ == DType::bf16) {
    std::vector<Bf16> bits(P);
    backend_.download_bytes(bits.data(), flat_.raw(), P * sizeof(Bf16));
    for (const Bf16 b : bits) h.params.push_back(from_bf16(b));
  } else {
    h.params = download(flat_.data(), P);
  }
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
  SHARDSCOPE_REQUIRE(stage >= 0 && stage <= 3, "deepspeed: ZeRO stages 0 (bf16), 1, 2 and 3");
  if (stage == 0) return std::make_unique<DeepSpeedStage0>(ctx);
  if (stage == 3) return std::make_unique<DeepSpeedZero3>(ctx);
  return std::make_unique<DeepSpeedZero>(ctx, stage);
}

}  // namespace shardscope
