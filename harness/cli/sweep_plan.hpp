// What `shardscope sweep` will launch (docs/design.md §6): its own flags, the `run` flags it
// passes through, the presets, and the list of jobs. Pure: nothing here runs anything.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardscope/schedule_kind.hpp"

namespace shardscope {

// A `run` flag given to the sweep, as it was written: {"--layers", "8"}, {"--layers=8"}
// or a bare {"--tf32"}.
struct PassFlag {
  std::string name;                 // "--layers"
  std::vector<std::string> tokens;  // passed to every job verbatim
};

struct SweepOptions {
  std::vector<int> worlds;               // --worlds; empty: the default (2,4; presets: theirs)
  std::vector<std::string> strategies;   // --strategies; empty: not given
  std::vector<ScheduleKind> schedules;   // --schedules
  std::vector<int> microbatches;         // --microbatches
  std::vector<std::string> presets;      // --preset, repeatable: seed-dp, seed-pp
  std::string out = "results";           // --out DIR
  std::string trace;                     // --trace FILE: every run's ranks in one trace
  std::string report;                    // --report FILE.html: the self-contained HTML report
  std::string csv;                       // --csv DIR: data_parallel.csv and pipeline.csv
  bool emulate = false;                  // --emulate: each rank its own `run --emulate W:r`
  std::string mpirun;                    // --mpirun PATH; empty: `mpirun` on PATH
  bool oversubscribe = false;            // --oversubscribe (also on when W > cores)
  int timeout_s = 600;                   // --timeout SECONDS, per job
  bool exact_bytes = false;              // --bytes exact: the tables' bytes to the byte
  bool wide = false;                     // --wide: the tables with every column
  std::vector<PassFlag> pass;            // every other flag: a `run` flag, in order
};

// One `shardscope run` job: W ranks of one configuration.
struct SweepJob {
  std::string kind;                   // "data_parallel" or "pipeline"
  int world = 1;                      // ranks (pipeline: stages)
  std::vector<std::string> run_args;  // after "run"; the sweep adds --json (and --emulate W:r)
  nlohmann::json config;              // kind, strategy|schedule, world, layers_per_unit,
                                      // microbatches, ... and "args": run_args
  std::string label;                  // "zero3 W=4 units=1", "1f1b S=2 M=8"
};

// Parses everything after `sweep`. Throws UsageError naming the flag and what is
// allowed: "--worlds: 'x' is not a positive integer", "--strategies: 'fsdp' is not a
// strategy; allowed: ddp, zero1, zero2, zero3", a world size above 65536, an item a list
// gives twice ("--worlds: 2 is given twice; give each once"), ...
SweepOptions parse_sweep_args(const std::vector<std::string>& args);

// The jobs, data-parallel first (world, strategy, unit setting), then pipeline (stages,
// schedule, micro-batches). No --preset, --strategies or --schedules: both presets.
// --strategies alone: data-parallel only; --schedules alone: pipeline only. A preset's
// model flags apply to its own jobs; a pass-through flag replaces a preset's flag of
// the same name and reaches every job it applies to: --units, --prefetch, --ddp-bucket
// and --bucket-mb data-parallel jobs, --split pipeline jobs, --chunks interleaved-1f1b
// jobs (UsageError when such a flag would reach no job). seed-dp runs zero2 and zero3
// once with --units all and once with --units 1 unless --units is given. The run flags
// are not checked here (check_run_args does, in the sweep).
std::vector<SweepJob> plan_sweep(const SweepOptions& opts);
std::vector<SweepJob> plan_sweep(const std::vector<std::string>& args);

// The sweep's own flags ("--worlds", ...): what an unknown flag may have meant.
std::vector<std::string> sweep_flag_names();

// True when `args` asks for help (-h, --help): answered before anything is checked.
bool sweep_wants_help(const std::vector<std::string>& args);
std::string sweep_usage();

}  // namespace shardscope
