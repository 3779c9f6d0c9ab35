// The CUDA flash attention (kernels/cuda_flash_attention.hpp) against attention written
// out in double here (softmax of the causal scores, every gradient by its formula),
// against the CPU backend's flash attention, and against the math path on the GPU (head
// permutes, batched GEMMs, causal softmax). Shapes: grouped-query with separate q, k, v;
// multi-head from one fused qkv row; head_dim 128 (the kernel's limit) and one above it.
// Sequences are not multiples of the kernel's 16-row tiles. Skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_vs_cpu.hpp"
#include "shardscope/check.hpp"

namespace shardscope::testing {
namespace {

struct Shape {
  int batch, seq, heads, kv_heads, head_dim;
  bool fused;  // q, k, v in one (rows, 3 * heads * head_dim) buffer (needs kv_heads == heads)
};

// Where q, k, v (and their gradients) lie in the one or three buffers of a shape.
struct Layout {
  int ldq, ldk, ldv;
  std::size_t q_off, k_off, v_off;  // offsets into their buffers
  std::size_t q_size, k_size, v_size;
};

Layout layout_of(const Shape& s) {
  const std::size_t rows = static_cast<std::size_t>(s.batch) * s.seq;
  const int h = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  if (s.fused) return {3 * h, 3 * h, 3 * h, 0, static_cast<std::size_t>(h), static_cast<std::size_t>(2 * h), rows * 3 * h, 0, 0};
  return {h, kv, kv, 0, 0, 0, rows * h, rows * kv, rows * kv};
}

// out, lse and dq, dk, dv (each laid out as its input) by the definition, in double.
struct Reference {
  std::vector<float> out, lse, dq, dk, dv;
};

Reference attention_in_double(const Shape& s, const Layout& l, const std::vector<float>& q,
                              const std::vector<float>& k, const std::vector<float>& v,
                              const std::vector<float>& dout, int ldo, float scale) {
  const int hd = s.head_dim, group = s.heads / s.kv_heads;
  Reference r;
  r.out.assign(static_cast<std::size_t>(s.batch) * s.seq * ldo, 0.0f);
  r.lse.assign(static_cast<std::size_t>(s.batch) * s.heads * s.seq, 0.0f);
  std::vector<double> dq(q.size(), 0.0), dk(k.size(), 0.0), dv(v.size(), 0.0);
  auto at = [&](int b, int t, int ld, std::size_t off, int head) {
    return (static_cast<std::size_t>(b) * s.seq + t) * ld + off + static_cast<std::size_t>(head) * hd;
  };
  std::vector<double> p(s.seq), dp(s.seq);
  for (int b = 0; b < s.batch; ++b) {
    for (int j = 0; j < s.heads; ++j) {
      const int g = j / group;
      for (int i = 0; i < s.seq; ++i) {
        const std::size_t qi = at(b, i, l.ldq, l.q_off, j), oi = at(b, i, ldo, 0, j);
        double m = -INFINITY;
        for (int t = 0; t <= i; ++t) {
          const std::size_t kt = at(b, t, l.ldk, l.k_off, g);
          double dot = 0.0;
          for (int d = 0; d < hd; ++d) dot += static_cast<double>(q[qi + d]) * k[kt + d];
          p[t] = scale * dot;
          m = std::max(m, p[t]);
        }
        double sum = 0.0;
        for (int t = 0; t <= i; ++t) sum += (p[t] = std::exp(p[t] - m));
        r.lse[(static_cast<std::size_t>(b) * s.heads + j) * s.seq + i] = static_cast<float>(m + std::log(sum));
        double delta = 0.0;
        for (int t = 0; t <= i; ++t) {
          p[t] /= sum;
          const std::size_t vt = at(b, t, l.ldv, l.v_off, g);
          dp[t] = 0.0;
          for (int d = 0; d < hd; ++d) dp[t] += static_cast<double>(dout[oi + d]) * v[vt + d];
          delta += p[t] * dp[t];
        }
        for (int d = 0; d < hd; ++d) {
          double o = 0.0;
          for (int t = 0; t <= i; ++t) o += p[t] * v[at(b, t, l.ldv, l.v_off, g) + d];
          r.out[oi + d] = static_cast<float>(o);
        }
        for (int t = 0; t <= i; ++t) {
          const double ds = p[t] * (dp[t] - delta);
          const std::size_t kt = at(b, t, l.ldk, l.k_off, g), vt = at(b, t, l.ldv, l.v_off, g);
          for (int d = 0; d < hd; ++d) {
            dq[qi + d] += scale * ds * k[kt + d];
            dk[kt + d] += scale * ds * q[qi + d];
            dv[vt + d] += p[t] * dout[oi + d];
          }
        }
      }
    }
  }
  r.dq.assign(dq.begin(), dq.end());
  r.dk.assign(dk.begin(), dk.end());
  r.dv.assign(dv.begin(), dv.end());
  return r;
}

class FlashAttentionTest : public CudaVsCpuTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(FlashAttentionTest, MatchesDefinitionCpuAndMathPath) {
  const Shape s = GetParam();
  const Layout l = layout_of(s);
  const int hd = s.head_dim, ldo = s.heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const std::size_t rows = static_cast<std::size_t>(s.batch) * s.seq;
  // One buffer (fused) or three; their gradients are laid out the same way.
  const auto q = random_floats(l.q_size, 800, -2.0f, 2.0f);
  const auto k = s.fused ? q : random_floats(l.k_size, 801, -2.0f, 2.0f);
  const auto v = s.fused ? q : random_floats(l.v_size, 802);
  const auto dout = random_floats(rows * ldo, 803);
  const Reference ref = attention_in_double(s, l, q, k, v, dout, ldo, scale);

  Twin tq = twin(q);
  Twin tk = twin(s.fused ? std::vector<float>{0.0f} : k), tv = twin(s.fused ? std::vector<float>{0.0f} : v);
  auto args = [&](Side side) {
    AttentionArgs a;
    a.batch = s.batch;
    a.seq = s.seq;
    a.heads = s.heads;
    a.kv_heads = s.kv_heads;
    a.head_dim = hd;
    a.scale = scale;
    a.q = tq.at(side) + l.q_off;
    a.ldq = l.ldq;
    a.k = (s.fused ? tq.at(side) : tk.at(side)) + l.k_off;
    a.ldk = l.ldk;
    a.v = (s.fused ? tq.at(side) : tv.at(side)) + l.v_off;
    a.ldv = l.ldv;
    return a;
  };
  Twin out = twin(nans(rows * ldo));
  Twin lse = twin(nans(static_cast<std::size_t>(s.batch) * s.heads * s.seq));
  on_both([&](Backend& be, Side side) { be.flash_attention_forward(args(side), out.at(side), ldo, lse.at(side)); });
  EXPECT_TRUE(all_close(cuda_values(out), ref.out, 1e-5, 1e-4)) << "out vs the definition";
  EXPECT_TRUE(all_close(cuda_values(lse), ref.lse, 1e-5, 1e-4)) << "lse vs the definition";
  EXPECT_TRUE(same(out, 1e-5, 1e-4, "out vs cpu"));
  EXPECT_TRUE(same(lse, 1e-5, 1e-4, "lse vs cpu"));

  Twin tdout = twin(dout);
  Twin dq = twin(nans(l.q_size));
  Twin dk = twin(nans(s.fused ? 1 : l.k_size)), dv = twin(nans(s.fused ? 1 : l.v_size));
  on_both([&](Backend& be, Side side) {
    float* dqp = dq.at(side) + l.q_off;
    float* dkp = (s.fused ? dq.at(side) : dk.at(side)) + l.k_off;
    float* dvp = (s.fused ? dq.at(side) : dv.at(side)) + l.v_off;
    be.flash_attention_backward(args(side), out.at(side), ldo, tdout.at(side), lse.at(side), dqp, dkp, dvp);
  });
  if (s.fused) {
    // dq, dk, dv share the fused buffer; the reference summed each into its own copy of it.
    std::vector<float> fused(ref.dq.size());
    for (std::size_t i = 0; i < fused.size(); ++i) fused[i] = ref.dq[i] + ref.dk[i] + ref.dv[i];
    EXPECT_TRUE(all_close(cuda_values(dq), fused, 1e-5, 1e-4)) << "dqkv vs the definition";
    EXPECT_TRUE(same(dq, 1e-5, 1e-4, "dqkv vs cpu"));
  } else {
    EXPECT_TRUE(all_close(cuda_values(dq), ref.dq, 1e-5, 1e-4)) << "dq vs the definition";
    EXPECT_TRUE(all_close(cuda_values(dk), ref.dk, 1e-5, 1e-4)) << "dk vs the definition";
    EXPECT_TRUE(all_close(cuda_values(dv), ref.dv, 1e-5, 1e-4)) << "dv vs the definition";
    EXPECT_TRUE(same(dq, 1e-5, 1e-4, "dq vs cpu"));
    EXPECT_TRUE(same(dk, 1e-5, 1e-4, "dk vs cpu"));
    EXPECT_TRUE(same(dv, 1e-5, 1e-4, "dv vs cpu"));
  }

  // The math path on the GPU: head-major q, k, v; scores by batched GEMMs (a kv head's
  // matrices shared by its group, stride 0); causal softmax; P V; back to token-major.
  CudaBackend& gpu = *backend_;
  const int group = s.heads / s.kv_heads;
  const std::size_t per_head = static_cast<std::size_t>(s.seq) * hd;
  const std::size_t scores = static_cast<std::size_t>(s.seq) * s.seq;
  Buffer qh = gpu.alloc(Category::temp, rows * s.heads * hd), kh = gpu.alloc(Category::temp, rows * s.kv_heads * hd),
         vh = gpu.alloc(Category::temp, rows * s.kv_heads * hd), oh = gpu.alloc(Category::temp, rows * s.heads * hd),
         p = gpu.alloc(Category::temp, static_cast<std::size_t>(s.batch) * s.heads * scores);
  const AttentionArgs a = args(Side::cuda);
  gpu.permute_heads(qh.data(), a.q, a.ldq, s.batch, s.seq, s.heads, hd, true);
  gpu.permute_heads(kh.data(), a.k, a.ldk, s.batch, s.seq, s.kv_heads, hd, true);
  gpu.permute_heads(vh.data(), a.v, a.ldv, s.batch, s.seq, s.kv_heads, hd, true);
  for (int b = 0; b < s.batch; ++b) {
    for (int g = 0; g < s.kv_heads; ++g) {
      const std::size_t first = static_cast<std::size_t>(b) * s.heads + static_cast<std::size_t>(g) * group;
      const std::size_t kv = static_cast<std::size_t>(b) * s.kv_heads + g;
      gpu.gemm_batched(Trans::no, Trans::yes, s.seq, s.seq, hd, 1.0f, qh.data() + first * per_head, hd,
                       static_cast<std::int64_t>(per_head), kh.data() + kv * per_head, hd, 0, 0.0f,
                       p.data() + first * scores, s.seq, static_cast<std::int64_t>(scores), group);
    }
  }
  gpu.causal_softmax_forward(p.data(), s.batch * s.heads, s.seq, scale);
  for (int b = 0; b < s.batch; ++b) {
    for (int g = 0; g < s.kv_heads; ++g) {
      const std::size_t first = static_cast<std::size_t>(b) * s.heads + static_cast<std::size_t>(g) * group;
      const std::size_t kv = static_cast<std::size_t>(b) * s.kv_heads + g;
      gpu.gemm_batched(Trans::no, Trans::no, s.seq, hd, s.seq, 1.0f, p.data() + first * scores, s.seq,
                       static_cast<std::int64_t>(scores), vh.data() + kv * per_head, hd, 0, 0.0f,
                       oh.data() + first * per_head, hd, static_cast<std::int64_t>(per_head), group);
    }
  }
  Buffer math_out = gpu.alloc(Category::temp, rows * ldo);
  gpu.permute_heads(math_out.data(), oh.data(), ldo, s.batch, s.seq, s.heads, hd, false);
  EXPECT_TRUE(all_close(cuda_values(out), to_host(math_out), 1e-5, 1e-4)) << "flash vs the math path";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashAttentionTest,
    ::testing::Values(Shape{2, 37, 4, 2, 24, false},   // grouped-query, separate q, k, v
                      Shape{1, 70, 2, 2, 64, false},   // multi-head
                      Shape{2, 33, 3, 3, 32, true},    // GPT-2's fused qkv row
                      Shape{1, 40, 4, 1, 128, false},  // head_dim at the limit, one kv head
                      Shape{1, 5, 2, 2, 6, false}),    // shorter than a tile
    [](const ::testing::TestParamInfo<Shape>& param_info) {
      const Shape& s = param_info.param;
      return "b" + std::to_string(s.batch) + "s" + std::to_string(s.seq) + "h" + std::to_string(s.heads) + "kv" +
             std::to_string(s.kv_heads) + "d" + std::to_string(s.head_dim) + (s.fused ? "fused" : "");
    });

TEST_F(CudaVsCpuTest, FlashAttentionRefusesHeadDimAboveLimit) {
  const int hd = 136, heads = 1, seq = 4;
  Buffer qkv = backend_->alloc(Category::temp, static_cast<std::size_t>(seq) * heads * hd);
  Buffer out = backend_->alloc(Category::temp, static_cast<std::size_t>(seq) * heads * hd);
  Buffer lse = backend_->alloc(Category::temp, static_cast<std::size_t>(seq) * heads);
  AttentionArgs a;
  a.batch = 1;
  a.seq = seq;
  a.heads = a.kv_heads = heads;
  a.head_dim = hd;
  a.scale = 1.0f;
  a.q = a.k = a.v = qkv.data();
  a.ldq = a.ldk = a.ldv = heads * hd;
  try {
    backend_->flash_attention_forward(a, out.data(), heads * hd, lse.data());
    FAIL() << "head_dim 136 was accepted";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("limit of 1..128"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace shardscope::testing
