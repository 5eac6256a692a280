#include "core/common/proc.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

namespace backhaul {

int64_t resident_kb(pid_t pid) {
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

std::optional<ProcStat> read_proc_stat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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
