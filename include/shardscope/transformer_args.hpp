// The arguments of the transformer kernels every backend runs (backend.hpp, "transformer
// math"): token ids, the attention's shape and where its q, k and v lie. Nothing here
// allocates or knows a backend.
//
// Layouts (row-major fp32, one row per token, rows = batch * seq, a sequence's tokens
// consecutive): a (rows, features) activation as everywhere else. Token ids and targets
// are int64, as torch's LongTensor (8 bytes a token), held in a Buffer of 2 floats a
// token (ids_of() below).
//
// Attention operands are views into row-major buffers: head j of q occupies columns
// [j * head_dim, (j + 1) * head_dim) of q's rows, whose stride (leading dimension) is
// ldq; likewise k and v with kv_heads heads. GPT-2's fused QKV output (rows, 3h) is
// q = base, k = base + h, v = base + 2h with ld 3h; Llama's separate projections have ld
// heads * head_dim and kv_heads * head_dim. Query head j reads kv head
// j / (heads / kv_heads) (grouped-query attention; kv_heads == heads is plain
// multi-head attention). Attention is causal: position i attends to positions <= i of
// its own sequence.
#pragma once

#include <cstdint>

namespace shardscope {

// The int64 token ids held in a Buffer's floats (2 floats a token).
inline std::int64_t* ids_of(float* data) { return reinterpret_cast<std::int64_t*>(data); }
inline const std::int64_t* ids_of(const float* data) { return reinterpret_cast<const std::int64_t*>(data); }
// Floats a Buffer needs to hold `tokens` int64 ids.
constexpr std::int64_t id_floats(std::int64_t tokens) { return 2 * tokens; }

enum class AttentionMode : std::uint8_t { math, flash };

struct AttentionArgs {
  int batch = 0;
  int seq = 0;
  int heads = 0;     // query heads
  int kv_heads = 0;  // divides heads
  int head_dim = 0;
  float scale = 0.0f;  // the softmax's scale, 1 / sqrt(head_dim) as torch's default
  const float* q = nullptr;
  int ldq = 0;
  const float* k = nullptr;
  int ldk = 0;
  const float* v = nullptr;
  int ldv = 0;

  std::int64_t rows() const { return static_cast<std::int64_t>(batch) * seq; }
  // Query head j's kv head.
  int kv_head(int j) const { return j / (heads / kv_heads); }
};

}  // namespace shardscope
