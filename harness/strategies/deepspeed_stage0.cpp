#include "harness/strategies/deepspeed_stage0.hpp"

#include "shardscope/check.hpp"

namespace shardscope {

DeepSpeedStage0::DeepSpeedStage0(const StrategyContext& ctx)
    // One root unit: autograd's whole flat gradient, made when the backward begins.
    : UnitShardedStrategy(ctx, false, 0), buckets_(ds_stage0_buckets(model_->tensor_sizes(), ctx.cfg.bucket_mb)) {
  SHARDSCOPE_REQUIRE(ctx.cfg.precision == PrecisionKind::bf16 && ctx.cfg.model.param_bf16,
                     "deepspeed stage 0: bf16 only (fp32 ddp is the torch engine's)");
}

void DeepSpeedStage0::setup() {
  backend_.tracker().mark(Phase::setup);
  // The bf16 group: the model's parameters rounded (the engine's module.bfloat16()).
  const std::size_t P = static_cast<std::size_t>(model_->params());
  flat_ = backend_.alloc(Category::param, P, DType::bf16);
  const std::vector<float> host = model_->init_flat_slice(cfg_.seed, 0, model_->params());
  std::vector<Bf16> rounded(P);
  for (std::size_t i = 0; i < P; ++i) rounded[i] = to_bf16(host[i]);
  backend_.upload_bytes(flat_.raw(), rounded.data(), P * sizeof(Bf16));
  // fp32_groups_flat: the group cloned to fp32, the master weights of every parameter.
  master_ = backend_.alloc(Category::master, P);
  backend_.cast_from_bf16(master_.data(), flat_.bf16(), P, 0.0f);
  adam_ = make_adam_state(backend_, P);
  // initialize_optimizer_states: a zero fp32 gradient and one optimizer step (AdamW's step 1:
  // the moments stay zero, the weight decay shrinks the master), the gradient dropped.
  Buffer zero = zeros(Category::temp, P);
  backend_.fill(adam_.step.data(), 1.0f, 1);
  backend_.adamw(hyper_, {{master_.data(), zero.data(), adam_.exp_avg.data(), adam_.exp_avg_sq.data(), P, 1}});
}

float* DeepSpeedStage0::at(const Buffer& b, std::int64_t elem) const {
  return reinterpret_cast<float*>(static_cast<char*>(b.raw()) + elem * dtype_bytes(DType::bf16));
}

const float* DeepSpeedStage0::param(int block, int tensor) {
  return at(flat_, model_->tensor_offset(model_->first_tensor(block) + tensor));
}

float* DeepSpeedStage0::grad(int block, int tensor) {
  return at(autograd_, model_->tensor_offset(model_->first_tensor(block) + tensor));
}

void DeepSpeedStage0::begin_unit_gradient(int) {
  // The first micro-step's backward; later ones add onto the same gradients.
  if (!autograd_)
    autograd_ = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(model_->params()), DType::bf16);
}

void DeepSpeedStage0::reduce_gradients() {
  const float inv = 1.0f / static_cast<float>(comm_.world());
  for (const DsStage0Bucket& b : buckets_) {
    // allreduce_bucket: the bucket's gradients flattened into a new bf16 buffer, summed over
    // the ranks in bf16, then divided by W; copied back (allreduce_and_copy) and freed.
    const std::size_t n = static_cast<std::size_t>(b.elems);
    Bf16* grads = as_bf16(at(autograd_, model_->tensor_offset(b.first)));
    Buffer flat = backend_.alloc(Category::comm, n, DType::bf16);
    backend_.copy_bf16(flat.bf16(), grads, n);
    comm_.all_reduce_sum_bf16(flat.bf16(), n);
    if (comm_.world() > 1) backend_.scale_bf16(flat.bf16(), inv, n);
    backend_.copy_bf16(grads, flat.bf16(), n);
  }
}

void DeepSpeedStage0::optimizer_step(int step) {
  const std::size_t P = static_cast<std::size_t>(model_->params());
  // has_overflow_serial: each gradient's `.float()` copy, one at a time.
  for (int t = 0; t < model_->param_tensors(); ++t) {
    const std::size_t n = static_cast<std::size_t>(model_->tensor_elems(t));
    Buffer copy = backend_.alloc(Category::temp, n);
    backend_.cast_from_bf16(copy.data(), as_bf16(at(autograd_, model_->tensor_offset(t))), n, 0.0f);
  }
  // The master's gradient: every gradient's `.to(fp32)` (all alive, the list
  // _flatten_dense_tensors takes), flattened into a new fp32 buffer; then the list and the
  // bf16 gradients (`p.grad = None`) go.
  Buffer g;
  {
    std::vector<Buffer> casts;
    for (int t = 0; t < model_->param_tensors(); ++t) {
      const std::size_t n = static_cast<std::size_t>(model_->tensor_elems(t));
      casts.push_back(backend_.alloc(Category::temp, n));
      backend_.cast_from_bf16(casts.back().data(), as_bf16(at(autograd_, model_->tensor_offset(t))), n, 0.0f);
    }
    g = backend_.alloc(Category::grad, P);
    for (int t = 0; t < model_->param_tensors(); ++t)
      backend_.copy(g.data() + model_->tensor_offset(t), casts[static_cast<std::size_t>(t)].data(),
                    static_cast<std::size_t>(model_->tensor_elems(t)));
  }
  autograd_.reset();
  last_grad_ = download(g);
  // AdamW on the master (the setup's step was step 1), its gradient dropped, the master
  // rounded into the bf16 group in place.
  const int adam_step = step + 1;
  backend_.fill(adam_.step.data(), static_cast<float>(adam_step), 1);
  backend_.adamw(hyper_, {{master_.data(), g.data(), adam_.exp_avg.data(), adam_.exp_avg_sq.data(), P, adam_step}});
  g.reset();
  backend_.cast_to_bf16(flat_.bf16(), master_.data(), P);
}

HostState DeepSpeedStage0::gather_state() {
  const std::size_t P = static_cast<std::size_t>(model_->params());
  HostState h;
  std::vector<Bf16> bits(P);
  backend_.download_bytes(bits.data(), flat_.raw(), P * sizeof(Bf16));
  for (const Bf16 b : bits) h.params.push_back(from_bf16(b));
  h.grads = last_grad_;
  h.exp_avg = download(adam_.exp_avg.data(), P);
  h.exp_avg_sq = download(adam_.exp_avg_sq.data(), P);
  return h;
}

}  // namespace shardscope
