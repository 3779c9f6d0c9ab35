#include "harness/backends/cuda_backend.hpp"

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCudaRt.h>

#include <cstdio>
#include <exception>
#include <limits>
#include <string>
#include <utility>

#include "harness/backends/nvml_query.hpp"
#include "kernels/cuda_bf16.hpp"
#include "kernels/cuda_flash_attention.hpp"
#include "kernels/cuda_ops.hpp"
#include "kernels/cuda_transformer.hpp"
#include "shardscope/cuda_check.hpp"

namespace shardscope {
namespace {

// The NVTX domain of every shardscope range (Nsight Systems shows it as a row).
nvtxDomainHandle_t nvtx_domain() {
  static const nvtxDomainHandle_t domain = nvtxDomainCreateA("shardscope");
  return domain;
}

std::string cuda_version_text(int v) {  // 13000 -> "13.0"
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

cublasOperation_t to_cublas(Trans t) { return t == Trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

// ---- the pool's rounding ------------------------------------------------------------------
// Measured on an H200 (driver 580.159.04, CUDA 13.0; test PoolRoundingMatchesUsedMemCurrent):
// cudaMemPoolAttrUsedMemCurrent/High count each allocation at exactly the requested size,
// from 4 B to 100 MB, even though the allocator places allocations 512 B apart (the next
// pointer lands at the request rounded up to 512 B) and reserves physical memory in
// chunks of 32 MiB and more. So the figure that equals UsedMemCurrent is the request
// itself. This is the one place that encodes that rule; the test re-measures it.
std::int64_t cuda_pool_rounded_bytes(std::int64_t bytes) { return bytes > 0 ? bytes : 0; }

int cuda_visible_devices() {
  int count = 0;  // left untouched when the call fails (no driver: error 35)
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it, so later checks do not report it
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> make_cuda_backend(int local_rank) {
  return std::make_unique<CudaBackend>(local_rank);
}

CudaBackend::CudaBackend(int local_rank, bool allow_tf32) {
  const int count = cuda_visible_devices();
  if (count == 0) {
    // A configuration this machine cannot run (exit 2; a sweep records it as skipped).
    throw UsageError("--backend cuda: no CUDA device is visible (cudaGetDeviceCount found none "
                     "or failed); use --backend cpu");
  }
  SHARDSCOPE_REQUIRE(local_rank >= 0, "CudaBackend: negative local rank");
  device_ = local_rank % count;
  try {
    CUDA_CHECK(cudaSetDevice(device_));
    int pools_supported = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, device_));
    if (pools_supported == 0) {
      throw RunError("--backend cuda: device " + std::to_string(device_) +
                     " does not support stream-ordered memory pools (cudaMallocAsync)");
    }
    // cudaSetDevice made the context: what the device holds now is the origin of the
    // fallback figure outside the pool (outside_pool()).
    device_used_at_start_ = device_used_bytes();
    char bus_id[32] = {};
    CUDA_CHECK(cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof(bus_id)), device_));
    pci_bus_id_ = bus_id;
    // The context is all this process holds on the device yet: NVML's figure for the
    // process is the context's. cudaMemGetInfo has no figure from before the context (it
    // needs one), so without NVML the context is not measured.
    if (const MeasuredPart now = device_bytes_now(); now.source == "nvml") breakdown_.cuda_context = now;

    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    const std::string stream_name = "shardscope rank stream (device " + std::to_string(device_) + ")";
    nvtxNameCudaStreamA(stream_, stream_name.c_str());

    // Our own pool (not the device's default one, which cuBLAS, NCCL or a framework may
    // also use), so that its counters hold exactly the tracked Buffers.
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    // Freed memory stays reserved by the pool (no release at each sync): reserved bytes
    // then show the step's footprint, and allocation stays fast.
    std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
    CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));

    // cuBLAS's part: what the process holds after the handle is made and given its stream
    // and our workspace, less before, less what our pool reserved for that workspace.
    const MeasuredPart before_cublas = device_bytes_now();
    const std::int64_t reserved_before_cublas = pool_reserved_bytes();
    CUBLAS_CHECK(cublasCreate(&cublas_));
    // cublasSetStream resets the workspace to cuBLAS's default: set the stream first.
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    // cuBLAS's workspace from the pool, tracked (category workspace), on the stream cuBLAS
    // runs on: cuBLAS advises 32 MiB on Hopper (cublasSetWorkspace). After the stream, before
    // any GEMM.
    workspace_ = alloc(Category::workspace, static_cast<std::size_t>(kWorkspaceBytes) / sizeof(float));
    CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace_.data(), static_cast<std::size_t>(kWorkspaceBytes)));
    CUBLAS_CHECK(cublasSetPointerMode(cublas_, CUBLAS_POINTER_MODE_HOST));
    set_allow_tf32(allow_tf32);
    const std::int64_t pool_growth = pool_reserved_bytes() - reserved_before_cublas;  // syncs first
    breakdown_.cublas = growth(before_cublas, device_bytes_now(), pool_growth);
  } catch (...) {
    // The destructor does not run for a half-built object: release what exists.
    if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
    workspace_.reset();
    if (pool_ != nullptr) (void)cudaMemPoolDestroy(pool_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    throw;
  }
}

CudaBackend::~CudaBackend() {
  // Pinned staging: freed while this class's host_free is still callable (the base
  // class would free it with std::free); a broken context only makes this warn.
  release_staging();
  // Every Buffer but the workspace must be gone by now (they point at this backend). Wait
  // for queued work and frees; if the context is already broken (a kernel faulted), the
  // error that broke it is on its way to the user, and releasing now would only fail
  // again: skip (the workspace's free included).
  const cudaError_t e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) {
    broken_ = true;
    std::fprintf(stderr, "shardscope: warning: CUDA backend teardown skipped: %s\n",
                 cudaGetErrorString(e));
    return;
  }
  CUBLAS_CHECK_NOEXCEPT(cublasSetWorkspace(cublas_, nullptr, 0));
  workspace_.reset();  // the tracker sees it go
  CUDA_CHECK_NOEXCEPT(cudaStreamSynchronize(stream_));  // its free has run before the pool goes
  CUBLAS_CHECK_NOEXCEPT(cublasDestroy(cublas_));
  CUDA_CHECK_NOEXCEPT(cudaMemPoolDestroy(pool_));
  CUDA_CHECK_NOEXCEPT(cudaStreamDestroy(stream_));
}

void CudaBackend::set_allow_tf32(bool allow) {
  CUBLAS_CHECK(cublasSetMathMode(cublas_, allow ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  allow_tf32_ = allow;
}

// ---- memory -----------------------------------------------------------------------------

void* CudaBackend::host_alloc(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocHost(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // reported by the caller as out of host memory
    return nullptr;
  }
  return p;
}

// Called from the destructor too, possibly after a kernel broke the context: a failure
// here is reported, not fatal (the process is on its way out with the first error).
void CudaBackend::host_free(void* p) noexcept {
  const cudaError_t e = cudaFreeHost(p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    std::fprintf(stderr, "shardscope: warning: cudaFreeHost failed: %s\n", cudaGetErrorString(e));
  }
}

void* CudaBackend::raw_alloc(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool_, stream_);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it; Backend::alloc reports the OOM
    return nullptr;
  }
  CUDA_CHECK(e);
  return p;
}

void CudaBackend::raw_free(void* p, std::size_t /*bytes*/) noexcept {
  if (broken_) return;  // teardown after a broken context: nothing can be freed
  const cudaError_t e = cudaFreeAsync(p, stream_);
  if (e == cudaSuccess) return;
  // Buffers freed while an earlier CUDA error unwinds the stack: the context may be broken
  // and every call fails; the first error is the one to report, so do not abort here.
  if (std::uncaught_exceptions() > 0) return;
  detail::abort_call_failed("cudaFreeAsync(p, stream_)", detail::cuda_error_text(e), __FILE__,
                            __LINE__);
}

bool CudaBackend::pool_stats(PoolStats* out) {
  synchronize();  // frees queued on the stream are counted once they have run
  std::uint64_t used = 0, used_high = 0, reserved = 0, reserved_high = 0;
  CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used));
  CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &used_high));
  CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved));
  CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &reserved_high));
  out->used_current = static_cast<std::int64_t>(used);
  out->used_high = static_cast<std::int64_t>(used_high);
  out->reserved_current = static_cast<std::int64_t>(reserved);
  out->reserved_high = static_cast<std::int64_t>(reserved_high);
  return true;
}

void CudaBackend::reset_pool_high() {
  synchronize();  // the new window starts from what is really live now
  // Setting a high-water attribute to 0 resets it to the current value (the only value
  // the driver accepts for it).
  std::uint64_t zero = 0;
  CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero));
  zero = 0;
  CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReservedMemHigh, &zero));
}

OutsidePool CudaBackend::outside_pool() {
  PoolStats s;
  pool_stats(&s);
  const NvmlProcessMemory process = nvml_process_used_bytes(pci_bus_id_);
  if (process.bytes >= 0) return {process.bytes - s.reserved_current, "nvml"};
  return {device_used_bytes() - device_used_at_start_ - s.reserved_current, "cuda_mem_get_info_delta"};
}

bool CudaBackend::outside_pool_breakdown(OutsidePoolBreakdown* out) const {
  *out = breakdown_;
  return true;
}

MeasuredPart CudaBackend::device_bytes_now() const {
  const NvmlProcessMemory process = nvml_process_used_bytes(pci_bus_id_);
  if (process.bytes >= 0) return {process.bytes, "nvml"};
  return {device_used_bytes(), "cuda_mem_get_info_delta"};
}

MeasuredPart CudaBackend::growth(const MeasuredPart& before, const MeasuredPart& after, std::int64_t pool_growth) {
  if (before.bytes < 0 || after.bytes < 0 || before.source != after.source) return {};
  const std::int64_t grown = after.bytes - before.bytes - pool_growth;
  if (grown < 0) return {};  // something gave memory back meanwhile (another process, for cudaMemGetInfo)
  return {grown, after.source};
}

std::int64_t CudaBackend::pool_reserved_bytes() {
  synchronize();  // an allocation queued on the stream has reserved its memory once it has run
  std::uint64_t reserved = 0;
  CUDA_CHECK(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved));
  return static_cast<std::int64_t>(reserved);
}

std::size_t CudaBackend::add_nccl_memory(NcclMemory memory) {
  breakdown_.nccl.push_back(std::move(memory));
  return breakdown_.nccl.size() - 1;
}

void CudaBackend::add_nccl_growth(std::size_t index, const MeasuredPart& grown) {
  MeasuredPart& total = breakdown_.nccl.at(index).total;
  if (total.bytes < 0) return;  // already not measured
  if (grown.bytes < 0 || grown.source != total.source) {
    total = {};
    return;
  }
  total.bytes += grown.bytes;
}

std::int64_t CudaBackend::device_used_bytes() const {
  CUDA_CHECK(cudaSetDevice(device_));  // cudaMemGetInfo reports the current device
  std::size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<std::int64_t>(total_bytes) - static_cast<std::int64_t>(free_bytes);
}

std::int64_t CudaBackend::device_free_bytes() {
  CUDA_CHECK(cudaSetDevice(device_));  // cudaMemGetInfo reports the current device
  std::size_t free_bytes = 0, total_bytes = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<std::int64_t>(free_bytes);
}

std::string cuda_versions_text() {
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess || cudaDriverGetVersion(&driver) != cudaSuccess) {
    (void)cudaGetLastError();
    return {};
  }
  return "runtime " + cuda_version_text(runtime) + ", driver " + cuda_version_text(driver);
}

std::string CudaBackend::device_description() const {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  int runtime = 0, driver = 0;
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  char mem[32];
  std::snprintf(mem, sizeof(mem), "%.1f GiB",
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  std::string s = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                  std::to_string(prop.minor) + ", " + std::to_string(prop.multiProcessorCount) +
                  " SMs, " + mem + ", device " + std::to_string(device_) + " " + pci_bus_id_ +
                  "), CUDA runtime " + cuda_version_text(runtime) + ", driver CUDA " +
                  cuda_version_text(driver);
  const std::string driver_version = nvml_driver_version();
  if (!driver_version.empty()) s += " (" + driver_version + ")";
  return s;
}

// ---- math ---------------------------------------------------------------------------------

// Row-major C(m,n) = alpha op(A) op(B) + beta C is column-major C^T(n,m) =
// alpha op(B)^T op(A)^T + beta C^T. A row-major matrix read column-major is its
// transpose, so cuBLAS gets B first, A second, the same transpose flags, and (n, m, k).
void CudaBackend::gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a,
                       int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  CUBLAS_CHECK(cublasSgemm(cublas_, to_cublas(tb), to_cublas(ta), n, m, k, &alpha, b, ldb, a, lda,
                           &beta, c, ldc));
}

void CudaBackend::bias_activation(float* y, const float* bias, int rows, int cols, Activation act) {
  cuda_ops::bias_activation(y, bias, rows, cols, act, stream_);
}

void CudaBackend::relu_backward(float* dz, const float* a, std::size_t n) {
  cuda_ops::relu_backward(dz, a, n, stream_);
}

void CudaBackend::bias_grad(float* db, const float* dz, int rows, int cols, float beta) {
  cuda_ops::bias_grad(db, dz, rows, cols, beta, stream_);
}

void CudaBackend::loss(Loss kind, const float* y, const float* target, float* dy, float* loss_out,
                       int rows, int cols, float scale) {
  cuda_ops::loss(kind, y, target, dy, loss_out, rows, cols, scale, stream_);
}

void CudaBackend::adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors) {
  cuda_ops::adamw(h, tensors, stream_);
}

void CudaBackend::copy(float* dst, const float* src, std::size_t n) {
  if (n == 0 || dst == src) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill(float* dst, float value, std::size_t n) {
  cuda_ops::fill(dst, value, n, stream_);
}

void CudaBackend::scale(float* x, float s, std::size_t n) { cuda_ops::scale(x, s, n, stream_); }

void CudaBackend::add(float* dst, const float* src, std::size_t n) {
  cuda_ops::add(dst, src, n, stream_);
}

// ---- bf16 ---------------------------------------------------------------------------------

// As gemm (B first, then A, for row-major), with bf16 A and B and fp32 compute: the
// tensor cores' bf16 path, as torch's bf16 matmul on cuda.
void CudaBackend::gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda,
                            const Bf16* b, int ldb, float beta, float* c, int ldc) {
  if (m == 0 || n == 0) return;
  CUBLAS_CHECK(cublasGemmEx(cublas_, to_cublas(tb), to_cublas(ta), n, m, k, &alpha, b, CUDA_R_16BF, ldb, a,
                            CUDA_R_16BF, lda, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda,
                            const Bf16* b, int ldb, float beta, Bf16* c, int ldc) {
  if (m == 0 || n == 0) return;
  CUBLAS_CHECK(cublasGemmEx(cublas_, to_cublas(tb), to_cublas(ta), n, m, k, &alpha, b, CUDA_R_16BF, ldb, a,
                            CUDA_R_16BF, lda, &beta, c, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaBackend::cast_to_bf16(Bf16* dst, const float* src, std::size_t n) {
  cuda_ops::cast_to_bf16(dst, src, n, stream_);
}

void CudaBackend::cast_from_bf16(float* dst, const Bf16* src, std::size_t n, float beta) {
  cuda_ops::cast_from_bf16(dst, src, n, beta, stream_);
}

void CudaBackend::bias_activation_bf16(Bf16* y, const Bf16* bias, int rows, int cols, Activation act) {
  cuda_ops::bias_activation_bf16(y, bias, rows, cols, act, stream_);
}

void CudaBackend::relu_backward_bf16(Bf16* dz, const Bf16* a, std::size_t n) {
  cuda_ops::relu_backward_bf16(dz, a, n, stream_);
}

void CudaBackend::bias_grad_bf16(Bf16* db, const Bf16* dz, int rows, int cols) {
  cuda_ops::bias_grad_bf16(db, dz, rows, cols, stream_);
}

void CudaBackend::fill_bf16(Bf16* dst, float value, std::size_t n) { cuda_ops::fill_bf16(dst, value, n, stream_); }

void CudaBackend::sum_bf16(float* out, const Bf16* x, std::size_t n, float scale) {
  cuda_ops::sum_bf16(out, x, n, scale, stream_);
}

// ---- transformer math ---------------------------------------------------------------------

// As gemm, batch by batch: cuBLAS gets B's matrices first, then A's, with their strides.
void CudaBackend::gemm_batched(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a,
                               int lda, std::int64_t stride_a, const float* b, int ldb,
                               std::int64_t stride_b, float beta, float* c, int ldc,
                               std::int64_t stride_c, int batch) {
  SHARDSCOPE_REQUIRE(batch >= 0, "gemm_batched: negative batch");
  if (m == 0 || n == 0 || batch == 0) return;
  CUBLAS_CHECK(cublasSgemmStridedBatched(cublas_, to_cublas(tb), to_cublas(ta), n, m, k, &alpha, b,
                                         ldb, stride_b, a, lda, stride_a, &beta, c, ldc, stride_c,
                                         batch));
}

void CudaBackend::embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows,
                                    int dim) {
  cuda_ops::embedding_forward(out, ids, table, rows, dim, stream_);
}

void CudaBackend::embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows,
                                     int dim, int vocab, float beta) {
  cuda_ops::embedding_backward(dtable, ids, dy, rows, dim, vocab, beta, stream_);
}

void CudaBackend::add_positions(float* out, const float* pos, int batch, int seq, int dim) {
  cuda_ops::add_positions(out, pos, batch, seq, dim, stream_);
}

void CudaBackend::positions_backward(float* dpos, const float* dy, int batch, int seq, int dim,
                                     float beta) {
  cuda_ops::positions_backward(dpos, dy, batch, seq, dim, beta, stream_);
}

void CudaBackend::layer_norm_forward(float* y, float* mean, float* rstd, const float* x,
                                     const float* gamma, const float* bias, int rows, int dim,
                                     float eps) {
  cuda_ops::layer_norm_forward(y, mean, rstd, x, gamma, bias, rows, dim, eps, stream_);
}

void CudaBackend::layer_norm_backward(float* dx, float* dgamma, float* dbias, const float* dy,
                                      const float* x, const float* mean, const float* rstd,
                                      const float* gamma, int rows, int dim, float beta) {
  cuda_ops::layer_norm_backward(dx, dgamma, dbias, dy, x, mean, rstd, gamma, rows, dim, beta, stream_);
}

void CudaBackend::rms_norm_forward(float* y, float* rstd, const float* x, const float* gamma, int rows,
                                   int dim, float eps) {
  cuda_ops::rms_norm_forward(y, rstd, x, gamma, rows, dim, eps, stream_);
}

void CudaBackend::rms_norm_backward(float* dx, float* dgamma, const float* dy, const float* x,
                                    const float* rstd, const float* gamma, int rows, int dim,
                                    float beta) {
  cuda_ops::rms_norm_backward(dx, dgamma, dy, x, rstd, gamma, rows, dim, beta, stream_);
}

void CudaBackend::gelu_tanh_forward(float* y, const float* x, std::size_t n) {
  cuda_ops::gelu_tanh_forward(y, x, n, stream_);
}

void CudaBackend::gelu_tanh_backward(float* dx, const float* dy, const float* x, std::size_t n) {
  cuda_ops::gelu_tanh_backward(dx, dy, x, n, stream_);
}

void CudaBackend::silu_forward(float* y, const float* x, std::size_t n) {
  cuda_ops::silu_forward(y, x, n, stream_);
}

void CudaBackend::silu_backward(float* dx, const float* dy, const float* x, std::size_t n) {
  cuda_ops::silu_backward(dx, dy, x, n, stream_);
}

void CudaBackend::mul(float* out, const float* a, const float* b, std::size_t n) {
  cuda_ops::mul(out, a, b, n, stream_);
}

void CudaBackend::rope(float* x, int ld, int batch, int seq, int heads, int head_dim, float theta,
                       bool inverse) {
  cuda_ops::rope(x, ld, batch, seq, heads, head_dim, theta, inverse, stream_);
}

void CudaBackend::causal_softmax_forward(float* p, int count, int seq, float scale) {
  cuda_ops::causal_softmax_forward(p, count, seq, scale, stream_);
}

void CudaBackend::softmax_backward(float* dp, const float* p, std::int64_t rows, int cols) {
  cuda_ops::softmax_backward(dp, p, rows, cols, stream_);
}

void CudaBackend::permute_heads(float* dst, const float* src, int ld_tokens, int batch, int seq,
                                int heads, int head_dim, bool to_heads) {
  cuda_ops::permute_heads(dst, src, ld_tokens, batch, seq, heads, head_dim, to_heads, stream_);
}

void CudaBackend::flash_attention_forward(const AttentionArgs& a, float* out, int ldo, float* lse) {
  cuda_ops::flash_attention_forward(a, out, ldo, lse, stream_);
}

void CudaBackend::flash_attention_backward(const AttentionArgs& a, const float* out, int ldo,
                                           const float* dout, const float* lse, float* dq, float* dk,
                                           float* dv) {
  cuda_ops::flash_attention_backward(a, out, ldo, dout, lse, dq, dk, dv, stream_);
}

void CudaBackend::log_softmax_forward(float* logprobs, const float* logits, std::int64_t rows,
                                      int cols) {
  cuda_ops::log_softmax_forward(logprobs, logits, rows, cols, stream_);
}

void CudaBackend::nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                                   std::int64_t rows, int cols, float scale) {
  cuda_ops::nll_loss_forward(loss_out, logprobs, targets, rows, cols, scale, stream_);
}

void CudaBackend::cross_entropy_backward(float* dlogits, const float* logprobs,
                                         const std::int64_t* targets, std::int64_t rows, int cols,
                                         float scale) {
  cuda_ops::cross_entropy_backward(dlogits, logprobs, targets, rows, cols, scale, stream_);
}

void CudaBackend::vocab_embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                                          std::int64_t first, int count) {
  cuda_ops::vocab_embedding_forward(out, ids, table, rows, dim, first, count, stream_);
}
void CudaBackend::vocab_embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                                           std::int64_t first, int count, float beta) {
  cuda_ops::vocab_embedding_backward(dtable, ids, dy, rows, dim, first, count, beta, stream_);
}
void CudaBackend::row_max(float* max, const float* x, std::int64_t rows, int cols) {
  cuda_ops::row_max(max, x, rows, cols, stream_);
}
void CudaBackend::row_sum_exp(float* sum, const float* x, const float* max, std::int64_t rows, int cols) {
  cuda_ops::row_sum_exp(sum, x, max, rows, cols, stream_);
}
void CudaBackend::log_softmax_given(float* logprobs, const float* x, const float* max, const float* sum,
                                    std::int64_t rows, int cols) {
  cuda_ops::log_softmax_given(logprobs, x, max, sum, rows, cols, stream_);
}
void CudaBackend::vocab_nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                                         std::int64_t rows, int cols, std::int64_t first, float scale) {
  cuda_ops::vocab_nll_loss_forward(loss_out, logprobs, targets, rows, cols, first, scale, stream_);
}
void CudaBackend::vocab_cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                               std::int64_t rows, int cols, std::int64_t first, float scale) {
  cuda_ops::vocab_cross_entropy_backward(dlogits, logprobs, targets, rows, cols, first, scale, stream_);
}

void CudaBackend::upload(float* dst, const float* host, std::size_t n) {
  if (n == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
  synchronize();
}

void CudaBackend::download(float* host, const float* src, std::size_t n) {
  if (n == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaBackend::upload_bytes(void* dst, const void* host, std::size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream_));
  synchronize();
}

void CudaBackend::download_bytes(void* host, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaBackend::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

// ---- profiler ranges ----------------------------------------------------------------------

void CudaBackend::do_range_push(const char* name) {
  nvtxEventAttributes_t attr{};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = name != nullptr ? name : "";
  nvtxDomainRangePushEx(nvtx_domain(), &attr);
}

void CudaBackend::do_range_pop() { nvtxDomainRangePop(nvtx_domain()); }

}  // namespace shardscope
