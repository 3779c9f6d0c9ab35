#include "harness/strategies/data_parallel.hpp"

#include "shardscope/check.hpp"


namespace shardscope {

DataParallelStrategy::DataParallelStrategy(const StrategyContext& ctx)
    : cfg_(ctx.cfg),
      backend_(ctx.backend),
      comm_(ctx.comm),
      tp_(ctx.tp),
      replicate_(ctx.replicate),
      model_(make_model(ctx.cfg.model, ctx.tp ? TensorParallel{ctx.tp->world(), ctx.tp->rank()} : TensorParallel{})),
      data_rank_(ctx.data_rank >= 0 ? ctx.data_rank : ctx.comm.rank()) {}

void DataParallelStrategy::average_replicas(float* shard, std::size_t n) {
  if (!replicate_ || replicate_->world() == 1) return;
  replicate_->all_reduce_sum(shard, n);
  backend_.scale(shard, 1.0f / static_cast<float>(replicate_->world()), n);
}

DataSlice DataParallelStrategy::batch_slice(int k) const {
  const int rows = cfg_.model.batch;
  return {cfg_.seed, batch_index_, data_rank_, k * rows, rows};
}

void DataParallelStrategy::prepare_batch(int index) {
  batch_index_ = index;
  host_batches_.clear();
  for (int k = 0; k < cfg_.accumulate; ++k) host_batches_.push_back(model_->host_input(batch_slice(k)));
}

float DataParallelStrategy::micro_step(int k) {
  Tracker& tracker = backend_.tracker();
  if (k > 0) tracker.mark(Phase::forward);
  micro_ = k;
  saved_.reset();
  const int rows = cfg_.model.batch;
  const std::size_t n = static_cast<std::size_t>(model_->input_elems(rows));
  Buffer x = backend_.alloc(Category::temp, n);  // the rank's batch: block 0's input
  backend_.upload(x.data(), host_batches_[k].data(), n);
  Buffer target = model_->make_target(backend_, batch_slice(k));  // empty when the loss takes none

  float loss = 0.0f;
  Tape tape;
  ModelContext mc{backend_, saved_, access(), tp_};
  {
    ScopedRange r(backend_, "forward");
    // torch's accumulation: each micro-batch's loss divided by K.
    tape = model_->forward(mc, 0, model_->blocks(), x.data(), rows, false);
    loss = model_->loss_forward(mc, tape, target.data(), 1.0f / static_cast<float>(cfg_.accumulate));
    saved_after_forward_ = {saved_.live_bytes(), saved_.live_storages()};
  }
  {
    ScopedRange r(backend_, "backward");
    model_->backward(mc, tape, Buffer{}, backward_beta(k));
  }
  x.reset();
  target.reset();

  // Without --no-sync every micro-step reduces; with it only the last (DDP's no_sync).
  if (syncs()) {
    tracker.mark(Phase::communication);
    ScopedRange r(backend_, "gradient communication");
    reduce_gradients();
  }
  return loss;
}

float DataParallelStrategy::step() {
  Tracker& tracker = backend_.tracker();
  tracker.mark(Phase::forward);
  tracker.reset_peak();
  backend_.reset_pool_high();
  comm_.reset_ledger();
  if (tp_) tp_->reset_ledger();
  if (replicate_) replicate_->reset_ledger();
  ScopedRange range(backend_, "step");
  SHARDSCOPE_REQUIRE(static_cast<int>(host_batches_.size()) == cfg_.accumulate,
                     "data parallel: prepare_batch was not called");

  float loss = 0.0f;
  for (int k = 0; k < cfg_.accumulate; ++k) loss += micro_step(k);

  tracker.mark(Phase::optimizer);
  {
    ScopedRange r(backend_, "optimizer");
    optimizer_step(++steps_done_);
  }
  tracker.mark(Phase::idle);
  return loss;
}

Buffer DataParallelStrategy::init_params(std::int64_t flat_begin, std::int64_t count) {
  Buffer b = backend_.alloc(Category::param, static_cast<std::size_t>(count));
  const std::vector<float> host = model_->init_flat_slice(cfg_.seed, flat_begin, count);
  backend_.upload(b.data(), host.data(), host.size());
  return b;
}

Buffer DataParallelStrategy::zeros(Category c, std::size_t count) {
  if (count == 0) return Buffer{};
  Buffer b = backend_.alloc(c, count);
  backend_.fill(b.data(), 0.0f, count);
  return b;
}

std::vector<float> DataParallelStrategy::download(const Buffer& b) const {
  return download(b.data(), b.count());
}

std::vector<float> DataParallelStrategy::download(const float* p, std::size_t n) const {
  std::vector<float> out(n);
  if (n) backend_.download(out.data(), p, n);  // a reference member: usable from const
  return out;
}

}  // namespace shardscope
