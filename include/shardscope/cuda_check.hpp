// Check macros for CUDA, cuBLAS and NCCL calls (STYLE: Errors). Included only from
// CUDA-only files (names with cuda/nccl/nvtx/nvml, or .cu), never from CPU code.
//
//   CUDA_CHECK(call)            throws RunError "file:line: call failed: cudaErrorX: text"
//   CUDA_CHECK_LAUNCH()         the same for cudaGetLastError() right after a kernel launch
//   CUBLAS_CHECK(call)          cublasStatus_t
//   NCCL_CHECK(call)            ncclResult_t (only when built with NCCL)
//   *_NOEXCEPT(call)            print the same line to stderr and std::abort(): destructors
//
// The rank is not known here; the top level (main, the sweep runner) prefixes "rank N".
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "shardscope/check.hpp"

#ifdef SHARDSCOPE_WITH_NCCL
#include <nccl.h>
#endif

namespace shardscope::detail {

inline std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

inline std::string cublas_error_text(cublasStatus_t s) {
  return std::string(cublasGetStatusName(s)) + ": " + cublasGetStatusString(s);
}

[[noreturn]] inline void throw_call_failed(const char* call, const std::string& error,
                                           const char* file, int line) {
  throw RunError(where_failed(file, line, std::string(call) + " failed: " + error));
}

// A failed runtime call also sets the thread's "last error"; clear it (when it is not
// sticky) so that the next CUDA_CHECK_LAUNCH does not report this failure again.
[[noreturn]] inline void throw_cuda_failed(cudaError_t e, const char* call, const char* file,
                                           int line) {
  (void)cudaGetLastError();
  throw_call_failed(call, cuda_error_text(e), file, line);
}

[[noreturn]] inline void abort_call_failed(const char* call, const std::string& error,
                                           const char* file, int line) noexcept {
  std::fprintf(stderr, "shardscope: error: %s\n",
               where_failed(file, line, std::string(call) + " failed: " + error).c_str());
  std::fflush(stderr);
  std::abort();
}

#ifdef SHARDSCOPE_WITH_NCCL
inline std::string nccl_error_text(ncclResult_t r) {
  std::string s = ncclGetErrorString(r);
  // NCCL keeps a more specific message for the last failure of this thread.
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0') s += " (" + std::string(last) + ")";
  return s;
}
#endif

}  // namespace shardscope::detail

#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    const cudaError_t ss_err_ = (call);                                                \
    if (ss_err_ != cudaSuccess)                                                        \
      ::shardscope::detail::throw_cuda_failed(ss_err_, #call, __FILE__, __LINE__);     \
  } while (0)

#define CUDA_CHECK_NOEXCEPT(call)                                                      \
  do {                                                                                 \
    const cudaError_t ss_err_ = (call);                                                \
    if (ss_err_ != cudaSuccess)                                                        \
      ::shardscope::detail::abort_call_failed(                                         \
          #call, ::shardscope::detail::cuda_error_text(ss_err_), __FILE__, __LINE__);  \
  } while (0)

// After every kernel launch: a bad configuration is reported here, at the launch site.
#define CUDA_CHECK_LAUNCH()                                                            \
  do {                                                                                 \
    const cudaError_t ss_err_ = cudaGetLastError();                                    \
    if (ss_err_ != cudaSuccess)                                                        \
      ::shardscope::detail::throw_call_failed(                                         \
          "kernel launch", ::shardscope::detail::cuda_error_text(ss_err_), __FILE__,   \
          __LINE__);                                                                   \
  } while (0)

#define CUBLAS_CHECK(call)                                                             \
  do {                                                                                 \
    const cublasStatus_t ss_st_ = (call);                                              \
    if (ss_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::shardscope::detail::throw_call_failed(                                         \
          #call, ::shardscope::detail::cublas_error_text(ss_st_), __FILE__, __LINE__); \
  } while (0)

#define CUBLAS_CHECK_NOEXCEPT(call)                                                    \
  do {                                                                                 \
    const cublasStatus_t ss_st_ = (call);                                              \
    if (ss_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      ::shardscope::detail::abort_call_failed(                                         \
          #call, ::shardscope::detail::cublas_error_text(ss_st_), __FILE__, __LINE__); \
  } while (0)

#ifdef SHARDSCOPE_WITH_NCCL
#define NCCL_CHECK(call)                                                               \
  do {                                                                                 \
    const ncclResult_t ss_res_ = (call);                                               \
    if (ss_res_ != ncclSuccess)                                                        \
      ::shardscope::detail::throw_call_failed(                                         \
          #call, ::shardscope::detail::nccl_error_text(ss_res_), __FILE__, __LINE__);  \
  } while (0)

#define NCCL_CHECK_NOEXCEPT(call)                                                      \
  do {                                                                                 \
    const ncclResult_t ss_res_ = (call);                                               \
    if (ss_res_ != ncclSuccess)                                                        \
      ::shardscope::detail::abort_call_failed(                                         \
          #call, ::shardscope::detail::nccl_error_text(ss_res_), __FILE__, __LINE__);  \
  } while (0)
#endif
