// Errors and the one family of check macros (STYLE: Errors).
//
// UsageError -> exit 2 (bad flag or configuration); RunError -> exit 3 (a run failed).
// The CUDA/NCCL/cuBLAS variants live in cuda_check.hpp so that CPU-only code
// never includes CUDA headers.
#pragma once

#include <stdexcept>
#include <string>

namespace shardscope {

// Bad usage or an impossible configuration: exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A run that could not complete (out of memory, a dead rank, a failed call): exit code 3.
class RunError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "file:line: text" for check failures.
std::string where_failed(const char* file, int line, const std::string& what);

}  // namespace shardscope

#define SHARDSCOPE_REQUIRE(cond, msg)                                                   \
  do {                                                                                  \
    if (!(cond))                                                                        \
      throw ::shardscope::RunError(::shardscope::where_failed(__FILE__, __LINE__,       \
                                                              std::string(msg)));       \
  } while (0)
