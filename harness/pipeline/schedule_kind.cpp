#include "shardscope/schedule_kind.hpp"

#include "shardscope/check.hpp"

namespace shardscope {

std::string schedule_names_text(const std::string& separator) {
  std::string text;
  for (const std::string_view name : kScheduleNames) {
    if (!text.empty()) text += separator;
    text += name;
  }
  return text;
}

ScheduleKind parse_schedule(const std::string& name, const std::string& flag) {
  if (const std::optional<ScheduleKind> s = find_schedule(name)) return *s;
  throw UsageError(flag + ": unknown '" + name + "'; allowed: " + schedule_names_text());
}

}  // namespace shardscope
