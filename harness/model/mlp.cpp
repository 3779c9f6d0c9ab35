// The MLP: L blocks of Linear(width, width) with bias, then the activation; the loss
// (sum or mse) after the last. Activations are (rows, width) fp32, row-major; a weight
// is (out, in) as torch stores it, so y = x W^T + b.
//
// Under --precision bf16 (ModelConfig::autocast) each Linear runs as under
// torch.autocast("cpu"|"cuda", bfloat16) (measured with torch 2.15:
// bench/torch_autocast_mlp.py): its input, weight and bias are cast to bf16 (the fp32
// batch to a new bf16 tensor; the parameters into autocast's cast cache, category
// param_cast, held until the autocast region ends with the loss), the GEMM runs on bf16
// with fp32 sums and a bf16 output, ReLU keeps bf16. Autograd saves the bf16 input and,
// when the input requires a gradient, the weight's bf16 cast (so that cast lives until the
// Linear's backward). Backward makes the weight's and the bias's gradients in bf16 (temp),
// casts each to an fp32 temp (the cast's backward) and adds it onto the fp32 gradient
// (AccumulateGrad), and dx in bf16. A tensor-parallel split is not built under bf16.
// --checkpoint under bf16: a wrapped layer's casts stay in the cast cache until the loss
// (its saves dropped), and its re-run's own region empties the cache when it ends
// (drop_checkpointed, end_recompute).
// The cast cache is the MLP's own (CastCache): the model engine knows nothing of it.
//
// Under --precision bf16 with zero2/zero3/hsdp (ModelConfig::param_bf16) the Linears run
// as under FSDP's MixedPrecision(param_dtype=bf16, reduce_dtype=fp32) without autocast
// (measured with torch 2.15: bench/torch_fsdp_mp.py): the parameters arrive as bf16 views
// of the strategy's gathered bf16 unit (no casts of their own), FSDP's root casts the fp32
// batch to a saved bf16 tensor (here, the first Linear), each GEMM runs on bf16 with fp32
// sums and a bf16 output, ReLU keeps bf16, and backward writes the weight's and bias's
// gradients in bf16 straight into the strategy's bf16 unit gradient (which the strategy
// casts to fp32 for its reduce-scatter), dx in bf16. The loss takes the bf16 output: sum
// sums it in fp32; mse saves it (bf16) and its fp32 target and computes on an fp32 cast
// (temp) of it, as torch's mse_loss promotes the pair to fp32.
// --checkpoint under FSDP's bf16: a wrapped layer's saves are dropped but its input, which its
// checkpoint saves (the first layer's: the batch's bf16 cast, FSDP's root cast, held in
// BlockTape::saved_input for the re-run and the backward; DeepSpeed's bf16 casts inside the
// layer, dropped with its saves and made again by the re-run); the re-run reads the unit the
// strategy gathered when its backward began (no gather of its own).
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/model/model.hpp"
#include "harness/model/models.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

constexpr int kWeight = 0;  // tensor indices within the block
constexpr int kBias = 1;

// How a Linear is split across the tensor-parallel group (Megatron's ColumnParallel and
// RowParallel Linear): whole; column (each rank holds out/T rows of the weight and of the
// bias, and makes out/T output features; backward all-reduces the input gradient); row
// (each rank holds in/T columns of the weight and takes in/T input features; forward
// all-reduces the partial output, then adds the whole bias every rank holds).
enum class Split : std::uint8_t { none, column, row };

// autocast's cast cache (--precision bf16): the parameters' bf16 casts the Linears made,
// which torch keeps until the autocast region (forward and loss) exits. The Linears fill
// it, the loss clears it at the end of its forward; a cast autograd saved (a weight whose
// Linear's input needs a gradient) lives on in that Linear's tape until its backward.
struct CastCache {
  std::vector<Buffer> entries;  // bf16, category param_cast
};

class LinearBlock final : public Block {
 public:
  // `cache`: autocast's cast cache under --precision bf16 (null: fp32).
  // `param_bf16`: FSDP's MixedPrecision (bf16 parameters and gradients from the strategy).
  LinearBlock(int index, int width, Activation activation, Split split = Split::none, TensorParallel tp = {},
              std::shared_ptr<CastCache> cache = nullptr, bool param_bf16 = false)
      : name_("layer " + std::to_string(index)),
        index_(index),
        in_(split == Split::row ? width / tp.size : width),
        out_(split == Split::column ? width / tp.size : width),
        activation_(activation),
        split_(split),
        autocast_(cache != nullptr),
        param_bf16_(param_bf16),
        cache_(std::move(cache)) {
    // torch's Linear init: uniform(-1/sqrt(in), 1/sqrt(in)) for weight and bias (the whole
    // Linear's fan-in, so that a shard starts as its slice of the one-rank model's).
    const float bound = 1.0f / std::sqrt(static_cast<float>(width));
    ParamSpec weight{"weight", {out_, in_}, bound};
    ParamSpec bias{"bias", {out_}, bound};
    if (split == Split::column) {  // rows [r out, (r + 1) out) of (width, width); the bias's slice
      weight.full_cols = width, weight.shard_first = std::int64_t{tp.rank} * out_ * width, weight.shard_cols = width;
      bias.full_cols = width, bias.shard_first = std::int64_t{tp.rank} * out_, bias.shard_cols = out_;
    } else if (split == Split::row) {  // columns [r in, (r + 1) in) of every row
      weight.full_cols = width, weight.shard_first = std::int64_t{tp.rank} * in_, weight.shard_cols = in_;
    }
    params_ = {weight, bias};
  }

  std::string name() const override { return name_; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  std::int64_t input_elems(int rows) const override { return static_cast<std::int64_t>(rows) * in_; }
  std::int64_t output_elems(int rows) const override { return static_cast<std::int64_t>(rows) * out_; }
  bool saves_input() const override { return true; }  // Linear saves its input
  bool saves_output() const override { return activation_ == Activation::relu; }  // ReLU saves its output
  // Under autocast a layer past the first takes the bf16 output of the one below.
  std::int64_t input_bytes(int rows) const override { return input_elems(rows) * ((autocast_ || param_bf16_) && index_ > 0 ? 2 : 4); }

  // --checkpoint under autocast: the wrapped layer's saves are dropped, but its weight's
  // cast stays in autocast's cast cache (a cast of a leaf that requires grad is cached)
  // until the region ends with the loss (MlpLoss::forward empties it), as its bias's
  // already does; the first layer's cast of the batch is no leaf's (uncached): it goes
  // with its dropped save.
  void drop_checkpointed(BlockTape& tape) override {
    if (autocast_ && !tape.held.empty() && tape.held[kWeightCast])
      cache_->entries.push_back(std::move(tape.held[kWeightCast]));
    tape.held.clear();
  }
  // The re-run's own autocast region exits (torch's checkpoint restores autocast around
  // the recompute): the cache lets go of its bias's cast, and of its weight's unless
  // autograd saved it (layers past the first), which lives to the layer's backward.
  void end_recompute(BlockTape& /*tape*/) override {
    if (autocast_) cache_->entries.clear();
  }
  DType output_dtype() const override { return autocast_ || param_bf16_ ? DType::bf16 : DType::f32; }
  void use_step_casts(std::shared_ptr<StepCasts> casts) override {
    if (autocast_) step_casts_ = std::move(casts);
  }

  Buffer forward(const BlockCall& c, const float* in, bool input_requires_grad, bool output_saved,
                 BlockTape& tape) override {
    if (autocast_) return forward_bf16(c, in, input_requires_grad, output_saved, tape);
    if (param_bf16_) return forward_param_bf16(c, in, input_requires_grad, output_saved, tape);
    // (rows, out) fp32: activation when saved for backward, temp otherwise
    Buffer out = c.backend.alloc(output_saved ? Category::activation : Category::temp,
                                 static_cast<std::size_t>(c.rows) * out_);
    c.backend.gemm(Trans::no, Trans::yes, c.rows, out_, in_, 1.0f, in, in_, c.access.param(c.index, kWeight), in_,
                   0.0f, out.data(), out_);
    // A row-parallel Linear's output is a partial sum until the group's all-reduce.
    if (split_ == Split::row) group(c).all_reduce_sum(out.data(), out.count());
    c.backend.bias_activation(out.data(), c.access.param(c.index, kBias), c.rows, out_, activation_);
    // Autograd: Linear saves its input, and a reference to its weight when the input
    // requires a gradient; ReLU saves its output.
    c.saved.save(in, bytes(c.rows, in_));
    if (input_requires_grad) c.saved.save(weight_id(), 0);
    if (activation_ == Activation::relu) c.saved.save(out.data(), bytes(c.rows, out_));
    return out;
  }

  Buffer backward(const BlockCall& c, const float* in, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& tape) override {
    if (autocast_) return backward_bf16(c, in, out, std::move(dy), needs_dx, beta, tape);
    if (param_bf16_) return backward_param_bf16(c, in, out, std::move(dy), needs_dx, beta, tape);
    activation_backward(c, out, dy);
    weight_gradients(c, in, dy, beta);
    Buffer dx;
    if (needs_dx) dx = input_gradient(c, dy);
    c.saved.release(in);
    dy.reset();
    out.reset();
    return dx;
  }

  Buffer backward_input(const BlockCall& c, const float* /*in*/, Buffer& out, Buffer dy, bool needs_dx, bool free_output,
                        BlockTape& tape) override {
    SHARDSCOPE_REQUIRE(!autocast_ && !param_bf16_,
                       name_ + ": the zero-bubble split is not built under bf16 (the CLI refuses it)");
    activation_backward(c, out, dy);
    // The weight gradients need only the input and dz: the output can go.
    if (free_output) out.reset();
    Buffer dx;
    if (needs_dx) dx = input_gradient(c, dy);
    tape.held.clear();
    tape.held.push_back(std::move(dy));  // dz, (rows, out) temp, until W
    return dx;
  }

  void backward_weight(const BlockCall& c, const float* in, float beta, BlockTape& tape) override {
    Buffer& dz = tape.held.at(0);
    weight_gradients(c, in, dz, beta);
    c.saved.release(in);
    dz.reset();
  }

 private:
  // tape.held under bf16: the weight's cast when autograd saved it (else empty), then the
  // first layer's cast of its input.
  static constexpr std::size_t kWeightCast = 0, kInputCast = 1;

  static std::int64_t bytes(int rows, int features) { return static_cast<std::int64_t>(rows) * features * 4; }
  // A stable address that names the weight for saves (a reference holds no bytes).
  const void* weight_id() const { return &weight_id_; }
  Communicator& group(const BlockCall& c) const {
    SHARDSCOPE_REQUIRE(c.tp != nullptr, name_ + ": a parallel Linear without its tensor-parallel group");
    return *c.tp;
  }

  // dz = dy * relu'(out) in place, releasing ReLU's save of the output.
  void activation_backward(const BlockCall& c, const Buffer& out, Buffer& dy) const {
    if (activation_ != Activation::relu) return;
    c.backend.relu_backward(dy.data(), out.data(), dy.count());
    c.saved.release(out.data());
  }
  // dW(out, in) = dz^T x ; db = column sums of dz
  void weight_gradients(const BlockCall& c, const float* in, const Buffer& dz, float beta) const {
    c.backend.gemm(Trans::yes, Trans::no, out_, in_, c.rows, 1.0f, dz.data(), out_, in, in_, beta,
                   c.access.grad(c.index, kWeight), in_);
    c.backend.bias_grad(c.access.grad(c.index, kBias), dz.data(), c.rows, out_, beta);
  }
  // dx = dz W, (rows, in) temp; releases the weight reference. A column-parallel
  // Linear's is this rank's part of the sum: the group all-reduces it in place.
  Buffer input_gradient(const BlockCall& c, const Buffer& dz) const {
    Buffer dx = c.backend.alloc(Category::temp, static_cast<std::size_t>(c.rows) * in_);
    c.backend.gemm(Trans::no, Trans::no, c.rows, in_, out_, 1.0f, dz.data(), out_, c.access.param(c.index, kWeight),
                   in_, 0.0f, dx.data(), in_);
    if (split_ == Split::column) group(c).all_reduce_sum(dx.data(), dx.count());
    c.saved.release(weight_id());
    return dx;
  }

  Buffer forward_bf16(const BlockCall& c, const float* in, bool input_requires_grad, bool output_saved,
                      BlockTape& tape) {
    const std::size_t n_in = static_cast<std::size_t>(c.rows) * in_, n_out = static_cast<std::size_t>(c.rows) * out_;
    const std::size_t ww = static_cast<std::size_t>(out_) * in_;
    tape.held.clear();
    // The input: the fp32 batch is cast (a new bf16 tensor, saved); a layer's bf16 output is taken as it is.
    Buffer input_cast;
    if (!input_requires_grad) {
      input_cast = c.backend.alloc(Category::activation, n_in, DType::bf16);  // (rows, in) bf16, saved
      c.backend.cast_to_bf16(input_cast.bf16(), in, n_in);
    }
    const Bf16* x = input_cast ? input_cast.bf16() : as_bf16(in);
    // autocast's casts of the weight (out, in) and the bias (out), bf16, category param_cast
    // (--autocast-region step: the step's cache's, made by the step's first forward).
    Buffer weight, bias;
    if (step_casts_) {
      weight = step_casts_->cast(c.backend, c.access.param(c.index, kWeight), static_cast<std::int64_t>(ww));
      bias = step_casts_->cast(c.backend, c.access.param(c.index, kBias), out_);
    } else {
      weight = c.backend.alloc(Category::param_cast, ww, DType::bf16);
      c.backend.cast_to_bf16(weight.bf16(), c.access.param(c.index, kWeight), ww);
      bias = c.backend.alloc(Category::param_cast, static_cast<std::size_t>(out_), DType::bf16);
      c.backend.cast_to_bf16(bias.bf16(), c.access.param(c.index, kBias), static_cast<std::size_t>(out_));
    }
    // (rows, out) bf16: activation when saved for backward, temp otherwise
    Buffer out = c.backend.alloc(output_saved ? Category::activation : Category::temp, n_out, DType::bf16);
    c.backend.gemm_bf16(Trans::no, Trans::yes, c.rows, out_, in_, 1.0f, x, in_, weight.bf16(), in_, 0.0f, out.bf16(),
                        out_);
    c.backend.bias_activation_bf16(out.bf16(), bias.bf16(), c.rows, out_, activation_);
    // Autograd: the Linear saves its bf16 input, and its weight's bf16 cast when the input
    // requires a gradient (a tensor of its own: 2 B an element); ReLU saves its output.
    c.saved.save(x, static_cast<std::int64_t>(n_in) * 2);
    if (input_requires_grad) c.saved.save(weight.raw(), weight.bytes());
    if (activation_ == Activation::relu) c.saved.save(out.raw(), out.bytes());
    // The bias cast, and the weight cast autograd did not save, live in the cast cache
    // until the region ends with the loss (MlpLoss::forward clears it).
    if (!step_casts_) {
      cache_->entries.push_back(std::move(bias));
      if (!input_requires_grad) cache_->entries.push_back(std::move(weight));
    }
    tape.held.push_back(std::move(weight));  // empty when the cache took it (a borrowed one under step)
    if (input_cast) tape.held.push_back(std::move(input_cast));
    return out;
  }

  Buffer backward_bf16(const BlockCall& c, const float* in, Buffer& out, Buffer dy, bool needs_dx, float beta,
                       BlockTape& tape) {
    const bool first = tape.held.size() > kInputCast;
    const Bf16* x = first ? tape.held[kInputCast].bf16() : as_bf16(in);
    if (activation_ == Activation::relu) {
      c.backend.relu_backward_bf16(dy.bf16(), out.bf16(), dy.count());
      c.saved.release(out.raw());
    }
    // dW(out, in) = dy^T x in bf16, its cast to fp32, added onto the fp32 gradient.
    accumulate(c, kWeight, static_cast<std::size_t>(out_) * in_, beta, [&](Bf16* g) {
      c.backend.gemm_bf16(Trans::yes, Trans::no, out_, in_, c.rows, 1.0f, dy.bf16(), out_, x, in_, 0.0f, g, in_);
    });
    // db = column sums of dy, the same way.
    accumulate(c, kBias, static_cast<std::size_t>(out_), beta,
               [&](Bf16* g) { c.backend.bias_grad_bf16(g, dy.bf16(), c.rows, out_); });
    Buffer dx;
    if (needs_dx) {
      // dx = dz W (rows, in) bf16 temp, from the saved weight cast, which then goes.
      dx = c.backend.alloc(Category::temp, static_cast<std::size_t>(c.rows) * in_, DType::bf16);
      c.backend.gemm_bf16(Trans::no, Trans::no, c.rows, in_, out_, 1.0f, dy.bf16(), out_, tape.held[kWeightCast].bf16(),
                          in_, 0.0f, dx.bf16(), in_);
      c.saved.release(tape.held[kWeightCast].raw());
    }
    c.saved.release(x);
    tape.held.clear();  // the weight cast (when saved) and the first layer's input cast
    dy.reset();
    out.reset();
    return dx;
  }

  // FSDP's MixedPrecision: the weight (out, in) and bias (out) are bf16 views of the
  // gathered unit. The first Linear casts the fp32 batch to bf16 (FSDP's root does:
  // cast_root_forward_inputs), saved and held in its tape until its backward.
  Buffer forward_param_bf16(const BlockCall& c, const float* in, bool input_requires_grad, bool output_saved,
                            BlockTape& tape) {
    const std::size_t n_in = static_cast<std::size_t>(c.rows) * in_, n_out = static_cast<std::size_t>(c.rows) * out_;
    tape.held.clear();
    Buffer input_cast;
    if (!input_requires_grad && !tape.saved_input) {
      input_cast = c.backend.alloc(Category::activation, n_in, DType::bf16);  // (rows, in) bf16, saved
      c.backend.cast_to_bf16(input_cast.bf16(), in, n_in);
      // FSDP's root cast: outside a checkpoint around the layer (which saves it; a re-run reads it).
      if (c.access.casts_input_at_root()) tape.saved_input = std::move(input_cast);
    }
    const Bf16* x = tape.saved_input ? tape.saved_input.bf16() : input_cast ? input_cast.bf16() : as_bf16(in);
    // (rows, out) bf16: activation when saved for backward, temp otherwise
    Buffer out = c.backend.alloc(output_saved ? Category::activation : Category::temp, n_out, DType::bf16);
    c.backend.gemm_bf16(Trans::no, Trans::yes, c.rows, out_, in_, 1.0f, x, in_, as_bf16(c.access.param(c.index, kWeight)),
                        in_, 0.0f, out.bf16(), out_);
    c.backend.bias_activation_bf16(out.bf16(), as_bf16(c.access.param(c.index, kBias)), c.rows, out_, activation_);
    // Autograd: the bf16 input, a reference to the weight (a view of the gathered unit: no
    // bytes of its own) when the input requires a gradient, ReLU's output.
    c.saved.save(x, static_cast<std::int64_t>(n_in) * 2);
    if (input_requires_grad) c.saved.save(weight_id(), 0);
    if (activation_ == Activation::relu) c.saved.save(out.raw(), out.bytes());
    if (input_cast) tape.held.push_back(std::move(input_cast));
    return out;
  }

  // dW = dy^T x and db in bf16, written into the strategy's bf16 gradient (beta 0), or
  // added onto it (beta 1: DeepSpeed's stage 1 accumulating autograd's bf16 gradients
  // across micro-steps, each sum rounded to bf16): the weight's in its GEMM, the bias's
  // made in a bf16 temp (out) and added; dx = dy W in bf16 (temp).
  Buffer backward_param_bf16(const BlockCall& c, const float* in, Buffer& out, Buffer dy, bool needs_dx, float beta,
                             BlockTape& tape) {
    const Bf16* x = tape.saved_input ? tape.saved_input.bf16() : tape.held.empty() ? as_bf16(in) : tape.held.front().bf16();
    if (activation_ == Activation::relu) {
      c.backend.relu_backward_bf16(dy.bf16(), out.bf16(), dy.count());
      c.saved.release(out.raw());
    }
    c.backend.gemm_bf16(Trans::yes, Trans::no, out_, in_, c.rows, 1.0f, dy.bf16(), out_, x, in_, beta,
                        as_bf16(c.access.grad(c.index, kWeight)), in_);
    Bf16* db = as_bf16(c.access.grad(c.index, kBias));
    if (beta == 0.0f) {
      c.backend.bias_grad_bf16(db, dy.bf16(), c.rows, out_);
    } else {
      Buffer fresh = c.backend.alloc(Category::temp, static_cast<std::size_t>(out_), DType::bf16);
      c.backend.bias_grad_bf16(fresh.bf16(), dy.bf16(), c.rows, out_);
      c.backend.add_bf16(db, fresh.bf16(), static_cast<std::size_t>(out_));
    }
    Buffer dx;
    if (needs_dx) {
      dx = c.backend.alloc(Category::temp, static_cast<std::size_t>(c.rows) * in_, DType::bf16);
      c.backend.gemm_bf16(Trans::no, Trans::no, c.rows, in_, out_, 1.0f, dy.bf16(), out_,
                          as_bf16(c.access.param(c.index, kWeight)), in_, 0.0f, dx.bf16(), in_);
      c.saved.release(weight_id());
    }
    c.saved.release(x);
    tape.held.clear();  // the first layer's cast of the batch
    tape.saved_input.reset();  // or its checkpoint's save of it
    dy.reset();
    out.reset();
    return dx;
  }

  // A parameter gradient made in bf16 by `make` (count elements, temp), cast to an fp32
  // temp, then written onto grad (beta 0) or added to it (beta 1).
  template <class Make>
  void accumulate(const BlockCall& c, int tensor, std::size_t count, float beta, Make make) const {
    Buffer g16 = c.backend.alloc(Category::temp, count, DType::bf16);
    make(g16.bf16());
    Buffer g32 = c.backend.alloc(Category::temp, count);
    c.backend.cast_from_bf16(g32.data(), g16.bf16(), count, 0.0f);
    g16.reset();
    float* grad = c.access.grad(c.index, tensor);
    if (beta == 0.0f) c.backend.copy(grad, g32.data(), count);
    else c.backend.add(grad, g32.data(), count);
  }

  std::string name_;
  int index_;  // the model's layer
  int in_;     // input features this rank takes
  int out_;  // output features this rank makes
  Activation activation_;
  Split split_;
  bool autocast_;  // --precision bf16: torch.autocast(bfloat16)'s Linear
  bool param_bf16_;  // --precision bf16 under FSDP: MixedPrecision's bf16 parameters and gradients
  std::shared_ptr<CastCache> cache_;
  std::shared_ptr<StepCasts> step_casts_;  // --autocast-region step (null: per micro-batch)
  std::vector<ParamSpec> params_;
  char weight_id_ = 0;
};

// sum: the sum of the output (its gradient is constant, nothing saved); mse: the mean
// of (y - 1)^2, which saves its input and its target.
class MlpLoss final : public ModelLoss {
 public:
  // `cache`: autocast's cast cache under --precision bf16 (null: fp32).
  // `param_bf16`: FSDP's MixedPrecision (the output is bf16, no autocast region).
  MlpLoss(int width, Loss kind, std::shared_ptr<CastCache> cache, bool param_bf16)
      : width_(width), kind_(kind), bf16_(cache != nullptr), param_bf16_(param_bf16), cache_(std::move(cache)) {}

  void end_autocast_region() override {
    if (cache_) cache_->entries.clear();
  }
  // Under autocast, mse saves its fp32 cast of the output instead (autocast runs mse_loss in
  // fp32); under FSDP's bf16 it saves the bf16 output itself.
  bool saves_input() const override { return kind_ == Loss::mse && !bf16_; }
  bool is_mean() const override { return kind_ == Loss::mse; }
  // mse's target: (rows, width) of ones; sum takes none.
  std::int64_t target_elems(int rows) const override {
    return kind_ == Loss::mse ? static_cast<std::int64_t>(rows) * width_ : 0;
  }
  void fill_target(Backend& backend, float* target, const DataSlice& at) const override {
    backend.fill(target, 1.0f, static_cast<std::size_t>(target_elems(at.rows)));
  }

  void forward(Backend& backend, SavedTensors& saved, const float* y, const float* target, int rows, float scale,
               float* value) override {
    const std::size_t n = static_cast<std::size_t>(rows) * width_;
    if (param_bf16_) return forward_param_bf16(backend, saved, y, target, rows, scale, value);
    if (bf16_ && kind_ == Loss::sum) {
      backend.sum_bf16(value, as_bf16(y), n, scale);  // summed and kept in fp32
      cache_->entries.clear();                        // the autocast region exits
      return;
    }
    if (bf16_) {
      // mse under autocast: the bf16 output cast to fp32 (rows, width), saved with the target.
      Buffer& y32 = y32_[target];
      y32 = backend.alloc(Category::activation, n);
      backend.cast_from_bf16(y32.data(), as_bf16(y), n, 0.0f);
      y = y32.data();
    }
    if (kind_ == Loss::mse) {
      const std::int64_t bytes = static_cast<std::int64_t>(rows) * width_ * 4;
      saved.save(y, bytes);
      saved.save(target, bytes);
    }
    backend.loss(kind_, y, target, nullptr, value, rows, width_, scale);
    if (bf16_) cache_->entries.clear();  // the autocast region exits
  }

  Buffer backward(Backend& backend, SavedTensors& saved, const float* y, const float* target, int rows,
                  float scale) override {
    const std::size_t n = static_cast<std::size_t>(rows) * width_;
    if (param_bf16_ && kind_ == Loss::mse) return mse_backward_param_bf16(backend, saved, y, target, rows, scale);
    if ((bf16_ || param_bf16_) && kind_ == Loss::sum) {
      Buffer dy = backend.alloc(Category::temp, n, DType::bf16);  // (rows, width) bf16: the scale
      backend.fill_bf16(dy.bf16(), scale, n);
      return dy;
    }
    if (bf16_) {
      // mse's fp32 gradient at its fp32 input, which then goes; its cast's backward to bf16.
      Buffer dy32 = backend.alloc(Category::temp, n);
      auto it = y32_.find(target);
      SHARDSCOPE_REQUIRE(it != y32_.end(), "mse under bf16: a backward without its forward");
      Buffer& y32 = it->second;
      backend.loss(kind_, y32.data(), target, dy32.data(), nullptr, rows, width_, scale);
      saved.release(y32.data());
      saved.release(target);
      y32_.erase(it);
      Buffer dy = backend.alloc(Category::temp, n, DType::bf16);
      backend.cast_to_bf16(dy.bf16(), dy32.data(), n);
      return dy;
    }
    Buffer dy = backend.alloc(Category::temp, static_cast<std::size_t>(rows) * width_);  // (rows, width)
    backend.loss(kind_, y, target, dy.data(), nullptr, rows, width_, scale);
    if (kind_ == Loss::mse) {
      saved.release(y);
      saved.release(target);
    }
    return dy;
  }

 private:
  // FSDP's bf16: sum in fp32 of the bf16 output; mse saves the bf16 output and the fp32
  // target, and computes on an fp32 cast of the output (temp, freed at once).
  void forward_param_bf16(Backend& backend, SavedTensors& saved, const float* y, const float* target, int rows,
                          float scale, float* value) {
    const std::size_t n = static_cast<std::size_t>(rows) * width_;
    if (kind_ == Loss::sum) return backend.sum_bf16(value, as_bf16(y), n, scale);
    saved.save(y, static_cast<std::int64_t>(n) * 2);
    saved.save(target, static_cast<std::int64_t>(n) * 4);
    Buffer y32 = backend.alloc(Category::temp, n);  // (rows, width) fp32
    backend.cast_from_bf16(y32.data(), as_bf16(y), n, 0.0f);
    backend.loss(kind_, y32.data(), target, nullptr, value, rows, width_, scale);
  }
  // mse's fp32 gradient from an fp32 cast of the saved bf16 output (both temp), then its
  // bf16 cast (the gradient the output's dtype takes).
  Buffer mse_backward_param_bf16(Backend& backend, SavedTensors& saved, const float* y, const float* target, int rows,
                                 float scale) {
    const std::size_t n = static_cast<std::size_t>(rows) * width_;
    Buffer y32 = backend.alloc(Category::temp, n);
    backend.cast_from_bf16(y32.data(), as_bf16(y), n, 0.0f);
    Buffer dy32 = backend.alloc(Category::temp, n);
    backend.loss(kind_, y32.data(), target, dy32.data(), nullptr, rows, width_, scale);
    y32.reset();
    saved.release(y);
    saved.release(target);
    Buffer dy = backend.alloc(Category::temp, n, DType::bf16);
    backend.cast_to_bf16(dy.bf16(), dy32.data(), n);
    return dy;
  }

  int width_;
  Loss kind_;
  bool bf16_;   // --precision bf16: the last block's output is bf16
  bool param_bf16_;  // --precision bf16 under FSDP: the last block's output is bf16, no autocast
  std::shared_ptr<CastCache> cache_;
  // Under bf16 mse: the output's fp32 cast, saved until backward, of each forward in flight
  // (a pipeline's last stage holds several micro-batches'), by its target's rows.
  std::map<const float*, Buffer> y32_;
};

}  // namespace

void check_mlp_tensor_parallel(const ModelConfig& m, int tp) {
  if (tp == 1) return;
  const std::string mesh = "--mesh tp=" + std::to_string(tp);
  if (m.autocast)
    throw UsageError(mesh + " and --precision bf16: a tensor-parallel MLP under autocast is not built yet; give "
                     "--precision fp32");
  if (m.width % tp != 0)
    throw UsageError(mesh + " and --width " + std::to_string(m.width) + ": the width must divide by tp (each rank "
                     "holds width/tp of every parallel Linear's features)");
  if (m.layers % 2 != 0)
    throw UsageError(mesh + " and --layers " + std::to_string(m.layers) + ": the layers must be even (column- and "
                     "row-parallel Linears alternate, and the model's output is a row-parallel Linear's)");
}

std::unique_ptr<Model> make_mlp(const ModelConfig& m, const TensorParallel& tp) {
  check_mlp_tensor_parallel(m, tp.size);
  std::shared_ptr<CastCache> cache = m.autocast ? std::make_shared<CastCache>() : nullptr;
  std::vector<std::unique_ptr<Block>> blocks;
  for (int i = 0; i < m.layers; ++i) {
    // Split into tp: column, row, column, row, ... (each pair one Megatron MLP).
    const Split split = tp.size == 1 ? Split::none : i % 2 == 0 ? Split::column : Split::row;
    blocks.push_back(std::make_unique<LinearBlock>(i, m.width, m.activation, split, tp, cache, m.param_bf16));
  }
  return std::make_unique<Model>(std::move(blocks), std::make_unique<MlpLoss>(m.width, m.loss, cache, m.param_bf16));
}

}  // namespace shardscope
