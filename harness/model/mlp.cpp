#include "harness/model/mlp.hpp"

#include <string>

#include "shardscope/check.hpp"

namespace shardscope {
namespace {

// A layer's profiler range: "forward layer 3".
std::string layer_range(const char* what, int layer) { return std::string(what) + " layer " + std::to_string(layer); }

}  // namespace

Mlp::Mlp(Backend& backend, const ModelConfig& model, SavedTensors& saved)
    : backend_(backend), model_(model), saved_(saved), weight_ids_(model.layers) {}

bool Mlp::output_saved(int layer, int last) const {
  if (model_.activation == Activation::relu) return true;  // ReLU saves its output
  if (layer + 1 < last) return true;                        // the next Linear saves its input
  return layer + 1 == model_.layers && model_.loss == Loss::mse;  // MSE saves its input
}

const float* Mlp::layer_input(const Tape& tape, int layer) const {
  return layer == tape.first ? tape.input : tape.outputs[layer - 1 - tape.first].data();
}

Tape Mlp::forward(int first, int last, const float* input, int rows, bool input_requires_grad,
                  LayerAccess& access) {
  Tape tape;
  tape.first = first;
  tape.last = last;
  tape.rows = rows;
  tape.input = input;
  tape.input_requires_grad = input_requires_grad;
  const int w = model_.width;
  const std::int64_t bytes = model_.activation_bytes(rows);
  const float* in = input;
  bool in_requires_grad = input_requires_grad;
  for (int i = first; i < last; ++i) {
    backend_.tracker().mark(Phase::forward, {PlaceKind::layer, i});
    access.before_forward(i);
    Buffer out;
    {
      // The layer's range closes before the hooks' work (a zero3 reshard), so a unit's
      // range (opened and closed by the hooks) nests around its layers'.
      ScopedRange range(backend_, layer_range("forward", i).c_str());
      // (rows, width) fp32: activation when saved for backward, temp otherwise
      out = backend_.alloc(output_saved(i, last) ? Category::activation : Category::temp,
                           static_cast<std::size_t>(rows) * w);
      backend_.gemm(Trans::no, Trans::yes, rows, w, w, 1.0f, in, w, access.weight(i), w, 0.0f,
                    out.data(), w);
      backend_.bias_activation(out.data(), access.bias(i), rows, w, model_.activation);
      // Autograd: Linear saves its input, and a reference to its weight when the input
      // requires a gradient; ReLU saves its output.
      saved_.save(in, bytes);
      if (in_requires_grad) saved_.save(weight_id(i), 0);
      if (model_.activation == Activation::relu) saved_.save(out.data(), bytes);
    }
    access.after_forward(i);
    in = out.data();
    in_requires_grad = true;
    tape.outputs.push_back(std::move(out));
  }
  return tape;
}

float Mlp::loss_forward(Tape& tape, const float* target, float scale) {
  SHARDSCOPE_REQUIRE(tape.last == model_.layers, "loss on a tape that does not end the model");
  tape.has_loss = true;
  tape.loss_scale = scale;
  tape.target = target;
  const std::int64_t bytes = model_.activation_bytes(tape.rows);
  if (model_.loss == Loss::mse) {  // MSE saves its input and its target
    saved_.save(tape.output(), bytes);
    saved_.save(target, bytes);
  }
  Buffer value = backend_.alloc(Category::temp, 1);  // the loss scalar
  backend_.loss(model_.loss, tape.output(), target, nullptr, value.data(), tape.rows,
                model_.width, scale);
  float host = 0.0f;
  backend_.download(&host, value.data(), 1);
  // An output nobody saved is not needed by backward (sum's gradient is constant).
  if (!output_saved(tape.last - 1, tape.last)) tape.outputs.back().reset();
  return host;
}

Buffer Mlp::loss_gradient(Tape& tape) {
  backend_.tracker().mark(Phase::backward, {PlaceKind::layer, tape.last - 1});
  Buffer dy = backend_.alloc(Category::temp, static_cast<std::size_t>(tape.rows) * model_.width);
  const float* y = tape.outputs.back() ? tape.output() : nullptr;
  backend_.loss(model_.loss, y, tape.target, dy.data(), nullptr, tape.rows, model_.width,
                tape.loss_scale);
  if (model_.loss == Loss::mse) {
    saved_.release(tape.output());
    saved_.release(tape.target);
  }
  return dy;
}

Buffer Mlp::backward(Tape& tape, Buffer dy, LayerAccess& access, float beta) {
  saved_.begin_backward();
  if (tape.has_loss) dy = loss_gradient(tape);
  const int w = model_.width;
  const int rows = tape.rows;
  for (int i = tape.last - 1; i >= tape.first; --i) {
    backend_.tracker().mark(Phase::backward, {PlaceKind::layer, i});
    access.before_backward(i);
    Buffer dx;
    {
      ScopedRange range(backend_, layer_range("backward", i).c_str());  // closes before the hooks' reduce-scatter
      Buffer& out = tape.outputs[i - tape.first];
      if (model_.activation == Activation::relu) {
        backend_.relu_backward(dy.data(), out.data(), dy.count());
        saved_.release(out.data());
      }
      const float* in = layer_input(tape, i);
      // dW(out, in) = dy^T x ; db = column sums of dy
      backend_.gemm(Trans::yes, Trans::no, w, w, rows, 1.0f, dy.data(), w, in, w, beta,
                    access.weight_grad(i), w);
      backend_.bias_grad(access.bias_grad(i), dy.data(), rows, w, beta);
      const bool needs_dx = i > tape.first || tape.input_requires_grad;
      if (needs_dx) {
        dx = backend_.alloc(Category::temp, static_cast<std::size_t>(rows) * w);  // (rows, width)
        backend_.gemm(Trans::no, Trans::no, rows, w, w, 1.0f, dy.data(), w, access.weight(i), w,
                      0.0f, dx.data(), w);
        saved_.release(weight_id(i));
      }
      saved_.release(in);
      dy.reset();
      out.reset();
    }
    access.after_backward(i);
    dy = std::move(dx);
  }
  return dy;
}

Buffer Mlp::backward_input(Tape& tape, Buffer dy, LayerAccess& access) {
  saved_.begin_backward();
  if (tape.has_loss) dy = loss_gradient(tape);
  const int w = model_.width;
  const int rows = tape.rows;
  tape.dz.clear();
  tape.dz.resize(tape.last - tape.first);
  for (int i = tape.last - 1; i >= tape.first; --i) {
    backend_.tracker().mark(Phase::backward, {PlaceKind::layer, i});
    access.before_backward(i);
    ScopedRange range(backend_, layer_range("backward-input", i).c_str());
    Buffer& out = tape.outputs[i - tape.first];
    if (model_.activation == Activation::relu) {
      backend_.relu_backward(dy.data(), out.data(), dy.count());
      saved_.release(out.data());
    }
    // The output itself is no longer needed once the last layer's ReLU is done: the
    // weight gradients need only each layer's input and dz.
    if (i == tape.last - 1) out.reset();
    Buffer dx;
    if (i > tape.first || tape.input_requires_grad) {
      dx = backend_.alloc(Category::temp, static_cast<std::size_t>(rows) * w);
      backend_.gemm(Trans::no, Trans::no, rows, w, w, 1.0f, dy.data(), w, access.weight(i), w,
                    0.0f, dx.data(), w);
      saved_.release(weight_id(i));
    }
    tape.dz[i - tape.first] = std::move(dy);
    dy = std::move(dx);
  }
  return dy;
}

void Mlp::backward_weight(Tape& tape, LayerAccess& access, float beta) {
  const int w = model_.width;
  const int rows = tape.rows;
  for (int i = tape.last - 1; i >= tape.first; --i) {
    backend_.tracker().mark(Phase::backward, {PlaceKind::layer, i});
    {
      ScopedRange range(backend_, layer_range("backward-weight", i).c_str());
      const float* in = layer_input(tape, i);
      Buffer& dz = tape.dz[i - tape.first];
      backend_.gemm(Trans::yes, Trans::no, w, w, rows, 1.0f, dz.data(), w, in, w, beta,
                    access.weight_grad(i), w);
      backend_.bias_grad(access.bias_grad(i), dz.data(), rows, w, beta);
      saved_.release(in);
      dz.reset();
      if (i > tape.first) tape.outputs[i - 1 - tape.first].reset();
    }
    access.after_backward(i);
  }
}

}  // namespace shardscope
