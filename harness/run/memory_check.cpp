#include "harness/run/memory_check.hpp"

#include <algorithm>
#include <string>

#include "harness/memory/host_memory.hpp"
#include "shardscope/check.hpp"
#include "shardscope/format.hpp"

namespace shardscope {

// Where to look before trying again: the same figures for any world, nothing allocated.
constexpr const char* kPlanHint = "; `shardscope plan` predicts every rank of any world without running";

std::int64_t bytes_to_allocate(std::int64_t predicted_peak, const Backend& backend) {
  return std::max<std::int64_t>(0, predicted_peak - backend.tracker().current().total());
}

void check_memory(std::int64_t predicted_peak, Backend& backend, int rank, const char* what) {
  const std::int64_t held = backend.tracker().current().total();
  const std::int64_t needed = bytes_to_allocate(predicted_peak, backend);
  // "predicted peak 1.03 GiB" or, when the backend already holds some of it,
  // "predicted peak 1.03 GiB less the 32.0 MiB already held (1.00 GiB to allocate)".
  std::string figure = std::string(what) + " " + format_bytes(predicted_peak);
  if (held > 0) figure += " less the " + format_bytes(held) + " already held (" + format_bytes(needed) + " to allocate)";
  const std::int64_t device = backend.device_free_bytes();
  if (device >= 0) {
    if (needed > device)
      throw RunError("rank " + std::to_string(rank) + ": " + figure + " exceeds the free device memory " +
                     format_bytes(device) + kPlanHint);
    return;
  }
  check_host_memory(needed, rank, figure, kPlanHint);
}

void check_host_memory(std::int64_t needed, int rank, const std::string& what, const char* hint) {
  const HostMemory host = host_memory_available();
  if (needed > host.available)
    throw RunError("rank " + std::to_string(rank) + ": " + what + " " + format_bytes(needed) +
                   " exceeds the memory this process can have, " + format_bytes(host.available) + " (" +
                   host.how + ")" + hint);
}

}  // namespace shardscope
