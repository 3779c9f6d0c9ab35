// Reading result files someone else may have written: a parse failure names the file,
// the field and the byte, with the offending text cut short; strings read from a file
// are made safe to print before they reach a terminal.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace shardscope {

// Parses `text`, the content of file `source`. Throws RunError on what is not JSON or
// holds a number no double can (5000 digits, 1e400):
//   'a.json': runs[0].ranks[1].peak.total: the number 12345678901234567890... (5000
//   characters) is beyond what a double holds (about 1.8e308)
//   'a.json' is not valid JSON (in runs[0].kind): parse error at line 3, column 7: ...
// The text quoted from the file is cut to a few dozen characters and printable.
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

// `text` with every control character (C0, DEL and the C1 range U+0080-U+009F, which
// terminals act on: colours, cursor moves, title changes) written as \xNN or \u00NN, and
// every byte that is not part of valid UTF-8 as \xNN; a backslash stays as it is.
std::string printable(const std::string& text);

// Every string in `j`, and every object key, made printable: for documents whose
// strings are only ever shown (compare's input).
void make_printable(nlohmann::json& j);

}  // namespace shardscope
