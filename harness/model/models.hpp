// The models, one factory each (one line per model in registry.cpp).
#pragma once

#include <memory>

#include "harness/model/model.hpp"

namespace shardscope {

std::unique_ptr<Model> make_mlp(const ModelConfig& config);   // mlp.cpp
std::unique_ptr<Model> make_gpt2(const ModelConfig& config);  // gpt2.cpp
// GPT-2 under autocast(bfloat16) (config.autocast), for a shape make_gpt2 completed.
std::unique_ptr<Model> make_gpt2_autocast(const TransformerShape& shape);  // gpt2_autocast.cpp
std::unique_ptr<Model> make_llama(const ModelConfig& config); // llama.cpp
// Llama under autocast(bfloat16) (config.autocast), for a shape make_llama completed.
std::unique_ptr<Model> make_llama_autocast(const TransformerShape& shape);  // llama_autocast.cpp

}  // namespace shardscope
