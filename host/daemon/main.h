// The body of backhauld's main(): options, config, start, wait for SIGTERM/SIGINT, drain.
#pragma once

namespace backhaul::daemon {

// Exit status: 0 after a graceful stop, 2 for a bad config or command line, 1 when the daemon
// could not start.
int main(int argc, char** argv);

}  // namespace backhaul::daemon
