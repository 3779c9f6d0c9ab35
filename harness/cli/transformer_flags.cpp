#include "harness/cli/transformer_flags.hpp"

#include <algorithm>

#include "harness/cli/cli.hpp"
#include "harness/cli/hf_config.hpp"
#include "harness/predict/transformer_forms.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

// A size and where it came from, for messages: the flag, the config's field, or the
// family's default.
struct Sized {
  int value = 0;
  std::string source;
};

// The family's shape without a config.json: GPT-2 124M (openai-community/gpt2) and
// Llama-2-7B (meta-llama/Llama-2-7b-hf).
HfModel family_defaults(const std::string& family) {
  HfModel m;
  m.family = family;
  TransformerShape& s = m.shape;
  s.model_type = family;
  if (family == "gpt2") {
    s.layers = 12;
    s.hidden = 768;
    s.heads = s.kv_heads = 12;
    s.ffn = 4 * 768;
    s.vocab = 50257;
    s.positions = 1024;
    s.tied_embeddings = true;
    s.qkv_bias = s.out_bias = true;
    s.norm_eps = 1e-5f;
  } else {
    s.layers = 32;
    s.hidden = 4096;
    s.heads = s.kv_heads = 32;
    s.ffn = 11008;
    s.vocab = 32000;
    s.positions = 4096;
    s.tied_embeddings = false;
    s.norm_eps = 1e-5f;
    s.rope_theta = 10000.0f;
  }
  return m;
}

}  // namespace

TransformerModel transformer_from_flags(const TransformerFlags& f) {
  using C = TransformerCaps;
  const bool has_config = !f.hf_config.empty();
  HfModel base = has_config ? read_hf_config(f.hf_config) : family_defaults(f.model);
  if (has_config && !f.model.empty() && f.model != base.family)
    throw UsageError("--model " + f.model + ": --hf-config " + f.hf_config + " is a " + base.family +
                     " (model_type " + base.shape.model_type + "); give --model " + base.family + " or leave --model out");
  TransformerShape s = base.shape;
  const bool gpt2 = base.family == "gpt2";
  // Where each size comes from when no flag gives it.
  auto field = [&](const char* gpt2_field, const char* llama_field) {
    return has_config ? (gpt2 ? std::string(gpt2_field) : std::string(llama_field)) + " of --hf-config " + f.hf_config
                      : std::string("the ") + base.family + " default";
  };
  auto take = [&](const std::string& given, const char* flag, int most, int from, const std::string& source) {
    if (given.empty()) return Sized{from, std::to_string(from) + " (" + source + ")"};
    return Sized{parse_positive(flag, given, most), std::string(flag) + " " + given};
  };
  const Sized layers = take(f.layers, "--layers", C::layers, s.layers, field("n_layer", "num_hidden_layers"));
  const Sized hidden = take(f.hidden, "--hidden", C::hidden, s.hidden, field("n_embd", "hidden_size"));
  const Sized heads = take(f.heads, "--heads", C::heads, s.heads, field("n_head", "num_attention_heads"));
  // Without --kv-heads they follow the heads when the config has no num_key_value_heads
  // of its own (and for gpt2, which has none).
  const bool kv_follows = !f.heads.empty() && !(has_config && !gpt2 && s.kv_heads != s.heads);
  const Sized kv_heads = take(f.kv_heads, "--kv-heads", C::heads, kv_follows ? heads.value : s.kv_heads,
                              kv_follows ? "as the heads" : field("n_head", "num_key_value_heads"));
  // gpt2's inner width follows the hidden size unless set (n_inner null is 4 * n_embd).
  const bool ffn_follows = gpt2 && f.ffn.empty() && !f.hidden.empty() && s.ffn == 4 * s.hidden;
  const std::int64_t ffn_from = ffn_follows ? 4LL * hidden.value : s.ffn;
  if (ffn_from > C::ffn)
    throw UsageError("--hidden " + f.hidden + ": gpt2's inner width 4 x hidden = " + std::to_string(ffn_from) +
                     " is above the largest allowed, " + std::to_string(C::ffn) + " (set --ffn)");
  const Sized ffn = take(f.ffn, "--ffn", C::ffn, static_cast<int>(ffn_from), field("n_inner", "intermediate_size"));
  const Sized vocab = take(f.vocab, "--vocab", C::vocab, s.vocab, field("vocab_size", "vocab_size"));
  const Sized positions =
      take(f.positions, "--positions", C::positions, s.positions, field("n_positions", "max_position_embeddings"));
  const Sized seq = take(f.seq, "--seq", C::seq, std::min(1024, positions.value), "min(1024, positions)");

  if (gpt2 && kv_heads.value != heads.value)
    throw UsageError("--kv-heads " + f.kv_heads + ": gpt2 has no grouped-query attention; its kv heads are its heads, " +
                     heads.source);
  if (!base.head_dim_given && hidden.value % heads.value != 0)
    throw UsageError("heads " + heads.source + " do not divide the hidden size " + hidden.source +
                     (gpt2 ? "" : " (a config may set head_dim instead)"));
  if (kv_heads.value > heads.value || heads.value % kv_heads.value != 0)
    throw UsageError("kv heads " + kv_heads.source + " do not divide the heads " + heads.source +
                     " (grouped-query attention: each kv head serves heads / kv_heads query heads)");
  if (seq.value > positions.value)
    throw UsageError("--seq " + std::to_string(seq.value) + " is above the model's positions " + positions.source);
  if (f.attention != "math" && f.attention != "flash")
    throw UsageError("--attention: unknown '" + f.attention + "'; allowed: math, flash");

  s.layers = layers.value;
  s.hidden = hidden.value;
  s.heads = heads.value;
  s.kv_heads = kv_heads.value;
  if (!base.head_dim_given) s.head_dim = hidden.value / heads.value;
  s.ffn = ffn.value;
  s.vocab = vocab.value;
  s.positions = positions.value;
  s.seq = seq.value;
  s.attention = f.attention == "math" ? AttentionMode::math : AttentionMode::flash;

  // The whole model's bytes inside 64 bits, with room: 16 B a parameter (weights,
  // gradients, AdamW's two moments), and a generous bound of what a step of --batch
  // sequences computes, 4 B x batch x seq x (vocab + layers x (64 hidden + 8 ffn +
  // heads x seq)).
  using i128 = __int128;
  const i128 per_block = 4 * i128{s.hidden} * (i128{s.heads} + 2 * s.kv_heads) * s.head_dim +
                         3 * i128{s.hidden} * s.ffn + 16 * i128{s.hidden} + 3 * i128{s.ffn};
  const i128 params = i128{s.layers} * per_block + 2 * i128{s.vocab} * s.hidden + i128{s.positions} * s.hidden;
  constexpr i128 kMost = i128{1} << 62;
  if (16 * params > kMost)
    throw UsageError("the model's sizes (layers " + layers.source + ", hidden " + hidden.source + ", heads " +
                     heads.source + " of " + std::to_string(s.head_dim) + " dimensions, ffn " + ffn.source +
                     ", vocab " + vocab.source + ") make more than 2^62 bytes of model states");
  if (!step_within_bounds(s, f.batch))
    throw UsageError("--batch " + std::to_string(f.batch) + " x --seq " + std::to_string(s.seq) +
                     " tokens make more than 2^62 bytes of activations for this model; lower one of them");
  return {base.family, s};
}

bool step_within_bounds(const TransformerShape& s, std::int64_t batch) {
  using i128 = __int128;
  const i128 tokens = i128{batch} * s.seq;
  const i128 step = 4 * tokens *
                    (i128{s.vocab} + i128{s.layers} * (64 * i128{s.hidden} + 8 * i128{s.ffn} + i128{s.heads} * s.seq));
  return step <= (i128{1} << 62);
}

}  // namespace shardscope
