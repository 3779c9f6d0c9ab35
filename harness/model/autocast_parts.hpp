// What the transformer families share under autocast(bfloat16) (gpt2_autocast.cpp,
// llama_autocast.cpp; harness/predict/autocast_forms.hpp has the account of what each
// saves): bf16 tensors in Buffers, the Linear's bf16 GEMM forward and backward, and the
// final block (the norm in fp32, its output cast, the head's GEMM on the weight's cast).
//
// A bf16 tensor is a Buffer of DType::bf16 (2 B an element, as the tracker counts it).
// On the CPU a bf16 GEMM widens its operands into fp32 temps (exactly), runs sgemm and
// rounds its result to bf16 once (OpenBLAS 0.3.21 as Debian builds it has no sbgemm). The
// backward computes in fp32 from the saved bf16 values; a gradient at a bf16 tensor is
// rounded to bf16, as autograd's would be; the weights' gradients accumulate in fp32
// (torch rounds each to bf16 first; ours keeps those bits).
#pragma once

#include <initializer_list>
#include <vector>

#include "harness/model/transformer_parts.hpp"
#include "shardscope/dtype.hpp"

namespace shardscope {
namespace transformer {

// x[i] = the value bf16(x[i]) holds, kept in fp32.
void autocast_round(float* x, i64 n);

// Where a weight's bf16 cast is counted: param_cast, the bf16 copies of fp32 parameters.
constexpr Category kCastCategory = Category::param_cast;

// A bf16 tensor of `elems` elements, category c.
Buffer alloc_bf16(Backend& be, Category c, i64 elems);
// The bf16 copy of fp32 x (elems), a new buffer of category c.
Buffer cast_bf16(Backend& be, Category c, const float* x, i64 elems);
// A weight's bf16 cast (kCastCategory): its own, or under --autocast-region step the one
// the step's cache made for it (borrowed: freed when the step's region exits).
Buffer weight_cast_bf16(Backend& be, StepCasts* casts, const float* w, i64 elems);
// An fp32 temp of bf16 x's values.
Buffer widen(Backend& be, const Buffer& x, i64 elems);
// An fp32 temp copy of x (count) rounded to bf16 values: the gradient at a bf16 tensor.
Buffer rounded_copy(Backend& be, const float* x, i64 count);

// A Linear's GEMM under autocast: bf16(x W^T + bf16(b)) for bf16 x (n, in) and W (out,
// in) (b may be null), as an fp32 temp (n, out) of bf16 values.
Buffer autocast_linear(Backend& be, const Buffer& x, const Buffer& w, const float* b, i64 n, int in, int out);
// Its backward from dy (n, out) of bf16 values: dW and db (may be null) onto the fp32
// gradients with beta; returns dx (n, in), an fp32 temp of bf16 values.
Buffer autocast_linear_backward(Backend& be, const float* dy, const Buffer& x, const Buffer& w, float* dw, float* db,
                                i64 n, int in, int out, float beta);

// Megatron's tensor parallelism under autocast (docs/design.md, "Tensor parallelism under
// bf16"). A row-parallel Linear's GEMM gives the rank's partial product in bf16, without
// the bias (added once, after the sum); Megatron's g all-reduces that bf16 tensor. `y`
// (count, an fp32 temp of bf16 values) is cast into a bf16 temp (2 B an element), y freed,
// and the cast all-reduced over the group in bf16; returns the sum (bf16 temp).
Buffer reduce_row_parallel(const BlockCall& c, Buffer& y, i64 count, const char* who);
// out (n, hidden) = residual + sum + b: the fp32 residual, the bf16 sum and the fp32 bias
// (may be null), added in fp32 (RowParallelLinear adds its bias to the reduced output:
// bf16 + fp32 is fp32).
void add_row_parallel_output(Backend& be, float* out, const float* residual, const Buffer& sum, const float* b,
                             i64 n, int hidden);

// Frees every buffer of `held` but those at `keep` (a wrapped block's weights' casts, which
// autocast's cast cache holds past the block's forward).
void keep_only(std::vector<Buffer>& held, std::initializer_list<int> keep);

// The zero-bubble split (B and W apart) is not built under bf16; the CLI refuses a
// pipeline under it, so reaching this is a bug.
[[noreturn]] void throw_unbuilt_autocast_split(const char* family);

// The final block under autocast: the norm in fp32 (LayerNorm with bias: saves x, mean,
// rstd; RMSNorm: x, rstd), its output cast to bf16 (saved by the head), the head's weight
// cast (saved), logits bf16 handed to the loss as fp32 (the loss's cast). `head` names
// the head's weight: the tied embedding's, or the block's own tensor 1 (head.block < 0).
class AutocastFinal final : public SequenceBlock {
 public:
  enum class Norm { layer, rms };
  // Under tensor parallelism the head is vocabulary-parallel: its weight (and its cast) the
  // rank's V/T rows, its logits (N, V/T), and its input gradient (fp32, the norm's output
  // gradient) all-reduced over the group.
  AutocastFinal(const TransformerShape& s, const char* family, Norm norm, std::vector<ParamSpec> params,
                TensorRef tied, const TensorParallel& tp = {});
  std::string name() const override { return "final"; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  TensorRef tied_param() const override { return tied_; }
  std::int64_t input_elems(int rows) const override { return tokens(rows) * s_.hidden; }
  std::int64_t output_elems(int rows) const override { return tokens(rows) * vocab_; }
  bool saves_input() const override { return true; }
  bool saves_output() const override { return false; }  // log_softmax saves its own result
  void use_step_casts(std::shared_ptr<StepCasts> casts) override { step_casts_ = std::move(casts); }

  Buffer forward(const BlockCall& c, const float* x, bool input_requires_grad, bool output_saved,
                 BlockTape& tape) override;
  Buffer backward(const BlockCall& c, const float* x, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override;
  Buffer backward_input(const BlockCall&, const float*, Buffer&, Buffer, bool, bool, BlockTape&) override {
    throw_unbuilt_autocast_split(family());
  }
  void backward_weight(const BlockCall&, const float*, float, BlockTape&) override {
    throw_unbuilt_autocast_split(family());
  }

 private:
  enum Held : int { kMean, kRstd, kY, kW, kHeld };
  const float* head_weight(const BlockCall& c) const;
  float* head_grad(const BlockCall& c) const;
  Norm norm_;
  std::vector<ParamSpec> params_;
  TensorRef tied_;
  TensorParallel tp_;
  int vocab_;  // the head's rows on this rank (V/T)
  WeightRef norm_ref_;
  std::shared_ptr<StepCasts> step_casts_;  // --autocast-region step (null: per micro-batch)
};

}  // namespace transformer
}  // namespace shardscope
