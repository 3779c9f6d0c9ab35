// A Hugging Face config.json to a transformer's shape. The fields read, as transformers'
// GPT2Config, LlamaConfig, MistralConfig and Qwen2Config name them:
//   gpt2: n_layer n_embd n_head n_positions vocab_size; n_inner (absent or null: 4 * n_embd),
//         tie_word_embeddings (default true), layer_norm_epsilon (default 1e-5)
//   llama, mistral, qwen2: hidden_size intermediate_size num_hidden_layers
//         num_attention_heads vocab_size max_position_embeddings; num_key_value_heads
//         (absent or null: the heads), head_dim (absent or null: hidden / heads),
//         tie_word_embeddings (default false), rms_norm_eps (default 1e-6), rope_theta
//         (default 10000), attention_bias (llama, mistral: q, k, v and o with bias; default
//         false); qwen2's q, k and v always have a bias and o none.
// Every other field is ignored (dropout, token ids, dtype, rope_scaling: none changes
// the parameters or the bytes of fp32 training).
#include "harness/cli/hf_config.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "harness/cli/transformer_flags.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// The JSON type of `v`, as a message says it.
std::string type_words(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number with a fraction";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

class Fields {
 public:
  Fields(const json& doc, std::string path) : doc_(doc), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw UsageError("--hf-config " + path_ + ": " + field + ": " + what);
  }

  // A present, non-null member, or nullptr.
  const json* find(const std::string& field) const {
    const auto it = doc_.find(field);
    return it == doc_.end() || it->is_null() ? nullptr : &*it;
  }

  // A required positive integer, at most `most`.
  int positive(const std::string& field, int most) const {
    const json* v = find(field);
    if (!v) fail(field, doc_.contains(field) ? "null; expected a positive integer" : "missing; expected a positive integer");
    return positive_value(field, *v, most);
  }

  // An optional positive integer.
  std::optional<int> optional_positive(const std::string& field, int most) const {
    const json* v = find(field);
    if (!v) return std::nullopt;
    return positive_value(field, *v, most);
  }

  bool boolean(const std::string& field, bool absent) const {
    const json* v = find(field);
    if (!v) return absent;
    if (!v->is_boolean()) fail(field, type_words(*v) + "; expected true or false");
    return v->get<bool>();
  }

  // A positive number (an epsilon, a rope base).
  float number(const std::string& field, float absent) const {
    const json* v = find(field);
    if (!v) return absent;
    if (!v->is_number()) fail(field, type_words(*v) + "; expected a positive number");
    const double x = v->get<double>();
    if (!(x > 0.0) || x > 1e30) fail(field, v->dump() + " is out of range; expected a positive number");
    return static_cast<float>(x);
  }

  std::string text(const std::string& field) const {
    const json* v = find(field);
    if (!v) fail(field, doc_.contains(field) ? "null; expected a string" : "missing; expected a string");
    if (!v->is_string()) fail(field, type_words(*v) + "; expected a string");
    return v->get<std::string>();
  }

 private:
  int positive_value(const std::string& field, const json& v, int most) const {
    if (!v.is_number_integer() && !v.is_number_unsigned())
      fail(field, type_words(v) + (v.is_number() ? " (" + v.dump() + ")" : "") + "; expected a positive integer");
    if (v.is_number_unsigned() ? v.get<std::uint64_t>() > static_cast<std::uint64_t>(most)
                               : v.get<std::int64_t>() > most)
      fail(field, v.dump() + " is above the largest allowed, " + std::to_string(most));
    if (v.get<std::int64_t>() < 1) fail(field, v.dump() + " is not a positive integer");
    return static_cast<int>(v.get<std::int64_t>());
  }

  const json& doc_;
  std::string path_;
};

HfModel read_gpt2(const Fields& f) {
  using C = TransformerCaps;
  HfModel m;
  m.family = "gpt2";
  TransformerShape& s = m.shape;
  s.model_type = "gpt2";
  s.layers = f.positive("n_layer", C::layers);
  s.hidden = f.positive("n_embd", C::hidden);
  s.heads = f.positive("n_head", C::heads);
  s.kv_heads = s.heads;
  s.positions = f.positive("n_positions", C::positions);
  s.vocab = f.positive("vocab_size", C::vocab);
  const std::optional<int> inner = f.optional_positive("n_inner", C::ffn);
  // n_inner null means 4 * n_embd (GPT2MLP); the cap on --ffn holds for it too.
  const std::int64_t ffn = inner ? *inner : 4LL * s.hidden;
  if (ffn > C::ffn)
    f.fail("n_inner", "absent, so 4 * n_embd = " + std::to_string(ffn) + ", above the largest allowed, " +
                          std::to_string(C::ffn));
  s.ffn = static_cast<int>(ffn);
  s.tied_embeddings = f.boolean("tie_word_embeddings", true);
  s.qkv_bias = s.out_bias = true;
  s.norm_eps = f.number("layer_norm_epsilon", 1e-5f);
  return m;
}

HfModel read_llama(const Fields& f, const std::string& model_type) {
  using C = TransformerCaps;
  HfModel m;
  m.family = "llama";
  TransformerShape& s = m.shape;
  s.model_type = model_type;
  s.hidden = f.positive("hidden_size", C::hidden);
  s.ffn = f.positive("intermediate_size", C::ffn);
  s.layers = f.positive("num_hidden_layers", C::layers);
  s.heads = f.positive("num_attention_heads", C::heads);
  s.kv_heads = f.optional_positive("num_key_value_heads", C::heads).value_or(s.heads);
  s.vocab = f.positive("vocab_size", C::vocab);
  s.positions = f.positive("max_position_embeddings", C::positions);
  if (const std::optional<int> d = f.optional_positive("head_dim", C::head_dim)) {
    s.head_dim = *d;
    m.head_dim_given = true;
  }
  s.tied_embeddings = f.boolean("tie_word_embeddings", false);
  s.norm_eps = f.number("rms_norm_eps", 1e-6f);
  s.rope_theta = f.number("rope_theta", 10000.0f);
  if (model_type == "qwen2") {
    s.qkv_bias = true;  // Qwen2Attention: q, k, v with bias, o without
    s.out_bias = false;
  } else {
    s.qkv_bias = s.out_bias = f.boolean("attention_bias", false);
  }
  // A bias on gate, up and down (LlamaConfig's mlp_bias) is not modelled: refused, not ignored.
  if (f.boolean("mlp_bias", false)) f.fail("mlp_bias", "true is not modelled (gate, up and down have no bias here); allowed: false");
  return m;
}

}  // namespace

HfModel parse_hf_config(const std::string& text, const std::string& path) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    const std::size_t colon = what.find(": ");  // after "[json.exception.parse_error.101] "
    throw UsageError("--hf-config " + path + ": not JSON (" + (colon == std::string::npos ? what : what.substr(colon + 2)) + ")");
  }
  if (!doc.is_object()) throw UsageError("--hf-config " + path + ": " + type_words(doc) + ", expected a JSON object (a config.json)");
  const Fields f(doc, path);
  const std::string model_type = f.text("model_type");
  if (model_type == "gpt2") return read_gpt2(f);
  if (model_type == "llama" || model_type == "mistral" || model_type == "qwen2") return read_llama(f, model_type);
  f.fail("model_type", "'" + model_type + "' is not a family shardscope models; allowed: gpt2, llama, mistral, qwen2");
}

HfModel read_hf_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("--hf-config " + path + ": cannot read it (" + std::strerror(errno) + ")");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw UsageError("--hf-config " + path + ": cannot read it");
  return parse_hf_config(text.str(), path);
}

}  // namespace shardscope
