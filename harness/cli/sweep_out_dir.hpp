// A sweep's output paths (docs/design.md §6): all checked before anything is made, so that a
// refused sweep leaves no trace; --out DIR written by one sweep at a time; the sweep's
// own scratch folder for its jobs' files inside DIR.
#pragma once

#include <string>

#include "harness/cli/sweep_plan.hpp"

namespace shardscope {

// DIR/failed-job.log: the stderr of the job that ended a sweep (exit 3), kept for the
// user since the sweep itself prints one error line.
inline constexpr const char* kFailedJobLog = "failed-job.log";

// DIR/shardscope.partial.json: where an incomplete (interrupted or failed) sweep writes
// what it finished when DIR/shardscope.json holds complete results, which it never replaces.
inline constexpr const char* kPartialResults = "shardscope.partial.json";

// Checks, creating nothing, that no two outputs name one file (DIR/shardscope.json,
// DIR/shardscope.partial.json, DIR/.shardscope.lock, DIR/failed-job.log, the two CSVs,
// --trace, --report; compared with "..", "." and links resolved) and that neither --out
// DIR nor --csv DIR is, or
// lies inside, one of those files; that --out DIR and --csv DIR exist as folders we can
// write in or can be made (their nearest existing ancestor takes a new folder); and that
// the --trace and --report files can be written, in a folder that exists or that --out
// or --csv will make; that --out DIR does not lie in a folder named as a sweep's scratch
// folder (.runs-XXXXXX), which a sweep into the folder above would remove. Throws
// UsageError naming the flags.
void check_sweep_outputs(const SweepOptions& opts);

// Makes --out DIR (checked by check_sweep_outputs); returns DIR/shardscope.json.
std::string make_out_dir(const std::string& out);

// An exclusive lock on DIR/.shardscope.lock for its lifetime, so that two sweeps never
// write one DIR; the file goes when the lock is let go. A sweep killed outright (SIGKILL)
// leaves the file, which the next one takes over, and its scratch folder, which the next
// one removes (see remove_stale_scratch). Throws UsageError("--out DIR: another
// sweep is writing there ('DIR')") when another sweep holds it.
class OutDirLock {
 public:
  explicit OutDirLock(const std::string& dir);
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// Removes what sweeps killed outright (SIGKILL) left in DIR: every folder named
// .runs-XXXXXX (six letters or digits, the ScratchDir pattern) whose lock file
// (.runs-XXXXXX/.scratch.lock) we can lock, so that no running sweep's folder goes, and
// an empty one (a sweep killed before it made its lock). Links, other names and folders
// without a lock file that hold something are left alone. Call it holding DIR's
// OutDirLock. One that cannot be removed is left, silently: the sweep does not need it gone.
void remove_stale_scratch(const std::string& dir);

// The sweep's own folder for its jobs' files, DIR/.runs-XXXXXX: a name no one else has,
// so nothing of the user's or of another sweep is touched. Holds a lock on the file
// .scratch.lock inside for its lifetime (see remove_stale_scratch). Removed with
// everything in it however the sweep ends, short of SIGKILL. Throws RunError when it
// cannot be made.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& dir);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int lock_fd_ = -1;
};

}  // namespace shardscope
