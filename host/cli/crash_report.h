// For commands that run a plugin in this process (`plugin info`, `fetch`): a plugin that crashes
// ends the command with a line naming the plugin and the signal, not with the shell's bare
// "Aborted" or "Segmentation fault".
#pragma once

#include <string>

namespace backhaul::cli {

// While alive, a crash signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) writes
// "<message>: killed by SIGSEGV (Segmentation fault)" and a line of `advice` to stderr and ends the
// process with exit status 1. One at a time. [main-thread]
class CrashReport {
 public:
  CrashReport(const std::string& message, const std::string& advice);
  ~CrashReport();
  CrashReport(const CrashReport&) = delete;
  CrashReport& operator=(const CrashReport&) = delete;
};

}  // namespace backhaul::cli
