#include "core/common/proc.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

namespace backhaul {

std::optional<std::string> read_proc_file(pid_t pid, const char* name) {
  const std::string path = "/proc/" + std::to_string(pid) + "/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string text;
  char chunk[4096];
  for (;;) {
    const ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n > 0) {
      text.append(chunk, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      ::close(fd);
      return std::nullopt;  // ESRCH: the process ended after the open
    }
  }
  ::close(fd);
  return text;
}

int64_t resident_kb(pid_t pid) {
  const std::optional<std::string> text = read_proc_file(pid, "statm");
  if (!text) return 0;
  // "size resident shared text lib data dt", in pages.
  char* end = nullptr;
  std::strtoll(text->c_str(), &end, 10);
  const long long resident_pages = std::strtoll(end, nullptr, 10);
  return resident_pages * (::sysconf(_SC_PAGESIZE) / 1024);
}

std::optional<ProcStat> read_proc_stat(pid_t pid) {
  const std::optional<std::string> read = read_proc_file(pid, "stat");
  if (!read) return std::nullopt;
  const std::string& text = *read;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the fields are counted
  // from its last ')', with the state as field 3.
  const size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  ProcStat stat;
  stat.comm = text.substr(open + 1, close - open - 1);
  std::istringstream fields(text.substr(close + 1));
  fields >> stat.state >> stat.ppid;
  std::string skipped;
  for (int field = 5; field <= 13 && fields >> skipped; ++field) {
  }
  fields >> stat.utime_ticks >> stat.stime_ticks;
  if (!fields) return std::nullopt;
  return stat;
}

std::vector<pid_t> child_pids(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<pid_t>(std::stol(name));
    if (const std::optional<ProcStat> stat = read_proc_stat(pid); stat && stat->ppid == parent) {
      children.push_back(pid);
    }
  }
  return children;
}

}  // namespace backhaul
