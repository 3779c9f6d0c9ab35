#include "harness/memory/host_memory.hpp"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include "shardscope/format.hpp"

namespace shardscope {
namespace {

// OpenBLAS maps one buffer at its first call (blas_memory_alloc): BUFFER_SIZE, fixed when
// OpenBLAS is built, 128 MiB for x86_64 (OpenBLAS 0.3.21 here: VmSize grows by exactly
// 134,217,728 B at the first sgemm, with one thread as the CPU backend sets). When the
// address-space limit leaves less, OpenBLAS retries forever at 100 % CPU: it is counted
// before anything runs, as mapped already.
#ifdef SHARDSCOPE_WITH_BLAS
constexpr std::int64_t kBlasBufferBytes = std::int64_t{128} << 20;
#else
constexpr std::int64_t kBlasBufferBytes = 0;
#endif

// cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB
// pages); anything this large is no limit.
constexpr std::int64_t kNoLimit = std::int64_t{1} << 60;

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file holding one integer, or "max" (cgroup v2's no limit, returned as kNoLimit).
std::optional<std::int64_t> read_int(const std::string& path) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  std::string word;
  if (!(in >> word)) return std::nullopt;
  if (word == "max") return kNoLimit;
  try {
    std::size_t used = 0;
    const long long v = std::stoll(word, &used);
    if (used != word.size()) return std::nullopt;
    return static_cast<std::int64_t>(v);
  } catch (const std::exception&) {
    // Out of range (a no-limit figure past int64) reads as no limit; garbage as nothing.
    return word.find_first_not_of("0123456789") == std::string::npos
               ? std::optional<std::int64_t>(kNoLimit)
               : std::nullopt;
  }
}

// The value of `key` in a "key value [unit]" file (meminfo, memory.stat).
std::optional<std::int64_t> read_key(const std::string& path, const std::string& key) {
  const auto text = read_text(path);
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string k;
    long long v = 0;
    if (!(ls >> k >> v)) continue;
    if (!k.empty() && k.back() == ':') k.pop_back();
    if (k != key) continue;
    std::string unit;
    ls >> unit;
    return static_cast<std::int64_t>(v) * (unit == "kB" ? 1024 : 1);
  }
  return std::nullopt;
}

struct Mount {
  std::string root;   // the path inside the hierarchy that is mounted
  std::string point;  // where it is mounted
};

struct CgroupFiles {
  int version = 0;           // 1 or 2; 0 when no memory cgroup was found
  std::string dir;           // this process's cgroup directory
  std::string top;           // the mount point: the walk upward stops there
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char ch : s) {
    if (ch == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(cur);
  return out;
}

// cgroup v2 and v1-memory mounts from mountinfo:
// "id parent maj:min root point opts [optional...] - fstype source superopts".
void find_mounts(const std::string& root, std::optional<Mount>& v2, std::optional<Mount>& v1) {
  const auto text = read_text(root + "/proc/self/mountinfo");
  if (!text) return;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<std::string> f;
    std::string w;
    while (ls >> w) f.push_back(w);
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    const std::string& fstype = *(dash + 1);
    const std::string& superopts = *(dash + 3);
    const Mount m{f[3], root + f[4]};
    if (fstype == "cgroup2" && !v2) v2 = m;
    if (fstype == "cgroup" && !v1) {
      for (const std::string& opt : split(superopts, ','))
        if (opt == "memory") v1 = m;
    }
  }
}

// The process's cgroup directory under a mount: its path from /proc/self/cgroup, made
// relative to the mounted root (containers mount their own subtree as "/").
std::string cgroup_dir(const Mount& m, std::string path) {
  if (m.root != "/" && path.compare(0, m.root.size(), m.root) == 0) path = path.substr(m.root.size());
  std::string dir = m.point + (path == "/" ? "" : path);
  if (!read_text(dir + "/cgroup.procs")) dir = m.point;  // path not visible here: use the top
  return dir;
}

CgroupFiles find_cgroup(const std::string& root) {
  std::optional<Mount> v2, v1;
  find_mounts(root, v2, v1);
  std::string path_v2, path_v1;
  if (const auto text = read_text(root + "/proc/self/cgroup")) {
    std::istringstream in(*text);
    std::string line;
    while (std::getline(in, line)) {
      const auto c1 = line.find(':');
      const auto c2 = c1 == std::string::npos ? c1 : line.find(':', c1 + 1);
      if (c2 == std::string::npos) continue;
      const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
      const std::string path = line.substr(c2 + 1);
      if (line.compare(0, c1, "0") == 0 && controllers.empty()) path_v2 = path;
      for (const std::string& c : split(controllers, ','))
        if (c == "memory") path_v1 = path;
    }
  }
  CgroupFiles out;
  if (v2 && !path_v2.empty()) {
    const std::string dir = cgroup_dir(*v2, path_v2);
    // v2's memory controller is on when memory.current exists (hybrid setups mount an
    // empty unified tree beside the v1 controllers).
    if (read_text(dir + "/memory.current") || read_text(v2->point + "/memory.stat")) {
      return {2, dir, v2->point};
    }
  }
  if (v1 && !path_v1.empty()) return {1, cgroup_dir(*v1, path_v1), v1->point};
  return out;
}

struct CgroupLimit {
  std::int64_t limit = kNoLimit;
  std::int64_t usage = 0;
  std::int64_t reclaimable = 0;
  std::int64_t free() const { return limit - usage + reclaimable; }
};

// The level with the least free memory among those with a limit, from dir up to top.
std::optional<CgroupLimit> tightest_limit(const CgroupFiles& cg) {
  const bool v2 = cg.version == 2;
  const std::string limit_file = v2 ? "/memory.max" : "/memory.limit_in_bytes";
  const std::string usage_file = v2 ? "/memory.current" : "/memory.usage_in_bytes";
  const std::string cache_key = v2 ? "inactive_file" : "total_inactive_file";
  std::optional<CgroupLimit> best;
  // dir starts as top + "/a/b": drop one component at a time until it is top.
  for (std::string dir = cg.dir;; dir = dir.substr(0, dir.find_last_of('/'))) {
    const auto limit = read_int(dir + limit_file);
    const auto usage = read_int(dir + usage_file);
    if (limit && usage && *limit < kNoLimit) {
      CgroupLimit here{*limit, *usage, read_key(dir + "/memory.stat", cache_key).value_or(0)};
      here.reclaimable = std::min(here.reclaimable, here.usage);
      if (!best || here.free() < best->free()) best = here;
    }
    if (dir.size() <= cg.top.size() || dir.find_last_of('/') < cg.top.size()) break;
  }
  return best;
}

}  // namespace

HostMemory host_memory_available_at(const std::string& root) {
  HostMemory out{0, ""};
  const auto mem_available = read_key(root + "/proc/meminfo", "MemAvailable");
  if (mem_available) {
    out.available = *mem_available;
    out.how = "MemAvailable " + format_bytes_short(*mem_available);
  } else if (const auto mem_free = read_key(root + "/proc/meminfo", "MemFree")) {
    // Kernels before 3.14 have no MemAvailable: MemFree understates, which is the safe side.
    out.available = *mem_free;
    out.how = "MemFree " + format_bytes_short(*mem_free) + " (no MemAvailable)";
  } else if (const long pages = root.empty() ? sysconf(_SC_AVPHYS_PAGES) : -1; pages > 0) {
    out.available = static_cast<std::int64_t>(pages) * sysconf(_SC_PAGESIZE);
    out.how = "free physical pages " + format_bytes_short(out.available) + " (no /proc/meminfo)";
  } else {
    out.available = kNoLimit;
    out.how = "MemAvailable unknown";
  }
  const CgroupFiles cg = find_cgroup(root);
  if (cg.version == 0) {
    out.how += ", cgroup limit unknown (no memory cgroup found)";
  } else if (const auto lim = tightest_limit(cg)) {
    const std::int64_t free = std::max<std::int64_t>(0, lim->free());
    out.how += ", cgroup v" + std::to_string(cg.version) + " limit " + format_bytes_short(lim->limit) +
               " with " + format_bytes_short(lim->usage) + " in use (" +
               format_bytes_short(lim->reclaimable) + " reclaimable cache): " +
               format_bytes_short(free) + " free";
    out.available = std::min(out.available, free);
  } else {
    out.how += ", cgroup v" + std::to_string(cg.version) + " limit none";
  }
  if (out.available == kNoLimit) {
    // Nothing could be read: claim nothing rather than everything, and say so.
    out.available = 0;
    out.how += " (no figure could be read: treating the available memory as 0)";
  }
  return out;
}

HostMemory host_memory_available() {
  HostMemory out = host_memory_available_at("");
  // This process's address-space limit (ulimit -v), against what it has mapped.
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    const std::int64_t limit =
        as.rlim_cur > static_cast<rlim_t>(INT64_MAX) ? INT64_MAX : static_cast<std::int64_t>(as.rlim_cur);
    const std::int64_t mapped = read_key("/proc/self/status", "VmSize").value_or(0);
    const std::int64_t free = std::max<std::int64_t>(0, limit - mapped - kBlasBufferBytes);
    out.how += ", address-space limit (ulimit -v) " + format_bytes_short(limit) + " with " +
               format_bytes_short(mapped) + " mapped";
    if (kBlasBufferBytes > 0) out.how += " and " + format_bytes_short(kBlasBufferBytes) + " for OpenBLAS's buffer";
    out.how += ": " + format_bytes_short(free) + " free";
    out.available = std::min(out.available, free);
  }
  return out;
}

}  // namespace shardscope
