// Grouped-query attention's head bookkeeping for the Llama family (llama.cpp and
// llama_autocast.cpp): k and v expanded to the query heads as Hugging Face's repeat_kv
// does, and the gradient summed back.
#pragma once

#include "harness/model/transformer_parts.hpp"

namespace shardscope {
namespace transformer {

// Copies token-major x (N, K d), row stride ld, into head-major (B, H, T, d) with kv head
// c repeated for query heads c r .. c r + r - 1 (r = H / K): Hugging Face's repeat_kv.
void expand_heads(Backend& be, float* dst, const float* x, int ld, int batch, int seq, int heads, int kv_heads,
                  int head_dim);
// The reverse of expand_heads on a gradient: sums head-major g (B, H, T, d) over each kv
// head's r query heads (in place in g) and writes the sums token-major into dx (N, K d),
// row stride ld.
void reduce_heads(Backend& be, float* dx, float* g, int ld, int batch, int seq, int heads, int kv_heads,
                  int head_dim);

}  // namespace transformer
}  // namespace shardscope
