// The Backend: where tensors live and how the math runs (docs/design.md §5).
//
// Strategies and schedules talk only to this interface (and to a Communicator), never
// to CUDA or BLAS directly. Every allocation goes through `alloc`, which records it
// in the rank's Tracker with its category. All matrices are row-major; fp32 unless a
// kernel says bf16 (shardscope/dtype.hpp: --precision bf16's GEMMs and casts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardscope/category.hpp"
#include "shardscope/dtype.hpp"
#include "shardscope/kernel_args.hpp"
#include "shardscope/tracker.hpp"
#include "shardscope/transformer_args.hpp"

namespace shardscope {

class Backend;

// A tracked allocation of `count` elements of one dtype (fp32 unless made with
// Backend::alloc(category, count, DType::bf16)); move-only, freed (and untracked) on
// destruction. data() is the fp32 view, bf16() the bf16 one: a block that passes its
// output on as `const float*` (Model's tape) is read back with as_bf16() by a block that
// knows it takes bf16.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* owner, void* data, std::size_t count, Category category, DType dtype = DType::f32)
      : owner_(owner), data_(data), count_(count), category_(category), dtype_(dtype) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void reset() noexcept;  // frees now
  float* data() const { return static_cast<float*>(data_); }
  Bf16* bf16() const { return static_cast<Bf16*>(data_); }
  void* raw() const { return data_; }
  std::size_t count() const { return count_; }  // elements
  std::int64_t bytes() const { return static_cast<std::int64_t>(count_) * dtype_bytes(dtype_); }
  Category category() const { return category_; }
  DType dtype() const { return dtype_; }
  explicit operator bool() const { return data_ != nullptr; }

 private:
  Backend* owner_ = nullptr;
  void* data_ = nullptr;
  std::size_t count_ = 0;
  Category category_ = Category::temp;
  DType dtype_ = DType::f32;
};

// A bf16 tensor handed on as the tape's `const float*` (Model::forward's outputs).
inline const Bf16* as_bf16(const float* p) { return reinterpret_cast<const Bf16*>(p); }
inline Bf16* as_bf16(float* p) { return reinterpret_cast<Bf16*>(p); }

// The CUDA pool's own counters (cudaMemPoolGetAttribute), in bytes.
// Device memory outside the pool and its source (the record's outside_pool_bytes and
// outside_pool_source, docs/json.md):
//   "nvml"                     NVML's figure for this process minus the pool's reserved
//                              bytes (context included);
//   "cuda_mem_get_info_delta"  when NVML has no figure for this process (not installed,
//                              or a container whose pids NVML does not list): the
//                              device's used bytes (cudaMemGetInfo) now minus when the
//                              backend started, just after the CUDA context was made,
//                              minus the pool's reserved bytes; the context is not in it,
//                              and other processes' allocations on the device since are
//                              (a negative figure, when they freed more, is recorded as
//                              unknown).
struct OutsidePool {
  std::int64_t bytes = -1;      // -1 when unknown (cpu)
  const char* source = nullptr; // null when unknown
};

// The device memory outside the pool, part by part, each measured around its creation
// (the record's outside_pool_parts, docs/json.md): the same figure as OutsidePool's taken
// just before and just after the part was made, so a part's bytes are that figure's growth
// (the pool's own growth meanwhile taken off). `source` says which figure:
//   "nvml"                     NVML's figure for this process;
//   "cuda_mem_get_info_delta"  the device's used bytes (cudaMemGetInfo), when NVML has no
//                              figure for this process (a container, no NVML);
//   "not measured"             no figure before the part existed (the CUDA context, without
//                              NVML: cudaMemGetInfo needs the context it would measure).
struct MeasuredPart {
  std::int64_t bytes = -1;       // -1: not measured
  std::string source = "not measured";
};
// One NCCL communicator's device memory: what ncclCommInitRank took (`init`), and that plus
// what the first call of each kind of operation added (`total`): NCCL 2.22 and later connect
// lazily (NCCL_RUNTIME_CONNECT), so a communicator's buffers appear at its first all-reduce,
// all-gather, send... rather than at its creation.
struct NcclMemory {
  std::string communicator;  // "world", or the group's name
  int ranks = 0;
  MeasuredPart init;
  MeasuredPart total;
};
struct OutsidePoolBreakdown {
  MeasuredPart cuda_context;  // made by cudaSetDevice, measured right after it
  MeasuredPart cublas;        // the handle, and whatever cuBLAS keeps outside our pool
  std::vector<NcclMemory> nccl;
};

// cuBLAS's workspace on cuda: 32 MiB, what NVIDIA's cuBLAS documentation (cublasSetWorkspace)
// recommends for Hopper (4 MiB before it). The CUDA backend allocates it from its pool as
// one tracked Buffer of category `workspace` when it starts and holds it for its life, so
// every CUDA rank rests and peaks that much above a CPU rank (docs/gpu.md, "Workspace").
inline constexpr std::int64_t kCudaWorkspaceBytes = std::int64_t{32} << 20;

struct PoolStats {
  std::int64_t used_current = 0;
  std::int64_t used_high = 0;
  std::int64_t reserved_current = 0;
  std::int64_t reserved_high = 0;
};

class Backend {
 public:
  Backend() = default;
  virtual ~Backend() { release_staging(); }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual std::string name() const = 0;

  // Tracked allocation of `count` elements of `dtype` (fp32 by default: 4 B each; bf16
  // 2 B) with its category. Contents uninitialised. Throws RunError naming the bytes and
  // the category when memory runs out.
  Buffer alloc(Category category, std::size_t count, DType dtype = DType::f32);
  Tracker& tracker() { return tracker_; }
  const Tracker& tracker() const { return tracker_; }

  // --- math (row-major fp32); every call is asynchronous on device backends ---
  // C(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C, leading dimensions in elements.
  virtual void gemm(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a,
                    int lda, const float* b, int ldb, float beta, float* c, int ldc) = 0;
  // y(rows, cols) += bias(cols), then the activation, in place.
  virtual void bias_activation(float* y, const float* bias, int rows, int cols,
                               Activation act) = 0;
  // dz(n) *= (a > 0): ReLU backward from the saved output a.
  virtual void relu_backward(float* dz, const float* a, std::size_t n) = 0;
  // db(cols) = beta * db + column sums of dz(rows, cols).
  virtual void bias_grad(float* db, const float* dz, int rows, int cols, float beta) = 0;
  // Loss of y(rows, cols) scaled by `scale`, written to loss_out[0] (one float on the
  // backend), and its gradient dy = d(scale * loss)/dy. `sum`: loss = sum(y), target unused.
  // `mse`: loss = mean((y - target)^2) over rows*cols elements.
  // Either output may be null: the value alone in forward (then `dy` is null), the
  // gradient alone in backward (then `loss_out` is null, and `y` may be null for sum).
  virtual void loss(Loss kind, const float* y, const float* target, float* dy, float* loss_out,
                    int rows, int cols, float scale) = 0;
  // torch.optim.AdamW update of every tensor in the list (one fused launch on CUDA).
  virtual void adamw(const AdamWHyper& h, const std::vector<AdamWTensor>& tensors) = 0;
  virtual void copy(float* dst, const float* src, std::size_t n) = 0;
  virtual void fill(float* dst, float value, std::size_t n) = 0;
  virtual void scale(float* x, float s, std::size_t n) = 0;
  // dst += src
  virtual void add(float* dst, const float* src, std::size_t n) = 0;

  // --- bf16 (--precision bf16; shardscope/dtype.hpp) ---
  // Each has a default that throws RunError naming the backend and the kernel; cpu and
  // cuda implement all of them.
  //
  // C(m,n) = alpha * op(A) op(B) + beta * C with A and B bf16, products summed in fp32
  // (torch's bf16 matmul: cuBLAS's CUBLAS_COMPUTE_32F, OpenBLAS's sbgemm); C fp32, or
  // bf16 (the fp32 result rounded to nearest even; beta then reads C's bf16 values).
  virtual void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda,
                         const Bf16* b, int ldb, float beta, float* c, int ldc);
  virtual void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda,
                         const Bf16* b, int ldb, float beta, Bf16* c, int ldc);
  // dst(n) = bf16(src) rounding to nearest even (torch's .to(bfloat16)), and back:
  // dst = beta * dst + float(src) (beta 0 overwrites; beta 1 accumulates a bf16 gradient
  // into an fp32 one, as autograd's AccumulateGrad after the cast's backward).
  virtual void cast_to_bf16(Bf16* dst, const float* src, std::size_t n);
  virtual void cast_from_bf16(float* dst, const Bf16* src, std::size_t n, float beta);
  // A Linear's bias and activation on a bf16 output, in place: y(rows, cols) = bf16(y +
  // bias) (bias bf16), then ReLU when asked.
  virtual void bias_activation_bf16(Bf16* y, const Bf16* bias, int rows, int cols, Activation act);
  // dz(n) *= (a > 0) on bf16 (ReLU's backward from its saved bf16 output).
  virtual void relu_backward_bf16(Bf16* dz, const Bf16* a, std::size_t n);
  // db(cols) = column sums of dz(rows, cols), summed in fp32, rounded to bf16 (torch's
  // bf16 sum over rows: the bias gradient autocast's Linear makes).
  virtual void bias_grad_bf16(Bf16* db, const Bf16* dz, int rows, int cols);
  // dst(n) = bf16(value).
  virtual void fill_bf16(Bf16* dst, float value, std::size_t n);
  // dst(n) = src(n), bf16 elements (fully_shard's copy-in and copy-out of bf16 units).
  virtual void copy_bf16(Bf16* dst, const Bf16* src, std::size_t n);
  // x(n) = bf16(x * s) in place (torch's div_ of a bf16 bucket by the world).
  virtual void scale_bf16(Bf16* x, float s, std::size_t n);
  // dst(n) = bf16(dst + src), each sum in fp32 rounded to bf16 (torch's add_ of bf16
  // tensors: DeepSpeed's bf16 gradient accumulation, grad_accum_dtype bf16).
  virtual void add_bf16(Bf16* dst, const Bf16* src, std::size_t n);
  // out[0] (one fp32 on the backend) = scale * the sum of x(n), summed in fp32: a bf16
  // output's `sum` loss, kept in fp32.
  virtual void sum_bf16(float* out, const Bf16* x, std::size_t n, float scale);
  // What gemm_bf16 runs as, for the run's record and header ("OpenBLAS cblas_sbgemm ...",
  // "cublasGemmEx ..."); empty on a backend without it.
  virtual std::string bf16_gemm() const { return {}; }

  // --- transformer math (transformer_args.hpp gives the layouts) ---
  // Each has a default that throws RunError naming the backend and the kernel, so a
  // backend gains them one at a time; cpu and cuda implement all of them.
  //
  // Strided batched GEMM: for i in [0, batch), C_i = alpha op(A_i) op(B_i) + beta C_i
  // with X_i = X + i * stride_x (a stride of 0 reuses one matrix for every i).
  virtual void gemm_batched(Trans ta, Trans tb, int m, int n, int k, float alpha, const float* a, int lda,
                            std::int64_t stride_a, const float* b, int ldb, std::int64_t stride_b, float beta,
                            float* c, int ldc, std::int64_t stride_c, int batch);
  // out(rows, dim) = table[ids[i]] row by row (ids int64, each in [0, vocab)).
  virtual void embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim);
  // dtable(vocab, dim) = beta * dtable + sum over i with ids[i] = v of dy(i), for every v
  // (beta 0 overwrites the whole table, rows no id names included).
  virtual void embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                                  int vocab, float beta);
  // Learned positions: out(batch * seq, dim) row (b, s) += pos(s); and its gradient
  // dpos(seq, dim) = beta * dpos + sum over b of dy(b, s).
  virtual void add_positions(float* out, const float* pos, int batch, int seq, int dim);
  virtual void positions_backward(float* dpos, const float* dy, int batch, int seq, int dim, float beta);
  // torch.nn.LayerNorm over the last dim: y = (x - mean) * rstd * gamma + bias, with
  // rstd = 1 / sqrt(var + eps) (biased variance); writes mean(rows) and rstd(rows), which
  // torch saves. Backward overwrites dx (rows, dim) and writes dgamma, dbias with beta.
  virtual void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* gamma,
                                  const float* bias, int rows, int dim, float eps);
  virtual void layer_norm_backward(float* dx, float* dgamma, float* dbias, const float* dy, const float* x,
                                   const float* mean, const float* rstd, const float* gamma, int rows, int dim,
                                   float beta);
  // RMSNorm (Llama): y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps), rstd(rows)
  // written. Backward overwrites dx and writes dgamma with beta.
  virtual void rms_norm_forward(float* y, float* rstd, const float* x, const float* gamma, int rows, int dim,
                                float eps);
  virtual void rms_norm_backward(float* dx, float* dgamma, const float* dy, const float* x, const float* rstd,
                                 const float* gamma, int rows, int dim, float beta);
  // GELU with the tanh approximation (nn.GELU(approximate="tanh")) and SiLU, elementwise;
  // backward dx = dy * f'(x) (dx may be dy).
  virtual void gelu_tanh_forward(float* y, const float* x, std::size_t n);
  virtual void gelu_tanh_backward(float* dx, const float* dy, const float* x, std::size_t n);
  virtual void silu_forward(float* y, const float* x, std::size_t n);
  virtual void silu_backward(float* dx, const float* dy, const float* x, std::size_t n);
  // out = a * b elementwise (out may be a or b).
  virtual void mul(float* out, const float* a, const float* b, std::size_t n);
  // Rotary embedding in place on x's `heads` heads of head_dim (rows batch * seq, row
  // stride ld; a token's position is its index in its sequence), as Hugging Face's
  // rotate_half: for i < head_dim / 2, the pair (x_i, x_{i + head_dim/2}) is rotated by
  // pos * theta^(-2i / head_dim). `inverse` rotates back by the negative angle: the
  // backward of the forward on the gradient.
  virtual void rope(float* x, int ld, int batch, int seq, int heads, int head_dim, float theta, bool inverse);
  // Causal softmax in place on `count` (seq, seq) score matrices, one after another: row
  // i of each becomes softmax(scale * s(i, 0..i)) with columns > i set to 0.
  virtual void causal_softmax_forward(float* p, int count, int seq, float scale);
  // dp(rows, cols) := p * (dp - rowsum(dp * p)) in place: the softmax's backward (the
  // scale is the caller's to apply).
  virtual void softmax_backward(float* dp, const float* p, std::int64_t rows, int cols);
  // Copies between the token-major layout (batch, seq, heads, head_dim), row stride
  // ld_tokens, and the head-major one (batch, heads, seq, head_dim), contiguous:
  // `to_heads` true copies token-major src into head-major dst, false the reverse.
  virtual void permute_heads(float* dst, const float* src, int ld_tokens, int batch, int seq, int heads,
                             int head_dim, bool to_heads);
  // Flash attention (never materialises seq x seq): out (rows, heads * head_dim),
  // token-major, row stride ldo, and the log-sum-exp lse (batch, heads, seq) of each
  // query's scaled scores. Backward from dout (same layout as out) recomputes the
  // probabilities from lse and overwrites dq, dk, dv (laid out as q, k, v with the same
  // leading dimensions; a kv head's gradient sums over its query heads).
  virtual void flash_attention_forward(const AttentionArgs& a, float* out, int ldo, float* lse);
  virtual void flash_attention_backward(const AttentionArgs& a, const float* out, int ldo, const float* dout,
                                        const float* lse, float* dq, float* dk, float* dv);
  // torch's log_softmax over rows of `cols`, then nll_loss with mean reduction:
  // loss_out[0] = scale * mean over rows of -logprobs(i, targets[i]).
  virtual void log_softmax_forward(float* logprobs, const float* logits, std::int64_t rows, int cols);
  virtual void nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                                std::int64_t rows, int cols, float scale);
  // The gradient of the above at the logits: dlogits = scale / rows * (exp(logprobs) -
  // onehot(targets)) (dlogits may be logprobs).
  virtual void cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                      std::int64_t rows, int cols, float scale);

  // --- vocabulary-parallel pieces (Megatron's VocabParallelEmbedding and
  // vocab_parallel_cross_entropy): a rank holds vocabulary rows [first, first + count) ---
  // out(rows, dim) = table[ids[i] - first] for an id in the range, 0 otherwise.
  virtual void vocab_embedding_forward(float* out, const std::int64_t* ids, const float* table, int rows, int dim,
                                       std::int64_t first, int count);
  // dtable(count, dim) = beta * dtable + sum over i with ids[i] = first + v of dy(i); ids
  // outside the range add nothing.
  virtual void vocab_embedding_backward(float* dtable, const std::int64_t* ids, const float* dy, int rows, int dim,
                                        std::int64_t first, int count, float beta);
  // Row statistics of x(rows, cols): max(rows) = the row's largest value; sum(rows) =
  // sum over the row of exp(x - max) with a given max (the group's, once all-reduced).
  virtual void row_max(float* max, const float* x, std::int64_t rows, int cols);
  virtual void row_sum_exp(float* sum, const float* x, const float* max, std::int64_t rows, int cols);
  // logprobs = x - max - log(sum), from the group's statistics.
  virtual void log_softmax_given(float* logprobs, const float* x, const float* max, const float* sum,
                                 std::int64_t rows, int cols);
  // nll_loss_forward's mean over all rows, counting only the targets in [first, first +
  // cols) (this rank's part: the group's parts sum to the loss); and cross_entropy_backward
  // with the one-hot only at the targets in the range.
  virtual void vocab_nll_loss_forward(float* loss_out, const float* logprobs, const std::int64_t* targets,
                                      std::int64_t rows, int cols, std::int64_t first, float scale);
  virtual void vocab_cross_entropy_backward(float* dlogits, const float* logprobs, const std::int64_t* targets,
                                            std::int64_t rows, int cols, std::int64_t first, float scale);

  // Host <-> backend transfers (blocking).
  virtual void upload(float* dst, const float* host, std::size_t n) = 0;
  virtual void download(float* host, const float* src, std::size_t n) = 0;
  // The same for a buffer of any dtype, by bytes (a bf16 tensor's 2 B an element).
  virtual void upload_bytes(void* dst, const void* host, std::size_t bytes);
  virtual void download_bytes(void* host, const void* src, std::size_t bytes);
  // Waits for all queued work.
  virtual void synchronize() = 0;

  // Named ranges: kept as spans in the tracker's timeline while it records, and handed
  // to the backend's profiler (do_range_push: NVTX on CUDA, nothing on CPU). `bytes` is
  // a collective's or p2p call's payload (-1: none), kept with the span.
  void range_push(const char* name, std::int64_t bytes = -1);
  void range_pop();
  // The profiler's range alone (NVTX on CUDA), with no timeline span: for what the
  // timeline records otherwise (a non-blocking collective's post, Communicator::start_*).
  void profiler_push(const char* name) { do_range_push(name); }
  void profiler_pop() { do_range_pop(); }

  // Host memory for staging this backend's buffers through a host transport (MPI with
  // CUDA buffers): slot `slot` holds at least `count` floats, grows as needed and is
  // kept. Pinned (cudaMallocHost) on CUDA so the copies run at full speed; not tracked,
  // since it is host memory, not the device's.
  float* staging(int slot, std::size_t count);

  // Bytes the allocator really reserves for a request (its granularity).
  virtual std::int64_t rounded_bytes(std::int64_t bytes) const = 0;

  // Pool counters after a sync; false on backends without a pool (cpu).
  virtual bool pool_stats(PoolStats* /*out*/) { return false; }
  // Starts a new high-water window for the pool (UsedMemHigh/ReservedMemHigh := current).
  virtual void reset_pool_high() {}
  // Device bytes this process holds outside the pool (context, NCCL, cuBLAS), and where
  // the figure came from (see OutsidePool); bytes -1 and no source on cpu.
  virtual OutsidePool outside_pool() { return {}; }
  std::int64_t outside_pool_bytes() { return outside_pool().bytes; }
  // The parts of that figure measured as they were made (see OutsidePoolBreakdown); none on
  // backends without a device (cpu).
  virtual bool outside_pool_breakdown(OutsidePoolBreakdown* /*out*/) const { return false; }
  // Bytes of category `workspace` the backend holds for its whole life from when it is
  // made (cuBLAS's workspace on cuda: kCudaWorkspaceBytes); 0 on cpu.
  virtual std::int64_t workspace_bytes() const { return 0; }
  // TF32 tensor-core GEMMs (CUDA only; off by default so cpu and cuda agree).
  virtual void set_allow_tf32(bool /*allow*/) {}
  // Free device memory in bytes (cudaMemGetInfo); -1 on host backends.
  virtual std::int64_t device_free_bytes() { return -1; }
  // The device index this backend runs on (cudaSetDevice's); -1 on host backends (cpu).
  virtual int device() const { return -1; }
  // A line naming the device, for provenance ("NVIDIA H200, CUDA 13.0, driver ..."); empty on cpu.
  virtual std::string device_description() const { return {}; }

 protected:
  friend class Buffer;
  virtual void* raw_alloc(std::size_t bytes) = 0;  // nullptr when out of memory
  virtual void raw_free(void* p, std::size_t bytes) noexcept = 0;
  // The profiler's side of range_push/range_pop.
  virtual void do_range_push(const char* /*name*/) {}
  virtual void do_range_pop() {}
  // Staging memory (see staging()); derived classes that override these must call
  // release_staging() in their destructor, while their override is still callable.
  virtual void* host_alloc(std::size_t bytes);
  virtual void host_free(void* p) noexcept;
  void release_staging() noexcept;

 private:
  void release(void* data, std::int64_t bytes, Category category) noexcept;
  Tracker tracker_;
  struct Staging {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<Staging> staging_;
};

// RAII range: marks a profiler range (and a timeline span) for the scope. The one range
// class: the model's layers, the strategies' steps and the pipeline's actions use it.
class ScopedRange {
 public:
  ScopedRange(Backend& b, const char* name, std::int64_t bytes = -1) : b_(b) { b_.range_push(name, bytes); }
  ~ScopedRange() { b_.range_pop(); }
  ScopedRange(const ScopedRange&) = delete;
  ScopedRange& operator=(const ScopedRange&) = delete;

 private:
  Backend& b_;
};

// Backends by name: "cpu", "cuda" (when built with CUDA).
std::unique_ptr<Backend> make_backend(const std::string& name, int local_rank);
bool cuda_built();
int cuda_device_count();  // 0 without a driver or device

}  // namespace shardscope
