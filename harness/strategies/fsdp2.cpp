#include "harness/strategies/fsdp2.hpp"

#include <string>

namespace shardscope {

Fsdp2Strategy::Fsdp2Strategy(const StrategyContext& ctx, bool full_shard)
    : UnitShardedStrategy(ctx, full_shard), bf16_(ctx.cfg.model.param_bf16) {
  const int world = ctx.comm.world();
  tensors_.resize(static_cast<std::size_t>(model_->param_tensors()));
  unit_tensors_.resize(units_.size());
  unit_flat_.assign(units_.size(), 0);
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    for (int b : blocks_of(u)) {
      for (int t = model_->first_tensor(b); t < model_->first_tensor(b + 1); ++t) {
        TensorState& s = tensors_[t];
        s.shard = dim0_shard(model_->tensor(t).shape, world);
        s.unit = u;
        s.offset = unit_flat_[u];
        unit_flat_[u] += s.shard.padded();
        unit_tensors_[u].push_back(t);
      }
    }
  }
  gathered_.assign(units_.size(), false);
  prefetching_.resize(units_.size());
}

void Fsdp2Strategy::setup() {
  backend_.tracker().mark(Phase::setup);
  const int rank = comm_.rank();
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    TensorState& s = tensors_[t];
    // The rank's rows of the tensor, then zero rows up to the chunk.
    s.param = backend_.alloc(Category::param, static_cast<std::size_t>(s.shard.padded()));
    const std::int64_t begin = model_->tensor_offset(static_cast<int>(t)) + s.shard.padded() * rank;
    std::vector<float> host = model_->init_flat_slice(cfg_.seed, begin, s.shard.local(rank));
    host.resize(static_cast<std::size_t>(s.shard.padded()), 0.0f);
    backend_.upload(s.param.data(), host.data(), host.size());
    // AdamW's state on the unpadded local shard (none when the rank holds no rows).
    const std::size_t local = static_cast<std::size_t>(s.shard.local(rank));
    s.adam.exp_avg = zeros(Category::optim, local);
    s.adam.exp_avg_sq = zeros(Category::optim, local);
    s.adam.step = zeros(Category::optim, 1);
  }
  for (std::size_t u = 0; u < units_.size(); ++u)
    unit_grad_.push_back(zeros(Category::grad, static_cast<std::size_t>(unit_flat_[u])));
}

// Under bf16 the gathered tensors and full gradients hold bf16: the blocks read and write
// them as bf16 (as_bf16) through these float pointers.
const float* Fsdp2Strategy::param(int block, int tensor) {
  const Buffer& full = tensors_[model_->first_tensor(block) + tensor].full;
  return bf16_ ? reinterpret_cast<const float*>(full.bf16()) : full.data();
}
float* Fsdp2Strategy::grad(int block, int tensor) {
  const Buffer& full_grad = tensors_[model_->first_tensor(block) + tensor].full_grad;
  return bf16_ ? reinterpret_cast<float*>(full_grad.bf16()) : full_grad.data();
}

Buffer Fsdp2Strategy::flat_with_own_shards(int u) {
  const std::int64_t world = comm_.world(), a = unit_flat_[u];
  if (!bf16_) {
    Buffer flat = backend_.alloc(Category::comm, static_cast<std::size_t>(world * a));
    float* own = flat.data() + a * comm_.rank();
    for (int t : tensors_of(u)) {
      const TensorState& s = tensors_[t];
      backend_.copy(own + s.offset, s.param.data(), static_cast<std::size_t>(s.shard.padded()));
    }
    return flat;
  }
  // all_gather_inputs: each tensor's padded shard cast to bf16, all made before the flat
  // buffer and freed once copied in (foreach_all_gather's del).
  std::vector<Buffer> casts;
  for (int t : tensors_of(u)) {
    const TensorState& s = tensors_[t];
    const std::size_t n = static_cast<std::size_t>(s.shard.padded());
    casts.push_back(backend_.alloc(Category::param_cast, n, DType::bf16));
    backend_.cast_to_bf16(casts.back().bf16(), s.param.data(), n);
  }
  Buffer flat = backend_.alloc(Category::comm, static_cast<std::size_t>(world * a), DType::bf16);
  Bf16* own = flat.bf16() + a * comm_.rank();
  for (std::size_t i = 0; i < casts.size(); ++i) {
    const TensorState& s = tensors_[tensors_of(u)[i]];
    backend_.copy_bf16(own + s.offset, casts[i].bf16(), casts[i].count());
  }
  return flat;  // the casts go here
}

void Fsdp2Strategy::all_gather_flat(int u, Buffer& flat) {
  const std::int64_t a = unit_flat_[u], at = a * comm_.rank();
  if (bf16_) comm_.all_gather_bf16(flat.bf16() + at, flat.bf16(), static_cast<std::size_t>(a));
  else comm_.all_gather(flat.data() + at, flat.data(), static_cast<std::size_t>(a));
}

CommTicket Fsdp2Strategy::start_all_gather_flat(int u, Buffer& flat) {
  const std::int64_t a = unit_flat_[u], at = a * comm_.rank();
  if (bf16_) return comm_.start_all_gather_bf16(flat.bf16() + at, flat.bf16(), static_cast<std::size_t>(a));
  return comm_.start_all_gather(flat.data() + at, flat.data(), static_cast<std::size_t>(a));
}

void Fsdp2Strategy::gather(int u) {
  if (gathered_[u]) return;
  backend_.tracker().mark(backend_.tracker().phase(), {PlaceKind::unit, u});
  Prefetching& pre = prefetching_[u];
  if (pre.flat) {
    // Prefetched: its all-gather may still be in flight; the copy-out waits for it.
    comm_.wait(pre.ticket);
    copy_out(u, pre.flat);
    pre.flat.reset();
    gathered_[u] = true;
    return;
  }
  // foreach_all_gather: this rank's padded shards copied into its slot, gathered in place.
  Buffer flat = flat_with_own_shards(u);
  all_gather_flat(u, flat);
  copy_out(u, flat);
  flat.reset();
  gathered_[u] = true;
}

void Fsdp2Strategy::prefetch(int u) {
  if (!cfg_.overlap || gathered_[u] || prefetching_[u].flat) return gather(u);
  backend_.tracker().mark(backend_.tracker().phase(), {PlaceKind::unit, u});
  Prefetching& pre = prefetching_[u];
  pre.flat = flat_with_own_shards(u);
  pre.ticket = start_all_gather_flat(u, pre.flat);
}

void Fsdp2Strategy::copy_out(int u, const Buffer& flat) {
  const std::int64_t world = comm_.world(), a = unit_flat_[u];
  // Copy-out: each tensor's chunks, rank by rank, into its own gathered buffer.
  for (int t : tensors_of(u)) {
    TensorState& s = tensors_[t];
    const std::int64_t n = s.shard.padded();
    if (bf16_) {
      s.full = backend_.alloc(Category::param_unsharded, static_cast<std::size_t>(world * n), DType::bf16);
      for (std::int64_t r = 0; r < world; ++r)
        backend_.copy_bf16(s.full.bf16() + r * n, flat.bf16() + r * a + s.offset, static_cast<std::size_t>(n));
      continue;
    }
    s.full = backend_.alloc(Category::param_unsharded, static_cast<std::size_t>(world * n));
    for (std::int64_t r = 0; r < world; ++r)
      backend_.copy(s.full.data() + r * n, flat.data() + r * a + s.offset, static_cast<std::size_t>(n));
  }
}

void Fsdp2Strategy::reshard(int u) {
  for (int t : tensors_of(u)) tensors_[t].full.reset();
  gathered_[u] = false;
}

void Fsdp2Strategy::begin_unit_gradient(int u) {
  // Each tensor's own full gradient, as autograd makes it (unpadded; overwritten), unless
  // kept from the micro-step before (--no-sync: set_requires_gradient_sync(False)).
  if (tensors_[tensors_of(u).front()].full_grad) return;
  for (int t : tensors_of(u)) {
    TensorState& s = tensors_[t];
    s.full_grad = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(s.shard.elems()),
                                 bf16_ ? DType::bf16 : DType::f32);
  }
}

void Fsdp2Strategy::end_unit_gradient(int u) {
  if (!accumulates_fp32()) return;
  for (int t : tensors_of(u)) {
    TensorState& s = tensors_[t];
    const std::size_t n = static_cast<std::size_t>(s.shard.elems());
    float beta = 1.0f;
    if (!s.accumulated) {
      s.accumulated = backend_.alloc(Category::grad_unsharded, n);
      beta = 0.0f;
    }
    backend_.cast_from_bf16(s.accumulated.data(), s.full_grad.bf16(), n, beta);
    s.full_grad.reset();
  }
}

void Fsdp2Strategy::reduce_unit(int u) {
  if (cfg_.overlap) finish_reduce();  // FSDP2 waits for the last one before the next input
  const int world = comm_.world();
  const std::int64_t a = unit_flat_[u];
  // foreach_reduce: the full gradients chunked into rank-major slots, padding zero (under
  // bf16 the copy-in casts them to the fp32 input: reduce_dtype).
  Buffer input = backend_.alloc(Category::comm, static_cast<std::size_t>(world * a));
  for (int t : tensors_of(u)) {
    TensorState& s = tensors_[t];
    for (int r = 0; r < world; ++r) {
      float* slot = input.data() + a * r + s.offset;
      const std::int64_t local = s.shard.local(r), pad = s.shard.padded() - local;
      if (local > 0 && s.accumulated)
        backend_.copy(slot, s.accumulated.data() + s.shard.padded() * r, static_cast<std::size_t>(local));
      else if (local > 0 && bf16_)
        backend_.cast_from_bf16(slot, s.full_grad.bf16() + s.shard.padded() * r, static_cast<std::size_t>(local), 0.0f);
      else if (local > 0)
        backend_.copy(slot, s.full_grad.data() + s.shard.padded() * r, static_cast<std::size_t>(local));
      if (pad > 0) backend_.fill(slot + local, 0.0f, static_cast<std::size_t>(pad));
    }
    s.full_grad.reset();
    s.accumulated.reset();
  }
  float* grad = unit_grad_[u].data();
  const std::size_t n = static_cast<std::size_t>(a);
  if (cfg_.overlap) {
    reducing_.unit = u;
    if (adds_to_shard()) reducing_.out = backend_.alloc(Category::comm, n);
    reducing_.ticket = comm_.start_reduce_scatter_sum(input.data(), reducing_.out ? reducing_.out.data() : grad, n);
    reducing_.input = std::move(input);
    return;
  }
  if (adds_to_shard()) {
    // foreach_reduce's output is a new flat buffer (comm) beside the input; the shards'
    // gradients add it (sharded_param.grad += ...), then both are freed.
    Buffer out = backend_.alloc(Category::comm, n);
    comm_.reduce_scatter_sum(input.data(), out.data(), n);
    backend_.scale(out.data(), 1.0f / static_cast<float>(world), n);
    average_replicas(out.data(), n);
    backend_.add(grad, out.data(), n);
  } else {
    comm_.reduce_scatter_sum(input.data(), grad, n);
    backend_.scale(grad, 1.0f / static_cast<float>(world), n);
    average_replicas(grad, n);
  }
  input.reset();
}

void Fsdp2Strategy::finish_reduce() {
  if (reducing_.unit < 0) return;
  const std::size_t n = static_cast<std::size_t>(unit_flat_[reducing_.unit]);
  float* grad = unit_grad_[reducing_.unit].data();
  comm_.wait(reducing_.ticket);
  const float inv_world = 1.0f / static_cast<float>(comm_.world());
  if (reducing_.out) {
    backend_.scale(reducing_.out.data(), inv_world, n);
    average_replicas(reducing_.out.data(), n);
    backend_.add(grad, reducing_.out.data(), n);
  } else {
    backend_.scale(grad, inv_world, n);
    average_replicas(grad, n);
  }
  reducing_ = Reducing{};  // frees the input and the output
}

void Fsdp2Strategy::optimizer_step(int step) {
  std::vector<AdamWTensor> list;
  const int rank = comm_.rank();
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    TensorState& s = tensors_[t];
    backend_.fill(s.adam.step.data(), static_cast<float>(step), 1);
    const std::size_t local = static_cast<std::size_t>(s.shard.local(rank));
    if (local == 0) continue;
    float* grad = unit_grad_[s.unit].data() + s.offset;
    list.push_back({s.param.data(), grad, s.adam.exp_avg.data(), s.adam.exp_avg_sq.data(), local, step});
  }
  backend_.adamw(hyper_, list);
}

HostState Fsdp2Strategy::gather_state() {
  HostState h;
  for (auto* v : {&h.params, &h.grads, &h.exp_avg, &h.exp_avg_sq}) v->resize(static_cast<std::size_t>(model_->params()));
  const int world = comm_.world(), rank = comm_.rank();
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    TensorState& s = tensors_[t];
    const std::size_t n = static_cast<std::size_t>(s.shard.padded());
    const std::size_t local = static_cast<std::size_t>(s.shard.local(rank));
    const float* grad = unit_grad_[s.unit].data() + s.offset;
    const float* sources[4] = {s.param.data(), grad, s.adam.exp_avg.data(), s.adam.exp_avg_sq.data()};
    std::vector<float>* targets[4] = {&h.params, &h.grads, &h.exp_avg, &h.exp_avg_sq};
    for (int k = 0; k < 4; ++k) {
      // Padded to the chunk (AdamW's state is unpadded: its rows, then zeros).
      Buffer mine = zeros(Category::temp, n);
      const std::size_t valid = k < 2 ? n : local;
      if (valid > 0) backend_.copy(mine.data(), sources[k], valid);
      Buffer full = backend_.alloc(Category::temp, n * static_cast<std::size_t>(world));
      comm_.all_gather(mine.data(), full.data(), n);
      const std::vector<float> host = download(full);
      std::copy(host.begin(), host.begin() + s.shard.elems(),
                targets[k]->begin() + model_->tensor_offset(static_cast<int>(t)));
    }
  }
  return h;
}

std::unique_ptr<Strategy> make_fsdp2(const StrategyContext& ctx, bool full_shard) {
  return std::make_unique<Fsdp2Strategy>(ctx, full_shard);
}

}  // namespace shardscope
