// What the transformer families share under FSDP's MixedPrecision(param_dtype=bf16,
// reduce_dtype=fp32) (ModelConfig::param_bf16; gpt2_param_bf16.cpp): the module runs in
// bf16 with no autocast region, as torch 2.15 runs a module whose parameters FSDP has
// gathered in bf16 (measured: bench/torch_saved.py --precision module). Every parameter is
// a bf16 view of the strategy's gathered unit and every gradient is written in bf16 into
// the unit's bf16 full gradient (which the strategy casts to fp32 for its reduce-scatter);
// every activation is bf16 (2 B an element): the residual stream, the norms' outputs and
// their saved mean and rstd, the Linears' outputs, GELU's; the token ids are int64 (FSDP's
// root casts floating inputs only), so the embedding's output is bf16 because its table is.
// The exceptions are torch's: flash attention keeps an fp32 log-sum-exp, math attention
// upcasts q, k, v to fp32 (saved, head-major) and keeps fp32 probabilities.
//
// The arithmetic runs in fp32 inside each op: a kernel here widens its bf16 operands into
// host scratch of its own, computes with the fp32 kernels and rounds its outputs to bf16
// once (as the CPU backend's gemm_bf16 does, and as torch's bf16 CPU kernels convert
// vector by vector). That scratch is the kernel's, not a tensor: the tracker counts the
// tensors torch would allocate, each a Buffer of DType::bf16 (or fp32 where torch's is).
// The CLI refuses --backend cuda under bf16, so the scratch is always host memory.
#pragma once

#include <vector>

#include "harness/model/transformer_parts.hpp"
#include "shardscope/dtype.hpp"

namespace shardscope {
namespace transformer {

// A bf16 tensor of `elems` elements, category c.
Buffer bf16_tensor(Backend& be, Category c, i64 elems);
// Kernel scratch: the fp32 values of x (n bf16 elements); and n fp32 values rounded into dst.
std::vector<float> widened(const Bf16* x, i64 n);
void round_into(Bf16* dst, const float* x, i64 n);
// A gradient written into a bf16 slot: dst = bf16(g) (beta 0) or bf16(dst + g) (beta 1).
void write_grad(Bf16* dst, const float* g, i64 n, float beta);

// The parameter tensor t of the call's block, bf16, and its bf16 gradient slot.
inline const Bf16* bf16_param(const BlockCall& c, int t) { return as_bf16(c.access.param(c.index, t)); }
inline Bf16* bf16_grad(const BlockCall& c, int t) { return as_bf16(c.access.grad(c.index, t)); }

// y(n, out) = bf16(x W^T + b) (b may be null), or with a residual r(n, out):
// bf16(r + x W^T + b). x, W, b, r, y bf16.
void bf16_linear(Backend& be, Bf16* y, const Bf16* x, const Bf16* w, const Bf16* b, i64 n, int in, int out,
                 const Bf16* residual = nullptr);
// Its backward from dy (n, out): dW (and db when db) written with beta, dx (n, in) when dx.
void bf16_linear_backward(Backend& be, Bf16* dx, Bf16* dw, Bf16* db, const Bf16* dy, const Bf16* x, const Bf16* w,
                          i64 n, int in, int out, float beta);

// LayerNorm over the last dim of x (n, h): y, mean and rstd bf16 (torch's CPU LayerNorm on a
// bf16 input returns and saves its statistics in bf16). Backward: dx (n, h) and the
// weight's and bias's gradients with beta.
void bf16_layer_norm(Backend& be, Bf16* y, Bf16* mean, Bf16* rstd, const Bf16* x, const Bf16* gamma,
                     const Bf16* bias, i64 n, int h, float eps);
void bf16_layer_norm_backward(Backend& be, Bf16* dx, Bf16* dgamma, Bf16* dbias, const Bf16* dy, const Bf16* x,
                              const Bf16* mean, const Bf16* rstd, const Bf16* gamma, i64 n, int h, float beta);

// The final block under FSDP's bf16: LayerNorm (mean, rstd, y bf16; saves x, mean, rstd),
// then the tied head, logits (N, V) = y W^T in bf16 (mm saves y and the weight, a view of
// the gathered unit). Backward: d y (temp, bf16) beside dlogits, dlogits freed, y
// released; dx (temp, bf16) and the norm's gradients; a tied weight's gradient written
// first with beta, the embedding adding its part later.
class Bf16FinalLayerNorm final : public SequenceBlock {
 public:
  Bf16FinalLayerNorm(const TransformerShape& s, const char* family, std::vector<ParamSpec> params, TensorRef tied);
  std::string name() const override { return "final"; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  TensorRef tied_param() const override { return tied_; }
  std::int64_t input_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  std::int64_t output_elems(int rows) const override { return tokens(rows) * s_.vocab; }
  DType output_dtype() const override { return DType::bf16; }
  bool saves_input() const override { return true; }
  bool saves_output() const override { return false; }  // log_softmax saves its own result

  Buffer forward(const BlockCall& c, const float* x, bool input_requires_grad, bool output_saved,
                 BlockTape& tape) override;
  Buffer backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override;
  Buffer backward_input(const BlockCall&, const float*, Buffer&, Buffer, bool, bool, BlockTape&) override;
  void backward_weight(const BlockCall&, const float*, float, BlockTape&) override;

 private:
  enum Held : int { kMean, kRstd, kY, kHeld };
  // The modules DeepSpeed's stage 3 gathers on their own (BlockAccess's module hooks): the
  // norm's weight and bias, and the head's weight (the embedding's table when tied).
  std::vector<TensorRef> norm_module(const BlockCall& c) const { return module_tensors(c.index, {0, 1}); }
  TensorRef head_tensor(const BlockCall& c) const;
  const Bf16* head_weight(const BlockCall& c) const;
  Bf16* head_grad(const BlockCall& c) const;
  std::vector<ParamSpec> params_;
  TensorRef tied_;
  WeightRef norm_ref_, head_ref_;
};

// The embedding block under FSDP's bf16: x0 = wte[idx] (+ wpe[arange(T)]), bf16 (the sum
// of two bf16 lookups, rounded once); saves the ids and, with positions, arange(T) (int64).
// Backward adds dy's rows into the table's bf16 gradient (onto a tied head's, which wrote
// first) and sums it over the sequences into the positions'.
std::unique_ptr<Block> make_bf16_embedding_block(const TransformerShape& shape, const EmbeddingNames& names,
                                                 const char* family);

// Cross-entropy on bf16 logits, as F.cross_entropy runs on them: log_softmax's result is bf16
// (saved, activation), nll_loss saves it with the target (int64) and a bf16 total_weight
// (2 B); the loss value is kept in fp32 (the model's scalar). Backward: dlogits bf16 (temp).
std::unique_ptr<ModelLoss> make_bf16_cross_entropy(const TransformerShape& shape, const char* family);

// The zero-bubble split is not built under FSDP's bf16 (a pipeline takes no FSDP strategy).
[[noreturn]] void throw_unbuilt_param_bf16_split(const char* family);

}  // namespace transformer
}  // namespace shardscope
