#include "harness/report/json_parse.hpp"

#include <cstdio>
#include <utility>
#include <vector>

#include "shardscope/check.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// Quoted text from the file: at most this many characters, then "... (N characters)".
constexpr std::size_t kQuoteChars = 24;

std::string cut_short(const std::string& text) {
  if (text.size() <= kQuoteChars + 16) return printable(text);
  std::size_t cut = kQuoteChars;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return printable(text.substr(0, cut)) + "... (" + std::to_string(text.size()) + " characters)";
}

// Builds the document as nlohmann's parser would, and keeps the path to where it is
// (runs[0].ranks[1].peak), so that a failure can name the field.
class PathKeepingParser {
 public:
  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const json::string_t& /*text*/) { return put(v); }
  bool string(json::string_t& v) { return put(std::move(v)); }
  bool binary(json::binary_t& v) { return put(json::binary(std::move(v))); }
  bool start_object(std::size_t /*size*/) { return open(json::object()); }
  bool start_array(std::size_t /*size*/) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    levels_.back().key = k;
    levels_.back().has_key = true;
    return true;
  }
  bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& e) {
    position_ = position;
    token_ = token;
    id_ = e.id;
    what_ = e.what();
    return false;
  }

  json& document() { return root_; }
  std::string error(const std::string& source) const {
    const std::string at = "'" + source + "': ";
    const std::string where = path();
    if (id_ == 406)  // nlohmann's out_of_range.406, "number overflow parsing '<token>'"
      return at + (where.empty() ? "" : where + ": ") + "the number " + cut_short(token_) +
             " is beyond what a double holds (about 1.8e308)";
    // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error
    // while parsing value - invalid literal; last read: '<token>'": the token cut short.
    std::string what = what_;
    if (const std::size_t bracket = what.find("] "); what.rfind("[json.exception.", 0) == 0 && bracket != std::string::npos)
      what = what.substr(bracket + 2);
    if (const std::size_t quoted = what.find("'" + token_ + "'"); !token_.empty() && quoted != std::string::npos)
      what.replace(quoted + 1, token_.size(), cut_short(token_));
    if (what.size() > 300) what = cut_short(what);
    return "'" + source + "' is not valid JSON" + (where.empty() ? "" : " (in " + where + ")") + ": " + printable(what) +
           " (byte " + std::to_string(position_) + ")";
  }

 private:
  struct Level {
    json* container;
    std::string key;  // objects: the last key read
    bool has_key = false;
  };

  // The path to the value being read: "runs[0].ranks[1].peak.total". An open array's
  // last element is the container being read (a level below it), else the next one.
  std::string path() const {
    std::string out;
    for (std::size_t i = 0; i < levels_.size(); ++i) {
      const Level& l = levels_[i];
      const bool inner_open = i + 1 < levels_.size();
      if (l.container->is_array()) {
        out += "[" + std::to_string(l.container->size() - (inner_open ? 1 : 0)) + "]";
      } else if (l.has_key) {
        out += (out.empty() ? "" : ".") + l.key;
      }
    }
    return printable(out);
  }

  // The value's place: the root, the end of the open array, or the last key of the open
  // object. A container's address stays put while values go into it: its parent grows
  // only once it is closed.
  json* place(json v) {
    if (levels_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Level& top = levels_.back();
    if (top.container->is_array()) {
      top.container->push_back(std::move(v));
      return &top.container->back();
    }
    json& slot = (*top.container)[top.key];
    slot = std::move(v);
    return &slot;
  }
  bool put(json v) {
    place(std::move(v));
    return true;
  }
  bool open(json container) {
    json* where = place(std::move(container));
    levels_.push_back({where, {}, false});
    return true;
  }
  bool close() {
    levels_.pop_back();
    return true;
  }

  json root_;
  std::vector<Level> levels_;
  std::size_t position_ = 0;
  std::string token_, what_;
  int id_ = 0;
};

void append_hex(std::string& out, const char* format, unsigned value) {
  char buf[8];
  std::snprintf(buf, sizeof buf, format, value);
  out += buf;
}

// The length of the valid UTF-8 character at text[i], 0 when the bytes there are not one.
std::size_t utf8_length(const std::string& text, std::size_t i) {
  const auto b = static_cast<unsigned char>(text[i]);
  const std::size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 && b >= 0xC2 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E && b <= 0xF4 ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
  return n;
}

}  // namespace

json parse_json_text(const std::string& text, const std::string& source) {
  PathKeepingParser parser;
  if (!json::sax_parse(text, &parser)) throw RunError(parser.error(source));
  return std::move(parser.document());
}

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    const std::size_t n = utf8_length(text, i);
    if (n == 0 || b < 0x20 || b == 0x7F) {  // a control character, or a byte of no character
      append_hex(out, "\\x%02x", b);
      ++i;
    } else if (n == 2 && b == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {  // C1: U+0080-U+009F
      append_hex(out, "\\u%04x", static_cast<unsigned char>(text[i + 1]));
      i += 2;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  return out;
}

void make_printable(json& j) {
  if (j.is_string()) {
    j = printable(j.get_ref<const std::string&>());
  } else if (j.is_array()) {
    for (json& v : j) make_printable(v);
  } else if (j.is_object()) {
    json out = json::object();
    for (auto it = j.begin(); it != j.end(); ++it) {
      json v = std::move(it.value());
      make_printable(v);
      out[printable(it.key())] = std::move(v);
    }
    j = std::move(out);
  }
}

}  // namespace shardscope
