#include "tests/host/daemon/child_process.h"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

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
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 1, stdout_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  const int rc = posix_spawn(&pid_, path.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("posix_spawn " + path + ": " + std::to_string(rc));
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
