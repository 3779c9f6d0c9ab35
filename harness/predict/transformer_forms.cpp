// Parameters of the transformer families, tensor by tensor (docs/formulas.md,
// "Transformers"). h hidden, f ffn, V vocab, n positions, a heads, k kv heads,
// d head_dim, L layers.
//
//   gpt2 (nanoGPT's GPT):   embeddings V·h + n·h; a block 12h² + 13h when f = 4h, in general
//                           ln_1 2h + c_attn (h·3h + 3h) + c_proj (h² + h) + ln_2 2h
//                           + c_fc (h·f + f) + c_proj (f·h + h); final ln_f 2h (+ V·h untied)
//   llama (LlamaForCausalLM): embeddings V·h; a block q h·a·d, k and v h·k·d each, o a·d·h
//                           (biases: q a·d, k and v k·d with qkv_bias, o h with out_bias),
//                           gate, up, down h·f each, two RMSNorms h each; final norm h
//                           (+ V·h untied)
#include "harness/predict/transformer_forms.hpp"

#include <algorithm>

#include "harness/strategies/partition.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

bool is_gpt2(const TransformerShape& s) { return s.model_type == "gpt2"; }

// Calls add(name, elems) for each tensor of block `layer` (0-based), in torch's order: a
// tensor-parallel rank's part when tp > 1 (column-parallel Linears' out/tp rows and
// bias, row-parallel ones' in/tp columns; norms and row-parallel biases whole; Llama's
// kv heads kv/tp each when tp divides them, one (a copy) when they divide tp).
template <typename Add>
void block_tensors(const TransformerShape& s, int layer, Add&& add, int tp = 1) {
  const i64 h = s.hidden, f = s.ffn / tp;
  if (is_gpt2(s)) {
    const i64 hl = h / tp;  // the rank's heads' width
    const std::string p = "transformer.h." + std::to_string(layer) + ".";
    add(p + "ln_1.weight", h);
    add(p + "ln_1.bias", h);
    add(p + "attn.c_attn.weight", 3 * hl * h);
    add(p + "attn.c_attn.bias", 3 * hl);
    add(p + "attn.c_proj.weight", h * hl);
    add(p + "attn.c_proj.bias", h);
    add(p + "ln_2.weight", h);
    add(p + "ln_2.bias", h);
    add(p + "mlp.c_fc.weight", h * f);
    add(p + "mlp.c_fc.bias", f);
    add(p + "mlp.c_proj.weight", f * h);
    add(p + "mlp.c_proj.bias", h);
    return;
  }
  const i64 q = static_cast<i64>(s.heads / tp) * s.head_dim;
  const i64 kv = static_cast<i64>(kv_heads_per_rank(s, tp)) * s.head_dim;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  add(p + "self_attn.q_proj.weight", q * h);
  if (s.qkv_bias) add(p + "self_attn.q_proj.bias", q);
  add(p + "self_attn.k_proj.weight", kv * h);
  if (s.qkv_bias) add(p + "self_attn.k_proj.bias", kv);
  add(p + "self_attn.v_proj.weight", kv * h);
  if (s.qkv_bias) add(p + "self_attn.v_proj.bias", kv);
  add(p + "self_attn.o_proj.weight", h * q);
  if (s.out_bias) add(p + "self_attn.o_proj.bias", h);
  add(p + "mlp.gate_proj.weight", f * h);
  add(p + "mlp.up_proj.weight", f * h);
  add(p + "mlp.down_proj.weight", h * f);
  add(p + "input_layernorm.weight", h);
  add(p + "post_attention_layernorm.weight", h);
}

}  // namespace

std::int64_t kv_replica_all_reduce_bytes(const TransformerShape& s, int tp) {
  if (is_gpt2(s) || kv_replicas(s, tp) == 1) return 0;
  return 8 * static_cast<i64>(s.kv_heads) * s.head_dim * (s.hidden + (s.qkv_bias ? 1 : 0));
}

namespace {

// The token embedding (and an untied head) is vocabulary-parallel under tp: V/tp rows.
template <typename Add>
void embedding_tensors(const TransformerShape& s, Add&& add, int tp = 1) {
  const i64 h = s.hidden;
  if (is_gpt2(s)) {
    add("transformer.wte.weight", static_cast<i64>(s.vocab / tp) * h);
    add("transformer.wpe.weight", static_cast<i64>(s.positions) * h);
  } else {
    add("model.embed_tokens.weight", static_cast<i64>(s.vocab / tp) * h);
  }
}

template <typename Add>
void final_tensors(const TransformerShape& s, Add&& add, int tp = 1) {
  const i64 h = s.hidden;
  if (is_gpt2(s)) {
    add("transformer.ln_f.weight", h);
    add("transformer.ln_f.bias", h);
  } else {
    add("model.norm.weight", h);
  }
  if (!s.tied_embeddings) add("lm_head.weight", static_cast<i64>(s.vocab / tp) * h);
}

// The sum and count of what a tensor walk adds, without naming anything.
struct Tally {
  i64 elems = 0;
  int tensors = 0;
  void operator()(const std::string&, i64 n) {
    elems += n;
    ++tensors;
  }
};

}  // namespace

int transformer_blocks(const TransformerShape& shape) { return shape.layers + 2; }

std::int64_t embedding_params(const TransformerShape& shape) {
  Tally t;
  embedding_tensors(shape, t);
  return t.elems;
}

std::int64_t block_params(const TransformerShape& shape) {
  Tally t;
  block_tensors(shape, 0, t);
  return t.elems;
}

std::int64_t final_params(const TransformerShape& shape) {
  Tally t;
  final_tensors(shape, t);
  return t.elems;
}

std::int64_t transformer_params(const TransformerShape& shape) {
  return embedding_params(shape) + shape.layers * block_params(shape) + final_params(shape);
}

int block_param_tensors(const TransformerShape& shape) {
  Tally t;
  block_tensors(shape, 0, t);
  return t.tensors;
}

int transformer_param_tensors(const TransformerShape& shape) {
  Tally e, f;
  embedding_tensors(shape, e);
  final_tensors(shape, f);
  return e.tensors + shape.layers * block_param_tensors(shape) + f.tensors;
}

std::vector<TransformerTensor> transformer_tensors(const TransformerShape& shape) {
  std::vector<TransformerTensor> out;
  out.reserve(static_cast<std::size_t>(transformer_param_tensors(shape)));
  int block = 0;
  auto add = [&](const std::string& name, i64 elems) { out.push_back({name, elems, block}); };
  embedding_tensors(shape, add);
  for (int l = 0; l < shape.layers; ++l) {
    block = l + 1;
    block_tensors(shape, l, add);
  }
  block = shape.layers + 1;
  final_tensors(shape, add);
  return out;
}

std::vector<std::int64_t> transformer_tensor_sizes(const TransformerShape& shape, int tp) {
  // One block's sizes, repeated: no names are made.
  std::vector<i64> embed, block, last;
  auto into = [](std::vector<i64>& v) { return [&v](const std::string&, i64 n) { v.push_back(n); }; };
  embedding_tensors(shape, into(embed), tp);
  block_tensors(shape, 0, into(block), tp);
  final_tensors(shape, into(last), tp);
  std::vector<i64> out(embed);
  out.reserve(embed.size() + static_cast<std::size_t>(shape.layers) * block.size() + last.size());
  for (int l = 0; l < shape.layers; ++l) out.insert(out.end(), block.begin(), block.end());
  out.insert(out.end(), last.begin(), last.end());
  return out;
}

std::vector<std::int64_t> transformer_block_sizes(const TransformerShape& shape, int tp) {
  Tally embed, block, last;
  embedding_tensors(shape, embed, tp);
  block_tensors(shape, 0, block, tp);
  final_tensors(shape, last, tp);
  std::vector<i64> out(static_cast<std::size_t>(transformer_blocks(shape)), block.elems);
  out.front() = embed.elems;
  out.back() = last.elems;
  return out;
}

std::vector<std::vector<int>> transformer_unit_blocks(const TransformerShape& shape, int blocks_per_unit) {
  const int L = shape.layers;
  std::vector<std::vector<int>> groups;
  if (blocks_per_unit <= 0) {
    groups.emplace_back(static_cast<std::size_t>(transformer_blocks(shape)));
    for (int b = 0; b < transformer_blocks(shape); ++b) groups.back()[b] = b;
    return groups;
  }
  groups.push_back({0, L + 1});  // the root: what no wrapped block holds
  for (int first = 1; first <= L; first += blocks_per_unit) {
    std::vector<int> unit;
    for (int b = first; b < std::min(L + 1, first + blocks_per_unit); ++b) unit.push_back(b);
    groups.push_back(std::move(unit));
  }
  return groups;
}

std::vector<Prediction> transformer_model_states(const RunConfig& cfg, int world) {
  const TransformerShape& shape = cfg.model.transformer;
  const StrategyKind strategy = cfg.strategy;
  Prediction p;
  p.peak_known = false;
  std::vector<i64> optim(static_cast<std::size_t>(world), 0);  // per rank
  auto comm = [&](CollKind kind) -> i64& { return p.comm_bytes[static_cast<int>(kind)]; };
  if (!shards_by_unit(strategy)) {
    const i64 P = transformer_params(shape);
    p.resting[Category::param] = 4 * P;
    p.resting[Category::grad] = 4 * P + (cfg.ddp_bucket == "copy" ? 4 * P : 0);
    if (strategy == StrategyKind::ddp) {
      std::fill(optim.begin(), optim.end(), 8 * P + 4 * transformer_param_tensors(shape));
    } else {
      const std::vector<i64> sizes = transformer_tensor_sizes(shape);
      const std::vector<int> owner = zero1_owners(sizes, world);
      for (std::size_t t = 0; t < sizes.size(); ++t) optim[owner[t]] += 8 * sizes[t] + 4;
      comm(CollKind::broadcast) = 4 * P;
    }
    comm(CollKind::all_reduce) = 4 * P;
  } else {
    // Under --mesh the units are the tensor-parallel rank's (its blocks' tensors at tp).
    const std::vector<Unit> units = fsdp_units(cfg.model, cfg.layers_per_unit, world, cfg.mesh.tp);
    i64 unit_optim = 0, gathered = 0, regathered = 0;
    for (std::size_t u = 0; u < units.size(); ++u) {
      p.resting[Category::param] += 4 * units[u].shard;
      p.resting[Category::grad] += 4 * units[u].shard;
      unit_optim += 8 * units[u].shard + 4;  // exp_avg, exp_avg_sq of the shard, one step
      gathered += 4 * units[u].padded;
      if (!units[u].root) regathered += 4 * units[u].padded;
    }
    std::fill(optim.begin(), optim.end(), unit_optim);
    comm(CollKind::all_gather) = gathered + (strategy == StrategyKind::zero3 ? regathered : 0);
    comm(CollKind::reduce_scatter) = gathered;
  }
  std::vector<Prediction> ranks(static_cast<std::size_t>(world), p);
  for (int r = 0; r < world; ++r) ranks[r].resting[Category::optim] = optim[r];
  return ranks;
}

}  // namespace shardscope
