// `shardscope compare` on hostile result files: a number no double holds is bad input
// (exit 2) naming the file and the field, the number cut short; control characters in
// the files' strings never reach the terminal.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/records_of.hpp"
#include "support/report_doc.hpp"
#include "support/shell.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

class CompareFiles : public testing::BinaryTest {
 protected:
  int compare(const std::string& args) {
    return testing::shell("cd '" + dir_ + "' && timeout 60 '" + bin_ + "' compare " + args + " > out.txt 2> err.txt");
  }
  std::string read(const char* name) const {
    std::ifstream in(dir_ + "/" + name);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // The report document with runs[3].ranks[1].peak.total written as `number`.
  void write_with_peak(const char* name, const std::string& number) const {
    json doc = testing::complete_document(testing::report_document());
    doc["runs"][3]["ranks"][1]["peak"]["total"] = 987654321987654321;
    std::string text = doc.dump();
    text.replace(text.find("987654321987654321"), 18, number);
    std::ofstream(dir_ + "/" + name) << text;
  }
};

TEST_F(CompareFiles, ANumberNoDoubleHoldsIsBadInputNamingTheField) {
  std::ofstream(dir_ + "/good.json") << testing::complete_document(testing::report_document()).dump();
  write_with_peak("big.json", std::string(5000, '9'));
  write_with_peak("e400.json", "1e400");
  EXPECT_EQ(compare("good.json big.json"), 2);
  EXPECT_EQ(read("err.txt"), "shardscope: error: NEW: 'big.json': runs[3].ranks[1].peak.total: the number "
                             "999999999999999999999999... (5000 characters) is beyond what a double holds "
                             "(about 1.8e308)\n");
  EXPECT_EQ(read("out.txt"), "");
  EXPECT_EQ(compare("e400.json good.json"), 2);
  EXPECT_EQ(read("err.txt"), "shardscope: error: BASE: 'e400.json': runs[3].ranks[1].peak.total: the number 1e400 "
                             "is beyond what a double holds (about 1.8e308)\n");
}

TEST_F(CompareFiles, ControlCharactersInAFileAreEscaped) {
  json doc = testing::complete_document(testing::report_document());
  doc["runs"][3]["strategy"] = "ddp\x1b[2J";
  doc["provenance"]["git"] = "abc\x1b]0;title\x07";
  doc["backend"] = "cpu\r";
  std::ofstream(dir_ + "/evil.json") << doc.dump();
  EXPECT_EQ(compare("evil.json evil.json"), 0) << read("err.txt");
  const std::string out = read("out.txt");
  for (const char c : out) EXPECT_TRUE(c == '\n' || static_cast<unsigned char>(c) >= 0x20) << int(c);
  EXPECT_NE(out.find("ddp\\x1b[2J"), std::string::npos) << out;
  EXPECT_NE(out.find("abc\\x1b]0;title\\x07"), std::string::npos) << out;

  // A refusal's line quotes the run's label: escaped too.
  doc["runs"][3]["ranks"][1]["peak"]["total"] = "x";
  std::ofstream(dir_ + "/bad.json") << doc.dump();
  EXPECT_EQ(compare("evil.json bad.json"), 2);
  const std::string err = read("err.txt");
  EXPECT_NE(err.find("runs[3] (ddp\\x1b[2J W=4"), std::string::npos) << err;
  for (const char c : err) EXPECT_TRUE(c == '\n' || static_cast<unsigned char>(c) >= 0x20) << int(c);
}

}  // namespace
}  // namespace shardscope
