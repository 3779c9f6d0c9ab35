#include "shardscope/format.hpp"

#include <array>
#include <cstdio>

namespace shardscope {
namespace {

// |bytes| without overflow at INT64_MIN.
std::uint64_t magnitude(std::int64_t bytes) {
  return bytes < 0 ? ~static_cast<std::uint64_t>(bytes) + 1 : static_cast<std::uint64_t>(bytes);
}

}  // namespace

std::string format_bytes_short(std::int64_t bytes) {
  static constexpr std::array<const char*, 7> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const std::uint64_t mag = magnitude(bytes);
  if (mag < 1024) return std::to_string(bytes) + " B";
  int unit = 0;
  double scaled = static_cast<double>(mag);
  while (scaled >= 1024.0 && unit + 1 < static_cast<int>(kUnits.size())) {
    scaled /= 1024.0;
    ++unit;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%.2f %s", bytes < 0 ? "-" : "", scaled, kUnits[unit]);
  return buf;
}

std::string format_bytes(std::int64_t bytes) {
  const std::uint64_t mag = magnitude(bytes);
  const std::string digits = std::to_string(mag);
  std::string grouped;
  grouped.reserve(digits.size() + digits.size() / 3 + 1);
  if (bytes < 0) grouped += '-';
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  grouped += " B";
  if (mag < 1024) return grouped;
  return grouped + " (" + format_bytes_short(bytes) + ")";
}

}  // namespace shardscope
