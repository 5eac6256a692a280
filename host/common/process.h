// Process plumbing shared by the long-running host executables (backhauld, backhaul-sandbox):
// termination signals received synchronously, and the port file tests and scripts read.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include <signal.h>

namespace backhaul::host {

// Call first thing in main, before anything opens a descriptor. Opens /dev/null on whichever of
// fds 0-2 the parent left closed: otherwise the next socket or pipe takes that number, and a log
// line meant for stderr goes into it (an admin client's connection, the signal pipe). And puts
// back SIGCHLD's default action if the parent left it ignored: the kernel would reap the children
// itself, and waitpid() could not tell how a plugin worker or a checked plugin ended. Returns
// false when /dev/null cannot be opened (a process to stop at once: where would it say why?).
bool start_clean();

// Catches SIGINT and SIGTERM (call first thing in main, before any thread starts): the handler
// only writes the signal's number to a close-on-exec pipe, which wait_for_termination() and a
// SignalWatch read, so no work happens in a signal handler. The signals are left unblocked (and
// unblocked here if the parent blocked them), so a process a plugin starts inherits neither a
// blocked SIGTERM nor the handler (exec resets it; a fork without exec gets the default back)
// and a service manager's SIGTERM stops it too. Returns the set of the two signals. Throws
// std::system_error when the pipe cannot be created. [main-thread]
sigset_t catch_termination_signals();
// Waits for one of `signals` (caught by catch_termination_signals()); returns its number.
// [main-thread]
int wait_for_termination(const sigset_t& signals);

// Takes the first of `signals` (caught by catch_termination_signals()) on a thread of its own,
// for while the main thread is busy with something that may never return: backhauld's start-up,
// which calls each plugin's init(). `on_signal(number)` runs on that thread and should return
// soon. Once the watch ends, signals it did not take are left for wait_for_termination().
// Throws std::system_error when the descriptor or the thread cannot be created.
class SignalWatch {
 public:
  SignalWatch(const sigset_t& signals, std::function<void(int)> on_signal);
  ~SignalWatch();  // stop()s
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;

  // Ends the watch, after on_signal() if it is running; returns the signal the watch took, or 0.
  // Idempotent. [main-thread]
  int stop();

 private:
  int wake_fd_ = -1;
  int taken_ = 0;  // written by the thread, read after join()
  std::thread thread_;
};

// Writes "PORT\n" to `path` via a temporary file of its own and a rename, so readers never see a
// partial file. Throws std::system_error naming the file.
void write_port_file(const std::string& path, uint16_t port);

}  // namespace backhaul::host
