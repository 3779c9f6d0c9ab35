// Everything a run is told on the command line (docs/design.md §6), as one plain record
// passed down explicitly (no configuration globals).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardscope/comm.hpp"
#include "shardscope/kernel_args.hpp"
#include "shardscope/mesh.hpp"
#include "shardscope/schedule_kind.hpp"
#include "shardscope/strategy_kind.hpp"
#include "shardscope/transformer_args.hpp"

namespace shardscope {

// The shape of a transformer (--model gpt2|llama, or --hf-config): docs/design.md
// says which modules each family has. head_dim is hidden / heads unless a config says
// otherwise; ffn is the MLP's inner width (gpt2: 4 * hidden unless n_inner).
struct TransformerShape {
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;  // == heads for gpt2
  int head_dim = 0;
  int ffn = 0;
  int vocab = 0;
  int seq = 0;        // tokens per sequence
  int positions = 0;  // gpt2's learned positions (n_positions); the config's max_position_embeddings
  bool tied_embeddings = false;  // the head's weight is the token embedding's
  bool qkv_bias = false;         // q, k, v projections with bias (gpt2, qwen2, llama's attention_bias)
  bool out_bias = false;         // the attention output projection with bias (gpt2, llama's attention_bias)
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;   // llama family
  AttentionMode attention = AttentionMode::flash;
  std::string model_type;        // the config.json's model_type ("gpt2", "llama", "mistral", "qwen2"), or the family
};

// The kv heads a rank of a tensor-parallel group of tp holds (docs/design.md, "Tensor
// parallelism of the transformers"): K/T of them when T divides K; one when K divides T
// (fewer kv heads than tp: each kv head replicated on the T/K ranks whose query heads
// read it, kv_replicas of them).
inline int kv_replicas(const TransformerShape& s, int tp) {
  return s.kv_heads > 0 && s.kv_heads < tp ? tp / s.kv_heads : 1;
}
inline int kv_heads_per_rank(const TransformerShape& s, int tp) {
  return s.kv_heads > 0 && s.kv_heads < tp ? 1 : s.kv_heads / tp;
}

// --checkpoint (docs/design.md §2): which blocks torch's non-reentrant checkpoint
// wraps. A model's checkpointable blocks are the MLP's layers and a transformer's
// blocks (h.i, layers.i), never its embedding or final block; they are numbered
// c = 0, 1, ... in model order, and every:K wraps those with c % K == 0 (full is
// every:1). A wrapped block saves only its input in forward and re-runs its whole
// forward at the start of its backward. `attention` wraps no block: a transformer's
// attention core (Korthikanti et al.'s selective recompute) drops the probabilities it
// would save, under math attention, and recomputes them in backward (flash attention
// saves none: its backward recomputes them from the log-sum-exp already).
enum class CheckpointKind : std::uint8_t { none, every, attention };
struct CheckpointPolicy {
  CheckpointKind kind = CheckpointKind::none;
  int every = 1;  // K of every:K; full is 1

  bool any() const { return kind != CheckpointKind::none; }
  // --checkpoint attention: every transformer block's attention core recomputed.
  bool attention() const { return kind == CheckpointKind::attention; }
  // Whether the c-th checkpointable block is wrapped.
  bool wraps(int c) const { return kind == CheckpointKind::every && c % every == 0; }
  // How many of n checkpointable blocks are wrapped: ceil(n / K), or 0.
  int wrapped_of(int n) const { return kind == CheckpointKind::every ? (n + every - 1) / every : 0; }
  // "none", "full", "every:K", "attention": the flag's spelling, for labels.
  std::string text() const {
    if (kind == CheckpointKind::none) return "none";
    if (kind == CheckpointKind::attention) return "attention";
    return every == 1 ? "full" : "every:" + std::to_string(every);
  }
};

struct ModelConfig {
  std::string name = "mlp";  // --model: the registry's entry (harness/model/registry.cpp)
  TransformerShape transformer;  // when name is a transformer family (gpt2, llama)
  int layers = 8;
  int width = 256;
  int batch = 32;  // rows per rank (data parallel) or per pipeline (pipeline)
  Activation activation = Activation::none;
  Loss loss = Loss::sum;
  CheckpointPolicy checkpoint;  // --checkpoint
  // --precision bf16 with the torch engine: a transformer runs as torch.autocast(bfloat16)
  // runs it (bf16 GEMMs on casts of their inputs and weights, norms and loss in fp32).
  bool autocast = false;
  // --autocast-region step (a bf16 pipeline): one autocast region around a stage's whole
  // schedule step, each parameter cast once and held to the step's end (false: each
  // micro-batch's forward its own region, the default).
  bool autocast_step = false;
  // --precision bf16 under zero2/zero3/hsdp: FSDP's MixedPrecision(param_dtype=bf16,
  // reduce_dtype=fp32). No autocast: the strategy hands each block its parameters as bf16
  // (views of the gathered bf16 unit) and takes its parameter gradients in bf16; the
  // model runs in bf16 on them (the MLP only; harness/model/mlp.cpp).
  bool param_bf16 = false;
  // --sp with --mesh tp > 1 (a transformer): Megatron's sequence parallelism, the norms'
  // and residuals' regions holding a tensor-parallel rank's N/T tokens (docs/design.md,
  // "Sequence parallelism").
  bool sequence_parallel = false;

  // gpt2 or llama: the shape is `transformer`, and the MLP's sizes below do not apply
  // (harness/predict/transformer_forms.hpp has the transformer's).
  bool is_transformer() const { return name != "mlp"; }

  std::int64_t weight_elems() const { return static_cast<std::int64_t>(width) * width; }
  std::int64_t layer_elems() const { return weight_elems() + width; }
  std::int64_t params() const { return layers * layer_elems(); }
  int param_tensors() const { return 2 * layers; }
  // Parameter tensors in torch's order: weight 0, bias 0, weight 1, bias 1, ...
  std::int64_t tensor_elems(int t) const { return t % 2 == 0 ? weight_elems() : width; }
  std::int64_t activation_bytes(int rows) const {
    return static_cast<std::int64_t>(rows) * width * 4;
  }
};

struct RunConfig {
  ModelConfig model;
  int steps = 3;
  std::uint64_t seed = 0;

  // Data parallel (when there is no `schedule`).
  StrategyKind strategy = StrategyKind::ddp;
  EngineKind engine = EngineKind::torch;  // --engine: whose layout zero2/zero3 take
  PrecisionKind precision = PrecisionKind::fp32;  // --precision: fp32, or the engine's bf16 regime
  int layers_per_unit = 0;  // --units K; 0 = "all" (one root unit)
  int prefetch = 1;
  std::string ddp_bucket = "view";  // view | copy
  double bucket_mb = 0.0;           // 0 = one flat bucket
  // zero3 under --engine deepspeed: a parameter tensor of at most this many elements stays
  // gathered between steps (DeepSpeed's stage3_param_persistence_threshold; its default).
  std::int64_t param_persistence = 100'000;
  // --strategy hsdp --shard-group G: zero3 (FSDP's HYBRID_SHARD) sharded within groups of
  // G consecutive ranks and replicated across them; 0: not hybrid. `strategy` is zero3.
  int shard_group = 0;
  // --accumulate K: micro-steps per optimizer step, each on the rank's whole batch (K x
  // batch rows per optimizer step), the loss scaled by 1/K, gradients accumulated.
  int accumulate = 1;
  // --no-sync: gradients are reduced after the last micro-step only (DDP's no_sync on the
  // others); without it every micro-step reduces (communication x K).
  bool no_sync = false;
  // --overlap on|off (docs/design.md, "Overlap"): ddp's and zero1's buckets are
  // all-reduced while backward continues, zero2/zero3's backward prefetch all-gathers
  // while the unit above computes; off: every collective blocks where it is called.
  bool overlap = true;

  // Pipeline.
  std::optional<ScheduleKind> schedule;  // --schedule; none = data parallel
  int microbatches = 0;  // 0 = one per stage
  int chunks = 1;
  std::vector<int> split;

  // --mesh dp=D,tp=T,pp=S (mesh.hpp); not given: the world is one data-parallel group or
  // one pipeline.
  MeshShape mesh;

  // Where it runs.
  std::string backend;  // empty = cuda when a GPU is visible, else cpu
  std::string comm;     // empty = chosen from backend and launch
  int emulate_world = 0;
  int emulate_rank = 0;
  bool allow_tf32 = false;
  // --comm-timeout: the most any one collective may wait, in seconds (kDefaultCommTimeoutSeconds).
  double comm_timeout_s = kDefaultCommTimeoutSeconds;

  bool timeline = true;     // --timeline on|off: record the memory timeline and spans
  std::string json_path;
  std::string trace_path;   // --trace FILE: Chrome trace-event JSON, written by rank 0
  std::string csv_dir;      // --csv DIR: data_parallel.csv, pipeline.csv, written by rank 0
  bool wide_tables = false; // --wide: the tables with every column
  bool exact_bytes = false; // --bytes exact: bytes in the tables to the byte
  std::string command_line;

  bool pipeline() const { return schedule.has_value(); }
  bool hybrid() const { return shard_group > 0; }
};

}  // namespace shardscope
