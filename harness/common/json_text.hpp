// The one way shardscope turns JSON into text: result files, the records ranks send
// each other and every printer's cells go through here.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace shardscope {

// `j` on one line, as nlohmann's dump() writes it, except that a string that is not
// valid UTF-8 (a file name in a command line, say) has its bad bytes replaced by U+FFFD
// instead of throwing.
std::string json_text(const nlohmann::json& j);

}  // namespace shardscope
