#include "harness/cli/sweep_plan.hpp"

#include <algorithm>
#include <optional>
#include <set>

#include "harness/cli/cli.hpp"
#include "harness/report/table.hpp"
#include "shardscope/check.hpp"
#include "shardscope/mesh.hpp"
#include "shardscope/schedule_kind.hpp"
#include "shardscope/strategy_kind.hpp"

namespace shardscope {
namespace {

using nlohmann::json;
using Flags = std::vector<std::pair<std::string, std::string>>;  // preset flags: name, value

const std::vector<std::string> kStrategies(kStrategyNames.begin(), kStrategyNames.end());
// What --strategies takes: every strategy, and hsdp (zero3 over --shard-group ranks,
// replicated across the groups), which runs only when named.
const std::vector<std::string> kStrategyChoices = [] {
  std::vector<std::string> v = kStrategies;
  v.push_back("hsdp");
  return v;
}();
const std::vector<std::string> kPresets = {"seed-dp", "seed-pp"};

// The seed's experiment (tests/reference/seed-3.13.json).
const Flags kSeedDpFlags = {{"--layers", "8"},       {"--width", "256"}, {"--batch", "32"},
                            {"--activation", "none"}, {"--loss", "sum"},  {"--steps", "11"}};
const Flags kSeedPpFlags = {{"--layers", "2"},       {"--width", "32"}, {"--batch", "8"},
                            {"--activation", "relu"}, {"--loss", "mse"}, {"--steps", "11"}};

// `run --units` when none is given: one layer per unit.
const std::string kDefaultUnits = "1";

// The largest world size --worlds takes: beyond any machine this tool profiles, and far
// below what would make `mpirun -np W` a fork bomb.
constexpr int kMaxWorld = 65'536;
// Micro-batches per pipeline run, as `run --microbatches` caps them.
constexpr int kMaxMicrobatches = 10'000;
// A job's time limit: a week is beyond any job worth waiting for.
constexpr int kMaxTimeoutS = 604'800;

// `run` flags that shape one family only (run refuses them in the other): a sweep passes
// each to the jobs it applies to, so one sweep can mix both families. (--sp reaches both:
// sequence-parallel data-parallel steps and pipeline stages.)
const std::vector<std::string> kDataParallelOnly = {"--units",      "--prefetch", "--ddp-bucket", "--bucket-mb",
                                                    "--accumulate", "--no-sync",  "--overlap"};
const std::vector<std::string> kPipelineOnly = {"--chunks", "--split"};  // --microbatches is a sweep list

// `run` flags the sweep sets itself, and what to use instead.
const std::vector<std::pair<std::string, std::string>> kOwnedRunFlags = {
    {"--strategy", "use --strategies in a sweep"},
    {"--schedule", "use --schedules in a sweep"},
    {"--json", "the sweep writes DIR/shardscope.json; use --out DIR"}};

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + v[i];
  return out;
}

std::vector<std::string> split_list(const std::string& flag, const std::string& value) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = value.find(',', start);
    items.push_back(value.substr(start, comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (const std::string& item : items)
    if (item.empty()) throw UsageError(flag + ": '" + value + "' has an empty item; give a comma-separated list");
  return items;
}

// A --worlds item: a positive integer up to kMaxWorld.
int world_size(const std::string& v) { return parse_positive("--worlds", v, kMaxWorld, " ranks"); }

// Refuses an item a list already holds: "--worlds: 2 is given twice".
template <typename T>
void check_new(const std::string& flag, const std::vector<T>& list, const T& item, const std::string& text) {
  if (std::find(list.begin(), list.end(), item) != list.end())
    throw UsageError(flag + ": " + text + " is given twice; give each once");
}

void check_allowed(const std::string& flag, const std::string& what, const std::string& v,
                   const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) == allowed.end())
    throw UsageError(flag + ": '" + v + "' is not " + what + "; allowed: " + join(allowed));
}

bool is_long_flag(const std::string& s) { return s.size() > 2 && s.compare(0, 2, "--") == 0; }

// The value of the last pass-through flag called `name`; nullopt when absent or bare.
std::optional<std::string> pass_value(const SweepOptions& o, const std::string& name) {
  std::optional<std::string> v;
  for (const PassFlag& f : o.pass) {
    if (f.name != name) continue;
    if (f.tokens.size() == 2) v = f.tokens[1];
    else if (const auto eq = f.tokens[0].find('='); eq != std::string::npos) v = f.tokens[0].substr(eq + 1);
  }
  return v;
}

// `args` less flag `name` and its value (given as two tokens or as name=value).
std::vector<std::string> without_flag(const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    if (args[i] == name) {
      if (i + 1 < args.size() && !is_long_flag(args[i + 1])) ++i;
      continue;
    }
    if (args[i].rfind(name + "=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  return out;
}

bool has_pass(const SweepOptions& o, const std::string& name) {
  return std::any_of(o.pass.begin(), o.pass.end(), [&](const PassFlag& f) { return f.name == name; });
}

template <typename T, typename U>
bool has(const std::vector<T>& v, const U& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Whether pass-through flag `name` reaches a job of this family (no schedule for data
// parallel, else the job's schedule): data-parallel flags only data-parallel jobs, pipeline
// flags only pipeline jobs, and --chunks only interleaved-1f1b, the one schedule it shapes.
bool reaches(const std::string& name, std::optional<ScheduleKind> schedule) {
  if (has(kDataParallelOnly, name)) return !schedule;
  if (name == "--chunks") return schedule == ScheduleKind::interleaved_1f1b;
  if (has(kPipelineOnly, name)) return schedule.has_value();
  return true;
}

// The preset's flags that no pass-through flag replaces, then every pass-through flag
// that reaches a job of this family (see reaches()).
std::vector<std::string> merged_flags(const SweepOptions& o, const Flags& preset,
                                      std::optional<ScheduleKind> schedule) {
  // A transformer (--hf-config, --model gpt2|llama) takes the preset's experiment (its
  // strategies, worlds and steps), not its MLP's shape.
  const std::optional<std::string> model = pass_value(o, "--model");
  const bool transformer = has_pass(o, "--hf-config") || (model && *model != "mlp");
  const std::vector<std::string> mlp_shape = {"--layers", "--width", "--batch", "--activation", "--loss"};
  std::vector<std::string> out;
  for (const auto& [name, value] : preset) {
    if (has_pass(o, name) || (transformer && has(mlp_shape, name))) continue;
    out.push_back(name);
    out.push_back(value);
  }
  for (const PassFlag& f : o.pass)
    if (reaches(f.name, schedule)) out.insert(out.end(), f.tokens.begin(), f.tokens.end());
  return out;
}

// "1" -> 1, "all" -> "all": layers_per_unit as the JSON schema writes it.
json units_value(const std::string& v) {
  const bool digits = !v.empty() && v.size() <= 9 &&
                      std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
  return digits ? json(std::stoi(v)) : json(v);
}

SweepJob make_job(json config, std::vector<std::string> run_args) {
  SweepJob job;
  job.kind = config["kind"].get<std::string>();
  job.world = config["world"].get<int>();
  config["args"] = run_args;
  job.label = run_label(config);
  job.run_args = std::move(run_args);
  job.config = std::move(config);
  return job;
}

// The sweep's own flags that hold one value (or none); every flag it does not own is a
// run flag, passed on to each job.
bool is_single_sweep_flag(const std::string& name) {
  static const std::set<std::string> single = {"--out",           "--trace",   "--report", "--csv",
                                               "--emulate",       "--mpirun",  "--bytes",  "--wide",
                                               "--oversubscribe", "--timeout"};
  return single.count(name) > 0;
}

}  // namespace

std::vector<std::string> sweep_flag_names() {
  return {"--worlds", "--strategies", "--schedules", "--microbatches", "--preset", "--out",     "--trace",
          "--report", "--csv",        "--emulate",   "--mpirun",       "--oversubscribe",        "--timeout",
          "--bytes",  "--wide",       "--help"};
}

bool sweep_wants_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "--help" || a == "-h"; });
}

SweepOptions parse_sweep_args(const std::vector<std::string>& args) {
  SweepOptions o;
  std::set<std::string> seen;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!is_long_flag(arg))
      throw UsageError("sweep: unexpected argument '" + arg + "'; flags are written --name value");
    const std::size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const bool inline_value = eq != std::string::npos;
    // The value of a sweep flag that takes one: "--name=value" or the next argument.
    auto value = [&]() -> std::string {
      if (inline_value) return arg.substr(eq + 1);
      if (i + 1 >= args.size() || is_long_flag(args[i + 1])) throw UsageError(name + ": needs a value");
      return args[++i];
    };
    auto no_value = [&] {
      if (inline_value) throw UsageError(name + ": takes no value");
    };
    // The sweep's own flags that take one value, as run's: once each, so that a second
    // --out is not quietly taken over the first. Lists (--worlds, --strategies, ...)
    // and --preset add up instead.
    if (is_single_sweep_flag(name) && !seen.insert(name).second)
      throw UsageError(name + ": given more than once; give it once");
    if (name == "--worlds") {
      for (const std::string& w : split_list(name, value())) {
        const int world = world_size(w);
        check_new(name, o.worlds, world, std::to_string(world));
        o.worlds.push_back(world);
      }
    } else if (name == "--strategies") {
      for (const std::string& s : split_list(name, value())) {
        check_allowed(name, "a strategy", s, kStrategyChoices);
        check_new(name, o.strategies, s, "'" + s + "'");
        o.strategies.push_back(s);
      }
    } else if (name == "--schedules") {
      for (const std::string& s : split_list(name, value())) {
        const std::optional<ScheduleKind> kind = find_schedule(s);
        if (!kind) throw UsageError(name + ": '" + s + "' is not a schedule; allowed: " + schedule_names_text());
        check_new(name, o.schedules, *kind, "'" + s + "'");
        o.schedules.push_back(*kind);
      }
    } else if (name == "--microbatches") {
      for (const std::string& m : split_list(name, value())) {
        const int count = parse_positive(name, m, kMaxMicrobatches);
        check_new(name, o.microbatches, count, std::to_string(count));
        o.microbatches.push_back(count);
      }
    } else if (name == "--preset") {
      const std::string p = value();
      check_allowed(name, "a preset", p, kPresets);
      if (!has(o.presets, p)) o.presets.push_back(p);
    } else if (name == "--out") {
      o.out = value();
      if (o.out.empty()) throw UsageError("--out: needs a directory");
    } else if (name == "--trace") {
      // The sweep's own: one trace of every job, from the merged document (never passed
      // on, or each job would write the same file).
      o.trace = value();
      if (o.trace.empty()) throw UsageError("--trace: needs a file name");
    } else if (name == "--report") {  // the sweep's own, like --trace
      o.report = value();
      if (o.report.empty()) throw UsageError("--report: needs a file name");
    } else if (name == "--csv") {
      o.csv = value();
      if (o.csv.empty()) throw UsageError("--csv: needs a directory");
    } else if (name == "--emulate") {
      if (inline_value || (i + 1 < args.size() && !is_long_flag(args[i + 1])))
        throw UsageError("--emulate: takes no value in a sweep (it runs every rank of each world as "
                         "its own emulated process)");
      o.emulate = true;
    } else if (name == "--mpirun") {
      o.mpirun = value();
      if (o.mpirun.empty()) throw UsageError("--mpirun: needs a path");
    } else if (name == "--oversubscribe") {
      no_value();
      o.oversubscribe = true;
    } else if (name == "--timeout") {
      o.timeout_s = parse_positive(name, value(), kMaxTimeoutS, " s (a week)");
    } else if (name == "--bytes") {  // the tables' own, never passed on
      o.exact_bytes = exact_bytes_value(value());
    } else if (name == "--wide") {
      no_value();
      o.wide = true;
    } else {
      for (const auto& [owned, instead] : kOwnedRunFlags)
        if (name == owned) throw UsageError(name + ": " + instead);
      PassFlag f{name, {arg}};
      if (!inline_value && i + 1 < args.size() && !is_long_flag(args[i + 1])) f.tokens.push_back(args[++i]);
      o.pass.push_back(std::move(f));
    }
  }
  if (!o.trace.empty() && pass_value(o, "--timeline") == std::optional<std::string>("off"))
    throw UsageError("--trace FILE needs the timeline: drop --timeline off");
  return o;
}

std::vector<SweepJob> plan_sweep(const SweepOptions& o) {
  const bool nothing_chosen = o.presets.empty() && o.strategies.empty() && o.schedules.empty();
  const bool dp_preset = nothing_chosen || has(o.presets, "seed-dp");
  const bool pp_preset = nothing_chosen || has(o.presets, "seed-pp");
  const bool data_parallel = dp_preset || !o.strategies.empty();
  const bool pipeline = pp_preset || !o.schedules.empty();
  if (!o.microbatches.empty() && !pipeline)
    throw UsageError("--microbatches: applies to pipeline runs; add --schedules or --preset seed-pp");
  // A family's flag that reaches no job would be quietly dropped: refused instead.
  for (const PassFlag& f : o.pass) {
    if (f.name == "--shard-group" && !has(o.strategies, std::string("hsdp")))
      throw UsageError("--shard-group: applies to hsdp runs; add hsdp to --strategies");
    if (has(kDataParallelOnly, f.name) && !data_parallel)
      throw UsageError(f.name + ": applies to data-parallel runs; add --strategies or --preset seed-dp");
    if (f.name == "--split" && !pipeline)
      throw UsageError("--split: applies to pipeline runs; add --schedules or --preset seed-pp");
    if (f.name == "--chunks" && !has(o.schedules, ScheduleKind::interleaved_1f1b))
      throw UsageError("--chunks: applies to interleaved-1f1b runs only; add interleaved-1f1b to --schedules");
  }

  // --mesh fixes a job's world, its product (a pipeline's too: its D·T·S ranks): --worlds
  // may name that alone, and without --worlds it is the one world run.
  std::optional<MeshShape> mesh;
  if (const std::optional<std::string> m = pass_value(o, "--mesh"); m) mesh = parse_mesh(*m);
  auto check_mesh_worlds = [&](const std::vector<int>& worlds) {
    for (int w : worlds)
      if (mesh && w != mesh->world())
        throw UsageError("--mesh " + mesh->text() + " and --worlds " + std::to_string(w) + ": the mesh is dp·tp·pp = " +
                         std::to_string(mesh->world()) + " ranks; give --worlds " + std::to_string(mesh->world()) +
                         " or leave --worlds out");
  };
  std::vector<SweepJob> jobs;
  if (data_parallel) {
    const std::vector<int> worlds =
        !o.worlds.empty() ? o.worlds : mesh ? std::vector<int>{mesh->world()} : std::vector<int>{2, 4};
    check_mesh_worlds(worlds);
    const std::vector<std::string> strategies = o.strategies.empty() ? kStrategies : o.strategies;
    const std::vector<std::string> flags = merged_flags(o, dp_preset ? kSeedDpFlags : Flags{}, std::nullopt);
    const std::optional<std::string> units = pass_value(o, "--units");
    for (int w : worlds) {
      for (const std::string& s : strategies) {
        const bool hsdp = s == "hsdp";  // zero3 within each shard group
        const bool sharded = hsdp || shards_by_unit(parse_strategy(s, "--strategies"));
        // seed-dp compares the root unit with one unit per layer, where zero2 and zero3 differ.
        std::vector<std::string> unit_settings = {""};
        if (dp_preset && !has_pass(o, "--units") && sharded) unit_settings = {"all", "1"};
        for (const std::string& u : unit_settings) {
          json config = {{"kind", "data_parallel"}, {"strategy", s}, {"world", w}};
          std::vector<std::string> args = {"--strategy", s};
          args.insert(args.end(), flags.begin(), flags.end());
          if (hsdp) {
            if (auto g = pass_value(o, "--shard-group")) config["shard_group"] = units_value(*g);
          } else {
            args = without_flag(args, "--shard-group");  // hsdp's alone
          }
          if (!u.empty()) {
            args.insert(args.end(), {"--units", u});
            config["layers_per_unit"] = units_value(u);
          } else if (sharded) {  // no effect on ddp and zero1
            config["layers_per_unit"] = units_value(units ? *units : kDefaultUnits);
          }
          if (auto p = pass_value(o, "--prefetch")) config["prefetch"] = units_value(*p);
          if (auto b = pass_value(o, "--ddp-bucket")) config["ddp_bucket"] = *b;
          jobs.push_back(make_job(std::move(config), std::move(args)));
        }
      }
    }
  }
  if (pipeline) {
    const std::vector<int> worlds = !o.worlds.empty() ? o.worlds
                                    : mesh            ? std::vector<int>{mesh->world()}
                                    : pp_preset       ? std::vector<int>{2}
                                                      : std::vector<int>{2, 4};
    check_mesh_worlds(worlds);
    const std::vector<ScheduleKind> schedules =
        o.schedules.empty() ? std::vector<ScheduleKind>{ScheduleKind::gpipe, ScheduleKind::one_f_one_b} : o.schedules;
    std::vector<int> microbatches = o.microbatches;
    if (microbatches.empty() && pp_preset) microbatches = {2, 4, 8};
    if (microbatches.empty()) microbatches = {0};  // 0: run's default, no flag
    for (int s : worlds) {
      for (const ScheduleKind schedule : schedules) {
        const std::string name(schedule_name(schedule));
        for (int m : microbatches) {
          json config = {{"kind", "pipeline"}, {"schedule", name}, {"world", s}};
          if (mesh) config["mesh"] = {{"dp", mesh->dp}, {"tp", mesh->tp}, {"pp", mesh->pp}};  // world: D·T·S ranks
          std::vector<std::string> args = {"--schedule", name};
          if (m > 0) {
            args.insert(args.end(), {"--microbatches", std::to_string(m)});
            config["microbatches"] = m;
          }
          const std::vector<std::string> flags = merged_flags(o, pp_preset ? kSeedPpFlags : Flags{}, schedule);
          args.insert(args.end(), flags.begin(), flags.end());
          if (auto c = pass_value(o, "--chunks"); c && reaches("--chunks", schedule)) config["chunks"] = units_value(*c);
          jobs.push_back(make_job(std::move(config), std::move(args)));
        }
      }
    }
  }
  return jobs;
}

std::vector<SweepJob> plan_sweep(const std::vector<std::string>& args) {
  return plan_sweep(parse_sweep_args(args));
}

std::string sweep_usage() {
  return "usage: shardscope sweep [sweep flags] [run flags]\n"
         "\n"
         "Runs one `shardscope run` job per configuration (mpirun -np W <this shardscope> run ...),\n"
         "merges the results into DIR/shardscope.json and prints the tables. With no flags it runs\n"
         "the seed's experiment: --preset seed-dp --preset seed-pp.\n"
         "\n"
         "sweep flags:\n"
         "  --worlds LIST        world sizes, for pipeline runs the stage counts (default 2,4;\n"
         "                       at most 65536)\n"
         "  --strategies LIST    data-parallel runs: ddp, zero1, zero2, zero3, hsdp (with --shard-group G)\n"
         "  --schedules LIST     pipeline runs: gpipe, 1f1b, interleaved-1f1b, zb-h1, zbv\n"
         "  --microbatches LIST  micro-batch counts of pipeline runs (default: one run at M = S)\n"
         "  --preset NAME        seed-dp: 8 x 256, activation none, loss sum, batch 32, 11 steps,\n"
         "                       every strategy at W = 2 and 4, zero2/zero3 with --units all and 1;\n"
         "                       seed-pp: 2 x 32, relu, mse, batch 8, 11 steps, gpipe and 1f1b at\n"
         "                       S = 2, M = 2, 4, 8. Repeatable.\n"
         "  --out DIR            where shardscope.json goes (default results/); one sweep at a time\n"
         "  --trace FILE         one Chrome trace-event JSON of every rank of every run\n"
         "                       (open it at ui.perfetto.dev or chrome://tracing)\n"
         "  --report FILE.html   one self-contained HTML report: charts of bytes per rank, memory\n"
         "                       over time, pipeline actions, and the tables (no network needed)\n"
         "  --csv DIR            DIR/data_parallel.csv and DIR/pipeline.csv, one flat row per\n"
         "                       rank x category and per stage (columns: docs/json.md, \"CSV\")\n"
         "  --emulate            run each rank of each world as its own emulated process\n"
         "                       (run --emulate W:r; no MPI needed; times are compute only)\n"
         "  --mpirun PATH        the launcher (default: mpirun on PATH)\n"
         "  --oversubscribe      pass --oversubscribe to mpirun (on anyway when W > cores)\n"
         "  --timeout SECONDS    per job (default 600); a job over it is killed and fails\n"
         "  --bytes binary|exact the tables' bytes as 2.01 MiB (default) or 2,105,344 (the JSON\n"
         "                       and CSV always hold exact bytes)\n"
         "  --wide               the tables with every column, each prediction in full\n"
         "\n"
         "Every other flag is a `run` flag (--layers 8 --width 256 --units 1 --backend cpu ...)\n"
         "and reaches every job it applies to: --units, --prefetch, --ddp-bucket, --bucket-mb and\n"
         "--overlap data-parallel jobs, --split pipeline jobs, --chunks interleaved-1f1b jobs; it\n"
         "replaces a preset's flag of the same name. Every job's flags are checked as `run` checks them before\n"
         "any job starts. Each list names an item once.\n"
         "--strategies alone runs data-parallel jobs only, --schedules alone pipeline jobs only.\n"
         "\n"
         "A configuration that cannot run (its run exits 2) is recorded as skipped with its reason;\n"
         "a failed run (exit 3, a dead rank, a timeout) ends the sweep with exit 3 after writing what\n"
         "completed, with one error line; the failed job's stderr is kept in DIR/failed-job.log.\n"
         "SIGINT, SIGTERM, SIGHUP or SIGQUIT end it the same way, after stopping the running job.\n"
         "No two outputs (--out's files, --trace, --report, --csv's files) may name one file.\n";
}

}  // namespace shardscope
