#include <sstream>
#include <stdexcept>
#include <string>

#include "core/common/proc.h"
#include "host/bench/bench.h"
#include <unistd.h>

namespace backhaul::bench {

int64_t proc_status_kb(pid_t pid, const std::string& field) {
  std::istringstream in(read_proc_file(pid, "status").value_or(""));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return 0;
}

double proc_cpu_s(pid_t pid) {
  const std::optional<ProcStat> stat = read_proc_stat(pid);
  if (!stat) {
    throw std::runtime_error("cannot read /proc/" + std::to_string(pid) +
                             "/stat (no such process?)");
  }
  return static_cast<double>(stat->utime_ticks + stat->stime_ticks) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace backhaul::bench
