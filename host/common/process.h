// Process plumbing shared by the long-running host executables (backhauld, backhaul-sandbox):
// termination signals received synchronously, and the port file tests and scripts read.
#pragma once

#include <cstdint>
#include <string>

#include <signal.h>

namespace backhaul::host {

// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts afterwards (call
// before any thread starts), so that wait_for_termination() receives them synchronously and no
// work happens in a signal handler. [main-thread]
sigset_t block_termination_signals();
// Waits for one of `signals`; returns its number. [main-thread]
int wait_for_termination(const sigset_t& signals);

// Writes "PORT\n" to `path` via a temporary file and a rename, so readers never see a partial
// file. Throws std::runtime_error or std::filesystem::filesystem_error.
void write_port_file(const std::string& path, uint16_t port);

}  // namespace backhaul::host
