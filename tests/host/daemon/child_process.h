// A child process for tests: spawned with extra environment and stderr to a file, waited for with
// a bound, and killed (by its PID only) if a test leaves it running.
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/types.h>

namespace backhaul::daemon::testing {

class ChildProcess {
 public:
  // Starts `path` with `args` (argv[1..]); `env` ("NAME=value") is added to this process's
  // environment. stderr goes to `stderr_path`, stdout to `stdout_path` (default: /dev/null).
  // Throws std::runtime_error when it cannot start.
  ChildProcess(const std::string& path, const std::vector<std::string>& args,
               const std::vector<std::string>& env, std::filesystem::path stderr_path,
               std::filesystem::path stdout_path = "/dev/null");
  ~ChildProcess();  // SIGKILL and reap if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Polls `port_file` until it holds a port (readiness, not timing); 0 when the process exited
  // or `timeout` passed.
  uint16_t wait_port(const std::filesystem::path& port_file, std::chrono::seconds timeout);
  // The wait status once exited, or -1 when it still runs after `timeout`.
  int wait_exit(std::chrono::seconds timeout);
  // Sends `signal` to the child's PID.
  bool signal(int signal_number) const;
  std::string stderr_text() const;
  std::string stdout_text() const;
  pid_t pid() const noexcept { return pid_; }

 private:
  bool reap_if_exited();
  pid_t pid_ = -1;
  int status_ = 0;
  std::filesystem::path stderr_path_;
  std::filesystem::path stdout_path_;
};

struct CommandResult {
  int exit_code = -1;  // -1: killed or did not finish in time
  std::string out;
  std::string err;
};
// Runs a command to completion (at most `timeout`), capturing its output in files under `dir`.
CommandResult run_command(const std::string& path, const std::vector<std::string>& args,
                          const std::vector<std::string>& env, const std::filesystem::path& dir,
                          std::chrono::seconds timeout = std::chrono::seconds(60));

}  // namespace backhaul::daemon::testing
