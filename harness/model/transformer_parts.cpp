#include "harness/model/transformer_parts.hpp"

#include <cmath>

#include "harness/model/data.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace transformer {

float uniform_bound(float std) { return std * std::sqrt(3.0f); }

Communicator& tp_group(const BlockCall& c, const char* who) {
  SHARDSCOPE_REQUIRE(c.tp != nullptr, std::string(who) + ": a tensor-parallel part without its group");
  return *c.tp;
}

void residual_linear_forward(const BlockCall& c, const TensorParallel& tp, float* out, const float* residual,
                             const float* x, const float* w, const float* b, i64 n, int in, int hidden,
                             const char* who) {
  Backend& be = c.backend;
  if (tp.size == 1) {
    be.copy(out, residual, floats(n * hidden));
    linear_forward(be, out, x, w, b, n, in, hidden, 1.0f);
    return;
  }
  const i64 ns = stream_tokens(tp, n);
  if (tp.sequence) {
    Buffer partial = be.alloc(Category::temp, floats(n * hidden));
    linear_forward(be, partial.data(), x, w, nullptr, n, in, hidden, 0.0f);
    tp_group(c, who).reduce_scatter_sum(partial.data(), out, floats(ns * hidden));
  } else {
    linear_forward(be, out, x, w, nullptr, n, in, hidden, 0.0f);
    tp_group(c, who).all_reduce_sum(out, floats(n * hidden));
  }
  be.add(out, residual, floats(ns * hidden));
  if (b) be.bias_activation(out, b, static_cast<int>(ns), hidden, Activation::none);
}

void column_parallel_input_grad(const BlockCall& c, const TensorParallel& tp, Buffer& dx, const char* who) {
  if (tp.size > 1) tp_group(c, who).all_reduce_sum(dx.data(), dx.count());
}

Buffer gather_tokens(const BlockCall& c, const TensorParallel& tp, const float* shard, i64 n, int cols,
                     const char* who) {
  Buffer full = c.backend.alloc(Category::temp, floats(n * cols));
  tp_group(c, who).all_gather(shard, full.data(), floats(stream_tokens(tp, n) * cols));
  return full;
}

Buffer scatter_tokens(const BlockCall& c, const TensorParallel& tp, Buffer& full, i64 n, int cols, const char* who) {
  const i64 ns = stream_tokens(tp, n);
  Buffer part = c.backend.alloc(Category::temp, floats(ns * cols));
  tp_group(c, who).reduce_scatter_sum(full.data(), part.data(), floats(ns * cols));
  full.reset();
  return part;
}

void reduce_norm_grads(const BlockCall& c, Buffer& part, const std::vector<GradSlot>& grads, float beta,
                       const char* who, i64 first) {
  tp_group(c, who).all_reduce_sum(part.data(), part.count());
  const float* from = part.data() + first;
  for (const GradSlot& g : grads) {
    if (beta == 0.0f)
      c.backend.copy(g.where, from, floats(g.floats));
    else
      c.backend.add(g.where, from, floats(g.floats));
    from += g.floats;
  }
  part.reset();
}

void shard_rows(ParamSpec& spec, int r, i64 rows, i64 cols) {
  spec.full_cols = cols;
  spec.shard_first = static_cast<i64>(r) * rows * cols;
  spec.shard_cols = cols;
}

void shard_cols(ParamSpec& spec, int r, i64 cols, i64 full_cols) {
  spec.full_cols = full_cols;
  spec.shard_first = static_cast<i64>(r) * cols;
  spec.shard_cols = cols;
}

void linear_forward(Backend& be, float* y, const float* x, const float* w, const float* b, i64 n, int in, int out,
                    float beta) {
  be.gemm(Trans::no, Trans::yes, static_cast<int>(n), out, in, 1.0f, x, in, w, in, beta, y, out);
  if (b) be.bias_activation(y, b, static_cast<int>(n), out, Activation::none);
}

void linear_backward(Backend& be, float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                     i64 n, int in, int out, float beta, float dx_beta) {
  linear_weight_grad(be, dw, db, dy, x, n, in, out, beta);
  if (dx) linear_input_grad(be, dx, dy, w, n, in, out, dx_beta);
}

void linear_weight_grad(Backend& be, float* dw, float* db, const float* dy, const float* x, i64 n, int in, int out,
                        float beta) {
  be.gemm(Trans::yes, Trans::no, out, in, static_cast<int>(n), 1.0f, dy, out, x, in, beta, dw, in);
  if (db) be.bias_grad(db, dy, static_cast<int>(n), out, beta);
}

void linear_input_grad(Backend& be, float* dx, const float* dy, const float* w, i64 n, int in, int out,
                       float dx_beta) {
  be.gemm(Trans::no, Trans::no, static_cast<int>(n), in, out, 1.0f, dy, out, w, in, dx_beta, dx, in);
}

std::vector<float> token_rows(const DataSlice& at, int seq, int vocab, std::uint64_t base) {
  const i64 tokens = static_cast<i64>(at.rows) * seq;
  std::vector<float> out(floats(id_floats(tokens)));
  std::int64_t* ids = ids_of(out.data());
  const std::uint64_t stream = batch_stream(at.step, at.rank);
  for (i64 i = 0; i < tokens; ++i) {
    const std::uint64_t index = base + static_cast<std::uint64_t>(at.row_begin) * seq + static_cast<std::uint64_t>(i);
    ids[i] = static_cast<std::int64_t>(hashed_bits(at.seed, stream, index) % static_cast<std::uint64_t>(vocab));
  }
  return out;
}

namespace {

// ---- the embedding block ----
class EmbeddingBlock final : public SequenceBlock {
 public:
  EmbeddingBlock(const TransformerShape& s, const EmbeddingNames& names, const char* family, const TensorParallel& tp)
      : SequenceBlock(s, family), positions_(!names.positions.empty()), tp_(tp), vocab_(s.vocab / tp.size) {
    ParamSpec table{names.tokens, {vocab_, s.hidden}, uniform_bound(kInitStd)};
    if (tp.size > 1) shard_rows(table, tp.rank, vocab_, s.hidden);
    params_ = {table};
    if (positions_) params_.push_back({names.positions, {s.positions, s.hidden}, uniform_bound(kInitStd)});
  }
  std::string name() const override { return "embeddings"; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  std::int64_t input_elems(int rows) const override { return id_floats(tokens(rows)); }
  std::int64_t output_elems(int rows) const override { return stream_tokens(tp_, tokens(rows)) * s_.hidden; }
  bool saves_input() const override { return true; }  // the ids, as EmbeddingBackward's indices
  bool saves_output() const override { return false; }
  std::vector<float> host_input(const DataSlice& at) const override {
    return token_rows(at, s_.seq, s_.vocab, kInputBase);
  }

  Buffer forward(const BlockCall& c, const float* in, bool /*input_requires_grad*/, bool output_saved,
                 BlockTape& tape) override {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows);
    tape.held.clear();
    if (positions_) {
      // pos = arange(seq), int64, saved by the positions' EmbeddingBackward (activation).
      Buffer pos = be.alloc(Category::activation, floats(id_floats(s_.seq)));
      std::vector<float> host(floats(id_floats(s_.seq)));
      for (int i = 0; i < s_.seq; ++i) ids_of(host.data())[i] = i;
      be.upload(pos.data(), host.data(), host.size());
      tape.held.push_back(std::move(pos));
    }
    // x0 = tokens[idx] (+ positions[pos]), (N, h); under --sp the rank's (N/T, h) tokens
    // of it (the sum made in a temp (N, h)).
    const char* who = "the vocabulary-parallel embedding";
    const std::vector<TensorRef> tokens_module = module_tensors(c.index, {0});
    c.access.module_forward_begin(tokens_module);
    Buffer out = be.alloc(output_saved ? Category::activation : Category::temp,
                          floats(stream_tokens(tp_, n) * s_.hidden));
    Buffer whole = tp_.sequence ? be.alloc(Category::temp, floats(n * s_.hidden)) : Buffer{};
    float* x0 = tp_.sequence ? whole.data() : out.data();
    if (tp_.size == 1) {
      be.embedding_forward(x0, ids_of(in), c.access.param(c.index, 0), static_cast<int>(n), s_.hidden);
    } else {
      // Each rank its rows' part (zeros elsewhere), summed over the group in place.
      be.vocab_embedding_forward(x0, ids_of(in), c.access.param(c.index, 0), static_cast<int>(n), s_.hidden,
                                 first_row(), vocab_);
      // --sp without positions: the sum reduce-scattered to the rank's tokens (Megatron's
      // reduce_scatter_embeddings); with them all-reduced, the positions added, the
      // rank's tokens kept (Megatron's scatter_to_sequence_parallel_region).
      if (tp_.sequence && !positions_)
        tp_group(c, who).reduce_scatter_sum(x0, out.data(), out.count());
      else
        tp_group(c, who).all_reduce_sum(x0, floats(n * s_.hidden));
    }
    c.access.module_forward_end(tokens_module);
    if (positions_) {
      c.access.module_forward_begin(module_tensors(c.index, {1}));
      be.add_positions(x0, c.access.param(c.index, 1), c.rows, s_.seq, s_.hidden);
      c.access.module_forward_end(module_tensors(c.index, {1}));
    }
    if (tp_.sequence && positions_) be.copy(out.data(), x0 + static_cast<i64>(tp_.rank) * out.count(), out.count());
    whole.reset();
    c.saved.save(in, 8 * n);
    if (positions_) c.saved.save(tape.held[0].data(), 8 * static_cast<i64>(s_.seq));
    return out;
  }

  Buffer backward(const BlockCall& c, const float* in, Buffer& out, Buffer dy, bool /*needs_dx*/, float beta,
                  BlockTape& tape) override {
    out.reset();
    weight_grads(c, in, dy, beta, tape);
    return Buffer{};  // token ids take no gradient
  }

  // B: nothing to compute (the ids take no gradient); dy (N, h) is kept for W.
  Buffer backward_input(const BlockCall& /*c*/, const float* /*in*/, Buffer& out, Buffer dy, bool /*needs_dx*/, bool free_output,
                        BlockTape& tape) override {
    if (free_output) out.reset();
    tape.held.push_back(std::move(dy));
    return Buffer{};
  }
  void backward_weight(const BlockCall& c, const float* in, float beta, BlockTape& tape) override {
    Buffer dy = std::move(tape.held.back());
    tape.held.pop_back();
    weight_grads(c, in, dy, beta, tape);
  }

 private:
  // The tables' gradients from dy (freed), releasing the saves.
  void weight_grads(const BlockCall& c, const float* in, Buffer& dy, float beta, BlockTape& tape) {
    Backend& be = c.backend;
    const i64 n = tokens(c.rows);
    // --sp: the rank's tokens of dy gathered (the scatter's backward), dy freed.
    if (tp_.sequence) {
      Buffer whole = gather_tokens(c, tp_, dy.data(), n, s_.hidden, "the vocabulary-parallel embedding");
      dy = std::move(whole);
    }
    // The positions first, as torch's backward reaches the table that forward used last
    // first (DeepSpeed's stage 3 gathers each table in its own pre-backward hook; its
    // post-backward hook never fires, the ids taking no gradient).
    if (positions_) {
      c.access.module_backward_begin(module_tensors(c.index, {1}));
      float* dpos = c.access.grad(c.index, 1);
      be.positions_backward(dpos, dy.data(), c.rows, s_.seq, s_.hidden, beta);
      // Positions past the sequence get no gradient: zero when overwriting (an FSDP full
      // gradient starts uninitialised).
      if (beta == 0.0f && s_.positions > s_.seq)
        be.fill(dpos + static_cast<i64>(s_.seq) * s_.hidden, 0.0f,
                floats(static_cast<i64>(s_.positions - s_.seq) * s_.hidden));
      c.access.module_backward_end(module_tensors(c.index, {1}), false);
    }
    // A tied head (the model's last block) wrote the table's gradient earlier in this
    // backward, with `beta`: the embedding adds onto it.
    const float table_beta = s_.tied_embeddings ? 1.0f : beta;
    c.access.module_backward_begin(module_tensors(c.index, {0}));
    if (tp_.size == 1)
      be.embedding_backward(c.access.grad(c.index, 0), ids_of(in), dy.data(), static_cast<int>(n), s_.hidden,
                            s_.vocab, table_beta);
    else
      be.vocab_embedding_backward(c.access.grad(c.index, 0), ids_of(in), dy.data(), static_cast<int>(n), s_.hidden,
                                  first_row(), vocab_, table_beta);
    dy.reset();
    c.access.module_backward_end(module_tensors(c.index, {0}), false);
    c.saved.release(in);
    if (positions_) c.saved.release(tape.held[0].data());
    tape.held.clear();
  }

  i64 first_row() const { return static_cast<i64>(tp_.rank) * vocab_; }

  bool positions_;
  TensorParallel tp_;
  int vocab_;  // the rows this rank holds (V/T)
  std::vector<ParamSpec> params_;
};

// ---- cross-entropy, mean over tokens ----
class CrossEntropyLoss final : public ModelLoss {
 public:
  CrossEntropyLoss(const TransformerShape& s, const char* family, const TensorParallel& tp)
      : s_(s), family_(family), tp_(tp), vocab_(s.vocab / tp.size) {}
  void bind_tensor_parallel(Communicator* group) override { group_ = group; }
  bool saves_input() const override { return false; }
  bool is_mean() const override { return true; }
  std::int64_t target_elems(int rows) const override { return id_floats(tokens(rows)); }
  void fill_target(Backend& backend, float* target, const DataSlice& at) const override {
    const std::vector<float> host = token_rows(at, s_.seq, s_.vocab, kTargetBase);
    backend.upload(target, host.data(), host.size());
  }

  void forward(Backend& be, SavedTensors& saved, const float* logits, const float* target, int rows, float scale,
               float* value) override {
    const i64 n = tokens(rows);
    Held& h = held_[target];  // one per micro-batch in flight, by its target
    h.logprobs = be.alloc(Category::activation, floats(n * vocab_));
    h.total_weight = be.alloc(Category::activation, 1);
    if (tp_.size == 1) {
      be.log_softmax_forward(h.logprobs.data(), logits, n, s_.vocab);
    } else {
      // vocab_parallel_cross_entropy: the group's row maxima, then its sums of exp(x - max).
      SHARDSCOPE_REQUIRE(group_ != nullptr, std::string(family_) + ": vocabulary-parallel loss without its group");
      Buffer stats = be.alloc(Category::temp, floats(2 * n));  // max (N), sum (N)
      float* mx = stats.data();
      float* sum = stats.data() + n;
      be.row_max(mx, logits, n, vocab_);
      group_->all_reduce_max(mx, floats(n));
      be.row_sum_exp(sum, logits, mx, n, vocab_);
      group_->all_reduce_sum(sum, floats(n));
      be.log_softmax_given(h.logprobs.data(), logits, mx, sum, n, vocab_);
    }
    be.fill(h.total_weight.data(), static_cast<float>(n), 1);
    if (tp_.size == 1) {
      be.nll_loss_forward(value, h.logprobs.data(), ids_of(target), n, s_.vocab, scale);
    } else {
      be.vocab_nll_loss_forward(value, h.logprobs.data(), ids_of(target), n, vocab_, first_column(), scale);
      group_->all_reduce_sum(value, 1);
    }
    saved.save(h.logprobs.data(), 4 * n * vocab_);
    saved.save(target, 8 * n);
    saved.save(h.total_weight.data(), 4);
  }

  Buffer backward(Backend& be, SavedTensors& saved, const float* /*logits*/, const float* target, int rows,
                  float scale) override {
    const i64 n = tokens(rows);
    auto it = held_.find(target);
    SHARDSCOPE_REQUIRE(it != held_.end(), std::string(family_) + ": cross-entropy backward without its forward");
    Held& h = it->second;
    Buffer dlogits = be.alloc(Category::temp, floats(n * vocab_));  // (N, V/T)
    if (tp_.size == 1)
      be.cross_entropy_backward(dlogits.data(), h.logprobs.data(), ids_of(target), n, s_.vocab, scale);
    else
      be.vocab_cross_entropy_backward(dlogits.data(), h.logprobs.data(), ids_of(target), n, vocab_, first_column(),
                                      scale);
    saved.release(h.logprobs.data());
    saved.release(target);
    saved.release(h.total_weight.data());
    held_.erase(it);
    return dlogits;
  }

 private:
  struct Held {
    Buffer logprobs;
    Buffer total_weight;
  };
  i64 tokens(int rows) const { return static_cast<i64>(rows) * s_.seq; }
  i64 first_column() const { return static_cast<i64>(tp_.rank) * vocab_; }
  TransformerShape s_;
  const char* family_;
  TensorParallel tp_;
  int vocab_;                      // the logits' columns on this rank (V/T)
  Communicator* group_ = nullptr;  // the tensor-parallel group (tp_.size > 1)
  std::map<const float*, Held> held_;
};

}  // namespace


std::unique_ptr<Block> make_embedding_block(const TransformerShape& shape, const EmbeddingNames& names,
                                            const char* family, const TensorParallel& tp) {
  return std::make_unique<EmbeddingBlock>(shape, names, family, tp);
}

std::unique_ptr<ModelLoss> make_cross_entropy(const TransformerShape& shape, const char* family,
                                              const TensorParallel& tp) {
  return std::make_unique<CrossEntropyLoss>(shape, family, tp);
}


void head_forward(Backend& be, float* logits, const float* x, const float* w, i64 n, int hidden, int vocab) {
  be.gemm(Trans::no, Trans::yes, static_cast<int>(n), vocab, hidden, 1.0f, x, hidden, w, hidden, 0.0f, logits,
          vocab);
}

Buffer head_backward(Backend& be, Buffer& dlogits, const float* x, const float* w, float* dw, i64 n, int hidden,
                     int vocab, float beta) {
  Buffer dx = be.alloc(Category::temp, floats(n * hidden));
  head_input_grad(be, dx.data(), dlogits.data(), w, n, hidden, vocab);
  head_weight_grad(be, dw, dlogits.data(), x, n, hidden, vocab, beta);
  dlogits.reset();
  return dx;
}

void head_input_grad(Backend& be, float* dx, const float* dlogits, const float* w, i64 n, int hidden, int vocab) {
  be.gemm(Trans::no, Trans::no, static_cast<int>(n), hidden, vocab, 1.0f, dlogits, vocab, w, hidden, 0.0f, dx, hidden);
}

void head_weight_grad(Backend& be, float* dw, const float* dlogits, const float* x, i64 n, int hidden, int vocab,
                      float beta) {
  be.gemm(Trans::yes, Trans::no, vocab, hidden, static_cast<int>(n), 1.0f, dlogits, vocab, x, hidden, beta, dw, hidden);
}

void layer_norm_input_grad(Backend& be, float* dx, const float* dy, const float* x, const float* mean,
                           const float* rstd, const float* gamma, i64 n, int hidden) {
  Buffer scratch = be.alloc(Category::temp, floats(2 * static_cast<i64>(hidden)));  // dgamma, dbias: dropped
  be.layer_norm_backward(dx, scratch.data(), scratch.data() + hidden, dy, x, mean, rstd, gamma, static_cast<int>(n),
                         hidden, 0.0f);
}

void layer_norm_weight_grad(Backend& be, float* dgamma, float* dbias, const float* dy, const float* x,
                            const float* mean, const float* rstd, const float* gamma, i64 n, int hidden, float beta) {
  Buffer scratch = be.alloc(Category::temp, floats(n * hidden));  // dx: dropped
  be.layer_norm_backward(scratch.data(), dgamma, dbias, dy, x, mean, rstd, gamma, static_cast<int>(n), hidden, beta);
}

void rms_norm_input_grad(Backend& be, float* dx, const float* dy, const float* x, const float* rstd,
                         const float* gamma, i64 n, int hidden) {
  Buffer scratch = be.alloc(Category::temp, floats(hidden));  // dgamma: dropped
  be.rms_norm_backward(dx, scratch.data(), dy, x, rstd, gamma, static_cast<int>(n), hidden, 0.0f);
}

void rms_norm_weight_grad(Backend& be, float* dgamma, const float* dy, const float* x, const float* rstd,
                          const float* gamma, i64 n, int hidden, float beta) {
  Buffer scratch = be.alloc(Category::temp, floats(n * hidden));  // dx: dropped
  be.rms_norm_backward(scratch.data(), dgamma, dy, x, rstd, gamma, static_cast<int>(n), hidden, beta);
}

AttentionArgs attention_args(const TransformerShape& s, int rows, const float* q, const float* k, const float* v,
                             int ldq, int ldkv) {
  AttentionArgs a;
  a.batch = rows;
  a.seq = s.seq;
  a.heads = s.heads;
  a.kv_heads = s.kv_heads;
  a.head_dim = s.head_dim;
  a.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  a.q = q;
  a.k = k;
  a.v = v;
  a.ldq = ldq;
  a.ldk = a.ldv = ldkv;
  return a;
}

MathAttention math_attention(const TransformerShape& s, int rows) {
  MathAttention m;
  m.batch = rows;
  m.seq = s.seq;
  m.heads = s.heads;
  m.head_dim = s.head_dim;
  m.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  return m;
}

namespace {

// probs = causal softmax(scale q k^T), (B, H, T, T), activation.
Buffer attention_probs(Backend& be, const MathAttention& m, const float* qh, const float* kh) {
  const int bh = m.batch * m.heads, t = m.seq, hd = m.head_dim;
  const i64 st = static_cast<i64>(t) * hd, tt = static_cast<i64>(t) * t;
  Buffer probs = be.alloc(Category::activation, floats(m.prob_elems()));
  be.gemm_batched(Trans::no, Trans::yes, t, t, hd, 1.0f, qh, hd, st, kh, hd, st, 0.0f, probs.data(), t, tt, bh);
  be.causal_softmax_forward(probs.data(), bh, t, m.scale);
  return probs;
}

}  // namespace

std::pair<Buffer, Buffer> math_attention_forward(Backend& be, const MathAttention& m, const float* qh,
                                                 const float* kh, MathOperand v, bool keep_probs) {
  const int bh = m.batch * m.heads, t = m.seq, hd = m.head_dim;
  const i64 st = static_cast<i64>(t) * hd, tt = static_cast<i64>(t) * t;
  Buffer probs = attention_probs(be, m, qh, kh);
  Buffer heads_out = be.alloc(Category::temp, floats(m.tokens() * m.width()));  // (B, H, T, d)
  be.gemm_batched(Trans::no, Trans::no, t, hd, t, 1.0f, probs.data(), t, tt, v.data, v.ld, v.stride, 0.0f,
                  heads_out.data(), hd, st, bh);
  if (!keep_probs) probs.reset();  // nothing saves them: the core's checkpoint recomputes them
  // y = out.transpose(1, 2).contiguous(), (N, H d)
  Buffer out = be.alloc(Category::activation, floats(m.tokens() * m.width()));
  be.permute_heads(out.data(), heads_out.data(), static_cast<int>(m.width()), m.batch, t, m.heads, hd, false);
  return {std::move(probs), std::move(out)};
}

void drop_saved(SavedTensors& saved, Buffer& b) {
  saved.release(b.data());
  b.reset();
}

void add_residual(Backend& be, Buffer& dx, Buffer& dresidual, i64 count) {
  be.add(dx.data(), dresidual.data(), floats(count));
  dresidual.reset();
}

Buffer finish_backward(std::vector<Buffer>& held, Buffer dx, bool needs_dx) {
  held.clear();
  if (!needs_dx) dx.reset();
  return dx;
}

std::int64_t FinalNormHead::input_elems(int rows) const { return stream_tokens(tp_, tokens(rows)) * s_.hidden; }
std::int64_t FinalNormHead::output_elems(int rows) const { return tokens(rows) * vocab_; }

Buffer FinalNormHead::forward(const BlockCall& c, const float* x, bool /*input_requires_grad*/, bool output_saved,
                              BlockTape& tape) {
  Backend& be = c.backend;
  const i64 n = tokens(c.rows), h = s_.hidden, ns = stream_tokens(tp_, n);
  std::vector<Buffer>& held = tape.held;
  held.clear();
  c.access.module_forward_begin(norm_module(c));
  for (int j = 0; j < stats_; ++j) held.push_back(be.alloc(Category::activation, floats(ns)));
  held.push_back(be.alloc(Category::activation, floats(ns * h)));  // y
  norm_forward(c, held[stats_].data(), held, x, ns);
  c.saved.save(x, 4 * ns * h);
  for (int j = 0; j < stats_; ++j) c.saved.save(held[j].data(), 4 * ns);
  c.saved.save(norm_ref_(), 0);
  c.access.module_forward_end(norm_module(c));
  // logits (N, V) = y W^T: the head (mm) saves y and its weight.
  c.access.module_forward_begin({head_tensor(c)});
  Buffer out = be.alloc(output_saved ? Category::activation : Category::temp, floats(n * vocab_));
  Buffer whole = tp_.sequence ? gather_tokens(c, tp_, held[stats_].data(), n, s_.hidden, "the sequence-parallel head")
                              : Buffer{};
  head_forward(be, out.data(), whole ? whole.data() : held[stats_].data(), head_weight(c), n, s_.hidden, vocab_);
  whole.reset();
  c.saved.save(held[stats_].data(), 4 * ns * h);
  c.saved.save(head_key(c), 0);
  c.access.module_forward_end({head_tensor(c)});
  return out;
}

Buffer FinalNormHead::backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, float beta,
                               BlockTape& tape) {
  Backend& be = c.backend;
  const i64 n = tokens(c.rows), ns = stream_tokens(tp_, n);
  std::vector<Buffer>& held = tape.held;
  out.reset();
  // The head: dy_norm = dlogits W and dW = dlogits^T y (a tied head writes the
  // embedding's gradient first, with beta; the embedding adds its part later).
  c.access.module_backward_begin({head_tensor(c)});
  Buffer dnorm;
  if (tp_.sequence) {
    // y's tokens gathered again; the input gradient (N, h) reduce-scattered to the rank's.
    const char* who = "the sequence-parallel head";
    Buffer whole = gather_tokens(c, tp_, held[stats_].data(), n, s_.hidden, who);
    Buffer dwhole = head_backward(be, dy, whole.data(), head_weight(c), head_grad(c), n, s_.hidden, vocab_, beta);
    whole.reset();
    dnorm = scatter_tokens(c, tp_, dwhole, n, s_.hidden, who);
  } else {
    dnorm = head_backward(be, dy, held[stats_].data(), head_weight(c), head_grad(c), n, s_.hidden, vocab_, beta);
    // The head's input went to every rank: its gradient is the group's sum.
    if (tp_.size > 1) tp_group(c, "the vocabulary-parallel head").all_reduce_sum(dnorm.data(), dnorm.count());
  }
  c.saved.release(head_key(c));
  drop_saved(c.saved, held[stats_]);
  c.access.module_backward_end({head_tensor(c)}, true);
  c.access.module_backward_begin(norm_module(c));
  Buffer dx = be.alloc(Category::temp, floats(ns * s_.hidden));
  if (tp_.sequence) {
    const i64 h = s_.hidden;
    Buffer part = be.alloc(Category::temp, floats(stats_ * h));  // the norm's parameters' gradients
    norm_backward(c, dx.data(), dnorm.data(), x, held, ns, 0.0f, part.data());
    dnorm.reset();
    std::vector<GradSlot> slots;
    for (int j = 0; j < stats_; ++j) slots.push_back({c.access.grad(c.index, j), h});
    reduce_norm_grads(c, part, slots, beta, "the sequence-parallel final norm");
  } else {
    norm_backward(c, dx.data(), dnorm.data(), x, held, ns, beta);
  }
  dnorm.reset();
  c.saved.release(norm_ref_());
  c.saved.release(x);
  for (int j = 0; j < stats_; ++j) drop_saved(c.saved, held[j]);
  c.access.module_backward_end(norm_module(c), true);
  return finish_backward(held, std::move(dx), needs_dx);
}

Buffer FinalNormHead::backward_input(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx,
                                     bool free_output, BlockTape& tape) {
  SHARDSCOPE_REQUIRE(!tp_.sequence, "the zero-bubble split of a sequence-parallel head is not built");
  Backend& be = c.backend;
  const i64 n = tokens(c.rows);
  std::vector<Buffer>& held = tape.held;
  if (free_output) out.reset();
  Buffer dnorm = be.alloc(Category::temp, floats(n * s_.hidden));
  head_input_grad(be, dnorm.data(), dy.data(), head_weight(c), n, s_.hidden, vocab_);
  if (tp_.size > 1) tp_group(c, "the vocabulary-parallel head").all_reduce_sum(dnorm.data(), dnorm.count());
  c.saved.release(head_key(c));
  Buffer dx;
  if (needs_dx) {
    dx = be.alloc(Category::temp, floats(n * s_.hidden));
    norm_input_grad(c, dx.data(), dnorm.data(), x, held, n);
  }
  held.push_back(std::move(dy));     // dlogits
  held.push_back(std::move(dnorm));  // the norm's output gradient
  return dx;
}

void FinalNormHead::backward_weight(const BlockCall& c, const float* x, float beta, BlockTape& tape) {
  Backend& be = c.backend;
  const i64 n = tokens(c.rows);
  std::vector<Buffer>& held = tape.held;
  Buffer& y = held[stats_];
  Buffer& dlogits = held[stats_ + 1];
  Buffer& dnorm = held[stats_ + 2];
  head_weight_grad(be, head_grad(c), dlogits.data(), y.data(), n, s_.hidden, vocab_, beta);
  dlogits.reset();
  drop_saved(c.saved, y);
  norm_weight_grad(c, dnorm.data(), x, held, n, beta);
  dnorm.reset();
  c.saved.release(norm_ref_());
  c.saved.release(x);
  for (int j = 0; j < stats_; ++j) drop_saved(c.saved, held[j]);
  held.clear();
}

HeadGrads math_attention_backward(Backend& be, SavedTensors& saved, const MathAttention& m, Buffer& dout, Buffer& qh,
                                  Buffer& kh, Buffer& probs, MathOperand v, Buffer& v_held) {
  const int bh = m.batch * m.heads, t = m.seq, hd = m.head_dim;
  const i64 st = static_cast<i64>(t) * hd, tt = static_cast<i64>(t) * t;
  const i64 nw = m.tokens() * m.width();
  auto drop = [&](Buffer& b) { drop_saved(saved, b); };
  Buffer doh = be.alloc(Category::temp, floats(nw));  // (B, H, T, d)
  be.permute_heads(doh.data(), dout.data(), static_cast<int>(m.width()), m.batch, t, m.heads, hd, true);
  dout.reset();
  if (!probs) {
    probs = attention_probs(be, m, qh.data(), kh.data());
    saved.save(probs.data(), static_cast<i64>(probs.bytes()));
  }
  // dP = dout V^T, dV = P^T dout
  Buffer dp = be.alloc(Category::temp, floats(m.prob_elems()));
  be.gemm_batched(Trans::no, Trans::yes, t, t, hd, 1.0f, doh.data(), hd, st, v.data, v.ld, v.stride, 0.0f, dp.data(),
                  t, tt, bh);
  HeadGrads g;
  g.dv = be.alloc(Category::temp, floats(nw));
  be.gemm_batched(Trans::yes, Trans::no, t, hd, t, 1.0f, probs.data(), t, tt, doh.data(), hd, st, 0.0f, g.dv.data(),
                  hd, st, bh);
  doh.reset();
  drop(v_held);
  // dS = softmax'(dP); scores = scale q k^T: dq = scale dS k, dk = scale dS^T q
  be.softmax_backward(dp.data(), probs.data(), static_cast<i64>(bh) * t, t);
  drop(probs);
  g.dq = be.alloc(Category::temp, floats(nw));
  be.gemm_batched(Trans::no, Trans::no, t, hd, t, m.scale, dp.data(), t, tt, kh.data(), hd, st, 0.0f, g.dq.data(),
                  hd, st, bh);
  g.dk = be.alloc(Category::temp, floats(nw));
  be.gemm_batched(Trans::yes, Trans::no, t, hd, t, m.scale, dp.data(), t, tt, qh.data(), hd, st, 0.0f, g.dk.data(),
                  hd, st, bh);
  dp.reset();
  drop(qh);
  drop(kh);
  return g;
}

}  // namespace transformer
}  // namespace shardscope
