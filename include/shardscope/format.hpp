// Byte counts as people read them, shared by every printer and error message.
#pragma once

#include <cstdint>
#include <string>

namespace shardscope {

// Exact bytes with thousands separators, then the binary-prefixed size when it is at
// least 1 KiB: "8,421,440 B (8.03 MiB)", "512 B", "-2,048 B (-2.00 KiB)".
std::string format_bytes(std::int64_t bytes);

// The binary-prefixed size alone, two decimals: "8.03 MiB", "512 B", "1.00 GiB".
std::string format_bytes_short(std::int64_t bytes);

}  // namespace shardscope
