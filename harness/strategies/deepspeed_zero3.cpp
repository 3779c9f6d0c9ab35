#include "harness/strategies/deepspeed_zero3.hpp"

#include <algorithm>

#include "shardscope/check.hpp"

namespace shardscope {

DeepSpeedZero3::DeepSpeedZero3(const StrategyContext& ctx)
    : DataParallelStrategy(ctx),
      layout_(ds3_layout(model_tensor_elems(ctx.cfg.model), ctx.comm.world(), ctx.cfg.param_persistence)),
      bucket_cap_(ds_bucket_elems(ctx.cfg.bucket_mb, model_tensor_elems(ctx.cfg.model))),
      lp_(ctx.cfg.precision == PrecisionKind::bf16 ? DType::bf16 : DType::f32) {
  SHARDSCOPE_REQUIRE(!ctx.cfg.model.autocast && (lp_ == DType::f32 || ctx.cfg.model.param_bf16),
                     "deepspeed zero3: fp32, or a bf16 module (the CLI refuses the rest)");
  modules_ = ctx.cfg.model.is_transformer();
  for (int t = 0; t < model_->param_tensors(); ++t)
    if (layout_.persistent[t]) persistent_.push_back(t);
  gathered_.resize(static_cast<std::size_t>(model_->param_tensors()));
  view_.assign(static_cast<std::size_t>(model_->param_tensors()), nullptr);
  block_grad_.resize(static_cast<std::size_t>(model_->blocks()));
  tensor_grad_.resize(static_cast<std::size_t>(model_->param_tensors()));
  rerun_kept_.resize(static_cast<std::size_t>(model_->param_tensors()));
  uses_.assign(static_cast<std::size_t>(model_->param_tensors()), 0);
}

void DeepSpeedZero3::setup() {
  backend_.tracker().mark(Phase::setup);
  const int r = comm_.rank();
  const std::size_t C = static_cast<std::size_t>(layout_.flat);
  // The flat partition: rank r's slice of every tensor, zero past its end.
  std::vector<float> host(C, 0.0f);
  for (int t = 0; t < model_->param_tensors(); ++t) {
    const std::int64_t real = layout_.real(t, r);
    if (real == 0) continue;
    const std::vector<float> part = model_->init_flat_slice(cfg_.seed, model_->tensor_offset(t) + layout_.part[t] * r, real);
    std::copy(part.begin(), part.end(), host.begin() + layout_.offset[t]);
  }
  flat_ = backend_.alloc(Category::param, C, lp_);
  if (lp_ == DType::bf16) {
    // bf16: the module's parameters rounded (module.bfloat16()); the master weights their
    // fp32 widening.
    std::vector<Bf16> rounded(C);
    for (std::size_t i = 0; i < C; ++i) rounded[i] = to_bf16(host[i]);
    backend_.upload_bytes(flat_.raw(), rounded.data(), C * sizeof(Bf16));
    master_ = backend_.alloc(Category::master, C);
    backend_.cast_from_bf16(master_.data(), flat_.bf16(), C, 0.0f);
    grad_parts_ = backend_.alloc(Category::grad, C, DType::bf16);
    backend_.fill_bf16(grad_parts_.bf16(), 0.0f, C);
  } else {
    backend_.upload(flat_.data(), host.data(), C);
    master_ = backend_.alloc(Category::param, C);
    backend_.copy(master_.data(), flat_.data(), C);
    grad_parts_ = zeros(Category::grad, C);
  }
  adam_ = make_adam_state(backend_, C);
  bucket_ = backend_.alloc(Category::comm, static_cast<std::size_t>(bucket_cap_), lp_);
  gather(persistent_, Category::param);
}

std::vector<int> DeepSpeedZero3::gathered_tensors(int block) const {
  std::vector<int> out;
  for (int t = model_->first_tensor(block); t < model_->first_tensor(block + 1); ++t)
    if (!layout_.persistent[t]) out.push_back(t);
  return out;
}

float* DeepSpeedZero3::at(const Buffer& b, std::int64_t elem) const {
  return reinterpret_cast<float*>(static_cast<char*>(b.raw()) + elem * dtype_bytes(lp_));
}

void DeepSpeedZero3::copy_lp(float* dst, const float* src, std::size_t n) {
  if (lp_ == DType::bf16)
    backend_.copy_bf16(as_bf16(dst), as_bf16(src), n);
  else
    backend_.copy(dst, src, n);
}

void DeepSpeedZero3::add_lp(float* dst, const float* src, std::size_t n) {
  if (lp_ == DType::bf16)
    backend_.add_bf16(as_bf16(dst), as_bf16(src), n);
  else
    backend_.add(dst, src, n);
}

void DeepSpeedZero3::gather(const std::vector<int>& tensors, Category c) {
  if (tensors.empty()) return;
  const std::size_t W = static_cast<std::size_t>(comm_.world()), r = static_cast<std::size_t>(comm_.rank());
  if (W == 1) {
    // One rank (_no_gather_coalesced): each tensor views its partition, the whole of it.
    for (int t : tensors) view_[t] = at(flat_, layout_.offset[t]);
    return;
  }
  if (tensors.size() == 1) {
    // One tensor (_all_gather_sequential): a buffer of W·c_t it then views.
    const int t = tensors[0];
    const std::size_t c_t = static_cast<std::size_t>(layout_.part[t]);
    gathered_[t] = backend_.alloc(c, W * c_t, lp_);
    if (lp_ == DType::bf16)
      comm_.all_gather_bf16(flat_.bf16() + layout_.offset[t], gathered_[t].bf16(), c_t);
    else
      comm_.all_gather(flat_.data() + layout_.offset[t], gathered_[t].data(), c_t);
    view_[t] = gathered_[t].data();
    return;
  }
  // Several (all_gather_coalesced): their partitions side by side in the rank's slot of a
  // flat buffer of W·Σc_t, all-gathered in place; then each tensor copied out of every
  // rank's slot into a tensor of its own (n_t), and the flat buffer freed.
  std::size_t sum = 0;
  for (int t : tensors) sum += static_cast<std::size_t>(layout_.part[t]);
  Buffer staging = backend_.alloc(Category::comm, W * sum, lp_);
  float* own = at(staging, static_cast<std::int64_t>(r * sum));
  std::int64_t in_slot = 0;
  for (int t : tensors) {
    copy_lp(at(staging, static_cast<std::int64_t>(r * sum) + in_slot), at(flat_, layout_.offset[t]),
            static_cast<std::size_t>(layout_.part[t]));
    in_slot += layout_.part[t];
  }
  if (lp_ == DType::bf16)
    comm_.all_gather_bf16(as_bf16(own), staging.bf16(), sum);
  else
    comm_.all_gather(own, staging.data(), sum);
  in_slot = 0;
  for (int t : tensors) {
    const std::int64_t n = layout_.elems[t], c_t = layout_.part[t];
    gathered_[t] = backend_.alloc(c, static_cast<std::size_t>(n), lp_);
    for (std::size_t q = 0; q < W; ++q) {
      const std::int64_t begin = c_t * static_cast<std::int64_t>(q);
      const std::int64_t count = std::max<std::int64_t>(0, std::min(c_t, n - begin));
      if (count > 0)
        copy_lp(at(gathered_[t], begin), at(staging, static_cast<std::int64_t>(q * sum) + in_slot),
                static_cast<std::size_t>(count));
    }
    view_[t] = gathered_[t].data();
    in_slot += c_t;
  }
}

void DeepSpeedZero3::release(const std::vector<int>& tensors) {
  for (int t : tensors) {
    gathered_[t].reset();
    view_[t] = nullptr;
  }
}

std::vector<int> DeepSpeedZero3::not_persistent(const std::vector<TensorRef>& tensors) const {
  std::vector<int> out;
  for (const TensorRef& r : tensors)
    if (!layout_.persistent[tensor_of(r)]) out.push_back(tensor_of(r));
  return out;
}

std::vector<int> DeepSpeedZero3::to_gather(const std::vector<TensorRef>& tensors) const {
  std::vector<int> out;
  for (int t : not_persistent(tensors))
    if (view_[t] == nullptr) out.push_back(t);
  return out;
}

void DeepSpeedZero3::module_forward_begin(const std::vector<TensorRef>& tensors) {
  if (!modules_) return;
  gather(to_gather(tensors), Category::param_unsharded);
  if (rerunning_) return;  // a re-run's use is met by no backward of its own
  for (const TensorRef& r : tensors) ++uses_[tensor_of(r)];
}

namespace {
bool same_module(const std::vector<TensorRef>& x, const std::vector<TensorRef>& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (x[i].block != y[i].block || x[i].tensor != y[i].tensor) return false;
  return true;
}
}  // namespace

void DeepSpeedZero3::module_forward_end(const std::vector<TensorRef>& tensors) {
  if (!modules_) return;
  if (!rerunning_) {
    release(not_persistent(tensors));
    return;
  }
  // A re-run (torch's non-reentrant checkpoint): it stops at its last save, inside the
  // block's first-backward module, whose post-forward hook so never fires (that module
  // stays gathered from its pre-backward hook to its backward's end). Every other
  // module's op saved detached views of its parameters (LinearFunctionForZeroStage3 its
  // weight and bias, LayerNorm its weight and bias, RMSNorm its weight), which keep their
  // gathered storages to that module's backward; the hook releases the parameters, so its
  // pre-backward hook gathers them again.
  if (same_module(tensors, rerun_entry_)) return;
  for (int t : not_persistent(tensors)) {
    rerun_kept_[t] = std::move(gathered_[t]);
    view_[t] = nullptr;
  }
}

void DeepSpeedZero3::module_backward_begin(const std::vector<TensorRef>& tensors) {
  if (!modules_) return;
  gather(to_gather(tensors), Category::param_unsharded);
  // Autograd makes each parameter's gradient in the parameter's dtype (the tied table's
  // once: the head's part, then the embedding's added onto it).
  for (const TensorRef& r : tensors) {
    const int t = tensor_of(r);
    if (!tensor_grad_[t])
      tensor_grad_[t] = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(layout_.elems[t]), lp_);
  }
}

void DeepSpeedZero3::module_backward_end(const std::vector<TensorRef>& tensors, bool input_requires_grad) {
  if (!modules_) return;
  // Its op's backward has run: a re-run's saves of its parameters go first.
  for (const TensorRef& r : tensors) rerun_kept_[tensor_of(r)].reset();
  // The gradient hooks fire before the module's post-backward hook: the last tensor first.
  for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) {
    const int t = tensor_of(*it);
    SHARDSCOPE_REQUIRE(uses_[t] > 0, "deepspeed zero3: a module's backward without its forward");
    if (--uses_[t] > 0) continue;  // the tied table: the embedding's part is still to come
    add_to_bucket(t, tensor_grad_[t].data());
    tensor_grad_[t].reset();
  }
  const std::vector<int> mine = not_persistent(tensors);
  if (input_requires_grad)
    release(mine);
  else
    leftovers_.insert(leftovers_.end(), mine.begin(), mine.end());
}

const float* DeepSpeedZero3::param(int block, int tensor) {
  const float* p = view_[tensor_of(block, tensor)];
  SHARDSCOPE_REQUIRE(p != nullptr, "deepspeed zero3: a tensor used while not gathered");
  return p;
}

float* DeepSpeedZero3::grad(int block, int tensor) {
  if (modules_) {
    float* g = tensor_grad_[tensor_of(block, tensor)].data();
    SHARDSCOPE_REQUIRE(g != nullptr, "deepspeed zero3: a gradient written outside its module's backward");
    return g;
  }
  const std::int64_t in_block = model_->tensor_offset(tensor_of(block, tensor)) - model_->block_offset(block);
  return at(block_grad_[block], in_block);
}

// The model marks the block's place (layer b) before each hook.
void DeepSpeedZero3::before_forward(int block) {
  if (modules_) return;  // a transformer's modules gather in the module hooks
  gather(gathered_tensors(block), Category::param_unsharded);
}

void DeepSpeedZero3::after_forward(int block) {
  if (!modules_) release(gathered_tensors(block));
}

bool DeepSpeedZero3::recompute_first(int block) const {
  return model_->checkpointed(block) && cfg_.model.activation == Activation::relu;
}

void DeepSpeedZero3::gather_for_backward(int block) {
  gather(gathered_tensors(block), Category::param_unsharded);
  const std::int64_t n = model_->block_offset(block + 1) - model_->block_offset(block);
  block_grad_[block] = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(n), lp_);
}

void DeepSpeedZero3::before_backward(int block) {
  if (modules_) return;  // a transformer's modules gather in the module hooks
  if (!recompute_first(block)) gather_for_backward(block);
}

// The re-run's pre-forward hook: it gathers what is not gathered (under ReLU, all of it).
// A transformer block's: its first-backward module's pre-backward hook has fired (its
// gradient arrives before anything unpacks a save) and gathered it; then the re-run, each
// module's hooks firing in it.
void DeepSpeedZero3::before_recompute(int block) {
  if (modules_) {
    rerun_entry_ = model_->block(block).first_backward_module(block);
    gather(to_gather(rerun_entry_), Category::param_unsharded);
    rerunning_ = true;
    return;
  }
  if (recompute_first(block)) gather(gathered_tensors(block), Category::param_unsharded);
}

// The re-run's post-forward hook releases the layer; its saves keep the gathered storages
// of its weight and bias (LinearFunctionForZeroStage3 saves both, every layer), which the
// backward then reads. Under ReLU the pre-backward hook comes next.
void DeepSpeedZero3::after_recompute(int block) {
  if (modules_) {
    rerunning_ = false;
    return;
  }
  // view_ stays on each kept storage until a gather replaces it.
  for (int t : gathered_tensors(block)) rerun_kept_[t] = std::move(gathered_[t]);
  if (recompute_first(block)) gather_for_backward(block);
}

void DeepSpeedZero3::after_backward(int block) {
  if (modules_) return;
  // The Linear's backward has run: its saves are freed.
  for (int t : gathered_tensors(block)) rerun_kept_[t].reset();
  // The block's tensors as their hooks fire: last first.
  for (int t = model_->first_tensor(block + 1) - 1; t >= model_->first_tensor(block); --t)
    add_to_bucket(t, at(block_grad_[block], model_->tensor_offset(t) - model_->block_offset(block)));
  block_grad_[block].reset();
  release(gathered_tensors(block));
}

void DeepSpeedZero3::add_to_bucket(int t, const float* src) {
  const std::int64_t n = layout_.elems[t];
  if (bucket_used_ + n > bucket_cap_ && bucket_used_ > 0) reduce_bucket();
  copy_lp(at(bucket_, bucket_used_), src, static_cast<std::size_t>(n));
  in_bucket_.emplace_back(t, bucket_used_);
  bucket_used_ += n;
}

void DeepSpeedZero3::reduce_bucket() {
  if (bucket_used_ == 0) return;
  const std::size_t n = static_cast<std::size_t>(bucket_used_);
  const int W = comm_.world(), r = comm_.rank();
  // Divided by W, then all-reduced (bf16: in bf16, communication_data_type's default).
  if (lp_ == DType::bf16) {
    if (W > 1) backend_.scale_bf16(bucket_.bf16(), 1.0f / static_cast<float>(W), n);
    comm_.all_reduce_sum_bf16(bucket_.bf16(), n);
  } else {
    if (W > 1) backend_.scale(bucket_.data(), 1.0f / static_cast<float>(W), n);
    comm_.all_reduce_sum(bucket_.data(), n);
  }
  // Each tensor's slice of the rank's partition; where it is short, a zero tensor of c_t
  // holds it (kept, with the bucket's others, until the bucket is done).
  std::vector<Buffer> padded;
  const bool adds = micro_step_index() > 0;
  for (const auto& [t, in_bucket] : in_bucket_) {
    const std::size_t c_t = static_cast<std::size_t>(layout_.part[t]);
    const std::int64_t real = layout_.real(t, r);
    const float* slice = at(bucket_, in_bucket + layout_.part[t] * r);
    if (real < layout_.part[t]) {
      if (lp_ == DType::bf16) {
        padded.push_back(backend_.alloc(Category::grad, c_t, DType::bf16));
        backend_.fill_bf16(padded.back().bf16(), 0.0f, c_t);
      } else {
        padded.push_back(zeros(Category::grad, c_t));
      }
      if (real > 0) copy_lp(padded.back().data(), slice, static_cast<std::size_t>(real));
      slice = padded.back().data();
    }
    if (real == 0) continue;  // partition_grads skips a partition holding no parameters
    float* dst = at(grad_parts_, layout_.offset[t]);
    if (adds)
      add_lp(dst, slice, c_t);  // in grad_accum_dtype (bf16 under bf16)
    else
      copy_lp(dst, slice, c_t);
  }
  in_bucket_.clear();
  bucket_used_ = 0;
}

void DeepSpeedZero3::reduce_gradients() {
  reduce_bucket();
  // backward_epilogue's release_backward_leftovers: the modules whose post-backward hook never fired.
  release(leftovers_);
  leftovers_.clear();
}

void DeepSpeedZero3::optimizer_step(int step) {
  const std::size_t C = static_cast<std::size_t>(layout_.flat);
  release(persistent_);  // _partition_all_parameters
  // The gradient partitions flattened (bf16: flattened in bf16, then `.to(fp32)` into a new
  // fp32 buffer and the bf16 one freed).
  Buffer g;
  if (lp_ == DType::bf16) {
    Buffer flat = backend_.alloc(Category::grad, C, DType::bf16);
    backend_.copy_bf16(flat.bf16(), grad_parts_.bf16(), C);
    g = backend_.alloc(Category::grad, C);
    backend_.cast_from_bf16(g.data(), flat.bf16(), C, 0.0f);
  } else {
    g = backend_.alloc(Category::grad, C);
    backend_.copy(g.data(), grad_parts_.data(), C);
  }
  last_grad_ = download(g);
  backend_.fill(adam_.step.data(), static_cast<float>(step), 1);
  backend_.adamw(hyper_, {{master_.data(), g.data(), adam_.exp_avg.data(), adam_.exp_avg_sq.data(), C, step}});
  g.reset();
  if (lp_ == DType::bf16)
    backend_.cast_to_bf16(flat_.bf16(), master_.data(), C);  // rounded into the partitions
  else
    backend_.copy(flat_.data(), master_.data(), C);
  backend_.tracker().mark(Phase::communication);
  gather(persistent_, Category::param);  // _post_step
}

HostState DeepSpeedZero3::gather_state() {
  const int W = comm_.world();
  const std::size_t C = static_cast<std::size_t>(layout_.flat);
  std::vector<float> last = last_grad_;
  last.resize(C, 0.0f);
  Buffer grad = backend_.alloc(Category::temp, C);
  backend_.upload(grad.data(), last.data(), C);
  const float* sources[4] = {master_.data(), grad.data(), adam_.exp_avg.data(), adam_.exp_avg_sq.data()};
  HostState h;
  std::vector<float>* targets[4] = {&h.params, &h.grads, &h.exp_avg, &h.exp_avg_sq};
  for (int k = 0; k < 4; ++k) {
    Buffer all = backend_.alloc(Category::temp, static_cast<std::size_t>(W) * C);
    comm_.all_gather(sources[k], all.data(), C);
    const std::vector<float> every = download(all);
    // Tensor t's elements: rank q's partition of it, in rank order, up to n_t.
    std::vector<float>& out = *targets[k];
    for (int t = 0; t < model_->param_tensors(); ++t)
      for (int q = 0; q < W; ++q) {
        const std::int64_t real = layout_.real(t, q);
        const auto from = every.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(q) * C + layout_.offset[t]);
        out.insert(out.end(), from, from + real);
      }
  }
  return h;
}

}  // namespace shardscope
