// Flash attention forward and backward on CUDA; see cuda_flash_attention.hpp.
//
// Every kernel runs kFlashThreads = 128 threads as 16 groups of 8 lanes. A group owns one
// row of its block's tile (a query in the forward and dq kernels, a key in the dk/dv
// kernel); its 8 lanes split the row's other-tile entries (lane + 8 t, t < 2) and its
// head_dim columns (lane + 8 kk, kk < 16), and meet by shuffles within the group (the 8
// lanes lie in one warp). Tiles in shared memory are padded to 129 columns so a group's
// reads of 8 different rows fall in different banks.
#include "kernels/cuda_flash_attention.hpp"

#include <cmath>
#include <cstddef>
#include <string>

#include "shardscope/cuda_check.hpp"

namespace shardscope::cuda_ops {
namespace {

constexpr int kTile = 16;                           // queries or keys per tile
constexpr int kLanes = 8;                           // lanes per row group
constexpr int kFlashThreads = kTile * kLanes;       // 128
constexpr int kPerLane = kFlashMaxHeadDim / kLanes;  // head_dim columns per lane (16)
constexpr int kTilePerLane = kTile / kLanes;         // other-tile entries per lane (2)
constexpr int kPad = kFlashMaxHeadDim + 1;
static_assert(kFlashThreads / kLanes == kTile, "one row group per tile row");
static_assert(32 % kLanes == 0, "a row group lies within one warp");

struct FlashParams {
  int seq = 0;
  int heads = 0;
  int group = 0;  // query heads per kv head
  int head_dim = 0;
  float scale = 0.0f;
  const float* q = nullptr;
  int ldq = 0;
  const float* k = nullptr;
  int ldk = 0;
  const float* v = nullptr;
  int ldv = 0;
};

// Sum and max over the 8 lanes of a row group (xor offsets below 8 stay within the group);
// every lane gets the result. Called by all 32 lanes of the warp.
__device__ __forceinline__ float group_sum(float x) {
  for (int o = kLanes / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float group_max(float x) {
  for (int o = kLanes / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// tile[r][d] = src row (tok0 + row0 + r), columns [col0, col0 + head_dim), for the rows
// below seq; zeros beyond the sequence.
__device__ void load_tile(float (*tile)[kPad], const float* src, int ld, std::size_t tok0, int row0,
                          int seq, int col0, int head_dim) {
  for (int idx = threadIdx.x; idx < kTile * head_dim; idx += kFlashThreads) {
    const int r = idx / head_dim, d = idx % head_dim;
    const int row = row0 + r;
    tile[r][d] = row < seq ? src[(tok0 + row) * ld + col0 + d] : 0.0f;
  }
}

__device__ __forceinline__ float dot_rows(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int d = 0; d < n; ++d) s += a[d] * b[d];
  return s;
}

// D_i = sum over d of dout(i, d) * out(i, d) for query `qi` of head j, by the 8 lanes of
// its group (0 beyond the sequence).
__device__ float row_delta(const float* out, const float* dout, int ldo, std::size_t tok0, int qi,
                           int seq, int col0, int head_dim, int lane) {
  float part = 0.0f;
  if (qi < seq) {
    const std::size_t base = (tok0 + qi) * ldo + col0;
    for (int d = lane; d < head_dim; d += kLanes) part += dout[base + d] * out[base + d];
  }
  return group_sum(part);
}

// grid (query tiles, heads, batch).
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(FlashParams p, float* out, int ldo, float* lse) {
  __shared__ float qs[kTile][kPad];
  __shared__ float ks[kTile][kPad];
  __shared__ float vs[kTile][kPad];
  __shared__ float ps[kTile][kTile + 1];  // [query][key]: this tile's exp(s - m)
  const int b = blockIdx.z, j = blockIdx.y, g = j / p.group, hd = p.head_dim;
  const int q0 = blockIdx.x * kTile;
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int qi = q0 + r;
  const std::size_t tok0 = static_cast<std::size_t>(b) * p.seq;

  load_tile(qs, p.q, p.ldq, tok0, q0, p.seq, j * hd, hd);
  float acc[kPerLane];
#pragma unroll
  for (int kk = 0; kk < kPerLane; ++kk) acc[kk] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  // Causal: the block's queries see keys [0, min(seq, q0 + kTile)). Key 0 is in the first
  // tile and every query (a padding row beyond seq too) sees it, so m is finite after it.
  const int key_end = min(p.seq, q0 + kTile);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // the previous tile's reads are done (and qs is loaded)
    load_tile(ks, p.k, p.ldk, tok0, k0, p.seq, g * hd, hd);
    load_tile(vs, p.v, p.ldv, tok0, k0, p.seq, g * hd, hd);
    __syncthreads();
    float s[kTilePerLane];
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kTilePerLane; ++t) {
      const int c = lane + kLanes * t, key = k0 + c;
      s[t] = key <= qi && key < p.seq ? p.scale * dot_rows(qs[r], ks[c], hd) : -INFINITY;
      tile_max = fmaxf(tile_max, s[t]);
    }
    const float m_new = fmaxf(m, group_max(tile_max));
    const float correction = expf(m - m_new);  // 0 at the first tile (m = -inf)
    float tile_sum = 0.0f;
#pragma unroll
    for (int t = 0; t < kTilePerLane; ++t) {
      const float e = expf(s[t] - m_new);  // 0 where masked
      ps[r][lane + kLanes * t] = e;
      tile_sum += e;
    }
    l = l * correction + group_sum(tile_sum);
    m = m_new;
    __syncwarp();  // row r of ps was written by its own group, in this warp
#pragma unroll
    for (int kk = 0; kk < kPerLane; ++kk) {
      const int d = lane + kLanes * kk;
      if (d < hd) {
        float a = acc[kk] * correction;
        for (int c = 0; c < kTile; ++c) a += ps[r][c] * vs[c][d];
        acc[kk] = a;
      }
    }
  }
  if (qi < p.seq) {
    float* o = out + (tok0 + qi) * ldo + static_cast<std::size_t>(j) * hd;
#pragma unroll
    for (int kk = 0; kk < kPerLane; ++kk) {
      const int d = lane + kLanes * kk;
      if (d < hd) o[d] = acc[kk] / l;
    }
    if (lane == 0) lse[(static_cast<std::size_t>(b) * p.heads + j) * p.seq + qi] = m + logf(l);
  }
}

// grid (key tiles, kv heads, batch). The thread's group owns key k0 + c; dk and dv of that
// key sum over the kv head's query heads and every query tile at or after k0.
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dkdv_kernel(FlashParams p, const float* out, int ldo, const float* dout,
                               const float* lse, float* dk, float* dv) {
  __shared__ float ks[kTile][kPad];
  __shared__ float vs[kTile][kPad];
  __shared__ float qs[kTile][kPad];
  __shared__ float dos[kTile][kPad];
  __shared__ float ps[kTile][kTile + 1];   // [query][key]: P
  __shared__ float dss[kTile][kTile + 1];  // [query][key]: dS = P * (dP - D)
  __shared__ float lse_s[kTile];
  __shared__ float delta_s[kTile];
  const int b = blockIdx.z, g = blockIdx.y, hd = p.head_dim;
  const int k0 = blockIdx.x * kTile;
  const int c = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int key = k0 + c;
  const std::size_t tok0 = static_cast<std::size_t>(b) * p.seq;

  load_tile(ks, p.k, p.ldk, tok0, k0, p.seq, g * hd, hd);
  load_tile(vs, p.v, p.ldv, tok0, k0, p.seq, g * hd, hd);
  float dk_acc[kPerLane], dv_acc[kPerLane];
#pragma unroll
  for (int kk = 0; kk < kPerLane; ++kk) dk_acc[kk] = dv_acc[kk] = 0.0f;

  for (int j = g * p.group; j < (g + 1) * p.group; ++j) {
    // Queries before k0 see none of these keys (causal).
    for (int q0 = k0; q0 < p.seq; q0 += kTile) {
      __syncthreads();  // the previous tile's reads are done
      load_tile(qs, p.q, p.ldq, tok0, q0, p.seq, j * hd, hd);
      load_tile(dos, dout, ldo, tok0, q0, p.seq, j * hd, hd);
      {
        // Group c here stands for query row c of the tile: its lse and D.
        const int qi = q0 + c;
        const float delta = row_delta(out, dout, ldo, tok0, qi, p.seq, j * hd, hd, lane);
        if (lane == 0) {
          delta_s[c] = delta;
          lse_s[c] = qi < p.seq ? lse[(static_cast<std::size_t>(b) * p.heads + j) * p.seq + qi] : 0.0f;
        }
      }
      __syncthreads();
#pragma unroll
      for (int t = 0; t < kTilePerLane; ++t) {
        const int r = lane + kLanes * t, qi = q0 + r;
        const bool seen = key <= qi && qi < p.seq;
        const float s = p.scale * dot_rows(qs[r], ks[c], hd);
        const float pr = seen ? expf(s - lse_s[r]) : 0.0f;
        const float dp = dot_rows(dos[r], vs[c], hd);
        ps[r][c] = pr;
        dss[r][c] = pr * (dp - delta_s[r]);
      }
      __syncwarp();  // column c of ps and dss was written by its own group, in this warp
#pragma unroll
      for (int kk = 0; kk < kPerLane; ++kk) {
        const int d = lane + kLanes * kk;
        if (d < hd) {
          float a = dv_acc[kk], e = dk_acc[kk];
          for (int r = 0; r < kTile; ++r) {
            a += ps[r][c] * dos[r][d];
            e += dss[r][c] * qs[r][d];
          }
          dv_acc[kk] = a;
          dk_acc[kk] = e;
        }
      }
    }
  }
  if (key < p.seq) {
    float* dkr = dk + (tok0 + key) * p.ldk + static_cast<std::size_t>(g) * hd;
    float* dvr = dv + (tok0 + key) * p.ldv + static_cast<std::size_t>(g) * hd;
#pragma unroll
    for (int kk = 0; kk < kPerLane; ++kk) {
      const int d = lane + kLanes * kk;
      if (d < hd) {
        dkr[d] = p.scale * dk_acc[kk];
        dvr[d] = dv_acc[kk];
      }
    }
  }
}

// grid (query tiles, heads, batch). The thread's group owns query q0 + r.
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_dq_kernel(FlashParams p, const float* out, int ldo, const float* dout,
                             const float* lse, float* dq) {
  __shared__ float qs[kTile][kPad];
  __shared__ float dos[kTile][kPad];
  __shared__ float ks[kTile][kPad];
  __shared__ float vs[kTile][kPad];
  __shared__ float dss[kTile][kTile + 1];  // [query][key]
  const int b = blockIdx.z, j = blockIdx.y, g = j / p.group, hd = p.head_dim;
  const int q0 = blockIdx.x * kTile;
  const int r = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const int qi = q0 + r;
  const std::size_t tok0 = static_cast<std::size_t>(b) * p.seq;

  load_tile(qs, p.q, p.ldq, tok0, q0, p.seq, j * hd, hd);
  load_tile(dos, dout, ldo, tok0, q0, p.seq, j * hd, hd);
  const float delta = row_delta(out, dout, ldo, tok0, qi, p.seq, j * hd, hd, lane);
  const float lse_r = qi < p.seq ? lse[(static_cast<std::size_t>(b) * p.heads + j) * p.seq + qi] : 0.0f;
  float dq_acc[kPerLane];
#pragma unroll
  for (int kk = 0; kk < kPerLane; ++kk) dq_acc[kk] = 0.0f;

  const int key_end = min(p.seq, q0 + kTile);
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // the previous tile's reads are done (and qs, dos are loaded)
    load_tile(ks, p.k, p.ldk, tok0, k0, p.seq, g * hd, hd);
    load_tile(vs, p.v, p.ldv, tok0, k0, p.seq, g * hd, hd);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kTilePerLane; ++t) {
      const int c = lane + kLanes * t, key = k0 + c;
      const bool seen = key <= qi && qi < p.seq;
      const float s = p.scale * dot_rows(qs[r], ks[c], hd);
      const float pr = seen ? expf(s - lse_r) : 0.0f;
      const float dp = dot_rows(dos[r], vs[c], hd);
      dss[r][c] = pr * (dp - delta);
    }
    __syncwarp();  // row r of dss was written by its own group, in this warp
#pragma unroll
    for (int kk = 0; kk < kPerLane; ++kk) {
      const int d = lane + kLanes * kk;
      if (d < hd) {
        float a = dq_acc[kk];
        for (int c = 0; c < kTile; ++c) a += dss[r][c] * ks[c][d];
        dq_acc[kk] = a;
      }
    }
  }
  if (qi < p.seq) {
    float* dqr = dq + (tok0 + qi) * p.ldq + static_cast<std::size_t>(j) * hd;
#pragma unroll
    for (int kk = 0; kk < kPerLane; ++kk) {
      const int d = lane + kLanes * kk;
      if (d < hd) dqr[d] = p.scale * dq_acc[kk];
    }
  }
}

FlashParams flash_params(const AttentionArgs& a, const char* what) {
  const std::string w(what);
  SHARDSCOPE_REQUIRE(a.batch >= 0 && a.seq >= 0, w + ": negative batch or seq");
  SHARDSCOPE_REQUIRE(a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0,
                     w + ": kv_heads (" + std::to_string(a.kv_heads) + ") must divide heads (" +
                         std::to_string(a.heads) + ")");
  SHARDSCOPE_REQUIRE(a.head_dim > 0 && a.head_dim <= kFlashMaxHeadDim,
                     w + ": head_dim " + std::to_string(a.head_dim) +
                         " is outside the CUDA flash kernel's limit of 1.." +
                         std::to_string(kFlashMaxHeadDim));
  SHARDSCOPE_REQUIRE(a.heads <= 65535 && a.batch <= 65535,
                     w + ": heads and batch must be at most 65535 (grid dimensions)");
  FlashParams p;
  p.seq = a.seq;
  p.heads = a.heads;
  p.group = a.heads / a.kv_heads;
  p.head_dim = a.head_dim;
  p.scale = a.scale;
  p.q = a.q;
  p.ldq = a.ldq;
  p.k = a.k;
  p.ldk = a.ldk;
  p.v = a.v;
  p.ldv = a.ldv;
  return p;
}

unsigned int tiles(int seq) { return static_cast<unsigned int>((seq + kTile - 1) / kTile); }

}  // namespace

void flash_attention_forward(const AttentionArgs& a, float* out, int ldo, float* lse, cudaStream_t stream) {
  const FlashParams p = flash_params(a, "flash_attention_forward");
  if (a.batch == 0 || a.seq == 0) return;
  const dim3 grid(tiles(a.seq), static_cast<unsigned int>(a.heads), static_cast<unsigned int>(a.batch));
  flash_forward_kernel<<<grid, kFlashThreads, 0, stream>>>(p, out, ldo, lse);
  CUDA_CHECK_LAUNCH();
}

void flash_attention_backward(const AttentionArgs& a, const float* out, int ldo, const float* dout,
                              const float* lse, float* dq, float* dk, float* dv, cudaStream_t stream) {
  const FlashParams p = flash_params(a, "flash_attention_backward");
  if (a.batch == 0 || a.seq == 0) return;
  const dim3 kv_grid(tiles(a.seq), static_cast<unsigned int>(a.kv_heads),
                     static_cast<unsigned int>(a.batch));
  flash_backward_dkdv_kernel<<<kv_grid, kFlashThreads, 0, stream>>>(p, out, ldo, dout, lse, dk, dv);
  CUDA_CHECK_LAUNCH();
  const dim3 q_grid(tiles(a.seq), static_cast<unsigned int>(a.heads), static_cast<unsigned int>(a.batch));
  flash_backward_dq_kernel<<<q_grid, kFlashThreads, 0, stream>>>(p, out, ldo, dout, lse, dq);
  CUDA_CHECK_LAUNCH();
}

}  // namespace shardscope::cuda_ops
