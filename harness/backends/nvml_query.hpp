// The few NVML figures the CUDA backend reports: this process's device memory (for
// "memory outside the pool", docs/design.md §5) and the driver version (provenance).
//
// NVML is loaded at run time (dlopen of libnvidia-ml.so.1, which the driver installs),
// so the build needs neither nvml.h nor the stub library, and a machine without NVML
// simply reports "unknown". Initialised once per process, never shut down.
#pragma once

#include <cstdint>
#include <string>

namespace shardscope {

// Device memory NVML attributes to this process on the GPU with this PCI bus id
// ("0000:3b:00.0", as cudaDeviceGetPCIBusId writes it); -1 when NVML is unavailable,
// fails, does not list this process, or reports the figure as not available.
std::int64_t nvml_process_used_bytes(const std::string& pci_bus_id);

// The driver's version ("580.159.03"); empty when NVML is unavailable.
std::string nvml_driver_version();

}  // namespace shardscope
