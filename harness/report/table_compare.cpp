// `shardscope compare`'s table: one row for a configuration whose ranks all hold the same
// bytes, the same in both documents (step time of the slowest rank), else a row per rank
// or stage; then the configurations only one document holds, and a summary. With no
// row to show, a line says so instead of a header over nothing.
#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/table.hpp"
#include "harness/report/text_table.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

std::string delta(const json& rank, const char* field) {
  std::int64_t a = 0, b = 0;
  if (!cells::as_int(cells::at(rank, {"base", field}), &a) || !cells::as_int(cells::at(rank, {"new", field}), &b))
    return cells::kMissing;
  return a == b ? "=" : cells::signed_digits(b - a);
}

double step_of(const json& rank, const char* which) {
  const json* v = cells::at(rank, {which, "step_ms"});
  return v && v->is_number() ? v->get<double>() : -1.0;
}

std::string ms(double v) {
  if (v < 0.0) return cells::kMissing;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

std::string ratio(double base, double fresh) {
  if (base <= 0.0 || fresh < 0.0) return cells::kMissing;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", fresh / base);
  return buf;
}

std::string source_line(const json& doc) {
  std::string line = cells::text(cells::at(doc, {"path"})) + " (backend " + cells::text(cells::at(doc, {"backend"})) +
                     ", comm " + cells::text(cells::at(doc, {"comm"}));
  if (const json* e = cells::at(doc, {"emulated"}); e && e->is_boolean() && e->get<bool>()) line += ", emulated";
  line += ", git " + cells::text(cells::at(doc, {"git"})) + ", host " + cells::text(cells::at(doc, {"host"})) + ")";
  return line;
}

}  // namespace

void print_comparison(const json& cmp, std::ostream& os) {
  os << "base: " << source_line(cmp["base"]) << "\nnew:  " << source_line(cmp["new"]) << "\n\n";
  TextTable table({"configuration", "rank", "resting B (base)", "Δ", "peak B (base)", "Δ", "step ms base", "new",
                   "new/base", "differs in"},
                  {Align::left, Align::left, Align::right, Align::right, Align::right, Align::right, Align::right,
                   Align::right, Align::right, Align::left});
  int same = 0, differ = 0;
  std::vector<double> ratios;
  std::vector<std::string> no_common_rank;
  for (const json& run : cmp["runs"]) {
    const json& ranks = run["ranks"];
    if (ranks.empty()) {  // emulated runs that each played a different rank
      no_common_rank.push_back(cells::text(cells::at(run, {"label"})));
      continue;
    }
    // The two documents agree on this configuration's bytes; and its ranks hold the same
    // bytes as each other, so that one row can show them all.
    const bool agree = std::all_of(ranks.begin(), ranks.end(), [](const json& r) { return r["differs"].empty(); });
    const bool alike = std::all_of(ranks.begin(), ranks.end(), [&](const json& r) {
      return r["base"]["resting"] == ranks[0]["base"]["resting"] && r["base"]["peak"] == ranks[0]["base"]["peak"];
    });
    ++(agree ? same : differ);
    // A step lasts as long as its slowest rank.
    double base_step = -1.0, new_step = -1.0;
    for (const json& r : ranks) {
      base_step = std::max(base_step, step_of(r, "base"));
      new_step = std::max(new_step, step_of(r, "new"));
    }
    if (base_step > 0.0 && new_step >= 0.0) ratios.push_back(new_step / base_step);
    auto add = [&](const json& r, const std::string& who, double b, double n) {
      std::string differs;
      for (const json& d : r["differs"]) differs += (differs.empty() ? "" : "; ") + d.get<std::string>();
      table.add_row({cells::text(cells::at(run, {"label"})), who, cells::bytes(cells::at(r, {"base", "resting"})),
                     delta(r, "resting"), cells::bytes(cells::at(r, {"base", "peak"})), delta(r, "peak"),
                     ms(b), ms(n), ratio(b, n), differs.empty() ? "-" : differs});
    };
    if (agree && alike) {
      add(ranks[0], ranks.size() == 1 ? cells::text(cells::at(ranks[0], {"rank"})) : "all", base_step, new_step);
      continue;
    }
    for (const json& r : ranks) add(r, cells::text(cells::at(r, {"rank"})), step_of(r, "base"), step_of(r, "new"));
  }
  if (!table.empty()) table.print(os, 2);
  else if (cmp["runs"].empty()) os << "no configuration is in both files\n";
  else os << "no rank or stage is in both files\n";
  os << '\n';
  for (const std::string& label : no_common_rank) os << "  in both, no rank or stage in common: " << label << '\n';
  for (const auto& [field, which] : {std::pair{"only_in_base", "base"}, std::pair{"only_in_new", "new"}})
    for (const json& label : cmp[field]) os << "  only in " << which << ": " << label.get<std::string>() << '\n';
  os << "configurations compared: " << same + differ << "; bytes identical in " << same << ", different in "
     << differ;
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    const double mid = ratios.size() % 2 ? ratios[ratios.size() / 2]
                                         : 0.5 * (ratios[ratios.size() / 2 - 1] + ratios[ratios.size() / 2]);
    char buf[96];
    std::snprintf(buf, sizeof buf, "; step time new/base: median %.3f (%.3f to %.3f)", mid, ratios.front(),
                  ratios.back());
    os << buf;
  }
  os << '\n';
}

}  // namespace shardscope
