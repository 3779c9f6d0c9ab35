#include "harness/predict/workspace_forms.hpp"

#include "shardscope/backend.hpp"

namespace shardscope {

std::int64_t backend_workspace_bytes(std::string_view backend) {
  return backend == "cuda" ? kCudaWorkspaceBytes : 0;
}

void add_backend_workspace(Prediction& p, std::string_view backend) {
  const std::int64_t w = backend_workspace_bytes(backend);
  p.resting[Category::workspace] += w;
  // A transformer's peak without a closed form stays zero: not a prediction.
  if (!p.peak_known) return;
  p.peak_by_category[Category::workspace] += w;
  p.peak_total += w;
}

void add_backend_workspace(StageForms& f, std::string_view backend) {
  const std::int64_t w = backend_workspace_bytes(backend);
  f.resting[Category::workspace] += w;
  f.peak[Category::workspace] += w;
}

}  // namespace shardscope
