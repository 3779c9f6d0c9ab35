// A result as plain records: what measurement fills and every printer renders. The
// shardscope/1 JSON document (docs/json.md) is one rendering of these (json_write.cpp),
// and a result file read back is parsed and checked into them once (json_read.cpp), so
// a printer never meets a field of the wrong type.
//
// Every field below is named as its JSON key. std::optional is a field the file may
// hold as null (or, where said, leave out); byte figures are int64, times double ms.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardscope/category.hpp"
#include "shardscope/comm.hpp"

namespace shardscope {

// {"total", "param", ..., "temp"}: bytes per category (kCategoryNames) and their total,
// kept as the file has it (a hand-edited file may disagree with the sum).
struct CategoryFigures {
  std::int64_t total = 0;
  std::array<std::int64_t, kCategoryCount> bytes{};
};

// "peak": the highest total a rank reached, where, and its bytes then.
struct PeakFigures {
  std::int64_t total = 0;
  std::string phase;
  std::string where;
  CategoryFigures by_category;
};

// One collective kind's calls in "comm" (keys kCollKindNames). busbw_gbps is null for
// an emulated run, whose calls move nothing.
struct CollectiveFigures {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;
  double ms = 0.0;
  // The part of ms the step waited for (docs/json.md); files from before the field read
  // it as ms (every call then blocked).
  double exposed_ms = 0.0;
  std::optional<double> busbw_gbps;
};
using CommFigures = std::array<CollectiveFigures, kCollKindCount>;

// {"median", "min", "max"} of the timed steps: null when no step was timed.
struct TimeSummary {
  std::optional<double> median;
  std::optional<double> min;
  std::optional<double> max;
};

// A data-parallel rank's "saved" (and its predicted figures, in "predicted"): what the
// saved-tensor instrument holds when the forward, loss included, has ended: the
// distinct saved storages holding bytes (parameters excluded) and their bytes. Files
// written before these existed leave "saved" out.
struct RankSaved {
  std::int64_t after_forward_bytes = 0;
  std::int64_t after_forward_tensors = 0;
};

// A data-parallel rank's "predicted".
struct RankPredicted {
  std::int64_t resting_total = 0;
  CategoryFigures resting;
  // False: no closed form of the peak in this build (a transformer's before its
  // activation forms); the peak fields are written as null.
  bool peak_known = true;
  std::int64_t peak_total = 0;
  CategoryFigures peak_by_category;
  std::string peak_phase;
  std::string peak_where;
  std::int64_t comm_bytes = 0;
  std::optional<RankSaved> saved;
  std::optional<std::int64_t> model_states;  // --engine deepspeed: the ZeRO paper's model states
};

// The allocator-granular figures: "rounded", "pool" (null on cpu),
// "outside_pool_bytes" (null when unknown) and "outside_pool_source" (where that figure
// came from: "nvml" or "cuda_mem_get_info_delta"; null on cpu, absent in older files).
struct PoolFigures {
  std::int64_t used_current = 0;
  std::int64_t used_high = 0;
  std::int64_t reserved_current = 0;
  std::int64_t reserved_high = 0;
};
// "outside_pool_parts" (null on cpu, absent in older files): the device memory outside the
// pool part by part, each measured around its creation (include/shardscope/backend.hpp,
// OutsidePoolBreakdown; docs/json.md). A part: {"bytes": N or null, "source": "nvml",
// "cuda_mem_get_info_delta" or "not measured"}.
struct MeasuredPartFigures {
  std::optional<std::int64_t> bytes;  // null: not measured
  std::string source = "not measured";
};
// One NCCL communicator: {"communicator", "ranks", "init_bytes", "bytes", "source"}:
// bytes at ncclCommInitRank, and with what its first calls added (NCCL connects lazily).
struct NcclMemoryFigures {
  std::string communicator;
  int ranks = 0;
  std::optional<std::int64_t> init_bytes;
  std::optional<std::int64_t> bytes;
  std::string source = "not measured";
};
struct OutsidePoolParts {
  MeasuredPartFigures cuda_context;
  MeasuredPartFigures cublas;
  std::vector<NcclMemoryFigures> nccl;
  // outside_pool_bytes less the parts above (modules loaded lazily at a kernel's first
  // launch, streams, events...); null when a part it needs was not measured.
  std::optional<std::int64_t> other;
};
struct AllocatorFigures {
  std::int64_t rounded_resting_total = 0;  // "rounded": {"resting_total", "peak_total"}
  std::int64_t rounded_peak_total = 0;
  std::optional<PoolFigures> pool;
  std::optional<std::int64_t> outside_pool_bytes;
  std::optional<std::string> outside_pool_source;
  std::optional<OutsidePoolParts> outside_pool_parts;
};

// A rank's "timeline" (records.hpp, timeline_record, says what each part holds).
struct TimelineRow {
  double t_ms = 0.0;
  std::array<std::int64_t, kCategoryCount> bytes{};
};
struct TimelineMark {
  double t_ms = 0.0;
  std::string phase;
  std::string place;
};
struct TimelineSpanRecord {
  std::string name;
  double start_ms = 0.0;
  double end_ms = 0.0;
  int depth = 0;
  std::optional<std::int64_t> bytes;  // collectives and p2p only; left out otherwise
  // "communication" for a non-blocking collective (kCommunicationTrack); left out for
  // the ranges.
  std::optional<std::string> track;
};
struct TimelineRecord {
  std::string unit = "ms since the run started";
  bool coalesced = false;
  std::int64_t merged_events = 0;
  std::int64_t events = 0;
  std::int64_t sample_limit = 0;
  // "categories" is always kCategoryNames, the order of every row's bytes.
  std::vector<TimelineRow> memory;
  std::vector<TimelineMark> marks;
  std::int64_t dropped_marks = 0;
  std::vector<TimelineSpanRecord> spans;
  std::int64_t dropped_spans = 0;
};

// Where a rank ran: its rank on the node and its GPU (null on cpu). Files written before
// these existed leave both out.
struct Placement {
  int local_rank = 0;
  std::optional<int> device;
};

// Under --mesh, one axis's group of a rank ("comm_groups": {"dp": {...}, "tp": {...},
// "pp": {...}}): its size, the rank's place in it, its members (world ranks, in the
// group's order), its own ledger (busbw with the group's size) and the bytes predicted.
struct GroupCommRecord {
  std::string axis;  // "dp", "tp", "pp"; HSDP's "shard", "replicate"
  int world = 1;
  int rank = 0;
  std::vector<int> members;
  CommFigures comm;
  std::int64_t comm_bytes = 0;
  std::int64_t predicted_comm_bytes = 0;
};

// A run's "mesh" (--mesh dp=D,tp=T,pp=S); left out without --mesh.
struct MeshRecord {
  int dp = 1;
  int tp = 1;
  int pp = 1;
  bool sp = false;  // --sp: "sp": true (left out without it)
};

// One rank of a data-parallel run ("runs[].ranks[]").
struct RankRecord {
  int rank = 0;
  CategoryFigures resting;
  PeakFigures peak;
  RankPredicted predicted;
  AllocatorFigures allocator;
  CommFigures comm;
  std::int64_t comm_bytes = 0;
  TimeSummary step_ms;
  std::vector<double> step_ms_all;
  TimeSummary comm_ms;  // the step's time inside collectives
  std::vector<double> comm_ms_all;
  // The part of comm_ms the step waited for (each step's exposed_ms summed over kinds):
  // comm_ms itself when every collective blocked; files from before it read comm_ms.
  TimeSummary comm_exposed_ms;
  std::vector<double> comm_exposed_ms_all;
  std::vector<double> loss;
  std::optional<TimelineRecord> timeline;  // left out when not recorded
  std::optional<Placement> placement;
  std::optional<RankSaved> saved;
  // Under --mesh: "comm" sums every group's ledger (its busbw null, a sum over groups of
  // different sizes having none) and each group's is here.
  std::optional<std::vector<GroupCommRecord>> comm_groups;
};

// A pipeline stage's saved-tensor counts ("saved", and the same four in "predicted").
struct SavedFigures {
  std::int64_t peak_live_tensors = 0;
  std::int64_t peak_live_bytes = 0;
  std::int64_t total_tensors = 0;
  std::int64_t before_first_backward = 0;
};

// A pipeline stage's "predicted".
struct StagePredicted {
  SavedFigures saved;  // its four fields sit at the top of "predicted"
  std::int64_t resting_total = 0;
  std::int64_t peak_total = 0;
  CategoryFigures peak_by_category;
  std::int64_t p2p_sent_bytes = 0;
  std::int64_t comm_bytes = 0;  // sent and received
  int peak_live_microbatches = 0;
  int peak_live_microbatches_theory = 0;
  int peak_held_microbatches = 0;
  int peak_held_microbatches_theory = 0;
};

// {"action", "microbatch", "chunk", "ms"}: one action of the last step.
struct ActionTime {
  std::string action;
  int microbatch = 0;
  int chunk = 0;
  double ms = 0.0;
};

using LayerRange = std::array<int, 2>;  // first and last layer, inclusive

// One stage of a pipeline run ("runs[].stages[]").
struct StageRecord {
  int stage = 0;
  int rank = 0;
  int world = 0;
  LayerRange layers{};
  std::optional<std::vector<LayerRange>> chunks_layers;  // left out with one chunk
  SavedFigures saved;
  StagePredicted predicted;
  CategoryFigures resting;
  PeakFigures peak;
  AllocatorFigures allocator;
  std::int64_t p2p_sent_bytes = 0;  // "p2p": {"sent_bytes", "recv_bytes", "peak_comm_bytes"}
  std::int64_t p2p_recv_bytes = 0;
  std::int64_t p2p_peak_comm_bytes = 0;
  // "p2p": {"dtype"}: "bf16" when what the stages exchange is bf16 (the MLP under autocast:
  // its bytes are then 2 a element); left out when fp32.
  std::optional<std::string> p2p_dtype;
  CommFigures comm;
  std::int64_t comm_bytes = 0;
  std::optional<double> busy_ms;
  TimeSummary step_ms;
  std::vector<double> step_ms_all;
  std::optional<double> actions_end_ms;
  std::optional<double> bubble_fraction;
  std::optional<double> bubble_fraction_replayed;
  double bubble_fraction_theory = 0.0;
  std::optional<double> replayed_makespan_ms;  // left out until the replay fills it
  std::optional<std::vector<ActionTime>> action_ms;
  std::optional<std::vector<double>> loss;  // the last stage's only
  std::optional<TimelineRecord> timeline;
  std::optional<Placement> placement;
  // Under --mesh dp=D,pp=S: "comm" sums the groups' ledgers and each group's is here (the
  // schedule's sends and the tied all-reduce in pp, the gradients' all-reduce in dp).
  std::optional<std::vector<GroupCommRecord>> comm_groups;
};

// "model"."shape": a transformer's shape (docs/json.md); left out for the MLP.
struct TransformerShapeRecord {
  std::string model_type;  // gpt2, llama, mistral, qwen2
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int ffn = 0;
  int vocab = 0;
  int seq = 0;
  int positions = 0;
  bool tied_embeddings = false;
  bool qkv_bias = false;
  bool out_bias = false;
  std::string attention;  // math | flash
};

// "model". A transformer's record adds "family" (gpt2, llama) and "shape"; its "layers"
// are its blocks, "width" its hidden size, "batch" sequences, "activation" and "loss" its
// (gelu_tanh or swiglu, cross_entropy).
struct ModelRecord {
  int layers = 0;
  int width = 0;
  std::int64_t params = 0;
  int param_tensors = 0;
  std::int64_t param_bytes = 0;
  std::string activation;
  std::string loss;
  int batch = 0;
  std::optional<std::string> family;               // left out for the MLP
  std::optional<TransformerShapeRecord> shape;     // left out for the MLP
  std::optional<std::string> checkpoint;           // --checkpoint full | every:K; left out for none
};

// What every run says of where it ran ("backend", "comm", "emulated", and "rank": the
// one rank an emulated job played, left out otherwise).
struct RunPlace {
  std::string backend;
  std::string comm;
  bool emulated = false;
  std::optional<int> rank;
};

struct DataParallelRun {
  std::string strategy;
  // Whose layout the run took (--engine): "torch", or "fsdp2" for zero2/zero3 under
  // --engine fsdp2 (ddp and zero1 are torch's under either). Records from before the
  // field read as torch.
  std::string engine = "torch";
  // --precision: "fp32", or "bf16" (the engine's mixed-precision regime). Records from
  // before the field read as fp32.
  std::string precision = "fp32";
  // Under bf16: what its GEMMs ran as (Backend::bf16_gemm: OpenBLAS's sbgemm, the
  // fallback, or cuBLAS's GemmEx); absent under fp32 and in a plan.
  std::optional<std::string> bf16_gemm;
  // --accumulate K (micro-steps per optimizer step) and --no-sync; records from before
  // the fields read as 1 and false.
  int accumulate = 1;
  bool no_sync = false;
  // --overlap; records from before the field read as false (every collective blocked).
  bool overlap = false;
  int world = 0;
  int units = 0;
  std::optional<int> layers_per_unit;  // nullopt: "all"
  int prefetch = 0;
  std::string ddp_bucket;
  double bucket_mb = 0.0;
  int steps = 0;
  int timed_steps = 0;
  std::uint64_t seed = 0;
  std::optional<MeshRecord> mesh;  // left out without --mesh
  std::optional<int> shard_group;  // --strategy hsdp --shard-group G; left out otherwise
  ModelRecord model;
  std::vector<RankRecord> ranks;
  RunPlace place;
};

struct PipelineRun {
  std::string schedule;
  std::string precision = "fp32";  // --precision, as DataParallelRun's
  // --autocast-region under the torch engine's bf16: "microbatch" or "step"; empty (left out
  // of the record) otherwise.
  std::string autocast_region;
  int world = 0;  // stages (under --mesh the pipeline axis's S; the job's ranks are mesh's D·T·S)
  int microbatches = 0;
  int chunks = 0;
  int steps = 0;
  int timed_steps = 0;
  std::uint64_t seed = 0;
  ModelRecord model;
  std::vector<int> split;            // layers per virtual stage
  std::vector<int> microbatch_rows;  // rows per micro-batch
  std::optional<MeshRecord> mesh;    // left out without --mesh; with it, one record per rank
  std::vector<StageRecord> stages;
  std::optional<double> wall_makespan_ms;
  std::optional<double> replayed_makespan_ms;
  RunPlace place;
};

// A sweep's configuration that could not run: its configuration as the sweep wrote it
// (kind, strategy or schedule, world, ...), "skipped": true and "reason".
struct SkippedRun {
  nlohmann::json config;  // an object, without "skipped" and "reason"
  std::string reason;
};

using RunRecord = std::variant<DataParallelRun, PipelineRun, SkippedRun>;

// "provenance": where the result came from. Null when unknown.
struct Provenance {
  std::optional<std::string> git, command, host, cpu;
  std::optional<std::int64_t> cores;  // the host's logical cores
  std::optional<std::string> gpu, blas, mpi, nccl, cuda;
};

// A sweep's "sweep": its jobs, how many were skipped, whether every job ran.
struct SweepSummary {
  std::int64_t jobs = 0;
  std::int64_t skipped = 0;
  bool complete = true;
  std::optional<std::string> error;
};

// The whole document, schema "shardscope/1". A sweep's backend and comm are its runs'
// common value, "mixed" or null; its emulated true, false or "mixed".
struct ResultDocument {
  std::string version;
  std::optional<std::string> backend;
  std::optional<std::string> comm;
  std::optional<bool> emulated;  // nullopt: "mixed"
  Provenance provenance;
  std::vector<RunRecord> runs;
  std::optional<SweepSummary> sweep;
};

inline constexpr const char* kResultSchema = "shardscope/1";

// `shardscope plan`'s document, schema "shardscope-plan/1": the predictions of every
// configuration, nothing run. "fits" and "fits_every_rank" are null without --memory.

// Consecutive ranks with the same figures: ranks first..last.
struct RankGroupPlan {
  int first = 0;
  int last = 0;
  // Under --mesh: every rank of the group, ascending ("ranks"; first and last its ends),
  // the ranks whose predictions are identical wherever they sit in the mesh. Without a
  // mesh the group is first..last and this is left out.
  std::optional<std::vector<int>> ranks;
  RankPredicted predicted;
  std::optional<bool> fits;
};

struct StagePlan {
  int stage = 0;
  int rank = 0;
  // Under --mesh dp=D,pp=S: the D ranks holding the stage (its data-parallel replicas,
  // identical predictions), ascending; "rank" is the first. Left out without a mesh.
  std::optional<std::vector<int>> ranks;
  LayerRange layers{};
  std::optional<std::vector<LayerRange>> chunks_layers;  // left out with one chunk
  StagePredicted predicted;
  std::optional<bool> fits;
};

// `plan --fit batch|seq`: the largest value of `dimension` (sequences or rows per rank, or
// per pipeline; tokens per sequence) at which every rank's (stage's) predicted peak fits
// --memory, the other sizes as planned. "bound" says what ends it: "memory" (value + 1
// does not fit), "positions" (the model has no more positions), "largest_accepted" (the
// largest value the flag accepts), "model_states" or "peak" (not even `smallest` fits:
// the model states at rest alone, or the peak at it, exceed --memory), "peak_unknown"
// (the model's peak has no closed form in this build).
struct FitRecord {
  std::string dimension;                    // "batch" or "seq"
  std::int64_t smallest = 1;                // the least value the configuration accepts (a pipeline's M)
  std::optional<std::int64_t> value;        // the largest that fits
  std::optional<std::int64_t> peak_bytes;   // the highest rank's peak at value
  // The highest peak at the least value above `value` (value + 1, or `smallest` when
  // none fits); none when value is the largest accepted or the peak is unknown.
  std::optional<std::int64_t> peak_bytes_next;
  std::optional<int> limiting;              // the rank (stage) with that peak, the lowest of equals
  std::optional<std::int64_t> resting_bytes;  // the highest rank's model states at rest
  std::string bound;
  std::string reason;                       // a sentence: why the search ended there
};

// A run's header as a run writes it, without what only a run has (steps, timed_steps,
// seed, its ranks or stages, where it ran).
struct DataParallelPlan {
  DataParallelRun run;
  std::vector<RankGroupPlan> rank_groups;
  std::optional<bool> fits_every_rank;
  std::optional<FitRecord> fit;  // with --fit
};

struct PipelinePlan {
  PipelineRun run;
  double bubble_fraction_theory = 0.0;
  std::vector<StagePlan> stages;
  std::optional<bool> fits_every_rank;
  std::optional<FitRecord> fit;  // with --fit
};

using PlanRecord = std::variant<DataParallelPlan, PipelinePlan, SkippedRun>;

// `plan --overhead FILE`: the device memory outside the pool a measured run held, added to
// every rank's peak for the --memory verdicts ("overhead" in the plan's JSON, only with it).
struct PlanOverhead {
  std::string file;
  std::int64_t bytes = 0;  // the largest outside_pool_bytes among the file's ranks and stages
  std::string source;      // that figure's outside_pool_source: "nvml" or "cuda_mem_get_info_delta"
  std::string taken_from;  // whose it is: "ddp W=2, rank 1"
};

struct PlanDocument {
  std::string version;
  std::string command;
  std::optional<std::int64_t> memory_bytes;  // --memory
  std::optional<PlanOverhead> overhead;      // --overhead
  std::string not_counted;                   // what the figures leave out
  std::vector<PlanRecord> plans;
};

// What the allocator may hold for a --memory verdict: --memory less --overhead's bytes.
inline std::optional<std::int64_t> allocator_budget(const PlanDocument& plan) {
  if (!plan.memory_bytes) return std::nullopt;
  return *plan.memory_bytes - (plan.overhead ? plan.overhead->bytes : 0);
}

inline constexpr const char* kPlanSchema = "shardscope-plan/1";

}  // namespace shardscope
