#include "harness/model/model.hpp"

#include <algorithm>

#include "harness/model/data.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

// A block's profiler range: "forward layer 3".
std::string block_range(const char* what, const Block& block) { return std::string(what) + " " + block.name(); }

}  // namespace

std::int64_t ParamSpec::elems() const {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

Buffer StepCasts::cast(Backend& backend, const float* param, std::int64_t elems) {
  Buffer& c = casts_[param];
  if (!c) {
    c = backend.alloc(Category::param_cast, static_cast<std::size_t>(elems), DType::bf16);
    backend.cast_to_bf16(c.bf16(), param, static_cast<std::size_t>(elems));
  }
  return Buffer(nullptr, c.raw(), c.count(), c.category(), c.dtype());
}

void Model::use_step_casts() {
  step_casts_ = std::make_shared<StepCasts>();
  for (auto& b : blocks_) b->use_step_casts(step_casts_);
}

Model::Model(std::vector<std::unique_ptr<Block>> blocks, std::unique_ptr<ModelLoss> loss)
    : blocks_(std::move(blocks)), loss_(std::move(loss)) {
  tensor_offset_.push_back(0);
  for (const auto& b : blocks_) {
    first_tensor_.push_back(static_cast<int>(tensors_.size()));
    for (const ParamSpec& p : b->params()) {
      tensors_.push_back(&p);
      tensor_offset_.push_back(tensor_offset_.back() + p.elems());
    }
  }
  first_tensor_.push_back(static_cast<int>(tensors_.size()));
  set_checkpoint(CheckpointPolicy{});
}

void Model::set_checkpoint(const CheckpointPolicy& policy) {
  checkpointed_.assign(blocks_.size(), false);
  ordinal_.assign(blocks_.size(), -1);
  int c = 0;
  for (int b = 0; b < blocks(); ++b) {
    blocks_[b]->set_recompute_attention(policy.attention());
    if (!blocks_[b]->checkpointable()) continue;
    ordinal_[b] = c;
    checkpointed_[b] = policy.wraps(c);
    ++c;
  }
}

bool Model::any_checkpointed() const {
  return std::find(checkpointed_.begin(), checkpointed_.end(), true) != checkpointed_.end();
}

std::vector<std::int64_t> Model::tensor_sizes() const {
  std::vector<std::int64_t> out;
  for (int t = 0; t < param_tensors(); ++t) out.push_back(tensor_elems(t));
  return out;
}

std::vector<std::int64_t> Model::block_sizes() const {
  std::vector<std::int64_t> out;
  for (int b = 0; b < blocks(); ++b) out.push_back(block_elems(b));
  return out;
}

std::vector<float> Model::init_flat_slice(std::uint64_t seed, std::int64_t begin, std::int64_t count) const {
  std::vector<float> out(static_cast<std::size_t>(count), 0.0f);
  const std::int64_t end = std::min(begin + count, params());
  // The first tensor that reaches past `begin`, then on while tensors start before `end`.
  int t = static_cast<int>(std::upper_bound(tensor_offset_.begin(), tensor_offset_.end(), begin) -
                           tensor_offset_.begin()) - 1;
  for (t = std::max(t, 0); t < param_tensors() && tensor_offset(t) < end; ++t) {
    const std::int64_t t0 = tensor_offset(t);
    const std::int64_t lo = std::max(begin, t0);
    const std::int64_t hi = std::min(end, t0 + tensor_elems(t));
    if (lo < hi) {
      float* dst = out.data() + (lo - begin);
      const ParamSpec& spec = tensor(t);
      if (spec.full_cols == 0) {
        init_uniform_slice(seed, t, spec.init_bound, lo - t0, hi - lo, dst);
      } else {
        // A shard: its elements, row by row, are the whole tensor's at full_index.
        for (std::int64_t k = lo - t0; k < hi - t0;) {
          const std::int64_t run = std::min(hi - t0 - k, spec.shard_cols - k % spec.shard_cols);
          init_uniform_slice(seed, t, spec.init_bound, spec.full_index(k), run, dst + (k - (lo - t0)));
          k += run;
        }
      }
      if (const float c = tensor(t).init_center; c != 0.0f)
        for (std::int64_t i = 0; i < hi - lo; ++i) dst[i] += c;
    }
  }
  return out;
}

std::vector<TensorRef> module_tensors(int block, std::initializer_list<int> tensors) {
  std::vector<TensorRef> out;
  for (int t : tensors)
    if (t >= 0) out.push_back({block, t});
  return out;
}

std::vector<float> Block::host_input(const DataSlice& at) const {
  return hashed_rows(at.seed, at.step, at.rank, at.row_begin, at.rows, static_cast<int>(input_elems(1)));
}

Buffer Model::make_target(Backend& backend, const DataSlice& at) const {
  const std::int64_t n = target_elems(at.rows);
  if (n == 0) return Buffer{};
  Buffer target = backend.alloc(Category::temp, static_cast<std::size_t>(n));
  loss_->fill_target(backend, target.data(), at);
  return target;
}

bool Model::output_saved(int b, int last) const {
  if (block(b).saves_output() && !checkpointed(b)) return true;
  if (b + 1 < last) return checkpointed(b + 1) || block(b + 1).saves_input();
  return b + 1 == blocks() && loss_->saves_input();
}

const float* Model::block_input(const Tape& tape, int b) const {
  return b == tape.first ? tape.input : tape.outputs[b - 1 - tape.first].data();
}

Tape Model::forward(ModelContext& ctx, int first, int last, const float* input, int rows,
                    bool input_requires_grad) {
  Tape tape;
  tape.first = first;
  tape.last = last;
  tape.rows = rows;
  tape.input = input;
  tape.input_requires_grad = input_requires_grad;
  tape.blocks.resize(static_cast<std::size_t>(last - first));
  const float* in = input;
  bool in_requires_grad = input_requires_grad;
  for (int b = first; b < last; ++b) {
    ctx.backend.tracker().mark(Phase::forward, {PlaceKind::layer, b});
    ctx.access.before_forward(b);
    Buffer out;
    {
      // The block's range closes before the hooks' work (a zero3 reshard), so a unit's
      // range (opened and closed by the hooks) nests around its blocks'.
      ScopedRange range(ctx.backend, block_range("forward", block(b)).c_str());
      if (checkpointed(b)) {
        // torch's checkpoint saves the function's input (_NoopSaveInputs) and packs
        // every save inside into a holder that keeps no tensor: so the block's saves go
        // to an instrument that is dropped, and what it kept for backward is freed (but
        // the input it made itself, which the checkpoint saves: BlockTape::saved_input).
        SavedTensors dropped;
        BlockTape& bt = tape.blocks[b - first];
        out = blocks_[b]->forward({ctx.backend, dropped, ctx.access, b, rows, ctx.tp}, in, in_requires_grad,
                                  output_saved(b, last), bt);
        blocks_[b]->drop_checkpointed(bt);
        if (bt.saved_input)  // the block made the input the checkpoint saves (its re-run reads it)
          ctx.saved.save(bt.saved_input.raw(), bt.saved_input.bytes());
        else
          ctx.saved.save(in, input_bytes(b, rows));
      } else {
        out = blocks_[b]->forward(call(ctx, b, rows), in, in_requires_grad, output_saved(b, last),
                                  tape.blocks[b - first]);
      }
    }
    ctx.access.after_forward(b);
    // An input the block made from another's output and nobody saved is freed once its
    // forward ends, as torch frees a tensor no save and no name holds (Llama's bf16 module:
    // each norm saves its fp32 upcast, not the bf16 stream).
    if (b > first && !output_saved(b - 1, last)) tape.outputs.back().reset();
    in = out.data();
    in_requires_grad = true;
    tape.outputs.push_back(std::move(out));
  }
  return tape;
}

float Model::loss_forward(ModelContext& ctx, Tape& tape, const float* target, float scale) {
  SHARDSCOPE_REQUIRE(tape.last == blocks(), "loss on a tape that does not end the model");
  tape.has_loss = true;
  tape.loss_scale = scale;
  tape.target = target;
  Buffer value = ctx.backend.alloc(Category::temp, 1);  // the loss scalar
  loss_->bind_tensor_parallel(ctx.tp);
  loss_->forward(ctx.backend, ctx.saved, tape.output(), target, tape.rows, scale, value.data());
  float host = 0.0f;
  ctx.backend.download(&host, value.data(), 1);
  // An output nobody saved is not needed by backward (sum's gradient is constant).
  if (!output_saved(tape.last - 1, tape.last)) tape.outputs.back().reset();
  // The autocast region ends with the loss: its cast cache lets go of what wrapped
  // blocks kept past their forward (their weights' casts; nothing in fp32).
  for (int b = tape.first; b < tape.last; ++b)
    if (checkpointed(b)) tape.blocks[b - tape.first].held.clear();
  return host;
}

void Model::end_autocast_region(Tape& tape) {
  loss_->end_autocast_region();
  for (int b = tape.first; b < tape.last; ++b)
    if (checkpointed(b)) tape.blocks[b - tape.first].held.clear();
}

Buffer Model::loss_gradient(ModelContext& ctx, Tape& tape) {
  ctx.backend.tracker().mark(Phase::backward, {PlaceKind::layer, tape.last - 1});
  const float* y = tape.outputs.back() ? tape.output() : nullptr;
  loss_->bind_tensor_parallel(ctx.tp);
  return loss_->backward(ctx.backend, ctx.saved, y, tape.target, tape.rows, tape.loss_scale);
}

Buffer Model::backward(ModelContext& ctx, Tape& tape, Buffer dy, float beta) {
  ctx.saved.begin_backward();
  if (tape.has_loss) dy = loss_gradient(ctx, tape);
  for (int b = tape.last - 1; b >= tape.first; --b) {
    const int j = b - tape.first;
    const bool recompute = checkpointed(b);
    // The forward's output of a checkpointed block: the block above (or the loss) has
    // consumed it, and the re-run makes the one its backward uses.
    if (recompute) tape.outputs[j].reset();
    ctx.backend.tracker().mark(Phase::backward, {PlaceKind::layer, b});
    ctx.access.before_backward(b);
    const bool needs_dx = b > tape.first || tape.input_requires_grad;
    const float* in = block_input(tape, b);
    if (recompute) {
      const Place was = ctx.backend.tracker().place();
      ctx.backend.tracker().mark(Phase::backward, {PlaceKind::recompute, checkpoint_ordinal(b)});
      ctx.access.before_recompute(b);
      {
        ScopedRange range(ctx.backend, block_range("recompute", block(b)).c_str());
        tape.outputs[j] = blocks_[b]->forward(call(ctx, b, tape.rows), in, needs_dx, block(b).saves_output(),
                                              tape.blocks[j]);
        // Nothing holds a re-run output the block does not save: freed at once.
        if (!block(b).saves_output()) tape.outputs[j].reset();
        blocks_[b]->end_recompute(tape.blocks[j]);
      }
      ctx.backend.tracker().mark(Phase::backward, was);
      ctx.access.after_recompute(b);
    }
    Buffer dx;
    {
      // Closes before the hooks' reduce-scatter.
      ScopedRange range(ctx.backend, block_range("backward", block(b)).c_str());
      // The checkpoint's save of its input (the block's own, which its backward frees, or `in`).
      const void* checkpoint_save = tape.blocks[j].saved_input ? tape.blocks[j].saved_input.raw() : in;
      dx = blocks_[b]->backward(call(ctx, b, tape.rows), in, tape.outputs[j], std::move(dy), needs_dx, beta,
                                tape.blocks[j]);
      if (recompute) ctx.saved.release(checkpoint_save);
    }
    ctx.access.after_backward(b);
    dy = std::move(dx);
  }
  return dy;
}

Buffer Model::backward_input(ModelContext& ctx, Tape& tape, Buffer dy, bool keep_output) {
  SHARDSCOPE_REQUIRE(!any_checkpointed(), "zero-bubble halves of a checkpointed model");
  ctx.saved.begin_backward();
  if (tape.has_loss) dy = loss_gradient(ctx, tape);
  for (int b = tape.last - 1; b >= tape.first; --b) {
    ctx.backend.tracker().mark(Phase::backward, {PlaceKind::layer, b});
    ctx.access.before_backward(b);
    ScopedRange range(ctx.backend, block_range("backward-input", block(b)).c_str());
    const bool needs_dx = b > tape.first || tape.input_requires_grad;
    const int j = b - tape.first;
    // The segment's last output is no block's input: its block frees it once done.
    dy = blocks_[b]->backward_input(call(ctx, b, tape.rows), block_input(tape, b), tape.outputs[j], std::move(dy), needs_dx,
                                    b == tape.last - 1 && !keep_output, tape.blocks[j]);
  }
  return dy;
}

void Model::backward_weight(ModelContext& ctx, Tape& tape, float beta) {
  for (int b = tape.last - 1; b >= tape.first; --b) {
    ctx.backend.tracker().mark(Phase::backward, {PlaceKind::layer, b});
    {
      ScopedRange range(ctx.backend, block_range("backward-weight", block(b)).c_str());
      const int j = b - tape.first;
      blocks_[b]->backward_weight(call(ctx, b, tape.rows), block_input(tape, b), beta, tape.blocks[j]);
      // The block's input, when another block of the segment made it, is needed no more.
      if (b > tape.first) tape.outputs[j - 1].reset();
    }
    ctx.access.after_backward(b);
  }
}

}  // namespace shardscope
