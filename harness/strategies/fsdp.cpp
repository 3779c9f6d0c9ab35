#include "harness/strategies/fsdp.hpp"

#include <algorithm>
#include <string>


namespace shardscope {

FsdpStrategy::FsdpStrategy(const StrategyContext& ctx, bool full_shard)
    : UnitShardedStrategy(ctx, full_shard), bf16_(ctx.cfg.model.param_bf16) {
  block_offset_in_unit_.assign(static_cast<std::size_t>(model_->blocks()), 0);
  for (int u = 0; u < static_cast<int>(units_.size()); ++u) {
    std::int64_t at = 0;
    for (int b : blocks_of(u)) {
      block_offset_in_unit_[b] = at;
      at += model_->block_elems(b);
    }
  }
}

std::vector<float> FsdpStrategy::init_unit_slice(int u, std::int64_t begin, std::int64_t count) const {
  std::vector<float> out(static_cast<std::size_t>(count), 0.0f);
  for (int b : blocks_of(u)) {
    // Block b occupies [at, at + n) of the unit's flat vector.
    const std::int64_t at = block_offset_in_unit_[b], n = model_->block_elems(b);
    const std::int64_t lo = std::max(begin, at), hi = std::min(begin + count, at + n);
    if (lo >= hi) continue;
    const std::vector<float> part = model_->init_flat_slice(cfg_.seed, model_->block_offset(b) + (lo - at), hi - lo);
    std::copy(part.begin(), part.end(), out.begin() + (lo - begin));
  }
  return out;
}

void FsdpStrategy::setup() {
  backend_.tracker().mark(Phase::setup);
  state_.resize(units_.size());
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const std::int64_t begin = unit.shard * comm_.rank();
    const std::size_t n = static_cast<std::size_t>(unit.shard);
    // The rank's slice of the unit's flat parameter; past the unit's end is padding (0).
    state_[u].shard = backend_.alloc(Category::param, n);
    const std::vector<float> host = init_unit_slice(static_cast<int>(u), begin, unit.shard);
    backend_.upload(state_[u].shard.data(), host.data(), n);
    state_[u].grad_shard = zeros(Category::grad, n);
    state_[u].adam = make_adam_state(backend_, n);
  }
}

std::int64_t FsdpStrategy::offset_in_unit(int block, int tensor) const {
  return block_offset_in_unit_[block] + model_->tensor_offset(model_->first_tensor(block) + tensor) -
         model_->block_offset(block);
}

// Under bf16 the gathered unit and the full gradient hold bf16 elements: the blocks read
// and write them as bf16 (as_bf16) through these float pointers.
const float* FsdpStrategy::param(int block, int tensor) {
  const Buffer& full = state_[unit_of_block_[block]].full;
  const std::int64_t at = offset_in_unit(block, tensor);
  return bf16_ ? reinterpret_cast<const float*>(full.bf16() + at) : full.data() + at;
}
float* FsdpStrategy::grad(int block, int tensor) {
  const Buffer& full_grad = state_[unit_of_block_[block]].full_grad;
  const std::int64_t at = offset_in_unit(block, tensor);
  return bf16_ ? reinterpret_cast<float*>(full_grad.bf16() + at) : full_grad.data() + at;
}

CommTicket FsdpStrategy::gather_into_full(int u, bool blocking) {
  UnitState& s = state_[u];
  const std::size_t shard = static_cast<std::size_t>(units_[u].shard), padded = static_cast<std::size_t>(units_[u].padded);
  backend_.tracker().mark(backend_.tracker().phase(), {PlaceKind::unit, u});
  if (!bf16_) {
    s.full = backend_.alloc(Category::param_unsharded, padded);
    if (!blocking) return comm_.start_all_gather(s.shard.data(), s.full.data(), shard);
    comm_.all_gather(s.shard.data(), s.full.data(), shard);
    return {};
  }
  // FSDP1's _mp_shard: the shard's bf16 cast, all-gathered into the bf16 unit.
  s.cast = backend_.alloc(Category::param_cast, shard, DType::bf16);
  backend_.cast_to_bf16(s.cast.bf16(), s.shard.data(), shard);
  s.full = backend_.alloc(Category::param_unsharded, padded, DType::bf16);
  if (!blocking) return comm_.start_all_gather_bf16(s.cast.bf16(), s.full.bf16(), shard);
  comm_.all_gather_bf16(s.cast.bf16(), s.full.bf16(), shard);
  s.cast.reset();
  return {};
}

void FsdpStrategy::gather(int u) {
  UnitState& s = state_[u];
  if (s.full) {
    comm_.wait(s.gathering);  // prefetched: its all-gather may still be in flight
    s.cast.reset();           // its bf16 cast goes once the all-gather has completed
    return;
  }
  gather_into_full(u, true);
}

// The gathered buffer is allocated where a blocking gather allocates it, so overlap moves
// no byte: only the wait moves, to the unit's own gather (and with it, under bf16, the
// free of the shard's cast).
void FsdpStrategy::prefetch(int u) {
  UnitState& s = state_[u];
  if (!cfg_.overlap || s.full) return gather(u);
  s.gathering = gather_into_full(u, false);
}

void FsdpStrategy::begin_unit_gradient(int u) {
  UnitState& s = state_[u];
  if (s.full_grad) return;  // kept from the micro-step before (--no-sync)
  // (padded) full flat gradient; the padding tail is zero, the rest gets overwritten.
  const std::int64_t pad = units_[u].padded - units_[u].elems;
  if (bf16_) {
    s.full_grad = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(units_[u].padded), DType::bf16);
    if (pad > 0) backend_.fill_bf16(s.full_grad.bf16() + units_[u].elems, 0.0f, static_cast<std::size_t>(pad));
    return;
  }
  s.full_grad = backend_.alloc(Category::grad_unsharded, static_cast<std::size_t>(units_[u].padded));
  if (pad > 0) backend_.fill(s.full_grad.data() + units_[u].elems, 0.0f, static_cast<std::size_t>(pad));
}

// reduce_dtype=fp32: the bf16 full gradient's fp32 cast replaces it (the bf16 freed after).
void FsdpStrategy::cast_gradient_for_reduce(int u) {
  UnitState& s = state_[u];
  if (!bf16_) return;
  const std::size_t padded = static_cast<std::size_t>(units_[u].padded);
  Buffer full32 = backend_.alloc(Category::grad_unsharded, padded);
  backend_.cast_from_bf16(full32.data(), s.full_grad.bf16(), padded, 0.0f);
  s.full_grad = std::move(full32);
}

void FsdpStrategy::reduce_unit(int u) {
  UnitState& s = state_[u];
  const std::size_t n = static_cast<std::size_t>(units_[u].shard);
  if (cfg_.overlap) {
    finish_reduce();  // the unit before's: one in flight at a time
    cast_gradient_for_reduce(u);
    reducing_.unit = u;
    float* dst = s.grad_shard.data();
    if (adds_to_shard()) {
      reducing_.out = backend_.alloc(Category::comm, n);  // added onto the shard at its wait
      dst = reducing_.out.data();
    }
    reducing_.ticket = comm_.start_reduce_scatter_sum(s.full_grad.data(), dst, n);
    return;
  }
  cast_gradient_for_reduce(u);
  const float inv_world = 1.0f / static_cast<float>(comm_.world());
  if (adds_to_shard()) {
    // FSDP1's _accumulate_sharded_grad: the reduce-scatter's output is a new shard (comm),
    // added onto the saved one and freed.
    Buffer out = backend_.alloc(Category::comm, n);
    comm_.reduce_scatter_sum(s.full_grad.data(), out.data(), n);
    backend_.scale(out.data(), inv_world, n);
    average_replicas(out.data(), n);
    backend_.add(s.grad_shard.data(), out.data(), n);
  } else {
    comm_.reduce_scatter_sum(s.full_grad.data(), s.grad_shard.data(), n);
    backend_.scale(s.grad_shard.data(), inv_world, n);
    average_replicas(s.grad_shard.data(), n);
  }
  s.full_grad.reset();
}

void FsdpStrategy::finish_reduce() {
  if (reducing_.unit < 0) return;
  UnitState& s = state_[reducing_.unit];
  const std::size_t n = static_cast<std::size_t>(units_[reducing_.unit].shard);
  comm_.wait(reducing_.ticket);
  const float inv_world = 1.0f / static_cast<float>(comm_.world());
  if (reducing_.out) {
    backend_.scale(reducing_.out.data(), inv_world, n);
    average_replicas(reducing_.out.data(), n);
    backend_.add(s.grad_shard.data(), reducing_.out.data(), n);
  } else {
    backend_.scale(s.grad_shard.data(), inv_world, n);
    average_replicas(s.grad_shard.data(), n);
  }
  reducing_ = Reducing{};  // frees the staging output
  s.full_grad.reset();
}

void FsdpStrategy::optimizer_step(int step) {
  std::vector<AdamWTensor> list;
  for (UnitState& s : state_) {
    backend_.fill(s.adam.step.data(), static_cast<float>(step), 1);
    list.push_back({s.shard.data(), s.grad_shard.data(), s.adam.exp_avg.data(),
                    s.adam.exp_avg_sq.data(), s.shard.count(), step});
  }
  backend_.adamw(hyper_, list);
}

HostState FsdpStrategy::gather_state() {
  HostState h;
  for (auto* v : {&h.params, &h.grads, &h.exp_avg, &h.exp_avg_sq}) v->resize(static_cast<std::size_t>(model_->params()));
  for (std::size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = units_[u];
    const std::size_t n = static_cast<std::size_t>(unit.shard);
    const Buffer* sources[4] = {&state_[u].shard, &state_[u].grad_shard, &state_[u].adam.exp_avg,
                                &state_[u].adam.exp_avg_sq};
    std::vector<float>* targets[4] = {&h.params, &h.grads, &h.exp_avg, &h.exp_avg_sq};
    for (int k = 0; k < 4; ++k) {
      Buffer full = backend_.alloc(Category::temp, static_cast<std::size_t>(unit.padded));
      comm_.all_gather(sources[k]->data(), full.data(), n);
      const std::vector<float> host = download(full);
      for (int b : blocks_of(static_cast<int>(u))) {
        const auto from = host.begin() + block_offset_in_unit_[b];
        std::copy(from, from + model_->block_elems(b), targets[k]->begin() + model_->block_offset(b));
      }
    }
  }
  return h;
}

std::unique_ptr<Strategy> make_zero2(const StrategyContext& ctx) {
  return std::make_unique<FsdpStrategy>(ctx, false);
}
std::unique_ptr<Strategy> make_zero3(const StrategyContext& ctx) {
  return std::make_unique<FsdpStrategy>(ctx, true);
}

}  // namespace shardscope
