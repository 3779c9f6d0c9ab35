// What the transformer families (gpt2.cpp, llama.cpp) share: their Linear, their data
// (token ids and targets), the embedding block, the head and the final block around it,
// the backward's bookkeeping, the causal attention's math path, and cross-entropy over
// the vocabulary. Each part allocates, saves and frees in the same order whichever
// family calls it, so the families' closed forms
// (harness/predict/transformer_step_forms) walk one order.
//
// Layouts as everywhere in the model: (N, features) fp32 row-major, N = rows * seq
// tokens; head-major tensors are (B, heads, T, head_dim) contiguous.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/model/model.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace transformer {

using i64 = std::int64_t;

inline std::size_t floats(i64 n) { return static_cast<std::size_t>(n); }

// Both reference modules draw Linear weights and embeddings from normal(0, 0.02); ours
// are uniform with the same standard deviation.
constexpr float kInitStd = 0.02f;
float uniform_bound(float std);

// A stable address that names a parameter in saves (a reference holds no bytes).
struct WeightRef {
  char id = 0;
  const void* operator()() const { return &id; }
};

// y(N, out) = x(N, in) W^T + b (b may be null), onto y with `beta` (1: a residual
// already in y).
void linear_forward(Backend& be, float* y, const float* x, const float* w, const float* b, i64 n, int in, int out,
                    float beta);
// dW(out, in) = dy^T x and db = column sums of dy (when db), with beta; dx(N, in) =
// dy W + dx_beta * dx when dx.
void linear_backward(Backend& be, float* dx, float* dw, float* db, const float* dy, const float* x, const float* w,
                     i64 n, int in, int out, float beta, float dx_beta = 0.0f);
// Its two halves, as the zero-bubble split runs them: the weight's (and bias's) gradient
// in W, the input's in B; linear_backward is the one, then the other.
void linear_weight_grad(Backend& be, float* dw, float* db, const float* dy, const float* x, i64 n, int in, int out,
                        float beta);
void linear_input_grad(Backend& be, float* dx, const float* dy, const float* w, i64 n, int in, int out,
                       float dx_beta = 0.0f);

// A backward's bookkeeping, the same in every block of both families. drop_saved: a
// tensor's last use (its save released from `saved`, its buffer freed). add_residual:
// the residual's gradient (count floats, then freed) added onto dx. finish_backward: the
// tape's buffers freed (held cleared), then dx returned when the block before needs it,
// freed otherwise.
void drop_saved(SavedTensors& saved, Buffer& b);
void add_residual(Backend& be, Buffer& dx, Buffer& dresidual, i64 count);
Buffer finish_backward(std::vector<Buffer>& held, Buffer dx, bool needs_dx);

// The token ids of the slice's rows (seq tokens each) in [0, vocab), as a Buffer's floats
// (id_floats): the model's input (kInputBase) or its target (kTargetBase, past the
// input's ids in the same stream).
constexpr std::uint64_t kInputBase = 0;
constexpr std::uint64_t kTargetBase = std::uint64_t{1} << 62;
std::vector<float> token_rows(const DataSlice& at, int seq, int vocab, std::uint64_t base);

// Megatron's tensor parallelism (docs/design.md, "Tensor parallelism of the
// transformers"): the group of the call (c.tp), which a split block or loss needs.
Communicator& tp_group(const BlockCall& c, const char* who);
// A shard of rows [r·rows, (r + 1)·rows) of a (·, cols) tensor: rank r's vocabulary rows
// of a table, a column-parallel Linear's output rows. And a row-parallel Linear's
// columns [r·cols, (r + 1)·cols) of every row of a (·, full_cols) weight.
void shard_rows(ParamSpec& spec, int r, i64 rows, i64 cols);
void shard_cols(ParamSpec& spec, int r, i64 cols, i64 full_cols);

// out (N, hidden) = residual + x W^T + b (b may be null) for a Linear taking `in`
// features: the whole Linear on one rank (tp.size 1: residual copied, then the product
// added onto it); a row-parallel one's partial product made in out, all-reduced over
// the group in place (Megatron's g), then the residual and the bias added. Under --sp
// out and residual are the rank's (N/T, hidden) tokens: the partial product is made in
// a temp (N, hidden), reduce-scattered into out and freed, then the residual and the bias
// added.
void residual_linear_forward(const BlockCall& c, const TensorParallel& tp, float* out, const float* residual,
                             const float* x, const float* w, const float* b, i64 n, int in, int hidden,
                             const char* who);
// A column-parallel Linear's input gradient is this rank's part of the sum: all-reduced
// over the group in place (Megatron's f in backward); nothing with one rank.
void column_parallel_input_grad(const BlockCall& c, const TensorParallel& tp, Buffer& dx, const char* who);

// Megatron's sequence parallelism (--sp, tp.sequence; docs/design.md, "Sequence
// parallelism"). Outside the parallel Linears (the norms, the residual adds, the blocks'
// inputs and outputs) a rank holds n/T of a block's n tokens: rows [r n/T, (r + 1) n/T)
// of the (n, ·) tensor in memory order, which with one sequence is the sequence's r-th
// T-th. (Megatron's layout is (s, b, h), ours (b, s, h): every op of that region works
// token by token, so which tokens a rank holds changes no value.) Where the
// tensor-parallel model all-reduces a row-parallel output, the group reduce-scatters it
// to the rank's tokens (residual_linear_forward); before a column-parallel region the
// rank's tokens are all-gathered, and its input gradient is reduce-scattered.
inline i64 stream_tokens(const TensorParallel& tp, i64 n) { return tp.sequence ? n / tp.size : n; }
// The whole (n, cols) tensor (temp) gathered from every rank's (n/T, cols) `shard`.
Buffer gather_tokens(const BlockCall& c, const TensorParallel& tp, const float* shard, i64 n, int cols,
                     const char* who);
// The rank's (n/T, cols) part (temp) of the group's sum of `full` (n, cols), which is freed.
Buffer scatter_tokens(const BlockCall& c, const TensorParallel& tp, Buffer& full, i64 n, int cols, const char* who);
// A norm over the rank's tokens makes its part of its parameters' gradients: `part`
// (temp, the gradients' floats end to end from its float `first`) is all-reduced over
// the group, written onto each gradient {where, floats} with beta (0 overwrite, 1 add)
// and freed. (Replicated kv heads use it too: their part holds every kv head's slot and
// the rank's begins at `first`.) (Megatron
// all-reduces these sequence-parallel gradients once a step, coalesced; here each norm's
// once its backward has made them: the same bytes a step.)
struct GradSlot {
  float* where = nullptr;
  i64 floats = 0;
};
void reduce_norm_grads(const BlockCall& c, Buffer& part, const std::vector<GradSlot>& grads, float beta,
                       const char* who, i64 first = 0);

// A block of a transformer family: its rows are sequences of shape.seq tokens (N = rows
// * seq). Each family's blocks run the zero-bubble split (zb-h1's B and W halves): B
// keeps each Linear's and each norm's output gradient (temp) for W, and W writes the
// parameter gradients in the whole backward's order (docs/design.md, "Transformers").
class SequenceBlock : public Block {
 public:
  SequenceBlock(const TransformerShape& shape, const char* family) : s_(shape), family_(family) {}
  // The embedding and final blocks are not wrapped by --checkpoint; the layers say so.
  bool checkpointable() const override { return false; }

 protected:
  i64 tokens(int rows) const { return static_cast<i64>(rows) * s_.seq; }
  const char* family() const { return family_; }
  const TransformerShape s_;

 private:
  const char* family_;
};

// The final block: a norm (its statistics, then its output y, activation), then the
// head, logits (N, V) = y W^T. Forward saves x, the statistics and the norm's weight
// reference, then y and the head's weight (by head_key); backward and the split's B and W
// free and release in one order for both families. held: the norm's statistics (mean
// and rstd for LayerNorm, rstd for RMSNorm, (N) each), y (N, h), and B's kept dlogits
// (N, V) and the norm's output gradient (N, h), temp. The families say the norm and
// where the head's weight lies.
class FinalNormHead : public SequenceBlock {
 public:
  // Under tensor parallelism the head is vocabulary-parallel (Megatron's
  // parallel_lm_logits): its weight is rank tp.rank's V/T rows, its logits (N, V/T), and
  // the norm's output gradient is all-reduced over the group (the head's input is
  // copied to every rank in forward: its backward sums). Under --sp the norm runs on the
  // rank's N/T tokens: its output is all-gathered for the head (a temp (N, h) freed
  // after the logits; the head saves the rank's tokens and gathers them again for its
  // weight's gradient), the head's input gradient reduce-scattered, and the norm's
  // parameter gradients all-reduced.
  FinalNormHead(const TransformerShape& shape, const char* family, int norm_stats, const TensorParallel& tp = {})
      : SequenceBlock(shape, family), stats_(norm_stats), tp_(tp), vocab_(shape.vocab / tp.size) {}
  std::string name() const override { return "final"; }
  std::int64_t input_elems(int rows) const override;
  std::int64_t output_elems(int rows) const override;
  bool saves_input() const override { return true; }    // the norm's input
  bool saves_output() const override { return false; }  // the logits: log_softmax saves its result

  Buffer forward(const BlockCall& c, const float* x, bool input_requires_grad, bool output_saved,
                 BlockTape& tape) override;
  Buffer backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override;
  Buffer backward_input(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, bool free_output,
                        BlockTape& tape) override;
  void backward_weight(const BlockCall& c, const float* x, float beta, BlockTape& tape) override;

 protected:
  // The modules DeepSpeed's stage 3 gathers on their own (BlockAccess's module hooks): the
  // norm's tensors (the block's first norm_stats, as norm_backward says), and the head's
  // weight (the embedding's table when tied).
  std::vector<TensorRef> norm_module(const BlockCall& c) const {
    std::vector<TensorRef> out;
    for (int j = 0; j < stats_; ++j) out.push_back({c.index, j});
    return out;
  }
  virtual TensorRef head_tensor(const BlockCall& c) const = 0;

  // The norm over x (N, h) with its statistics in stats (held's first norm_stats).
  virtual void norm_forward(const BlockCall& c, float* y, const std::vector<Buffer>& stats, const float* x,
                            i64 n) const = 0;
  // The norm's parameters are the block's first norm_stats tensors, h floats each
  // (LayerNorm's weight and bias, RMSNorm's weight): their gradients go there with beta,
  // or with `into` (--sp: the rank's part) end to end into it, overwritten.
  virtual void norm_backward(const BlockCall& c, float* dx, const float* dy, const float* x,
                             const std::vector<Buffer>& stats, i64 n, float beta, float* into = nullptr) const = 0;
  virtual void norm_input_grad(const BlockCall& c, float* dx, const float* dy, const float* x,
                               const std::vector<Buffer>& stats, i64 n) const = 0;
  virtual void norm_weight_grad(const BlockCall& c, const float* dy, const float* x, const std::vector<Buffer>& stats,
                                i64 n, float beta) const = 0;
  virtual const float* head_weight(const BlockCall& c) const = 0;
  virtual float* head_grad(const BlockCall& c) const = 0;
  virtual const void* head_key(const BlockCall& c) const = 0;  // what the head's save of its weight names
  WeightRef norm_ref_;

  // The vocabulary rows this rank's head holds (V/T).
  int vocab() const { return vocab_; }

 private:
  const int stats_;
  const TensorParallel tp_;
  const int vocab_;
};

// The embedding block: the token embedding (vocab, h) and, for gpt2, learned positions
// (positions, h). Saves the ids (EmbeddingBackward's indices, 8 B a token) and, with
// positions, arange(seq) (int64). When the head is tied to the token embedding, the
// head wrote its gradient earlier in the same backward (with beta) and the embedding
// adds onto it.
struct EmbeddingNames {
  std::string tokens;     // "transformer.wte.weight", "model.embed_tokens.weight"
  std::string positions;  // "transformer.wpe.weight"; empty: no learned positions
};
// Under tensor parallelism (tp.size > 1) the token embedding is vocabulary-parallel
// (Megatron's VocabParallelEmbedding): rank r holds rows [r V/T, (r + 1) V/T); the lookup
// writes zeros for ids outside them and the group all-reduces the (N, h) output in
// place; its backward adds only the rows it holds. Learned positions are whole on every
// rank (their gradient the same on each: dy is).
std::unique_ptr<Block> make_embedding_block(const TransformerShape& shape, const EmbeddingNames& names,
                                            const char* family, const TensorParallel& tp = {});

// The head: logits (N, V) = x W^T, W (V, h); its backward writes dW with beta and
// returns dx (temp, (N, h)), freeing dlogits first.
void head_forward(Backend& be, float* logits, const float* x, const float* w, i64 n, int hidden, int vocab);
Buffer head_backward(Backend& be, Buffer& dlogits, const float* x, const float* w, float* dw, i64 n, int hidden,
                     int vocab, float beta);
// Its halves: dx (N, h) = dlogits W (overwritten) in B, dW = dlogits^T x with beta in W.
void head_input_grad(Backend& be, float* dx, const float* dlogits, const float* w, i64 n, int hidden, int vocab);
void head_weight_grad(Backend& be, float* dw, const float* dlogits, const float* x, i64 n, int hidden, int vocab,
                      float beta);

// The norms' halves. A norm's backward kernel writes dx and its parameters' gradients
// in one call; each half runs it whole and drops what the other half owns into a
// scratch temp freed before it returns: B's the parameter gradients (2h floats for
// LayerNorm's gamma and bias, h for RMSNorm's gamma, written with beta 0), W's dx (N·h
// floats). Both calls read the same saved x, mean, rstd, gamma and dy: W's parameter
// gradients are the whole backward's to the bit.
void layer_norm_input_grad(Backend& be, float* dx, const float* dy, const float* x, const float* mean,
                           const float* rstd, const float* gamma, i64 n, int hidden);
void layer_norm_weight_grad(Backend& be, float* dgamma, float* dbias, const float* dy, const float* x,
                            const float* mean, const float* rstd, const float* gamma, i64 n, int hidden, float beta);
void rms_norm_input_grad(Backend& be, float* dx, const float* dy, const float* x, const float* rstd,
                         const float* gamma, i64 n, int hidden);
void rms_norm_weight_grad(Backend& be, float* dgamma, const float* dy, const float* x, const float* rstd,
                          const float* gamma, i64 n, int hidden, float beta);

// Causal attention's math path, as torch's math SDPA runs it on head-major q and k
// (B, H, T, d), each its own storage, and v: the probabilities (B, H, T, T) = causal
// softmax(scale q k^T) (activation, saved) and the output, token-major (N, H d)
// (activation: the output projection saves it), through a head-major temp.
struct MathOperand {  // B·H matrices (T, d): matrix i at data + i·stride, rows ld apart
  const float* data = nullptr;
  int ld = 0;
  i64 stride = 0;
};
struct MathAttention {
  int batch = 0, seq = 0, heads = 0, head_dim = 0;
  float scale = 0.0f;
  i64 tokens() const { return static_cast<i64>(batch) * seq; }
  i64 width() const { return static_cast<i64>(heads) * head_dim; }
  i64 prob_elems() const { return static_cast<i64>(batch) * heads * seq * seq; }
  MathOperand head_major(const float* x) const { return {x, head_dim, static_cast<i64>(seq) * head_dim}; }
};
// Causal attention over `rows` sequences of the shape, scale 1 / sqrt(head_dim): q with
// row stride ldq, k and v with ldkv (transformer_args.hpp); and its math path's shape.
AttentionArgs attention_args(const TransformerShape& s, int rows, const float* q, const float* k, const float* v,
                             int ldq, int ldkv);
MathAttention math_attention(const TransformerShape& s, int rows);
// Returns {probs, out}. With keep_probs false (--checkpoint attention) the probabilities
// are freed once they have been multiplied by v, before the output is copied
// token-major, and the returned probs is empty.
std::pair<Buffer, Buffer> math_attention_forward(Backend& be, const MathAttention& m, const float* qh,
                                                 const float* kh, MathOperand v, bool keep_probs = true);
// The gradients at q, k, v, head-major (temp each), from dout (token-major (N, H d),
// freed) through the saved q, k, probabilities and v (v_held: the storage v lies in),
// each released from `saved` and freed as soon as it is used. Empty probs (--checkpoint
// attention) are recomputed first, as torch's non-reentrant checkpoint does when the
// backward first unpacks a save of the core: once dout is head-major (dout freed),
// q k^T and the softmax into a new probabilities buffer (activation, saved again); the
// recompute stops there (torch's early stop: the product with v saves its inputs before
// it runs, so it is never re-run).
struct HeadGrads {
  Buffer dq, dk, dv;
};
HeadGrads math_attention_backward(Backend& be, SavedTensors& saved, const MathAttention& m, Buffer& dout, Buffer& qh,
                                  Buffer& kh, Buffer& probs, MathOperand v, Buffer& v_held);

// Cross-entropy over the vocabulary, mean over tokens, as F.cross_entropy: log_softmax
// saves its result (the log-probabilities, (N, V), activation), nll_loss saves them with
// the target (int64, 8 B a token) and a 4-byte total_weight it makes. The logits are
// saved by nobody.
// Under tensor parallelism the logits are (N, V/T) on each rank and the loss is
// Megatron's vocab_parallel_cross_entropy: the row maxima all-reduced (max), the sums of
// exp(x - max) all-reduced (sum), the log-probabilities of the rank's columns
// (activation, saved) from them; each rank's part of the mean over the targets it holds,
// all-reduced (a 4-byte sum; Megatron all-reduces the (N) target logits instead). The
// statistics, max and sum (N each), are one temp of 2N floats, freed before the loss is
// made. Backward: softmax - onehot on the rank's columns, no communication.
std::unique_ptr<ModelLoss> make_cross_entropy(const TransformerShape& shape, const char* family,
                                              const TensorParallel& tp = {});

}  // namespace transformer
}  // namespace shardscope
