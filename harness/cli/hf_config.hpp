// `--hf-config FILE`: the shape of a transformer from a Hugging Face config.json
// (docs/cli.md, "Transformers"). model_type gpt2 is the gpt2 family; llama, mistral and
// qwen2 the llama family.
#pragma once

#include <string>

#include "shardscope/config.hpp"

namespace shardscope {

// A config.json's model: its family ("gpt2" or "llama") and shape (seq and attention
// left at their defaults: they are not the model's). head_dim_given: the config sets
// head_dim itself (then heads need not divide hidden).
struct HfModel {
  std::string family;
  TransformerShape shape;
  bool head_dim_given = false;
};

// Reads and checks the file; throws UsageError "--hf-config FILE: FIELD: ..." naming the
// field for an unknown model_type, a missing field, a value of the wrong JSON type or
// out of range; "--hf-config FILE: ..." when the file cannot be read or is not JSON.
// Shapes that do not divide are left to check_transformer_shape (the flags may change them).
HfModel read_hf_config(const std::string& path);

// The same from the file's text; `path` names it in messages.
HfModel parse_hf_config(const std::string& text, const std::string& path);

}  // namespace shardscope
