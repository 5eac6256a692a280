#include "tests/host/daemon/child_process.h"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace backhaul::daemon::testing {

ChildProcess::ChildProcess(const std::string& path, const std::vector<std::string>& args,
                           const std::vector<std::string>& env, std::filesystem::path stderr_path,
                           std::filesystem::path stdout_path)
    : stderr_path_(std::move(stderr_path)), stdout_path_(std::move(stdout_path)) {
  std::vector<std::string> arg_storage = {path};
  arg_storage.insert(arg_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : arg_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_storage(env);
  for (char** e = environ; *e; ++e) env_storage.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);
  // fork + exec rather than posix_spawn, for PR_SET_PDEATHSIG: the child is killed when this
  // process dies, so a test run that aborts (a failed assertion in a fixture, a sanitizer) leaves
  // no daemon behind. Between fork and exec only async-signal-safe calls.
  if (access(path.c_str(), X_OK) != 0) throw std::runtime_error("cannot execute " + path);
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork for " + path + " failed");
  if (pid_ == 0) {
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(126);
    const int err = open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const int out = open(stdout_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (err < 0 || out < 0 || dup2(err, 2) < 0 || dup2(out, 1) < 0) _exit(126);
    execve(path.c_str(), argv.data(), envp.data());
    _exit(127);
  }
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

bool ChildProcess::reap_if_exited() {
  if (pid_ > 0 && waitpid(pid_, &status_, WNOHANG) == pid_) pid_ = -1;
  return pid_ <= 0;
}

uint16_t ChildProcess::wait_port(const std::filesystem::path& port_file,
                                 std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) return static_cast<uint16_t>(port);
    if (reap_if_exited()) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

int ChildProcess::wait_exit(std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (reap_if_exited()) return status_;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

bool ChildProcess::signal(int signal_number) const {
  return pid_ > 0 && kill(pid_, signal_number) == 0;
}

namespace {
std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}
}  // namespace

std::string ChildProcess::stderr_text() const { return read_file(stderr_path_); }

std::string ChildProcess::stdout_text() const { return read_file(stdout_path_); }

CommandResult run_command(const std::string& path, const std::vector<std::string>& args,
                          const std::vector<std::string>& env, const std::filesystem::path& dir,
                          std::chrono::seconds timeout) {
  ChildProcess child(path, args, env, dir / "command.stderr", dir / "command.stdout");
  const int status = child.wait_exit(timeout);
  CommandResult result;
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  result.out = child.stdout_text();
  result.err = child.stderr_text();
  return result;
}

}  // namespace backhaul::daemon::testing
