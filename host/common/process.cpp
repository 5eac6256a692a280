#include "host/common/process.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

namespace backhaul::host {

sigset_t block_termination_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int wait_for_termination(const sigset_t& signals) {
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  return signal_number;
}

SignalWatch::SignalWatch(const sigset_t& signals, std::function<void(int)> on_signal) {
  signal_fd_ = ::signalfd(-1, &signals, SFD_CLOEXEC);
  if (signal_fd_ < 0) throw std::system_error(errno, std::generic_category(), "signalfd");
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const int error = errno;
    ::close(signal_fd_);
    throw std::system_error(error, std::generic_category(), "eventfd");
  }
  auto watch = [this, on_signal = std::move(on_signal)] {
    pollfd fds[2] = {{signal_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    for (;;) {
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;  // stop()
      signalfd_siginfo info{};
      if (fds[0].revents != 0 && ::read(signal_fd_, &info, sizeof info) == sizeof info) {
        taken_ = static_cast<int>(info.ssi_signo);
        on_signal(taken_);
        return;
      }
    }
  };
  try {
    thread_ = std::thread(std::move(watch));
  } catch (...) {
    ::close(signal_fd_);
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
    ::close(signal_fd_);
    ::close(wake_fd_);
  }
  return taken_;
}

void write_port_file(const std::string& path, uint16_t port) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << port << '\n';
    if (!out) throw std::runtime_error("cannot write " + temporary);
  }
  std::filesystem::rename(temporary, path);
}

}  // namespace backhaul::host
