#include "harness/model/llama_heads.hpp"

namespace shardscope {
namespace transformer {

void expand_heads(Backend& be, float* dst, const float* x, int ld, int batch, int seq, int heads, int kv_heads,
                  int head_dim) {
  if (heads == kv_heads) {
    be.permute_heads(dst, x, ld, batch, seq, heads, head_dim, true);
    return;
  }
  const int r = heads / kv_heads;
  const i64 st = static_cast<i64>(seq) * head_dim;
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < heads; ++j)
      be.permute_heads(dst + (static_cast<i64>(b) * heads + j) * st,
                       x + static_cast<i64>(b) * seq * ld + (j / r) * head_dim, ld, 1, seq, 1, head_dim, true);
}

void reduce_heads(Backend& be, float* dx, float* g, int ld, int batch, int seq, int heads, int kv_heads,
                  int head_dim) {
  if (heads == kv_heads) {
    be.permute_heads(dx, g, ld, batch, seq, heads, head_dim, false);
    return;
  }
  const int r = heads / kv_heads;
  const i64 st = static_cast<i64>(seq) * head_dim;
  for (int b = 0; b < batch; ++b)
    for (int c = 0; c < kv_heads; ++c) {
      float* first = g + (static_cast<i64>(b) * heads + static_cast<i64>(c) * r) * st;
      for (int rep = 1; rep < r; ++rep) be.add(first, first + rep * st, floats(st));
      be.permute_heads(dx + static_cast<i64>(b) * seq * ld + static_cast<i64>(c) * head_dim, first, ld, 1, seq, 1,
                       head_dim, false);
    }
}

}  // namespace transformer
}  // namespace shardscope
