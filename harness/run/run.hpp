// `shardscope run`: one job in which this process is one rank (docs/design.md §6).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "harness/comm/mpi_env.hpp"
#include "harness/records/result.hpp"
#include "shardscope/comm.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// What a job runs on, chosen before anything is made.
struct JobSetup {
  std::string backend;  // "cpu" or "cuda"
  CommOptions comm;
  int world = 1;  // the job's ranks (the emulated world under --emulate)
};

// Chooses the backend and the communicator, and refuses (UsageError) a configuration
// the job cannot run, before anything is made. Every rank calls it: the ranks agree on
// the backend, then refuse alike (the refusals follow from the flags alone).
JobSetup prepare_job(const RunConfig& cfg, const MpiSession& mpi);

// Runs the job: measures, and on rank 0 returns the job's document (schema
// shardscope/1: records/json_write.hpp renders it); the other ranks get nothing. Prints nothing and writes
// no file: the caller renders the document. Throws UsageError (exit 2) or RunError
// (exit 3).
std::optional<ResultDocument> run_job(const RunConfig& cfg, const JobSetup& setup, MpiSession& mpi);

// Refuses (UsageError) what a data-parallel job cannot run at any world: zero2 or
// zero3 with more layers per unit than layers. (zero1 with more ranks than parameter
// tensors runs, as torch's ZeroRedundancyOptimizer does: some ranks own nothing.)
void validate_data_parallel(const RunConfig& cfg);
// UsageError naming --checkpoint and --schedule when a pipeline is asked to checkpoint
// (its stages do not: docs/design.md §2); a plan or sweep lists it as skipped.
void refuse_checkpointed_pipeline(const RunConfig& cfg);
// --precision bf16 where the torch engine's autocast is not built: a pipeline, zero2 and
// zero3 (exit 2 naming them).
void refuse_unbuilt_autocast(const RunConfig& cfg);

// A data-parallel run's fields before its ranks (docs/design.md §7): strategy, world, units,
// layers_per_unit, prefetch, ddp_bucket, bucket_mb, steps, timed_steps, seed, model.
DataParallelRun data_parallel_run(const RunConfig& cfg, int world);
// The same as JSON ("kind" too), without the fields only a run has (ranks, backend,
// comm, emulated).
nlohmann::json data_parallel_header(const RunConfig& cfg, int world);

}  // namespace shardscope
