#include "harness/run/memory_check.hpp"

#include <string>

#include "harness/memory/host_memory.hpp"
#include "shardscope/check.hpp"
#include "shardscope/format.hpp"

namespace shardscope {

// Where to look before trying again: the same figures for any world, nothing allocated.
constexpr const char* kPlanHint = "; `shardscope plan` predicts every rank of any world without running";

void check_memory(std::int64_t predicted_peak, Backend& backend, int rank, const char* what) {
  const std::int64_t device = backend.device_free_bytes();
  if (device >= 0) {
    if (predicted_peak > device)
      throw RunError("rank " + std::to_string(rank) + ": " + std::string(what) + " " + format_bytes(predicted_peak) +
                     " exceeds the free device memory " + format_bytes(device) + kPlanHint);
    return;
  }
  check_host_memory(predicted_peak, rank, what, kPlanHint);
}

void check_host_memory(std::int64_t needed, int rank, const std::string& what, const char* hint) {
  const HostMemory host = host_memory_available();
  if (needed > host.available)
    throw RunError("rank " + std::to_string(rank) + ": " + what + " " + format_bytes(needed) +
                   " exceeds the memory this process can have, " + format_bytes(host.available) + " (" +
                   host.how + ")" + hint);
}

}  // namespace shardscope
