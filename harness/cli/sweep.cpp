#include "harness/cli/sweep.hpp"

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "harness/cli/child_process.hpp"
#include "harness/cli/cli.hpp"
#include "harness/cli/job_errors.hpp"
#include "harness/cli/sweep_out_dir.hpp"
#include "harness/cli/sweep_results.hpp"
#include "harness/cli/timeline_spill.hpp"
#include "harness/memory/host_memory.hpp"
#include "harness/report/cells.hpp"
#include "harness/report/csv.hpp"
#include "harness/report/html_report.hpp"
#include "harness/records/json_read.hpp"
#include "harness/report/json_io.hpp"
#include "harness/report/table.hpp"
#include "harness/report/trace.hpp"
#include "harness/run/provenance.hpp"
#include "shardscope/check.hpp"
#include "shardscope/format.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

struct JobOutcome {
  enum class Status { done, skipped, failed };
  Status status = Status::done;
  std::vector<json> runs;  // done
  json document;           // done: the job's result document (one rank's when emulated)
  json provenance;         // done: the job document's
  std::string reason;      // skipped: why the configuration cannot run
  std::string error;       // failed: one line, without "shardscope: error: "
  std::string stderr_text; // failed: the failing process's stderr, for DIR/failed-job.log
  bool timed_out = false;   // failed: stopped at its time limit
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class JobRunner {
 public:
  // Every job's timelines go to `spill` as its result is read.
  JobRunner(const SweepOptions& opts, std::string self_exe, std::string mpirun, std::string scratch,
            TimelineSpill& spill)
      : opts_(opts), self_exe_(std::move(self_exe)), mpirun_(std::move(mpirun)), scratch_(std::move(scratch)),
        spill_(spill) {
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
    return attempt(job, argv, base, -1, opts_.timeout_s);
  }

 private:
  // Rank r of world W as its own process (`run --emulate W:r`), ranks in sequence.
  JobOutcome run_emulated(const SweepJob& job, const std::string& base) const {
    std::vector<json> docs;
    json provenance;
    // --timeout bounds the job, all its ranks together, as it bounds an mpirun job.
    const auto job_start = std::chrono::steady_clock::now();
    for (int r = 0; r < job.world; ++r) {
      if (const int sig = InterruptGuard::received()) {  // the rest of the job is not started
        JobOutcome stopped;
        stopped.status = JobOutcome::Status::failed;
        stopped.error = job.label + ": interrupted by " + interrupt_text(sig) + " before rank " + std::to_string(r);
        return stopped;
      }
      const double used = std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start).count();
      const double left = opts_.timeout_s - used;
      auto timed_out = [&](JobOutcome out) {
        out.status = JobOutcome::Status::failed;
        out.error = job.label + ": timed out after " + std::to_string(opts_.timeout_s) + " s with " +
                    std::to_string(r) + " of its " + std::to_string(job.world) +
                    " emulated ranks done (--timeout bounds the whole job)";
        return out;
      };
      if (left <= 0.0) return timed_out(JobOutcome{});
      const std::string rank_base = base + "." + std::to_string(r);
      std::vector<std::string> argv = {self_exe_, "run"};
      argv.insert(argv.end(), job.run_args.begin(), job.run_args.end());
      argv.insert(argv.end(), {"--emulate", std::to_string(job.world) + ":" + std::to_string(r), "--json",
                               rank_base + ".json"});
      JobOutcome one = attempt(job, argv, rank_base, r, left);
      if (one.timed_out) return timed_out(std::move(one));
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

  // One process, stopped after `timeout_s` (what is left of the job's --timeout): its
  // result document, or why there is none.
  JobOutcome attempt(const SweepJob& job, const std::vector<std::string>& argv, const std::string& base,
                     int known_rank, double timeout_s) const {
    ChildSpec spec{argv, base + ".log", base + ".err", env_, timeout_s};
    const ChildResult r = run_child(spec);
    JobOutcome out;
    const std::string err = read_text(spec.stderr_path);
    const std::string how = describe(r, opts_.timeout_s);
    const bool exited = r.end == ChildResult::End::exited;
    if (exited && r.code == 0) {
      try {
        out.document = read_json_file(base + ".json");
        spill_.take(out.document);  // the sweep holds no rank's timeline until it writes
        // Every field checked here, at the edge, naming the job's file (its timelines as
        // they are read back from disk).
        (void)read_result(out.document, base + ".json");
        out.runs = runs_of_document(out.document, base + ".json");
        out.provenance = out.document.value("provenance", json());
        return out;
      } catch (const std::runtime_error& e) {  // RunError, or UsageError from the check
        out.status = JobOutcome::Status::failed;
        out.error = job.label + ": finished, but its result is unusable: " + e.what();
        out.stderr_text = err;
        return out;
      }
    }
    // Exit 2 is the run refusing the configuration only when the run says so; without its
    // "shardscope: error:" line it is the launcher failing, and a failure like any other.
    if (exited && r.code == 2 && !shardscope_error_text(err).empty()) {
      out.status = JobOutcome::Status::skipped;
      out.reason = shardscope_error_text(err);
      return out;
    }
    out.status = JobOutcome::Status::failed;
    out.stderr_text = err;
    // Under mpirun (argv[0]) a rank is only known from stderr; alone, the process is rank
    // `known_rank` (emulated) or rank 0 (W = 1).
    const bool launcher = argv[0] == mpirun_;
    const int rank = launcher ? -1 : known_rank >= 0 ? known_rank : 0;
    out.timed_out = r.end == ChildResult::End::timed_out;
    if (r.end == ChildResult::End::timed_out || r.end == ChildResult::End::interrupted) {
      // What stderr says last is not the cause. An emulated rank runs alone: the others
      // have finished or not started.
      out.error = opts_.emulate ? "rank " + std::to_string(rank) + ": " + how + " (" + job.label + ")"
                                : job.label + ": " + how + "; every rank was stopped";
    } else if (launcher && shardscope_error_text(err).empty() && failed_rank(err) < 0) {
      out.error = launcher_failure_message(err, job.label, how);
    } else if (!launcher && r.end == ChildResult::End::signaled) {
      out.error = "rank " + std::to_string(rank) + ": " + how + " (" + job.label + ")";
    } else {
      out.error = failure_message(err, job.label, rank, how);
    }
    return out;
  }

  const SweepOptions& opts_;
  std::string self_exe_;
  std::string mpirun_;
  std::string scratch_;
  TimelineSpill& spill_;
  std::vector<std::string> env_;
};

// The failed job's stderr kept in DIR/failed-job.log (the sweep prints one error line,
// not the ranks' errors and mpirun's banners); `error` with where it went, inside the
// closing "(<label>)" when it has one: "rank 1: ... (ddp W=2; its output: DIR/failed-job.log)".
std::string keep_failed_output(const std::string& error, const std::string& label, const std::string& stderr_text,
                               const std::string& out_dir) {
  if (stderr_text.empty()) return error;
  const std::string path = (std::filesystem::path(out_dir) / kFailedJobLog).string();
  std::string note;
  try {
    write_file_atomic(path, stderr_text.back() == '\n' ? stderr_text : stderr_text + "\n");
    note = "its output: " + path;
  } catch (const std::exception& e) {
    note = "its output was not kept: " + std::string(e.what());
  }
  const std::string tail = " (" + label + ")";
  if (!label.empty() && error.size() > tail.size() && error.compare(error.size() - tail.size(), tail.size(), tail) == 0)
    return error.substr(0, error.size() - 1) + "; " + note + ")";
  return error + " (" + note + ")";
}

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

// Every job's flags as its `run` will read them (with the --emulate and --json the sweep
// adds), before any job starts: a bad flag is bad usage of the sweep, exit 2, not a
// configuration to record as skipped. What only the run can tell is left to it.
void check_job_args(const std::vector<SweepJob>& jobs, bool emulate) {
  for (const SweepJob& job : jobs) {
    check_run_args(job.run_args, sweep_flag_names(), "sweep");  // first alone: a trailing "--steps" does not meet "--json"
    std::vector<std::string> args = job.run_args;
    if (emulate) args.insert(args.end(), {"--emulate", std::to_string(job.world) + ":0"});
    args.insert(args.end(), {"--json", "job.json"});
    // `run` refuses --comm fake without --emulate only once it runs: every job would be
    // recorded as skipped.
    if (parse_run_args(args).comm == "fake" && !emulate)
      throw UsageError("--comm fake: needs --emulate (each rank its own process on the fake communicator)");
  }
}

// The sweep's results file: DIR/shardscope.json, unless the sweep is incomplete and that
// file holds complete results, which an interrupted or failed sweep never replaces: then
// DIR/shardscope.partial.json beside it.
std::string results_path(const std::string& json_path, const std::string& partial_path, bool complete) {
  return complete || !holds_complete_results(json_path) ? json_path : partial_path;
}

// Runs `write`; its failure is kept in `errors` (after any earlier one) instead of
// ending the sweep before the other files are written. True when it succeeded.
template <typename Write>
bool write_keeping_error(std::vector<std::string>& errors, Write write) {
  try {
    write();
    return true;
  } catch (const std::exception& e) {
    errors.emplace_back(e.what());
    return false;
  }
}

// The report draws every rank's timeline at once: the document with all of them back,
// after checking that they fit. Parsed, a timeline takes about 7 times its text (6.9
// measured for one at its limits: 3,161,846 B of text, 21,943,536 B parsed).
json whole_document(const json& doc, const TimelineSpill& spill) {
  constexpr std::int64_t kParsedPerTextByte = 7;
  const std::int64_t needed = spill.bytes() * kParsedPerTextByte;
  const HostMemory host = host_memory_available();
  if (needed > host.available)
    throw RunError("--report: the report draws every rank's timeline at once, about " + format_bytes(needed) +
                   " in memory (" + format_bytes(spill.bytes()) + " of timelines as text), more than the " +
                   format_bytes(host.available) + " this process can have (" + host.how +
                   "); it was not written: fewer ranks, fewer --steps or --timeline off make it fit");
  json whole = doc;
  const json* runs = cells::at(doc, {"runs"});
  for (std::size_t i = 0; runs && runs->is_array() && i < runs->size(); ++i)
    whole["runs"][i] = spill.restore_run((*runs)[i]);
  return whole;
}

}  // namespace

int sweep_main(const std::vector<std::string>& args, const std::string& self_exe) {
  if (sweep_wants_help(args)) {
    std::cout << sweep_usage();
    return 0;
  }
  const SweepOptions opts = parse_sweep_args(args);
  const std::vector<SweepJob> jobs = plan_sweep(opts);
  check_job_args(jobs, opts.emulate);
  const std::string mpirun = resolve_mpirun(opts, jobs);
  const std::string exe = find_executable(self_exe);
  if (exe.empty()) throw RunError("cannot run '" + self_exe + "': not an executable file");
  // From here until the sweep returns, SIGINT, SIGTERM, SIGHUP and SIGQUIT stop the
  // running job's process group and the sweep writes what completed (exit 3): nothing
  // is left running, and no result file is left half written.
  const InterruptGuard interrupts;
  check_sweep_outputs(opts);
  if (const int sig = InterruptGuard::received())  // nothing made yet: nothing to write
    throw RunError("interrupted by " + interrupt_text(sig) + " before any job started");
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

  const std::string json_path = make_out_dir(opts.out);
  const OutDirLock lock(opts.out);
  remove_stale_scratch(opts.out);  // what a sweep killed outright left
  {
    // An earlier sweep's failed-job log would read as this one's: only a failure of this
    // sweep leaves one.
    std::error_code ec;
    const std::filesystem::path old_log = std::filesystem::path(opts.out) / kFailedJobLog;
    if (std::filesystem::is_regular_file(old_log, ec)) std::filesystem::remove(old_log, ec);
  }
  std::vector<json> runs;
  json first_provenance;
  std::string error, failed_label, failed_stderr;
  // The jobs' folder, and the timelines on disk until the files are written.
  const ScratchDir scratch(opts.out);
  TimelineSpill spill(scratch.path() + "/timelines");
  {
    const JobRunner runner(opts, exe, mpirun, scratch.path(), spill);
    for (std::size_t n = 0; n < jobs.size(); ++n) {
      const SweepJob& job = jobs[n];
      if (const int sig = InterruptGuard::received()) {
        error = "interrupted by " + interrupt_text(sig) + " before " + job.label;
        break;
      }
      // Progress goes to stderr: stdout holds the tables alone.
      std::cerr << "[" << n + 1 << "/" << jobs.size() << "] " << job.label << ": " << std::flush;
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
        std::cerr << "done" << std::endl;
      } else if (outcome.status == JobOutcome::Status::skipped) {
        runs.push_back(skipped_record(job, outcome.reason));
        std::cerr << "skipped: " << outcome.reason << std::endl;
      } else {
        std::cerr << "failed" << std::endl;
        error = outcome.error;
        failed_label = job.label;
        failed_stderr = std::move(outcome.stderr_text);
        break;
      }
    }
  }
  const std::string error_line = keep_failed_output(error, failed_label, failed_stderr, opts.out);
  const json doc = sweep_document(runs, first_provenance, command, opts.emulate, jobs.size(), error);
  // Every file that can be written is, whatever failed before it; the first failure is the
  // one reported first (a job's, then a file's).
  std::vector<std::string> errors;
  if (!error.empty()) errors.push_back(error_line);
  const std::string partial_path = (std::filesystem::path(opts.out) / kPartialResults).string();
  const std::string results = results_path(json_path, partial_path, error.empty());
  // doc holds no timeline: each record gets its own back as it is written, one at a time.
  const auto whole_record = [&](const json& record) { return spill.restore(record); };
  const bool results_written = write_keeping_error(errors, [&] {
    write_file_atomic_streamed(results, [&](const TextSink& sink) { write_results_text(doc, whole_record, sink); });
    std::error_code ec;  // an older sweep's partial results would read as this one's
    if (results == json_path && std::filesystem::is_regular_file(partial_path, ec))
      std::filesystem::remove(partial_path, ec);
  });
  // The records of the document as it stands (no timeline), read once: what every printer
  // renders. Each job's file was read into records where the sweep read it, so nothing is
  // refused here that a job's file did not hold.
  std::optional<ResultDocument> records;
  write_keeping_error(errors, [&] { records = read_result(doc, results); });
  // The CSV folder first: it is made now, and a --trace or --report may lie inside it.
  const bool csv_written = records && !opts.csv.empty() && write_keeping_error(errors, [&] {
    write_csv_files(*records, opts.csv);
  });
  // Each timeline is brought back from disk as it is written.
  const bool trace_written = records && !opts.trace.empty() && write_keeping_error(errors, [&] {
    write_file_atomic_streamed(opts.trace,
                               [&](const TextSink& sink) { write_trace_text(*records, spill.timelines_of(doc), sink); });
  });
  // The report draws the timelines: the records with them, read from the whole document.
  const bool report_written = records && !opts.report.empty() && write_keeping_error(errors, [&] {
    write_file_atomic(opts.report, render_html_report(read_result(whole_document(doc, spill), results), command));
  });
  if (records) print_tables(*records, std::cout, TableOptions{opts.exact_bytes, opts.wide});
  if (results_written) {
    std::cout << "results: " << results;
    if (results != json_path)
      std::cout << " (incomplete; the complete results of an earlier sweep in " << json_path << " were kept)\n";
    else
      std::cout << (error.empty() ? "\n" : " (incomplete: a run failed)\n");
  }
  if (trace_written) std::cout << "trace: " << opts.trace << '\n';
  if (report_written) std::cout << "report: " << opts.report << '\n';
  if (csv_written) std::cout << "csv: " << opts.csv << "/{data_parallel,pipeline}.csv\n";
  if (!errors.empty()) {
    std::cout << std::flush;
    for (const std::string& e : errors) std::cerr << "shardscope: error: " << e << '\n';
    std::cerr << std::flush;
    return 3;
  }
  return 0;
}

}  // namespace shardscope
