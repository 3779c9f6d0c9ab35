#include "shardscope/check.hpp"

namespace shardscope {

std::string where_failed(const char* file, int line, const std::string& what) {
  return std::string(file) + ":" + std::to_string(line) + ": " + what;
}

}  // namespace shardscope
