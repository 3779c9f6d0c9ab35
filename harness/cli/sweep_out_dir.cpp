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

void check_outputs_apart(const SweepOptions& opts) {
  const fs::path out(opts.out);
  std::vector<std::pair<std::string, std::string>> files = {
      {"--out", (out / "shardscope.json").string()},
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
}

}  // namespace

void check_sweep_outputs(const SweepOptions& opts) {
  check_outputs_apart(opts);
  std::vector<fs::path> to_make = check_dir_usable(opts.out, "--out DIR", {"shardscope.json"});
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
    if (is_scratch_name(it->path().filename().string()) && !it->is_symlink(type_ec) && it->is_directory(type_ec))
      fs::remove_all(it->path(), rm_ec);
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
