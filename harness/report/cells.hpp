// How the tables write bytes ("2.01 MiB", "2,105,344", "-" for none). Every table renders
// the typed records (table_parts.hpp); `at` and `text` are for what is still JSON: a
// sweep's free-form configuration (a skipped record's label) and its merged document.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

namespace shardscope {

// How the tables are written (--bytes, --wide; run, sweep, plan and compare).
struct TableOptions {
  // The columns a line of the tables fits, but under --wide.
  static constexpr std::size_t kColumns = 120;

  bool exact_bytes = false;  // 2,105,344 rather than 2.01 MiB
  bool wide = false;         // every column, each prediction in full: wider than kColumns
};

}  // namespace shardscope

namespace shardscope::cells {

inline constexpr const char* kMissing = "-";
// A prediction equal to the figure beside it (compact tables).
inline constexpr const char* kSame = "=";

// The value at `path` below `j` (object keys), or nullptr when a step is missing or
// the value is null.
const nlohmann::json* at(const nlohmann::json& j, std::initializer_list<const char*> path);

// "8,421,440".
std::string group_digits(std::int64_t n);
// A difference with its sign: "+32,768", "-1,024", "+0".
std::string signed_digits(std::int64_t n);
// Binary units with three significant figures: "512 B", "2.01 MiB", "16.5 KiB",
// "337 MiB", "4.14 GiB", "-2.00 KiB".
std::string binary_bytes(std::int64_t n);
// A byte count as `options` say (binary by default, exact digits under --bytes exact).
std::string bytes(std::int64_t n, const TableOptions& options);
// Strings as they are, integers as digits, other numbers with 3 decimals, "-" when missing.
std::string text(const nlohmann::json* v);

}  // namespace shardscope::cells
