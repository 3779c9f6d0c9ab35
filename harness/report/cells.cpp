#include "harness/report/cells.hpp"

#include <cstdio>

#include "harness/report/json_io.hpp"

namespace shardscope::cells {

const nlohmann::json* at(const nlohmann::json& j, std::initializer_list<const char*> path) {
  const nlohmann::json* cur = &j;
  for (const char* key : path) {
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(key);
    if (it == cur->end()) return nullptr;
    cur = &*it;
  }
  return cur->is_null() ? nullptr : cur;
}

std::string group_digits(std::int64_t n) {
  const std::uint64_t mag = n < 0 ? ~static_cast<std::uint64_t>(n) + 1 : static_cast<std::uint64_t>(n);
  const std::string digits = std::to_string(mag);
  std::string out = n < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string signed_digits(std::int64_t n) { return (n >= 0 ? "+" : "") + group_digits(n); }

std::string binary_bytes(std::int64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  const std::uint64_t mag = n < 0 ? ~static_cast<std::uint64_t>(n) + 1 : static_cast<std::uint64_t>(n);
  const std::string sign = n < 0 ? "-" : "";
  if (mag < 1024) return sign + std::to_string(mag) + " B";
  double scaled = static_cast<double>(mag);
  int unit = 0;
  while (scaled >= 1024.0 && unit < 6) {
    scaled /= 1024.0;
    ++unit;
  }
  // 999.6 KiB would print as "1000 KiB": four figures; the next unit says it in three.
  if (scaled >= 999.5 && unit < 6) {
    scaled /= 1024.0;
    ++unit;
  }
  const int decimals = scaled >= 99.95 ? 0 : scaled >= 9.995 ? 1 : scaled >= 0.9995 ? 2 : 3;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%.*f %s", sign.c_str(), decimals, scaled, kUnits[unit]);
  return buf;
}

std::string bytes(std::int64_t n, const TableOptions& options) {
  return options.exact_bytes ? group_digits(n) : binary_bytes(n);
}

std::string text(const nlohmann::json* v) {
  if (!v) return kMissing;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_number_integer()) return std::to_string(v->get<std::int64_t>());
  if (v->is_number()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", v->get<double>());
    return buf;
  }
  if (v->is_boolean()) return v->get<bool>() ? "true" : "false";
  return json_text(*v);
}

}  // namespace shardscope::cells
