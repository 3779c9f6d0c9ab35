// Result files from elsewhere: a parse failure names the field with the text cut short,
// and strings are made printable before they reach a terminal.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "harness/report/json_parse.hpp"
#include "shardscope/check.hpp"

namespace shardscope {
namespace {

std::string refusal(const std::string& text) {
  try {
    parse_json_text(text, "f.json");
  } catch (const RunError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(JsonParse, ANumberNoDoubleHoldsNamesItsFieldCutShort) {
  const std::string digits(5000, '7');
  EXPECT_EQ(refusal(R"({"runs": [{"ranks": [{"rank": 0}, {"peak": {"total": )" + digits + "}}]}]}"),
            "'f.json': runs[0].ranks[1].peak.total: the number 777777777777777777777777... (5000 characters) is "
            "beyond what a double holds (about 1.8e308)");
  EXPECT_EQ(refusal(R"({"a": [1, 2, -1e400]})"),
            "'f.json': a[2]: the number -1e400 is beyond what a double holds (about 1.8e308)");
  EXPECT_EQ(refusal("1e400"), "'f.json': the number 1e400 is beyond what a double holds (about 1.8e308)");
}

TEST(JsonParse, ASyntaxErrorQuotesLittleOfTheFile) {
  const std::string junk = "x" + std::string(3000, 'y');
  const std::string e = refusal(R"({"runs": [{"kind": )" + junk + "}]}");
  EXPECT_EQ(e.rfind("'f.json' is not valid JSON (in runs[0].kind): ", 0), 0u) << e;
  EXPECT_LT(e.size(), 300u) << e;
  EXPECT_EQ(refusal("{\"a\": 1").rfind("'f.json' is not valid JSON (in a): ", 0), 0u) << refusal("{\"a\": 1");
}

TEST(JsonParse, ParsesWhatNlohmannParses) {
  const std::string text =
      R"({"a": [1, -2, 3.5, 18446744073709551615, "s", null, true, {"b": [], "c": {}}], "": {"d": [[1], [2, [3]]]}})";
  const nlohmann::json j = parse_json_text(text, "f.json");
  EXPECT_EQ(j, nlohmann::json::parse(text));
  EXPECT_TRUE(j["a"][3].is_number_unsigned());
  EXPECT_EQ(parse_json_text("[]", "f"), nlohmann::json::array());
}

TEST(JsonParse, ControlCharactersAreEscaped) {
  EXPECT_EQ(printable("ddp\x1b[31m W=2\r\n\x7f"), "ddp\\x1b[31m W=2\\x0d\\x0a\\x7f");
  EXPECT_EQ(printable("\xc2\x9b" "31m \xc3\xa9 \xe2\x82\xac"), "\\u009b31m \xc3\xa9 \xe2\x82\xac");  // C1 CSI; é and € stay
  EXPECT_EQ(printable("a\xff" "b"), "a\\xffb");
  nlohmann::json doc = {{"runs", {{{"strategy", "ddp\x1b]0;pwned\x07"}}}}, {"k\x1b", 1}};
  make_printable(doc);
  EXPECT_EQ(doc["runs"][0]["strategy"], "ddp\\x1b]0;pwned\\x07");
  EXPECT_EQ(doc["k\\x1b"], 1);
}

}  // namespace
}  // namespace shardscope
