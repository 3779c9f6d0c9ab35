#include "harness/backends/nvml_query.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <vector>

namespace shardscope {
namespace {

// The subset of nvml.h used here, with NVML's ABI (stable across driver versions; the
// _v3 process query and its struct are those of nvml.h since CUDA 11.x/12.x).
using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ULL;
using nvmlDevice_t = struct nvmlDevice_st*;

struct NvmlProcessInfo {  // nvmlProcessInfo_t (v2 layout, used by the _v3 query)
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

using InitFn = nvmlReturn_t (*)();
using HandleByPciFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
using ProcessesFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, NvmlProcessInfo*);
using DriverVersionFn = nvmlReturn_t (*)(char*, unsigned int);

struct Nvml {
  bool ok = false;
  HandleByPciFn handle_by_pci = nullptr;
  ProcessesFn compute_processes = nullptr;
  DriverVersionFn driver_version = nullptr;
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
    if (lib == nullptr) return n;  // kept open for the process's life when found
    const auto init = symbol<InitFn>(lib, "nvmlInit_v2");
    n.handle_by_pci = symbol<HandleByPciFn>(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    n.compute_processes = symbol<ProcessesFn>(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    n.driver_version = symbol<DriverVersionFn>(lib, "nvmlSystemGetDriverVersion");
    n.ok = init != nullptr && init() == kNvmlSuccess;
    return n;
  }();
  return loaded;
}

}  // namespace

std::int64_t nvml_process_used_bytes(const std::string& pci_bus_id) {
  const Nvml& n = nvml();
  if (!n.ok || n.handle_by_pci == nullptr || n.compute_processes == nullptr) return -1;
  nvmlDevice_t dev = nullptr;
  if (n.handle_by_pci(pci_bus_id.c_str(), &dev) != kNvmlSuccess) return -1;
  // The list can grow between the two calls: ask with room to spare, retry a few times.
  unsigned int count = 0;
  nvmlReturn_t r = n.compute_processes(dev, &count, nullptr);
  if (r != kNvmlSuccess && r != kNvmlInsufficientSize) return -1;
  std::vector<NvmlProcessInfo> infos;
  for (int attempt = 0; attempt < 4; ++attempt) {
    infos.assign(count + 8u, NvmlProcessInfo{});
    count = static_cast<unsigned int>(infos.size());
    r = n.compute_processes(dev, &count, infos.data());
    if (r == kNvmlSuccess) break;
    if (r != kNvmlInsufficientSize) return -1;
  }
  if (r != kNvmlSuccess) return -1;
  const auto pid = static_cast<unsigned int>(getpid());
  for (unsigned int i = 0; i < count && i < infos.size(); ++i) {
    if (infos[i].pid != pid) continue;
    if (infos[i].usedGpuMemory == kNvmlValueNotAvailable) return -1;
    return static_cast<std::int64_t>(infos[i].usedGpuMemory);
  }
  return -1;
}

std::string nvml_driver_version() {
  const Nvml& n = nvml();
  if (!n.ok || n.driver_version == nullptr) return {};
  char buf[96] = {};
  if (n.driver_version(buf, sizeof(buf)) != kNvmlSuccess) return {};
  return std::string(buf);
}

}  // namespace shardscope
