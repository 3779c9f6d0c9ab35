#include "harness/model/autocast_parts.hpp"

#include <algorithm>
#include <string>

namespace shardscope {
namespace transformer {

void autocast_round(float* x, i64 n) {
  for (i64 i = 0; i < n; ++i) x[i] = from_bf16(to_bf16(x[i]));
}

Buffer alloc_bf16(Backend& be, Category c, i64 elems) { return be.alloc(c, floats(elems), DType::bf16); }

Buffer cast_bf16(Backend& be, Category c, const float* x, i64 elems) {
  Buffer b = alloc_bf16(be, c, elems);
  Bf16* y = b.bf16();
  for (i64 i = 0; i < elems; ++i) y[i] = to_bf16(x[i]);
  return b;
}

Buffer weight_cast_bf16(Backend& be, StepCasts* casts, const float* w, i64 elems) {
  return casts != nullptr ? casts->cast(be, w, elems) : cast_bf16(be, kCastCategory, w, elems);
}

Buffer widen(Backend& be, const Buffer& x, i64 elems) {
  Buffer w = be.alloc(Category::temp, floats(elems));
  const Bf16* b = x.bf16();
  for (i64 i = 0; i < elems; ++i) w.data()[i] = from_bf16(b[i]);
  return w;
}

Buffer rounded_copy(Backend& be, const float* x, i64 count) {
  Buffer b = be.alloc(Category::temp, floats(count));
  be.copy(b.data(), x, floats(count));
  autocast_round(b.data(), count);
  return b;
}

Buffer autocast_linear(Backend& be, const Buffer& x, const Buffer& w, const float* b, i64 n, int in, int out) {
  Buffer xf = widen(be, x, n * in);
  Buffer wf = widen(be, w, static_cast<i64>(out) * in);
  Buffer y = be.alloc(Category::temp, floats(n * out));
  Buffer bias;
  if (b) bias = rounded_copy(be, b, out);
  linear_forward(be, y.data(), xf.data(), wf.data(), b ? bias.data() : nullptr, n, in, out, 0.0f);
  autocast_round(y.data(), n * out);
  return y;
}

Buffer autocast_linear_backward(Backend& be, const float* dy, const Buffer& x, const Buffer& w, float* dw, float* db,
                                i64 n, int in, int out, float beta) {
  Buffer xf = widen(be, x, n * in);
  Buffer wf = widen(be, w, static_cast<i64>(out) * in);
  Buffer dx = be.alloc(Category::temp, floats(n * in));
  linear_backward(be, dx.data(), dw, db, dy, xf.data(), wf.data(), n, in, out, beta);
  autocast_round(dx.data(), n * in);
  return dx;
}

Buffer reduce_row_parallel(const BlockCall& c, Buffer& y, i64 count, const char* who) {
  Buffer sum = cast_bf16(c.backend, Category::temp, y.data(), count);
  y.reset();
  tp_group(c, who).all_reduce_sum_bf16(sum.bf16(), floats(count));
  return sum;
}

void add_row_parallel_output(Backend& be, float* out, const float* residual, const Buffer& sum, const float* b,
                             i64 n, int hidden) {
  const i64 count = n * hidden;
  be.copy(out, residual, floats(count));
  const Bf16* s = sum.bf16();
  for (i64 i = 0; i < count; ++i) out[i] += from_bf16(s[i]);
  if (b) be.bias_activation(out, b, static_cast<int>(n), hidden, Activation::none);
}

void keep_only(std::vector<Buffer>& held, std::initializer_list<int> keep) {
  for (std::size_t j = 0; j < held.size(); ++j)
    if (std::find(keep.begin(), keep.end(), static_cast<int>(j)) == keep.end()) held[j].reset();
}

void throw_unbuilt_autocast_split(const char* family) {
  throw RunError(std::string(family) + " under bf16: the zero-bubble split (B and W apart) is not built");
}

AutocastFinal::AutocastFinal(const TransformerShape& s, const char* family, Norm norm, std::vector<ParamSpec> params,
                             TensorRef tied, const TensorParallel& tp)
    : SequenceBlock(s, family),
      norm_(norm),
      params_(std::move(params)),
      tied_(tied),
      tp_(tp),
      vocab_(s.vocab / tp.size) {}

const float* AutocastFinal::head_weight(const BlockCall& c) const {
  return tied_.block >= 0 ? c.access.param(tied_.block, tied_.tensor) : c.access.param(c.index, 1);
}
float* AutocastFinal::head_grad(const BlockCall& c) const {
  return tied_.block >= 0 ? c.access.grad(tied_.block, tied_.tensor) : c.access.grad(c.index, 1);
}

Buffer AutocastFinal::forward(const BlockCall& c, const float* x, bool /*input_requires_grad*/, bool output_saved,
                              BlockTape& tape) {
  Backend& be = c.backend;
  const i64 n = tokens(c.rows), h = s_.hidden, v = vocab_;
  std::vector<Buffer>& held = tape.held;
  held.clear();
  held.resize(kHeld);
  const bool layer = norm_ == Norm::layer;
  if (layer) held[kMean] = be.alloc(Category::activation, floats(n));
  held[kRstd] = be.alloc(Category::activation, floats(n));
  Buffer y = be.alloc(Category::temp, floats(n * h));
  if (layer)
    be.layer_norm_forward(y.data(), held[kMean].data(), held[kRstd].data(), x, c.access.param(c.index, 0),
                          c.access.param(c.index, 1), static_cast<int>(n), s_.hidden, s_.norm_eps);
  else
    be.rms_norm_forward(y.data(), held[kRstd].data(), x, c.access.param(c.index, 0), static_cast<int>(n), s_.hidden,
                        s_.norm_eps);
  c.saved.save(x, 4 * n * h);
  if (layer) c.saved.save(held[kMean].data(), 4 * n);
  c.saved.save(held[kRstd].data(), 4 * n);
  c.saved.save(norm_ref_(), 0);
  held[kY] = cast_bf16(be, Category::activation, y.data(), n * h);
  y.reset();
  // logits (N, V) = bf16(y W^T): mm saves y's cast and the weight's; the loss casts the
  // logits to fp32, which is what this block hands it.
  held[kW] = weight_cast_bf16(be, step_casts_.get(), head_weight(c), v * h);
  Buffer logits = autocast_linear(be, held[kY], held[kW], nullptr, n, s_.hidden, vocab_);
  c.saved.save(held[kY].data(), 2 * n * h);
  c.saved.save(held[kW].data(), 2 * v * h);
  if (!output_saved) return logits;
  Buffer out = be.alloc(Category::activation, floats(n * v));
  be.copy(out.data(), logits.data(), floats(n * v));
  return out;
}

Buffer AutocastFinal::backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, float beta,
                               BlockTape& tape) {
  Backend& be = c.backend;
  const i64 n = tokens(c.rows), h = s_.hidden;
  std::vector<Buffer>& held = tape.held;
  out.reset();
  // The head: the gradient at the bf16 logits is bf16; a tied weight's gradient is written
  // first, with beta (the embedding adds its part later).
  autocast_round(dy.data(), n * vocab_);
  Buffer dnorm = autocast_linear_backward(be, dy.data(), held[kY], held[kW], head_grad(c), nullptr, n, s_.hidden,
                                          vocab_, beta);
  dy.reset();
  // The head's input went to every rank: its (fp32) gradient is the group's sum.
  column_parallel_input_grad(c, tp_, dnorm, "the vocabulary-parallel head");
  drop_saved(c.saved, held[kW]);
  drop_saved(c.saved, held[kY]);
  Buffer dx = be.alloc(Category::temp, floats(n * h));
  if (norm_ == Norm::layer)
    be.layer_norm_backward(dx.data(), c.access.grad(c.index, 0), c.access.grad(c.index, 1), dnorm.data(), x,
                           held[kMean].data(), held[kRstd].data(), c.access.param(c.index, 0), static_cast<int>(n),
                           s_.hidden, beta);
  else
    be.rms_norm_backward(dx.data(), c.access.grad(c.index, 0), dnorm.data(), x, held[kRstd].data(),
                         c.access.param(c.index, 0), static_cast<int>(n), s_.hidden, beta);
  dnorm.reset();
  c.saved.release(norm_ref_());
  c.saved.release(x);
  if (norm_ == Norm::layer) drop_saved(c.saved, held[kMean]);
  drop_saved(c.saved, held[kRstd]);
  return finish_backward(held, std::move(dx), needs_dx);
}

}  // namespace transformer
}  // namespace shardscope
