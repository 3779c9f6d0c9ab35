#include "harness/cli/sweep_out_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <utility>
#include <vector>

#include "harness/report/csv.hpp"
#include "harness/report/json_io.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;

// In every scratch folder, locked (flock) by its sweep for the sweep's lifetime: a folder
// is another sweep's to remove only when no one holds it.
constexpr const char* kScratchLock = ".scratch.lock";

// Every output the sweep writes names its own file (check_distinct_outputs), and no
// folder the sweep writes in (--out DIR, --csv DIR) is, or lies inside, the path of one
// of those files: the folder would take the file's place, or the file the folder's.
// A sweep's scratch folder in --out DIR: ".runs-" and mkdtemp's six characters.
bool is_scratch_name(const std::string& name) {
  constexpr std::string_view kPrefix = ".runs-";
  return name.size() == kPrefix.size() + 6 && name.compare(0, kPrefix.size(), kPrefix) == 0 &&
         std::all_of(name.begin() + kPrefix.size(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; });
}

// The next sweep into --out DIR removes every scratch folder there (what a sweep killed
// outright left): an output inside one would be lost, so it is refused.
void check_outside_scratch(const SweepOptions& opts) {
  const fs::path out = resolved_path(opts.out);
  for (const auto& [flag, path] : {std::pair{"--trace FILE", opts.trace}, std::pair{"--report FILE", opts.report},
                                   std::pair{"--csv DIR", opts.csv}}) {
    if (path.empty()) continue;
    const fs::path rel = resolved_path(path).lexically_relative(out);
    if (rel.empty() || !is_scratch_name(rel.begin()->string())) continue;
    throw UsageError(std::string(flag) + ": '" + path + "' lies in '" + (fs::path(opts.out) / *rel.begin()).string() +
                     "', a sweep's scratch folder, which every sweep into --out DIR removes: write it elsewhere");
  }
}

// --out DIR inside a scratch folder (DIR2/.runs-XXXXXX/...) would be removed, with the
// sweep writing there, by the next sweep into DIR2: refused, whatever the folder holds.
void check_out_outside_scratch(const SweepOptions& opts) {
  fs::path up;
  for (const fs::path& part : resolved_path(opts.out)) {
    up /= part;
    if (!is_scratch_name(part.string())) continue;
    throw UsageError("--out DIR: '" + opts.out + "' is in '" + up.string() +
                     "', named as a sweep's scratch folder (.runs-XXXXXX), which the next sweep into '" +
                     up.parent_path().string() + "' removes: write it elsewhere");
  }
}

void check_outputs_apart(const SweepOptions& opts) {
  const fs::path out(opts.out);
  std::vector<std::pair<std::string, std::string>> files = {
      {"--out", (out / "shardscope.json").string()},
      {"--out (its partial results)", (out / kPartialResults).string()},
      {"--out (its lock)", (out / ".shardscope.lock").string()},
      {"--out (its failed-job log)", (out / kFailedJobLog).string()},
  };
  if (!opts.csv.empty()) {
    for (const std::string& path : csv_paths(opts.csv)) files.emplace_back("--csv", path);
  }
  files.emplace_back("--trace", opts.trace);
  files.emplace_back("--report", opts.report);
  check_distinct_outputs(files);
  check_folders_apart({{"--out DIR", opts.out}, {"--csv DIR", opts.csv}}, files);
  check_outside_scratch(opts);
  check_out_outside_scratch(opts);
}

}  // namespace

void check_sweep_outputs(const SweepOptions& opts) {
  check_outputs_apart(opts);
  std::vector<fs::path> to_make = check_dir_usable(opts.out, "--out DIR", {"shardscope.json", kPartialResults});
  if (!opts.csv.empty()) {
    const std::vector<fs::path> csv = check_csv_dir(opts.csv);
    to_make.insert(to_make.end(), csv.begin(), csv.end());
  }
  for (const auto& [path, flag] : {std::pair{opts.trace, "--trace FILE"}, std::pair{opts.report, "--report FILE"}}) {
    if (path.empty()) continue;
    check_writable_in(path, flag, to_make);
  }
}


std::string make_out_dir(const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw UsageError("--out DIR: cannot create '" + out + "': " + ec.message());
  const std::string json_path = (fs::path(out) / "shardscope.json").string();
  check_writable(json_path, "--out DIR");
  return json_path;
}


OutDirLock::OutDirLock(const std::string& dir) : path_((fs::path(dir) / ".shardscope.lock").string()) {
  while (true) {
    // Close-on-exec: a rank left running must not hold the lock.
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw UsageError("--out DIR: cannot create '" + path_ + "': " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      ::close(fd_);
      if (err == EWOULDBLOCK) throw UsageError("--out DIR: another sweep is writing there ('" + dir + "')");
      throw UsageError("--out DIR: cannot lock '" + path_ + "': " + std::strerror(err));
    }
    // The sweep before us removes the file as it lets go: the lock is ours only when the
    // name still leads to the file we locked.
    struct stat held {}, named {};
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino)
      return;
    ::close(fd_);
  }
}

OutDirLock::~OutDirLock() {
  ::unlink(path_.c_str());  // before the lock goes, so that no one locks a file about to vanish
  ::close(fd_);
}

void remove_stale_scratch(const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec, rm_ec;
    if (!is_scratch_name(it->path().filename().string()) || it->is_symlink(type_ec) || !it->is_directory(type_ec))
      continue;
    const std::string lock = (it->path() / kScratchLock).string();
    const int fd = ::open(lock.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
      // No lock file: not a sweep's folder, or one killed before it made its lock (then
      // it is empty, and rmdir removes only an empty folder).
      ::rmdir(it->path().c_str());
      continue;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) fs::remove_all(it->path(), rm_ec);  // its sweep is gone
    ::close(fd);
  }
}

ScratchDir::ScratchDir(const std::string& dir) {
  std::string templ = (fs::path(dir) / ".runs-XXXXXX").string();
  if (::mkdtemp(templ.data()) == nullptr)
    throw RunError("cannot create a folder in '" + dir + "': " + std::strerror(errno));
  path_ = templ;
  // Close-on-exec: the lock goes with this process, not with a job it could not stop.
  const std::string lock = (fs::path(path_) / kScratchLock).string();
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (lock_fd_ >= 0) ::close(lock_fd_);
    std::error_code ec;
    fs::remove_all(path_, ec);
    throw RunError("cannot lock '" + lock + "': " + std::strerror(err));
  }
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
  ::close(lock_fd_);
}

}  // namespace shardscope
