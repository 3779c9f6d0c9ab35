// JSON fields as table cells, read defensively: a missing or null field prints "-".
// What still prints from JSON uses them (the plan's tables); the other printers render
// the records (table_parts.hpp) and take only the byte formats from here.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

namespace shardscope {

// How the tables are written (--bytes, --wide; run, sweep, plan and compare).
struct TableOptions {
  bool exact_bytes = false;  // 2,105,344 rather than 2.01 MiB
  bool wide = false;         // every column, each prediction in full: wider than 120
};

}  // namespace shardscope

namespace shardscope::cells {

inline constexpr const char* kMissing = "-";
// A prediction equal to the figure beside it (compact tables).
inline constexpr const char* kSame = "=";

// The value at `path` below `j` (object keys), or nullptr when a step is missing or
// the value is null.
const nlohmann::json* at(const nlohmann::json& j, std::initializer_list<const char*> path);

// Integer value of a number field; false when absent or not a number.
bool as_int(const nlohmann::json* v, std::int64_t* out);
bool as_double(const nlohmann::json* v, double* out);

// "8,421,440".
std::string group_digits(std::int64_t n);
// A difference with its sign: "+32,768", "-1,024", "+0".
std::string signed_digits(std::int64_t n);
// A byte count with thousands separators, or "-".
std::string bytes(const nlohmann::json* v);
// Binary units with three significant figures: "512 B", "2.01 MiB", "16.5 KiB",
// "337 MiB", "4.14 GiB", "-2.00 KiB".
std::string binary_bytes(std::int64_t n);
// A byte count as `options` say (binary by default, exact digits under --bytes exact).
std::string bytes(const nlohmann::json* v, const TableOptions& options);
std::string bytes(std::int64_t n, const TableOptions& options);
// The measured bytes, followed by " ! <predicted>" when a prediction differs from them.
std::string measured_bytes(const nlohmann::json* measured, const nlohmann::json* predicted);
std::string measured_bytes(const nlohmann::json* measured, const nlohmann::json* predicted,
                           const TableOptions& options);
// bytes / base with 3 decimals ("4.000"), or "-" when either is missing or base is 0.
std::string multiple(const nlohmann::json* v, const nlohmann::json* base);
// A number with `decimals` places, or "-".
std::string fixed(const nlohmann::json* v, int decimals);
// A fraction in [0, 1] as a percentage with one decimal ("33.3%"), or "-".
std::string percent(const nlohmann::json* v);
// Strings as they are, integers as digits, other numbers with 3 decimals, "-" when missing.
std::string text(const nlohmann::json* v);
// The predicted figure beside a measured one: grouped digits, then " !" when both are
// present and differ.
std::string predicted_bytes(const nlohmann::json* predicted, const nlohmann::json* measured);
// The same as `options` say: under --wide as above; otherwise "=" where the prediction
// equals the measured figure, and the predicted figure with " !" only where it differs.
std::string predicted_bytes(const nlohmann::json* predicted, const nlohmann::json* measured,
                            const TableOptions& options);

}  // namespace shardscope::cells
