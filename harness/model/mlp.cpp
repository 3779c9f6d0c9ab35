// The MLP: L blocks of Linear(width, width) with bias, then the activation; the loss
// (sum or mse) after the last. Activations are (rows, width) fp32, row-major; a weight
// is (out, in) as torch stores it, so y = x W^T + b.
#include <cmath>
#include <cstdint>
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

class LinearBlock final : public Block {
 public:
  LinearBlock(int index, int width, Activation activation, Split split = Split::none, TensorParallel tp = {})
      : name_("layer " + std::to_string(index)),
        in_(split == Split::row ? width / tp.size : width),
        out_(split == Split::column ? width / tp.size : width),
        activation_(activation),
        split_(split) {
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

  Buffer forward(const BlockCall& c, const float* in, bool input_requires_grad, bool output_saved,
                 BlockTape& /*tape*/) override {
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
                  BlockTape& /*tape*/) override {
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

  std::string name_;
  int in_;   // input features this rank takes
  int out_;  // output features this rank makes
  Activation activation_;
  Split split_;
  std::vector<ParamSpec> params_;
  char weight_id_ = 0;
};

// sum: the sum of the output (its gradient is constant, nothing saved); mse: the mean
// of (y - 1)^2, which saves its input and its target.
class MlpLoss final : public ModelLoss {
 public:
  MlpLoss(int width, Loss kind) : width_(width), kind_(kind) {}

  bool saves_input() const override { return kind_ == Loss::mse; }
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
    if (kind_ == Loss::mse) {
      const std::int64_t bytes = static_cast<std::int64_t>(rows) * width_ * 4;
      saved.save(y, bytes);
      saved.save(target, bytes);
    }
    backend.loss(kind_, y, target, nullptr, value, rows, width_, scale);
  }

  Buffer backward(Backend& backend, SavedTensors& saved, const float* y, const float* target, int rows,
                  float scale) override {
    Buffer dy = backend.alloc(Category::temp, static_cast<std::size_t>(rows) * width_);  // (rows, width)
    backend.loss(kind_, y, target, dy.data(), nullptr, rows, width_, scale);
    if (kind_ == Loss::mse) {
      saved.release(y);
      saved.release(target);
    }
    return dy;
  }

 private:
  int width_;
  Loss kind_;
};

}  // namespace

void check_mlp_tensor_parallel(const ModelConfig& m, int tp) {
  if (tp == 1) return;
  const std::string mesh = "--mesh tp=" + std::to_string(tp);
  if (m.width % tp != 0)
    throw UsageError(mesh + " and --width " + std::to_string(m.width) + ": the width must divide by tp (each rank "
                     "holds width/tp of every parallel Linear's features)");
  if (m.layers % 2 != 0)
    throw UsageError(mesh + " and --layers " + std::to_string(m.layers) + ": the layers must be even (column- and "
                     "row-parallel Linears alternate, and the model's output is a row-parallel Linear's)");
}

std::unique_ptr<Model> make_mlp(const ModelConfig& m, const TensorParallel& tp) {
  check_mlp_tensor_parallel(m, tp.size);
  std::vector<std::unique_ptr<Block>> blocks;
  for (int i = 0; i < m.layers; ++i) {
    // Split into tp: column, row, column, row, ... (each pair one Megatron MLP).
    const Split split = tp.size == 1 ? Split::none : i % 2 == 0 ? Split::column : Split::row;
    blocks.push_back(std::make_unique<LinearBlock>(i, m.width, m.activation, split, tp));
  }
  return std::make_unique<Model>(std::move(blocks), std::make_unique<MlpLoss>(m.width, m.loss));
}

}  // namespace shardscope
