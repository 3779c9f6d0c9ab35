// See nvtx_counter.hpp. A static NVTX injection: NVTX calls our init function with its
// export table, and we point the CORE2 (domain) callbacks at the counters below.
#include "nvtx_counter.hpp"

#include <cstdint>
#include <map>
#include <mutex>

// Static injection (nvtxInit.h): this file defines InitializeInjectionNvtx2_fnptr as a
// normal symbol, so it must skip the header's weak definition and declare it itself.
#define NVTX_STATIC_INJECTION_IMPL
extern "C" int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(std::uint32_t));
#include <nvtx3/nvToolsExt.h>

namespace shardscope::testing {
namespace {

struct State {
  std::mutex mu;
  bool attached = false;
  // One fake handle per domain name: the address of the map node's name.
  std::map<std::string, NvtxDomainCounts> by_name;
  std::map<const void*, std::string> name_of;
};

State& state() {
  static State s;
  return s;
}

nvtxDomainHandle_t domain_create(const char* name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.by_name.try_emplace(name != nullptr ? name : "").first;
  const void* handle = &it->first;
  s.name_of[handle] = it->first;
  return reinterpret_cast<nvtxDomainHandle_t>(const_cast<void*>(handle));
}

void domain_destroy(nvtxDomainHandle_t) {}

NvtxDomainCounts* counts_for(nvtxDomainHandle_t domain) {
  State& s = state();
  const auto it = s.name_of.find(reinterpret_cast<const void*>(domain));
  if (it == s.name_of.end()) return nullptr;  // the default domain, or another tool's
  return &s.by_name[it->second];
}

int range_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* attr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  NvtxDomainCounts* c = counts_for(domain);
  if (c == nullptr) return 0;
  ++c->pushes;
  if (attr != nullptr && attr->messageType == NVTX_MESSAGE_TYPE_ASCII && attr->message.ascii)
    c->last_message = attr->message.ascii;
  return static_cast<int>(c->pushes - c->pops - 1);  // nesting level, as NVTX defines it
}

int range_pop(nvtxDomainHandle_t domain) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  NvtxDomainCounts* c = counts_for(domain);
  if (c == nullptr) return 0;
  ++c->pops;
  return static_cast<int>(c->pushes - c->pops);
}

template <class F>
void install(NvtxFunctionTable table, unsigned int size, unsigned int slot, F* fn) {
  if (slot <= size && table[slot] != nullptr)
    *table[slot] = reinterpret_cast<NvtxFunctionPointer>(fn);
}

int initialize(NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr || callbacks->GetModuleFunctionTable == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || table == nullptr)
    return 0;
  install(table, size, NVTX_CBID_CORE2_DomainCreateA, &domain_create);
  install(table, size, NVTX_CBID_CORE2_DomainDestroy, &domain_destroy);
  install(table, size, NVTX_CBID_CORE2_DomainRangePushEx, &range_push);
  install(table, size, NVTX_CBID_CORE2_DomainRangePop, &range_pop);
  std::lock_guard<std::mutex> lock(state().mu);
  state().attached = true;
  return 1;
}

}  // namespace

bool nvtx_counter_attached() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.attached;
}

NvtxDomainCounts nvtx_counts(const std::string& domain_name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto it = s.by_name.find(domain_name);
  return it == s.by_name.end() ? NvtxDomainCounts{} : it->second;
}

}  // namespace shardscope::testing

// The strong definition that NVTX's weak one (in every other object) yields to.
extern "C" {
int (*InitializeInjectionNvtx2_fnptr)(const void* (*)(std::uint32_t)) =
    &shardscope::testing::initialize;
}
