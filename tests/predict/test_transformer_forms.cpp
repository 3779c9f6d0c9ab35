// The transformers' closed forms (harness/predict/transformer_forms): parameters per
// block and per model against the published counts and against the per-block formulas
// written out by hand here; the tensor list in torch's order; FSDP's units as the
// transformer wrap policy forms them; and the model states per rank of every strategy,
// each against its formula (docs/formulas.md, "Transformers"), at sizes up to an
// 80-layer 70B model at W = 65,536.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <vector>

#include "harness/predict/transformer_forms.hpp"
#include "harness/strategies/partition.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {
namespace {

using i64 = std::int64_t;

TransformerShape gpt2_124m() {
  TransformerShape s;
  s.model_type = "gpt2";
  s.layers = 12;
  s.hidden = 768;
  s.heads = s.kv_heads = 12;
  s.head_dim = 64;
  s.ffn = 3072;
  s.vocab = 50257;
  s.positions = 1024;
  s.seq = 1024;
  s.tied_embeddings = true;
  s.qkv_bias = s.out_bias = true;
  return s;
}

TransformerShape llama(int layers, int hidden, int heads, int kv_heads, int ffn, int vocab) {
  TransformerShape s;
  s.model_type = "llama";
  s.layers = layers;
  s.hidden = hidden;
  s.heads = heads;
  s.kv_heads = kv_heads;
  s.head_dim = hidden / heads;
  s.ffn = ffn;
  s.vocab = vocab;
  s.positions = 4096;
  s.seq = 1024;
  return s;
}

TransformerShape llama2_7b() { return llama(32, 4096, 32, 32, 11008, 32000); }
TransformerShape llama3_8b() { return llama(32, 4096, 32, 8, 14336, 128256); }
TransformerShape llama2_70b() { return llama(80, 8192, 64, 8, 28672, 32000); }

TransformerShape qwen2_05b() {
  TransformerShape s = llama(24, 896, 14, 2, 4864, 151936);
  s.model_type = "qwen2";
  s.tied_embeddings = true;
  s.qkv_bias = true;
  return s;
}

TEST(TransformerForms, ParameterCountsAreThePublishedOnes) {
  EXPECT_EQ(transformer_params(gpt2_124m()), 124'439'808);
  EXPECT_EQ(transformer_params(llama2_7b()), 6'738'415'616);
  EXPECT_EQ(transformer_params(llama3_8b()), 8'030'261'248);
  EXPECT_EQ(transformer_params(llama2_70b()), 68'976'648'192);
  EXPECT_EQ(transformer_params(qwen2_05b()), 494'032'768);
}

// A block's parameters written out: gpt2 12h² + 13h with f = 4h; llama 2h·a·d + 2h·k·d
// + 3hf + 2h (and the biases).
TEST(TransformerForms, BlockParametersFollowTheirFormulas) {
  for (const int h : {64, 768, 1600}) {
    TransformerShape s = gpt2_124m();
    s.hidden = h;
    s.ffn = 4 * h;
    EXPECT_EQ(block_params(s), 12LL * h * h + 13LL * h) << h;
    s.ffn = 3 * h;  // n_inner set: h·3h + 3h + h² + h + 2·(h·f) + f + h + 4h
    EXPECT_EQ(block_params(s), 4LL * h * h + 4LL * h + 2LL * h * s.ffn + s.ffn + h + 4LL * h) << h;
  }
  const TransformerShape l = llama3_8b();
  const i64 h = l.hidden, q = 32LL * 128, kv = 8LL * 128, f = l.ffn;
  EXPECT_EQ(block_params(l), 2 * h * q + 2 * h * kv + 3 * h * f + 2 * h);
  TransformerShape biased = l;
  biased.qkv_bias = biased.out_bias = true;  // llama's attention_bias
  EXPECT_EQ(block_params(biased), block_params(l) + q + 2 * kv + h);
  EXPECT_EQ(block_param_tensors(biased), block_param_tensors(l) + 4);
  // An explicit head_dim (heads · head_dim need not be hidden).
  TransformerShape wide = l;
  wide.head_dim = 256;
  EXPECT_EQ(block_params(wide), 2 * h * 32 * 256 + 2 * h * 8 * 256 + 3 * h * f + 2 * h);
  // Tying removes the head: V·h.
  TransformerShape tied = l;
  tied.tied_embeddings = true;
  EXPECT_EQ(transformer_params(l) - transformer_params(tied), static_cast<i64>(l.vocab) * l.hidden);
  EXPECT_EQ(transformer_param_tensors(l) - transformer_param_tensors(tied), 1);
}

TEST(TransformerForms, TensorsAreTorchsInOrderAndSumToTheModel) {
  for (const TransformerShape& s : {gpt2_124m(), llama2_7b(), llama3_8b(), qwen2_05b()}) {
    const std::vector<TransformerTensor> tensors = transformer_tensors(s);
    ASSERT_EQ(static_cast<int>(tensors.size()), transformer_param_tensors(s));
    const std::vector<i64> sizes = transformer_tensor_sizes(s);
    ASSERT_EQ(sizes.size(), tensors.size());
    i64 sum = 0;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      EXPECT_EQ(sizes[t], tensors[t].elems) << tensors[t].name;
      sum += tensors[t].elems;
      if (t > 0) {
        EXPECT_GE(tensors[t].block, tensors[t - 1].block);
      }
    }
    EXPECT_EQ(sum, transformer_params(s));
    const std::vector<i64> blocks = transformer_block_sizes(s);
    ASSERT_EQ(static_cast<int>(blocks.size()), s.layers + 2);
    EXPECT_EQ(std::accumulate(blocks.begin(), blocks.end(), i64{0}), transformer_params(s));
  }
  // gpt2 as nanoGPT's named_parameters(): the head is the token embedding, listed once.
  const std::vector<TransformerTensor> g = transformer_tensors(gpt2_124m());
  ASSERT_EQ(g.size(), 148u);  // 2 + 12 x 12 + 2
  EXPECT_EQ(g[0].name, "transformer.wte.weight");
  EXPECT_EQ(g[0].elems, 50257LL * 768);
  EXPECT_EQ(g[1].name, "transformer.wpe.weight");
  EXPECT_EQ(g[2].name, "transformer.h.0.ln_1.weight");
  EXPECT_EQ(g[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(g[4].elems, 768LL * 2304);
  EXPECT_EQ(g[13].name, "transformer.h.0.mlp.c_proj.bias");
  EXPECT_EQ(g[146].name, "transformer.ln_f.weight");
  EXPECT_EQ(g[147].name, "transformer.ln_f.bias");
  EXPECT_EQ(g[147].block, 13);
  // Llama as LlamaForCausalLM's: attention, MLP, then the two norms; lm_head last.
  const std::vector<TransformerTensor> l = transformer_tensors(llama3_8b());
  ASSERT_EQ(l.size(), 1u + 32 * 9 + 2);
  EXPECT_EQ(l[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(l[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(l[2].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(l[2].elems, 1024LL * 4096);
  EXPECT_EQ(l[5].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(l[8].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(l[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(l[l.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(l.back().name, "lm_head.weight");
  EXPECT_EQ(l.back().block, 33);
  // qwen2: q, k and v with bias, o without.
  const std::vector<TransformerTensor> q = transformer_tensors(qwen2_05b());
  EXPECT_EQ(q[2].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(q[2].elems, 896);
  EXPECT_EQ(q[7].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(q[8].name, "model.layers.0.mlp.gate_proj.weight");
}

// The transformer wrap policy: each block its own unit, the root the rest (embeddings,
// final norm and head: blocks 0 and L + 1, not contiguous).
TEST(TransformerForms, UnitsAreBlocksAndARootOfTheRest) {
  const TransformerShape s = llama2_7b();
  const std::vector<i64> sizes = transformer_block_sizes(s);
  const std::vector<std::vector<int>> one = transformer_unit_blocks(s, 1);
  ASSERT_EQ(one.size(), 33u);
  EXPECT_EQ(one[0], (std::vector<int>{0, 33}));
  EXPECT_EQ(one[1], (std::vector<int>{1}));
  EXPECT_EQ(one[32], (std::vector<int>{32}));
  const std::vector<std::vector<int>> three = transformer_unit_blocks(s, 3);
  ASSERT_EQ(three.size(), 1u + 11);  // 32 blocks: ten of 3, one of 2
  EXPECT_EQ(three[11], (std::vector<int>{31, 32}));
  EXPECT_EQ(transformer_unit_blocks(s, 0).size(), 1u);
  EXPECT_EQ(transformer_unit_blocks(s, 0)[0].size(), 34u);

  const int W = 7;
  const std::vector<Unit> units = fsdp_units(sizes, one, W);
  const i64 root = embedding_params(s) + final_params(s);
  EXPECT_EQ(units[0].elems, root);
  EXPECT_EQ(units[0].blocks, (std::vector<int>{0, 33}));
  EXPECT_EQ(units[0].shard, (root + W - 1) / W);
  EXPECT_EQ(units[0].padded, units[0].shard * W);
  EXPECT_TRUE(units[1].blocks.empty());  // contiguous
  EXPECT_EQ(units[1].elems, block_params(s));
  EXPECT_EQ(units[1].flat_offset, embedding_params(s));
  EXPECT_EQ(units[32].flat_offset, embedding_params(s) + 31 * block_params(s));
  ModelConfig m;
  m.name = "llama";
  m.transformer = s;
  const std::vector<Unit> via_config = fsdp_units(m, 1, W);
  ASSERT_EQ(via_config.size(), units.size());
  for (std::size_t u = 0; u < units.size(); ++u) EXPECT_EQ(via_config[u].elems, units[u].elems);
}

RunConfig config(const TransformerShape& s, StrategyKind strategy, int layers_per_unit = 1) {
  RunConfig c;
  c.model.name = s.model_type == "gpt2" ? "gpt2" : "llama";
  c.model.transformer = s;
  c.model.layers = s.layers;
  c.model.width = s.hidden;
  c.model.batch = 1;
  c.strategy = strategy;
  c.layers_per_unit = layers_per_unit;
  return c;
}

i64 comm(const Prediction& p, CollKind k) { return p.comm_bytes[static_cast<int>(k)]; }

TEST(TransformerForms, ModelStatesPerRankFollowEachStrategysForm) {
  for (const TransformerShape& s : {gpt2_124m(), llama3_8b(), qwen2_05b()}) {
    const i64 P = transformer_params(s);
    const i64 T = transformer_param_tensors(s);
    for (const int W : {1, 3, 8, 64}) {
      SCOPED_TRACE(s.model_type + " W=" + std::to_string(W));
      // ddp: 4P + 4P + 8P + 4T on every rank.
      for (const Prediction& p : predict_data_parallel_ranks(config(s, StrategyKind::ddp), W)) {
        EXPECT_EQ(p.resting.total(), 16 * P + 4 * T);
        EXPECT_TRUE(p.peak_known);  // gpt2_forms.hpp and llama_forms.hpp have each family's step
        EXPECT_EQ(comm(p, CollKind::all_reduce), 4 * P);
      }
      RunConfig copy = config(s, StrategyKind::ddp);
      copy.ddp_bucket = "copy";
      EXPECT_EQ(predict_data_parallel(copy, W, 0).resting[Category::grad], 8 * P);
      // zero1: every tensor's state on exactly one rank, whole; the ranks' optimizer
      // state sums to 8P + 4T and none exceeds the largest tensor above the mean.
      const std::vector<Prediction> z1 = predict_data_parallel_ranks(config(s, StrategyKind::zero1), W);
      i64 optim = 0, most = 0;
      for (const Prediction& p : z1) {
        EXPECT_EQ(p.resting[Category::param], 4 * P);
        EXPECT_EQ(p.resting[Category::grad], 4 * P);
        EXPECT_EQ(comm(p, CollKind::broadcast), 4 * P);
        optim += p.resting[Category::optim];
        most = std::max(most, p.resting[Category::optim]);
      }
      EXPECT_EQ(optim, 8 * P + 4 * T);
      const std::vector<i64> sizes = transformer_tensor_sizes(s);
      const i64 largest = *std::max_element(sizes.begin(), sizes.end());
      EXPECT_LE(most, (8 * P + 4 * T) / W + 8 * largest + 4 * T);
      // zero2 and zero3, a unit per block and a root: Σ_u 16 ceil(P_u / W) + 4U, the
      // root's P_u = embeddings + final, each block's its own.
      const i64 root = embedding_params(s) + final_params(s), block = block_params(s);
      auto ceil_div = [&](i64 n) { return (n + W - 1) / W; };
      const i64 U = s.layers + 1;
      const i64 expected = 16 * (ceil_div(root) + s.layers * ceil_div(block)) + 4 * U;
      const i64 gathered = 4 * W * (ceil_div(root) + s.layers * ceil_div(block));
      for (const StrategyKind k : {StrategyKind::zero2, StrategyKind::zero3}) {
        const Prediction p = predict_data_parallel(config(s, k), W, W - 1);
        EXPECT_EQ(p.resting.total(), expected);
        EXPECT_EQ(comm(p, CollKind::reduce_scatter), gathered);
        // zero3 gathers every block's unit again in backward; the root once.
        EXPECT_EQ(comm(p, CollKind::all_gather),
                  k == StrategyKind::zero2 ? gathered : gathered + 4 * W * s.layers * ceil_div(block));
      }
      // --units all: one root unit of everything.
      const Prediction all = predict_data_parallel(config(s, StrategyKind::zero3, 0), W, 0);
      EXPECT_EQ(all.resting.total(), 16 * ceil_div(P) + 4);
      EXPECT_EQ(comm(all, CollKind::all_gather), 4 * W * ceil_div(P));
    }
  }
}

// Random shapes of both families, every strategy: each rank's model states against a
// partition written here the slow way (zero1: a scan for the least-loaded rank per tensor,
// in size order; FSDP: the units' elements summed from the tensor list by block).
TEST(TransformerForms, RandomShapesMatchAPartitionWrittenTheSlowWay) {
  std::mt19937 rng(14);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 60; ++trial) {
    const bool gpt2 = trial % 2 == 0;
    const int heads = pick(1, 6), per_head = pick(1, 12);
    TransformerShape s = gpt2 ? gpt2_124m() : llama(1, 1, 1, 1, 1, 1);
    s.model_type = gpt2 ? "gpt2" : (trial % 3 == 0 ? "qwen2" : "llama");
    s.layers = pick(1, 9);
    s.heads = heads;
    s.kv_heads = gpt2 ? heads : heads / std::max(1, pick(1, heads));
    while (heads % s.kv_heads != 0) --s.kv_heads;
    s.head_dim = per_head;
    s.hidden = heads * per_head;
    s.ffn = pick(1, 80);
    s.vocab = pick(1, 500);
    s.positions = pick(1, 64);
    s.tied_embeddings = pick(0, 1) == 1;
    s.qkv_bias = gpt2 || s.model_type == "qwen2" || pick(0, 1) == 1;
    s.out_bias = gpt2 || (s.model_type == "llama" && s.qkv_bias);
    const int W = pick(1, 13), K = pick(0, 4);
    SCOPED_TRACE(s.model_type + " trial " + std::to_string(trial) + " W=" + std::to_string(W) + " K=" +
                 std::to_string(K));
    const std::vector<TransformerTensor> tensors = transformer_tensors(s);
    const i64 P = transformer_params(s);
    // zero1, the slow way.
    std::vector<int> order(tensors.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return tensors[a].elems > tensors[b].elems; });
    std::vector<i64> load(W, 0), optim(W, 0);
    for (const int t : order) {
      int least = 0;
      for (int r = 1; r < W; ++r)
        if (load[r] < load[least]) least = r;
      load[least] += tensors[t].elems;
      optim[least] += 8 * tensors[t].elems + 4;
    }
    const std::vector<Prediction> z1 = predict_data_parallel_ranks(config(s, StrategyKind::zero1), W);
    for (int r = 0; r < W; ++r) EXPECT_EQ(z1[r].resting.total(), 8 * P + optim[r]) << "rank " << r;
    // FSDP units, the slow way: the root holds blocks 0 and L + 1 (or, with K = 0, all).
    std::vector<i64> unit_elems;
    const int L = s.layers;
    auto unit_of = [&](int block) {
      if (K == 0) return 0;
      if (block == 0 || block == L + 1) return 0;
      return 1 + (block - 1) / K;
    };
    for (const TransformerTensor& t : tensors) {
      const int u = unit_of(t.block);
      if (static_cast<int>(unit_elems.size()) <= u) unit_elems.resize(u + 1, 0);
      unit_elems[u] += t.elems;
    }
    i64 resting = 0, gathered = 0;
    for (const i64 e : unit_elems) {
      const i64 shard = (e + W - 1) / W;
      resting += 16 * shard + 4;
      gathered += 4 * shard * W;
    }
    for (const StrategyKind k : {StrategyKind::zero2, StrategyKind::zero3}) {
      const Prediction p = predict_data_parallel(config(s, k, K), W, pick(0, W - 1));
      EXPECT_EQ(p.resting.total(), resting);
      EXPECT_EQ(comm(p, CollKind::reduce_scatter), gathered);
      const i64 root = 4 * W * ((unit_elems[0] + W - 1) / W);
      EXPECT_EQ(comm(p, CollKind::all_gather), k == StrategyKind::zero2 ? gathered : 2 * gathered - root);
    }
  }
}

// The whole plan's forms for an 80-layer 70B model at 65,536 ranks: at once.
TEST(TransformerForms, SeventyBillionAtSixtyFiveThousandRanksAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  const TransformerShape s = llama2_70b();
  const i64 P = transformer_params(s);
  const int W = 65'536;
  for (const StrategyKind k : {StrategyKind::ddp, StrategyKind::zero1, StrategyKind::zero2, StrategyKind::zero3}) {
    const std::vector<Prediction> ranks = predict_data_parallel_ranks(config(s, k), W);
    ASSERT_EQ(static_cast<int>(ranks.size()), W);
    if (k == StrategyKind::zero1) {
      // 723 tensors over 65,536 ranks: most own none and hold 8P of params and grads only.
      EXPECT_EQ(ranks.back().resting.total(), 8 * P);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0) << "the forms should be O(tensors + units + world)";
}

}  // namespace
}  // namespace shardscope
