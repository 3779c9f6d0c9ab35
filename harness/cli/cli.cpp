// `shardscope run` and `shardscope sweep`: flags to a RunConfig, errors to exit codes
// (docs/design.md §6): 0 done, 2 bad usage or configuration, 3 a run failed.
#include "harness/cli/cli.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include <CLI/CLI.hpp>

#include "harness/cli/child_process.hpp"
#include "harness/cli/compare.hpp"
#include "harness/cli/plan.hpp"
#include "harness/cli/run_outputs.hpp"
#include "harness/cli/sweep.hpp"
#include "harness/cli/transformer_flags.hpp"
#include "harness/comm/mpi_env.hpp"
#include "harness/model/model.hpp"
#include "harness/model/models.hpp"
#include "harness/common/signals_held.hpp"
#include "harness/predict/deepspeed_forms.hpp"
#include "harness/report/csv.hpp"
#include "harness/report/json_io.hpp"
#include "harness/strategies/deepspeed_layout.hpp"
#include "harness/run/provenance.hpp"
#include "harness/run/run.hpp"
#include "shardscope/check.hpp"
#include "shardscope/schedule_kind.hpp"

namespace shardscope {
namespace {

void error_line(const std::string& what) {
  std::fprintf(stderr, "shardscope: error: %s\n", what.c_str());
  std::fflush(stderr);
}

bool all_digits(const std::string& v) {
  return !v.empty() && v.find_first_not_of("0123456789") == std::string::npos;
}


int parse_bounded(const std::string& flag, const std::string& v, int most) {
  return parse_positive(flag, v, most, " (byte counts must fit in 64 bits)");
}

// Ranks of one job: at most kMaxWorld (far beyond any machine this models, and small
// enough that per-rank bookkeeping of an emulated rank stays small).
constexpr int kMaxWorld = 65'536;

int parse_bounded_world(const std::string& flag, const std::string& v) {
  return parse_positive(flag, v, kMaxWorld, " ranks");
}

std::string self_exe(const char* argv0) {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n > 0) return std::string(buf, static_cast<std::size_t>(n));
  return argv0;
}

// Flags of `run` (docs/design.md §6). Numeric flags are taken as strings and checked here so
// that every message names the flag and what is allowed.
struct RunFlags {
  // Steps: one warm-up and ten timed, so that a time has a spread to print.
  std::string model = "mlp", layers = "8", width = "256", batch = "32", steps = "11", seed = "0";
  std::string activation = "none", loss = "sum";
  // One layer per unit, as FSDP's per-layer wrap policy and DeepSpeed shard; "all" is
  // the root unit alone (torch FSDP without a wrap policy).
  std::string strategy = "ddp", schedule, units = "1", prefetch = "1", engine = "torch";
  std::string precision = "fp32";
  std::string autocast_region = "microbatch";
  std::string microbatches, chunks = "1", split;
  std::string backend, comm, emulate, json, trace, timeline = "on", csv;
  std::string ddp_bucket = "view", bucket_mb = "0", overlap = "on";
  std::string bytes = "binary";
  std::string comm_timeout = "300";
  std::string checkpoint = "none";
  std::string accumulate = "1";
  std::string mesh, shard_group;
  bool tf32 = false, wide = false, no_sync = false, sp = false;
  // Transformers (--model gpt2|llama, --hf-config): empty when not given.
  std::string hf_config, hidden, heads, kv_heads, ffn, vocab, seq, positions, attention = "flash";
};

// The flags only a transformer takes, and those only the MLP takes.
constexpr const char* kTransformerFlags[] = {"--hf-config", "--hidden", "--heads",     "--kv-heads", "--ffn",
                                             "--vocab",     "--seq",    "--positions", "--attention"};
constexpr const char* kMlpFlags[] = {"--width", "--activation", "--loss"};

void add_run_flags(CLI::App& app, RunFlags& f) {
  app.add_option("--model", f.model, model_names_text() + " (default mlp; --hf-config implies its family)")->type_name("NAME");
  app.add_option("--layers", f.layers, "MLP: Linear layers (default 8); transformer: blocks")->type_name("N");
  app.add_option("--width", f.width, "MLP only: width of every layer (default 256)")->type_name("N");
  app.add_option("--batch", f.batch,
                 "rows (MLP, default 32) or sequences (transformer, default 1) per rank (data parallel) or per pipeline")
      ->type_name("N");
  app.add_option("--activation", f.activation, "MLP only: none | relu (default none)")->type_name("none|relu");
  app.add_option("--loss", f.loss, "MLP only: sum | mse (default sum)")->type_name("sum|mse");
  app.add_option("--hf-config", f.hf_config,
                 "a Hugging Face config.json (model_type gpt2, llama, mistral, qwen2); the flags below override it")
      ->type_name("FILE");
  app.add_option("--hidden", f.hidden, "transformer: hidden size (default: the config's, or gpt2 768, llama 4096)")->type_name("N");
  app.add_option("--heads", f.heads, "transformer: attention heads (gpt2 12, llama 32)")->type_name("N");
  app.add_option("--kv-heads", f.kv_heads, "transformer: key/value heads, dividing the heads (default: the heads)")->type_name("N");
  app.add_option("--ffn", f.ffn, "transformer: MLP inner width (gpt2 4 x hidden, llama 11008)")->type_name("N");
  app.add_option("--vocab", f.vocab, "transformer: vocabulary (gpt2 50257, llama 32000)")->type_name("N");
  app.add_option("--seq", f.seq, "transformer: tokens per sequence (default min(1024, positions))")->type_name("N");
  app.add_option("--positions", f.positions, "transformer: most positions (gpt2 1024, llama 4096)")->type_name("N");
  app.add_option("--attention", f.attention, "transformer: math | flash (default flash)")->type_name("math|flash");
  app.add_option("--steps", f.steps, "optimizer steps; the first is warm-up (default 11: ten timed)")->type_name("N");
  app.add_option("--seed", f.seed, "seed of data and initial parameters (default 0)")->type_name("N");
  app.add_option("--strategy", f.strategy, "ddp | zero1 | zero2 | zero3 | hsdp (default ddp)")->type_name("NAME");
  app.add_option("--shard-group", f.shard_group,
                 "hsdp: shard within groups of G consecutive ranks (zero3's layout), replicate across them "
                 "(FSDP's HYBRID_SHARD); G divides the world")
      ->type_name("G");
  app.add_option("--engine", f.engine,
                 "torch | fsdp2 | deepspeed: whose layout the sharded strategies take: torch's FSDP1 flat units, "
                 "fully_shard's per-tensor dim-0 shards (zero2/zero3), or DeepSpeed's ZeRO stages (zero1, zero2, "
                 "zero3); ddp is torch's under each, but under --engine deepspeed --precision bf16 DeepSpeed's "
                 "stage 0: its FP16_Optimizer in bf16 over FusedAdam, bf16 parameters and gradients, fp32 master and "
                 "AdamW on every rank (the ZeRO paper's 16 B a parameter; default torch)")
      ->type_name("torch|fsdp2|deepspeed");
  app.add_option("--precision", f.precision,
                 "fp32 | bf16: bf16 trains in the engine's mixed-precision regime (default fp32; built: autocast "
                 "under ddp/zero1 and the pipelines, FSDP's MixedPrecision for the MLP, gpt2 and llama under "
                 "zero2/zero3/hsdp, DeepSpeed's bf16 for their ddp (stage 0)/zero1/zero2/zero3; docs/cli.md "
                 "lists the rest)")
      ->type_name("fp32|bf16");
  app.add_option("--autocast-region", f.autocast_region,
                 "microbatch | step: where a bf16 pipeline's autocast region sits (--precision bf16 --schedule "
                 "gpipe|1f1b|interleaved-1f1b): around each micro-batch's forward of a stage, each holding its own "
                 "weight casts (default microbatch), or around the schedule's whole step, each cast made once and "
                 "held to the step's end")
      ->type_name("microbatch|step");
  app.add_option("--schedule", f.schedule, schedule_names_text(" | ") + " (a pipeline run)")->type_name("NAME");
  app.add_option("--checkpoint", f.checkpoint,
                 "none | full | every:K | attention: recompute each (every K-th) layer or transformer block in "
                 "backward, keeping only its input; attention: only a transformer's attention core (default none)")
      ->type_name("MODE");
  app.add_option("--accumulate", f.accumulate,
                 "data parallel: micro-steps per optimizer step, each on the rank's whole --batch (K x batch rows "
                 "per optimizer step), the loss scaled by 1/K, gradients accumulated (default 1)")
      ->type_name("K");
  app.add_flag("--no-sync", f.no_sync,
               "with --accumulate: reduce gradients after the last micro-step only (DDP's and FSDP's no_sync); without it "
               "every micro-step reduces");
  app.add_option("--units", f.units, "layers (transformer: blocks, beside a root unit of embeddings and head) per unit for zero2/zero3: K, or all for one root unit (default 1)")->type_name("K|all");
  app.add_option("--prefetch", f.prefetch, "0 | 1: gather the next unit during backward (default 1)")->type_name("0|1");
  app.add_option("--microbatches", f.microbatches, "pipeline micro-batches M (default: stages)")->type_name("M");
  app.add_option("--chunks", f.chunks, "model chunks per stage for interleaved-1f1b (default 1; zbv: 2, its V)")->type_name("V");
  app.add_option("--split", f.split, "layers per stage, e.g. 4,4 (default even; a transformer: its transformer blocks)")->type_name("LIST");
  app.add_option("--backend", f.backend, "cpu | cuda (default cuda when a GPU is visible)")->type_name("cpu|cuda");
  app.add_option("--comm", f.comm, "self | mpi | nccl | fake (default from backend and launch)")->type_name("NAME");
  app.add_option("--emulate", f.emulate, "W:r: play rank r of a world of W in this one process")->type_name("W:r");
  app.add_option("--mesh", f.mesh,
                 "dp=D,tp=T,pp=S (any subset; D*T*S = the world; ranks tp fastest, then dp, then pp): each axis its "
                 "own group and communicator; tp splits the MLP's Linears (column, row, ...) and GPT-2 and Llama as Megatron-LM")
      ->type_name("AXES");
  app.add_flag("--sp", f.sp,
               "with --mesh tp > 1 (GPT-2, Llama): Megatron's sequence parallelism, the norms and residuals holding "
               "each tensor-parallel rank's seq/T tokens (all-gathers and reduce-scatters instead of all-reduces)");
  app.add_option("--comm-timeout", f.comm_timeout,
                 "seconds any one collective may wait before the job is aborted, exit 3 (default 300)")
      ->type_name("SECONDS");
  app.add_option("--json", f.json, "write the shardscope/1 JSON document here")->type_name("FILE");
  app.add_option("--trace", f.trace, "write a Chrome trace-event JSON (Perfetto, chrome://tracing) here")->type_name("FILE");
  app.add_option("--csv", f.csv, "write DIR/data_parallel.csv and DIR/pipeline.csv (docs/json.md, \"CSV\")")->type_name("DIR");
  app.add_option("--timeline", f.timeline, "on | off: record each rank's memory timeline and ranges (default on)")->type_name("on|off");
  app.add_option("--ddp-bucket", f.ddp_bucket, "view | copy: copy keeps torch's separate flat bucket (default view)")->type_name("view|copy");
  app.add_option("--bucket-mb", f.bucket_mb, "DDP bucket cap in MiB (0 = one flat bucket); --engine deepspeed: its reduce_bucket_size in MiB of fp32 (0 = its default, 5e8 elements, at most P)")->type_name("MIB");
  app.add_option("--overlap", f.overlap,
                 "on | off: all-reduce ddp/zero1 buckets while backward continues, and prefetch zero2/zero3 "
                 "units without blocking; off blocks on every collective (default on)")
      ->type_name("on|off");
  app.add_flag("--tf32", f.tf32, "allow TF32 GEMMs on cuda");
  app.add_option("--bytes", f.bytes, kBytesHelp)->type_name("binary|exact");
  app.add_flag("--wide", f.wide, kWideHelp);
}

// --comm-timeout SECONDS: a positive number (decimals allowed, e.g. 0.5), at most a day.
double comm_timeout_value(const std::string& v) {
  const std::string allowed = "; allowed: a number of seconds above 0 and at most " +
                              std::to_string(static_cast<int>(kMaxCommTimeoutSeconds)) + " (default 300)";
  std::size_t used = 0;
  double s = -1.0;
  try {
    s = std::stod(v, &used);
  } catch (...) {
    used = 0;
  }
  if (v.empty() || used != v.size() || v.find_first_not_of("0123456789.") != std::string::npos)
    throw UsageError("--comm-timeout: '" + v + "' is not a number of seconds" + allowed);
  if (!(s > 0.0) || s > kMaxCommTimeoutSeconds) throw UsageError("--comm-timeout: " + v + " is out of range" + allowed);
  return s;
}

std::vector<int> parse_list(const std::string& flag, const std::string& v) {
  if (v.empty()) throw UsageError(flag + ": empty list");
  if (v.front() == ',' || v.back() == ',' || v.find(",,") != std::string::npos)
    throw UsageError(flag + ": '" + v + "' has an empty entry; expected e.g. 4,4");
  std::vector<int> out;
  std::stringstream ss(v);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(parse_positive(flag, item));
  return out;
}

// The long names of the options `app` takes ("--layers", ..., "--help").
std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options())
    for (const std::string& name : opt->get_lnames()) names.push_back("--" + name);
  return names;
}

// CLI11's message for a parse error, except for arguments it does not know, which it
// lists back to front: those are named one by one, in the order given, each with the
// closest flag of `run` or of the command that passed them on (`also_known`).
std::string parse_error_text(const CLI::App& app, const CLI::ParseError& e,
                             const std::vector<std::string>& also_known = {}, const std::string& command = "run") {
  if (dynamic_cast<const CLI::ExtrasError*>(&e) == nullptr) return e.what();
  std::vector<std::string> extra = app.remaining();
  if (extra.empty()) return e.what();
  std::vector<std::string> known = option_names(app);
  known.insert(known.end(), also_known.begin(), also_known.end());
  std::string text;
  bool after_unknown_flag = false;
  for (const std::string& a : extra) {
    const bool flag = a.rfind("-", 0) == 0;
    // A word right after an unknown flag is that flag's value, not an argument of its own.
    if (!flag && after_unknown_flag) {
      after_unknown_flag = false;
      continue;
    }
    after_unknown_flag = flag && a.find('=') == std::string::npos;
    if (!text.empty()) text += ", ";
    if (flag) text += "unknown flag '" + a + "'" + did_you_mean(a, known);
    else text += "unexpected argument '" + a + "'";
  }
  // Sweep and plan pass run's flags on; their own --help lists both.
  return text + " (shardscope " + command + " --help lists the flags)";
}

// Checks of `run`'s options that CLI11 does not make, or words in its own way, so that
// every refusal names the option and what it takes: a value that is missing, empty, or
// is the next flag (`--json --tf32` would write a file named "--tf32"); a value given
// to a switch (`--tf32=abc`); an option given twice.
void check_option_values(const CLI::App& app, const std::vector<std::string>& args) {
  std::map<std::string, int> seen;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    const std::size_t eq = a.find('=');
    const std::string name = a.substr(0, eq);
    const CLI::Option* opt = nullptr;
    try {
      opt = app.get_option(name);
    } catch (const CLI::OptionNotFound&) {
      continue;  // CLI11 names unknown flags itself
    }
    if (++seen[name] == 2)
      throw UsageError(name + ": given more than once; give it once (" + opt->get_description() + ")");
    if (opt->get_expected_min() == 0) {  // a switch (--tf32)
      if (eq != std::string::npos)
        throw UsageError(name + ": takes no value, got '" + a.substr(eq + 1) + "'; " + opt->get_description());
      continue;
    }
    if (eq != std::string::npos) {
      if (eq + 1 == a.size()) throw UsageError(name + ": empty value; " + opt->get_description());
      continue;
    }
    if (i + 1 == args.size()) throw UsageError(name + ": needs a value; " + opt->get_description());
    const std::string& v = args[i + 1];
    if (v.empty()) throw UsageError(name + ": empty value; " + opt->get_description());
    if (v.rfind("--", 0) == 0)
      throw UsageError(name + ": needs a value, got the flag '" + v + "'; " + opt->get_description());
  }
}

// --checkpoint: none, full (every:1), every:K with K a positive integer, or attention.
CheckpointPolicy parse_checkpoint(const std::string& v) {
  CheckpointPolicy p;
  if (v == "none") return p;
  if (v == "attention") {
    p.kind = CheckpointKind::attention;
    return p;
  }
  p.kind = CheckpointKind::every;
  if (v == "full") return p;
  const std::string prefix = "every:";
  if (v.rfind(prefix, 0) == 0 && all_digits(v.substr(prefix.size())) && v.size() > prefix.size()) {
    p.every = parse_positive("--checkpoint every:K", v.substr(prefix.size()), 100'000);
    return p;
  }
  throw UsageError("--checkpoint: unknown '" + v + "'; allowed: none, full, every:K (K >= 1), attention");
}

// --precision bf16 runs only where its regime is built and its peak has closed forms; everywhere
// else it is refused by name, never quietly run in fp32. Built: the torch engine's autocast
// for the MLP, GPT-2 and Llama under ddp and zero1 (harness/predict/mlp_autocast_forms.hpp,
// autocast_step.hpp); the strategies a plan or sweep lists are checked per configuration
// (refuse_unbuilt_autocast).
void refuse_unbuilt_precision(const RunConfig& c, const std::string& command, const CLI::App& app) {
  if (c.precision == PrecisionKind::fp32) return;
  // DeepSpeed's bf16 regime runs the MLP's, GPT-2's and Llama's stages 0 (ddp: FP16_Optimizer
  // in bf16), 1, 2 and 3 (--accumulate and --checkpoint too); what it refuses check_deepspeed
  // says.
  if (effective_engine(c.engine, c.strategy, c.precision) == EngineKind::deepspeed) return;
  const std::string bf16 = "--precision bf16";
  // --checkpoint attention runs under autocast's ddp and zero1 (and along dp of a tp mesh);
  // FSDP's bf16 and a bf16 pipeline's stages refuse what is not built (refuse_unbuilt_autocast,
  // refuse_checkpointed_pipeline).
  // A mesh under autocast: a pipeline's stages (pipeline_shape says what is not built), or
  // GPT-2's and Llama's data-parallel step, split along tp as in fp32 (docs/design.md,
  // "Tensor parallelism under bf16"), with ddp or zero1 along dp (refuse_unbuilt_autocast
  // refuses zero2/zero3 of a transformer under bf16, a plan skipping each with the reason).
  if (app.count("--mesh") > 0 && !c.pipeline() && !c.model.is_transformer())
    throw UsageError("--mesh and " + bf16 + " and --model " + c.model.name + ": a data-parallel mesh of the MLP "
                     "under autocast is not built yet (its pipelines are: give --schedule); allowed: --model "
                     "gpt2|llama");
  if (command != "plan") refuse_unbuilt_autocast(c);
}

// --engine deepspeed's combinations (docs/cli.md, "Engines"): stages 1 to 3 run the MLP, GPT-2
// and Llama in fp32 and bf16 (stage 0 under bf16 too), --checkpoint wherever the step runs;
// DeepSpeed has no units, no DDP bucket copy, no no_sync under stages 2 and 3 (its engine
// asserts so), and its bucket must hold the largest tensor (DeepSpeed's extra-large-parameter
// path is not built).
void check_deepspeed(const RunConfig& c, const RunFlags& f, CLI::App& app, const std::string& command) {
  if (effective_engine(c.engine, c.strategy, c.precision) != EngineKind::deepspeed) return;
  const std::string both = "--engine deepspeed and --strategy " + f.strategy;
  if (app.count("--units") > 0)
    throw UsageError("--units and --engine deepspeed: DeepSpeed's ZeRO has no units (one flat group); drop --units");
  // A plan lists its strategies: the forms skip each refused one with the reason.
  if (command != "plan") refuse_deepspeed_no_sync(c);
  // --checkpoint under bf16 runs every policy: the MLP's, GPT-2's and Llama's full|every:K (the
  // bf16 module re-runs a wrapped block) and the transformers' attention (the module's
  // recompute; under stage 3 no hook fires in it), stages 0 to 3.
  if (app.count("--ddp-bucket") > 0)
    throw UsageError("--ddp-bucket and " + both + ": DeepSpeed's buckets are its own (--bucket-mb); drop --ddp-bucket");
  std::int64_t largest = 0;
  for (std::int64_t n : model_tensor_elems(c.model)) largest = std::max(largest, n);
  // (Stage 0 flattens any bucket size: allreduce_no_retain closes a bucket past the cap.)
  if (c.bucket_mb > 0 && c.strategy != StrategyKind::ddp && ds_bucket_elems(c.bucket_mb, {}) < largest)
    throw UsageError("--bucket-mb " + f.bucket_mb + " and --engine deepspeed: the bucket must hold the largest " +
                     "tensor, " + std::to_string(largest) + " elements (" + std::to_string(4 * largest) +
                     " B); give 0 or at least that");
}

// What a mesh can run in this build (docs/design.md, "Meshes"): data parallel along dp
// (ddp, zero1 when tp > 1; ddp under a schedule), the models split along tp, a schedule
// along pp (its stages split along tp too); the world's size when it is known
// from the flags (--emulate W:r; a launch's is checked where the job is prepared).
void check_mesh_config(const RunConfig& c) {
  const MeshShape& m = c.mesh;
  const std::string mesh = "--mesh " + m.text();
  if (c.emulate_world > 0)
    check_mesh_world(m, c.emulate_world, "--emulate " + std::to_string(c.emulate_world) + ":" +
                                             std::to_string(c.emulate_rank));
  if (m.pp > 1 && !c.pipeline())
    throw UsageError(mesh + ": a pipeline axis (pp > 1) runs a schedule; give --schedule " + schedule_names_text("|") +
                     ", or pp=1 and --strategy");
  // pp along the pipeline axis, ddp along dp (--strategy's check above), each stage's
  // blocks split along tp (what a schedule and a split ask of them is checked with the
  // pipeline's shape: check_pipeline_tensor_parallel).
  if (c.pipeline()) {
    check_tensor_parallel(c.model, m.tp);
    return;
  }
  if (m.tp == 1) return;
  check_tensor_parallel(c.model, m.tp);
  if (c.strategy != StrategyKind::ddp && c.strategy != StrategyKind::zero1 && !c.model.is_transformer())
    throw UsageError(mesh + " and --strategy " + std::string(strategy_name(c.strategy)) +
                     ": tp > 1 of the MLP runs with ddp or zero1 along dp (zero2/zero3 with tp > 1 are built for "
                     "the transformers)");
  if (effective_engine(c.engine, c.strategy, c.precision) != EngineKind::torch)
    throw UsageError(mesh + " and --engine " + std::string(engine_name(c.engine)) +
                     ": tp > 1 runs the torch engine's layout along dp; give --engine torch");
  if (c.model.checkpoint.any() && !c.model.is_transformer())
    throw UsageError(mesh + " and --checkpoint " + c.model.checkpoint.text() +
                     ": a checkpointed tensor-parallel MLP is not built yet; give --checkpoint none");
  if ((c.accumulate > 1 || c.no_sync) && (!c.model.is_transformer() || shards_by_unit(c.strategy)))
    throw UsageError(mesh + " and --accumulate/--no-sync: accumulation with tp > 1 is built for the transformers "
                     "under ddp and zero1 (not the MLP, not zero2/zero3 yet)");
}

// --sp as built (docs/design.md, "Sequence parallelism"): GPT-2 and Llama in fp32 under --mesh with
// tp > 1, along dp or in pipeline stages (gpipe, 1f1b, interleaved-1f1b: the stage's checks,
// check_pipeline_tensor_parallel), and a sequence the tp ranks divide.
// --autocast-region: only a bf16 pipeline under the torch engine's autocast has a region to
// place (gpipe, 1f1b, interleaved-1f1b: what it runs under bf16).
void check_autocast_region(RunConfig& c, const RunFlags& f) {
  if (f.autocast_region != "microbatch" && f.autocast_region != "step")
    throw UsageError("--autocast-region: unknown '" + f.autocast_region + "'; allowed: microbatch, step");
  if (!c.model.autocast || !c.pipeline())
    throw UsageError("--autocast-region " + f.autocast_region +
                     ": where a bf16 pipeline's autocast region sits; allowed only with --precision bf16 and "
                     "--schedule gpipe|1f1b|interleaved-1f1b under the torch engine");
  c.model.autocast_step = f.autocast_region == "step";
}

void check_sequence_parallel(const RunConfig& c, const RunFlags& f, const CLI::App& app) {
  if (!c.model.is_transformer())
    throw UsageError("--sp and --model mlp: sequence parallelism splits a transformer's sequence (the MLP has none); "
                     "give --model gpt2|llama or drop --sp");
  const int tp = app.count("--mesh") > 0 ? parse_mesh(f.mesh).tp : 1;
  if (tp < 2)
    throw UsageError("--sp: sequence parallelism splits the sequence over the tensor-parallel ranks; give --mesh with "
                     "tp > 1 (e.g. --mesh dp=2,tp=2)");
  if (c.precision != PrecisionKind::fp32)
    throw UsageError("--sp and --precision bf16: sequence parallelism under autocast is not built yet; give "
                     "--precision fp32");
  const int seq = c.model.transformer.seq;
  if (seq % tp != 0)
    throw UsageError("--sp and --mesh tp=" + std::to_string(tp) + ": --seq " + std::to_string(seq) +
                     " does not divide into " + std::to_string(tp) + " tensor-parallel ranks' shards; give a --seq " +
                     "that tp divides");
}

// HSDP as built (docs/design.md, "HSDP"): zero3 under the torch or fsdp2 engine, without a mesh;
// --shard-group divides the world when the flags give it (--emulate W:r).
void check_hsdp_config(const RunConfig& c) {
  const std::string hsdp = "--strategy hsdp";
  if (c.emulate_world > 0 && c.emulate_world % c.shard_group != 0)
    throw UsageError("--shard-group " + std::to_string(c.shard_group) + ": it must divide the world, " +
                     std::to_string(c.emulate_world) + " ranks (--emulate " + std::to_string(c.emulate_world) + ":" +
                     std::to_string(c.emulate_rank) + ")");
  if (c.engine == EngineKind::deepspeed)
    throw UsageError(hsdp + " and --engine deepspeed: deepspeed's hybrid partitioning is not built; give --engine "
                     "torch (FSDP1's HYBRID_SHARD) or fsdp2 (fully_shard on a 2-D mesh)");
  if (c.mesh.given) throw UsageError(hsdp + " and --mesh: give one of them (hsdp's groups are its own mesh)");
}

RunConfig to_config(const RunFlags& f, CLI::App& app, const std::string& command = "run") {
  RunConfig c;
  // Caps that keep every byte count of the closed forms inside 64 bits (and the
  // per-layer predictions quick): 16 B x layers x width^2 and 4 B x batch x width x layers.
  c.model.name = f.model;
  check_model_name(c.model.name);
  const bool transformer = app.count("--hf-config") > 0 || c.model.name != "mlp";
  if (transformer) {
    for (const char* flag : kMlpFlags)
      if (app.count(flag) > 0)
        throw UsageError(std::string(flag) + " is the MLP's flag; a transformer (--model gpt2|llama, --hf-config) "
                         "takes --layers --hidden --heads --kv-heads --ffn --vocab --seq --positions --attention");
    c.model.batch = app.count("--batch") > 0 ? parse_bounded("--batch", f.batch, kMostBatch) : 1;
    TransformerFlags t;
    if (app.count("--model") > 0) t.model = f.model;
    t.hf_config = f.hf_config;
    if (app.count("--layers") > 0) t.layers = f.layers;
    t.hidden = f.hidden;
    t.heads = f.heads;
    t.kv_heads = f.kv_heads;
    t.ffn = f.ffn;
    t.vocab = f.vocab;
    t.seq = f.seq;
    t.positions = f.positions;
    t.attention = f.attention;
    t.batch = c.model.batch;
    const TransformerModel model = transformer_from_flags(t);
    c.model.name = model.family;
    c.model.transformer = model.shape;
    c.model.layers = model.shape.layers;
    c.model.width = model.shape.hidden;
  } else {
    for (const char* flag : kTransformerFlags)
      if (app.count(flag) > 0)
        throw UsageError(std::string(flag) + " is a transformer's flag: give --model gpt2|llama or --hf-config FILE "
                         "(the MLP takes --layers --width --batch --activation --loss)");
    c.model.layers = parse_bounded("--layers", f.layers, 100'000);
    c.model.width = parse_bounded("--width", f.width, 1'000'000);
    c.model.batch = parse_bounded("--batch", f.batch, kMostBatch);
    if (f.activation == "none") c.model.activation = Activation::none;
    else if (f.activation == "relu") c.model.activation = Activation::relu;
    else throw UsageError("--activation: unknown '" + f.activation + "'; allowed: none, relu");
    if (f.loss == "sum") c.model.loss = Loss::sum;
    else if (f.loss == "mse") c.model.loss = Loss::mse;
    else throw UsageError("--loss: unknown '" + f.loss + "'; allowed: sum, mse");
  }
  c.steps = parse_positive("--steps", f.steps, 1'000'000);
  {
    std::size_t used = 0;
    unsigned long long s = 0;
    if (all_digits(f.seed)) {
      try { s = std::stoull(f.seed, &used); } catch (...) { used = 0; }
    }
    if (used != f.seed.size() || f.seed.empty())
      throw UsageError("--seed: '" + f.seed + "' is not a non-negative integer (below 2^64)");
    c.seed = s;
  }
  const bool has_schedule = app.count("--schedule") > 0;
  // Under --mesh a pipeline's stages are replicated along dp, where they run ddp (the one
  // strategy built there); without a mesh a run is one or the other.
  if (has_schedule && app.count("--strategy") > 0 && app.count("--mesh") == 0)
    throw UsageError("--strategy and --schedule: a run is either data parallel or a pipeline, not both (with --mesh "
                     "dp=D,pp=S both: --strategy ddp along dp)");
  if (has_schedule && app.count("--strategy") > 0 && f.strategy != "ddp")
    throw UsageError("--strategy " + f.strategy + " and --schedule with --mesh: along dp a pipeline's stages run ddp "
                     "(each stage's gradients all-reduced in place after the schedule); allowed: --strategy ddp "
                     "(zero1, zero2, zero3 along dp with pp are not built yet)");
  // hsdp is zero3 sharded within each group of --shard-group ranks and replicated across.
  const bool hsdp = f.strategy == "hsdp";
  c.strategy = hsdp ? StrategyKind::zero3 : parse_strategy(f.strategy);
  if (hsdp) {
    if (app.count("--shard-group") == 0)
      throw UsageError("--strategy hsdp needs --shard-group G (ranks per shard group, dividing the world)");
    c.shard_group = parse_positive("--shard-group", f.shard_group, 1'000'000);
  } else if (app.count("--shard-group") > 0) {
    throw UsageError("--shard-group is only valid with --strategy hsdp");
  }
  c.engine = parse_engine(f.engine);
  c.precision = parse_precision(f.precision);
  c.layers_per_unit = f.units == "all" ? 0 : parse_positive("--units (K or all)", f.units, 100'000);
  if (f.prefetch != "0" && f.prefetch != "1") throw UsageError("--prefetch: '" + f.prefetch + "'; allowed: 0, 1");
  c.prefetch = f.prefetch == "1";
  if (f.ddp_bucket != "view" && f.ddp_bucket != "copy")
    throw UsageError("--ddp-bucket: unknown '" + f.ddp_bucket + "'; allowed: view, copy");
  c.ddp_bucket = f.ddp_bucket;
  if (f.overlap != "on" && f.overlap != "off")
    throw UsageError("--overlap: unknown '" + f.overlap + "'; allowed: on, off");
  c.overlap = f.overlap == "on";
  {
    // Plain decimal only: no sign, exponent, hex, inf or nan.
    std::size_t used = 0;
    double mb = -1;
    if (!f.bucket_mb.empty() && f.bucket_mb.find_first_not_of("0123456789.") == std::string::npos) {
      try {
        mb = std::stod(f.bucket_mb, &used);
      } catch (const std::out_of_range&) {
        // Digits and one dot out of a double's range: far above the cap, or a positive
        // value below the smallest double (0.000...01), which is a cap below any tensor.
        const bool one_dot = std::count(f.bucket_mb.begin(), f.bucket_mb.end(), '.') <= 1 && f.bucket_mb != ".";
        const std::string whole = f.bucket_mb.substr(0, f.bucket_mb.find('.'));
        used = one_dot ? f.bucket_mb.size() : 0;
        mb = whole.find_first_not_of('0') != std::string::npos ? HUGE_VAL : std::numeric_limits<double>::denorm_min();
      } catch (...) {
        used = 0;
      }
    }
    if (used != f.bucket_mb.size() || !(mb >= 0))
      throw UsageError("--bucket-mb: '" + f.bucket_mb + "' is not a number >= 0 (MiB, e.g. 25)");
    if (mb > 1e6) throw UsageError("--bucket-mb: " + f.bucket_mb + " is above the largest allowed, 1000000 MiB");
    c.bucket_mb = mb;
  }
  c.model.checkpoint = parse_checkpoint(f.checkpoint);
  if (c.model.checkpoint.attention() && !c.model.is_transformer())
    throw UsageError("--checkpoint attention: the MLP has no attention to recompute; allowed with --model gpt2|llama, "
                     "or give --checkpoint none, full or every:K");
  for (const char* flag : {"--accumulate", "--no-sync"})
    if (has_schedule && app.count(flag) > 0)
      throw UsageError(std::string(flag) + " and --schedule: a pipeline's micro-batches are already its gradient "
                       "accumulation; give --microbatches, or --strategy with --accumulate");
  c.accumulate = parse_positive("--accumulate", f.accumulate, 10'000);
  c.no_sync = f.no_sync;
  if (has_schedule && f.schedule.empty()) throw UsageError("--schedule: empty; allowed: " + schedule_names_text());
  if (has_schedule) c.schedule = parse_schedule(f.schedule);
  if (!has_schedule) {
    for (const char* flag : {"--microbatches", "--chunks", "--split"})
      if (app.count(flag) > 0) throw UsageError(std::string(flag) + " is only valid with --schedule");
  } else {
    for (const char* flag : {"--units", "--prefetch", "--ddp-bucket", "--bucket-mb", "--engine", "--overlap"})
      if (app.count(flag) > 0) throw UsageError(std::string(flag) + " is only valid with --strategy (data parallel)");
  }
  // A schedule is validated action by action before it runs: M and v are capped so
  // that this stays well under a second.
  if (!f.microbatches.empty()) {
    c.microbatches = parse_positive("--microbatches", f.microbatches, 10'000);
  }
  c.chunks = parse_positive("--chunks", f.chunks, 1'000);
  if (c.schedule && app.count("--chunks") == 0) c.chunks = default_chunks(*c.schedule);  // zbv: its V's 2
  if (!f.split.empty()) c.split = parse_list("--split", f.split);
  c.model.sequence_parallel = f.sp;
  if (f.sp) check_sequence_parallel(c, f, app);  // before the refusals that would name --mesh instead
  refuse_unbuilt_precision(c, command, app);
  // The torch engine's bf16: the MLP, GPT-2 and Llama run as torch.autocast(bfloat16) runs them
  // under ddp and zero1; under zero2/zero3 as FSDP's MixedPrecision(param_dtype=bf16) runs them.
  const bool bf16_fsdp = c.precision == PrecisionKind::bf16 && shards_by_unit(c.strategy) &&
                         effective_engine(c.engine, c.strategy, c.precision) != EngineKind::deepspeed;
  c.model.autocast = c.precision == PrecisionKind::bf16 && !bf16_fsdp &&
                     effective_engine(c.engine, c.strategy, c.precision) == EngineKind::torch;
  // DeepSpeed's bf16 (the MLP's and GPT-2's stages 0, 1, 2 and 3, Llama's 0, 1 and 2): the
  // module in bf16 on the flat group's (or the partitions') views.
  const bool bf16_deepspeed = c.precision == PrecisionKind::bf16 &&
                              effective_engine(c.engine, c.strategy, c.precision) == EngineKind::deepspeed;
  c.model.param_bf16 = bf16_fsdp || bf16_deepspeed;
  if (app.count("--autocast-region") > 0) check_autocast_region(c, f);
  c.wide_tables = f.wide;
  c.exact_bytes = exact_bytes_value(f.bytes);
  if (!f.backend.empty() && f.backend != "cpu" && f.backend != "cuda")
    throw UsageError("--backend: unknown '" + f.backend + "'; allowed: cpu, cuda");
  c.backend = f.backend;
  if (!f.comm.empty() && f.comm != "self" && f.comm != "mpi" && f.comm != "nccl" && f.comm != "fake")
    throw UsageError("--comm: unknown '" + f.comm + "'; allowed: self, mpi, nccl, fake");
  c.comm = f.comm;
  if (!f.emulate.empty()) {
    const std::size_t colon = f.emulate.find(':');
    if (colon == std::string::npos) throw UsageError("--emulate: '" + f.emulate + "'; expected W:r, e.g. 4:2");
    c.emulate_world = parse_bounded_world("--emulate W:r (W)", f.emulate.substr(0, colon));
    const std::string r = f.emulate.substr(colon + 1);
    if (!all_digits(r)) throw UsageError("--emulate: rank '" + r + "' is not a non-negative integer");
    if (r.size() > 6 || std::stoi(r) >= c.emulate_world)
      throw UsageError("--emulate " + f.emulate + ": rank must be below the world size " +
                       std::to_string(c.emulate_world));
    c.emulate_rank = std::stoi(r);
    if (!f.comm.empty() && f.comm != "fake")
      throw UsageError("--comm " + f.comm + ": --emulate always uses the fake communicator");
  }
  if (app.count("--mesh") > 0) {
    c.mesh = parse_mesh(f.mesh);
    check_mesh_config(c);
  }
  if (c.hybrid()) check_hsdp_config(c);
  c.comm_timeout_s = comm_timeout_value(f.comm_timeout);
  c.json_path = f.json;
  if (f.timeline != "on" && f.timeline != "off")
    throw UsageError("--timeline: unknown '" + f.timeline + "'; allowed: on, off");
  c.timeline = f.timeline == "on";
  if (app.count("--trace") > 0 && f.trace.empty()) throw UsageError("--trace: needs a file name");
  if (!f.trace.empty() && !c.timeline)
    throw UsageError("--trace FILE needs the timeline: drop --timeline off");
  c.trace_path = f.trace;
  if (app.count("--csv") > 0 && f.csv.empty()) throw UsageError("--csv: needs a directory");
  c.csv_dir = f.csv;
  c.allow_tf32 = f.tf32;
  std::vector<std::pair<std::string, std::string>> outputs = {{"--json", c.json_path}, {"--trace", c.trace_path}};
  if (!c.csv_dir.empty())
    for (const std::string& path : csv_paths(c.csv_dir)) outputs.emplace_back("--csv", path);
  check_distinct_outputs(outputs);
  check_folders_apart({{"--csv DIR", c.csv_dir}}, {{"--json FILE", c.json_path}, {"--trace FILE", c.trace_path}});
  check_deepspeed(c, f, app, command);
  return c;
}

// A run stopped by a signal still says so in one line (docs/design.md §6) and exits 128 + the
// signal, as the shell would report it. The line is made before any signal can come,
// so the handler only writes it (async-signal-safe). Result files are never half
// written: their writer holds these signals off until the rename is done.
char g_interrupt_line[128];
std::size_t g_interrupt_length = 0;
// After the signal's name: under mpirun, where SIGTERM also comes from mpirun when
// another rank has died, a word on where to look.
const char* g_interrupt_suffix = "";

extern "C" void on_run_interrupt(int sig) {
  if (writing_result_file()) {  // the writer raises it again once the file is whole
    defer_signal(sig);
    return;
  }
  if (g_interrupt_length == 0) ::_exit(128 + sig);  // not the rank that speaks
  char line[384];
  std::size_t n = 0;
  for (std::size_t i = 0; i < g_interrupt_length && n < sizeof(line) - 16; ++i) line[n++] = g_interrupt_line[i];
  const char* name = interrupt_name(sig);  // only these four are handled here
  if (name == nullptr) name = "a signal";
  for (const char* c = name; *c != '\0'; ++c) line[n++] = *c;
  if (sig == SIGTERM)
    for (const char* c = g_interrupt_suffix; *c != '\0' && n < sizeof(line) - 1; ++c) line[n++] = *c;
  line[n++] = '\n';
  (void)!::write(STDERR_FILENO, line, n);
  ::_exit(128 + sig);
}

// Under mpirun every rank gets the signal; rank 0 alone says so, the others just exit.
// An emulated process speaks for the one rank it plays.
void say_when_interrupted(int rank, bool speaks, bool under_launcher = false) {
  std::snprintf(g_interrupt_line, sizeof(g_interrupt_line), "shardscope: error: rank %d: interrupted by ", rank);
  g_interrupt_length = speaks ? std::strlen(g_interrupt_line) : 0;
  g_interrupt_suffix = under_launcher ? " (mpirun sends it to every rank when one has failed: its own message names "
                                        "that rank)"
                                      : "";
  struct sigaction sa {};
  sa.sa_handler = on_run_interrupt;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(sig, &sa, nullptr);
}

int run_command(int argc, char** argv) {
  // `--comm mpi|nccl` asks for MPI even for one rank (mpirun -np 1, or a singleton).
  bool wants_mpi = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const std::string next = i + 1 < argc ? argv[i + 1] : "";
    if ((a == "--comm" && (next == "mpi" || next == "nccl")) || a == "--comm=mpi" || a == "--comm=nccl")
      wants_mpi = true;
  }
  std::unique_ptr<MpiSession> session;
  try {
    session = std::make_unique<MpiSession>(&argc, &argv, wants_mpi);
  } catch (const std::exception& e) {  // a launcher's variables that make no sense
    error_line(e.what());
    return 2;
  }
  MpiSession& mpi = *session;
  const bool multi = mpi.world() > 1;
  say_when_interrupted(mpi.rank(), mpi.rank() == 0, multi);

  // Every rank parses its flags, then the ranks agree on the outcome before anything
  // else: a rank whose flags fail (or ask for --help) must not leave the others waiting
  // in the job's first collective.
  enum Status : int { parsed = 0, wants_help = 1, refused = 2 };
  int status = parsed;
  std::string problem;
  CLI::App app{"shardscope run: one job; this process is one rank", "shardscope run"};
  RunFlags flags;
  add_run_flags(app, flags);
  RunConfig cfg;
  try {
    check_option_values(app, std::vector<std::string>(argv + 1, argv + argc));
    app.parse(argc, argv);  // argv[0] is "run"
    cfg = to_config(flags, app);
    cfg.command_line = "shardscope " + join_command_line(argc, argv);  // argv[0] is "run"
  } catch (const CLI::CallForHelp&) {
    status = wants_help;
  } catch (const CLI::ParseError& e) {
    status = refused;
    problem = parse_error_text(app, e);
  } catch (const UsageError& e) {
    status = refused;
    problem = e.what();
  }
  const int worst = multi ? all_reduce_max(status) : status;
  if (worst != parsed) {
    const int least = multi ? -all_reduce_max(-status) : status;
    if (worst == wants_help && least == wants_help) {
      if (mpi.rank() == 0) std::cout << app.help();
      return 0;
    }
    // The lowest rank that was refused names why; if none was, some asked for help.
    const int first = multi ? -all_reduce_max(status == refused ? -mpi.rank() : -mpi.world()) : 0;
    if (first == mpi.world()) {
      if (mpi.rank() == 0) error_line("flags differ across ranks: some ask for --help; start every rank alike");
    } else if (mpi.rank() == first) {
      error_line(first == 0 ? problem : "rank " + std::to_string(first) + ": " + problem);
    }
    return 2;
  }
  // Every rank must run the same job: differing flags would leave some ranks waiting
  // in a collective the others never reach.
  if (multi && !all_ranks_equal(cfg.command_line)) {
    if (mpi.rank() == 0) error_line("flags differ across ranks: every rank of a job must be started with the same flags");
    return 2;
  }
  if (cfg.emulate_world > 0) say_when_interrupted(cfg.emulate_rank, true);  // the rank it plays
  try {
    run_and_write(cfg, mpi, std::cout);
    return 0;
  } catch (const UsageError& e) {
    // Every rank checks the configuration the same way, so all exit here together.
    if (mpi.rank() == 0) error_line(e.what());
    return 2;
  } catch (const std::exception& e) {
    std::string what = e.what();
    if (what.rfind("rank ", 0) != 0) what = "rank " + std::to_string(mpi.rank()) + ": " + what;
    error_line(what);
    if (multi) mpi.abort(3);  // the other ranks may be waiting in a collective
    return 3;
  }
}

void usage() {
  std::cout << "usage: shardscope run [flags]          one job (start under mpirun -np W for W ranks)\n"
               "       shardscope sweep [flags]        the seed's experiment, or any list of runs\n"
               "       shardscope plan [flags]         a sweep's closed forms, every rank, nothing run\n"
               "       shardscope compare BASE NEW     two result files side by side\n"
               "       shardscope <command> --help\n"
               "       shardscope --version            the version and the git commit built from\n";
}

}  // namespace

int parse_positive(const std::string& flag, const std::string& v, int most, const std::string& why) {
  if (!all_digits(v) || v.find_first_not_of('0') == std::string::npos)
    throw UsageError(flag + ": '" + v + "' is not a positive integer");
  const std::size_t first = v.find_first_not_of('0');
  if (v.size() - first > 10 || std::stoll(v.substr(first)) > most)
    throw UsageError(flag + ": " + v + " is above the largest allowed, " + std::to_string(most) + why);
  return static_cast<int>(std::stoll(v.substr(first)));
}

std::string did_you_mean(const std::string& given, const std::vector<std::string>& known) {
  const std::string name = given.substr(0, given.find('='));
  // Edit distance between two flag names: insertions, deletions, substitutions and swaps
  // of neighbours ("--hlep") each count one.
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); ++i)
      for (std::size_t j = 1; j <= b.size(); ++j) {
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    return d[a.size()][b.size()];
  };
  // Close means a third of the name or less changed (at least one edit), or the name is
  // the start of exactly one flag ("--micro" for "--microbatches").
  const std::size_t letters = name.size() > 2 ? name.size() - 2 : name.size();
  std::size_t best = std::max<std::size_t>(1, letters / 3) + 1;
  std::string closest;
  std::vector<std::string> starting;
  for (const std::string& k : known) {
    if (k == name) continue;
    if (letters >= 3 && k.rfind(name, 0) == 0 &&
        std::find(starting.begin(), starting.end(), k) == starting.end())
      starting.push_back(k);
    const std::size_t d = distance(name, k);
    if (d < best) {
      best = d;
      closest = k;
    }
  }
  if (closest.empty() && starting.size() == 1) closest = starting.front();
  return closest.empty() ? "" : "; did you mean " + closest + "?";
}

bool exact_bytes_value(const std::string& v) {
  if (v != "binary" && v != "exact") throw UsageError("--bytes: unknown '" + v + "'; allowed: binary, exact");
  return v == "exact";
}

void check_run_args(const std::vector<std::string>& args, const std::vector<std::string>& also_known,
                    const std::string& command) {
  (void)parse_run_args(args, also_known, command);
}

RunConfig parse_run_args(const std::vector<std::string>& args, const std::vector<std::string>& also_known,
                         const std::string& command) {
  CLI::App app{"shardscope run", "shardscope run"};
  RunFlags flags;
  add_run_flags(app, flags);
  check_option_values(app, args);
  // As argv, so that CLI11's messages list the arguments in the order given.
  std::vector<std::string> words{"run"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    throw UsageError("--help is not a flag a sweep passes to its runs");
  } catch (const CLI::ParseError& e) {
    throw UsageError(parse_error_text(app, e, also_known, command));
  }
  return to_config(flags, app, command);
}

namespace {

// The command's own work; cli_main adds the check of standard output.
int dispatch(int argc, char** argv) {
  if (argc < 2) {
    usage();
    error_line("missing command; allowed: run, sweep, plan, compare");
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage();
    return 0;
  }
  if (cmd == "--version" || cmd == "version") {
    std::cout << "shardscope " << SHARDSCOPE_VERSION << " (git " << build_commit() << ")\n";
    return 0;
  }
  if (cmd == "run") return run_command(argc - 1, argv + 1);
  if (cmd == "sweep" || cmd == "plan" || cmd == "compare") {
    const std::vector<std::string> args(argv + 2, argv + argc);
    try {
      if (cmd == "compare") return compare_main(args);
      return cmd == "sweep" ? sweep_main(args, self_exe(argv[0])) : plan_main(args);
    } catch (const UsageError& e) {
      error_line(e.what());
      return 2;
    } catch (const std::exception& e) {
      error_line(e.what());
      return 3;
    }
  }
  usage();
  if (cmd.rfind("-", 0) == 0)
    error_line("unknown flag '" + cmd + "'" + did_you_mean(cmd, {"--help", "--version"}) +
               "; a command comes first: run, sweep, plan, compare");
  else
    error_line("unknown command '" + cmd + "'; allowed: run, sweep, plan, compare");
  return 2;
}

}  // namespace

int cli_main(int argc, char** argv) {
  const int rc = dispatch(argc, argv);
  // Tables that could not be written (a full disk, /dev/full) are a failure, not a
  // success with nothing said. A pipe or socket whose reader left (`| head`) is not: the
  // reader chose to stop, and the result files are whole.
  errno = 0;
  std::cout.flush();
  struct stat out {};
  const bool reader_may_leave = ::fstat(STDOUT_FILENO, &out) == 0 && (S_ISFIFO(out.st_mode) || S_ISSOCK(out.st_mode));
  if ((!std::cout || std::fflush(stdout) != 0 || std::ferror(stdout)) && !reader_may_leave) {
    error_line("cannot write the tables to standard output" +
               std::string(errno != 0 ? std::string(": ") + std::strerror(errno) : std::string()));
    return rc == 0 ? 3 : rc;
  }
  return rc;
}

}  // namespace shardscope
