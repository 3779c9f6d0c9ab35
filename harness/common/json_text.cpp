#include "harness/common/json_text.hpp"

namespace shardscope {

std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace shardscope
