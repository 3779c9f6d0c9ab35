// A tiny NVTX tool linked into the CUDA test binary, to prove that the backend emits
// its ranges (docs/design.md §5) without Nsight Systems.
//
// NVTX3 looks for a tool on the first NVTX call: NVTX_INJECTION64_PATH first, then a
// statically linked one through the C symbol InitializeInjectionNvtx2_fnptr (nvtxInit.h,
// load sequence version 2). nvtx_counter.cpp defines that symbol, so in this binary every
// nvtxDomainCreateA / nvtxDomainRangePushEx / nvtxDomainRangePop lands in its counters.
// When a real tool is injected through the environment (nsys), it wins and
// nvtx_counter_attached() stays false: tests then skip.
#pragma once

#include <string>

namespace shardscope::testing {

struct NvtxDomainCounts {
  long pushes = 0;
  long pops = 0;
  std::string last_message;  // the ASCII message of the last push
};

// True once NVTX has initialised this tool (after the process's first NVTX call).
bool nvtx_counter_attached();
// Counts for the domain created under `domain_name` (zero when it was never created).
NvtxDomainCounts nvtx_counts(const std::string& domain_name);

}  // namespace shardscope::testing
