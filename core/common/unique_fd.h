// A file descriptor that closes itself, and close-on-exec for descriptors opened by others.
#pragma once

#include <utility>

#include <fcntl.h>
#include <unistd.h>

namespace backhaul {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Marks `fd` close-on-exec, for descriptors a library opens without O_CLOEXEC (Poco's sockets,
// the MySQL client's): a process a plugin starts must not inherit them. A fork() on another
// thread between their opening and this call still passes them on. Returns false on failure.
inline bool set_close_on_exec(int fd) noexcept {
  const int flags = ::fcntl(fd, F_GETFD);
  return flags >= 0 && ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) == 0;
}

}  // namespace backhaul
