#include "harness/cli/plan.hpp"

#include <algorithm>
#include <cctype>
#include <iostream>
#include <map>
#include <optional>
#include <utility>

#include "harness/cli/cli.hpp"
#include "harness/cli/plan_overhead.hpp"
#include "harness/cli/sweep_plan.hpp"
#include "harness/cli/sweep_results.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/table.hpp"
#include "harness/records/json_write.hpp"
#include "harness/run/records.hpp"
#include "harness/run/run.hpp"
#include "harness/pipeline/run_pipeline.hpp"
#include "harness/predict/workspace_forms.hpp"
#include "shardscope/check.hpp"
#include "shardscope/format.hpp"
#include "shardscope/mesh.hpp"
#include "shardscope/predict.hpp"
#include "shardscope/schedule.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// Sweep flags that only mean something when jobs run, and why plan has none.
const std::vector<std::pair<std::string, std::string>> kRunningFlags = {
    {"--out", "plan writes no results folder; --json FILE writes the plan"},
    {"--trace", "plan runs nothing, so there is no timeline to trace"},
    {"--report", "plan runs nothing; the tables are its report"},
    {"--csv", "plan runs nothing; --json FILE writes the plan"},
    {"--emulate", "plan runs nothing; it predicts every rank of every world"},
    {"--mpirun", "plan launches nothing"},
    {"--oversubscribe", "plan launches nothing"},
    {"--timeout", "plan launches nothing"}};

// What the figures leave out, printed under the tables and kept in the document.
constexpr const char* kNotCounted =
    "Bytes are what shardscope's allocator hook counts: every tensor, buffer and workspace a "
    "step allocates, equal on cpu and cuda (docs/results.md, \"GPU\") but for cuBLAS's 32 MiB workspace, "
    "which cuda holds and --backend cuda adds. Left out: what a process holds "
    "outside that hook (on a GPU the CUDA context and NCCL's and cuBLAS's own buffers: 620,756,992 B "
    "per process on one H200, measured while cuBLAS's 4 MiB default workspace was still outside the pool), and "
    "allocator fragmentation. Leave room for them: --overhead RESULT.json adds a measured run's.";

}  // namespace

PlanRequest parse_plan_args(const std::vector<std::string>& args) {
  PlanRequest f;
  f.command = "shardscope plan";
  for (const std::string& a : args) f.command += " " + a;
  bool json_given = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const std::size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    for (const auto& [flag, why] : kRunningFlags)
      if (name == flag) throw UsageError(name + ": not a plan flag: " + why);
    if (name != "--json" && name != "--memory" && name != "--fit" && name != "--overhead") {
      f.sweep_args.push_back(arg);
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    } else {
      throw UsageError(name + ": needs a value");
    }
    if (value.empty()) throw UsageError(name + ": empty value");
    if (name == "--json") {
      if (json_given) throw UsageError("--json: given twice; give it once");
      json_given = true;
      f.json_path = value;
    } else if (name == "--overhead") {
      if (!f.overhead_path.empty()) throw UsageError("--overhead: given twice; give it once");
      f.overhead_path = value;
    } else if (name == "--fit") {
      if (f.fit) throw UsageError("--fit: given twice; give it once");
      f.fit = parse_fit_dimension(value);
    } else {
      if (f.memory) throw UsageError("--memory: given twice; give it once");
      f.memory = parse_memory_size(value);
    }
  }
  if (!f.overhead_path.empty() && !f.memory)
    throw UsageError("--overhead " + f.overhead_path +
                     " needs --memory SIZE: its bytes outside the pool are added to every peak for the --memory "
                     "verdicts (e.g. --memory 141GB)");
  if (f.fit && !f.memory)
    throw UsageError(std::string("--fit ") + fit_dimension_name(*f.fit) +
                     " needs --memory SIZE: the size every rank's peak must fit in (e.g. --memory 80GiB)");
  return f;
}

namespace {

// Whether `peak` fits in --memory; none without it.
std::optional<bool> fits(const std::optional<std::int64_t>& memory, std::int64_t peak) {
  if (!memory) return std::nullopt;
  return peak <= *memory;
}

// The same for a rank whose peak may have no closed form yet (a transformer's): then
// only the resting bytes decide, and only that it does not fit.
std::optional<bool> fits(const std::optional<std::int64_t>& memory, const Prediction& p) {
  if (p.peak_known) return fits(memory, p.peak_total);
  const std::optional<bool> resting = fits(memory, p.resting.total());
  return resting && !*resting ? resting : std::nullopt;
}

// Every rank's closed forms on the backend the flags name: `--backend cuda` adds cuBLAS's
// workspace to each (plan runs nothing, so no flag or cpu plans the allocator's bytes as
// cpu holds them; docs/cli.md).
std::vector<Prediction> predict_ranks(const RunConfig& cfg, int world) {
  std::vector<Prediction> predicted = predict_data_parallel_ranks(cfg, world);
  for (Prediction& p : predicted) add_backend_workspace(p, cfg.backend);
  return predicted;
}

DataParallelPlan plan_data_parallel(const RunConfig& cfg, int world, const std::optional<std::int64_t>& memory) {
  validate_data_parallel(cfg);
  DataParallelPlan plan;
  plan.run = data_parallel_run(cfg, world);
  // Consecutive ranks with the same figures share one entry: a world of 65,536 ranks
  // stays a few lines (zero1's whole-tensor partition makes a few groups at most; every
  // other strategy one).
  const std::vector<Prediction> predicted = predict_ranks(cfg, world);
  if (cfg.mesh.given) {
    // A mesh's equal ranks need not be neighbours (tp is fastest): each distinct
    // prediction is one group, listing its ranks.
    std::map<std::string, std::size_t> seen;  // figures as written -> group
    for (int r = 0; r < world; ++r) {
      RankPredicted p = rank_predicted(predicted[r]);
      const std::string figures = to_json(p).dump();
      const auto at = seen.find(figures);
      if (at != seen.end()) {
        RankGroupPlan& g = plan.rank_groups[at->second];
        g.last = r;
        g.ranks->push_back(r);
        continue;
      }
      seen.emplace(figures, plan.rank_groups.size());
      plan.rank_groups.push_back({r, r, std::vector<int>{r}, std::move(p), fits(memory, predicted[r])});
    }
  }
  json last;  // the last group's figures, as written
  for (int r = 0; r < world && !cfg.mesh.given; ++r) {
    RankPredicted p = rank_predicted(predicted[r]);
    json figures = to_json(p);
    if (!plan.rank_groups.empty() && figures == last) {
      plan.rank_groups.back().last = r;
      continue;
    }
    last = std::move(figures);
    plan.rank_groups.push_back({r, r, std::nullopt, std::move(p), fits(memory, predicted[r])});
  }
  // Every rank fits when each is known to; one that does not decides alone.
  std::optional<bool> every = memory ? std::optional<bool>(true) : std::nullopt;
  for (const RankGroupPlan& group : plan.rank_groups) {
    if (!memory) break;
    if (group.fits == std::optional<bool>(false)) {
      every = false;
      break;
    }
    if (!group.fits) every = std::nullopt;
  }
  plan.fits_every_rank = every;
  return plan;
}

// What --fit asks of a data-parallel configuration: its ranks' predictions, the highest
// peak and resting bytes among them.
ConfigPeak data_parallel_peak(const RunConfig& cfg, int world) {
  ConfigPeak out;
  const std::vector<Prediction> predicted = predict_ranks(cfg, world);
  for (int r = 0; r < world; ++r) {
    const Prediction& p = predicted[r];
    out.known = out.known && p.peak_known;
    out.resting = std::max(out.resting, p.resting.total());
    if (p.peak_known && (r == 0 || p.peak_total > out.peak)) {
      out.peak = p.peak_total;
      out.limiting = r;
    }
  }
  return out;
}

// Every stage's closed forms (stage s is rank s; under --mesh dp=D,pp=S the D ranks of
// its replicas), what plan_pipeline prints and --fit asks, from one place; `shape` is set
// to the checked shape.
std::vector<StageForms> predict_stages(const RunConfig& cfg, int stages, PipelineShape* shape) {
  refuse_checkpointed_pipeline(cfg);
  refuse_unbuilt_autocast(cfg);
  *shape = pipeline_shape(cfg, stages);
  std::vector<StageForms> forms;
  for (int s = 0; s < stages; ++s) {
    forms.push_back(predict_pipeline_stage(*shape, s, cfg.mesh.given ? cfg.mesh.dp : 1));
    add_backend_workspace(forms.back(), cfg.backend);
  }
  return forms;
}

// What --fit asks of a pipeline: the highest stage's peak and resting bytes.
ConfigPeak pipeline_peak(const RunConfig& cfg, int stages) {
  ConfigPeak out;
  PipelineShape shape;
  const std::vector<StageForms> forms = predict_stages(cfg, stages, &shape);
  for (int s = 0; s < stages; ++s) {
    out.resting = std::max(out.resting, forms[s].resting.total());
    if (s == 0 || forms[s].peak.total() > out.peak) {
      out.peak = forms[s].peak.total();
      out.limiting = s;
    }
  }
  return out;
}

PipelinePlan plan_pipeline(const RunConfig& cfg, int stages, const std::optional<std::int64_t>& memory) {
  PipelineShape shape;
  const std::vector<StageForms> forms = predict_stages(cfg, stages, &shape);
  // The lists (bounded by pipeline_shape's cap on forward actions) give the live
  // micro-batch counts beside their formulas; the bytes are closed forms.
  const PipelineLayout layout = make_pipeline_layout(shape);
  PipelinePlan plan;
  plan.run = pipeline_run(cfg, stages);
  plan.bubble_fraction_theory = bubble_theory(layout.schedule);
  std::int64_t highest = 0;
  for (int s = 0; s < stages; ++s) {
    StagePlan stage;
    stage.stage = s;
    stage.rank = s;
    if (cfg.mesh.given) {  // the ranks whose pp index is s
      stage.ranks.emplace();
      for (int d = 0; d < cfg.mesh.dp; ++d)
        for (int t = 0; t < cfg.mesh.tp; ++t) stage.ranks->push_back(cfg.mesh.rank_of({d, t, s}));
      stage.rank = stage.ranks->front();
    }
    stage_layers(layout, s, &stage.layers, &stage.chunks_layers);
    stage.predicted = stage_predicted(forms[s], layout.schedule, s);
    stage.fits = fits(memory, forms[s].peak.total());
    highest = std::max(highest, forms[s].peak.total());
    plan.stages.push_back(std::move(stage));
  }
  plan.fits_every_rank = fits(memory, highest);
  return plan;
}

}  // namespace

std::int64_t parse_memory_size(const std::string& text) {
  const std::string what = "--memory: '" + text + "'";
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  std::string unit = text.substr(i);
  if (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool plain = !number.empty() && number.find('.') == std::string::npos;
  const bool decimal = !number.empty() && std::count(number.begin(), number.end(), '.') == 1 &&
                       number.front() != '.' && number.back() != '.';
  if (!plain && !decimal)
    throw UsageError(what + " is not a size; write e.g. 80GiB, 141GB, 512MiB or a byte count");
  static const std::vector<std::pair<std::string, std::int64_t>> kUnits = {
      {"", 1},           {"b", 1},           {"kib", 1LL << 10}, {"mib", 1LL << 20}, {"gib", 1LL << 30},
      {"tib", 1LL << 40}, {"kb", 1'000},     {"mb", 1'000'000},  {"gb", 1'000'000'000}, {"tb", 1'000'000'000'000}};
  for (const char* ambiguous : {"k", "m", "g", "t"})
    if (unit == ambiguous)
      throw UsageError(what + " is ambiguous: write " + number + static_cast<char>(std::toupper(ambiguous[0])) +
                       "iB (binary) or " + number + static_cast<char>(std::toupper(ambiguous[0])) + "B (decimal)");
  const auto u = std::find_if(kUnits.begin(), kUnits.end(), [&](const auto& k) { return k.first == unit; });
  if (u == kUnits.end())
    throw UsageError(what + ": unknown unit; allowed: B, KiB, MiB, GiB, TiB, KB, MB, GB, TB");
  if (!plain && u->second == 1) throw UsageError(what + ": a byte count is a whole number");
  // In integers, so that every byte count is exact: whole × unit + ⌊0.fraction × unit⌋,
  // the floor taken digit by digit from the right (acc = ⌊(d × unit + acc) / 10⌋ stays
  // below unit, so nothing overflows however many digits there are).
  constexpr std::int64_t kCap = std::int64_t{1} << 62;
  const std::string whole = number.substr(0, number.find('.'));
  const std::string fraction = plain ? "" : number.substr(number.find('.') + 1);
  const std::size_t first = whole.find_first_not_of('0');
  const std::string digits = first == std::string::npos ? "0" : whole.substr(first);
  if (digits.size() > 19) throw UsageError(what + " is above the largest allowed, 4 EiB");
  const unsigned __int128 unit_bytes = static_cast<unsigned __int128>(u->second);
  unsigned __int128 part = 0;
  for (auto d = fraction.rbegin(); d != fraction.rend(); ++d)
    part = (static_cast<unsigned __int128>(*d - '0') * unit_bytes + part) / 10;
  const unsigned __int128 bytes = static_cast<unsigned __int128>(std::stoull(digits)) * unit_bytes + part;
  if (bytes < 1) throw UsageError(what + " is below one byte");
  if (bytes > static_cast<unsigned __int128>(kCap)) throw UsageError(what + " is above the largest allowed, 4 EiB");
  return static_cast<std::int64_t>(bytes);
}

namespace {

// Under --mesh the world is the mesh's D·T·S: the sweep plans that one world (--worlds is
// refused), and every rank group of it.
std::vector<std::string> with_mesh_world(const std::vector<std::string>& args) {
  std::optional<std::string> text;
  bool worlds = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string name = args[i].substr(0, args[i].find('='));
    if (name == "--worlds") worlds = true;
    if (name != "--mesh") continue;
    if (args[i].find('=') != std::string::npos)
      text = args[i].substr(args[i].find('=') + 1);
    else if (i + 1 < args.size())
      text = args[i + 1];
  }
  if (!text) return args;
  const MeshShape mesh = parse_mesh(*text);
  if (worlds)
    throw UsageError("--worlds and --mesh " + mesh.text() + ": the mesh's dp·tp·pp (" + std::to_string(mesh.world()) +
                     " ranks) is the world; drop --worlds");
  std::vector<std::string> out = args;
  out.push_back("--worlds");
  out.push_back(std::to_string(mesh.world()));
  return out;
}

}  // namespace

PlanDocument make_plan(const PlanRequest& flags) {
  const std::vector<SweepJob> jobs = plan_sweep(parse_sweep_args(with_mesh_world(flags.sweep_args)));
  // Every job's flags first, as a sweep checks them: a bad flag is exit 2, not a skip.
  std::vector<RunConfig> configs;
  std::vector<std::string> known = sweep_flag_names();
  known.insert(known.end(), {"--json", "--memory"});
  known.push_back("--fit");
  known.push_back("--overhead");
  for (const SweepJob& job : jobs) configs.push_back(parse_run_args(job.run_args, known, "plan"));
  if (flags.fit == FitDimension::seq)
    for (const RunConfig& cfg : configs)
      if (!cfg.model.is_transformer())
        throw UsageError("--fit seq: the MLP has no sequence length; --fit batch fits its rows per rank");
  PlanDocument plan;
  plan.version = SHARDSCOPE_VERSION;
  plan.command = flags.command;
  plan.memory_bytes = flags.memory;
  plan.not_counted = kNotCounted;
  if (!flags.overhead_path.empty()) {
    plan.overhead = read_plan_overhead(flags.overhead_path);
    if (plan.overhead->bytes >= *flags.memory)
      throw UsageError("--overhead: the " + format_bytes(plan.overhead->bytes) + " outside the pool that '" +
                       flags.overhead_path + "' measured (" + plan.overhead->taken_from + ") leave nothing of --memory " +
                       format_bytes(*flags.memory));
  }
  // What every rank's peak is compared with: --memory less what the device holds outside
  // the pool (--overhead), so the verdicts are about the device.
  const std::optional<std::int64_t> budget = allocator_budget(plan);
  for (std::size_t n = 0; n < jobs.size(); ++n) {
    try {
      const RunConfig& cfg = configs[n];
      // Under --mesh a pipeline's stages are the pp axis's (the job's world is the mesh's).
      const int world = jobs[n].kind == "pipeline" && cfg.mesh.given ? cfg.mesh.pp : jobs[n].world;
      if (jobs[n].kind == "pipeline") {
        PipelinePlan pipeline = plan_pipeline(cfg, world, budget);
        // A pipeline's batch is cut into M micro-batches of at least a row each: any
        // batch from M up runs (tensor_split), so the fit steps by a row from M.
        const std::int64_t smallest = flags.fit == FitDimension::batch ? pipeline_microbatches(cfg, world) : 1;
        if (flags.fit)
          pipeline.fit = fit_configuration(cfg, *flags.fit, *budget, smallest,
                                           [&](const RunConfig& c) { return pipeline_peak(c, world); });
        plan.plans.push_back(std::move(pipeline));
      } else {
        DataParallelPlan data_parallel = plan_data_parallel(cfg, world, budget);
        if (flags.fit)
          data_parallel.fit = fit_configuration(cfg, *flags.fit, *budget, 1,
                                                [&](const RunConfig& c) { return data_parallel_peak(c, world); });
        plan.plans.push_back(std::move(data_parallel));
      }
    } catch (const UsageError& e) {
      plan.plans.push_back(SkippedRun{jobs[n].config, e.what()});
    }
  }
  return plan;
}

int plan_main(const std::vector<std::string>& args) {
  if (sweep_wants_help(args)) {
    std::cout << plan_usage();
    return 0;
  }
  const PlanRequest request = parse_plan_args(args);
  const SweepOptions sweep = parse_sweep_args(request.sweep_args);
  // The output path before the work, so that a refused plan has done nothing.
  if (!request.json_path.empty()) check_writable(request.json_path, "--json FILE");
  const PlanDocument plan = make_plan(request);
  // The file first: a reader that closes stdout early (`plan | head`) must not cost it.
  if (!request.json_path.empty()) write_file_atomic(request.json_path, readable_json(to_json(plan)) + "\n");
  print_plan(plan, std::cout, TableOptions{sweep.exact_bytes, sweep.wide});
  return 0;
}

std::string plan_usage() {
  return "usage: shardscope plan [sweep flags] [run flags] [--memory SIZE [--fit batch|seq] [--overhead RESULT.json]]\n"
         "                      [--json FILE]\n"
         "\n"
         "Prints the closed forms (docs/formulas.md) of every rank of every configuration that\n"
         "`shardscope sweep` with the same flags would run: bytes at rest and at the peak, where the\n"
         "peak falls and what it holds above rest by category, communication per step, and per\n"
         "pipeline stage the saved activations and point-to-point bytes. Nothing runs and nothing\n"
         "is allocated, so any model a run accepts can be planned at any world size (up to 65536),\n"
         "on any machine. Measured runs equal these figures to the byte (the tests).\n"
         "\n"
         "  --memory SIZE   say for every rank whether its peak fits in SIZE (80GiB, 141GB, 512MiB or\n"
         "                  bytes; \"80G\" is ambiguous and refused), and at which of the worlds\n"
         "                  planned each configuration fits\n"
         "  --fit batch|seq with --memory: per configuration, the largest batch (sequences or rows per\n"
         "                  rank; per pipeline for a pipeline, from M up) or sequence length\n"
         "                  (transformers) at which every rank's peak fits, the peak there and one\n"
         "                  above, the rank that decides, and what bounds it when memory does not\n"
         "  --overhead RESULT.json\n"
         "                  with --memory: add the device memory outside the pool that a measured\n"
         "                  --backend cuda run held (the most any of its ranks did: CUDA context,\n"
         "                  cuBLAS, NCCL) to every rank's peak, so the verdicts are about the device\n"
         "  --json FILE     write the plan (schema shardscope-plan/1) here\n"
         "\n"
         "Sweep flags: --worlds, --strategies, --schedules, --microbatches, --preset (see\n"
         "`shardscope sweep --help`); with none, the seed's experiment. Every other flag is a `run`\n"
         "flag (--layers 80 --width 8192 --batch 16 --units 1 ...). A configuration that cannot run\n"
         "is listed as skipped with its reason.\n"
         "\n"
         "Transformers: --hf-config config.json (gpt2, llama, mistral, qwen2) or --model gpt2|llama with\n"
         "--layers --hidden --heads --kv-heads --ffn --vocab --seq --positions; their model states per\n"
         "rank are exact, their peak comes with the activation forms (`shardscope run --help`).\n";
}

}  // namespace shardscope
