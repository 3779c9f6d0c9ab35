#include "harness/cli/sweep_out_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "harness/report/json_io.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

namespace fs = std::filesystem;

// `path` absolute and normal, without a trailing '/': how paths are compared here.
fs::path absolute_path(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) p = path;
  p = p.lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();  // "dir/" -> "dir"
  return p;
}

// Checks, creating nothing, that directory `dir` (of `flag`) is one we can write
// `probe_file` in, or one that can be made: its nearest existing ancestor is a directory
// that takes a new folder (probed with a temporary one, removed at once). Returns the
// folders that would be made, from the outermost.
std::vector<fs::path> check_dir_usable(const std::string& dir, const std::string& flag,
                                        const std::string& probe_file) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec)) throw UsageError(flag + ": '" + dir + "' exists and is not a directory");
    check_writable((fs::path(dir) / probe_file).string(), flag);
    return {};
  }
  std::vector<fs::path> made;
  fs::path up = absolute_path(dir);
  while (up.has_relative_path() && !fs::exists(up, ec)) {
    made.insert(made.begin(), up);
    up = up.parent_path();
  }
  auto fail = [&](const std::string& why) { throw UsageError(flag + ": cannot create '" + dir + "': " + why); };
  if (!fs::is_directory(up, ec)) fail("'" + up.string() + "' is not a directory");
  std::string probe = (up / ".shardscope-probe-XXXXXX").string();
  if (::mkdtemp(probe.data()) == nullptr) fail(std::string(std::strerror(errno)) + " in '" + up.string() + "'");
  ::rmdir(probe.c_str());
  return made;
}

}  // namespace

void check_sweep_outputs(const SweepOptions& opts) {
  std::vector<fs::path> to_make = check_dir_usable(opts.out, "--out DIR", "shardscope.json");
  if (!opts.csv.empty()) {
    const std::vector<fs::path> csv = check_dir_usable(opts.csv, "--csv DIR", "data_parallel.csv");
    to_make.insert(to_make.end(), csv.begin(), csv.end());
  }
  for (const auto& [path, flag] : {std::pair{opts.trace, "--trace FILE"}, std::pair{opts.report, "--report FILE"}}) {
    if (path.empty()) continue;
    const fs::path file = absolute_path(path);
    const bool folder_made = std::find(to_make.begin(), to_make.end(), file.parent_path()) != to_make.end();
    if (!folder_made || path.back() == '/') check_writable(path, flag);
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

ScratchDir::ScratchDir(const std::string& dir) {
  std::string templ = (fs::path(dir) / ".runs-XXXXXX").string();
  if (::mkdtemp(templ.data()) == nullptr)
    throw RunError("cannot create a folder in '" + dir + "': " + std::strerror(errno));
  path_ = templ;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace shardscope
