// For commands that run a plugin in this process (`plugin info`, `fetch`): a crash ends the command
// with a line naming the signal and whose code crashed, the plugin's or the command's own, not
// with the shell's bare "Aborted" or "Segmentation fault".
#pragma once

#include <filesystem>
#include <string>

namespace backhaul::cli {

// While alive, a crash signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) writes two lines to
// stderr and ends the process with exit status 1. When the crashed thread's stack has a frame in
// a plugin's code (a mapping of a sealed copy of a plugin file, /memfd:backhaul-plugin:...), they
// are "<in_plugin>: killed by SIGSEGV (Segmentation fault)" and where `plugin validate` says more.
// When it has none, the crash is the command's own: "<command>: crashed outside the code of the
// plugin <plugin>, which was loaded: killed by ..." and that it is a bug to report. When the
// stack cannot be read, the plugin is named, as before a plugin was told apart. One at a time.
// [main-thread]
class CrashReport {
 public:
  CrashReport(const std::string& command, const std::filesystem::path& plugin,
              const std::string& in_plugin);
  ~CrashReport();
  CrashReport(const CrashReport&) = delete;
  CrashReport& operator=(const CrashReport&) = delete;
};

}  // namespace backhaul::cli
