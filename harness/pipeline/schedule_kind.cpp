#include "shardscope/schedule_kind.hpp"

namespace shardscope {

std::string schedule_names_text(const std::string& separator) { return join_names(kScheduleNames, separator); }

ScheduleKind parse_schedule(const std::string& name, const std::string& flag) {
  return parse_named<ScheduleKind>(kScheduleNames, name, flag);
}

}  // namespace shardscope
