// `shardscope plan --overhead RESULT.json`: the device memory outside the pool that a
// measured CUDA run held (its ranks' outside_pool_bytes: the CUDA context, cuBLAS, NCCL's
// communicators and the rest), read from that run's result file, so that plan's --memory
// verdicts are about the whole device and not only about what the allocator holds.
#pragma once

#include <string>

#include "harness/records/result.hpp"

namespace shardscope {

// The largest outside_pool_bytes among every rank and stage of the result file `path`, and
// whose it is. UsageError beginning "--overhead: " and naming the file when it cannot be
// read, is not a shardscope/1 result, has a field of the wrong type (read_result names
// it), or records no such figure for any rank (a cpu run measures none).
PlanOverhead read_plan_overhead(const std::string& path);

}  // namespace shardscope
