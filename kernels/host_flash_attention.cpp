// Flash attention on the host (FlashAttention-2's algorithm, one thread): causal,
// grouped-query, never materialising seq x seq. A block of kFlashBlock queries meets the
// key blocks up to its diagonal; each tile's scores are one GEMM (host::gemm: cblas_sgemm
// with OpenBLAS), the softmax is online (a running max m and sum l per query, the output
// block rescaled as m grows), and the output is divided by l once at the end.
// Scratch: a (block, block) tile and a (block, head_dim) accumulator, host memory the
// tracker does not see (a few tens of KiB; torch's CPU flash kernel holds the same kind).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/elementwise.hpp"
#include "kernels/host_ops.hpp"
#include "kernels/host_reduce.hpp"
#include "kernels/host_transformer.hpp"

namespace shardscope::host {

namespace {

constexpr int kB = kFlashBlock;

// Where head `head` of token `row` starts in a (rows, ld) token-major buffer.
template <typename T>
T* head_at(T* base, std::int64_t row, int ld, int head, int head_dim) {
  return base + static_cast<std::size_t>(row) * static_cast<std::size_t>(ld) +
         static_cast<std::size_t>(head) * static_cast<std::size_t>(head_dim);
}

// Sets columns [0, width) of `rows` rows of stride ld to 0.
void zero_columns(float* x, std::int64_t rows, int ld, int width) {
  for (std::int64_t r = 0; r < rows; ++r) std::fill_n(x + static_cast<std::size_t>(r) * ld, width, 0.0f);
}

}  // namespace

void flash_attention_forward(const AttentionArgs& a, float* out, int ldo, float* lse) {
  const int d = a.head_dim, seq = a.seq;
  std::vector<float> s_tile(static_cast<std::size_t>(kB) * kB);
  std::vector<float> acc(static_cast<std::size_t>(kB) * d);
  std::vector<float> m(kB), l(kB);
  for (int b = 0; b < a.batch; ++b) {
    const std::int64_t row0 = static_cast<std::int64_t>(b) * seq;
    for (int j = 0; j < a.heads; ++j) {
      const int g = a.kv_head(j);
      for (int i0 = 0; i0 < seq; i0 += kB) {
        const int br = std::min(kB, seq - i0);
        const float* q = head_at(a.q, row0 + i0, a.ldq, j, d);
        std::fill_n(acc.begin(), static_cast<std::size_t>(br) * d, 0.0f);
        std::fill_n(m.begin(), br, -std::numeric_limits<float>::infinity());
        std::fill_n(l.begin(), br, 0.0f);
        // Key blocks up to the block's last query, i0 + br - 1 (causal).
        for (int c0 = 0; c0 < i0 + br; c0 += kB) {
          const int bc = std::min(kB, i0 + br - c0);
          float* s = s_tile.data();
          // s(br, bc) = scale * q k^T
          gemm(Trans::no, Trans::yes, br, bc, d, a.scale, q, a.ldq, head_at(a.k, row0 + c0, a.ldk, g, d), a.ldk,
               0.0f, s, kB);
          for (int r = 0; r < br; ++r) {
            float* sr = s + static_cast<std::size_t>(r) * kB;
            float* accr = acc.data() + static_cast<std::size_t>(r) * d;
            // Keys c0 .. i0 + r are visible to query i0 + r; the rest of the row gets p = 0.
            const int visible = std::min(bc, i0 + r - c0 + 1);
            if (visible <= 0) {
              std::fill_n(sr, bc, 0.0f);
              continue;
            }
            const float mx = lane_max(sr, visible, m[r]);
            const float correction = math::fast_exp(m[r] - mx);  // 0 on the first block (m = -inf)
            for (int c = 0; c < visible; ++c) sr[c] = math::fast_exp(sr[c] - mx);
            const float sum = static_cast<float>(lane_sum(visible, [&](int c) { return sr[c]; }));
            std::fill(sr + visible, sr + bc, 0.0f);
            m[r] = mx;
            l[r] = l[r] * correction + sum;
            for (int e = 0; e < d; ++e) accr[e] *= correction;
          }
          // acc(br, d) += p v
          gemm(Trans::no, Trans::no, br, d, bc, 1.0f, s, kB, head_at(a.v, row0 + c0, a.ldv, g, d), a.ldv, 1.0f,
               acc.data(), d);
        }
        float* lse_block = lse + (static_cast<std::size_t>(b) * a.heads + j) * seq + i0;
        for (int r = 0; r < br; ++r) {
          const float inv = 1.0f / l[r];
          const float* accr = acc.data() + static_cast<std::size_t>(r) * d;
          float* o = head_at(out, row0 + i0 + r, ldo, j, d);
          for (int e = 0; e < d; ++e) o[e] = accr[e] * inv;
          lse_block[r] = m[r] + std::log(l[r]);
        }
      }
    }
  }
}

// FlashAttention-2's backward: for each query head and key block, the query blocks from
// the diagonal on recompute p = exp(scale q k^T - lse) tile by tile, then
//   dv += p^T dout,  dp = dout v^T,  ds = p * (dp - D)  with D_i = rowsum(dout_i * out_i),
//   dq += scale ds k,  dk += scale ds^T q,
// accumulated straight into dq, dk and dv (zeroed first), so a kv head's dk and dv sum
// over the query heads of its group.
void flash_attention_backward(const AttentionArgs& a, const float* out, int ldo, const float* dout,
                              const float* lse, float* dq, float* dk, float* dv) {
  const int d = a.head_dim, seq = a.seq;
  zero_columns(dq, a.rows(), a.ldq, a.heads * d);
  zero_columns(dk, a.rows(), a.ldk, a.kv_heads * d);
  zero_columns(dv, a.rows(), a.ldv, a.kv_heads * d);
  std::vector<float> p_tile(static_cast<std::size_t>(kB) * kB), dp_tile(p_tile.size());
  std::vector<float> D(static_cast<std::size_t>(seq));
  for (int b = 0; b < a.batch; ++b) {
    const std::int64_t row0 = static_cast<std::int64_t>(b) * seq;
    for (int j = 0; j < a.heads; ++j) {
      const int g = a.kv_head(j);
      const float* lse_head = lse + (static_cast<std::size_t>(b) * a.heads + j) * seq;
      for (int i = 0; i < seq; ++i) {
        const float* o = head_at(out, row0 + i, ldo, j, d);
        const float* go = head_at(dout, row0 + i, ldo, j, d);
        D[i] = static_cast<float>(lane_sum(d, [&](int e) { return o[e] * go[e]; }));
      }
      for (int c0 = 0; c0 < seq; c0 += kB) {
        const int bc = std::min(kB, seq - c0);
        const float* k = head_at(a.k, row0 + c0, a.ldk, g, d);
        const float* v = head_at(a.v, row0 + c0, a.ldv, g, d);
        float* dk_block = head_at(dk, row0 + c0, a.ldk, g, d);
        float* dv_block = head_at(dv, row0 + c0, a.ldv, g, d);
        // Query blocks whose last query reaches c0: blocks align, so from i0 = c0 on.
        for (int i0 = c0; i0 < seq; i0 += kB) {
          const int br = std::min(kB, seq - i0);
          const float* q = head_at(a.q, row0 + i0, a.ldq, j, d);
          const float* go = head_at(dout, row0 + i0, ldo, j, d);
          float* p = p_tile.data();
          float* dp = dp_tile.data();
          gemm(Trans::no, Trans::yes, br, bc, d, a.scale, q, a.ldq, k, a.ldk, 0.0f, p, kB);
          for (int r = 0; r < br; ++r) {
            float* pr = p + static_cast<std::size_t>(r) * kB;
            const int visible = std::clamp(i0 + r - c0 + 1, 0, bc);
            const float row_lse = lse_head[i0 + r];
            for (int c = 0; c < visible; ++c) pr[c] = math::fast_exp(pr[c] - row_lse);
            std::fill(pr + visible, pr + bc, 0.0f);
          }
          // dv(bc, d) += p^T dout
          gemm(Trans::yes, Trans::no, bc, d, br, 1.0f, p, kB, go, ldo, 1.0f, dv_block, a.ldv);
          // dp(br, bc) = dout v^T, then ds = p * (dp - D) in place
          gemm(Trans::no, Trans::yes, br, bc, d, 1.0f, go, ldo, v, a.ldv, 0.0f, dp, kB);
          for (int r = 0; r < br; ++r) {
            const float* pr = p + static_cast<std::size_t>(r) * kB;
            float* dpr = dp + static_cast<std::size_t>(r) * kB;
            const float Di = D[i0 + r];
            for (int c = 0; c < bc; ++c) dpr[c] = pr[c] * (dpr[c] - Di);
          }
          // dq(br, d) += scale ds k;  dk(bc, d) += scale ds^T q
          gemm(Trans::no, Trans::no, br, d, bc, a.scale, dp, kB, k, a.ldk, 1.0f, head_at(dq, row0 + i0, a.ldq, j, d),
               a.ldq);
          gemm(Trans::yes, Trans::no, bc, d, br, a.scale, dp, kB, q, a.ldq, 1.0f, dk_block, a.ldk);
        }
      }
    }
  }
}

}  // namespace shardscope::host
