// `shardscope compare`'s table: a row per range of consecutive ranks (or stages) that hold
// the same bytes in both documents and differ alike ("all" when one row covers every
// rank; step time of the range's slowest rank); then, in a compact table, what differs
// under it; the configurations only one document holds, and a summary. With no row to
// show, a line says so instead of a header over nothing.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/table.hpp"
#include "harness/report/text_table.hpp"

namespace shardscope {
namespace {

using nlohmann::json;

// A difference with its sign, as `options` write bytes: "+32.0 KiB", "+32,768".
std::string signed_bytes(std::int64_t n, const TableOptions& options) {
  return options.exact_bytes ? cells::signed_digits(n) : (n >= 0 ? "+" : "") + cells::binary_bytes(n);
}

std::string delta(const json& rank, const char* field, const TableOptions& options) {
  std::int64_t a = 0, b = 0;
  if (!cells::as_int(cells::at(rank, {"base", field}), &a) || !cells::as_int(cells::at(rank, {"new", field}), &b))
    return cells::kMissing;
  return a == b ? "=" : signed_bytes(b - a, options);
}

// The new figure beside the base one: "=" when they are equal.
std::string new_bytes(const json& rank, const char* field, const TableOptions& options) {
  const json* a = cells::at(rank, {"base", field});
  const json* b = cells::at(rank, {"new", field});
  if (a && b && *a == *b) return cells::kSame;
  return cells::bytes(b, options);
}

// What differs in a rank, as `options` write bytes: "peak temp +32.0 KiB; peak +32.0 KiB"
// (exact: "+32,768 B", the record's own words).
std::string differences_text(const json& rank, const TableOptions& options) {
  std::string out;
  const json* figures = cells::at(rank, {"differences"});
  if (options.exact_bytes || !figures || !figures->is_array() || figures->size() != rank["differs"].size()) {
    for (const json& d : rank["differs"]) out += (out.empty() ? "" : "; ") + d.get<std::string>();
    return out;
  }
  for (const json& d : *figures) {
    const std::string what = cells::text(cells::at(d, {"what"}));
    std::int64_t a = 0, b = 0;
    std::string item;
    if (!cells::at(d, {"base"}) || !cells::at(d, {"new"}))
      item = what + ": only in " + (cells::at(d, {"base"}) ? "base" : "new");
    else if (cells::at(d, {"count"}))
      item = what + " " + cells::text(cells::at(d, {"base"})) + " -> " + cells::text(cells::at(d, {"new"}));
    else if (cells::as_int(cells::at(d, {"base"}), &a) && cells::as_int(cells::at(d, {"new"}), &b))
      item = what + " " + signed_bytes(b - a, options);
    else
      item = what + " " + cells::text(cells::at(d, {"base"})) + " -> " + cells::text(cells::at(d, {"new"}));
    out += (out.empty() ? "" : "; ") + item;
  }
  return out;
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

// Consecutive ranks whose bytes agree, in both files and in what differs, share a row.
struct RankGroup {
  std::size_t first, last;  // indices into the run's ranks
};

std::vector<RankGroup> rank_groups(const json& ranks) {
  auto same = [](const json& a, const json& b) {
    return a["base"]["resting"] == b["base"]["resting"] && a["base"]["peak"] == b["base"]["peak"] &&
           a["new"]["resting"] == b["new"]["resting"] && a["new"]["peak"] == b["new"]["peak"] &&
           a["differs"] == b["differs"];
  };
  std::vector<RankGroup> groups;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (!groups.empty() && same(ranks[groups.back().last], ranks[i])) groups.back().last = i;
    else groups.push_back({i, i});
  }
  return groups;
}

// Wraps "label: a; b; c" at `width` columns, each line indented by two spaces (four
// after the first).
void print_wrapped(const std::string& text, std::size_t width, std::ostream& os) {
  std::string line = "  ";
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(' ', at);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(at, end - at);
    if (line.size() > 4 && display_width(line) + 1 + display_width(word) > width) {
      os << line << '\n';
      line = "    ";
    } else if (line.size() > 2 && line != "    ") {
      line += ' ';
    }
    line += word;
    at = end + 1;
  }
  os << line << '\n';
}

std::string source_line(const json& doc) {
  std::string line = cells::text(cells::at(doc, {"path"})) + " (backend " + cells::text(cells::at(doc, {"backend"})) +
                     ", comm " + cells::text(cells::at(doc, {"comm"}));
  if (const json* e = cells::at(doc, {"emulated"}); e && e->is_boolean() && e->get<bool>()) line += ", emulated";
  line += ", git " + cells::text(cells::at(doc, {"git"})) + ", host " + cells::text(cells::at(doc, {"host"})) + ")";
  return line;
}

}  // namespace

void print_comparison(const json& cmp, std::ostream& os, const TableOptions& options) {
  os << "base: " << source_line(cmp["base"]) << "\nnew:  " << source_line(cmp["new"]) << "\n\n";
  std::vector<std::string> headers = options.wide ? std::vector<std::string>{"configuration", "rank", "resting B (base)",
                                                                              "Δ", "peak B (base)", "Δ"}
                                                  : std::vector<std::string>{"configuration", "rank", "resting B: base",
                                                                             "new", "peak B: base", "new"};
  for (const char* c : {"step ms base", "new", "new/base"}) headers.emplace_back(c);
  if (options.wide) headers.emplace_back("differs in");
  std::vector<Align> align(headers.size(), Align::right);
  align[0] = align[1] = Align::left;
  if (options.wide) align.back() = Align::left;
  TextTable table(headers, align);
  int same = 0, differ = 0, across = 0;
  std::vector<double> ratios;
  std::vector<std::string> no_common_rank, notes;
  for (const json& run : cmp["runs"]) {
    const json& ranks = run["ranks"];
    const std::string label = cells::text(cells::at(run, {"label"}));
    if (ranks.empty()) {  // emulated runs that each played a different rank
      no_common_rank.push_back(label);
      continue;
    }
    const bool agree = std::all_of(ranks.begin(), ranks.end(), [](const json& r) { return r["differs"].empty(); });
    ++(agree ? same : differ);
    if (const json* a = cells::at(run, {"across_settings"}); a && a->is_boolean() && a->get<bool>()) ++across;
    // A step lasts as long as its slowest rank.
    double base_step = -1.0, new_step = -1.0;
    for (const json& r : ranks) {
      base_step = std::max(base_step, step_of(r, "base"));
      new_step = std::max(new_step, step_of(r, "new"));
    }
    if (base_step > 0.0 && new_step >= 0.0) ratios.push_back(new_step / base_step);
    const std::vector<RankGroup> groups = rank_groups(ranks);
    for (const RankGroup& g : groups) {
      const json& r = ranks[g.first];
      std::string who = cells::text(cells::at(r, {"rank"}));
      if (groups.size() == 1 && ranks.size() > 1) who = "all";
      else if (g.last > g.first) who += "-" + cells::text(cells::at(ranks[g.last], {"rank"}));
      double b = -1.0, n = -1.0;
      for (std::size_t i = g.first; i <= g.last; ++i) {
        b = std::max(b, step_of(ranks[i], "base"));
        n = std::max(n, step_of(ranks[i], "new"));
      }
      const std::string differs = differences_text(r, options);
      std::vector<std::string> row = {label, who, cells::bytes(cells::at(r, {"base", "resting"}), options)};
      if (options.wide) {
        row.insert(row.end(), {delta(r, "resting", options), cells::bytes(cells::at(r, {"base", "peak"}), options),
                               delta(r, "peak", options)});
      } else {
        row.insert(row.end(), {new_bytes(r, "resting", options), cells::bytes(cells::at(r, {"base", "peak"}), options),
                               new_bytes(r, "peak", options)});
      }
      row.insert(row.end(), {ms(b), ms(n), ratio(b, n)});
      if (options.wide) row.push_back(differs.empty() ? "-" : differs);
      else if (!differs.empty()) notes.push_back(label + ", " + (who == "all" ? "every rank" : "rank " + who) + ": " + differs);
      table.add_row(std::move(row));
    }
  }
  if (!table.empty()) table.print(os, 2);
  else if (cmp["runs"].empty()) os << "no configuration is in both files\n";
  else os << "no rank or stage is in both files\n";
  if (!notes.empty()) {
    os << "\n  what differs (new - base):\n";
    for (const std::string& note : notes) print_wrapped(note, 118, os);
  }
  os << '\n';
  for (const std::string& label : no_common_rank) os << "  in both, no rank or stage in common: " << label << '\n';
  for (const auto& [field, which] : {std::pair{"only_in_base", "base"}, std::pair{"only_in_new", "new"}})
    for (const json& label : cmp[field]) os << "  only in " << which << ": " << label.get<std::string>() << '\n';
  std::string summary = "configurations compared: " + std::to_string(same + differ) + "; bytes identical in " +
                        std::to_string(same) + ", different in " + std::to_string(differ);
  if (across > 0) summary += "; " + std::to_string(across) + " of them across settings";
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    const double mid = ratios.size() % 2 ? ratios[ratios.size() / 2]
                                         : 0.5 * (ratios[ratios.size() / 2 - 1] + ratios[ratios.size() / 2]);
    char buf[96];
    std::snprintf(buf, sizeof buf, "step time new/base: median %.3f (%.3f to %.3f)", mid, ratios.front(),
                  ratios.back());
    summary += (summary.size() + 2 + std::strlen(buf) > 120 ? ";\n" : "; ") + std::string(buf);
  }
  os << summary << '\n';
  if (!table.empty() && !options.wide) os << "\"=\": the new figure equals the base one.\n";
  if (!table.empty()) os << bytes_footnote(options, false);
}

}  // namespace shardscope
