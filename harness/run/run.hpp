// `shardscope run`: one job in which this process is one rank (DESIGN §6).
#pragma once

#include <nlohmann/json.hpp>

#include "harness/comm/mpi_env.hpp"
#include "shardscope/config.hpp"

namespace shardscope {

// Runs the job; on rank 0 prints the table and writes --json. Throws UsageError
// (exit 2) or RunError (exit 3).
void run_job(RunConfig cfg, MpiSession& mpi);

// Refuses (UsageError) what a data-parallel job cannot run at any world: zero2 or
// zero3 with more layers per unit than layers. (zero1 with more ranks than parameter
// tensors runs, as torch's ZeroRedundancyOptimizer does: some ranks own nothing.)
void validate_data_parallel(const RunConfig& cfg);

// A data-parallel run's fields before its ranks (DESIGN §7): kind, strategy, world,
// units, layers_per_unit, prefetch, ddp_bucket, bucket_mb, steps, timed_steps, seed, model.
nlohmann::json data_parallel_header(const RunConfig& cfg, int world);

// The whole-job document (schema shardscope/1) around a list of runs.
nlohmann::json make_document(const nlohmann::json& runs, const std::string& backend,
                             const std::string& comm, bool emulated,
                             const nlohmann::json& provenance);

}  // namespace shardscope
