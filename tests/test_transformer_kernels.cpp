// The CPU backend's transformer kernels (kernels/host_transformer.hpp) against float64
// references written here, and every backward against central finite differences of its
// forward (support/grad_check.hpp). Flash attention: test_flash_attention.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "kernels/elementwise.hpp"
#include "shardscope/check.hpp"
#include "support/grad_check.hpp"
#include "support/random_data.hpp"

namespace shardscope {
namespace {

using testing::all_zero;
using testing::central_differences;
using testing::expect_gradient;
using testing::expect_near_all;
using testing::random_floats;
using testing::sample_indices;
using testing::weighted_sum;

constexpr double kAtol = 1e-6;
constexpr double kRtol = 1e-5;
constexpr float kEps = 1e-3f;  // finite-difference step
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::size_t sz(long long n) { return static_cast<std::size_t>(n); }

std::vector<std::int64_t> random_ids(std::size_t n, int vocab, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> dist(0, vocab - 1);
  std::vector<std::int64_t> ids(n);
  for (auto& id : ids) id = dist(gen);
  return ids;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ---- the host's vectorisable exp and tanh (elementwise.hpp) ----------------------------

TEST(TransformerKernels, FastExpAndTanhAccuracy) {
  double worst_exp_ulp = 0.0, worst_tanh = 0.0;
  for (float x = -87.0f; x <= 88.0f; x += 0.00731f) {
    const double e = std::exp(static_cast<double>(x));
    const auto ef = static_cast<float>(e);
    const double ulp = static_cast<double>(std::nextafter(ef, std::numeric_limits<float>::infinity())) - ef;
    worst_exp_ulp = std::max(worst_exp_ulp, std::fabs(math::fast_exp(x) - e) / ulp);
  }
  for (float x = -12.0f; x <= 12.0f; x += 0.000913f)
    worst_tanh = std::max(worst_tanh, std::fabs(math::fast_tanh(x) - std::tanh(static_cast<double>(x))));
  EXPECT_LE(worst_exp_ulp, 2.0);
  EXPECT_LE(worst_tanh, 2e-7);
  EXPECT_EQ(math::fast_exp(0.0f), 1.0f);
  EXPECT_EQ(math::fast_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(math::fast_exp(-100.0f), 0.0f);
  EXPECT_EQ(math::fast_exp(100.0f), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(math::fast_exp(kNaN)));
  EXPECT_TRUE(std::isnan(math::fast_tanh(kNaN)));
  EXPECT_EQ(math::fast_tanh(std::numeric_limits<float>::infinity()), 1.0f);
  EXPECT_EQ(math::fast_tanh(-std::numeric_limits<float>::infinity()), -1.0f);
}

// ---- batched GEMM ---------------------------------------------------------------------

TEST(TransformerKernels, GemmBatchedEveryMatrix) {
  CpuBackend cpu;
  const int batch = 3, m = 7, n = 11, k = 5, pad = 2;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (bool shared_b : {false, true}) {  // stride_b 0: one B for every matrix
        const int lda = (ta == Trans::no ? k : m) + pad, ldb = (tb == Trans::no ? n : k) + pad, ldc = n + pad;
        const std::int64_t sa = (ta == Trans::no ? m : k) * lda, sb = shared_b ? 0 : (tb == Trans::no ? k : n) * ldb,
                           sc = m * ldc;
        const auto a = random_floats(sz(batch * sa), 1);
        const auto b = random_floats(sz(shared_b ? (tb == Trans::no ? k : n) * ldb : batch * sb), 2);
        auto c = random_floats(sz(batch * sc), 3);
        std::vector<double> ref = widen(c);  // padding comes back untouched
        const float alpha = 0.5f, beta = -1.5f;
        for (int i = 0; i < batch; ++i)
          for (int r = 0; r < m; ++r)
            for (int col = 0; col < n; ++col) {
              double s = 0.0;
              for (int p = 0; p < k; ++p) {
                const double av = ta == Trans::no ? a[sz(i * sa + r * lda + p)] : a[sz(i * sa + p * lda + r)];
                const double bv = tb == Trans::no ? b[sz(i * sb + p * ldb + col)] : b[sz(i * sb + col * ldb + p)];
                s += av * bv;
              }
              const std::size_t at = sz(i * sc + r * ldc + col);
              ref[at] = alpha * s + beta * static_cast<double>(c[at]);
            }
        cpu.gemm_batched(ta, tb, m, n, k, alpha, a.data(), lda, sa, b.data(), ldb, sb, beta, c.data(), ldc, sc,
                         batch);
        expect_near_all(c, ref, std::string("gemm_batched ta=") + (ta == Trans::yes ? "T" : "N") +
                                    " tb=" + (tb == Trans::yes ? "T" : "N") + (shared_b ? " shared B" : ""),
                        1e-5, 1e-5);
      }
}

// ---- embeddings and positions ---------------------------------------------------------

TEST(TransformerKernels, EmbeddingForwardGathersRows) {
  CpuBackend cpu;
  const int vocab = 13, dim = 7, rows = 20;
  const auto table = random_floats(sz(vocab * dim), 4);
  const auto ids = random_ids(rows, vocab, 5);
  std::vector<float> out(sz(rows * dim), kNaN);
  cpu.embedding_forward(out.data(), ids.data(), table.data(), rows, dim);
  std::vector<double> ref(out.size());
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < dim; ++j) ref[sz(i * dim + j)] = table[sz(ids[sz(i)] * dim + j)];
  expect_near_all(out, ref, "embedding_forward", 0.0, 0.0);
}

// Repeated ids sum; beta 0 overwrites the whole table (NaN included, rows no id names
// become 0); beta 1 adds to what it held.
TEST(TransformerKernels, EmbeddingBackwardSumsRepeatedIds) {
  CpuBackend cpu;
  const int vocab = 9, dim = 5, rows = 12;
  std::vector<std::int64_t> ids = {3, 1, 3, 3, 0, 7, 1, 3, 0, 7, 7, 3};  // 2, 4, 5, 6, 8 never named
  const auto dy = random_floats(sz(rows * dim), 6);
  ASSERT_FALSE(all_zero(dy));
  auto ref_for = [&](const std::vector<double>& start) {
    std::vector<double> ref = start;
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < dim; ++j) ref[sz(ids[sz(i)] * dim + j)] += dy[sz(i * dim + j)];
    return ref;
  };
  std::vector<float> dtable(sz(vocab * dim), kNaN);
  cpu.embedding_backward(dtable.data(), ids.data(), dy.data(), rows, dim, vocab, 0.0f);
  expect_near_all(dtable, ref_for(std::vector<double>(dtable.size(), 0.0)), "embedding_backward beta 0", 1e-6, 1e-6);
  EXPECT_EQ(dtable[sz(2 * dim)], 0.0f);

  const auto held = random_floats(dtable.size(), 7);
  dtable = held;
  cpu.embedding_backward(dtable.data(), ids.data(), dy.data(), rows, dim, vocab, 1.0f);
  expect_near_all(dtable, ref_for(widen(held)), "embedding_backward beta 1", 1e-6, 1e-6);

  ids[4] = vocab;  // out of range: refused, not written out of bounds
  EXPECT_THROW(cpu.embedding_backward(dtable.data(), ids.data(), dy.data(), rows, dim, vocab, 1.0f), RunError);
}

TEST(TransformerKernels, PositionsAddAndBackward) {
  CpuBackend cpu;
  const int batch = 3, seq = 5, dim = 7;
  const auto pos = random_floats(sz(seq * dim), 8);
  auto x = random_floats(sz(batch * seq * dim), 9);
  std::vector<double> ref(x.size());
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seq; ++s)
      for (int j = 0; j < dim; ++j)
        ref[sz((b * seq + s) * dim + j)] = static_cast<double>(x[sz((b * seq + s) * dim + j)]) + pos[sz(s * dim + j)];
  cpu.add_positions(x.data(), pos.data(), batch, seq, dim);
  expect_near_all(x, ref, "add_positions", 0.0, 1e-7);

  const auto dy = random_floats(x.size(), 10);
  for (float beta : {0.0f, 1.0f}) {
    const auto held = random_floats(pos.size(), 11);
    std::vector<float> dpos = beta == 0.0f ? std::vector<float>(pos.size(), kNaN) : held;
    std::vector<double> want(pos.size());
    for (int s = 0; s < seq; ++s)
      for (int j = 0; j < dim; ++j) {
        double acc = beta == 0.0f ? 0.0 : held[sz(s * dim + j)];
        for (int b = 0; b < batch; ++b) acc += dy[sz((b * seq + s) * dim + j)];
        want[sz(s * dim + j)] = acc;
      }
    cpu.positions_backward(dpos.data(), dy.data(), batch, seq, dim, beta);
    expect_near_all(dpos, want, "positions_backward beta " + std::to_string(beta), 1e-6, 1e-6);
  }
}

// ---- norms ----------------------------------------------------------------------------

TEST(TransformerKernels, LayerNormForwardMatchesTorchDefinition) {
  CpuBackend cpu;
  const int rows = 6, dim = 37;
  const float eps = 1e-5f;
  auto x = random_floats(sz(rows * dim), 12, -2.0f, 3.0f);
  const auto gamma = random_floats(dim, 13, 0.5f, 1.5f), bias = random_floats(dim, 14);
  std::vector<float> y(x.size()), mean(rows), rstd(rows);
  cpu.layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), bias.data(), rows, dim, eps);
  std::vector<double> ry(y.size()), rmean(rows), rrstd(rows);
  for (int r = 0; r < rows; ++r) {
    double mu = 0.0, var = 0.0;
    for (int j = 0; j < dim; ++j) mu += x[sz(r * dim + j)];
    mu /= dim;
    for (int j = 0; j < dim; ++j) var += (x[sz(r * dim + j)] - mu) * (x[sz(r * dim + j)] - mu);
    var /= dim;  // biased, as torch
    rmean[sz(r)] = mu;
    rrstd[sz(r)] = 1.0 / std::sqrt(var + eps);
    for (int j = 0; j < dim; ++j)
      ry[sz(r * dim + j)] = (x[sz(r * dim + j)] - mu) * rrstd[sz(r)] * gamma[sz(j)] + bias[sz(j)];
  }
  expect_near_all(y, ry, "layer_norm y", kAtol, kRtol);
  expect_near_all(mean, rmean, "layer_norm mean", kAtol, kRtol);
  expect_near_all(rstd, rrstd, "layer_norm rstd", kAtol, kRtol);
}

TEST(TransformerKernels, LayerNormBackwardMatchesFiniteDifferences) {
  CpuBackend cpu;
  const int rows = 4, dim = 13;
  const float eps = 1e-5f;
  auto x = random_floats(sz(rows * dim), 15, -2.0f, 2.0f);
  auto gamma = random_floats(dim, 16, 0.5f, 1.5f), bias = random_floats(dim, 17);
  const auto w = random_floats(x.size(), 18);
  auto loss = [&] {
    std::vector<float> y(x.size()), mean(rows), rstd(rows);
    cpu.layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), bias.data(), rows, dim, eps);
    return weighted_sum(y, w);
  };
  std::vector<float> y(x.size()), mean(rows), rstd(rows), dx(x.size(), kNaN), dgamma(dim, kNaN), dbias(dim, kNaN);
  cpu.layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), gamma.data(), bias.data(), rows, dim, eps);
  cpu.layer_norm_backward(dx.data(), dgamma.data(), dbias.data(), w.data(), x.data(), mean.data(), rstd.data(),
                          gamma.data(), rows, dim, 0.0f);
  const auto all_x = sample_indices(x.size(), x.size()), all_p = sample_indices(sz(dim), sz(dim));
  expect_gradient(dx, all_x, central_differences(x, all_x, kEps, loss), "layer_norm dx");
  expect_gradient(dgamma, all_p, central_differences(gamma, all_p, kEps, loss), "layer_norm dgamma");
  expect_gradient(dbias, all_p, central_differences(bias, all_p, kEps, loss), "layer_norm dbias");

  // beta 1 adds this batch's gradient to what the parameters' gradients held.
  const auto g0 = random_floats(dim, 19), b0 = random_floats(dim, 20);
  std::vector<float> dgamma2 = g0, dbias2 = b0;
  cpu.layer_norm_backward(dx.data(), dgamma2.data(), dbias2.data(), w.data(), x.data(), mean.data(), rstd.data(),
                          gamma.data(), rows, dim, 1.0f);
  std::vector<double> want_g(sz(dim)), want_b(sz(dim));
  for (int j = 0; j < dim; ++j) {
    want_g[sz(j)] = static_cast<double>(g0[sz(j)]) + dgamma[sz(j)];
    want_b[sz(j)] = static_cast<double>(b0[sz(j)]) + dbias[sz(j)];
  }
  expect_near_all(dgamma2, want_g, "layer_norm dgamma beta 1", 1e-6, 1e-6);
  expect_near_all(dbias2, want_b, "layer_norm dbias beta 1", 1e-6, 1e-6);
}

TEST(TransformerKernels, RmsNormForwardMatchesDefinition) {
  CpuBackend cpu;
  const int rows = 5, dim = 29;
  const float eps = 1e-6f;
  const auto x = random_floats(sz(rows * dim), 21, -2.0f, 2.0f);
  const auto gamma = random_floats(dim, 22, 0.5f, 1.5f);
  std::vector<float> y(x.size()), rstd(rows);
  cpu.rms_norm_forward(y.data(), rstd.data(), x.data(), gamma.data(), rows, dim, eps);
  std::vector<double> ry(y.size()), rr(rows);
  for (int r = 0; r < rows; ++r) {
    double ms = 0.0;
    for (int j = 0; j < dim; ++j) ms += static_cast<double>(x[sz(r * dim + j)]) * x[sz(r * dim + j)];
    rr[sz(r)] = 1.0 / std::sqrt(ms / dim + eps);
    for (int j = 0; j < dim; ++j) ry[sz(r * dim + j)] = gamma[sz(j)] * (x[sz(r * dim + j)] * rr[sz(r)]);
  }
  expect_near_all(y, ry, "rms_norm y", kAtol, kRtol);
  expect_near_all(rstd, rr, "rms_norm rstd", kAtol, kRtol);
}

TEST(TransformerKernels, RmsNormBackwardMatchesFiniteDifferences) {
  CpuBackend cpu;
  const int rows = 4, dim = 11;
  const float eps = 1e-6f;
  auto x = random_floats(sz(rows * dim), 23, -2.0f, 2.0f);
  auto gamma = random_floats(dim, 24, 0.5f, 1.5f);
  const auto w = random_floats(x.size(), 25);
  auto loss = [&] {
    std::vector<float> y(x.size()), rstd(rows);
    cpu.rms_norm_forward(y.data(), rstd.data(), x.data(), gamma.data(), rows, dim, eps);
    return weighted_sum(y, w);
  };
  std::vector<float> y(x.size()), rstd(rows), dx(x.size(), kNaN), dgamma(dim, kNaN);
  cpu.rms_norm_forward(y.data(), rstd.data(), x.data(), gamma.data(), rows, dim, eps);
  cpu.rms_norm_backward(dx.data(), dgamma.data(), w.data(), x.data(), rstd.data(), gamma.data(), rows, dim, 0.0f);
  const auto all_x = sample_indices(x.size(), x.size()), all_p = sample_indices(sz(dim), sz(dim));
  expect_gradient(dx, all_x, central_differences(x, all_x, kEps, loss), "rms_norm dx");
  expect_gradient(dgamma, all_p, central_differences(gamma, all_p, kEps, loss), "rms_norm dgamma");

  const auto g0 = random_floats(dim, 26);
  std::vector<float> dgamma2 = g0;
  cpu.rms_norm_backward(dx.data(), dgamma2.data(), w.data(), x.data(), rstd.data(), gamma.data(), rows, dim, 1.0f);
  std::vector<double> want(sz(dim));
  for (int j = 0; j < dim; ++j) want[sz(j)] = static_cast<double>(g0[sz(j)]) + dgamma[sz(j)];
  expect_near_all(dgamma2, want, "rms_norm dgamma beta 1", 1e-6, 1e-6);
}

// ---- element-wise ---------------------------------------------------------------------

using Unary = void (CpuBackend::*)(float*, const float*, std::size_t);
using UnaryBackward = void (CpuBackend::*)(float*, const float*, const float*, std::size_t);

// Forward against `f` in double; backward against finite differences, then again in
// place (dx = dy), which the interface allows.
void check_activation(Unary forward, UnaryBackward backward, double (*f)(double), const char* name) {
  CpuBackend cpu;
  const std::size_t n = 203;
  auto x = random_floats(n, 27, -4.0f, 4.0f);
  std::vector<float> y(n);
  (cpu.*forward)(y.data(), x.data(), n);
  std::vector<double> ref(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = f(x[i]);
  expect_near_all(y, ref, std::string(name) + " forward", kAtol, kRtol);

  const auto w = random_floats(n, 28);
  std::vector<float> dx(n, kNaN);
  (cpu.*backward)(dx.data(), w.data(), x.data(), n);
  const auto all = sample_indices(n, n);
  const auto numeric = central_differences(x, all, kEps, [&] {
    std::vector<float> out(n);
    (cpu.*forward)(out.data(), x.data(), n);
    return weighted_sum(out, w);
  });
  expect_gradient(dx, all, numeric, std::string(name) + " backward");
  std::vector<float> in_place = w;
  (cpu.*backward)(in_place.data(), in_place.data(), x.data(), n);
  expect_near_all(in_place, widen(dx), std::string(name) + " backward in place", 0.0, 0.0);
}

TEST(TransformerKernels, GeluTanhForwardAndBackward) {
  check_activation(&CpuBackend::gelu_tanh_forward, &CpuBackend::gelu_tanh_backward,
                   [](double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::acos(-1.0)) * (x + 0.044715 * x * x * x))); },
                   "gelu_tanh");
}

TEST(TransformerKernels, SiluForwardAndBackward) {
  check_activation(&CpuBackend::silu_forward, &CpuBackend::silu_backward,
                   [](double x) { return x / (1.0 + std::exp(-x)); }, "silu");
}

TEST(TransformerKernels, MulElementwiseInPlace) {
  CpuBackend cpu;
  const std::size_t n = 77;
  auto a = random_floats(n, 29);
  const auto b = random_floats(n, 30);
  std::vector<double> ref(n);
  for (std::size_t i = 0; i < n; ++i) ref[i] = static_cast<double>(a[i]) * b[i];
  std::vector<float> out(n);
  cpu.mul(out.data(), a.data(), b.data(), n);
  expect_near_all(out, ref, "mul", 0.0, 1e-7);
  cpu.mul(a.data(), a.data(), b.data(), n);  // out = a
  expect_near_all(a, ref, "mul in place", 0.0, 1e-7);
}

// ---- rotary embedding -----------------------------------------------------------------

// Heads 3 of head_dim 10 in rows of ld 3 * 10 + 4 (the 4 padding columns untouched).
TEST(TransformerKernels, RopeRotatesPairsAndInverseIsItsBackward) {
  CpuBackend cpu;
  const int batch = 2, seq = 9, heads = 3, d = 10, ld = heads * d + 4, half = d / 2;
  const float theta = 10000.0f;
  auto x = random_floats(sz(batch * seq * ld), 31);
  const auto x0 = x;
  std::vector<double> ref = widen(x0);
  for (int b = 0; b < batch; ++b)
    for (int s = 0; s < seq; ++s)
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < half; ++i) {
          const double angle = s * std::pow(static_cast<double>(theta), -2.0 * i / d);
          const std::size_t lo = sz((b * seq + s) * ld + h * d + i), hi = lo + sz(half);
          ref[lo] = x0[lo] * std::cos(angle) - x0[hi] * std::sin(angle);
          ref[hi] = x0[hi] * std::cos(angle) + x0[lo] * std::sin(angle);
        }
  cpu.rope(x.data(), ld, batch, seq, heads, d, theta, false);
  expect_near_all(x, ref, "rope", 1e-6, 1e-5);
  cpu.rope(x.data(), ld, batch, seq, heads, d, theta, true);
  expect_near_all(x, widen(x0), "rope then inverse", 1e-6, 1e-5);

  // The inverse applied to dy is the gradient of sum(dy * rope(x)).
  const auto w = random_floats(x.size(), 32);
  std::vector<float> grad = w;
  cpu.rope(grad.data(), ld, batch, seq, heads, d, theta, true);
  const auto at = sample_indices(x.size(), 150);
  const auto numeric = central_differences(x, at, kEps, [&] {
    std::vector<float> y = x;
    cpu.rope(y.data(), ld, batch, seq, heads, d, theta, false);
    return weighted_sum(y, w);
  });
  expect_gradient(grad, at, numeric, "rope backward");
}

// ---- softmax and head permutes --------------------------------------------------------

TEST(TransformerKernels, CausalSoftmaxForward) {
  CpuBackend cpu;
  const int count = 3, seq = 11;
  const float scale = 0.37f;
  auto p = random_floats(sz(count * seq * seq), 33, -4.0f, 4.0f);
  std::vector<double> ref(p.size(), 0.0);
  for (int c = 0; c < count; ++c)
    for (int i = 0; i < seq; ++i) {
      const std::size_t row = sz((c * seq + i) * seq);
      double mx = -1e300, sum = 0.0;
      for (int j = 0; j <= i; ++j) mx = std::max(mx, scale * static_cast<double>(p[row + sz(j)]));
      for (int j = 0; j <= i; ++j) sum += std::exp(scale * static_cast<double>(p[row + sz(j)]) - mx);
      for (int j = 0; j <= i; ++j) ref[row + sz(j)] = std::exp(scale * static_cast<double>(p[row + sz(j)]) - mx) / sum;
    }
  cpu.causal_softmax_forward(p.data(), count, seq, scale);
  expect_near_all(p, ref, "causal_softmax", kAtol, kRtol);
}

// softmax_backward gives the gradient at the scaled scores: times scale, at the scores.
TEST(TransformerKernels, SoftmaxBackwardMatchesFiniteDifferences) {
  CpuBackend cpu;
  const int count = 2, seq = 7;
  const float scale = 0.6f;
  auto s = random_floats(sz(count * seq * seq), 34, -2.0f, 2.0f);
  const auto w = random_floats(s.size(), 35);
  std::vector<float> p = s;
  cpu.causal_softmax_forward(p.data(), count, seq, scale);
  std::vector<float> grad = w;
  cpu.softmax_backward(grad.data(), p.data(), static_cast<std::int64_t>(count) * seq, seq);
  for (float& g : grad) g *= scale;
  const auto all = sample_indices(s.size(), s.size());
  const auto numeric = central_differences(s, all, kEps, [&] {
    std::vector<float> q = s;
    cpu.causal_softmax_forward(q.data(), count, seq, scale);
    return weighted_sum(q, w);
  });
  expect_gradient(grad, all, numeric, "softmax_backward");
}

TEST(TransformerKernels, PermuteHeadsBothWays) {
  CpuBackend cpu;
  const int batch = 2, seq = 5, heads = 3, d = 4, ld = heads * d * 3;  // a q view in a fused qkv row
  const auto tokens = random_floats(sz(batch * seq * ld), 36);
  std::vector<float> by_head(sz(batch * heads * seq * d), kNaN);
  cpu.permute_heads(by_head.data(), tokens.data(), ld, batch, seq, heads, d, true);
  std::vector<double> ref(by_head.size());
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < seq; ++s)
        for (int e = 0; e < d; ++e)
          ref[sz(((b * heads + h) * seq + s) * d + e)] = tokens[sz((b * seq + s) * ld + h * d + e)];
  expect_near_all(by_head, ref, "permute_heads to heads", 0.0, 0.0);

  std::vector<float> back(tokens.size(), 5.0f);  // the columns past heads * d stay 5
  cpu.permute_heads(back.data(), by_head.data(), ld, batch, seq, heads, d, false);
  std::vector<double> want(back.size(), 5.0);
  for (int r = 0; r < batch * seq; ++r)
    for (int c = 0; c < heads * d; ++c) want[sz(r * ld + c)] = tokens[sz(r * ld + c)];
  expect_near_all(back, want, "permute_heads to tokens", 0.0, 0.0);
}

// ---- cross-entropy --------------------------------------------------------------------

TEST(TransformerKernels, LogSoftmaxAndNllLoss) {
  CpuBackend cpu;
  const int rows = 6, cols = 37;
  const float scale = 0.5f;
  const auto logits = random_floats(sz(rows * cols), 37, -5.0f, 5.0f);
  const auto targets = random_ids(rows, cols, 38);
  std::vector<float> lp(logits.size());
  cpu.log_softmax_forward(lp.data(), logits.data(), rows, cols);
  std::vector<double> ref(lp.size());
  double nll = 0.0;
  for (int r = 0; r < rows; ++r) {
    double mx = -1e300, sum = 0.0;
    for (int j = 0; j < cols; ++j) mx = std::max(mx, static_cast<double>(logits[sz(r * cols + j)]));
    for (int j = 0; j < cols; ++j) sum += std::exp(logits[sz(r * cols + j)] - mx);
    for (int j = 0; j < cols; ++j) ref[sz(r * cols + j)] = logits[sz(r * cols + j)] - mx - std::log(sum);
    nll -= ref[sz(r * cols + targets[sz(r)])];
  }
  expect_near_all(lp, ref, "log_softmax", kAtol, kRtol);
  float loss = kNaN;
  cpu.nll_loss_forward(&loss, lp.data(), targets.data(), rows, cols, scale);
  EXPECT_NEAR(loss, scale * nll / rows, 1e-5 * std::fabs(scale * nll / rows));
}

// The gradient of scale * mean nll(log_softmax(logits)) at the logits, out of place and
// in place (dlogits = logprobs).
TEST(TransformerKernels, CrossEntropyBackwardMatchesFiniteDifferences) {
  CpuBackend cpu;
  const int rows = 5, cols = 23;
  const float scale = 2.5f;
  auto logits = random_floats(sz(rows * cols), 39, -3.0f, 3.0f);
  const auto targets = random_ids(rows, cols, 40);
  std::vector<float> lp(logits.size()), dlogits(logits.size(), kNaN);
  cpu.log_softmax_forward(lp.data(), logits.data(), rows, cols);
  cpu.cross_entropy_backward(dlogits.data(), lp.data(), targets.data(), rows, cols, scale);
  const auto all = sample_indices(logits.size(), logits.size());
  // A step of 1e-2: the loss comes back as one fp32 (nll_loss_forward), whose rounding
  // over 2e-3 would be a quarter of the smallest gradients' tolerance.
  const auto numeric = central_differences(logits, all, 1e-2f, [&] {
    std::vector<float> l(logits.size());
    cpu.log_softmax_forward(l.data(), logits.data(), rows, cols);
    float loss = 0.0f;
    cpu.nll_loss_forward(&loss, l.data(), targets.data(), rows, cols, scale);
    return static_cast<double>(loss);
  });
  expect_gradient(dlogits, all, numeric, "cross_entropy_backward");
  cpu.cross_entropy_backward(lp.data(), lp.data(), targets.data(), rows, cols, scale);
  expect_near_all(lp, widen(dlogits), "cross_entropy_backward in place", 0.0, 0.0);
}

}  // namespace
}  // namespace shardscope
