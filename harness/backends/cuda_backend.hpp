// The CUDA backend (docs/design.md §5): one device, one non-blocking stream and one memory pool
// per rank; every tracked allocation comes from that pool in stream order.
//
// Memory accounting: after a stream sync, the pool's UsedMemCurrent equals the tracker's
// rounded figure, and UsedMemHigh (reset together with the tracker's peak) equals its
// rounded peak. Only tracked Buffers live in the pool, cuBLAS's workspace among them (one
// Buffer of category workspace); NCCL's and cuBLAS's own buffers and the CUDA context are
// "outside the pool" (outside_pool_bytes()), each measured as it is made
// (outside_pool_breakdown()).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "shardscope/backend.hpp"

namespace shardscope {

// Devices the CUDA runtime can see; 0 when cudaGetDeviceCount fails (no driver, no GPU).
int cuda_visible_devices();

// "runtime 13.0, driver 13.0" for provenance.
std::string cuda_versions_text();

// Throws RunError when no device is visible.
std::unique_ptr<Backend> make_cuda_backend(int local_rank);

// Bytes a request of `bytes` counts for in a cudaMallocAsync pool's
// cudaMemPoolAttrUsedMemCurrent/High: the single place that knows the pool's rounding.
// Measured (H200, CUDA 13.0): the request itself; placement is 512-B aligned, but the
// counters do not include that padding.
std::int64_t cuda_pool_rounded_bytes(std::int64_t bytes);

class CudaBackend final : public Backend {
 public:
  // Device local_rank % visible devices. TF32 off unless allow_tf32 (see set_allow_tf32).
  explicit CudaBackend(int local_rank, bool allow_tf32 = false);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }

  void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override;
  void bias_activation(float* y, const float* bias, int rows, int cols, Activation act) override;
  void relu_backward(float* dz, const float* a, std::size_t n) override;
  void bias_grad(float* db, const float* dz, int rows, int cols, float beta) override;
  void loss(Loss kind, const float* y, const float* target, float* dy, float* loss_out, int rows,
            int cols, float scale) override;
  void adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors) override;
  void copy(float* dst, const float* src, std::size_t n) override;
  void fill(float* dst, float value, std::size_t n) override;
  void scale(float* x, float s, std::size_t n) override;
  void add(float* dst, const float* src, std::size_t n) override;

  // bf16 (kernels/cuda_bf16.hpp); gemm_bf16 is cublasGemmEx with CUDA_R_16BF A and B,
  // CUBLAS_COMPUTE_32F, C CUDA_R_32F or CUDA_R_16BF.
  void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda, const Bf16* b,
                 int ldb, float beta, float* c, int ldc) override;
  void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda, const Bf16* b,
                 int ldb, float beta, Bf16* c, int ldc) override;
  void cast_to_bf16(Bf16* dst, const float* src, std::size_t n) override;
  void cast_from_bf16(float* dst, const Bf16* src, std::size_t n, float beta) override;
  void bias_activation_bf16(Bf16* y, const Bf16* bias, int rows, int cols, Activation act) override;
  void relu_backward_bf16(Bf16* dz, const Bf16* a, std::size_t n) override;
  void bias_grad_bf16(Bf16* db, const Bf16* dz, int rows, int cols) override;
  void fill_bf16(Bf16* dst, float value, std::size_t n) override;
  void sum_bf16(float* out, const Bf16* x, std::size_t n, float scale) override;
  std::string bf16_gemm() const override {
    return "cublasGemmEx (CUDA_R_16BF inputs, CUBLAS_COMPUTE_32F)";
  }

  // Transformer math (kernels/cuda_transformer.hpp, kernels/cuda_flash_attention.hpp);
  // gemm_batched is cublasSgemmStridedBatched under the same math mode as gemm.
  void gemm_batched(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                    std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta,
                    float* c, int ldc, std::int64_t stride_c, int batch) override;
  void embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows,
                         int dim) override;
  void embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                          int vocab, float beta) override;
  void add_positions(float* out, const float* pos, int batch, int seq, int dim) override;
  void positions_backward(float* dpos, const float* dy, int batch, int seq, int dim,
                          float beta) override;
  void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                          const float* bias, int rows, int dim, float eps) override;
  void layer_norm_backward(float* dx, float* dgamma, float* dbias, const float* dy, const float* x,
                           const float* mean, const float* rstd, const float* gamma, int rows,
                           int dim, float beta) override;
  void rms_norm_forward(float* y, float* rstd, const float* x, const float* gamma, int rows, int dim,
                        float eps) override;
  void rms_norm_backward(float* dx, float* dgamma, const float* dy, const float* x, const float* rstd,
                         const float* gamma, int rows, int dim, float beta) override;
  void gelu_tanh_forward(float* y, const float* x, std::size_t n) override;
  void gelu_tanh_backward(float* dx, const float* dy, const float* x, std::size_t n) override;
  void silu_forward(float* y, const float* x, std::size_t n) override;
  void silu_backward(float* dx, const float* dy, const float* x, std::size_t n) override;
  void mul(float* out, const float* a, const float* b, std::size_t n) override;
  void rope(float* x, int ld, int batch, int seq, int heads, int head_dim, float theta,
            bool inverse) override;
  void causal_softmax_forward(float* p, int count, int seq, float scale) override;
  void softmax_backward(float* dp, const float* p, std::int64_t rows, int cols) override;
  void permute_heads(float* dst, const float* src, int ld_tokens, int batch, int seq, int heads,
                     int head_dim, bool to_heads) override;
  void flash_attention_forward(const AttentionArgs& a, float* out, int ldo, float* lse) override;
  void flash_attention_backward(const AttentionArgs& a, const float* out, int ldo, const float* dout,
                                const float* lse, float* dq, float* dk, float* dv) override;
  void log_softmax_forward(float* logprobs, const float* logits, std::int64_t rows, int cols) override;
  void nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                        std::int64_t rows, int cols, float scale) override;
  void cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                              std::int64_t rows, int cols, float scale) override;

  void vocab_embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                               std::int64_t first, int count) override;
  void vocab_embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                                std::int64_t first, int count, float beta) override;
  void row_max(float* max, const float* x, std::int64_t rows, int cols) override;
  void row_sum_exp(float* sum, const float* x, const float* max, std::int64_t rows, int cols) override;
  void log_softmax_given(float* logprobs, const float* x, const float* max, const float* sum, std::int64_t rows,
                         int cols) override;
  void vocab_nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets, std::int64_t rows,
                              int cols, std::int64_t first, float scale) override;
  void vocab_cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                    std::int64_t rows, int cols, std::int64_t first, float scale) override;

  void upload(float* dst, const float* host, std::size_t n) override;
  void download(float* host, const float* src, std::size_t n) override;
  void upload_bytes(void* dst, const void* host, std::size_t bytes) override;
  void download_bytes(void* host, const void* src, std::size_t bytes) override;
  void synchronize() override;


  std::int64_t rounded_bytes(std::int64_t bytes) const override {
    return cuda_pool_rounded_bytes(bytes);
  }
  bool pool_stats(PoolStats* out) override;
  void reset_pool_high() override;
  OutsidePool outside_pool() override;
  // The context's, cuBLAS's and each NCCL communicator's part of it, measured as each was made.
  bool outside_pool_breakdown(OutsidePoolBreakdown* out) const override;
  // This process's device memory now: NVML's figure for it ("nvml"), else the device's used
  // bytes ("cuda_mem_get_info_delta"). A part is the growth of this figure around its making.
  MeasuredPart device_bytes_now() const;
  // `after` less `before` less `pool_growth` (what our pool reserved meanwhile); not measured
  // when either is not, when their sources differ, or when the figure shrank.
  static MeasuredPart growth(const MeasuredPart& before, const MeasuredPart& after, std::int64_t pool_growth = 0);
  // The pool's reserved bytes (cudaMemPoolAttrReservedMemCurrent), after a stream sync.
  std::int64_t pool_reserved_bytes();
  // An NCCL communicator made on this backend's device reports its memory here: its init
  // part (returns the index it is kept at), then what each first call adds to its total.
  std::size_t add_nccl_memory(NcclMemory memory);
  void add_nccl_growth(std::size_t index, const MeasuredPart& growth);
  // cudaMemGetInfo's free bytes on this backend's device (memory the pool has reserved
  // but not handed out is not counted as free).
  std::int64_t device_free_bytes() override;
  // The device's total minus free bytes (cudaMemGetInfo): every process's use.
  std::int64_t device_used_bytes() const;
  std::string device_description() const override;

  // cuBLAS math mode: CUBLAS_DEFAULT_MATH (true fp32) by default; with `allow` true,
  // CUBLAS_TF32_TENSOR_OP_MATH (like torch.backends.cuda.matmul.allow_tf32 = True).
  void set_allow_tf32(bool allow) override;
  bool allow_tf32() const { return allow_tf32_; }

  // cuBLAS's workspace: kCudaWorkspaceBytes (32 MiB, NVIDIA's advice for Hopper) from the
  // pool, tracked as category workspace, handed to cublasSetWorkspace with the stream
  // before any GEMM and freed when the backend goes.
  static constexpr std::int64_t kWorkspaceBytes = kCudaWorkspaceBytes;
  std::int64_t workspace_bytes() const override { return kWorkspaceBytes; }

  int device() const override { return device_; }
  cudaStream_t stream() const { return stream_; }
  cudaMemPool_t pool() const { return pool_; }

 protected:
  void* raw_alloc(std::size_t bytes) override;
  void raw_free(void* p, std::size_t bytes) noexcept override;
  // Pinned host memory (cudaMallocHost) for staging through MPI (--comm mpi).
  void* host_alloc(std::size_t bytes) override;
  void host_free(void* p) noexcept override;
  // NVTX ranges in the "shardscope" domain (Backend::range_push records the span).
  void do_range_push(const char* name) override;
  void do_range_pop() override;

 private:
  int device_ = 0;
  bool allow_tf32_ = false;
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  Buffer workspace_;     // kWorkspaceBytes of category workspace, from the pool
  bool broken_ = false;  // set by a teardown that found the context broken
  std::string pci_bus_id_;
  // The device's used bytes (cudaMemGetInfo) just after the context was made: the origin
  // of outside_pool()'s fallback when NVML has no figure for this process.
  std::int64_t device_used_at_start_ = 0;
  OutsidePoolBreakdown breakdown_;  // the parts outside the pool, as they were measured
};

}  // namespace shardscope
