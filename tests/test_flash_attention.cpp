// The CPU backend's flash attention (kernels/host_flash_attention.cpp): forward against
// float64 causal attention and against the math path built from the backend's own kernels
// (batched score GEMM, causal softmax, batched GEMM with v); backward against the float64
// gradients, the math path's backward and central finite differences. Shapes cross the
// tile size (host::kFlashBlock), with grouped-query heads and odd head_dim.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "harness/backends/cpu_backend.hpp"
#include "kernels/host_transformer.hpp"
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

std::size_t sz(long long n) { return static_cast<std::size_t>(n); }

struct Shape {
  int batch, seq, heads, kv_heads, head_dim;
  bool fused;  // GPT-2's (rows, 3h) qkv row; else q, k, v apart with padded rows
  std::string name() const {
    return "b" + std::to_string(batch) + " s" + std::to_string(seq) + " h" + std::to_string(heads) + " kv" +
           std::to_string(kv_heads) + " d" + std::to_string(head_dim) + (fused ? " fused" : " apart");
  }
};

// q, k and v in one buffer x: fused, one row of (heads + 2 kv_heads) head_dim per token;
// apart, three blocks of rows with 3 padding columns each (which no kernel may write).
// The gradients take the same layout in dx. out has 2 padding columns.
struct Problem {
  Shape s;
  std::int64_t rows;
  int ldq, ldk, ldv, ldo;
  std::size_t oq, ok, ov;  // offsets of q, k, v in x
  std::vector<float> x;

  explicit Problem(const Shape& shape, std::uint32_t seed) : s(shape), rows(std::int64_t{shape.batch} * shape.seq) {
    const int d = s.head_dim, hq = s.heads * d, hkv = s.kv_heads * d;
    if (s.fused) {
      ldq = ldk = ldv = hq + 2 * hkv;
      oq = 0;
      ok = sz(hq);
      ov = sz(hq + hkv);
      x = random_floats(sz(rows * ldq), seed, -1.5f, 1.5f);
    } else {
      ldq = hq + 3;
      ldk = ldv = hkv + 3;
      oq = 0;
      ok = sz(rows * ldq);
      ov = ok + sz(rows * ldk);
      x = random_floats(ov + sz(rows * ldv), seed, -1.5f, 1.5f);
    }
    ldo = hq + 2;
  }
  std::size_t out_size() const { return sz(rows * ldo); }
  std::size_t lse_size() const { return sz(std::int64_t{s.batch} * s.heads * s.seq); }
  AttentionArgs args(const float* base) const {
    AttentionArgs a;
    a.batch = s.batch;
    a.seq = s.seq;
    a.heads = s.heads;
    a.kv_heads = s.kv_heads;
    a.head_dim = s.head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    a.q = base + oq;
    a.ldq = ldq;
    a.k = base + ok;
    a.ldk = ldk;
    a.v = base + ov;
    a.ldv = ldv;
    return a;
  }
  // Element e of head h at token (b, i) of q, k, v, out.
  std::size_t iq(int b, int i, int h, int e) const { return oq + sz((b * s.seq + i) * ldq + h * s.head_dim + e); }
  std::size_t ik(int b, int i, int h, int e) const { return ok + sz((b * s.seq + i) * ldk + h * s.head_dim + e); }
  std::size_t iv(int b, int i, int h, int e) const { return ov + sz((b * s.seq + i) * ldv + h * s.head_dim + e); }
  std::size_t io(int b, int i, int h, int e) const { return sz((b * s.seq + i) * ldo + h * s.head_dim + e); }
  // Whether x's element i is padding (a column no head owns).
  bool padding(std::size_t i) const {
    if (s.fused) return false;
    const int hq = s.heads * s.head_dim, hkv = s.kv_heads * s.head_dim;
    if (i < ok) return static_cast<int>(i % sz(ldq)) >= hq;
    if (i < ov) return static_cast<int>((i - ok) % sz(ldk)) >= hkv;
    return static_cast<int>((i - ov) % sz(ldv)) >= hkv;
  }
};

struct Forward {
  std::vector<float> out, lse;
};

Forward flash_forward(CpuBackend& cpu, const Problem& p) {
  Forward f{std::vector<float>(p.out_size(), 0.0f), std::vector<float>(p.lse_size(), 0.0f)};
  cpu.flash_attention_forward(p.args(p.x.data()), f.out.data(), p.ldo, f.lse.data());
  return f;
}

// Float64 causal attention and its gradients from dout, in x's and out's layouts.
struct Reference {
  std::vector<double> out, lse, dx;
};

Reference reference(const Problem& p, const std::vector<float>& dout) {
  const Shape& s = p.s;
  const int d = s.head_dim, group = s.heads / s.kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Reference r{std::vector<double>(p.out_size(), 0.0), std::vector<double>(p.lse_size()),
              std::vector<double>(p.x.size(), 0.0)};
  for (std::size_t i = 0; i < p.x.size(); ++i)
    if (p.padding(i)) r.dx[i] = p.x[i];  // padding must come back as it was
  std::vector<double> prob(sz(s.seq)), dprob(sz(s.seq));
  for (int b = 0; b < s.batch; ++b)
    for (int h = 0; h < s.heads; ++h) {
      const int g = h / group;
      for (int i = 0; i < s.seq; ++i) {
        double mx = -1e300;
        for (int c = 0; c <= i; ++c) {
          double dot = 0.0;
          for (int e = 0; e < d; ++e) dot += static_cast<double>(p.x[p.iq(b, i, h, e)]) * p.x[p.ik(b, c, g, e)];
          prob[sz(c)] = scale * dot;
          mx = std::max(mx, prob[sz(c)]);
        }
        double sum = 0.0;
        for (int c = 0; c <= i; ++c) sum += std::exp(prob[sz(c)] - mx);
        r.lse[sz((b * s.heads + h) * s.seq + i)] = mx + std::log(sum);
        for (int c = 0; c <= i; ++c) prob[sz(c)] = std::exp(prob[sz(c)] - mx) / sum;
        for (int c = 0; c <= i; ++c)
          for (int e = 0; e < d; ++e) r.out[p.io(b, i, h, e)] += prob[sz(c)] * p.x[p.iv(b, c, g, e)];
        // dP = dout v^T, D = sum(P dP), dS = P (dP - D)
        double D = 0.0;
        for (int c = 0; c <= i; ++c) {
          double dot = 0.0;
          for (int e = 0; e < d; ++e) dot += static_cast<double>(dout[p.io(b, i, h, e)]) * p.x[p.iv(b, c, g, e)];
          dprob[sz(c)] = dot;
          D += prob[sz(c)] * dot;
        }
        for (int c = 0; c <= i; ++c) {
          const double ds = prob[sz(c)] * (dprob[sz(c)] - D);
          for (int e = 0; e < d; ++e) {
            r.dx[p.iq(b, i, h, e)] += scale * ds * p.x[p.ik(b, c, g, e)];
            r.dx[p.ik(b, c, g, e)] += scale * ds * p.x[p.iq(b, i, h, e)];
            r.dx[p.iv(b, c, g, e)] += prob[sz(c)] * dout[p.io(b, i, h, e)];
          }
        }
      }
    }
  return r;
}

// Attention as the math mode runs it, from the backend's kernels: q, k, v permuted
// head-major; per (batch, kv head), the group's query heads stacked as one (group * seq,
// head_dim) matrix, so one batched GEMM serves grouped-query attention.
struct MathAttention {
  CpuBackend& cpu;
  const Problem& p;
  int d, group, seq;
  std::vector<float> qh, kh, vh, probs;

  MathAttention(CpuBackend& c, const Problem& pr)
      : cpu(c), p(pr), d(pr.s.head_dim), group(pr.s.heads / pr.s.kv_heads), seq(pr.s.seq) {
    const Shape& s = p.s;
    qh.resize(sz(p.rows * s.heads * d));
    kh.resize(sz(p.rows * s.kv_heads * d));
    vh.resize(kh.size());
    probs.resize(sz(std::int64_t{s.batch} * s.heads * seq * seq));
    cpu.permute_heads(qh.data(), p.x.data() + p.oq, p.ldq, s.batch, seq, s.heads, d, true);
    cpu.permute_heads(kh.data(), p.x.data() + p.ok, p.ldk, s.batch, seq, s.kv_heads, d, true);
    cpu.permute_heads(vh.data(), p.x.data() + p.ov, p.ldv, s.batch, seq, s.kv_heads, d, true);
  }
  int count() const { return p.s.batch * p.s.kv_heads; }
  std::int64_t stacked(int cols) const { return std::int64_t{group} * seq * cols; }  // one group's stride
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(d)); }

  std::vector<float> forward() {
    cpu.gemm_batched(Trans::no, Trans::yes, group * seq, seq, d, 1.0f, qh.data(), d, stacked(d), kh.data(), d,
                     std::int64_t{seq} * d, 0.0f, probs.data(), seq, stacked(seq), count());
    cpu.causal_softmax_forward(probs.data(), p.s.batch * p.s.heads, seq, scale());
    std::vector<float> oh(qh.size()), out(p.out_size(), 0.0f);
    cpu.gemm_batched(Trans::no, Trans::no, group * seq, d, seq, 1.0f, probs.data(), seq, stacked(seq), vh.data(), d,
                     std::int64_t{seq} * d, 0.0f, oh.data(), d, stacked(d), count());
    cpu.permute_heads(out.data(), oh.data(), p.ldo, p.s.batch, seq, p.s.heads, d, false);
    return out;
  }

  // After forward(): the gradients in x's layout (padding kept from x).
  std::vector<float> backward(const std::vector<float>& dout) {
    const Shape& s = p.s;
    std::vector<float> doh(qh.size()), dp(probs.size()), dqh(qh.size()), dkh(kh.size()), dvh(vh.size());
    cpu.permute_heads(doh.data(), dout.data(), p.ldo, s.batch, seq, s.heads, d, true);
    const std::int64_t kv_stride = std::int64_t{seq} * d;
    // dv = P^T dout over the group's stacked rows; dP = dout v^T; dS = softmax backward
    cpu.gemm_batched(Trans::yes, Trans::no, seq, d, group * seq, 1.0f, probs.data(), seq, stacked(seq), doh.data(),
                     d, stacked(d), 0.0f, dvh.data(), d, kv_stride, count());
    cpu.gemm_batched(Trans::no, Trans::yes, group * seq, seq, d, 1.0f, doh.data(), d, stacked(d), vh.data(), d,
                     kv_stride, 0.0f, dp.data(), seq, stacked(seq), count());
    cpu.softmax_backward(dp.data(), probs.data(), std::int64_t{s.batch} * s.heads * seq, seq);
    cpu.gemm_batched(Trans::no, Trans::no, group * seq, d, seq, scale(), dp.data(), seq, stacked(seq), kh.data(), d,
                     kv_stride, 0.0f, dqh.data(), d, stacked(d), count());
    cpu.gemm_batched(Trans::yes, Trans::no, seq, d, group * seq, scale(), dp.data(), seq, stacked(seq), qh.data(), d,
                     stacked(d), 0.0f, dkh.data(), d, kv_stride, count());
    std::vector<float> dx = p.x;
    cpu.permute_heads(dx.data() + p.oq, dqh.data(), p.ldq, s.batch, seq, s.heads, d, false);
    cpu.permute_heads(dx.data() + p.ok, dkh.data(), p.ldk, s.batch, seq, s.kv_heads, d, false);
    cpu.permute_heads(dx.data() + p.ov, dvh.data(), p.ldv, s.batch, seq, s.kv_heads, d, false);
    return dx;
  }
};

std::vector<Shape> shapes() {
  const int t = host::kFlashBlock;
  return {
      {2, t + 3, 4, 2, 13, false},      // GQA (2 query heads per kv head), seq past one tile, odd head_dim
      {1, 2 * t + 5, 4, 1, 8, true},    // one kv head, three query blocks, fused qkv
      {2, t, 2, 2, t + 1, true},        // plain multi-head, seq exactly one tile, head_dim past it
      {1, 7, 3, 3, 5, false},           // shorter than a tile
  };
}

// out to 1e-5 relative of float64 attention (atol 1e-6 for outputs near 0), lse to the
// log-sum-exp, and equal to the math path.
TEST(FlashAttention, ForwardEqualsMathAttention) {
  CpuBackend cpu;
  std::uint32_t seed = 100;
  for (const Shape& s : shapes()) {
    Problem p(s, seed++);
    const Forward f = flash_forward(cpu, p);
    ASSERT_FALSE(all_zero(f.out)) << s.name();
    const Reference r = reference(p, std::vector<float>(p.out_size(), 0.0f));
    expect_near_all(f.out, r.out, "flash out " + s.name(), 1e-6, 1e-5);
    expect_near_all(f.lse, r.lse, "flash lse " + s.name(), 1e-6, 1e-5);
    MathAttention math(cpu, p);
    const auto math_out = math.forward();
    expect_near_all(math_out, r.out, "math out " + s.name(), 1e-6, 1e-5);
  }
}

// dq, dk, dv (a kv head's summed over its query heads) against float64 and the math
// path's backward; padding columns untouched.
TEST(FlashAttention, BackwardEqualsMathAttentionBackward) {
  CpuBackend cpu;
  std::uint32_t seed = 200;
  for (const Shape& s : shapes()) {
    Problem p(s, seed++);
    const Forward f = flash_forward(cpu, p);
    const auto dout = random_floats(p.out_size(), seed++);
    const Reference r = reference(p, dout);
    std::vector<float> dx = p.x;  // padding columns hold x's values, which must stay
    const AttentionArgs a = p.args(p.x.data());
    cpu.flash_attention_backward(a, f.out.data(), p.ldo, dout.data(), f.lse.data(), dx.data() + p.oq,
                                 dx.data() + p.ok, dx.data() + p.ov);
    ASSERT_FALSE(all_zero(dx)) << s.name();
    expect_near_all(dx, r.dx, "flash dq dk dv " + s.name(), 1e-5, 1e-4);
    MathAttention math(cpu, p);
    math.forward();
    expect_near_all(math.backward(dout), r.dx, "math dq dk dv " + s.name(), 1e-5, 1e-4);
  }
}

// Central differences of sum(w * flash_forward(x)) at samples of q, k and v.
TEST(FlashAttention, BackwardMatchesFiniteDifferences) {
  CpuBackend cpu;
  for (const Shape& s : {Shape{1, host::kFlashBlock + 6, 4, 2, 5, false}, Shape{2, 9, 2, 1, 3, true}}) {
    Problem p(s, 300);
    const auto w = random_floats(p.out_size(), 301);
    const Forward f = flash_forward(cpu, p);
    std::vector<float> dx(p.x.size(), 0.0f);
    cpu.flash_attention_backward(p.args(p.x.data()), f.out.data(), p.ldo, w.data(), f.lse.data(), dx.data() + p.oq,
                                 dx.data() + p.ok, dx.data() + p.ov);
    std::vector<std::size_t> at;
    for (std::size_t i : sample_indices(p.x.size(), 400))
      if (!p.padding(i)) at.push_back(i);
    const auto numeric = central_differences(p.x, at, 1e-3f, [&] { return weighted_sum(flash_forward(cpu, p).out, w); });
    expect_gradient(dx, at, numeric, "flash backward " + s.name());
  }
}

}  // namespace
}  // namespace shardscope
