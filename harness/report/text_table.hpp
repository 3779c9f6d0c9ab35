// Plain, aligned text tables: the layout every printer shares.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace shardscope {

enum class Align { left, right };

class TextTable {
 public:
  // One column per header; `align` per column (left when shorter than the headers).
  TextTable(std::vector<std::string> headers, std::vector<Align> align);

  // A row of cells; missing cells print empty, extra cells are an error (throws).
  void add_row(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }

  // Header, a rule of dashes, then the rows; columns two spaces apart, each line
  // indented by `indent` spaces, no trailing blanks. Widths count UTF-8 code points.
  void print(std::ostream& os, int indent = 2) const;

 private:
  std::vector<std::string> headers_;
  std::vector<Align> align_;
  std::vector<std::vector<std::string>> rows_;
};

// Display width of UTF-8 text in code points ("× 4P" is 4 wide).
std::size_t display_width(const std::string& s);

}  // namespace shardscope
