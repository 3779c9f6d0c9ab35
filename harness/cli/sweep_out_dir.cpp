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

// Every output the sweep writes names its own file (check_distinct_outputs), and no
// folder the sweep writes in (--out DIR, --csv DIR) is, or lies inside, the path of one
// of those files: the folder would take the file's place, or the file the folder's.
void check_outputs_apart(const SweepOptions& opts) {
  const fs::path out(opts.out);
  std::vector<std::pair<std::string, std::string>> files = {
      {"--out", (out / "shardscope.json").string()},
      {"--out (its lock)", (out / ".shardscope.lock").string()},
      {"--out (its failed-job log)", (out / kFailedJobLog).string()},
  };
  if (!opts.csv.empty()) {
    files.emplace_back("--csv", (fs::path(opts.csv) / "data_parallel.csv").string());
    files.emplace_back("--csv", (fs::path(opts.csv) / "pipeline.csv").string());
  }
  files.emplace_back("--trace", opts.trace);
  files.emplace_back("--report", opts.report);
  check_distinct_outputs(files);
  check_folders_apart({{"--out DIR", opts.out}, {"--csv DIR", opts.csv}}, files);
}

}  // namespace

void check_sweep_outputs(const SweepOptions& opts) {
  check_outputs_apart(opts);
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

void remove_stale_scratch(const std::string& dir) {
  constexpr std::string_view kPrefix = ".runs-";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool scratch_name =
        name.size() == kPrefix.size() + 6 && name.compare(0, kPrefix.size(), kPrefix) == 0 &&
        std::all_of(name.begin() + kPrefix.size(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
    std::error_code type_ec, rm_ec;
    if (scratch_name && !it->is_symlink(type_ec) && it->is_directory(type_ec)) fs::remove_all(it->path(), rm_ec);
  }
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
