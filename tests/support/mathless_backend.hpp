// A Backend for communicator tests: host memory, every math kernel refused (the
// communicators never compute). Subclasses say how data moves.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "shardscope/backend.hpp"

namespace shardscope::testing {

class MathlessBackend : public Backend {
 public:
  void gemm(Trans, Trans, int, int, int, float, const float*, int, const float*, int, float,
            float*, int) override {
    unused();
  }
  void bias_activation(float*, const float*, int, int, Activation) override { unused(); }
  void relu_backward(float*, const float*, std::size_t) override { unused(); }
  void bias_grad(float*, const float*, int, int, float) override { unused(); }
  void loss(Loss, const float*, const float*, float*, float*, int, int, float) override {
    unused();
  }
  void adamw(const AdamWHyper&, const std::vector<AdamWTensor>&) override { unused(); }
  void scale(float*, float, std::size_t) override { unused(); }
  void add(float*, const float*, std::size_t) override { unused(); }
  std::int64_t rounded_bytes(std::int64_t bytes) const override { return bytes; }

 protected:
  void* raw_alloc(std::size_t bytes) override { return std::malloc(bytes); }
  void raw_free(void* p, std::size_t) noexcept override { std::free(p); }
  [[noreturn]] static void unused() { throw std::logic_error("not used by communicators"); }
};

}  // namespace shardscope::testing
