// How much host memory a run can have (docs/design.md §6): before allocating, a run compares its
// predicted peak with this figure and refuses with exit 3 naming both.
#pragma once

#include <cstdint>
#include <string>

namespace shardscope {

struct HostMemory {
  std::int64_t available;  // bytes: min(MemAvailable, what the cgroup limit leaves)
  std::string how;         // the figures used: "MemAvailable 23.29 GiB, cgroup limit none"
};

// min(MemAvailable from /proc/meminfo, the tightest cgroup memory limit on the way from
// this process's cgroup to the root, less that cgroup's usage plus its reclaimable page
// cache (inactive_file)). cgroup v2 (memory.max, memory.current) is used when its memory
// controller is enabled, else cgroup v1 (memory.limit_in_bytes, memory.usage_in_bytes).
// host_memory_available() also bounds it by the address-space limit (ulimit -v, RLIMIT_AS)
// less what is mapped (VmSize) and, in a build with OpenBLAS, less the 128 MiB buffer
// OpenBLAS maps at its first call (which it would otherwise retry forever).
HostMemory host_memory_available();

// The same, reading every file under `root` ("/proc/meminfo" becomes root + "/proc/meminfo",
// and the cgroup mount points found in root/proc/self/mountinfo are prefixed by root too):
// lets tests describe a machine with a fake tree. host_memory_available() is
// host_memory_available_at("").
HostMemory host_memory_available_at(const std::string& root);

}  // namespace shardscope
