// The MLP's forward and backward over a contiguous range of layers, on any Backend.
//
// Each layer is Linear(width, width) with bias, then the activation. Activations are
// (rows, width) fp32, row-major; a weight is (out, in) as torch stores it, so
// y = x W^T + b. What autograd would save is recorded in a SavedTensors instrument,
// and every buffer is allocated with the category docs/design.md §1 gives it.
#pragma once

#include <vector>

#include "harness/model/saved_tensors.hpp"
#include "shardscope/backend.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// How the engine reaches a layer's parameters and gradient slots. Strategies that
// gather parameters (ZeRO-2/3) do it in the hooks, before the pointers are asked for.
class LayerAccess {
 public:
  virtual ~LayerAccess() = default;
  virtual const float* weight(int layer) = 0;  // (width, width)
  virtual const float* bias(int layer) = 0;    // (width)
  virtual float* weight_grad(int layer) = 0;
  virtual float* bias_grad(int layer) = 0;
  virtual void before_forward(int /*layer*/) {}
  virtual void after_forward(int /*layer*/) {}
  virtual void before_backward(int /*layer*/) {}
  virtual void after_backward(int /*layer*/) {}
};

// What one forward over layers [first, last) keeps for its backward.
struct Tape {
  int first = 0;
  int last = 0;
  int rows = 0;
  bool input_requires_grad = false;
  const float* input = nullptr;  // (rows, width), owned by the caller, kept alive by it
  std::vector<Buffer> outputs;   // outputs[j]: output of layer first + j
  bool has_loss = false;
  float loss_scale = 1.0f;
  const float* target = nullptr;  // mse target, owned by the caller
  std::vector<Buffer> dz;         // zero-bubble: gradients kept from B to W, per layer

  const float* output() const { return outputs.back().data(); }
};

class Mlp {
 public:
  Mlp(Backend& backend, const ModelConfig& model, SavedTensors& saved);

  // Forward through layers [first, last) of `rows` rows.
  Tape forward(int first, int last, const float* input, int rows, bool input_requires_grad,
               LayerAccess& access);
  // The loss of the model's output (the tape must end at the last layer); returns its
  // value scaled by `scale`. The loss saves its input and target (mse) until backward.
  float loss_forward(Tape& tape, const float* target, float scale);

  // Whole backward of the tape. `dy` is the gradient of the segment's output (empty
  // when the tape ends with the loss). Gradients are written with `beta` (0 overwrite,
  // 1 accumulate). Returns dx (rows, width, temp) when the input requires grad.
  Buffer backward(Tape& tape, Buffer dy, LayerAccess& access, float beta);

  // Zero-bubble halves: B computes the input gradient and keeps each layer's dz;
  // W computes the weight and bias gradients from them and frees what is left.
  Buffer backward_input(Tape& tape, Buffer dy, LayerAccess& access);
  void backward_weight(Tape& tape, LayerAccess& access, float beta);

  // Whether layer `layer`'s output is saved for backward when the segment ends at `last`.
  bool output_saved(int layer, int last) const;

 private:
  Buffer loss_gradient(Tape& tape);
  const float* layer_input(const Tape& tape, int layer) const;
  const void* weight_id(int layer) const { return &weight_ids_[layer]; }

  Backend& backend_;
  ModelConfig model_;
  SavedTensors& saved_;
  std::vector<char> weight_ids_;  // stable addresses that name each weight for saves
};

}  // namespace shardscope
