// Entry point: parses the command line and maps errors to exit codes (docs/design.md §6).
#include "harness/cli/blas_threads.hpp"
#include "harness/cli/cli.hpp"

int main(int argc, char** argv) {
  shardscope::use_one_blas_thread(argv);  // may execute the program again, with one OpenBLAS thread
  return shardscope::cli_main(argc, argv);
}
