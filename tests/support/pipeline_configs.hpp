// Configurations shared by the single-process and the MPI pipeline tests.
#pragma once

#include <cstdint>
#include <string>

#include "shardscope/config.hpp"

namespace shardscope::testing {

inline ModelConfig model_of(int layers, int width, int batch, Activation act, Loss loss) {
  ModelConfig m;
  m.layers = layers;
  m.width = width;
  m.batch = batch;
  m.activation = act;
  m.loss = loss;
  return m;
}

// A GPT-2 of the given shape (head_dim hidden / heads; ffn 4·hidden unless given;
// positions seq unless given), `batch` sequences.
inline ModelConfig gpt2_of(int layers, int hidden, int heads, int vocab, int seq, int batch, AttentionMode mode,
                           int ffn = 0, int positions = 0) {
  ModelConfig m;
  m.name = "gpt2";
  m.layers = layers;
  m.width = hidden;
  m.batch = batch;
  TransformerShape& t = m.transformer;
  t.model_type = "gpt2";
  t.layers = layers;
  t.hidden = hidden;
  t.heads = t.kv_heads = heads;
  t.head_dim = hidden / heads;
  t.ffn = ffn > 0 ? ffn : 4 * hidden;
  t.vocab = vocab;
  t.seq = seq;
  t.positions = positions > 0 ? positions : seq;
  t.tied_embeddings = t.qkv_bias = t.out_bias = true;
  t.attention = mode;
  return m;
}

// A Llama of the given shape (head_dim hidden / heads, no biases; `tied`: the head is the
// token embedding), `batch` sequences.
inline ModelConfig llama_of(int layers, int hidden, int heads, int kv_heads, int ffn, int vocab, int seq, int batch,
                            AttentionMode mode, bool tied) {
  ModelConfig m;
  m.name = "llama";
  m.layers = layers;
  m.width = hidden;
  m.batch = batch;
  TransformerShape& t = m.transformer;
  t.model_type = "llama";
  t.layers = layers;
  t.hidden = hidden;
  t.heads = heads;
  t.kv_heads = kv_heads;
  t.head_dim = hidden / heads;
  t.ffn = ffn;
  t.vocab = vocab;
  t.seq = seq;
  t.positions = seq;
  t.tied_embeddings = tied;
  t.norm_eps = 1e-6f;
  t.attention = mode;
  return m;
}

inline RunConfig pipeline_config(const std::string& schedule, int microbatches, int chunks,
                                 const ModelConfig& model, int steps, std::uint64_t seed) {
  RunConfig cfg;
  cfg.model = model;
  cfg.schedule = parse_schedule(schedule);
  cfg.microbatches = microbatches;
  cfg.chunks = chunks;
  cfg.steps = steps;
  cfg.seed = seed;
  return cfg;
}

}  // namespace shardscope::testing
