#include "harness/run/provenance.hpp"

#include <unistd.h>

#include <fstream>
#include <thread>

#if defined(SHARDSCOPE_WITH_MPI)
#include <mpi.h>
#endif

#if defined(SHARDSCOPE_WITH_BLAS)
extern "C" char* openblas_get_config(void);
#endif

#ifdef SHARDSCOPE_GIT_HEADER
#include "shardscope_git.hpp"  // generated at build time: SHARDSCOPE_GIT
#endif
#ifndef SHARDSCOPE_GIT
#define SHARDSCOPE_GIT "unknown"
#endif

namespace shardscope {
namespace {

std::optional<std::string> string_or_null(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return s;
}

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string blas_description() {
#if defined(SHARDSCOPE_WITH_BLAS)
  const char* config = openblas_get_config();
  return config ? trim(config) : std::string("OpenBLAS");
#else
  return "none (loops)";
#endif
}

std::optional<std::string> mpi_description() {
#if defined(SHARDSCOPE_WITH_MPI)
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(buf, &len) != MPI_SUCCESS) return "unknown MPI";
  // Open MPI counts the terminating NUL in `len`: stop at the first NUL.
  std::string text(buf, static_cast<std::size_t>(len > 0 ? len : 0));
  text = text.substr(0, text.find('\0'));
  return trim(text.substr(0, text.find('\n')));
#else
  return std::nullopt;
#endif
}

bool needs_quotes(const std::string& arg) {
  if (arg.empty()) return true;
  for (char c : arg) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       std::string("-_./:=,+@%").find(c) != std::string::npos;
    if (!plain) return true;
  }
  return false;
}

}  // namespace

// "AMD EPYC 7B13 (2 cores)": the first "model name" of /proc/cpuinfo (other
// architectures call it "Processor" or "cpu model"), then the logical core count.
std::string cpu_description() {
  std::string model;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; model.empty() && std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    if (key == "model name" || key == "Processor" || key == "cpu model")
      model = trim(line.substr(colon + 1));
  }
  if (model.empty()) model = "unknown cpu";
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores == 0) return model;
  return model + " (" + std::to_string(cores) + (cores == 1 ? " core)" : " cores)");
}

std::string build_commit() { return SHARDSCOPE_GIT; }

Provenance provenance(const std::string& command_line, const std::string& gpu, const std::string& cuda,
                      const std::string& nccl) {
  Provenance p;
  p.git = build_commit();
  p.command = command_line;
  p.host = host_name();
  p.cpu = cpu_description();
  // Logical cores of this host: the tables say when a job's ranks outnumber them.
  if (std::thread::hardware_concurrency() > 0) p.cores = std::thread::hardware_concurrency();
  p.gpu = string_or_null(gpu);
  p.blas = blas_description();
  p.mpi = mpi_description();
  p.nccl = string_or_null(nccl);
  p.cuda = string_or_null(cuda);
  return p;
}

std::string join_command_line(int argc, const char* const* argv) {
  std::string out;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i] ? argv[i] : "";
    if (i > 0) out += ' ';
    if (!needs_quotes(arg)) {
      out += arg;
      continue;
    }
    out += '\'';
    for (char c : arg) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
    out += '\'';
  }
  return out;
}

}  // namespace shardscope
