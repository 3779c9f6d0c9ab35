// `shardscope compare`'s table: a row per range of consecutive ranks (or stages) that hold
// the same bytes in both documents and differ alike ("all" when one row covers every
// rank; step time of the range's slowest rank); then, in a compact table, what differs
// under it; the configurations only one document holds, and a summary. With no row to
// show, a line says so instead of a header over nothing.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "harness/report/cells.hpp"
#include "harness/report/comparison.hpp"
#include "harness/report/table.hpp"
#include "harness/report/text_table.hpp"

namespace shardscope {
namespace {

// A difference with its sign, as `options` write bytes: "+32.0 KiB", "+32,768".
std::string signed_bytes(std::int64_t n, const TableOptions& options) {
  return options.exact_bytes ? cells::signed_digits(n) : (n >= 0 ? "+" : "") + cells::binary_bytes(n);
}

std::string bytes(const std::optional<std::int64_t>& v, const TableOptions& options) {
  return v ? cells::bytes(*v, options) : cells::kMissing;
}

std::string delta(const std::optional<std::int64_t>& a, const std::optional<std::int64_t>& b,
                  const TableOptions& options) {
  if (!a || !b) return cells::kMissing;
  return *a == *b ? "=" : signed_bytes(*b - *a, options);
}

// The new figure beside the base one: "=" when they are equal.
std::string new_bytes(const std::optional<std::int64_t>& a, const std::optional<std::int64_t>& b,
                      const TableOptions& options) {
  if (a && b && *a == *b) return cells::kSame;
  return bytes(b, options);
}

// What differs in a rank, as `options` write bytes: "peak temp +32.0 KiB; peak +32.0 KiB"
// (exact: "+32,768 B", the rank's own words).
std::string differences_text(const ComparedRank& rank, const TableOptions& options) {
  std::string out;
  if (options.exact_bytes || rank.differences.size() != rank.differs.size()) {
    for (const std::string& d : rank.differs) out += (out.empty() ? "" : "; ") + d;
    return out;
  }
  for (const FigureDifference& d : rank.differences) {
    const std::string item = d.count ? d.what + " " + std::to_string(d.base) + " -> " + std::to_string(d.fresh)
                                     : d.what + " " + signed_bytes(d.fresh - d.base, options);
    out += (out.empty() ? "" : "; ") + item;
  }
  return out;
}

double step_of(const ComparedSide& side) { return side.step_ms ? *side.step_ms : -1.0; }

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

std::vector<RankGroup> rank_groups(const std::vector<ComparedRank>& ranks) {
  auto same = [](const ComparedRank& a, const ComparedRank& b) {
    return a.base.resting == b.base.resting && a.base.peak == b.base.peak && a.fresh.resting == b.fresh.resting &&
           a.fresh.peak == b.fresh.peak && a.differs == b.differs;
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

std::string text(const std::optional<std::string>& v) { return v ? *v : cells::kMissing; }

std::string source_line(const ComparedFile& file) {
  std::string line = file.path + " (backend " + text(file.backend) + ", comm " + text(file.comm);
  if (file.emulated && *file.emulated) line += ", emulated";
  line += ", git " + text(file.git) + ", host " + text(file.host) + ")";
  return line;
}

}  // namespace

void print_comparison(const Comparison& cmp, std::ostream& os, const TableOptions& options) {
  os << "base: " << source_line(cmp.base) << "\nnew:  " << source_line(cmp.fresh) << "\n\n";
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
  for (const ComparedRun& run : cmp.runs) {
    const std::vector<ComparedRank>& ranks = run.ranks;
    const std::string& label = run.label;
    if (ranks.empty()) {  // emulated runs that each played a different rank
      no_common_rank.push_back(label);
      continue;
    }
    const bool agree = std::all_of(ranks.begin(), ranks.end(), [](const ComparedRank& r) { return r.differs.empty(); });
    ++(agree ? same : differ);
    if (run.across_settings) ++across;
    // A step lasts as long as its slowest rank.
    double base_step = -1.0, new_step = -1.0;
    for (const ComparedRank& r : ranks) {
      base_step = std::max(base_step, step_of(r.base));
      new_step = std::max(new_step, step_of(r.fresh));
    }
    if (base_step > 0.0 && new_step >= 0.0) ratios.push_back(new_step / base_step);
    const std::vector<RankGroup> groups = rank_groups(ranks);
    for (const RankGroup& g : groups) {
      const ComparedRank& r = ranks[g.first];
      std::string who = std::to_string(r.rank);
      if (groups.size() == 1 && ranks.size() > 1) who = "all";
      else if (g.last > g.first) who += "-" + std::to_string(ranks[g.last].rank);
      double b = -1.0, n = -1.0;
      for (std::size_t i = g.first; i <= g.last; ++i) {
        b = std::max(b, step_of(ranks[i].base));
        n = std::max(n, step_of(ranks[i].fresh));
      }
      const std::string differs = differences_text(r, options);
      std::vector<std::string> row = {label, who, bytes(r.base.resting, options)};
      if (options.wide) {
        row.insert(row.end(), {delta(r.base.resting, r.fresh.resting, options), bytes(r.base.peak, options),
                               delta(r.base.peak, r.fresh.peak, options)});
      } else {
        row.insert(row.end(), {new_bytes(r.base.resting, r.fresh.resting, options), bytes(r.base.peak, options),
                               new_bytes(r.base.peak, r.fresh.peak, options)});
      }
      row.insert(row.end(), {ms(b), ms(n), ratio(b, n)});
      if (options.wide) row.push_back(differs.empty() ? "-" : differs);
      else if (!differs.empty()) notes.push_back(label + ", " + (who == "all" ? "every rank" : "rank " + who) + ": " + differs);
      table.add_row(std::move(row));
    }
  }
  if (!table.empty()) table.print(os, 2);
  else if (cmp.runs.empty()) os << "no configuration is in both files\n";
  else os << "no rank or stage is in both files\n";
  if (!notes.empty()) {
    os << "\n  what differs (new - base):\n";
    for (const std::string& note : notes) print_wrapped(note, 118, os);
  }
  os << '\n';
  for (const std::string& label : no_common_rank) os << "  in both, no rank or stage in common: " << label << '\n';
  for (const std::string& label : cmp.only_in_base) os << "  only in base: " << label << '\n';
  for (const std::string& label : cmp.only_in_new) os << "  only in new: " << label << '\n';
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
    summary += (summary.size() + 2 + std::strlen(buf) > TableOptions::kColumns ? ";\n" : "; ") + std::string(buf);
  }
  os << summary << '\n';
  if (!table.empty() && !options.wide) os << "\"=\": the new figure equals the base one.\n";
  if (!table.empty()) os << bytes_footnote(options, false);
}

}  // namespace shardscope
