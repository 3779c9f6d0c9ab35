// Entry point: parses the command line and maps errors to exit codes (DESIGN §6).
#include "harness/cli/cli.hpp"

int main(int argc, char** argv) { return shardscope::cli_main(argc, argv); }
