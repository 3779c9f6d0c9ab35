#pragma once

namespace shardscope {
// Runs `shardscope run|sweep ...`; returns the process exit code (0, 2 or 3).
int cli_main(int argc, char** argv);
}  // namespace shardscope
