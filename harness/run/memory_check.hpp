// The check docs/design.md §6 asks of every run before it allocates.
#pragma once

#include <cstdint>
#include <string>

#include "shardscope/backend.hpp"

namespace shardscope {

// Refuses (RunError, exit 3) when the bytes a step still has to allocate exceed what this
// rank can have: free device memory on device backends, else MemAvailable and the cgroup
// limit. `predicted_peak` counts everything the backend tracks, what it already holds too
// (cuBLAS's workspace on cuda, allocated when the backend was made); that memory is no
// longer free, so it is taken off the peak before the comparison (bytes_to_allocate), not
// counted twice. The message names both figures and the rank, and points to
// `shardscope plan`.
void check_memory(std::int64_t predicted_peak, Backend& backend, int rank, const char* what = "predicted peak");

// What a step whose peak is `predicted_peak` still has to allocate on `backend`: the peak
// less the tracked bytes the backend already holds (never below 0).
std::int64_t bytes_to_allocate(std::int64_t predicted_peak, const Backend& backend);

// The same against host memory only (MemAvailable and the cgroup limit), for what a run
// keeps on the host whatever its backend.
// `hint` is appended to the message.
void check_host_memory(std::int64_t needed, int rank, const std::string& what, const char* hint = "");

}  // namespace shardscope
