#include "harness/model/param_bf16_parts.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>

namespace shardscope {
namespace transformer {

Buffer bf16_tensor(Backend& be, Category c, i64 elems) { return be.alloc(c, floats(elems), DType::bf16); }

std::vector<float> widened(const Bf16* x, i64 n) {
  std::vector<float> w(floats(n));
  for (i64 i = 0; i < n; ++i) w[floats(i)] = from_bf16(x[i]);
  return w;
}

void round_into(Bf16* dst, const float* x, i64 n) {
  for (i64 i = 0; i < n; ++i) dst[i] = to_bf16(x[i]);
}

void write_grad(Bf16* dst, const float* g, i64 n, float beta) {
  for (i64 i = 0; i < n; ++i) dst[i] = to_bf16(beta == 0.0f ? g[i] : from_bf16(dst[i]) + g[i]);
}

void bf16_linear(Backend& be, Bf16* y, const Bf16* x, const Bf16* w, const Bf16* b, i64 n, int in, int out,
                 const Bf16* residual) {
  const std::vector<float> x32 = widened(x, n * in), w32 = widened(w, static_cast<i64>(out) * in);
  const std::vector<float> b32 = b ? widened(b, out) : std::vector<float>{};
  std::vector<float> y32 = residual ? widened(residual, n * out) : std::vector<float>(floats(n * out));
  linear_forward(be, y32.data(), x32.data(), w32.data(), b ? b32.data() : nullptr, n, in, out, residual ? 1.0f : 0.0f);
  round_into(y, y32.data(), n * out);
}

void bf16_linear_backward(Backend& be, Bf16* dx, Bf16* dw, Bf16* db, const Bf16* dy, const Bf16* x, const Bf16* w,
                          i64 n, int in, int out, float beta) {
  const std::vector<float> dy32 = widened(dy, n * out), x32 = widened(x, n * in);
  const std::vector<float> w32 = widened(w, static_cast<i64>(out) * in);
  std::vector<float> dw32(floats(static_cast<i64>(out) * in)), db32(db ? floats(out) : 0);
  std::vector<float> dx32(dx ? floats(n * in) : 0);
  linear_backward(be, dx ? dx32.data() : nullptr, dw32.data(), db ? db32.data() : nullptr, dy32.data(), x32.data(),
                  w32.data(), n, in, out, 0.0f);
  write_grad(dw, dw32.data(), static_cast<i64>(out) * in, beta);
  if (db) write_grad(db, db32.data(), out, beta);
  if (dx) round_into(dx, dx32.data(), n * in);
}

void bf16_layer_norm(Backend& be, Bf16* y, Bf16* mean, Bf16* rstd, const Bf16* x, const Bf16* gamma,
                     const Bf16* bias, i64 n, int h, float eps) {
  const std::vector<float> x32 = widened(x, n * h), g32 = widened(gamma, h), b32 = widened(bias, h);
  std::vector<float> y32(floats(n * h)), m32(floats(n)), r32(floats(n));
  be.layer_norm_forward(y32.data(), m32.data(), r32.data(), x32.data(), g32.data(), b32.data(), static_cast<int>(n), h,
                        eps);
  round_into(y, y32.data(), n * h);
  round_into(mean, m32.data(), n);
  round_into(rstd, r32.data(), n);
}

void bf16_layer_norm_backward(Backend& be, Bf16* dx, Bf16* dgamma, Bf16* dbias, const Bf16* dy, const Bf16* x,
                              const Bf16* mean, const Bf16* rstd, const Bf16* gamma, i64 n, int h, float beta) {
  const std::vector<float> dy32 = widened(dy, n * h), x32 = widened(x, n * h), m32 = widened(mean, n),
                           r32 = widened(rstd, n), g32 = widened(gamma, h);
  std::vector<float> dx32(floats(n * h)), dg32(floats(h)), db32(floats(h));
  be.layer_norm_backward(dx32.data(), dg32.data(), db32.data(), dy32.data(), x32.data(), m32.data(), r32.data(),
                         g32.data(), static_cast<int>(n), h, 0.0f);
  round_into(dx, dx32.data(), n * h);
  write_grad(dgamma, dg32.data(), h, beta);
  write_grad(dbias, db32.data(), h, beta);
}

void throw_unbuilt_param_bf16_split(const char* family) {
  throw RunError(std::string(family) + " under FSDP's bf16: the zero-bubble split (B and W apart) is not built");
}

// ---- the final block ----

Bf16FinalLayerNorm::Bf16FinalLayerNorm(const TransformerShape& s, const char* family, std::vector<ParamSpec> params,
                                       TensorRef tied)
    : SequenceBlock(s, family), params_(std::move(params)), tied_(tied) {}

TensorRef Bf16FinalLayerNorm::head_tensor(const BlockCall& c) const {
  return tied_.block >= 0 ? tied_ : TensorRef{c.index, 2};
}
const Bf16* Bf16FinalLayerNorm::head_weight(const BlockCall& c) const {
  const TensorRef t = head_tensor(c);
  return as_bf16(c.access.param(t.block, t.tensor));
}
Bf16* Bf16FinalLayerNorm::head_grad(const BlockCall& c) const {
  const TensorRef t = head_tensor(c);
  return as_bf16(c.access.grad(t.block, t.tensor));
}

Buffer Bf16FinalLayerNorm::forward(const BlockCall& c, const float* x, bool /*input_requires_grad*/,
                                   bool output_saved, BlockTape& tape) {
  Backend& be = c.backend;
  const i64 n = tokens(c.rows), h = s_.hidden, v = s_.vocab;
  std::vector<Buffer>& held = tape.held;
  held.clear();
  held.resize(kHeld);
  c.access.module_forward_begin(norm_module(c));
  held[kMean] = bf16_tensor(be, Category::activation, n);
  held[kRstd] = bf16_tensor(be, Category::activation, n);
  held[kY] = bf16_tensor(be, Category::activation, n * h);
  bf16_layer_norm(be, held[kY].bf16(), held[kMean].bf16(), held[kRstd].bf16(), as_bf16(x), bf16_param(c, 0),
                  bf16_param(c, 1), n, s_.hidden, s_.norm_eps);
  c.saved.save(x, 2 * n * h);
  c.saved.save(held[kMean].raw(), 2 * n);
  c.saved.save(held[kRstd].raw(), 2 * n);
  c.saved.save(norm_ref_(), 0);
  c.access.module_forward_end(norm_module(c));
  // logits (N, V) bf16: nobody saves them (log_softmax saves its result).
  c.access.module_forward_begin({head_tensor(c)});
  Buffer out = bf16_tensor(be, output_saved ? Category::activation : Category::temp, n * v);
  bf16_linear(be, out.bf16(), held[kY].bf16(), head_weight(c), nullptr, n, s_.hidden, s_.vocab);
  c.saved.save(held[kY].raw(), 2 * n * h);
  c.saved.save(head_ref_(), 0);
  c.access.module_forward_end({head_tensor(c)});
  return out;
}

Buffer Bf16FinalLayerNorm::backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx,
                                    float beta, BlockTape& tape) {
  Backend& be = c.backend;
  const i64 n = tokens(c.rows), h = s_.hidden;
  std::vector<Buffer>& held = tape.held;
  out.reset();
  // The head: d y (N, h) bf16 beside dlogits; a tied weight's gradient written first, with beta.
  c.access.module_backward_begin({head_tensor(c)});
  Buffer dnorm = bf16_tensor(be, Category::temp, n * h);
  bf16_linear_backward(be, dnorm.bf16(), head_grad(c), nullptr, dy.bf16(), held[kY].bf16(), head_weight(c), n,
                       s_.hidden, s_.vocab, beta);
  dy.reset();
  c.saved.release(head_ref_());
  c.saved.release(held[kY].raw());
  held[kY].reset();
  c.access.module_backward_end({head_tensor(c)}, true);
  c.access.module_backward_begin(norm_module(c));
  Buffer dx = bf16_tensor(be, Category::temp, n * h);
  bf16_layer_norm_backward(be, dx.bf16(), bf16_grad(c, 0), bf16_grad(c, 1), dnorm.bf16(), as_bf16(x),
                           held[kMean].bf16(), held[kRstd].bf16(), bf16_param(c, 0), n, s_.hidden, beta);
  dnorm.reset();
  c.saved.release(norm_ref_());
  c.saved.release(x);
  for (int j : {kMean, kRstd}) {
    c.saved.release(held[j].raw());
    held[j].reset();
  }
  c.access.module_backward_end(norm_module(c), true);
  return finish_backward(held, std::move(dx), needs_dx);
}

Buffer Bf16FinalLayerNorm::backward_input(const BlockCall&, const float*, Buffer&, Buffer, bool, bool, BlockTape&) {
  throw_unbuilt_param_bf16_split(family());
}
void Bf16FinalLayerNorm::backward_weight(const BlockCall&, const float*, float, BlockTape&) {
  throw_unbuilt_param_bf16_split(family());
}

namespace {

// ---- the embeddings ----

class Bf16Embedding final : public SequenceBlock {
 public:
  Bf16Embedding(const TransformerShape& s, const EmbeddingNames& names, const char* family)
      : SequenceBlock(s, family), positions_(!names.positions.empty()) {
    params_ = {{names.tokens, {s.vocab, s.hidden}, uniform_bound(kInitStd)}};
    if (positions_) params_.push_back({names.positions, {s.positions, s.hidden}, uniform_bound(kInitStd)});
  }
  std::string name() const override { return "embeddings"; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  std::int64_t input_elems(int rows) const override { return id_floats(tokens(rows)); }
  std::int64_t output_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  DType output_dtype() const override { return DType::bf16; }
  bool saves_input() const override { return true; }  // the ids, as EmbeddingBackward's indices
  bool saves_output() const override { return false; }
  std::vector<float> host_input(const DataSlice& at) const override {
    return token_rows(at, s_.seq, s_.vocab, kInputBase);
  }

  Buffer forward(const BlockCall& c, const float* in, bool /*input_requires_grad*/, bool output_saved,
                 BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows), h = s_.hidden;
    tape.held.clear();
    if (positions_) {
      // pos = arange(seq), int64, saved by the positions' EmbeddingBackward (activation).
      Buffer pos = be.alloc(Category::activation, floats(id_floats(s_.seq)));
      std::vector<float> host(floats(id_floats(s_.seq)));
      for (int i = 0; i < s_.seq; ++i) ids_of(host.data())[i] = i;
      be.upload(pos.data(), host.data(), host.size());
      tape.held.push_back(std::move(pos));
    }
    // x0 (N, h) bf16 = tokens[idx] + positions[t], each lookup exact, the sum rounded once;
    // each table read inside its own module hooks (DeepSpeed's stage 3 gathers each on its own).
    const std::vector<TensorRef> tokens_module = module_tensors(c.index, {0});
    c.access.module_forward_begin(tokens_module);
    Buffer out = bf16_tensor(be, output_saved ? Category::activation : Category::temp, n * h);
    const std::int64_t* ids = ids_of(in);
    const Bf16* table = bf16_param(c, 0);
    for (i64 i = 0; i < n; ++i) std::copy(table + ids[i] * h, table + ids[i] * h + h, out.bf16() + i * h);
    c.access.module_forward_end(tokens_module);
    if (positions_) {
      c.access.module_forward_begin(module_tensors(c.index, {1}));
      const Bf16* pos = bf16_param(c, 1);
      for (i64 i = 0; i < n; ++i) {
        const Bf16* prow = pos + (i % s_.seq) * h;
        Bf16* o = out.bf16() + i * h;
        for (i64 j = 0; j < h; ++j) o[j] = to_bf16(from_bf16(o[j]) + from_bf16(prow[j]));
      }
      c.access.module_forward_end(module_tensors(c.index, {1}));
    }
    c.saved.save(in, 8 * n);
    if (positions_) c.saved.save(tape.held[0].data(), 8 * static_cast<i64>(s_.seq));
    return out;
  }

  Buffer backward(const BlockCall& c, const float* in, Buffer& out, Buffer dy, bool /*needs_dx*/, float beta,
                  BlockTape& tape) override {
    out.reset();
    const i64 n = tokens(c.rows), h = s_.hidden;
    const std::int64_t* ids = ids_of(in);
    // The positions first, as torch's backward reaches the table that forward used last
    // first (DeepSpeed's stage 3 gathers each table in its own pre-backward hook; its
    // post-backward hook never fires, the ids taking no gradient).
    if (positions_) {
      // dpos (positions, h): the sum over sequences at each t; rows past seq get none.
      c.access.module_backward_begin(module_tensors(c.index, {1}));
      std::vector<float> dpos(floats(static_cast<i64>(s_.positions) * h), 0.0f);
      for (i64 i = 0; i < n; ++i)
        for (i64 j = 0; j < h; ++j) dpos[floats((i % s_.seq) * h + j)] += from_bf16(dy.bf16()[i * h + j]);
      write_grad(bf16_grad(c, 1), dpos.data(), static_cast<i64>(s_.positions) * h, beta);
      c.access.module_backward_end(module_tensors(c.index, {1}), false);
    }
    // The table's rows the ids name, summed in fp32, each added once into the bf16
    // gradient: onto a tied head's (which wrote the whole table first), else onto zeros.
    const std::vector<TensorRef> tokens_module = module_tensors(c.index, {0});
    c.access.module_backward_begin(tokens_module);
    Bf16* dtable = bf16_grad(c, 0);
    const bool tied = s_.tied_embeddings;
    if (!tied && beta == 0.0f) std::fill(dtable, dtable + static_cast<i64>(s_.vocab) * h, Bf16{});
    std::map<std::int64_t, std::vector<float>> rows;
    for (i64 i = 0; i < n; ++i) {
      std::vector<float>& r = rows[ids[i]];
      if (r.empty()) r.assign(floats(h), 0.0f);
      for (i64 j = 0; j < h; ++j) r[floats(j)] += from_bf16(dy.bf16()[i * h + j]);
    }
    for (const auto& [id, r] : rows) write_grad(dtable + id * h, r.data(), h, 1.0f);
    dy.reset();
    c.access.module_backward_end(tokens_module, false);
    c.saved.release(in);
    if (positions_) c.saved.release(tape.held[0].data());
    tape.held.clear();
    return Buffer{};  // token ids take no gradient
  }

  Buffer backward_input(const BlockCall&, const float*, Buffer&, Buffer, bool, bool, BlockTape&) override {
    throw_unbuilt_param_bf16_split(family());
  }
  void backward_weight(const BlockCall&, const float*, float, BlockTape&) override {
    throw_unbuilt_param_bf16_split(family());
  }

 private:
  bool positions_;
  std::vector<ParamSpec> params_;
};

// ---- cross-entropy on bf16 logits ----

class Bf16CrossEntropy final : public ModelLoss {
 public:
  Bf16CrossEntropy(const TransformerShape& s, const char* family) : s_(s), family_(family) {}
  bool saves_input() const override { return false; }
  bool is_mean() const override { return true; }
  std::int64_t target_elems(int rows) const override { return id_floats(tokens(rows)); }
  void fill_target(Backend& backend, float* target, const DataSlice& at) const override {
    const std::vector<float> host = token_rows(at, s_.seq, s_.vocab, kTargetBase);
    backend.upload(target, host.data(), host.size());
  }

  void forward(Backend& be, SavedTensors& saved, const float* logits, const float* target, int rows, float scale,
               float* value) override {
    const i64 n = tokens(rows), v = s_.vocab;
    Held& h = held_[target];  // one per micro-batch in flight, by its target
    h.logprobs = bf16_tensor(be, Category::activation, n * v);
    h.total_weight = bf16_tensor(be, Category::activation, 1);
    const std::vector<float> x32 = widened(as_bf16(logits), n * v);
    std::vector<float> lp32(floats(n * v));
    be.log_softmax_forward(lp32.data(), x32.data(), n, s_.vocab);
    round_into(h.logprobs.bf16(), lp32.data(), n * v);
    h.total_weight.bf16()[0] = to_bf16(static_cast<float>(n));
    // The loss from the bf16 log-probabilities (what nll_loss reads), kept in fp32.
    const std::vector<float> lp = widened(h.logprobs.bf16(), n * v);
    be.nll_loss_forward(value, lp.data(), ids_of(target), n, s_.vocab, scale);
    saved.save(h.logprobs.raw(), 2 * n * v);
    saved.save(target, 8 * n);
    saved.save(h.total_weight.raw(), 2);
  }

  Buffer backward(Backend& be, SavedTensors& saved, const float* /*logits*/, const float* target, int rows,
                  float scale) override {
    const i64 n = tokens(rows), v = s_.vocab;
    auto it = held_.find(target);
    SHARDSCOPE_REQUIRE(it != held_.end(), std::string(family_) + ": cross-entropy backward without its forward");
    Held& h = it->second;
    Buffer dlogits = bf16_tensor(be, Category::temp, n * v);  // (N, V) bf16
    const std::vector<float> lp = widened(h.logprobs.bf16(), n * v);
    std::vector<float> d32(floats(n * v));
    be.cross_entropy_backward(d32.data(), lp.data(), ids_of(target), n, s_.vocab, scale);
    round_into(dlogits.bf16(), d32.data(), n * v);
    saved.release(h.logprobs.raw());
    saved.release(target);
    saved.release(h.total_weight.raw());
    held_.erase(it);
    return dlogits;
  }

 private:
  struct Held {
    Buffer logprobs;
    Buffer total_weight;
  };
  i64 tokens(int rows) const { return static_cast<i64>(rows) * s_.seq; }
  TransformerShape s_;
  const char* family_;
  std::map<const float*, Held> held_;
};

}  // namespace

std::unique_ptr<Block> make_bf16_embedding_block(const TransformerShape& shape, const EmbeddingNames& names,
                                                 const char* family) {
  return std::make_unique<Bf16Embedding>(shape, names, family);
}

std::unique_ptr<ModelLoss> make_bf16_cross_entropy(const TransformerShape& shape, const char* family) {
  return std::make_unique<Bf16CrossEntropy>(shape, family);
}

}  // namespace transformer
}  // namespace shardscope
