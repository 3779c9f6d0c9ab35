// OpenBLAS's threads, which shardscope never uses: the CPU backend computes on one thread.
#pragma once

namespace shardscope {

// OpenBLAS starts one thread per core as it is loaded, before main, and each maps its own
// 128 MiB buffer when it gets to it: the process's address space then grows at a time no
// check can foresee, and under an address-space limit (ulimit -v) a buffer that does not
// fit is retried forever at 100 % CPU, by a worker or at exit. With OPENBLAS_NUM_THREADS=1
// in the environment OpenBLAS starts none. So, in a build with OpenBLAS, unless it is
// already 1, this sets it and executes the program again (/proc/self/exe, same argv; the
// same process, so mpirun and the sweep see no difference), and the runs it starts
// inherit it. When the program cannot be executed again it returns and things stay as
// they were. Call it first thing in main.
void use_one_blas_thread(char** argv);

}  // namespace shardscope
