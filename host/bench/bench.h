// Benchmark subcommands of backhaul-bench.
#pragma once

#include <cstdint>
#include <string>

#include <sys/types.h>

namespace CLI {
class App;
}

namespace backhaul::bench {

void add_plugin_bench(CLI::App& app);
void add_queue_bench(CLI::App& app);
void add_pipeline_bench(CLI::App& app);

// From /proc/PID: a /proc/PID/status field in kB ("VmRSS", "VmHWM"; 0 when absent), and the
// process's user + system CPU seconds so far (throws when the process cannot be read).
int64_t proc_status_kb(pid_t pid, const std::string& field);
double proc_cpu_s(pid_t pid);

}  // namespace backhaul::bench
