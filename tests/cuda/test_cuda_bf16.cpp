// The CUDA backend's bf16 math (cublasGemmEx with CUDA_R_16BF inputs and
// CUBLAS_COMPUTE_32F; kernels/cuda_bf16.cu) against the CPU backend's on the same bf16
// inputs, and a bf16 buffer's 2 B an element in the pool's tracker. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda/cuda_testbed.hpp"
#include "harness/backends/cpu_backend.hpp"

namespace shardscope {
namespace {

using testing::CudaTest;
using testing::random_floats;

constexpr double kBf16Unit = 1.0 / 256.0;

class CudaBf16 : public CudaTest {
 protected:
  Buffer to_device_bf16(const std::vector<Bf16>& host, Category c = Category::temp) {
    Buffer b = backend_->alloc(c, host.size(), DType::bf16);
    backend_->upload_bytes(b.raw(), host.data(), host.size() * sizeof(Bf16));
    return b;
  }
  std::vector<Bf16> to_host_bf16(const Buffer& b) {
    std::vector<Bf16> h(b.count());
    backend_->download_bytes(h.data(), b.raw(), h.size() * sizeof(Bf16));
    return h;
  }
  static std::vector<Bf16> rounded(const std::vector<float>& v) {
    std::vector<Bf16> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
    return out;
  }
  static std::vector<float> widened(const std::vector<Bf16>& v) {
    std::vector<float> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = from_bf16(v[i]);
    return out;
  }
};

TEST_F(CudaBf16, GemmEqualsTheCpuBackendsWithinFp32Summation) {
  CpuBackend cpu;
  const struct {
    Trans ta, tb;
    int m, n, k;
    float beta;
  } cases[] = {{Trans::no, Trans::yes, 64, 96, 128, 0.0f},
               {Trans::yes, Trans::no, 96, 64, 32, 1.0f},
               {Trans::no, Trans::no, 33, 17, 65, 0.5f}};
  unsigned seed = 300;
  for (const auto& g : cases) {
    const int a_cols = g.ta == Trans::no ? g.k : g.m, b_cols = g.tb == Trans::no ? g.n : g.k;
    const std::vector<Bf16> a = rounded(random_floats(static_cast<std::size_t>(g.m) * g.k, seed++));
    const std::vector<Bf16> b = rounded(random_floats(static_cast<std::size_t>(g.k) * g.n, seed++));
    const std::vector<float> c0 = random_floats(static_cast<std::size_t>(g.m) * g.n, seed++);
    ASSERT_TRUE(testing::nonzero(widened(a), "A") && testing::nonzero(widened(b), "B") && testing::nonzero(c0, "C"));
    // fp32 C
    std::vector<float> ref = c0;
    cpu.gemm_bf16(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), a_cols, b.data(), b_cols, g.beta, ref.data(), g.n);
    Buffer da = to_device_bf16(a), db = to_device_bf16(b), dc = to_device(c0);
    backend_->gemm_bf16(g.ta, g.tb, g.m, g.n, g.k, 1.0f, da.bf16(), a_cols, db.bf16(), b_cols, g.beta, dc.data(), g.n);
    // Sums of up to 128 products of magnitude <= 1, in a different order.
    EXPECT_TRUE(testing::all_close(to_host(dc), ref, 1e-4, 1e-4));
    // bf16 C: one rounding more, which may fall either side of a tie.
    const std::vector<Bf16> c0b = rounded(c0);
    std::vector<Bf16> refb = c0b;
    cpu.gemm_bf16(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a.data(), a_cols, b.data(), b_cols, g.beta, refb.data(), g.n);
    Buffer dcb = to_device_bf16(c0b);
    backend_->gemm_bf16(g.ta, g.tb, g.m, g.n, g.k, 1.0f, da.bf16(), a_cols, db.bf16(), b_cols, g.beta, dcb.bf16(), g.n);
    EXPECT_TRUE(testing::all_close(widened(to_host_bf16(dcb)), widened(refb), 1e-3, 2 * kBf16Unit));
  }
}

TEST_F(CudaBf16, CastsBiasReluAndBiasGradEqualTheCpuBackends) {
  CpuBackend cpu;
  const int rows = 29, cols = 300;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const std::vector<float> x = random_floats(n, 41u, -3.0f, 3.0f);
  ASSERT_TRUE(testing::nonzero(x, "x"));
  Buffer dx = to_device(x);
  Buffer dxb = backend_->alloc(Category::param_cast, n, DType::bf16);
  EXPECT_EQ(backend_->tracker().current()[Category::param_cast], static_cast<std::int64_t>(2 * n));
  backend_->cast_to_bf16(dxb.bf16(), dx.data(), n);
  const std::vector<Bf16> got = to_host_bf16(dxb);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(got[i].bits, to_bf16(x[i]).bits) << i;
  std::vector<float> acc = random_floats(n, 42u), ref = acc;
  cpu.cast_from_bf16(ref.data(), got.data(), n, 1.0f);
  Buffer dacc = to_device(acc);
  backend_->cast_from_bf16(dacc.data(), dxb.bf16(), n, 1.0f);
  EXPECT_TRUE(testing::all_close(to_host(dacc), ref, 0.0, 0.0));
  const std::vector<Bf16> bias = rounded(random_floats(cols, 43u));
  Buffer dbias = to_device_bf16(bias);
  for (const Activation act : {Activation::none, Activation::relu}) {
    std::vector<Bf16> y = got;
    cpu.bias_activation_bf16(y.data(), bias.data(), rows, cols, act);
    Buffer dy = to_device_bf16(got);
    backend_->bias_activation_bf16(dy.bf16(), dbias.bf16(), rows, cols, act);
    EXPECT_TRUE(testing::all_close(widened(to_host_bf16(dy)), widened(y), 0.0, 0.0));
  }
  std::vector<Bf16> dz = rounded(random_floats(n, 44u));
  std::vector<Bf16> dz_ref = dz;
  cpu.relu_backward_bf16(dz_ref.data(), got.data(), n);
  Buffer ddz = to_device_bf16(dz);
  backend_->relu_backward_bf16(ddz.bf16(), dxb.bf16(), n);
  EXPECT_TRUE(testing::all_close(widened(to_host_bf16(ddz)), widened(dz_ref), 0.0, 0.0));
  // Column sums (bf16 out) and the whole sum (fp32), in another order than the CPU's.
  std::vector<Bf16> db(cols);
  cpu.bias_grad_bf16(db.data(), dz.data(), rows, cols);
  Buffer ddb = backend_->alloc(Category::temp, cols, DType::bf16);
  Buffer dzs = to_device_bf16(dz);
  backend_->bias_grad_bf16(ddb.bf16(), dzs.bf16(), rows, cols);
  EXPECT_TRUE(testing::all_close(widened(to_host_bf16(ddb)), widened(db), 1e-4, 2 * kBf16Unit));
  float sum = 0.0f;
  cpu.sum_bf16(&sum, dz.data(), n, 0.25f);
  Buffer dsum = backend_->alloc(Category::temp, 1);
  backend_->sum_bf16(dsum.data(), dzs.bf16(), n, 0.25f);
  EXPECT_TRUE(testing::all_close(to_host(dsum), {sum}, 1e-3, 1e-4));
  Buffer dfill = backend_->alloc(Category::temp, n, DType::bf16);
  backend_->fill_bf16(dfill.bf16(), 0.3f, n);
  for (const Bf16 f : to_host_bf16(dfill)) ASSERT_EQ(f.bits, to_bf16(0.3f).bits);
}

}  // namespace
}  // namespace shardscope
