#include "harness/cli/child_process.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <thread>

#include "shardscope/check.hpp"

extern char** environ;

namespace shardscope {
namespace {

// The signals a sweep turns into "stop the job, write what completed, exit 3".
constexpr int kInterrupts[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

volatile std::sig_atomic_t g_interrupt = 0;  // the first signal received; 0 when none
int g_guard_depth = 0;
struct sigaction g_old_actions[std::size(kInterrupts)];

void on_interrupt(int sig) {
  if (g_interrupt == 0) g_interrupt = sig;
}

std::vector<std::string> child_environment(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
  for (const std::string& kv : extra) {
    const std::string name = kv.substr(0, kv.find('=') + 1);
    bool present = false;
    for (const std::string& have : env) present = present || have.compare(0, name.size(), name) == 0;
    if (!present) env.push_back(kv);
  }
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// SIGTERM to the group, then SIGKILL after a grace period; reaps `pid`.
int terminate_group(pid_t pid) {
  ::kill(-pid, SIGTERM);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < deadline) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      ::kill(-pid, SIGKILL);  // ranks mpirun left behind
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(-pid, SIGKILL);
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Passes errno to the parent through `report` and exits 127 (async-signal-safe).
[[noreturn]] void child_fail(int report) {
  const int e = errno;
  (void)!::write(report, &e, sizeof e);
  ::_exit(127);
}

// The child's side of spawn(), between fork and exec: only async-signal-safe calls.
// Every signal is blocked on entry (`old_mask` is the sweep's own mask), so none can
// reach the sweep's handlers here; a SIGTERM from the parent's death stays pending until
// the mask is restored just before exec, and then ends the child.
[[noreturn]] void become_child(char* const argv[], char* const envp[], const char* out, const char* err, int report,
                               pid_t parent, const sigset_t* old_mask) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : kInterrupts) ::sigaction(sig, &dfl, nullptr);
  ::sigaction(SIGPIPE, &dfl, nullptr);  // the sweep ignores it
  // Ends with the sweep, however the sweep ends (even SIGKILL, which it cannot catch):
  // mpirun passes SIGTERM on to its ranks, a lone rank stops on it.
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) child_fail(report);
  if (::getppid() != parent) ::_exit(127);        // the sweep died before prctl took hold
  if (::setpgid(0, 0) != 0) child_fail(report);   // a new group led by the child
  // Opened close-on-exec: dup2 gives 0, 1 and 2 without the flag, the originals go.
  const int in = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int o = ::open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int e = ::open(err, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (in < 0 || o < 0 || e < 0) child_fail(report);
  if (::dup2(in, STDIN_FILENO) < 0 || ::dup2(o, STDOUT_FILENO) < 0 || ::dup2(e, STDERR_FILENO) < 0) child_fail(report);
  ::sigprocmask(SIG_SETMASK, old_mask, nullptr);
  ::execve(argv[0], argv, envp);
  child_fail(report);
}

// Starts argv[0] with `envp`, stdin from /dev/null, stdout and stderr to the files, in
// a process group of its own, and set to get SIGTERM when this process dies. Returns its
// pid; throws RunError when it cannot be started (the child's errno, passed back through
// a close-on-exec pipe, which exec closes on success).
pid_t spawn(std::vector<char*>& argv, std::vector<char*>& envp, const std::string& out, const std::string& err) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw RunError(std::string("pipe: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  // As glibc's posix_spawn does: no signal is delivered between fork and the child's
  // reset of its handlers (see become_child).
  sigset_t all, old_mask;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old_mask);
  const pid_t pid = ::fork();
  if (pid == 0) become_child(argv.data(), envp.data(), out.c_str(), err.c_str(), report[1], parent, &old_mask);
  const int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (pid < 0) {
    ::close(report[0]);
    ::close(report[1]);
    throw RunError("cannot start '" + std::string(argv[0]) + "': fork: " + std::strerror(fork_errno));
  }
  ::close(report[1]);
  int child_errno = 0;
  ssize_t n = 0;
  while ((n = ::read(report[0], &child_errno, sizeof child_errno)) < 0 && errno == EINTR) {
  }
  ::close(report[0]);
  if (n > 0) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    throw RunError("cannot start '" + std::string(argv[0]) + "': " + std::strerror(child_errno));
  }
  return pid;
}

}  // namespace

InterruptGuard::InterruptGuard() {
  if (g_guard_depth++ > 0) return;
  outermost_ = true;
  g_interrupt = 0;
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  for (int sig : kInterrupts) sigaddset(&sa.sa_mask, sig);
  sa.sa_flags = SA_RESTART;  // a result file being written is not cut short by EINTR
  for (std::size_t i = 0; i < std::size(kInterrupts); ++i) sigaction(kInterrupts[i], &sa, &g_old_actions[i]);
}

InterruptGuard::~InterruptGuard() {
  --g_guard_depth;
  if (!outermost_) return;
  for (std::size_t i = 0; i < std::size(kInterrupts); ++i) sigaction(kInterrupts[i], &g_old_actions[i], nullptr);
}

int InterruptGuard::received() { return g_interrupt; }

ChildResult run_child(const ChildSpec& spec) {
  if (spec.argv.empty()) throw RunError("run_child: empty command");
  const InterruptGuard guard;
  if (g_interrupt != 0) {  // stopped before this job began: do not start it
    ChildResult stopped;
    stopped.end = ChildResult::End::interrupted;
    stopped.signal = g_interrupt;
    return stopped;
  }
  std::vector<std::string> argv = spec.argv;
  std::vector<std::string> env = child_environment(spec.extra_env);
  std::vector<char*> c_argv = c_strings(argv);
  std::vector<char*> c_env = c_strings(env);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = spawn(c_argv, c_env, spec.stdout_path, spec.stderr_path);
  ChildResult result;
  const auto deadline =
      start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(spec.timeout_s));
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) {
      ::kill(-pid, SIGKILL);  // whatever the child left running in its group
      break;
    }
    if (done < 0 && errno != EINTR) throw RunError(std::string("waitpid: ") + std::strerror(errno));
    if (g_interrupt != 0 || std::chrono::steady_clock::now() >= deadline) {
      result.end = g_interrupt != 0 ? ChildResult::End::interrupted : ChildResult::End::timed_out;
      result.signal = g_interrupt;
      terminate_group(pid);
      result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return result;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) {
    result.end = ChildResult::End::exited;
    result.code = WEXITSTATUS(status);
  } else {
    result.end = ChildResult::End::signaled;
    result.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  }
  return result;
}

std::string describe(const ChildResult& r, int timeout_s) {
  switch (r.end) {
    case ChildResult::End::exited:
      return "exited with code " + std::to_string(r.code);
    case ChildResult::End::signaled:
      return "killed by " + signal_text(r.signal);
    case ChildResult::End::timed_out:
      return "timed out after " + std::to_string(timeout_s) + " s";
    case ChildResult::End::interrupted:
      return r.signal > 0 ? "interrupted by " + interrupt_text(r.signal) : "interrupted";
  }
  return "ended";
}

std::string signal_text(int signal) {
  const char* name = strsignal(signal);
  return "signal " + std::to_string(signal) + (name ? std::string(" (") + name + ")" : "");
}

const char* interrupt_name(int signal) noexcept {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    default: return nullptr;
  }
}

std::string interrupt_text(int signal) {
  const char* name = interrupt_name(signal);
  return name != nullptr ? name : signal_text(signal);
}

std::string find_executable(const std::string& name) {
  auto executable = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) return executable(name) ? name : std::string();
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t colon = dirs.find(':', start);
    if (colon == std::string::npos) colon = dirs.size();
    std::string dir = dirs.substr(start, colon - start);
    if (dir.empty()) dir = ".";
    if (executable(dir + "/" + name)) return dir + "/" + name;
    start = colon + 1;
  }
  return {};
}

}  // namespace shardscope
