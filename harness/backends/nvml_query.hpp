// The few NVML figures the CUDA backend reports: this process's device memory (for
// "memory outside the pool", docs/design.md §5) and the driver version (provenance).
//
// NVML is loaded at run time only (dlopen of libnvidia-ml.so.1, which the driver
// installs): the binary never links it, so it starts on nodes without the driver, and a
// machine without NVML reports why instead of a figure. Initialised once per process,
// never shut down.
#pragma once

#include <cstdint>
#include <string>

namespace shardscope {

// Device memory NVML attributes to this process, or why there is no figure.
struct NvmlProcessMemory {
  std::int64_t bytes = -1;  // -1: see `why`
  std::string why;          // empty when `bytes` is NVML's figure
};

// This process's device memory on the GPU with this PCI bus id ("0000:3b:00.0", as
// cudaDeviceGetPCIBusId writes it), read through nvmlDeviceGetComputeRunningProcesses_v3.
// No figure when NVML cannot be loaded or fails, when this process's pid is not in the
// list (in a container NVML may list host pids), or when NVML reports the figure as not
// available.
NvmlProcessMemory nvml_process_used_bytes(const std::string& pci_bus_id);

// The driver's version ("580.159.03"); empty when NVML is unavailable.
std::string nvml_driver_version();

}  // namespace shardscope
