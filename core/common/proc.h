// Facts about a process from /proc, for the parents that watch their children.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

namespace backhaul {

// The resident set of `pid` in KiB, from /proc/PID/statm; 0 when it cannot be read (the process is
// gone). Cheap enough to call every few milliseconds: one open and one short read.
inline int64_t resident_kb(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/statm";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char text[128];
  const ssize_t n = ::read(fd, text, sizeof text - 1);
  ::close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  // "size resident shared text lib data dt", in pages.
  char* end = nullptr;
  std::strtoll(text, &end, 10);
  const long long resident_pages = std::strtoll(end, nullptr, 10);
  return resident_pages * (::sysconf(_SC_PAGESIZE) / 1024);
}

}  // namespace backhaul
