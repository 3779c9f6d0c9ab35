// Flash attention on CUDA (FlashAttention-2 style, fp32; backend.hpp gives the semantics,
// transformer_args.hpp the layouts). Causal, grouped-query, head_dim up to
// kFlashMaxHeadDim (beyond it: RunError naming the limit). Never materialises seq x seq:
// its memory is the shared-memory tiles of each block, and nothing is allocated.
//
// Forward: one block per (16 queries, query head, sequence); keys and values stream
// through shared memory 16 at a time with the online softmax (running max and sum); writes
// out and lse = max + log(sum).
// Backward: D_i = rowsum(dout_i * out_i) is recomputed where needed (no buffer), P from
// lse tile by tile. Two kernels, no atomics, deterministic: dk/dv with one block per (16
// keys, kv head, sequence) looping over the kv head's query heads and the query tiles
// that see those keys (so a kv head's gradient sums its group's query heads in a fixed
// order); dq with one block per (16 queries, query head, sequence) looping over the key
// tiles it sees.
#pragma once

#include <cuda_runtime_api.h>

#include "shardscope/transformer_args.hpp"

namespace shardscope::cuda_ops {

inline constexpr int kFlashMaxHeadDim = 128;

void flash_attention_forward(const AttentionArgs& a, float* out, int ldo, float* lse, cudaStream_t stream);
void flash_attention_backward(const AttentionArgs& a, const float* out, int ldo, const float* dout,
                              const float* lse, float* dq, float* dk, float* dv, cudaStream_t stream);

}  // namespace shardscope::cuda_ops
