// Buffer ownership, the tracked allocation path shared by every backend, and the
// backend registry.
#include "shardscope/backend.hpp"

#include <cstdlib>

#include <limits>
#include <utility>

#include "harness/backends/cpu_backend.hpp"
#include "shardscope/check.hpp"
#include "shardscope/format.hpp"

#ifdef SHARDSCOPE_WITH_CUDA
#include "harness/backends/cuda_backend.hpp"
#endif

namespace shardscope {

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::exchange(o.owner_, nullptr);
    data_ = std::exchange(o.data_, nullptr);
    count_ = std::exchange(o.count_, 0);
    category_ = o.category_;
    dtype_ = o.dtype_;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (owner_ != nullptr && data_ != nullptr) owner_->release(data_, bytes(), category_);
  owner_ = nullptr;
  data_ = nullptr;
  count_ = 0;
}

// count == 0 is allowed and returns an empty Buffer (data() == nullptr, false as a
// bool) that is neither allocated nor tracked: a zero-sized tensor or shard (a zero1
// rank that owns no tensor, say) holds no bytes, so there is nothing to count, and
// refusing it would turn a legal configuration into a failed run.
Buffer Backend::alloc(Category category, std::size_t count, DType dtype) {
  if (count == 0) return Buffer();
  const auto size = static_cast<std::size_t>(dtype_bytes(dtype));
  if (count > static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max()) / size) {
    throw RunError("out of memory: " + std::to_string(count) + " " + std::string(dtype_name(dtype)) +
                   " elements for category " + std::string(category_name(category)) + " overflow a byte count");
  }
  const std::size_t bytes = count * size;
  void* p = raw_alloc(bytes);
  if (p == nullptr) {
    throw RunError("out of memory: the " + name() + " backend could not allocate " +
                   format_bytes(static_cast<std::int64_t>(bytes)) + " for category " +
                   std::string(category_name(category)) + " (this rank already holds " +
                   format_bytes(tracker_.current_total()) + " tracked)");
  }
  const auto b = static_cast<std::int64_t>(bytes);
  tracker_.on_alloc(category, b, rounded_bytes(b));
  return Buffer(this, p, count, category, dtype);
}

void Backend::range_push(const char* name, std::int64_t bytes) {
  tracker_.push_span(name, bytes);
  do_range_push(name);
}

void Backend::range_pop() {
  do_range_pop();
  tracker_.pop_span();
}

void Backend::release(void* data, std::int64_t bytes, Category category) noexcept {
  tracker_.on_free(category, bytes, rounded_bytes(bytes));
  raw_free(data, static_cast<std::size_t>(bytes));
}

std::unique_ptr<Backend> make_backend(const std::string& name, int local_rank) {
  if (name == "cpu") return std::make_unique<CpuBackend>();
  if (name == "cuda") {
#ifdef SHARDSCOPE_WITH_CUDA
    return make_cuda_backend(local_rank);
#else
    (void)local_rank;
    throw UsageError("--backend cuda: this build has no CUDA support; allowed: cpu");
#endif
  }
  throw UsageError("--backend: unknown backend '" + name + "'; allowed: " +
                   (cuda_built() ? "cpu, cuda" : "cpu"));
}

bool cuda_built() {
#ifdef SHARDSCOPE_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef SHARDSCOPE_WITH_CUDA
  return cuda_visible_devices();
#else
  return 0;
#endif
}

float* Backend::staging(int slot, std::size_t count) {
  if (slot < 0) throw RunError("staging: negative slot");
  if (static_cast<std::size_t>(slot) >= staging_.size()) staging_.resize(static_cast<std::size_t>(slot) + 1);
  Staging& s = staging_[static_cast<std::size_t>(slot)];
  const std::size_t bytes = count * sizeof(float);
  if (bytes > s.bytes) {
    if (s.data != nullptr) host_free(s.data);
    s.data = nullptr;
    s.bytes = 0;
    s.data = host_alloc(bytes);
    if (s.data == nullptr)
      throw RunError("out of host memory: " + std::to_string(bytes) + " B of staging for " + name());
    s.bytes = bytes;
  }
  return static_cast<float*>(s.data);
}

void* Backend::host_alloc(std::size_t bytes) {
  const std::size_t rounded = (bytes + 63) / 64 * 64;
  return std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
}

void Backend::host_free(void* p) noexcept { std::free(p); }

void Backend::release_staging() noexcept {
  for (Staging& s : staging_)
    if (s.data != nullptr) host_free(s.data);
  staging_.clear();
}

}  // namespace shardscope

// ---- transformer math: a backend without a kernel says so (backend.hpp) ----

namespace shardscope {
namespace {

[[noreturn]] void no_kernel(const Backend& backend, const char* kernel) {
  throw RunError("the " + backend.name() + " backend has no " + kernel + " kernel");
}

}  // namespace

void Backend::gemm_bf16(Trans, Trans, int, int, int, float, const Bf16*, int, const Bf16*, int, float, float*, int) {
  no_kernel(*this, "gemm_bf16");
}
void Backend::gemm_bf16(Trans, Trans, int, int, int, float, const Bf16*, int, const Bf16*, int, float, Bf16*, int) {
  no_kernel(*this, "gemm_bf16");
}
void Backend::cast_to_bf16(Bf16*, const float*, std::size_t) { no_kernel(*this, "cast_to_bf16"); }
void Backend::cast_from_bf16(float*, const Bf16*, std::size_t, float) { no_kernel(*this, "cast_from_bf16"); }
void Backend::bias_activation_bf16(Bf16*, const Bf16*, int, int, Activation) {
  no_kernel(*this, "bias_activation_bf16");
}
void Backend::relu_backward_bf16(Bf16*, const Bf16*, std::size_t) { no_kernel(*this, "relu_backward_bf16"); }
void Backend::bias_grad_bf16(Bf16*, const Bf16*, int, int) { no_kernel(*this, "bias_grad_bf16"); }
void Backend::fill_bf16(Bf16*, float, std::size_t) { no_kernel(*this, "fill_bf16"); }
void Backend::copy_bf16(Bf16*, const Bf16*, std::size_t) { no_kernel(*this, "copy_bf16"); }
void Backend::scale_bf16(Bf16*, float, std::size_t) { no_kernel(*this, "scale_bf16"); }
void Backend::add_bf16(Bf16*, const Bf16*, std::size_t) { no_kernel(*this, "add_bf16"); }
void Backend::sum_bf16(float*, const Bf16*, std::size_t, float) { no_kernel(*this, "sum_bf16"); }
void Backend::upload_bytes(void*, const void*, std::size_t) { no_kernel(*this, "upload_bytes"); }
void Backend::download_bytes(void*, const void*, std::size_t) { no_kernel(*this, "download_bytes"); }

void Backend::gemm_batched(Trans, Trans, int, int, int, float, const float*, int, std::int64_t, const float*, int,
                           std::int64_t, float, float*, int, std::int64_t, int) {
  no_kernel(*this, "gemm_batched");
}
void Backend::embedding_forward(float*, const std::int64_t*, const float*, int, int) {
  no_kernel(*this, "embedding_forward");
}
void Backend::embedding_backward(float*, const std::int64_t*, const float*, int, int, int, float) {
  no_kernel(*this, "embedding_backward");
}
void Backend::add_positions(float*, const float*, int, int, int) { no_kernel(*this, "add_positions"); }
void Backend::positions_backward(float*, const float*, int, int, int, float) {
  no_kernel(*this, "positions_backward");
}
void Backend::layer_norm_forward(float*, float*, float*, const float*, const float*, const float*, int, int, float) {
  no_kernel(*this, "layer_norm_forward");
}
void Backend::layer_norm_backward(float*, float*, float*, const float*, const float*, const float*, const float*,
                                  const float*, int, int, float) {
  no_kernel(*this, "layer_norm_backward");
}
void Backend::rms_norm_forward(float*, float*, const float*, const float*, int, int, float) {
  no_kernel(*this, "rms_norm_forward");
}
void Backend::rms_norm_backward(float*, float*, const float*, const float*, const float*, const float*, int, int,
                                float) {
  no_kernel(*this, "rms_norm_backward");
}
void Backend::gelu_tanh_forward(float*, const float*, std::size_t) { no_kernel(*this, "gelu_tanh_forward"); }
void Backend::gelu_tanh_backward(float*, const float*, const float*, std::size_t) {
  no_kernel(*this, "gelu_tanh_backward");
}
void Backend::silu_forward(float*, const float*, std::size_t) { no_kernel(*this, "silu_forward"); }
void Backend::silu_backward(float*, const float*, const float*, std::size_t) { no_kernel(*this, "silu_backward"); }
void Backend::mul(float*, const float*, const float*, std::size_t) { no_kernel(*this, "mul"); }
void Backend::rope(float*, int, int, int, int, int, float, bool) { no_kernel(*this, "rope"); }
void Backend::causal_softmax_forward(float*, int, int, float) { no_kernel(*this, "causal_softmax_forward"); }
void Backend::softmax_backward(float*, const float*, std::int64_t, int) { no_kernel(*this, "softmax_backward"); }
void Backend::permute_heads(float*, const float*, int, int, int, int, int, bool) {
  no_kernel(*this, "permute_heads");
}
void Backend::flash_attention_forward(const AttentionArgs&, float*, int, float*) {
  no_kernel(*this, "flash_attention_forward");
}
void Backend::flash_attention_backward(const AttentionArgs&, const float*, int, const float*, const float*, float*,
                                       float*, float*) {
  no_kernel(*this, "flash_attention_backward");
}
void Backend::log_softmax_forward(float*, const float*, std::int64_t, int) { no_kernel(*this, "log_softmax_forward"); }
void Backend::nll_loss_forward(float*, const float*, const std::int64_t*, std::int64_t, int, float) {
  no_kernel(*this, "nll_loss_forward");
}
void Backend::vocab_embedding_forward(float*, const std::int64_t*, const float*, int, int, std::int64_t, int) {
  no_kernel(*this, "vocab_embedding_forward");
}
void Backend::vocab_embedding_backward(float*, const std::int64_t*, const float*, int, int, std::int64_t, int, float) {
  no_kernel(*this, "vocab_embedding_backward");
}
void Backend::row_max(float*, const float*, std::int64_t, int) { no_kernel(*this, "row_max"); }
void Backend::row_sum_exp(float*, const float*, const float*, std::int64_t, int) { no_kernel(*this, "row_sum_exp"); }
void Backend::log_softmax_given(float*, const float*, const float*, const float*, std::int64_t, int) {
  no_kernel(*this, "log_softmax_given");
}
void Backend::vocab_nll_loss_forward(float*, const float*, const std::int64_t*, std::int64_t, int, std::int64_t, float) {
  no_kernel(*this, "vocab_nll_loss_forward");
}
void Backend::vocab_cross_entropy_backward(float*, const float*, const std::int64_t*, std::int64_t, int, std::int64_t,
                                           float) {
  no_kernel(*this, "vocab_cross_entropy_backward");
}
void Backend::cross_entropy_backward(float*, const float*, const std::int64_t*, std::int64_t, int, float) {
  no_kernel(*this, "cross_entropy_backward");
}

}  // namespace shardscope
