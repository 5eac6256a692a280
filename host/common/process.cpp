#include "host/common/process.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

namespace backhaul::host {

namespace {

// The pipe the handler writes caught signals to: [0] read (non-blocking), [1] write (non-blocking:
// with the pipe full a signal is dropped rather than the handler blocked; one is enough).
int g_signal_pipe[2] = {-1, -1};

void on_termination_signal(int number) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(number);
  [[maybe_unused]] const ssize_t written = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// In a child forked without exec, the default action again (exec resets the handler anyway).
void default_termination_signals_in_child() {
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

// Takes one caught signal of `signals` if there is one: its number, or 0.
int take_signal(const sigset_t& signals) {
  unsigned char byte = 0;
  for (;;) {
    const ssize_t got = ::read(g_signal_pipe[0], &byte, 1);
    if (got == 1) {
      if (sigismember(&signals, byte) == 1) return byte;
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    return 0;
  }
}

// Waits for one of `signals` to be caught, or for `wake_fd` (-1: none) to become readable: the
// signal's number, or 0 once woken. Woken and signalled at once, it leaves the signal in the pipe.
int next_signal(const sigset_t& signals, int wake_fd) {
  pollfd fds[2] = {{g_signal_pipe[0], POLLIN, 0}, {wake_fd, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 0;
    }
    if (fds[1].revents != 0) return 0;
    if (const int number = take_signal(signals)) return number;
  }
}

}  // namespace

bool start_clean() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int opened = ::open("/dev/null", O_RDWR);  // the lowest free number: this one
    if (opened != fd) {
      if (opened >= 0) ::close(opened);
      return false;
    }
  }
  struct sigaction action {};
  ::sigaction(SIGCHLD, nullptr, &action);
  if (action.sa_handler == SIG_IGN) {
    action.sa_handler = SIG_DFL;
    ::sigaction(SIGCHLD, &action, nullptr);
  }
  return true;
}

sigset_t catch_termination_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  if (g_signal_pipe[0] < 0) {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw std::system_error(errno, std::generic_category(), "pipe2 for termination signals");
    }
    ::pthread_atfork(nullptr, nullptr, &default_termination_signals_in_child);
  }
  struct sigaction action {};
  action.sa_handler = &on_termination_signal;
  sigfillset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  pthread_sigmask(SIG_UNBLOCK, &signals, nullptr);
  return signals;
}

int wait_for_termination(const sigset_t& signals) { return next_signal(signals, -1); }

SignalWatch::SignalWatch(const sigset_t& signals, std::function<void(int)> on_signal) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  auto watch = [this, signals, on_signal = std::move(on_signal)] {
    taken_ = next_signal(signals, wake_fd_);
    if (taken_ != 0) on_signal(taken_);
  };
  try {
    thread_ = std::thread(std::move(watch));
  } catch (...) {
    ::close(wake_fd_);
    throw;
  }
}

SignalWatch::~SignalWatch() { stop(); }

int SignalWatch::stop() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
    thread_.join();
    ::close(wake_fd_);
  }
  return taken_;
}

void write_port_file(const std::string& path, uint16_t port) {
  // A temporary of its own (two writers of one path never share one), closed and checked before
  // the rename: a write that fails only as it is flushed (a full disk) must not put an empty file
  // in place.
  std::string temporary = path + ".XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot create " + temporary);
  const std::string text = std::to_string(port) + "\n";
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int saved = errno;
  if (::close(fd) != 0 || !written) {
    const int error = written ? errno : saved;
    ::unlink(temporary.c_str());
    throw std::system_error(error, std::generic_category(), "cannot write " + temporary);
  }
  // mkstemp makes the file 0600; a port file is for anyone who may reach the port.
  ::chmod(temporary.c_str(), 0644);
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    ::unlink(temporary.c_str());
    throw std::system_error(error, "cannot rename " + temporary + " to " + path);
  }
}

}  // namespace backhaul::host
