#include "harness/pipeline/pipeline_stage.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "harness/model/models.hpp"
#include "shardscope/check.hpp"

namespace shardscope {

namespace {

std::string str(int i) { return std::to_string(i); }

int key_payload(Payload p) { return p == Payload::activation ? 0 : 1; }

}  // namespace

std::vector<int> tensor_split_sizes(int n, int parts) {
  std::vector<int> out(static_cast<std::size_t>(std::max(parts, 0)));
  for (int i = 0; i < parts; ++i) out[i] = n / parts + (i < n % parts ? 1 : 0);
  return out;
}

int pipeline_layers(const ModelConfig& model) {
  return model.is_transformer() ? model.transformer.layers : model.layers;
}

std::vector<int> block_bounds(const ModelConfig& model, const std::vector<int>& split) {
  // A transformer's model blocks are the embeddings, the L transformer blocks, the final
  // block: virtual stage k holds transformer blocks [1 + Σ_{j<k} n_j, 1 + Σ_{j<=k} n_j),
  // the first also block 0 and the last also block L + 1.
  const int extra = model.is_transformer() ? 1 : 0;
  std::vector<int> bounds(1, 0);
  for (int n : split) bounds.push_back(bounds.back() + n + (bounds.size() == 1 ? extra : 0));
  bounds.back() += extra;
  return bounds;
}

void check_pipeline_tensor_parallel(const ModelConfig& model, ScheduleKind schedule, const std::vector<int>& split,
                                    int tp) {
  if (tp == 1) return;
  check_tensor_parallel(model, tp);
  const std::string mesh = "--mesh tp=" + str(tp) + " and --schedule " + std::string(schedule_name(schedule));
  if (model.sequence_parallel && (schedule == ScheduleKind::zb_h1 || schedule == ScheduleKind::zbv))
    throw UsageError("--sp and --schedule " + std::string(schedule_name(schedule)) + ": the zero-bubble split (B and W "
                     "apart) of a sequence-parallel stage is not built yet; allowed: gpipe, 1f1b, interleaved-1f1b");
  // The MLP's Linears alternate column- and row-parallel: a stage cut after a row Linear
  // sends the whole (rows, width) activation, as Megatron cuts between its MLPs.
  if (!model.is_transformer())
    for (std::size_t k = 0; k < split.size(); ++k)
      if (split[k] % 2 != 0)
        throw UsageError(mesh + ": virtual stage " + str(static_cast<int>(k)) + " holds " + str(split[k]) +
                         " layers; with tp > 1 every virtual stage of the MLP holds an even number (column- and "
                         "row-parallel pairs; give --split or --layers)");
}

int pipeline_microbatches(const RunConfig& cfg, int stages) {
  return cfg.microbatches > 0 ? cfg.microbatches : stages;
}

namespace {

// --precision bf16 (the torch engine's autocast) runs the MLP's, GPT-2's and Llama's stages
// under gpipe, 1f1b and interleaved-1f1b (harness/predict/autocast_piece.hpp), GPT-2's and
// Llama's split along tp too; what is not built is refused by name.
void check_autocast_pipeline(const RunConfig& cfg) {
  if (!cfg.model.autocast) return;
  const std::string both = "--precision bf16 and --schedule " + std::string(schedule_name(*cfg.schedule));
  if (cfg.mesh.tp > 1 && !cfg.model.is_transformer())
    throw UsageError(both + " and --mesh tp=" + str(cfg.mesh.tp) + ": a tensor-parallel MLP's stages under autocast "
                     "are not built yet; allowed: --mesh dp=D,pp=S, or --model gpt2|llama");
  if (*cfg.schedule == ScheduleKind::zb_h1 || *cfg.schedule == ScheduleKind::zbv)
    throw UsageError(both + ": the zero-bubble split (B and W apart) under autocast is not built yet; allowed: "
                     "gpipe, 1f1b, interleaved-1f1b");
}

}  // namespace

PipelineShape pipeline_shape(const RunConfig& cfg, int stages) {
  SHARDSCOPE_REQUIRE(cfg.pipeline(), "pipeline_shape: a data-parallel configuration (no --schedule)");
  const int M = pipeline_microbatches(cfg, stages);
  // What --split counts: the MLP's layers, a transformer's transformer blocks (its
  // embedding block rides with the first virtual stage, its final block and loss with
  // the last: docs/design.md, "Transformers").
  const int B = cfg.model.batch, L = pipeline_layers(cfg.model), v = cfg.chunks;
  if (M > B)
    throw UsageError("--microbatches " + str(M) + (cfg.microbatches > 0 ? "" : " (default: one per stage)") +
                     " exceeds --batch " + str(B) + ": every micro-batch needs at least one row (--batch is the "
                     "pipeline's whole batch: a micro-batch of one with " + str(M) + " micro-batches is --batch " +
                     str(M) + ")");
  const std::string shape = str(stages) + " stage" + (stages == 1 ? "" : "s") + " x " + str(v) + " chunk" +
                            (v == 1 ? "" : "s");
  // The layout's checks first (cheap), then the schedule's own (S, M, chunks), whose
  // construction and validation grow with S x v x M and, matching channels between
  // every pair of stages, with S^2.
  constexpr int kMostStages = 512;
  if (stages > kMostStages)
    throw UsageError("a pipeline of " + str(stages) + " stages is above the largest allowed, " + str(kMostStages));
  const long long V = static_cast<long long>(stages) * v;
  std::vector<int> split;
  if (!cfg.split.empty()) {
    if (static_cast<long long>(cfg.split.size()) != V)
      throw UsageError("--split: expected " + std::to_string(V) + " entries, layers per virtual stage (" + shape +
                       "), got " + str(static_cast<int>(cfg.split.size())));
    for (std::size_t i = 0; i < cfg.split.size(); ++i)
      if (cfg.split[i] < 1)
        throw UsageError("--split: every virtual stage needs at least 1 layer (entry " + str(static_cast<int>(i)) +
                         " is " + str(cfg.split[i]) + ")");
    const long long sum = std::accumulate(cfg.split.begin(), cfg.split.end(), 0LL);
    if (sum != L)
      throw UsageError("--split: entries sum to " + std::to_string(sum) + ", expected --layers " + str(L) +
                       (cfg.model.is_transformer() ? " (transformer blocks)" : ""));
    split = cfg.split;
  } else {
    if (V > L)
      throw UsageError("--layers " + str(L) + ": a pipeline of " + shape + " needs at least " + std::to_string(V) +
                       " layers (one per virtual stage)");
    split = tensor_split_sizes(L, static_cast<int>(V));
  }
  // A run builds and validates every stage's action list; keep that to seconds.
  constexpr long long kMostForwards = 200'000;
  if (V * M > kMostForwards)
    throw UsageError("a pipeline of " + shape + " and " + str(M) + " micro-batches has " + std::to_string(V * M) +
                     " forward actions, above the largest allowed, " + std::to_string(kMostForwards) +
                     " (fewer --microbatches or stages)");
  check_schedule(*cfg.schedule, stages, M, v);
  check_autocast_pipeline(cfg);
  const int tp = cfg.mesh.given ? cfg.mesh.tp : 1;
  check_pipeline_tensor_parallel(cfg.model, *cfg.schedule, split, tp);
  PipelineShape out{cfg.model, *cfg.schedule, stages, M, v, std::move(split)};
  out.tp = tp;
  return out;
}

PipelineLayout make_pipeline_layout(const PipelineShape& shape) {
  const int M = shape.microbatches;
  PipelineLayout layout;
  layout.schedule = make_schedule(shape.schedule, shape.stages, M, shape.chunks);
  layout.bounds = block_bounds(shape.model, shape.split);
  layout.rows = tensor_split_sizes(shape.model.batch, M);
  layout.row_offset.assign(1, 0);
  for (int m = 0; m + 1 < M; ++m) layout.row_offset.push_back(layout.row_offset.back() + layout.rows[m]);
  const ValidationResult check = validate(layout.schedule);
  if (!check.ok) throw RunError("the schedule failed its validator: " + check.message);
  return layout;
}

PipelineLayout make_pipeline_layout(const RunConfig& cfg, int stages) {
  return make_pipeline_layout(pipeline_shape(cfg, stages));
}

std::string describe_action(const Action& a, int chunks) {
  std::string out = std::string(action_name(a.kind)) + "(m=" + str(a.microbatch);
  if (chunks > 1) out += ", chunk " + str(a.chunk);
  return out + ")";
}

// ---- PipelineStage ------------------------------------------------------------------

float* PipelineStage::Access::at(int block, int tensor, bool grad) {
  for (Chunk& c : chunks_)
    if (block >= c.first && block < c.last)
      return (grad ? c.grads.data() : c.params.data()) + model_.tensor_offset(model_.first_tensor(block) + tensor) -
             model_.block_offset(c.first);
  if (tied_.copy && block == tied_.ref.block && tensor == tied_.ref.tensor)
    return grad ? tied_.grads.data() : tied_.params.data();
  throw RunError("pipeline stage: block " + str(block) + " is not held here");
}

PipelineStage::PipelineStage(const RunConfig& cfg, Backend& backend, Communicator& comm)
    : PipelineStage(cfg, backend, comm, make_pipeline_layout(cfg, comm.world())) {}

PipelineStage::PipelineStage(const RunConfig& cfg, Backend& backend, Communicator& comm, PipelineLayout layout,
                             Communicator* dp, Communicator* tp)
    : cfg_(cfg),
      backend_(backend),
      comm_(comm),
      dp_(dp),
      tp_(tp && tp->world() > 1 ? tp : nullptr),
      layout_(std::move(layout)),
      stage_(comm.rank()),
      model_(make_model(cfg.model, tp_ ? TensorParallel{tp_->world(), tp_->rank()} : TensorParallel{})),
      access_(*model_, chunks_, tied_) {
  program_ = lower(layout_.schedule).at(stage_);
}

bool PipelineStage::holds_loss() const {
  return stage_of_vstage(layout_.schedule, layout_.vstages() - 1) == stage_;
}

void PipelineStage::setup() {
  const Model& m = *model_;
  backend_.tracker().mark(Phase::setup);
  chunks_.clear();
  chunks_.resize(layout_.chunks());
  for (int c = 0; c < layout_.chunks(); ++c) {
    Chunk& ch = chunks_[c];
    const int k = vstage(c);
    ch.first = layout_.first_layer(k);
    ch.last = layout_.end_layer(k);
    const std::int64_t begin = m.block_offset(ch.first);
    const std::size_t n = static_cast<std::size_t>(m.block_offset(ch.last) - begin);
    ch.params = backend_.alloc(Category::param, n);
    const std::vector<float> host = m.init_flat_slice(cfg_.seed, begin, static_cast<std::int64_t>(n));
    backend_.upload(ch.params.data(), host.data(), n);
    ch.grads = backend_.alloc(Category::grad, n);
    backend_.fill(ch.grads.data(), 0.0f, n);
    for (int t = m.first_tensor(ch.first); t < m.first_tensor(ch.last); ++t)
      ch.state.push_back(make_adam_state(backend_, static_cast<std::size_t>(m.tensor_elems(t))));
  }
  setup_tied();
  backend_.synchronize();
  backend_.tracker().mark(Phase::idle);
}

void PipelineStage::setup_tied() {
  const Model& m = *model_;
  tied_ = Tied{};
  int reader = -1;
  for (int b = 0; b < m.blocks(); ++b)
    if (m.block(b).tied_param().block >= 0) reader = b, tied_.ref = m.block(b).tied_param();
  if (reader < 0) return;
  auto stage_of_block = [&](int b) {
    int k = 0;
    while (layout_.end_layer(k) <= b) ++k;
    return stage_of_vstage(layout_.schedule, k);
  };
  const int owner_stage = stage_of_block(tied_.ref.block), reader_stage = stage_of_block(reader);
  if (owner_stage == reader_stage || (stage_ != owner_stage && stage_ != reader_stage)) return;
  tied_.peer = stage_ == owner_stage ? reader_stage : owner_stage;
  const int t = m.first_tensor(tied_.ref.block) + tied_.ref.tensor;
  tied_.elems = static_cast<std::size_t>(m.tensor_elems(t));
  if (stage_ != reader_stage) return;
  // The reader's copy, initialised as the owner's tensor is.
  tied_.copy = true;
  tied_.params = backend_.alloc(Category::param, tied_.elems);
  const std::vector<float> host = m.init_flat_slice(cfg_.seed, m.tensor_offset(t), static_cast<std::int64_t>(tied_.elems));
  backend_.upload(tied_.params.data(), host.data(), tied_.elems);
  tied_.grads = backend_.alloc(Category::grad, tied_.elems);
  backend_.fill(tied_.grads.data(), 0.0f, tied_.elems);
  tied_.state = make_adam_state(backend_, tied_.elems);
}

void PipelineStage::all_reduce_tied() {
  if (tied_.peer < 0) return;
  Tracker& tracker = backend_.tracker();
  tracker.mark(Phase::communication);
  const std::int64_t before = tracker.peak().total;
  Buffer scratch = backend_.alloc(Category::comm, tied_.elems);
  if (comm_.emulated()) backend_.fill(scratch.data(), 0.0f, tied_.elems);  // the fake moves nothing
  peak_comm_bytes_ = std::max(peak_comm_bytes_, tracker.current()[Category::comm]);
  {
    ScopedRange r(backend_, "tied all-reduce");
    comm_.pair_all_reduce_sum(access_.grad(tied_.ref.block, tied_.ref.tensor), scratch.data(), tied_.elems, tied_.peer);
  }
  scratch.reset();
  note_peak(before, "tied all-reduce");
}

void PipelineStage::all_reduce_data_parallel() {
  if (dp_ == nullptr || dp_->world() == 1) return;
  Tracker& tracker = backend_.tracker();
  tracker.mark(Phase::communication);
  ScopedRange r(backend_, "data-parallel all-reduce");
  const float inv = 1.0f / static_cast<float>(dp_->world());
  auto reduce = [&](float* g, std::size_t n) {
    if (n == 0) return;
    dp_->all_reduce_sum(g, n);
    backend_.scale(g, inv, n);
  };
  for (Chunk& ch : chunks_) reduce(ch.grads.data(), ch.grads.count());
  if (tied_.copy) reduce(tied_.grads.data(), tied_.elems);
}

DataSlice PipelineStage::batch_slice() const {
  // Each pipeline replica along dp draws its own batch, as a data-parallel rank does.
  return {cfg_.seed, batch_index_, dp_ ? dp_->rank() : 0, 0, cfg_.model.batch};
}

void PipelineStage::prepare_batch(int index) {
  // One global batch per step, held by the stage that runs the first virtual stage.
  batch_index_ = index;
  if (stage_ == stage_of_vstage(layout_.schedule, 0))
    host_batch_ = model_->host_input(batch_slice());
}

void PipelineStage::note_peak(std::int64_t before, const std::string& what) {
  const PeakRecord& peak = backend_.tracker().peak();
  if (peak.total <= before) return;
  peak_where_ = what;
  if (peak.place.kind == PlaceKind::layer) peak_where_ += " layer " + str(peak.place.index);
}

float PipelineStage::step() {
  Tracker& tracker = backend_.tracker();
  tracker.mark(Phase::forward, {PlaceKind::microbatch, 0});
  tracker.reset_peak();
  backend_.reset_pool_high();
  comm_.reset_ledger();
  if (dp_) dp_->reset_ledger();
  if (tp_) tp_->reset_ledger();
  saved_.reset();
  peak_where_ = "step start";
  peak_comm_bytes_ = tracker.current()[Category::comm];
  action_ms_.clear();
  step_start_ = std::chrono::steady_clock::now();
  actions_end_ms_ = 0.0;
  ScopedRange range(backend_, "step");

  const int batch = cfg_.model.batch;
  const std::size_t n = static_cast<std::size_t>(model_->input_elems(batch));
  Buffer x;       // the global batch (block 0's input), on the first virtual stage's stage
  Buffer target;  // the loss's target (if it takes one), on the last virtual stage's stage
  {
    const std::int64_t before = tracker.peak().total;
    if (stage_ == stage_of_vstage(layout_.schedule, 0)) {
      SHARDSCOPE_REQUIRE(host_batch_.size() == n, "pipeline stage: prepare_batch was not called");
      x = backend_.alloc(Category::temp, n);
      backend_.upload(x.data(), host_batch_.data(), n);
    }
    if (holds_loss()) target = model_->make_target(backend_, batch_slice());
    note_peak(before, "batch");
  }

  slots_.clear();
  slots_.resize(static_cast<std::size_t>(layout_.chunks()) * layout_.microbatches());
  pending_.clear();
  std::vector<bool> grads_written(layout_.chunks(), false);
  // The owner of a tied tensor whose reader is on another stage: the reader wrote its
  // gradient first (with beta) when both were here; the owner's part only adds onto it.
  if (tied_.peer >= 0 && !tied_.copy)
    backend_.fill(access_.grad(tied_.ref.block, tied_.ref.tensor), 0.0f, tied_.elems);
  double loss = 0.0;
  for (const ProgramStep& ps : program_) {
    run_group(ps);
    if (ps.action) loss += run_action(*ps.action, x, target, grads_written);
  }
  // --autocast-region step: the region around the schedule's step exits with its actions.
  model_->end_autocast_step();
  SHARDSCOPE_REQUIRE(pending_.empty(), "pipeline stage " + str(stage_) + ": outputs never sent");
  for (int c = 0; c < layout_.chunks(); ++c)
    SHARDSCOPE_REQUIRE(grads_written[c], "pipeline stage " + str(stage_) + ": chunk " + str(c) + " got no gradient");
  slots_.clear();
  x.reset();
  target.reset();
  all_reduce_tied();
  all_reduce_data_parallel();

  tracker.mark(Phase::optimizer);
  {
    ScopedRange r(backend_, "optimizer");
    const std::int64_t before = tracker.peak().total;
    optimizer_step(++steps_done_);
    note_peak(before, "optimizer");
  }
  backend_.synchronize();
  tracker.mark(Phase::idle);
  return static_cast<float>(loss);
}

void PipelineStage::run_group(const ProgramStep& ps) {
  if (ps.comm.empty()) return;
  Tracker& tracker = backend_.tracker();
  const Schedule& s = layout_.schedule;
  const std::int64_t before = tracker.peak().total;
  tracker.mark(Phase::communication,
               ps.action ? Place{PlaceKind::microbatch, ps.action->microbatch} : Place{});
  std::vector<P2pOp> ops;
  std::vector<Key> sent;
  for (const P2p& op : ps.comm) {
    const Key key{key_payload(op.payload), op.microbatch, op.vstage};
    if (op.is_send) {
      auto it = pending_.find(key);
      SHARDSCOPE_REQUIRE(it != pending_.end(), "pipeline stage " + str(stage_) + ": nothing to send for " +
                                                   payload_name(op.payload) +
                                                   "(m=" + str(op.microbatch) + ", vstage " + str(op.vstage) + ")");
      ops.push_back({true, const_cast<float*>(it->second.data), it->second.count, op.peer, it->second.dtype});
      sent.push_back(key);
      continue;
    }
    // The output of the sender's virtual stage (activation) or of the one before this
    // receiver's (gradient): what crosses that boundary.
    const int boundary = op.payload == Payload::activation ? op.vstage : op.vstage - 1;
    const std::size_t count = boundary_elems(boundary, layout_.rows[op.microbatch]);
    const DType dtype = boundary_dtype(boundary);
    Slot* sl = nullptr;
    if (op.payload == Payload::activation) {
      // saved by the consumer's first block
      sl = &slot(op.microbatch, chunk_of_vstage(s, op.vstage + 1));
      sl->act_in = backend_.alloc(Category::activation, count, dtype);
      ops.push_back({false, sl->act_in.data(), count, op.peer, dtype});
    } else {
      // gradient of the consumer's output, a p2p staging buffer
      sl = &slot(op.microbatch, chunk_of_vstage(s, op.vstage - 1));
      sl->grad_in = backend_.alloc(Category::comm, count, dtype);
      ops.push_back({false, sl->grad_in.data(), count, op.peer, dtype});
    }
    // The fake communicator moves nothing: give the math defined inputs.
    if (comm_.emulated()) {
      if (dtype == DType::bf16) backend_.fill_bf16(as_bf16(ops.back().buf), 0.0f, count);
      else backend_.fill(ops.back().buf, 0.0f, count);
    }
  }
  peak_comm_bytes_ = std::max(peak_comm_bytes_, tracker.current()[Category::comm]);
  {
    ScopedRange r(backend_, "p2p");
    comm_.p2p(ops);
  }
  for (const Key& k : sent) pending_.erase(k);  // frees what nobody here still needs
  note_peak(before, "p2p before " + (ps.action ? describe_action(*ps.action, layout_.chunks()) : std::string("the end")));
}

float PipelineStage::run_action(const Action& a, const Buffer& x, const Buffer& target,
                                std::vector<bool>& grads_written) {
  const Schedule& s = layout_.schedule;
  const int V = layout_.vstages();
  const int k = vstage(a.chunk);
  const int first = layout_.first_layer(k), last = layout_.end_layer(k);
  const int rows = layout_.rows[a.microbatch];
  const int row_offset = layout_.row_offset[a.microbatch];
  Slot& sl = slot(a.microbatch, a.chunk);
  Tracker& tracker = backend_.tracker();
  const std::string what = describe_action(a, layout_.chunks());
  ModelContext mc{backend_, saved_, access_, tp_};

  tracker.mark(a.kind == ActionKind::F ? Phase::forward : Phase::backward, {PlaceKind::microbatch, a.microbatch});
  backend_.synchronize();
  const std::int64_t before = tracker.peak().total;
  ScopedRange range(backend_, what.c_str());
  const auto t0 = std::chrono::steady_clock::now();
  float loss = 0.0f;
  switch (a.kind) {
    case ActionKind::F: {
      const float* input = nullptr;
      if (k == 0)
        input = x.data() + model_->input_elems(row_offset);  // a row slice of the batch
      else if (stage_of_vstage(s, k - 1) == stage_)
        input = slot(a.microbatch, chunk_of_vstage(s, k - 1)).tape.output();  // one stage: local
      else
        input = sl.act_in.data();
      SHARDSCOPE_REQUIRE(input != nullptr, "pipeline stage " + str(stage_) + ": no input for " + what);
      sl.tape = model_->forward(mc, first, last, input, rows, /*input_requires_grad*/ k > 0);
      if (k == V - 1) {
        const int batch = cfg_.model.batch;
        const float scale = model_->loss_is_mean() ? static_cast<float>(rows) / static_cast<float>(batch) : 1.0f;
        loss = model_->loss_forward(mc, sl.tape, target ? target.data() + model_->target_elems(row_offset) : nullptr,
                                    scale);
      } else {
        // The stage's forward ends its autocast region (nothing in fp32).
        model_->end_autocast_region(sl.tape);
      }
      if (k != V - 1 && stage_of_vstage(s, k + 1) != stage_) {
        Pending p;
        p.count = boundary_elems(k, rows);
        p.dtype = boundary_dtype(k);
        if (model_->output_saved(last - 1, last)) {
          p.data = sl.tape.output();  // saved here: lives on in the tape until B
        } else {
          p.owned = std::move(sl.tape.outputs.back());  // temp: freed once sent
          p.data = p.owned.data();
        }
        pending_.emplace(Key{key_payload(Payload::activation), a.microbatch, k}, std::move(p));
      }
      break;
    }
    case ActionKind::B: {
      Buffer dy = std::move(sl.grad_in);
      SHARDSCOPE_REQUIRE(k == V - 1 || dy, "pipeline stage " + str(stage_) + ": no gradient for " + what);
      Buffer dx;
      if (s.split_backward) {
        // zbv's V bottom: the next virtual stage, here too, read this output as its input
        // and its W, not run yet, reads it again; it stays, owned by that pair, until then
        // (as autograd keeps a tensor two graphs saved).
        Slot* reader = nullptr;
        if (k + 1 < V && stage_of_vstage(s, k + 1) == stage_) {
          Slot& next = slot(a.microbatch, chunk_of_vstage(s, k + 1));
          if (!next.tape.outputs.empty()) reader = &next;
        }
        dx = model_->backward_input(mc, sl.tape, std::move(dy), reader != nullptr);
        if (reader) reader->act_in = std::move(sl.tape.outputs.back());
      } else {
        dx = model_->backward(mc, sl.tape, std::move(dy), grads_written[a.chunk] ? 1.0f : 0.0f);
        grads_written[a.chunk] = true;
        sl.act_in.reset();
        sl.tape = Tape{};
      }
      if (k > 0) {
        SHARDSCOPE_REQUIRE(dx, "pipeline stage " + str(stage_) + ": " + what + " produced no input gradient");
        if (stage_of_vstage(s, k - 1) == stage_) {
          slot(a.microbatch, chunk_of_vstage(s, k - 1)).grad_in = std::move(dx);
        } else {
          Pending p;
          p.count = boundary_elems(k - 1, rows);
          p.dtype = boundary_dtype(k - 1);
          p.data = dx.data();
          p.owned = std::move(dx);
          pending_.emplace(Key{key_payload(Payload::gradient), a.microbatch, k}, std::move(p));
        }
      }
      break;
    }
    case ActionKind::W: {
      model_->backward_weight(mc, sl.tape, grads_written[a.chunk] ? 1.0f : 0.0f);
      grads_written[a.chunk] = true;
      sl.act_in.reset();
      sl.tape = Tape{};
      break;
    }
  }
  backend_.synchronize();
  const auto t1 = std::chrono::steady_clock::now();
  action_ms_.push_back({a, std::chrono::duration<double, std::milli>(t1 - t0).count()});
  actions_end_ms_ = std::chrono::duration<double, std::milli>(t1 - step_start_).count();
  note_peak(before, what);
  return loss;
}

void PipelineStage::optimizer_step(int step) {
  const Model& m = *model_;
  std::vector<AdamWTensor> list;
  for (Chunk& ch : chunks_) {
    const int t0 = m.first_tensor(ch.first);
    for (int t = t0; t < m.first_tensor(ch.last); ++t) {
      AdamState& st = ch.state[t - t0];
      const std::int64_t off = m.tensor_offset(t) - m.tensor_offset(t0);
      backend_.fill(st.step.data(), static_cast<float>(step), 1);
      list.push_back({ch.params.data() + off, ch.grads.data() + off, st.exp_avg.data(), st.exp_avg_sq.data(),
                      static_cast<std::size_t>(m.tensor_elems(t)), step});
    }
  }
  if (tied_.copy) {
    backend_.fill(tied_.state.step.data(), static_cast<float>(step), 1);
    list.push_back({tied_.params.data(), tied_.grads.data(), tied_.state.exp_avg.data(), tied_.state.exp_avg_sq.data(),
                    tied_.elems, step});
  }
  if (!list.empty()) backend_.adamw(hyper_, list);
}

std::size_t PipelineStage::boundary_elems(int vstage, int rows) const {
  return static_cast<std::size_t>(model_->output_elems(layout_.end_layer(vstage) - 1, rows));
}

DType PipelineStage::boundary_dtype(int vstage) const { return model_->output_dtype(layout_.end_layer(vstage) - 1); }

std::vector<float> PipelineStage::download(const float* p, std::size_t n) const {
  std::vector<float> out(n);
  if (n) backend_.download(out.data(), p, n);
  return out;
}

std::vector<float> PipelineStage::download_params(int chunk) const {
  const Chunk& ch = chunks_.at(chunk);
  return download(ch.params.data(), ch.params.count());
}

std::vector<float> PipelineStage::download_tied_params() const { return download(tied_.params.data(), tied_.params.count()); }

std::vector<float> PipelineStage::download_tied_grads() const { return download(tied_.grads.data(), tied_.grads.count()); }

std::vector<float> PipelineStage::download_grads(int chunk) const {
  const Chunk& ch = chunks_.at(chunk);
  return download(ch.grads.data(), ch.grads.count());
}

std::vector<float> PipelineStage::download_state(int chunk, Buffer AdamState::*moment) const {
  std::vector<float> out;
  for (const AdamState& st : chunks_.at(chunk).state) {
    const Buffer& b = st.*moment;
    const std::vector<float> part = download(b.data(), b.count());
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

std::vector<float> PipelineStage::download_exp_avg(int chunk) const {
  return download_state(chunk, &AdamState::exp_avg);
}

std::vector<float> PipelineStage::download_exp_avg_sq(int chunk) const {
  return download_state(chunk, &AdamState::exp_avg_sq);
}

}  // namespace shardscope
