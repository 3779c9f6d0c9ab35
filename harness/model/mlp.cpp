// The MLP: L blocks of Linear(width, width) with bias, then the activation; the loss
// (sum or mse) after the last. Activations are (rows, width) fp32, row-major; a weight
// is (out, in) as torch stores it, so y = x W^T + b.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "harness/model/model.hpp"
#include "harness/model/models.hpp"

namespace shardscope {
namespace {

constexpr int kWeight = 0;  // tensor indices within the block
constexpr int kBias = 1;

class LinearBlock final : public Block {
 public:
  LinearBlock(int index, int width, Activation activation)
      : name_("layer " + std::to_string(index)), width_(width), activation_(activation) {
    // torch's Linear init: uniform(-1/sqrt(in), 1/sqrt(in)) for weight and bias.
    const float bound = 1.0f / std::sqrt(static_cast<float>(width));
    params_ = {{"weight", {width, width}, bound}, {"bias", {width}, bound}};
  }

  std::string name() const override { return name_; }
  const std::vector<ParamSpec>& params() const override { return params_; }
  std::int64_t input_elems(int rows) const override { return static_cast<std::int64_t>(rows) * width_; }
  std::int64_t output_elems(int rows) const override { return static_cast<std::int64_t>(rows) * width_; }
  bool saves_input() const override { return true; }  // Linear saves its input
  bool saves_output() const override { return activation_ == Activation::relu; }  // ReLU saves its output

  Buffer forward(const BlockCall& c, const float* in, bool input_requires_grad, bool output_saved,
                 BlockTape& /*tape*/) override {
    const int w = width_;
    // (rows, width) fp32: activation when saved for backward, temp otherwise
    Buffer out = c.backend.alloc(output_saved ? Category::activation : Category::temp,
                                 static_cast<std::size_t>(c.rows) * w);
    c.backend.gemm(Trans::no, Trans::yes, c.rows, w, w, 1.0f, in, w, c.access.param(c.index, kWeight), w, 0.0f,
                   out.data(), w);
    c.backend.bias_activation(out.data(), c.access.param(c.index, kBias), c.rows, w, activation_);
    // Autograd: Linear saves its input, and a reference to its weight when the input
    // requires a gradient; ReLU saves its output.
    const std::int64_t bytes = activation_bytes(c.rows);
    c.saved.save(in, bytes);
    if (input_requires_grad) c.saved.save(weight_id(), 0);
    if (activation_ == Activation::relu) c.saved.save(out.data(), bytes);
    return out;
  }

  Buffer backward(const BlockCall& c, const float* in, Buffer& out, Buffer dy, bool needs_dx, float beta,
                  BlockTape& /*tape*/) override {
    const int w = width_;
    activation_backward(c, out, dy);
    // dW(out, in) = dy^T x ; db = column sums of dy
    c.backend.gemm(Trans::yes, Trans::no, w, w, c.rows, 1.0f, dy.data(), w, in, w, beta,
                   c.access.grad(c.index, kWeight), w);
    c.backend.bias_grad(c.access.grad(c.index, kBias), dy.data(), c.rows, w, beta);
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
    tape.held.push_back(std::move(dy));  // dz, (rows, width) temp, until W
    return dx;
  }

  void backward_weight(const BlockCall& c, const float* in, float beta, BlockTape& tape) override {
    const int w = width_;
    Buffer& dz = tape.held.at(0);
    c.backend.gemm(Trans::yes, Trans::no, w, w, c.rows, 1.0f, dz.data(), w, in, w, beta,
                   c.access.grad(c.index, kWeight), w);
    c.backend.bias_grad(c.access.grad(c.index, kBias), dz.data(), c.rows, w, beta);
    c.saved.release(in);
    dz.reset();
  }

 private:
  std::int64_t activation_bytes(int rows) const { return static_cast<std::int64_t>(rows) * width_ * 4; }
  // A stable address that names the weight for saves (a reference holds no bytes).
  const void* weight_id() const { return &weight_id_; }

  // dz = dy * relu'(out) in place, releasing ReLU's save of the output.
  void activation_backward(const BlockCall& c, const Buffer& out, Buffer& dy) const {
    if (activation_ != Activation::relu) return;
    c.backend.relu_backward(dy.data(), out.data(), dy.count());
    c.saved.release(out.data());
  }
  // dx = dz W, (rows, width) temp; releases the weight reference.
  Buffer input_gradient(const BlockCall& c, const Buffer& dz) const {
    const int w = width_;
    Buffer dx = c.backend.alloc(Category::temp, static_cast<std::size_t>(c.rows) * w);
    c.backend.gemm(Trans::no, Trans::no, c.rows, w, w, 1.0f, dz.data(), w, c.access.param(c.index, kWeight), w,
                   0.0f, dx.data(), w);
    c.saved.release(weight_id());
    return dx;
  }

  std::string name_;
  int width_;
  Activation activation_;
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

std::unique_ptr<Model> make_mlp(const ModelConfig& m) {
  std::vector<std::unique_ptr<Block>> blocks;
  for (int i = 0; i < m.layers; ++i) blocks.push_back(std::make_unique<LinearBlock>(i, m.width, m.activation));
  return std::make_unique<Model>(std::move(blocks), std::make_unique<MlpLoss>(m.width, m.loss));
}

}  // namespace shardscope
