// Every host kernel (kernels/host_ops.hpp) and every CpuBackend method against a float64
// reference written here, on fresh seeded random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/random_data.hpp"
#include "harness/backends/cpu_backend.hpp"
#include "kernels/host_ops.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using testing::all_zero;
using testing::random_floats;

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-5;



// |got - ref| <= atol + rtol * scale for every element; `scale` is |ref| unless given
// (for sums, the sum of the terms' magnitudes: the size of fp32's rounding error).
void expect_close(const std::vector<float>& got, const std::vector<double>& ref,
                  const std::string& what, const std::vector<double>* scale = nullptr,
                  double atol = kAtol, double rtol = kRtol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int bad = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double s = scale ? (*scale)[i] : std::fabs(ref[i]);
    const double tol = atol + rtol * s;
    if (!(std::fabs(static_cast<double>(got[i]) - ref[i]) <= tol)) {
      if (++bad <= 5)
        ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << ref[i]
                      << " (tol " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << ref.size() << " elements differ";
}

// ---- GEMM --------------------------------------------------------------------------

struct GemmCase {
  Trans ta, tb;
  int m, n, k;
  float alpha, beta;
  int pad;  // extra leading-dimension elements: checks lda/ldb/ldc are honoured
};

std::string describe(const GemmCase& g) {
  return std::string("gemm ta=") + (g.ta == Trans::yes ? "T" : "N") +
         " tb=" + (g.tb == Trans::yes ? "T" : "N") + " m=" + std::to_string(g.m) +
         " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
         " beta=" + std::to_string(g.beta) + " pad=" + std::to_string(g.pad);
}

using GemmFn = void (*)(Trans, Trans, int, int, int, float, const float*, int, const float*, int,
                        float, float*, int);

struct GemmData {
  int lda, ldb, ldc;
  std::vector<float> a, b, c;
  std::vector<double> ref, scale;
};

// A stored (m,k) or, transposed, (k,m); B (k,n) or (n,k); C (m,n); all row-major.
GemmData make_gemm(const GemmCase& g, std::uint32_t seed) {
  GemmData d;
  const int a_rows = g.ta == Trans::no ? g.m : g.k, a_cols = g.ta == Trans::no ? g.k : g.m;
  const int b_rows = g.tb == Trans::no ? g.k : g.n, b_cols = g.tb == Trans::no ? g.n : g.k;
  d.lda = a_cols + g.pad;
  d.ldb = b_cols + g.pad;
  d.ldc = g.n + g.pad;
  d.a = random_floats(static_cast<std::size_t>(a_rows) * d.lda, seed);
  d.b = random_floats(static_cast<std::size_t>(b_rows) * d.ldb, seed + 1);
  d.c = random_floats(static_cast<std::size_t>(g.m) * d.ldc, seed + 2);
  if (g.beta == 0.0f) {
    // BLAS rule: beta == 0 ignores C, which may be uninitialised (NaN bit patterns).
    for (int i = 0; i < g.m; ++i)
      for (int j = 0; j < g.n; ++j) d.c[static_cast<std::size_t>(i) * d.ldc + j] = std::nanf("");
  }
  auto opa = [&](int i, int p) -> double {
    return g.ta == Trans::no ? d.a[static_cast<std::size_t>(i) * d.lda + p]
                             : d.a[static_cast<std::size_t>(p) * d.lda + i];
  };
  auto opb = [&](int p, int j) -> double {
    return g.tb == Trans::no ? d.b[static_cast<std::size_t>(p) * d.ldb + j]
                             : d.b[static_cast<std::size_t>(j) * d.ldb + p];
  };
  d.ref.assign(d.c.begin(), d.c.end());  // padding must come back untouched
  d.scale.assign(d.c.size(), 0.0);
  for (int i = 0; i < g.m; ++i) {
    for (int j = 0; j < g.n; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int p = 0; p < g.k; ++p) {
        sum += opa(i, p) * opb(p, j);
        mag += std::fabs(opa(i, p) * opb(p, j));
      }
      const std::size_t idx = static_cast<std::size_t>(i) * d.ldc + j;
      const double c0 = g.beta == 0.0f ? 0.0 : static_cast<double>(g.beta) * d.c[idx];
      d.ref[idx] = static_cast<double>(g.alpha) * sum + c0;
      d.scale[idx] = std::fabs(static_cast<double>(g.alpha)) * mag + std::fabs(c0);
    }
  }
  return d;
}

void check_gemm(GemmFn fn, const char* fn_name, const GemmCase& g, std::uint32_t seed) {
  GemmData d = make_gemm(g, seed);
  ASSERT_FALSE(all_zero(d.a));
  ASSERT_FALSE(all_zero(d.b));
  fn(g.ta, g.tb, g.m, g.n, g.k, g.alpha, d.a.data(), d.lda, d.b.data(), d.ldb, g.beta, d.c.data(),
     d.ldc);
  ASSERT_FALSE(all_zero(d.c));
  expect_close(d.c, d.ref, std::string(fn_name) + " " + describe(g), &d.scale);
}

std::vector<GemmCase> gemm_cases() {
  std::vector<GemmCase> cases;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      cases.push_back({ta, tb, 37, 53, 29, 1.0f, 0.0f, 0});     // non-square, odd sizes
      cases.push_back({ta, tb, 19, 7, 301, 0.75f, -0.5f, 3});  // long k, beta != 0, padded
      cases.push_back({ta, tb, 64, 48, 32, -1.25f, 1.0f, 5});  // beta == 1 (accumulate)
      cases.push_back({ta, tb, 1, 33, 17, 2.0f, 0.0f, 1});     // a single row
    }
  return cases;
}

TEST(HostOps, GemmLoopsAllTransposes) {
  std::uint32_t seed = 100;
  for (const GemmCase& g : gemm_cases()) check_gemm(&host::gemm_loops, "gemm_loops", g, seed += 10);
}

TEST(HostOps, GemmAllTransposes) {
  std::uint32_t seed = 500;
  for (const GemmCase& g : gemm_cases()) check_gemm(&host::gemm, "gemm", g, seed += 10);
}

// The comparison itself must be able to fail: a swapped transpose is caught.
TEST(HostOps, GemmComparisonCatchesWrongTranspose) {
  const GemmCase g{Trans::no, Trans::no, 24, 24, 24, 1.0f, 0.0f, 0};
  GemmData d = make_gemm(g, 7);
  host::gemm_loops(Trans::yes, Trans::no, g.m, g.n, g.k, g.alpha, d.a.data(), d.lda, d.b.data(),
                   d.ldb, g.beta, d.c.data(), d.ldc);
  int bad = 0;
  for (std::size_t i = 0; i < d.ref.size(); ++i)
    if (std::fabs(d.c[i] - d.ref[i]) > kAtol + kRtol * d.scale[i]) ++bad;
  EXPECT_GT(bad, static_cast<int>(d.ref.size()) / 2);
}

// k == 0: C = beta * C (BLAS semantics), both implementations.
TEST(HostOps, GemmEmptyInnerDimension) {
  for (GemmFn fn : {&host::gemm_loops, &host::gemm}) {
    std::vector<float> c = random_floats(6, 3);
    std::vector<double> ref;
    for (float x : c) ref.push_back(0.5 * x);
    const float dummy = 1.0f;
    fn(Trans::no, Trans::no, 2, 3, 0, 1.0f, &dummy, 1, &dummy, 3, 0.5f, c.data(), 3);
    expect_close(c, ref, "gemm k=0");
  }
}

// ---- element-wise ------------------------------------------------------------------

TEST(HostOps, BiasActivation) {
  const int rows = 13, cols = 37;
  for (Activation act : {Activation::none, Activation::relu}) {
    std::vector<float> y = random_floats(static_cast<std::size_t>(rows) * cols, 11);
    const std::vector<float> bias = random_floats(cols, 12);
    ASSERT_FALSE(all_zero(y));
    ASSERT_FALSE(all_zero(bias));
    std::vector<double> ref(y.size());
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        const std::size_t i = static_cast<std::size_t>(r) * cols + c;
        const double z = static_cast<double>(y[i]) + bias[c];
        ref[i] = act == Activation::relu ? (z > 0.0 ? z : 0.0) : z;
      }
    host::bias_activation(y.data(), bias.data(), rows, cols, act);
    ASSERT_FALSE(all_zero(y));
    expect_close(y, ref, act == Activation::relu ? "bias+relu" : "bias");
  }
}

TEST(HostOps, ReluBackward) {
  const std::size_t n = 1001;
  std::vector<float> dz = random_floats(n, 21);
  std::vector<float> a = random_floats(n, 22);
  for (std::size_t i = 0; i < n; ++i) {
    if (a[i] < 0.0f) a[i] = 0.0f;  // a is a ReLU output: zeros and positives
  }
  a[0] = 0.0f;  // exactly zero: the gradient is zero there (torch: threshold_backward)
  ASSERT_FALSE(all_zero(dz));
  ASSERT_FALSE(all_zero(a));
  std::vector<double> ref(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = a[i] > 0.0f ? dz[i] : 0.0;
  host::relu_backward(dz.data(), a.data(), n);
  ASSERT_FALSE(all_zero(dz));
  expect_close(dz, ref, "relu_backward");
}

TEST(HostOps, BiasGrad) {
  const int rows = 67, cols = 29;
  const std::vector<float> dz = random_floats(static_cast<std::size_t>(rows) * cols, 31);
  ASSERT_FALSE(all_zero(dz));
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    std::vector<float> db = random_floats(cols, 32);
    if (beta == 0.0f) db.assign(cols, std::nanf(""));  // ignored, as in BLAS
    std::vector<double> ref(cols), scale(cols);
    for (int c = 0; c < cols; ++c) {
      double s = beta == 0.0f ? 0.0 : static_cast<double>(beta) * db[c];
      double mag = std::fabs(s);
      for (int r = 0; r < rows; ++r) {
        s += dz[static_cast<std::size_t>(r) * cols + c];
        mag += std::fabs(dz[static_cast<std::size_t>(r) * cols + c]);
      }
      ref[c] = s;
      scale[c] = mag;
    }
    host::bias_grad(db.data(), dz.data(), rows, cols, beta);
    ASSERT_FALSE(all_zero(db));
    expect_close(db, ref, "bias_grad beta=" + std::to_string(beta), &scale);
  }
}

TEST(HostOps, LossSum) {
  const int rows = 16, cols = 33;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const std::vector<float> y = random_floats(n, 41, -0.5f, 1.5f);
  ASSERT_FALSE(all_zero(y));
  const float scale = 0.25f;
  double sum = 0.0;
  for (float v : y) sum += v;
  std::vector<float> dy(n, std::nanf(""));
  std::vector<float> out(1, std::nanf(""));
  host::loss(Loss::sum, y.data(), nullptr, dy.data(), out.data(), rows, cols, scale);
  expect_close(out, {scale * sum}, "sum loss");
  expect_close(dy, std::vector<double>(n, scale), "sum loss dy");

  // Forward: the value alone. Backward: the gradient alone, without y.
  std::vector<float> out2(1, std::nanf(""));
  host::loss(Loss::sum, y.data(), nullptr, nullptr, out2.data(), rows, cols, scale);
  expect_close(out2, {scale * sum}, "sum loss, value only");
  std::vector<float> dy2(n, std::nanf(""));
  host::loss(Loss::sum, nullptr, nullptr, dy2.data(), nullptr, rows, cols, scale);
  expect_close(dy2, std::vector<double>(n, scale), "sum loss, gradient only");
}

TEST(HostOps, LossMse) {
  const int rows = 16, cols = 33;
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  const std::vector<float> y = random_floats(n, 51, -2.0f, 2.0f);
  const std::vector<float> t = random_floats(n, 52);
  ASSERT_FALSE(all_zero(y));
  ASSERT_FALSE(all_zero(t));
  const float scale = 0.375f;  // a micro-batch's share of the batch (rows / B)
  double acc = 0.0;
  std::vector<double> dref(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(y[i]) - t[i];
    acc += d * d;
    dref[i] = 2.0 * d * scale / static_cast<double>(n);
  }
  std::vector<float> dy(n, std::nanf(""));
  std::vector<float> out(1, std::nanf(""));
  host::loss(Loss::mse, y.data(), t.data(), dy.data(), out.data(), rows, cols, scale);
  expect_close(out, {scale * acc / static_cast<double>(n)}, "mse loss");
  // dy is ~1e-3: compare tightly in relative terms rather than under a 1e-5 atol.
  expect_close(dy, dref, "mse loss dy", nullptr, 1e-9, kRtol);

  std::vector<float> out2(1, std::nanf(""));
  host::loss(Loss::mse, y.data(), t.data(), nullptr, out2.data(), rows, cols, scale);
  expect_close(out2, {scale * acc / static_cast<double>(n)}, "mse loss, value only");
  std::vector<float> dy2(n, std::nanf(""));
  host::loss(Loss::mse, y.data(), t.data(), dy2.data(), nullptr, rows, cols, scale);
  expect_close(dy2, dref, "mse loss, gradient only", nullptr, 1e-9, kRtol);
}

// ---- CpuBackend ------------------------------------------------------------------------

TEST(CpuBackend, AllocTracksRequestedAndRoundedBytes) {
  CpuBackend be;
  EXPECT_EQ(be.name(), "cpu");
  {
    Buffer p = be.alloc(Category::param, 1000);   // 4000 B -> 4032 rounded
    Buffer t = be.alloc(Category::temp, 1);       // 4 B -> 64 rounded
    Buffer o = be.alloc(Category::optim, 16);     // 64 B exactly
    ASSERT_TRUE(p && t && o);
    for (const Buffer* b : {&p, &t, &o})
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b->data()) % CpuBackend::kAlignment, 0u);
    EXPECT_EQ(p.bytes(), 4000);
    EXPECT_EQ(be.tracker().current()[Category::param], 4000);
    EXPECT_EQ(be.tracker().current()[Category::temp], 4);
    EXPECT_EQ(be.tracker().current()[Category::optim], 64);
    EXPECT_EQ(be.tracker().current_total(), 4068);
    EXPECT_EQ(be.tracker().rounded_current(), 4032 + 64 + 64);
    EXPECT_EQ(be.tracker().live_allocations(), 3);
    // The memory is really there: write all of it.
    be.fill(p.data(), 1.0f, p.count());
    EXPECT_EQ(p.data()[999], 1.0f);
  }
  EXPECT_EQ(be.tracker().current_total(), 0);
  EXPECT_EQ(be.tracker().rounded_current(), 0);
  EXPECT_EQ(be.tracker().live_allocations(), 0);
  EXPECT_EQ(be.tracker().peak().total, 4068);
  EXPECT_EQ(be.tracker().rounded_peak(), 4160);
}

TEST(CpuBackend, ZeroCountAllocIsEmptyAndUntracked) {
  CpuBackend be;
  Buffer b = be.alloc(Category::optim, 0);
  EXPECT_FALSE(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.count(), 0u);
  EXPECT_EQ(be.tracker().current_total(), 0);
  EXPECT_EQ(be.tracker().live_allocations(), 0);
  be.copy(b.data(), b.data(), 0);  // no-ops on empty buffers
  be.upload(b.data(), nullptr, 0);
}

TEST(CpuBackend, RoundedBytes) {
  CpuBackend be;
  EXPECT_EQ(be.rounded_bytes(0), 0);
  EXPECT_EQ(be.rounded_bytes(1), 64);
  EXPECT_EQ(be.rounded_bytes(64), 64);
  EXPECT_EQ(be.rounded_bytes(65), 128);
  EXPECT_EQ(be.rounded_bytes(8421440), 8421440);
}

TEST(CpuBackend, MathThroughTrackedBuffers) {
  CpuBackend be;
  const int m = 9, n = 11, k = 7;
  const std::vector<float> ha = random_floats(static_cast<std::size_t>(m) * k, 61);
  const std::vector<float> hb = random_floats(static_cast<std::size_t>(k) * n, 62);
  const std::vector<float> hbias = random_floats(n, 63);
  ASSERT_FALSE(all_zero(ha) || all_zero(hb) || all_zero(hbias));
  Buffer a = be.alloc(Category::activation, ha.size());
  Buffer b = be.alloc(Category::param, hb.size());
  Buffer bias = be.alloc(Category::param, hbias.size());
  Buffer c = be.alloc(Category::temp, static_cast<std::size_t>(m) * n);
  EXPECT_EQ(be.tracker().current_total(), 4 * static_cast<std::int64_t>(m * k + k * n + n + m * n));
  be.upload(a.data(), ha.data(), ha.size());
  be.upload(b.data(), hb.data(), hb.size());
  be.upload(bias.data(), hbias.data(), hbias.size());

  // y = relu(A B + bias)
  be.gemm(Trans::no, Trans::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
  be.bias_activation(c.data(), bias.data(), m, n, Activation::relu);
  be.synchronize();
  std::vector<float> y(static_cast<std::size_t>(m) * n);
  be.download(y.data(), c.data(), y.size());
  std::vector<double> ref(y.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = hbias[j];
      for (int p = 0; p < k; ++p) s += static_cast<double>(ha[i * k + p]) * hb[p * n + j];
      ref[static_cast<std::size_t>(i) * n + j] = s > 0.0 ? s : 0.0;
    }
  ASSERT_FALSE(all_zero(y));
  expect_close(y, ref, "cpu backend gemm+bias+relu");

  // relu_backward, bias_grad, loss through the backend.
  Buffer dz = be.alloc(Category::temp, y.size());
  be.fill(dz.data(), 2.0f, dz.count());
  be.relu_backward(dz.data(), c.data(), dz.count());
  Buffer db = be.alloc(Category::grad, static_cast<std::size_t>(n));
  be.bias_grad(db.data(), dz.data(), m, n, 0.0f);
  std::vector<float> hdb(n);
  be.download(hdb.data(), db.data(), hdb.size());
  std::vector<double> dbref(n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) dbref[j] += ref[static_cast<std::size_t>(i) * n + j] > 0.0 ? 2.0 : 0.0;
  ASSERT_FALSE(all_zero(hdb));
  expect_close(hdb, dbref, "cpu backend relu_backward+bias_grad");

  Buffer loss_out = be.alloc(Category::temp, 1);
  Buffer dy = be.alloc(Category::temp, y.size());
  be.loss(Loss::sum, c.data(), nullptr, dy.data(), loss_out.data(), m, n, 0.5f);
  double sum = 0.0;
  for (double v : ref) sum += v;
  expect_close({loss_out.data()[0]}, {0.5 * sum}, "cpu backend sum loss");
  EXPECT_EQ(dy.data()[0], 0.5f);
}

TEST(CpuBackend, CopyFillScaleAdd) {
  CpuBackend be;
  const std::size_t n = 257;
  const std::vector<float> hx = random_floats(n, 71), hy = random_floats(n, 72);
  ASSERT_FALSE(all_zero(hx) || all_zero(hy));
  Buffer x = be.alloc(Category::temp, n), y = be.alloc(Category::temp, n);
  be.upload(x.data(), hx.data(), n);
  be.upload(y.data(), hy.data(), n);
  be.scale(x.data(), -1.5f, n);
  be.add(x.data(), y.data(), n);  // x = -1.5 hx + hy
  std::vector<float> got(n);
  be.download(got.data(), x.data(), n);
  std::vector<double> ref(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = -1.5 * hx[i] + hy[i];
  expect_close(got, ref, "scale+add");
  be.copy(y.data(), x.data(), n);
  be.download(got.data(), y.data(), n);
  expect_close(got, ref, "copy");
  be.fill(y.data(), 3.25f, n);
  be.download(got.data(), y.data(), n);
  expect_close(got, std::vector<double>(n, 3.25), "fill");
}

TEST(CpuBackend, AdamWMatchesHostKernel) {
  CpuBackend be;
  const std::size_t n = 100;
  std::vector<float> p1 = random_floats(n, 81), g = random_floats(n, 82);
  std::vector<float> m1(n, 0.0f), v1(n, 0.0f);
  std::vector<float> p2 = p1, m2 = m1, v2 = v1;
  ASSERT_FALSE(all_zero(p1) || all_zero(g));
  const AdamWHyper h;
  be.adamw(h, {{p1.data(), g.data(), m1.data(), v1.data(), n, 1}});
  host::adamw(h, {{p2.data(), g.data(), m2.data(), v2.data(), n, 1}});
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
  EXPECT_NE(p1, random_floats(n, 81));  // it did update
}

TEST(CpuBackend, MakeBackendByName) {
  auto be = make_backend("cpu", 0);
  ASSERT_TRUE(be);
  EXPECT_EQ(be->name(), "cpu");
  try {
    make_backend("tpu", 0);
    FAIL() << "unknown backend accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--backend"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'tpu'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("allowed: cpu"), std::string::npos) << e.what();
  }
  if (!cuda_built()) {
    EXPECT_THROW(make_backend("cuda", 0), UsageError);
    EXPECT_EQ(cuda_device_count(), 0);
  }
}

}  // namespace
}  // namespace shardscope
