#include "host/cli/crash_report.h"

#include <algorithm>
#include <array>
#include <csignal>
#include <cstring>
#include <stdexcept>

#include <unistd.h>

namespace backhaul::cli {
namespace {

constexpr std::array<std::pair<int, const char*>, 5> kCrashSignals = {{
    {SIGSEGV, "SIGSEGV (Segmentation fault)"},
    {SIGBUS, "SIGBUS (Bus error)"},
    {SIGILL, "SIGILL (Illegal instruction)"},
    {SIGFPE, "SIGFPE (Floating point exception)"},
    {SIGABRT, "SIGABRT (Aborted)"},
}};

// Written before any plugin code runs; the handler only reads them.
char g_message[2048];
size_t g_length = 0;
char g_advice[1024];
size_t g_advice_length = 0;
bool g_active = false;
// A stack of its own, so that a plugin that overflowed its stack is reported too.
alignas(16) char g_stack[64 * 1024];
std::array<struct sigaction, kCrashSignals.size()> g_previous{};

void write_all(const char* text, size_t length) {
  while (length > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, length);
    if (n <= 0) return;
    text += n;
    length -= static_cast<size_t>(n);
  }
}

void on_crash(int signal) {
  const char* name = "a crash signal";
  for (const auto& [number, description] : kCrashSignals) {
    if (number == signal) name = description;
  }
  write_all(g_message, g_length);
  write_all(": killed by ", 12);
  write_all(name, std::strlen(name));
  write_all("\n", 1);
  write_all(g_advice, g_advice_length);
  ::_exit(1);
}

}  // namespace

CrashReport::CrashReport(const std::string& message, const std::string& advice) {
  if (g_active) throw std::logic_error("CrashReport: one at a time");
  g_length = std::min(message.size(), sizeof g_message);
  std::memcpy(g_message, message.data(), g_length);
  const std::string line = advice.empty() ? advice : advice + "\n";
  g_advice_length = std::min(line.size(), sizeof g_advice);
  std::memcpy(g_advice, line.data(), g_advice_length);
  stack_t stack{};
  stack.ss_sp = g_stack;
  stack.ss_size = sizeof g_stack;
  ::sigaltstack(&stack, nullptr);
  struct sigaction action {};
  action.sa_handler = on_crash;
  action.sa_flags = SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < kCrashSignals.size(); ++i) {
    ::sigaction(kCrashSignals[i].first, &action, &g_previous[i]);
  }
  g_active = true;
}

CrashReport::~CrashReport() {
  for (size_t i = 0; i < kCrashSignals.size(); ++i) {
    ::sigaction(kCrashSignals[i].first, &g_previous[i], nullptr);
  }
  g_active = false;
}

}  // namespace backhaul::cli
