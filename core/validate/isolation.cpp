#include "core/validate/isolation.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "core/common/proc.h"
#include "core/common/signal_name.h"
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace backhaul::validate {
namespace {

using Clock = std::chrono::steady_clock;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

constexpr size_t kStderrKeep = 8 * 1024;
constexpr std::chrono::milliseconds kWatchTick{10};
constexpr size_t kActivityBytes = 256;
constexpr char kTagReturned = 'R';
constexpr char kTagThrew = 'E';

[[noreturn]] void throw_errno(const char* what) {
  throw std::system_error(errno, std::generic_category(), what);
}

// --- child side ---------------------------------------------------------------------------------

// Set in the child only: a page shared with the parent (MAP_SHARED before fork), which survives
// the child's death, unlike anything the child could send through the pipe.
char* g_activity = nullptr;

bool write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Frame: tag byte, 8-byte length (host order: the reader is our own parent), payload. The length
// lets the parent tell a complete result from one cut short by a crash mid-write.
void write_frame(int fd, char tag, const std::string& payload) {
  uint64_t size = payload.size();
  char header[1 + sizeof size];
  header[0] = tag;
  std::memcpy(header + 1, &size, sizeof size);
  if (write_all(fd, header, sizeof header)) write_all(fd, payload.data(), payload.size());
}

void apply_limits(const ChildLimits& limits) {
  rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  // A backstop for the parent's deadline: CPU time cannot exceed wall time times the cores, so
  // this only fires if the parent is gone (PR_SET_PDEATHSIG normally covers that too).
  const rlim_t cores = std::max(1u, std::thread::hardware_concurrency());
  const rlim_t cpu_s = static_cast<rlim_t>(limits.timeout.count() / 1000 + 2) * cores;
  rlimit cpu{cpu_s, cpu_s + 1};
  setrlimit(RLIMIT_CPU, &cpu);
  // Rationale: under ASan the shadow memory is already mapped (NORESERVE, but it counts towards
  // RLIMIT_AS), so any limit would make every allocation fail. The parent's RSS watchdog is the
  // memory limit there.
  if (limits.memory_bytes > 0 && !kAddressSanitizer) {
    rlimit as{limits.memory_bytes, limits.memory_bytes};
    setrlimit(RLIMIT_AS, &as);
  }
}

void redirect_stdio(int err_fd) {
  int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(null_fd, STDOUT_FILENO);
    ::close(null_fd);
  }
  ::dup2(err_fd, STDERR_FILENO);
}

[[noreturn]] void child_main(int result_fd, int err_fd, const std::function<std::string()>& body,
                             const ChildLimits& limits) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  redirect_stdio(err_fd);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS, SIGPIPE}) {
    ::signal(s, SIG_DFL);
  }
  apply_limits(limits);
  char tag = kTagReturned;
  std::string out;
  try {
    out = body();
  } catch (const std::exception& e) {
    tag = kTagThrew;
    out = e.what();
  } catch (...) {
    tag = kTagThrew;
    out = "unknown exception";
  }
  write_frame(result_fd, tag, out);
  ::_exit(0);
}

// --- parent side --------------------------------------------------------------------------------

// Reads whatever is available; returns false at EOF or on error.
bool drain(int fd, std::string& into) {
  char buffer[64 * 1024];
  ssize_t n = ::read(fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) return false;
  into.append(buffer, static_cast<size_t>(n));
  return true;
}

struct Watch {
  pid_t pid;
  int result_fd;
  int err_fd;
  std::string result;
  std::string err;
  bool result_open = true;
  bool err_open = true;
  bool exited = false;
  bool timed_out = false;
  bool memory_exceeded = false;
  int left = 0;  // processes the child left running out of its group, killed
  int status = 0;
  rusage usage{};
};

// A process the child started, in a session of its own (setsid()), is out of the group the
// supervisor kills, and may hold the child's pipes for as long as it lives. Long enough after the
// child's end for the kernel to have closed the child's own ends.
constexpr std::chrono::milliseconds kHeldPipesGrace{500};
// Rounds of kill_orphans(): each finds the orphans of the processes the round before killed. A
// process that forks faster than it is killed cannot keep the validator here for ever.
constexpr int kMaxOrphanRounds = 100;

// Makes this process the child subreaper of what it forks while the object lives (unless it was
// one already), so that a process the child leaves behind, whatever it did to leave the child's
// group and session and to drop its descriptors, becomes this process's child when its parent
// ends, where kill_orphans() finds it.
class SubreaperScope {
 public:
  SubreaperScope() {
    int was = 0;
    if (::prctl(PR_GET_CHILD_SUBREAPER, &was) == 0 && was == 0)
      set_ = ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
  }
  ~SubreaperScope() {
    if (set_) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  }
  SubreaperScope(const SubreaperScope&) = delete;
  SubreaperScope& operator=(const SubreaperScope&) = delete;

 private:
  bool set_ = false;
};

// After the child was reaped: kills, by PID, and reaps every child of this process that is not
// one of `ours` (its children before the fork): the processes the child left behind, handed to
// this subreaper as their parents ended. Returns how many of them were running out of process
// group `group`; the group's own members were killed with it and are reaped here uncounted, as is
// one that had already ended by itself. A killed process's children become ours as it ends, so
// rounds go on until one finds none.
int kill_orphans(pid_t group, const std::set<pid_t>& ours) {
  int escaped = 0;
  // One this process may not signal (it ran a set-user-ID program), or that will not end: counted,
  // and left, rather than waited for without end.
  std::set<pid_t> left;
  for (int round = 0; round < kMaxOrphanRounds; ++round) {
    std::vector<pid_t> orphans;
    for (pid_t pid : child_pids(::getpid())) {
      if (!ours.count(pid) && !left.count(pid)) orphans.push_back(pid);
    }
    if (orphans.empty()) break;
    std::vector<pid_t> killed;
    for (pid_t pid : orphans) {
      // A child's PID is not reused before it is reaped: the kill reaches the process counted.
      const std::optional<ProcStat> stat = read_proc_stat(pid);
      const bool running = stat && stat->state != 'Z' && stat->state != 'X';
      const bool in_group = ::getpgid(pid) == group;
      if (running && !in_group) ++escaped;
      if (::kill(pid, SIGKILL) == 0 || !running) {
        killed.push_back(pid);
      } else {
        if (in_group) ++escaped;  // not counted above: it is left running
        left.insert(pid);
      }
    }
    // Up to 2 s a round for the killed to end (one in uninterruptible sleep may take longer);
    // their own children are handed to this process as they end, for the next round to find.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    for (pid_t pid : killed) {
      for (;;) {
        const pid_t reaped = ::waitpid(pid, nullptr, WNOHANG);
        if (reaped == pid || (reaped < 0 && errno != EINTR)) break;
        if (std::chrono::steady_clock::now() >= give_up) {
          left.insert(pid);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }
  return escaped;
}

// Notices that the child ended without reaping it: a zombie keeps its pid (and so its process
// group id) from being reused, which makes the kill of the group after it safe.
bool has_exited(Watch& w) {
  if (w.exited) return true;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(w.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
      info.si_pid == w.pid) {
    w.exited = true;
  }
  return w.exited;
}

void poll_pipes(Watch& w, std::chrono::milliseconds wait) {
  pollfd fds[2];
  nfds_t n = 0;
  if (w.result_open) fds[n++] = {w.result_fd, POLLIN, 0};
  if (w.err_open) fds[n++] = {w.err_fd, POLLIN, 0};
  if (n == 0) {
    std::this_thread::sleep_for(std::min(wait, std::chrono::milliseconds(2)));
    return;
  }
  if (::poll(fds, n, static_cast<int>(wait.count())) <= 0) return;
  for (nfds_t i = 0; i < n; ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    const bool is_result = fds[i].fd == w.result_fd;
    if (!drain(fds[i].fd, is_result ? w.result : w.err)) {
      (is_result ? w.result_open : w.err_open) = false;
    }
  }
  if (w.err.size() > 2 * kStderrKeep) w.err.erase(0, w.err.size() - kStderrKeep);
}

// Reads the pipes until the child has ended and both are at EOF, or until the deadline, or until
// the child outgrows the memory limit. Then kills the child's process group (a grandchild may
// still hold the pipes) and reaps the child, then kills and reaps what the child left behind out
// of its group (kill_orphans). Pipes still open kHeldPipesGrace after the child ended are held by
// such a process: not waited for (every check would take the whole timeout).
void supervise(Watch& w, const ChildLimits& limits, const std::set<pid_t>& ours) {
  const auto deadline = Clock::now() + limits.timeout;
  const int64_t limit_kb = static_cast<int64_t>(limits.memory_bytes / 1024);
  std::optional<Clock::time_point> ended;
  while (true) {
    const auto now = Clock::now();
    if (has_exited(w)) {
      if (!w.result_open && !w.err_open) break;
      if (!ended) ended = now;
      // Still open: held by a process the child started, which kill_orphans() ends.
      if (now - *ended >= kHeldPipesGrace || now >= deadline) break;
      poll_pipes(w, kWatchTick);
      continue;
    }
    if (now >= deadline) {
      w.timed_out = true;
      break;
    }
    if (limit_kb > 0 && resident_kb(w.pid) > limit_kb) {
      w.memory_exceeded = true;
      break;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
    poll_pipes(w, std::clamp(left, std::chrono::milliseconds(1), kWatchTick));
  }
  ::kill(-w.pid, SIGKILL);
  ::kill(w.pid, SIGKILL);
  pid_t r;
  do {
    r = ::wait4(w.pid, &w.status, 0, &w.usage);
  } while (r < 0 && errno == EINTR);
  w.left = kill_orphans(w.pid, ours);
}

// Splits the result frame; false when it is incomplete.
bool parse_frame(const std::string& data, char& tag, std::string& payload) {
  uint64_t size = 0;
  if (data.size() < 1 + sizeof size) return false;
  std::memcpy(&size, data.data() + 1, sizeof size);
  if (data.size() - 1 - sizeof size != size) return false;
  tag = data[0];
  payload = data.substr(1 + sizeof size);
  return true;
}

ChildOutcome classify(Watch& w, const char* activity) {
  ChildOutcome out;
  out.activity.assign(activity, strnlen(activity, kActivityBytes));
  out.peak_rss_kb = w.usage.ru_maxrss;
  out.stderr_tail = w.err.size() > kStderrKeep ? w.err.substr(w.err.size() - kStderrKeep) : w.err;
  char tag = 0;
  std::string payload;
  if (w.timed_out) {
    out.end = ChildEnd::kTimedOut;
  } else if (w.left > 0) {
    out.end = ChildEnd::kLeftProcesses;
    out.left_processes = w.left;
  } else if (w.memory_exceeded) {
    out.end = ChildEnd::kMemoryExceeded;
  } else if (parse_frame(w.result, tag, payload)) {
    out.end = tag == kTagReturned ? ChildEnd::kReturned : ChildEnd::kThrew;
    out.payload = std::move(payload);
  } else if (WIFSIGNALED(w.status)) {
    out.end = ChildEnd::kSignaled;
    out.signal = WTERMSIG(w.status);
  } else {
    out.end = ChildEnd::kExited;
    out.exit_code = WIFEXITED(w.status) ? WEXITSTATUS(w.status) : -1;
  }
  return out;
}

bool contains(const std::string& text, const char* needle) {
  return text.find(needle) != std::string::npos;
}

std::string clip(std::string text, size_t max) {
  if (text.size() > max) text = text.substr(0, max) + "...";
  return text;
}

// The stderr line that explains a crash best: a sanitizer summary, std::terminate's message, or
// (when `fallback_last`) the last non-empty line.
std::string notable_line(const std::string& tail, bool fallback_last) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < tail.size()) {
    size_t end = tail.find('\n', start);
    if (end == std::string::npos) end = tail.size();
    std::string line = tail.substr(start, end - start);
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);
    start = end + 1;
  }
  for (const char* key :
       {"SUMMARY: ", "ERROR: AddressSanitizer", "runtime error:", "terminate called", "what():"}) {
    for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
      if (!contains(*it, key)) continue;
      std::string text = *it;
      // std::terminate prints the type on one line and what() on the next: keep both.
      if (contains(text, "terminate called") && it != lines.rbegin() &&
          contains(*(it - 1), "what():"))
        text += " " + *(it - 1);
      return clip(text, 300);
    }
  }
  if (fallback_last && !lines.empty()) return clip(lines.back(), 300);
  return {};
}

std::string with_stderr(std::string text, const std::string& line) {
  if (!line.empty()) text += "; stderr: " + line;
  return text;
}

std::string where(const std::string& activity) {
  return activity.empty() ? std::string() : " " + activity;
}

}  // namespace

std::string ChildOutcome::describe(const ChildLimits& limits) const {
  const int64_t limit_mb = static_cast<int64_t>(limits.memory_bytes >> 20);
  switch (end) {
    case ChildEnd::kReturned:
      return {};
    case ChildEnd::kThrew:
      return payload;
    case ChildEnd::kTimedOut:
      return "timed out after " + std::to_string(limits.timeout.count()) + " ms" + where(activity) +
             " and was killed (endless loop or blocking call in plugin code?)";
    case ChildEnd::kMemoryExceeded:
      return "exceeded the memory limit of " + std::to_string(limit_mb) + " MB" + where(activity) +
             " and was killed (unbounded allocation in plugin code?)";
    case ChildEnd::kLeftProcesses:
      return "left " + std::to_string(left_processes) +
             " process(es) running after it ended, out of its process group (setsid() in plugin "
             "code?); killed. Plugin code must not leave processes behind";
    case ChildEnd::kExited:
      return with_stderr("exited with status " + std::to_string(exit_code) + where(activity) +
                             " before the check finished (exit() called in plugin code, or a "
                             "sanitizer report)",
                         notable_line(stderr_tail, true));
    case ChildEnd::kSignaled: {
      std::string text = "killed by " + signal_description(signal) + where(activity);
      if (signal == SIGXCPU) text += ": CPU time limit reached";
      if (limits.memory_bytes > 0 &&
          peak_rss_kb * 1024 >= static_cast<int64_t>(limits.memory_bytes) * 9 / 10) {
        text += " after using " + std::to_string(peak_rss_kb / 1024) + " MB of the " +
                std::to_string(limit_mb) + " MB memory limit (out of memory?)";
      }
      return with_stderr(text, notable_line(stderr_tail, false));
    }
  }
  return "unknown child outcome";
}

void note_activity(const char* what) noexcept {
  if (!g_activity) return;
  // Threads of one child (the concurrency checks) take turns; the last note wins.
  static std::atomic_flag busy = ATOMIC_FLAG_INIT;
  while (busy.test_and_set(std::memory_order_acquire)) {
  }
  std::strncpy(g_activity, what, kActivityBytes - 1);
  g_activity[kActivityBytes - 1] = '\0';
  busy.clear(std::memory_order_release);
}

ChildOutcome run_in_child(const std::function<std::string()>& body, const ChildLimits& limits) {
  void* shared =
      ::mmap(nullptr, kActivityBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) throw_errno("mmap");
  // Unmapped on every way out of this function.
  std::unique_ptr<void, void (*)(void*)> unmap(shared,
                                               [](void* p) { ::munmap(p, kActivityBytes); });
  auto* activity = static_cast<char*>(shared);
  activity[0] = '\0';
  int result_pipe[2];
  int err_pipe[2];
  if (::pipe2(result_pipe, O_CLOEXEC) != 0) throw_errno("pipe");
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    int saved = errno;
    ::close(result_pipe[0]);
    ::close(result_pipe[1]);
    errno = saved;
    throw_errno("pipe");
  }
  // Buffered output would otherwise be written twice if plugin code calls exit() in the child.
  std::fflush(nullptr);
  // [main-thread]: nothing else forks while the child runs, so every child of this process but
  // these and the child itself is one the child left behind.
  const std::vector<pid_t> before = child_pids(::getpid());
  const std::set<pid_t> ours(before.begin(), before.end());
  const SubreaperScope subreaper;
  const auto started = Clock::now();
  pid_t pid = ::fork();
  if (pid < 0) {
    int saved = errno;
    for (int fd : {result_pipe[0], result_pipe[1], err_pipe[0], err_pipe[1]}) ::close(fd);
    errno = saved;
    throw_errno("fork");
  }
  if (pid == 0) {
    g_activity = activity;
    ::close(result_pipe[0]);
    ::close(err_pipe[0]);
    child_main(result_pipe[1], err_pipe[1], body, limits);
  }
  ::setpgid(pid, pid);  // also done by the child; whichever runs first closes the race
  ::close(result_pipe[1]);
  ::close(err_pipe[1]);
  Watch w{pid, result_pipe[0], err_pipe[0], {}, {}};
  supervise(w, limits, ours);
  ::close(result_pipe[0]);
  ::close(err_pipe[0]);
  ChildOutcome out = classify(w, activity);
  out.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  return out;
}

}  // namespace backhaul::validate
