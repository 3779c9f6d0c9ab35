#include "harness/cli/job_errors.hpp"

#include <regex>
#include <sstream>
#include <vector>

namespace shardscope {
namespace {

constexpr const char* kPrefix = "shardscope: error: ";

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// "rank 3: rest" -> 3 and "rest"; -1 otherwise.
int leading_rank(const std::string& text, std::string* rest) {
  static const std::regex re(R"(^rank (\d+): (.*)$)");
  std::smatch m;
  if (!std::regex_match(text, m, re)) return -1;
  *rest = m[2];
  return std::stoi(m[1]);
}

// mpirun's own account of the failure, e.g. "exited on signal 9 (Killed)".
std::string mpirun_account(const std::string& stderr_text) {
  static const std::regex signal_re(R"(process rank \d+ with PID \d+ on node \S+ (exited on signal [^.]*))");
  static const std::regex code_re(R"(Exit code:\s*(\d+))");
  static const std::regex abort_re(R"(MPI_ABORT was invoked on rank \d+)");
  std::smatch m;
  if (std::regex_search(stderr_text, m, signal_re)) return m[1];
  if (std::regex_search(stderr_text, m, abort_re)) return "called MPI_Abort";
  if (std::regex_search(stderr_text, m, code_re)) return "exited with code " + std::string(m[1]);
  return {};
}

// Whether a line says something (is not blank or a rule of dashes).
bool says_something(const std::string& trimmed) {
  return !trimmed.empty() && trimmed.find_first_not_of("-=*") != std::string::npos;
}

// The last line that says something.
std::string last_line(const std::string& stderr_text) {
  const std::vector<std::string> lines = lines_of(stderr_text);
  for (auto it = lines.rbegin(); it != lines.rend(); ++it)
    if (const std::string t = trim(*it); says_something(t)) return t;
  return {};
}

// The first line that says something: mpirun's errors open with the cause ("There are
// not enough slots available ...") and end with advice.
std::string first_line(const std::string& stderr_text) {
  for (const std::string& line : lines_of(stderr_text))
    if (const std::string t = trim(line); says_something(t)) return t;
  return {};
}

}  // namespace

std::string shardscope_error_text(const std::string& stderr_text) {
  std::string found;
  for (const std::string& line : lines_of(stderr_text)) {
    const std::size_t at = line.find(kPrefix);
    if (at != std::string::npos) found = trim(line.substr(at + std::char_traits<char>::length(kPrefix)));
  }
  return found;
}

int failed_rank(const std::string& stderr_text) {
  static const std::vector<std::regex> patterns = {
      std::regex(R"(process rank (\d+) with PID)"),
      std::regex(R"(MPI_ABORT was invoked on rank (\d+))"),
      std::regex(R"(Process name:\s*\[\[\d+,\d+\],(\d+)\])"),
      std::regex(R"(shardscope: error: rank (\d+): )"),
  };
  for (const std::regex& re : patterns) {
    std::smatch m;
    if (std::regex_search(stderr_text, m, re)) return std::stoi(m[1]);
  }
  return -1;
}

std::string failure_message(const std::string& stderr_text, const std::string& label, int known_rank,
                            const std::string& how) {
  std::string what = shardscope_error_text(stderr_text);
  // A rank that says it was interrupted was told to stop (mpirun's SIGTERM once another
  // rank died): when mpirun names what happened, that is the cause, not this.
  if (what.find(": interrupted by SIG") != std::string::npos && !mpirun_account(stderr_text).empty()) what.clear();
  int rank = known_rank;
  std::string rest;
  if (const int own = leading_rank(what, &rest); own >= 0) {
    what = rest;  // the job named its rank itself
    if (rank < 0) rank = own;
  }
  if (rank < 0) rank = failed_rank(stderr_text);
  if (what.empty()) what = mpirun_account(stderr_text);
  if (what.empty()) what = last_line(stderr_text);
  if (what.empty()) what = how;
  return rank >= 0 ? "rank " + std::to_string(rank) + ": " + what + " (" + label + ")" : label + ": " + what;
}

std::string launcher_failure_message(const std::string& stderr_text, const std::string& label,
                                     const std::string& how) {
  const std::string said = first_line(stderr_text);
  return label + ": mpirun " + how + " (no rank reported an error)" + (said.empty() ? "" : ": \"" + said + "\"");
}

}  // namespace shardscope
