#include "harness/cli/cli.hpp"

#include <cstdio>

namespace shardscope {
int cli_main(int argc, char** argv) {
  std::fprintf(stderr, "shardscope: error: not built yet\n");
  return 2;
}
}  // namespace shardscope
