// Host kernels of --precision bf16 (docs/design.md §2), with the signatures of the
// Backend's bf16 math (backend.hpp): the CPU backend calls them and the CUDA tests use
// them as the reference. Row-major.
//
// The GEMM: OpenBLAS's cblas_sbgemm (bf16 A and B, fp32 products and sums, fp32 C) when
// the installed OpenBLAS exports it (CMake checks the symbol: SHARDSCOPE_WITH_SBGEMM);
// otherwise A and B are widened to fp32 (exact) into scratch and multiplied by
// cblas_sgemm, which is the same arithmetic: a product of two bf16 values is exact in
// fp32 and the sums are fp32 either way. A bf16 C is the fp32 result rounded to nearest
// even. The scratch is the kernel's own, as OpenBLAS's packing buffers are: not tracked.
#pragma once

#include <cstddef>

#include "shardscope/dtype.hpp"
#include "shardscope/kernel_args.hpp"

namespace shardscope::host {

// Which bf16 GEMM this build runs: "OpenBLAS cblas_sbgemm", or the fallback's words.
const char* bf16_gemm_kind();

void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda, const Bf16* b,
               int ldb, float beta, float* c, int ldc);
void gemm_bf16(Trans ta, Trans tb, int m, int n, int k, float alpha, const Bf16* a, int lda, const Bf16* b,
               int ldb, float beta, Bf16* c, int ldc);
void cast_to_bf16(Bf16* dst, const float* src, std::size_t n);
void cast_from_bf16(float* dst, const Bf16* src, std::size_t n, float beta);
void bias_activation_bf16(Bf16* y, const Bf16* bias, int rows, int cols, Activation act);
void relu_backward_bf16(Bf16* dz, const Bf16* a, std::size_t n);
void bias_grad_bf16(Bf16* db, const Bf16* dz, int rows, int cols);
void fill_bf16(Bf16* dst, float value, std::size_t n);
void scale_bf16(Bf16* x, float s, std::size_t n);
// dst(n) = bf16(dst + src), each sum in fp32 rounded to nearest even.
void add_bf16(Bf16* dst, const Bf16* src, std::size_t n);
void sum_bf16(float* out, const Bf16* x, std::size_t n, float scale);

}  // namespace shardscope::host
