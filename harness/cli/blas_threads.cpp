#include "harness/cli/blas_threads.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace shardscope {

void use_one_blas_thread(char** argv) {
#ifdef SHARDSCOPE_WITH_BLAS
  const char* threads = std::getenv("OPENBLAS_NUM_THREADS");
  if (threads != nullptr && std::strcmp(threads, "1") == 0) return;
  if (::setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // Not executed again (no /proc, the binary replaced): go on with OpenBLAS's threads.
  if (threads != nullptr) ::setenv("OPENBLAS_NUM_THREADS", threads, 1);
  else ::unsetenv("OPENBLAS_NUM_THREADS");
#else
  (void)argv;
#endif
}

}  // namespace shardscope
