// The bf16 kernels (kernels/host_bf16.hpp, through the CpuBackend) against float64
// references written here, on fresh seeded random data, and bf16 buffers' bytes: 2 B an
// element in the tracker, in the category asked for (master, param_cast included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "kernels/host_bf16.hpp"
#include "support/random_data.hpp"

namespace shardscope {
namespace {

using testing::all_zero;
using testing::random_floats;

// bf16 keeps 8 significant bits: one rounding is within 2^-8 of the value (half its spacing,
// relative to the value, is at most 2^-8).
constexpr double kBf16Unit = 1.0 / 256.0;

std::vector<Bf16> rounded(const std::vector<float>& v) {
  std::vector<Bf16> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_bf16(v[i]);
  return out;
}

double widen(Bf16 b) { return static_cast<double>(from_bf16(b)); }

TEST(Bf16, RoundingIsToNearestEvenAndWideningExact) {
  EXPECT_EQ(to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(to_bf16(-2.0f).bits, 0xc000);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
  EXPECT_EQ(to_bf16(1.0f + 1.0f / 256).bits, 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: to the even one, 1 + 2^-6.
  EXPECT_EQ(to_bf16(1.0f + 3.0f / 256).bits, 0x3f82);
  EXPECT_EQ(to_bf16(1.0f + 1.0f / 256 + 1.0f / 65536).bits, 0x3f81);  // above halfway: up
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(from_bf16(to_bf16(std::numeric_limits<float>::infinity())), std::numeric_limits<float>::infinity());
  // Random values: within half a unit of the 8th bit, and bf16 -> fp32 -> bf16 is the identity.
  const std::vector<float> x = random_floats(4096, 11u, -100.0f, 100.0f);
  ASSERT_FALSE(all_zero(x));
  for (float v : x) {
    const Bf16 b = to_bf16(v);
    EXPECT_LE(std::fabs(widen(b) - v), kBf16Unit * std::fabs(v)) << v;
    EXPECT_EQ(to_bf16(from_bf16(b)).bits, b.bits);
  }
}

// add_bf16 (DeepSpeed's bf16 gradient accumulation): each sum in fp32, rounded to nearest
// even: 1 + 2^-8 is a tie that goes to 1, 1 + 3·2^-8 one that goes to 1 + 2^-6; random
// pairs equal their fp32 sum rounded once.
TEST(Bf16, AddRoundsEachSumOnce) {
  CpuBackend backend;
  std::vector<Bf16> dst = {to_bf16(1.0f), to_bf16(1.0f), to_bf16(-2.0f)};
  const std::vector<Bf16> src = {to_bf16(1.0f / 256), to_bf16(3.0f / 256), to_bf16(2.0f)};
  backend.add_bf16(dst.data(), src.data(), dst.size());
  EXPECT_EQ(dst[0].bits, 0x3f80);
  EXPECT_EQ(dst[1].bits, 0x3f82);
  EXPECT_EQ(from_bf16(dst[2]), 0.0f);
  const std::vector<float> a = random_floats(4096, 23u, -10.0f, 10.0f), b = random_floats(4096, 29u, -10.0f, 10.0f);
  ASSERT_FALSE(all_zero(a));
  ASSERT_FALSE(all_zero(b));
  std::vector<Bf16> x = rounded(a);
  const std::vector<Bf16> y = rounded(b);
  backend.add_bf16(x.data(), y.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(x[i].bits, to_bf16(from_bf16(to_bf16(a[i])) + from_bf16(to_bf16(b[i]))).bits) << i;
}

struct GemmCase {
  Trans ta, tb;
  int m, n, k;
  float alpha, beta;
  int pad;
};

std::string describe(const GemmCase& g) {
  return std::string("gemm_bf16 ta=") + (g.ta == Trans::yes ? "T" : "N") + " tb=" + (g.tb == Trans::yes ? "T" : "N") +
         " m=" + std::to_string(g.m) + " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
         " beta=" + std::to_string(g.beta) + " pad=" + std::to_string(g.pad);
}

// Both outputs (fp32 C, bf16 C) of every transpose pair, against float64 sums of (1) the
// bf16 inputs' exact values, to fp32 summation's error (the kernel multiplies bf16 values
// and sums in fp32), and (2) the fp32 values before rounding, to bf16's error: each
// input's rounding (2^-8 each), and a bf16 C's own.
TEST(Bf16, GemmAgainstFloat64References) {
  const GemmCase cases[] = {
      {Trans::no, Trans::yes, 32, 48, 64, 1.0f, 0.0f, 0},  {Trans::yes, Trans::no, 48, 64, 32, 1.0f, 1.0f, 3},
      {Trans::no, Trans::no, 17, 9, 33, 0.5f, 0.0f, 1},    {Trans::yes, Trans::yes, 5, 7, 130, 1.0f, 0.5f, 2},
  };
  CpuBackend be;
  std::uint32_t seed = 100;
  for (const GemmCase& g : cases) {
    const int a_rows = g.ta == Trans::no ? g.m : g.k, a_cols = g.ta == Trans::no ? g.k : g.m;
    const int b_rows = g.tb == Trans::no ? g.k : g.n, b_cols = g.tb == Trans::no ? g.n : g.k;
    const int lda = a_cols + g.pad, ldb = b_cols + g.pad, ldc = g.n + g.pad;
    const std::vector<float> a32 = random_floats(static_cast<std::size_t>(a_rows) * lda, seed++);
    const std::vector<float> b32 = random_floats(static_cast<std::size_t>(b_rows) * ldb, seed++);
    const std::vector<float> c0 = random_floats(static_cast<std::size_t>(g.m) * ldc, seed++);
    ASSERT_FALSE(all_zero(a32) || all_zero(b32) || all_zero(c0));
    const std::vector<Bf16> a = rounded(a32), b = rounded(b32), c0b = rounded(c0);
    auto at = [&](const auto& x, int ld, Trans t, int i, int p) {
      return t == Trans::no ? x[static_cast<std::size_t>(i) * ld + p] : x[static_cast<std::size_t>(p) * ld + i];
    };
    std::vector<float> c = c0;
    std::vector<Bf16> cb = c0b;
    be.gemm_bf16(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb, g.beta, c.data(), ldc);
    be.gemm_bf16(g.ta, g.tb, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb, g.beta, cb.data(), ldc);
    int bad = 0;
    for (int i = 0; i < g.m; ++i)
      for (int j = 0; j < g.n; ++j) {
        double exact = 0, unrounded = 0, magnitude = 0;
        for (int p = 0; p < g.k; ++p) {
          const double ab = widen(at(a, lda, g.ta, i, p)) * widen(at(b, ldb, g.tb, p, j));
          exact += ab;
          magnitude += std::fabs(ab);
          unrounded += static_cast<double>(at(a32, lda, g.ta, i, p)) * at(b32, ldb, g.tb, p, j);
        }
        const std::size_t ij = static_cast<std::size_t>(i) * ldc + j;
        const double ref = g.alpha * exact + g.beta * static_cast<double>(c0[ij]);
        const double ref_b = g.alpha * exact + g.beta * widen(c0b[ij]);
        const double ref_unrounded = g.alpha * unrounded + g.beta * static_cast<double>(c0[ij]);
        const double scale = std::fabs(g.alpha) * magnitude + std::fabs(g.beta * c0[ij]);
        // (1) fp32 sums of exact products: fp32's error on the magnitudes summed.
        if (!(std::fabs(c[ij] - ref) <= 1e-6 + 1e-5 * scale) && ++bad <= 5)
          ADD_FAILURE() << describe(g) << " fp32 C (" << i << "," << j << ") " << c[ij] << " want " << ref;
        // A bf16 C: that, rounded once more.
        if (!(std::fabs(widen(cb[ij]) - ref_b) <= 1e-6 + 1e-5 * scale + kBf16Unit * std::fabs(ref_b)) && ++bad <= 5)
          ADD_FAILURE() << describe(g) << " bf16 C (" << i << "," << j << ") " << widen(cb[ij]) << " want " << ref_b;
        // (2) against the fp32 inputs: two roundings a product, one of C.
        if (!(std::fabs(widen(cb[ij]) - ref_unrounded) <= 1e-6 + 3 * kBf16Unit * scale) && ++bad <= 5)
          ADD_FAILURE() << describe(g) << " vs fp32 inputs (" << i << "," << j << ") " << widen(cb[ij]) << " want "
                        << ref_unrounded;
      }
    EXPECT_EQ(bad, 0) << describe(g);
    // Padding columns untouched.
    for (int i = 0; i < g.m; ++i)
      for (int j = g.n; j < ldc; ++j) {
        EXPECT_EQ(c[static_cast<std::size_t>(i) * ldc + j], c0[static_cast<std::size_t>(i) * ldc + j]);
        EXPECT_EQ(cb[static_cast<std::size_t>(i) * ldc + j].bits, c0b[static_cast<std::size_t>(i) * ldc + j].bits);
      }
  }
  // The kernel this build runs, as the run's header says it.
#if defined(SHARDSCOPE_WITH_SBGEMM)
  EXPECT_NE(std::string(host::bf16_gemm_kind()).find("cblas_sbgemm"), std::string::npos);
#elif defined(SHARDSCOPE_WITH_BLAS)
  EXPECT_NE(std::string(host::bf16_gemm_kind()).find("widened to fp32, cblas_sgemm"), std::string::npos);
#endif
}

TEST(Bf16, CastsBiasReluAndBiasGradAgainstFloat64) {
  CpuBackend be;
  const int rows = 13, cols = 37;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const std::vector<float> x = random_floats(n, 7u, -3.0f, 3.0f);
  const std::vector<float> bias = random_floats(cols, 8u);
  ASSERT_FALSE(all_zero(x) || all_zero(bias));
  // fp32 -> bf16 -> fp32 with beta 0 (overwrite) and 1 (accumulate into fp32).
  std::vector<Bf16> xb(n);
  be.cast_to_bf16(xb.data(), x.data(), n);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(xb[i].bits, to_bf16(x[i]).bits);
  std::vector<float> back(n, 0.0f), acc = random_floats(n, 9u);
  const std::vector<float> acc0 = acc;
  be.cast_from_bf16(back.data(), xb.data(), n, 0.0f);
  be.cast_from_bf16(acc.data(), xb.data(), n, 1.0f);
  for (std::size_t i = 0; i < n; ++i) {
    EXPECT_EQ(back[i], from_bf16(xb[i]));
    EXPECT_NEAR(acc[i], static_cast<double>(acc0[i]) + widen(xb[i]), 1e-6 * (1 + std::fabs(acc[i])));
  }
  // bias + ReLU on bf16: the fp32 sum of the two bf16 values, rounded once.
  const std::vector<Bf16> bb = rounded(bias);
  for (const Activation act : {Activation::none, Activation::relu}) {
    std::vector<Bf16> y = xb;
    be.bias_activation_bf16(y.data(), bb.data(), rows, cols, act);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) {
        double ref = widen(xb[static_cast<std::size_t>(i) * cols + j]) + widen(bb[j]);
        if (act == Activation::relu && ref < 0) ref = 0;
        EXPECT_NEAR(widen(y[static_cast<std::size_t>(i) * cols + j]), ref, kBf16Unit * std::fabs(ref) + 1e-30);
      }
  }
  // ReLU's backward zeroes where the saved output is not positive.
  std::vector<Bf16> dz = rounded(random_floats(n, 10u));
  const std::vector<Bf16> dz0 = dz;
  be.relu_backward_bf16(dz.data(), xb.data(), n);
  for (std::size_t i = 0; i < n; ++i) EXPECT_EQ(dz[i].bits, from_bf16(xb[i]) > 0 ? dz0[i].bits : Bf16{}.bits);
  // Column sums in fp32 of bf16 values, rounded to bf16; the whole sum, scaled, in fp32.
  std::vector<Bf16> db(cols);
  be.bias_grad_bf16(db.data(), dz0.data(), rows, cols);
  double total = 0, total_mag = 0;
  for (int j = 0; j < cols; ++j) {
    double s = 0, mag = 0;
    for (int i = 0; i < rows; ++i) {
      s += widen(dz0[static_cast<std::size_t>(i) * cols + j]);
      mag += std::fabs(widen(dz0[static_cast<std::size_t>(i) * cols + j]));
    }
    EXPECT_NEAR(widen(db[j]), s, 1e-6 + 1e-5 * mag + kBf16Unit * std::fabs(s));
    total += s;
    total_mag += mag;
  }
  float sum = 0.0f;
  be.sum_bf16(&sum, dz0.data(), n, 0.5f);
  EXPECT_NEAR(sum, 0.5 * total, 1e-6 + 1e-5 * total_mag);
  std::vector<Bf16> filled(n);
  be.fill_bf16(filled.data(), 0.3f, n);
  for (const Bf16 f : filled) EXPECT_EQ(f.bits, to_bf16(0.3f).bits);
}

TEST(Bf16, BuffersCountTwoBytesAnElementInTheirCategory) {
  CpuBackend be;
  {
    Buffer cast = be.alloc(Category::param_cast, 100, DType::bf16);
    Buffer master = be.alloc(Category::master, 10);
    EXPECT_EQ(cast.dtype(), DType::bf16);
    EXPECT_EQ(cast.bytes(), 200);
    EXPECT_EQ(master.bytes(), 40);
    EXPECT_EQ(be.tracker().current()[Category::param_cast], 200);
    EXPECT_EQ(be.tracker().current()[Category::master], 40);
    EXPECT_EQ(be.tracker().current_total(), 240);
    Buffer moved = std::move(cast);
    EXPECT_EQ(moved.bytes(), 200);
    EXPECT_EQ(moved.dtype(), DType::bf16);
    EXPECT_EQ(be.tracker().current_total(), 240);
  }
  EXPECT_EQ(be.tracker().current_total(), 0);
  EXPECT_EQ(be.tracker().peak().by_category[Category::param_cast], 200);
  EXPECT_EQ(std::string(category_name(Category::param_cast)), "param_cast");
  EXPECT_EQ(std::string(category_name(Category::master)), "master");
}

}  // namespace
}  // namespace shardscope
