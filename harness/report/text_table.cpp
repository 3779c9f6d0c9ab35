#include "harness/report/text_table.hpp"

#include <algorithm>
#include <stdexcept>

namespace shardscope {

std::size_t display_width(const std::string& s) {
  std::size_t width = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++width;  // count lead bytes, skip continuation bytes
  return width;
}

TextTable::TextTable(std::vector<std::string> headers, std::vector<Align> align)
    : headers_(std::move(headers)), align_(std::move(align)) {
  align_.resize(headers_.size(), Align::left);
}

void TextTable::add_row(std::vector<std::string> cells) {
  if (cells.size() > headers_.size())
    throw std::logic_error("TextTable: a row has more cells than the table has columns");
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

void TextTable::print(std::ostream& os, int indent) const {
  std::vector<std::size_t> width(headers_.size());
  for (std::size_t c = 0; c < headers_.size(); ++c) {
    width[c] = display_width(headers_[c]);
    for (const auto& row : rows_) width[c] = std::max(width[c], display_width(row[c]));
  }
  auto print_line = [&](const std::vector<std::string>& cells) {
    std::string line(static_cast<std::size_t>(std::max(indent, 0)), ' ');
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const std::string pad(width[c] - display_width(cells[c]), ' ');
      if (c > 0) line += "  ";
      line += align_[c] == Align::right ? pad + cells[c] : cells[c] + pad;
    }
    line.erase(line.find_last_not_of(' ') + 1);
    os << line << '\n';
  };
  print_line(headers_);
  std::vector<std::string> rule;
  for (std::size_t w : width) rule.emplace_back(w, '-');
  print_line(rule);
  for (const auto& row : rows_) print_line(row);
}

}  // namespace shardscope
