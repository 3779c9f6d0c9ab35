#include "harness/backends/nvml_query.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <vector>

// The types and signatures come from nvml.h when the CUDA toolkit has it (only its
// declarations: nothing is linked; every function is looked up with dlsym). Without the
// header, the same declarations are spelled here as nvml.h (NVML_API_VERSION 13, CUDA
// 13.0) has them: nvmlDeviceGetComputeRunningProcesses_v3 fills nvmlProcessInfo_t, the
// four-field record {pid, usedGpuMemory, gpuInstanceId, computeInstanceId}.
#if __has_include(<nvml.h>)
#include <nvml.h>
#define SHARDSCOPE_NVML_FROM_HEADER 1
#endif

namespace shardscope {
namespace {

#ifdef SHARDSCOPE_NVML_FROM_HEADER
using Return = nvmlReturn_t;
using Device = nvmlDevice_t;
using ProcessInfo = nvmlProcessInfo_t;
constexpr Return kSuccess = NVML_SUCCESS;
constexpr Return kInsufficientSize = NVML_ERROR_INSUFFICIENT_SIZE;
constexpr unsigned long long kValueNotAvailable = NVML_VALUE_NOT_AVAILABLE;
using InitFn = decltype(&nvmlInit_v2);
using HandleByPciFn = decltype(&nvmlDeviceGetHandleByPciBusId_v2);
using ProcessesFn = decltype(&nvmlDeviceGetComputeRunningProcesses_v3);
using DriverVersionFn = decltype(&nvmlSystemGetDriverVersion);
using ErrorStringFn = decltype(&nvmlErrorString);
#else
using Return = int;
using Device = struct nvmlDevice_st*;
struct ProcessInfo {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};
constexpr Return kSuccess = 0;
constexpr Return kInsufficientSize = 7;
constexpr unsigned long long kValueNotAvailable = ~0ULL;
using InitFn = Return (*)();
using HandleByPciFn = Return (*)(const char*, Device*);
using ProcessesFn = Return (*)(Device, unsigned int*, ProcessInfo*);
using DriverVersionFn = Return (*)(char*, unsigned int);
using ErrorStringFn = const char* (*)(Return);
#endif

struct Nvml {
  bool ok = false;
  std::string why;  // when not ok
  HandleByPciFn handle_by_pci = nullptr;
  ProcessesFn compute_processes = nullptr;
  DriverVersionFn driver_version = nullptr;
  ErrorStringFn error_string = nullptr;

  std::string error(Return r) const {
    const char* text = error_string != nullptr ? error_string(r) : nullptr;
    return text != nullptr ? std::string(text) : "NVML error " + std::to_string(static_cast<int>(r));
  }
};

template <class F>
F symbol(void* lib, const char* name) {
  return reinterpret_cast<F>(dlsym(lib, name));
}

// Loaded on first use; thread-safe (function-local static).
const Nvml& nvml() {
  static const Nvml loaded = [] {
    Nvml n;
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {  // kept open for the process's life when found
      n.why = "NVML is not installed (libnvidia-ml.so.1 could not be loaded)";
      return n;
    }
    const auto init = symbol<InitFn>(lib, "nvmlInit_v2");
    n.handle_by_pci = symbol<HandleByPciFn>(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    n.compute_processes = symbol<ProcessesFn>(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    n.driver_version = symbol<DriverVersionFn>(lib, "nvmlSystemGetDriverVersion");
    n.error_string = symbol<ErrorStringFn>(lib, "nvmlErrorString");
    if (init == nullptr || n.handle_by_pci == nullptr || n.compute_processes == nullptr) {
      n.why = "this libnvidia-ml.so.1 lacks nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 or "
              "nvmlDeviceGetComputeRunningProcesses_v3 (a driver older than R470?)";
      return n;
    }
    const Return r = init();
    n.ok = r == kSuccess;
    if (!n.ok) n.why = "nvmlInit_v2 failed: " + n.error(r);
    return n;
  }();
  return loaded;
}

}  // namespace

NvmlProcessMemory nvml_process_used_bytes(const std::string& pci_bus_id) {
  const Nvml& n = nvml();
  if (!n.ok) return {-1, n.why};
  Device dev{};
  Return r = n.handle_by_pci(pci_bus_id.c_str(), &dev);
  if (r != kSuccess) return {-1, "nvmlDeviceGetHandleByPciBusId_v2(" + pci_bus_id + ") failed: " + n.error(r)};
  // The list can grow between the two calls: ask with room to spare, retry a few times.
  unsigned int count = 0;
  r = n.compute_processes(dev, &count, nullptr);
  if (r != kSuccess && r != kInsufficientSize)
    return {-1, "nvmlDeviceGetComputeRunningProcesses_v3 failed: " + n.error(r)};
  std::vector<ProcessInfo> infos;
  for (int attempt = 0; attempt < 4; ++attempt) {
    infos.assign(count + 8u, ProcessInfo{});
    count = static_cast<unsigned int>(infos.size());
    r = n.compute_processes(dev, &count, infos.data());
    if (r != kInsufficientSize) break;
  }
  if (r != kSuccess) return {-1, "nvmlDeviceGetComputeRunningProcesses_v3 failed: " + n.error(r)};
  const auto pid = static_cast<unsigned int>(getpid());
  for (unsigned int i = 0; i < count && i < infos.size(); ++i) {
    if (infos[i].pid != pid) continue;
    if (infos[i].usedGpuMemory == kValueNotAvailable)
      return {-1, "NVML lists this process but not its memory (NVML_VALUE_NOT_AVAILABLE)"};
    return {static_cast<std::int64_t>(infos[i].usedGpuMemory), {}};
  }
  return {-1, "NVML does not list this process's pid " + std::to_string(pid) + " among " + std::to_string(count) +
                  " on the device (a container's pid namespace: NVML lists host pids)"};
}

std::string nvml_driver_version() {
  const Nvml& n = nvml();
  if (!n.ok || n.driver_version == nullptr) return {};
  char buf[96] = {};
  if (n.driver_version(buf, sizeof(buf)) != kSuccess) return {};
  return std::string(buf);
}

}  // namespace shardscope
