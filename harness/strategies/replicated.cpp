#include "harness/strategies/replicated.hpp"

namespace shardscope {

// Like torch DDP: whole tensors in reverse order, a bucket closes once it reaches
// the cap; a cap of 0 means one bucket for everything.
std::vector<std::pair<std::int64_t, std::int64_t>> ddp_buckets(const Model& m, double bucket_mb) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  if (bucket_mb <= 0.0) {
    out.emplace_back(0, m.params());
    return out;
  }
  const double cap = bucket_mb * 1024.0 * 1024.0;
  std::int64_t end = m.params();
  std::int64_t begin = end;
  for (int t = m.param_tensors() - 1; t >= 0; --t) {
    begin = m.tensor_offset(t);
    if (static_cast<double>(end - begin) * 4.0 >= cap || t == 0) {
      out.emplace_back(begin, end - begin);
      end = begin;
    }
  }
  return out;
}

ReplicatedStrategy::ReplicatedStrategy(const StrategyContext& ctx)
    : DataParallelStrategy(ctx), access_(*model_, nullptr, nullptr, this) {}

float* ReplicatedStrategy::param(int t) const {
  return params_.data() + model_->tensor_offset(t);
}
float* ReplicatedStrategy::grad(int t) const {
  return grads_.data() + model_->tensor_offset(t);
}

void ReplicatedStrategy::setup() {
  const Model& m = *model_;
  backend_.tracker().mark(Phase::setup);
  params_ = init_params(0, m.params());
  grads_ = zeros(Category::grad, static_cast<std::size_t>(m.params()));
  if (cfg_.ddp_bucket == "copy") bucket_ = zeros(Category::grad, static_cast<std::size_t>(m.params()));
  access_ = Access(m, params_.data(), grads_.data(), this);
  state_.resize(m.param_tensors());
  for (int t = 0; t < m.param_tensors(); ++t)
    if (owns(t)) state_[t] = make_adam_state(backend_, static_cast<std::size_t>(m.tensor_elems(t)));
  buckets_ = ddp_buckets(m, cfg_.bucket_mb);
  in_flight_.assign(buckets_.size(), CommTicket{});
}

void ReplicatedStrategy::block_backward_done(int block) {
  if (cfg_.overlap && syncs()) {
    // Backward runs from the last block down and the flat vector is in block order, so
    // every gradient at or above the block's offset is final (a tied head writes the
    // embedding's, lower down, before the embedding's own backward).
    const std::int64_t ready_from = model_->block_offset(block);
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].first >= ready_from) post_bucket(next_bucket_++);
  }
  comm_.progress();
}

void ReplicatedStrategy::post_bucket(std::size_t i) {
  const auto [offset, count] = buckets_[i];
  float* g = grads_.data() + offset;
  float* b = bucket_ ? bucket_.data() + offset : g;
  if (bucket_) backend_.copy(b, g, static_cast<std::size_t>(count));
  in_flight_[i] = comm_.start_all_reduce_sum(b, static_cast<std::size_t>(count));
}

void ReplicatedStrategy::finish_bucket(std::size_t i) {
  const auto [offset, count] = buckets_[i];
  float* g = grads_.data() + offset;
  float* b = bucket_ ? bucket_.data() + offset : g;
  if (comm_.world() > 1) backend_.scale(b, 1.0f / static_cast<float>(comm_.world()), static_cast<std::size_t>(count));
  if (bucket_) backend_.copy(g, b, static_cast<std::size_t>(count));
}

void ReplicatedStrategy::reduce_gradients() {
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    if (in_flight_[i]) {
      comm_.wait(in_flight_[i]);  // posted in backward (--overlap on)
    } else {
      const auto [offset, count] = buckets_[i];
      float* b = bucket_ ? bucket_.data() + offset : grads_.data() + offset;
      if (bucket_) backend_.copy(b, grads_.data() + offset, static_cast<std::size_t>(count));
      comm_.all_reduce_sum(b, static_cast<std::size_t>(count));
    }
    finish_bucket(i);
  }
  next_bucket_ = 0;
}

void ReplicatedStrategy::update_owned(int step) {
  std::vector<AdamWTensor> list;
  for (int t = 0; t < model_->param_tensors(); ++t) {
    if (!owns(t)) continue;
    AdamState& s = state_[t];
    backend_.fill(s.step.data(), static_cast<float>(step), 1);
    list.push_back({param(t), grad(t), s.exp_avg.data(), s.exp_avg_sq.data(),
                    static_cast<std::size_t>(model_->tensor_elems(t)), step});
  }
  if (!list.empty()) backend_.adamw(hyper_, list);
}

HostState ReplicatedStrategy::gather_state() {
  const Model& m = *model_;
  HostState h;
  h.params = download(params_);
  h.grads = download(grads_);
  h.exp_avg.resize(static_cast<std::size_t>(m.params()));
  h.exp_avg_sq.resize(static_cast<std::size_t>(m.params()));
  for (int t = 0; t < m.param_tensors(); ++t) {
    const std::size_t n = static_cast<std::size_t>(m.tensor_elems(t));
    Buffer tmp = backend_.alloc(Category::temp, 2 * n);
    if (owns(t)) {
      backend_.copy(tmp.data(), state_[t].exp_avg.data(), n);
      backend_.copy(tmp.data() + n, state_[t].exp_avg_sq.data(), n);
    }
    comm_.broadcast(tmp.data(), 2 * n, owner(t));
    const std::vector<float> both = download(tmp);
    const std::int64_t off = m.tensor_offset(t);
    std::copy(both.begin(), both.begin() + static_cast<std::ptrdiff_t>(n), h.exp_avg.begin() + off);
    std::copy(both.begin() + static_cast<std::ptrdiff_t>(n), both.end(), h.exp_avg_sq.begin() + off);
  }
  return h;
}

}  // namespace shardscope
