// The check docs/design.md §6 asks of every run before it allocates.
#pragma once

#include <cstdint>
#include <string>

#include "shardscope/backend.hpp"

namespace shardscope {

// Refuses (RunError, exit 3) when `needed` bytes exceed what this rank can have: free
// device memory on device backends, else MemAvailable and the cgroup limit. The message
// names both figures and the rank, and points to `shardscope plan`.
void check_memory(std::int64_t needed, Backend& backend, int rank, const char* what = "predicted peak");

// The same against host memory only (MemAvailable and the cgroup limit), for what a run
// keeps on the host whatever its backend.
// `hint` is appended to the message.
void check_host_memory(std::int64_t needed, int rank, const std::string& what, const char* hint = "");

}  // namespace shardscope
