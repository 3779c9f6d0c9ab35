#include "harness/cli/run_outputs.hpp"

#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "harness/records/json_write.hpp"
#include "harness/report/csv.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/table.hpp"
#include "harness/report/trace.hpp"
#include "harness/run/run.hpp"
#include "shardscope/check.hpp"

namespace shardscope {

// Only rank 0 writes the outputs, so only it can check their paths; every rank must
// then learn its verdict, or the others would wait forever in the next collective.
void check_run_outputs(const RunConfig& cfg, const MpiSession& mpi) {
  std::string refusal;
  if (mpi.rank() == 0) {
    try {
      // The CSV folder first: a --json or --trace inside a folder it will make is fine.
      const std::vector<std::filesystem::path> made =
          cfg.csv_dir.empty() ? std::vector<std::filesystem::path>{} : check_csv_dir(cfg.csv_dir);
      if (!cfg.json_path.empty()) check_writable_in(cfg.json_path, "--json FILE", made);
      if (!cfg.trace_path.empty()) check_writable_in(cfg.trace_path, "--trace FILE", made);
    } catch (const UsageError& e) {
      refusal = e.what();
    }
  }
  broadcast_string(refusal, 0);
  if (!refusal.empty()) throw UsageError(refusal);
}

void write_run_outputs(const ResultDocument& doc, const RunConfig& cfg, std::ostream& out) {
  print_tables(doc, out, TableOptions{cfg.exact_bytes, cfg.wide_tables});
  // The CSV folder first: it is made now, and --json or --trace may lie inside it.
  if (!cfg.csv_dir.empty()) write_csv_files(doc, cfg.csv_dir);
  if (!cfg.json_path.empty()) write_file_atomic(cfg.json_path, readable_json(to_json(doc)) + "\n");
  if (!cfg.trace_path.empty()) write_trace_file(cfg.trace_path, doc);
}

void run_and_write(const RunConfig& cfg, MpiSession& mpi, std::ostream& out) {
  // The configuration first (every rank alike, no collective), then the output paths
  // (rank 0 checks, every rank learns the verdict): a refused run creates nothing.
  const JobSetup setup = prepare_job(cfg, mpi);
  check_run_outputs(cfg, mpi);
  const std::optional<ResultDocument> doc = run_job(cfg, setup, mpi);
  if (doc) write_run_outputs(*doc, cfg, out);
}

}  // namespace shardscope
