// Runs a function in a forked child process with a deadline and a memory limit, so that whatever
// plugin code does in there (crash, abort, exit(), endless loop, unbounded allocation) ends the
// child and never the caller. The function's result comes back through a pipe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <sys/types.h>

namespace backhaul::validate {

struct ChildLimits {
  // Wall-clock budget; the child (and its process group) is killed with SIGKILL when it runs out.
  std::chrono::milliseconds timeout{5000};
  // Address-space limit (RLIMIT_AS), or, in AddressSanitizer builds where RLIMIT_AS cannot work
  // (the shadow memory alone reserves terabytes of address space), a resident-set watchdog that
  // kills the child. 0 means no limit.
  uint64_t memory_bytes = uint64_t{2} << 30;
};

enum class ChildEnd {
  kReturned = 1,    // the function returned; `payload` holds its result
  kThrew,           // the function threw; `payload` holds what()
  kExited,          // the process exited before returning (exit() in plugin code, a sanitizer)
  kSignaled,        // killed by a signal it raised itself (SIGSEGV, SIGABRT, SIGXCPU, ...)
  kTimedOut,        // killed by us at the deadline
  kMemoryExceeded,  // killed by us when its resident set passed the limit
  kLeftProcesses,   // ended, but processes it started were still running out of its group
};

struct ChildOutcome {
  ChildEnd end = ChildEnd::kReturned;
  std::string payload;
  int exit_code = 0;        // kExited
  int signal = 0;           // kSignaled
  int left_processes = 0;   // kLeftProcesses: how many (each killed)
  std::string stderr_tail;  // the last few KB the child wrote to stderr
  std::string activity;     // the child's last note_activity(), e.g. "in fetch_page()"
  int64_t peak_rss_kb = 0;
  std::chrono::milliseconds elapsed{0};

  bool returned() const noexcept { return end == ChildEnd::kReturned; }
  // One line for a report: "killed by SIGSEGV (Segmentation fault)", "timed out after 500 ms
  // (killed)", ... with the child's last stderr line when it helps explain.
  std::string describe(const ChildLimits& limits) const;
};

// Forks; in the child: new process group, core dumps off, stdout to /dev/null (plugin output must
// not corrupt a --json report), stderr captured, crash signals reset to their default action
// (so a sanitizer's handler does not turn a SIGSEGV into a plain exit), limits applied, then
// `body` runs and its result is written back; the child ends with _exit() (no atexit handlers, no
// leak check: the plugin may leak on purpose and the report already says so).
// While the child runs the caller is a child subreaper (PR_SET_CHILD_SUBREAPER): once the child
// is reaped, every process it left behind is this process's child, and each is killed by its PID
// and reaped; any out of the child's process group makes the outcome kLeftProcesses.
// Throws std::system_error if fork or pipe fail. [main-thread]: the caller must be
// single-threaded, as fork() copies only the calling thread, and must not fork meanwhile.
ChildOutcome run_in_child(const std::function<std::string()>& body, const ChildLimits& limits);

// Child side: says what the child is doing now ("in fetch_page()"), so that a report of a crash,
// hang or exit can say where it happened. Copies into memory shared with the parent; no
// allocation, safe to call often. Does nothing outside run_in_child.
void note_activity(const char* what) noexcept;

}  // namespace backhaul::validate
