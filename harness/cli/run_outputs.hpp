// What `shardscope run` makes of a job (docs/design.md §6): its output paths checked before the
// job starts, and on rank 0 its tables on stdout and its files (--csv, --json, --trace)
// once the job has measured. The job itself (harness/run/run.hpp) prints nothing.
#pragma once

#include <iosfwd>

#include <nlohmann/json.hpp>

#include "harness/comm/mpi_env.hpp"
#include "harness/records/result.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// Refuses (UsageError, on every rank) outputs that rank 0, which writes them, cannot
// write: the --csv folder first (a --json or --trace inside a folder it will make is
// fine), then --json and --trace. Creates nothing. A collective: every rank calls it.
void check_run_outputs(const RunConfig& cfg, const MpiSession& mpi);

// The document's tables on `out`, then the CSV folder (made now, --json or --trace may
// lie inside it), the JSON file and the trace, each when asked for.
void write_run_outputs(const ResultDocument& doc, const RunConfig& cfg, std::ostream& out);

// One job as `shardscope run` runs it: prepare_job, check_run_outputs, run_job, then
// on rank 0 write_run_outputs. Throws UsageError (exit 2) or RunError (exit 3).
void run_and_write(const RunConfig& cfg, MpiSession& mpi, std::ostream& out);

}  // namespace shardscope
