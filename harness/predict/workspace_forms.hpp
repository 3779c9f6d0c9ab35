// What a backend holds for its whole life, beside the model's bytes (docs/formulas.md,
// "Workspace"): cuBLAS's workspace on cuda (kCudaWorkspaceBytes, category workspace),
// nothing on cpu. Allocated when the backend is made, it is live at rest and at every
// peak, so it adds the same bytes to both.
#pragma once

#include <cstdint>
#include <string_view>

#include "harness/predict/pipeline_forms.hpp"
#include "shardscope/predict.hpp"

namespace shardscope {

// kCudaWorkspaceBytes for "cuda", 0 for "cpu" (and any backend without a workspace).
std::int64_t backend_workspace_bytes(std::string_view backend);

// A rank's or a stage's closed forms on `backend`: its workspace added to the resting
// bytes and to the peak (total and by category).
void add_backend_workspace(Prediction& p, std::string_view backend);
void add_backend_workspace(StageForms& f, std::string_view backend);

}  // namespace shardscope
