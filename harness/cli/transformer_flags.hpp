// The transformer's shape flags of `run`, `sweep` and `plan` (--model gpt2|llama,
// --hf-config FILE, --layers --hidden --heads --kv-heads --ffn --vocab --seq --positions
// --attention): from the flags and the config.json to one checked TransformerShape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "shardscope/config.hpp"

namespace shardscope {

// The largest value each size may take, so that every byte count of the closed forms
// stays inside 64 bits (checked again as a whole by check_transformer_shape).
struct TransformerCaps {
  static constexpr int layers = 10'000;
  static constexpr int hidden = 1 << 20;
  static constexpr int heads = 1 << 16;
  static constexpr int ffn = 1 << 22;
  static constexpr int vocab = 10'000'000;
  static constexpr int seq = 1 << 20;
  static constexpr int positions = 1 << 24;
  static constexpr int head_dim = 1 << 16;
};

// The shape flags as given: empty when not given.
struct TransformerFlags {
  std::string model;      // --model as given ("" when not)
  std::string hf_config;  // --hf-config FILE
  std::string layers, hidden, heads, kv_heads, ffn, vocab, seq, positions;
  std::string attention;  // math | flash
  int batch = 1;          // sequences per rank (checked by the caller)
};

// The family ("gpt2" or "llama") and the shape: the config.json's (or the family's
// defaults: GPT-2 124M for gpt2, Llama-2-7B for llama), each given flag overriding it;
// --seq defaults to min(1024, positions). Throws UsageError naming the flag or the
// config's field: an unknown model_type, a missing field, sizes out of range, heads that
// do not divide hidden (unless the config gives head_dim), kv heads that do not divide
// heads, --seq above the positions, or a model whose bytes would leave 64 bits.
struct TransformerModel {
  std::string family;
  TransformerShape shape;
};
TransformerModel transformer_from_flags(const TransformerFlags& flags);

// Whether a step of `batch` sequences of shape.seq tokens stays inside the generous
// bound transformer_from_flags holds every shape to (4 B x batch x seq x (vocab + layers
// x (64 hidden + 8 ffn + heads x seq)) <= 2^62): rising in batch and in seq, so the
// values it accepts are a prefix (plan --fit searches no further).
bool step_within_bounds(const TransformerShape& shape, std::int64_t batch);

}  // namespace shardscope
