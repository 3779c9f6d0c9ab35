#include "harness/cli/sweep.hpp"

#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "harness/cli/child_process.hpp"
#include "harness/cli/job_errors.hpp"
#include "harness/cli/sweep_results.hpp"
#include "harness/report/csv.hpp"
#include "harness/report/html_report.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/provenance.hpp"
#include "harness/report/table.hpp"
#include "harness/report/trace.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct JobOutcome {
  enum class Status { done, skipped, failed };
  Status status = Status::done;
  std::vector<json> runs;  // done
  json document;           // done: the job's result document (one rank's when emulated)
  json provenance;         // done: the job document's
  std::string reason;      // skipped: why the configuration cannot run
  std::string error;       // failed: one line, without "shardscope: error: "
  std::string stderr_text; // failed: the failing process's stderr, shown as it is
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Removes the per-job folder however the sweep ends.
class ScratchDir {
 public:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {
    std::error_code ec;
    fs::remove_all(path_, ec);  // a previous sweep that was killed
    if (!fs::create_directory(path_, ec))
      throw RunError("cannot create '" + path_ + "': " + (ec ? ec.message() : "it exists"));
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class JobRunner {
 public:
  JobRunner(const SweepOptions& opts, std::string self_exe, std::string mpirun, std::string scratch)
      : opts_(opts), self_exe_(std::move(self_exe)), mpirun_(std::move(mpirun)), scratch_(std::move(scratch)) {
    if (::geteuid() == 0) env_ = {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"};
  }

  JobOutcome run(const SweepJob& job, std::size_t n) const {
    const std::string base = scratch_ + "/" + std::to_string(n);
    if (opts_.emulate) return run_emulated(job, base);
    std::vector<std::string> argv;
    if (job.world > 1) {
      argv = {mpirun_, "-np", std::to_string(job.world)};
      if (opts_.oversubscribe || static_cast<unsigned>(job.world) > std::thread::hardware_concurrency())
        argv.push_back("--oversubscribe");
    }
    argv.insert(argv.end(), {self_exe_, "run"});
    argv.insert(argv.end(), job.run_args.begin(), job.run_args.end());
    argv.insert(argv.end(), {"--json", base + ".json"});
    return attempt(job, argv, base, -1);
  }

 private:
  // Rank r of world W as its own process (`run --emulate W:r`), ranks in sequence.
  JobOutcome run_emulated(const SweepJob& job, const std::string& base) const {
    std::vector<json> docs;
    json provenance;
    for (int r = 0; r < job.world; ++r) {
      const std::string rank_base = base + "." + std::to_string(r);
      std::vector<std::string> argv = {self_exe_, "run"};
      argv.insert(argv.end(), job.run_args.begin(), job.run_args.end());
      argv.insert(argv.end(), {"--emulate", std::to_string(job.world) + ":" + std::to_string(r), "--json",
                               rank_base + ".json"});
      JobOutcome one = attempt(job, argv, rank_base, r);
      if (one.status != JobOutcome::Status::done) return one;
      if (r == 0) provenance = one.provenance;
      docs.push_back(std::move(one.document));
    }
    JobOutcome merged;
    merged.provenance = provenance;
    try {
      merged.runs = merge_emulated_ranks(docs);
    } catch (const RunError& e) {
      merged.status = JobOutcome::Status::failed;
      merged.error = job.label + ": " + e.what();
    }
    return merged;
  }

  // One process: its result document, or why there is none.
  JobOutcome attempt(const SweepJob& job, const std::vector<std::string>& argv, const std::string& base,
                     int known_rank) const {
    ChildSpec spec{argv, base + ".log", base + ".err", env_, opts_.timeout_s};
    const ChildResult r = run_child(spec);
    JobOutcome out;
    const std::string err = read_text(spec.stderr_path);
    const std::string how = describe(r, opts_.timeout_s);
    const bool exited = r.end == ChildResult::End::exited;
    if (exited && r.code == 0) {
      try {
        out.document = read_json_file(base + ".json");
        out.runs = runs_of_document(out.document, base + ".json");
        out.provenance = out.document.value("provenance", json());
        return out;
      } catch (const RunError& e) {
        out.status = JobOutcome::Status::failed;
        out.error = job.label + ": finished, but its result is unusable: " + e.what();
        out.stderr_text = err;
        return out;
      }
    }
    if (exited && r.code == 2) {
      out.status = JobOutcome::Status::skipped;
      out.reason = shardscope_error_text(err);
      if (out.reason.empty()) out.reason = "the run refused the configuration (exit code 2)";
      return out;
    }
    out.status = JobOutcome::Status::failed;
    out.stderr_text = err;
    if (exited || r.end == ChildResult::End::signaled)
      out.error = failure_message(err, job.label, known_rank, how);
    else  // timed out or interrupted: what stderr says last is not the cause
      out.error = (known_rank >= 0 ? "rank " + std::to_string(known_rank) + ": " : std::string()) +
                  job.label + ": " + how;
    return out;
  }

  const SweepOptions& opts_;
  std::string self_exe_;
  std::string mpirun_;
  std::string scratch_;
  std::vector<std::string> env_;
};

// The launcher, when some job needs one; throws UsageError when it cannot be found.
std::string resolve_mpirun(const SweepOptions& opts, const std::vector<SweepJob>& jobs) {
  bool needed = false;
  for (const SweepJob& job : jobs) needed = needed || (!opts.emulate && job.world > 1);
  if (!needed) return {};
  if (!opts.mpirun.empty()) {
    const std::string path = find_executable(opts.mpirun);
    if (path.empty()) throw UsageError("--mpirun: '" + opts.mpirun + "' is not an executable file");
    return path;
  }
  const std::string path = find_executable("mpirun");
  if (path.empty())
    throw UsageError("mpirun not found on PATH: pass --mpirun PATH, or --emulate to run each rank as its "
                     "own emulated process");
  return path;
}

// Makes --out DIR and checks that DIR/shardscope.json can be written.
std::string prepare_out_dir(const std::string& out) {
  std::error_code ec;
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw UsageError("--out DIR: '" + out + "' exists and is not a directory");
  fs::create_directories(out, ec);
  if (ec) throw UsageError("--out DIR: cannot create '" + out + "': " + ec.message());
  const std::string json_path = (fs::path(out) / "shardscope.json").string();
  check_writable(json_path, "--out DIR");
  return json_path;
}

}  // namespace

int sweep_main(const std::vector<std::string>& args, const std::string& self_exe) {
  if (sweep_wants_help(args)) {
    std::cout << sweep_usage();
    return 0;
  }
  const SweepOptions opts = parse_sweep_args(args);
  const std::vector<SweepJob> jobs = plan_sweep(opts);
  const std::string mpirun = resolve_mpirun(opts, jobs);
  const std::string exe = find_executable(self_exe);
  if (exe.empty()) throw RunError("cannot run '" + self_exe + "': not an executable file");
  const std::string json_path = prepare_out_dir(opts.out);
  if (!opts.trace.empty()) check_writable(opts.trace, "--trace FILE");
  if (!opts.report.empty()) check_writable(opts.report, "--report FILE");
  if (!opts.csv.empty()) prepare_csv_dir(opts.csv);
  std::vector<std::string> words = {"shardscope", "sweep"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  const std::string command = join_command_line(static_cast<int>(argv.size()), argv.data());

  // A closed stdout (`shardscope sweep | head`) must not kill the sweep before it writes
  // its results: writes to it fail quietly instead. Jobs get the default back.
  struct IgnoreSigpipe {
    void (*old)(int) = std::signal(SIGPIPE, SIG_IGN);
    ~IgnoreSigpipe() { std::signal(SIGPIPE, old); }
  } ignore_sigpipe;

  std::vector<json> runs;
  json first_provenance;
  std::string error;
  {
    const ScratchDir scratch((fs::path(opts.out) / ".runs").string());
    const JobRunner runner(opts, exe, mpirun, scratch.path());
    for (std::size_t n = 0; n < jobs.size(); ++n) {
      const SweepJob& job = jobs[n];
      std::cout << "[" << n + 1 << "/" << jobs.size() << "] " << job.label << ": " << std::flush;
      JobOutcome outcome;
      try {
        outcome = runner.run(job, n);
      } catch (const std::exception& e) {  // the job could not be started: a failure like any other
        outcome.status = JobOutcome::Status::failed;
        outcome.error = job.label + ": " + e.what();
      }
      if (outcome.status == JobOutcome::Status::done) {
        runs.insert(runs.end(), outcome.runs.begin(), outcome.runs.end());
        if (first_provenance.is_null()) first_provenance = outcome.provenance;
        std::cout << "done" << std::endl;
      } else if (outcome.status == JobOutcome::Status::skipped) {
        runs.push_back(skipped_record(job, outcome.reason));
        std::cout << "skipped: " << outcome.reason << std::endl;
      } else {
        std::cout << "failed" << std::endl;
        std::cerr << outcome.stderr_text;
        if (!outcome.stderr_text.empty() && outcome.stderr_text.back() != '\n') std::cerr << '\n';
        error = outcome.error;
        break;
      }
    }
  }  // the job folder is gone before anything is printed
  const json doc = sweep_document(runs, first_provenance, command, opts.emulate, jobs.size(), error);
  write_file_atomic(json_path, readable_json(doc) + "\n");
  if (!opts.trace.empty()) write_trace_file(opts.trace, doc);
  if (!opts.report.empty()) write_file_atomic(opts.report, render_html_report(doc, command));
  if (!opts.csv.empty()) write_csv_files(doc, opts.csv);
  std::cout << '\n';
  print_tables(doc, std::cout);
  std::cout << "results: " << json_path << (error.empty() ? "\n" : " (incomplete: a run failed)\n");
  if (!opts.trace.empty()) std::cout << "trace: " << opts.trace << '\n';
  if (!opts.report.empty()) std::cout << "report: " << opts.report << '\n';
  if (!opts.csv.empty()) std::cout << "csv: " << opts.csv << "/{data_parallel,pipeline}.csv\n";
  if (!error.empty()) {
    std::cout << std::flush;
    std::cerr << "shardscope: error: " << error << std::endl;
    return 3;
  }
  return 0;
}

}  // namespace shardscope
