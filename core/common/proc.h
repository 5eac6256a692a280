// Facts about a process from /proc, for the parents that watch their children (the plugin worker
// pool, validate's child runner) and for the benchmarks and tests that measure them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <sys/types.h>

namespace backhaul {

// The text of /proc/PID/`name` ("stat", "status", ...); nullopt when the process is gone, before
// the open or during the read (a read of an ended process's file fails with ESRCH, which an
// std::ifstream turns into an exception).
std::optional<std::string> read_proc_file(pid_t pid, const char* name);

// The resident set of `pid` in KiB, from /proc/PID/statm; 0 when it cannot be read (the process is
// gone). Cheap enough to call every few milliseconds: one open and one short read.
int64_t resident_kb(pid_t pid);

// The fields of /proc/PID/stat that are read here.
struct ProcStat {
  std::string comm;  // the command name, cut by the kernel to 15 characters
  char state = '?';  // 'R', 'S', 'D', 'Z' (ended, not yet reaped), ...
  pid_t ppid = 0;
  uint64_t utime_ticks = 0;  // user and system CPU time, in clock ticks (sysconf(_SC_CLK_TCK))
  uint64_t stime_ticks = 0;
};
// nullopt when the process is gone (or the file does not read as a process's stat).
std::optional<ProcStat> read_proc_stat(pid_t pid);

// The processes whose parent is `parent`, zombies included.
std::vector<pid_t> child_pids(pid_t parent);

}  // namespace backhaul
