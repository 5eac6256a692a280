#include "host/cli/crash_report.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include <execinfo.h>
#include <fcntl.h>
#include <ucontext.h>
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

// A line the handler writes, made before any plugin code runs; the handler only reads it.
struct Text {
  char bytes[4096];
  size_t length = 0;
  void set(const std::string& text) {
    length = std::min(text.size(), sizeof bytes);
    std::memcpy(bytes, text.data(), length);
  }
};
Text g_in_plugin, g_in_plugin_advice, g_outside, g_outside_advice, g_command;
bool g_active = false;
volatile sig_atomic_t g_entered = 0;  // set by the handler: a crash in it says less
// A stack of its own, so that a plugin that overflowed its stack is reported too.
alignas(16) char g_stack[64 * 1024];
std::array<struct sigaction, kCrashSignals.size()> g_previous{};

// How plugin_loader.cpp names the sealed copy of a plugin file (or of a library it brings along),
// as /proc/self/maps shows its mappings.
constexpr char kPluginMapping[] = "/memfd:backhaul-plugin:";
constexpr size_t kMaxFrames = 128;
void* g_frames[kMaxFrames];
char g_maps[16 * 1024];  // /proc/self/maps, a piece at a time

void write_all(const char* text, size_t length) {
  while (length > 0) {
    const ssize_t n = ::write(STDERR_FILENO, text, length);
    if (n <= 0) return;
    text += n;
    length -= static_cast<size_t>(n);
  }
}

void write_text(const Text& text) { write_all(text.bytes, text.length); }

// Whether `line` of /proc/self/maps ("start-end perms offset dev inode path") is an executable
// mapping of a plugin copy holding one of `addresses`.
bool in_plugin_mapping(const char* line, size_t length, const uintptr_t* addresses, size_t count) {
  size_t i = 0;
  auto hex = [&](uintptr_t* value) {
    const size_t first = i;
    for (; i < length; ++i) {
      const char c = line[i];
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (digit < 0) break;
      *value = *value * 16 + static_cast<uintptr_t>(digit);
    }
    return i > first;
  };
  uintptr_t start = 0;
  uintptr_t end = 0;
  if (!hex(&start) || i >= length || line[i++] != '-' || !hex(&end)) return false;
  if (i + 4 >= length || line[i + 3] != 'x') return false;  // " r-xp": i is at the blank
  for (int field = 0; field < 4; ++field) {                 // perms, offset, dev, inode
    while (i < length && line[i] == ' ') ++i;
    while (i < length && line[i] != ' ') ++i;
  }
  while (i < length && line[i] == ' ') ++i;
  const size_t prefix = sizeof kPluginMapping - 1;
  if (length - i < prefix || std::memcmp(line + i, kPluginMapping, prefix) != 0) return false;
  return std::any_of(addresses, addresses + count,
                     [&](uintptr_t address) { return address >= start && address < end; });
}

enum class Whose { kPlugin, kOutside, kUnknown };

// Whose code holds one of `addresses`, from /proc/self/maps read with open() and read() only.
Whose whose(const uintptr_t* addresses, size_t count) {
  const int fd = ::open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Whose::kUnknown;
  Whose found = Whose::kUnknown;
  size_t filled = 0;
  while (found == Whose::kUnknown) {
    const ssize_t n = ::read(fd, g_maps + filled, sizeof g_maps - filled);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {  // the end (a last line without its newline), or a file that cannot be read
      if (n == 0) {
        found =
            in_plugin_mapping(g_maps, filled, addresses, count) ? Whose::kPlugin : Whose::kOutside;
      }
      break;
    }
    filled += static_cast<size_t>(n);
    size_t begin = 0;
    for (size_t j = 0; j < filled && found == Whose::kUnknown; ++j) {
      if (g_maps[j] != '\n') continue;
      if (in_plugin_mapping(g_maps + begin, j - begin, addresses, count)) found = Whose::kPlugin;
      begin = j + 1;
    }
    if (begin == 0 && filled == sizeof g_maps) begin = filled;  // no plugin's: names are short
    std::memmove(g_maps, g_maps + begin, filled - begin);
    filled -= begin;
  }
  ::close(fd);
  return found;
}

// Where the crashed thread was interrupted (the faulting instruction), or 0.
uintptr_t interrupted_at(void* context) {
#if defined(__x86_64__)
  return static_cast<uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<uintptr_t>(static_cast<ucontext_t*>(context)->uc_mcontext.pc);
#else
  (void)context;
  return 0;
#endif
}

void on_crash(int signal, siginfo_t* info, void* context) {
  const char* name = "a crash signal";
  for (const auto& [number, description] : kCrashSignals) {
    if (number == signal) name = description;
  }
  // Sent by another process (kill -ABRT PID): no crash, and not the plugin's doing, whatever
  // code the thread was in. (The plugin's own abort() is sent by this process.) The command says
  // so and dies of the signal, as it was asked to.
  // (si_code <= 0: sent by kill, tgkill or sigqueue; si_pid 0: by a process outside this one's
  // PID namespace.)
  if (info != nullptr && info->si_code <= 0 && info->si_pid != ::getpid()) {
    char digits[24];
    size_t length = 0;
    for (auto pid = static_cast<unsigned long>(info->si_pid); length == 0 || pid > 0; pid /= 10) {
      digits[length++] = static_cast<char>('0' + pid % 10);
    }
    write_text(g_command);
    write_all(": killed by ", 12);
    write_all(name, std::strlen(name));
    if (info->si_pid == 0) {
      write_all(", sent by another process", 25);
    } else {
      write_all(", sent by process ", 18);
      while (length > 0) write_all(&digits[--length], 1);
    }
    write_all(" (not a crash)\n", 15);
    ::signal(signal, SIG_DFL);
    ::raise(signal);
    ::_exit(128 + signal);
  }
  Whose crashed = Whose::kUnknown;
  if (!g_entered) {  // a second entry is a crash while the stack was being read
    g_entered = 1;
    uintptr_t addresses[kMaxFrames + 1];
    size_t count = 0;
    if (const uintptr_t at = interrupted_at(context); at != 0) addresses[count++] = at;
    const int frames = ::backtrace(g_frames, static_cast<int>(kMaxFrames));
    for (int f = 0; f < frames; ++f) addresses[count++] = reinterpret_cast<uintptr_t>(g_frames[f]);
    crashed = whose(addresses, count);
  }
  const bool outside = crashed == Whose::kOutside;
  write_text(outside ? g_outside : g_in_plugin);
  write_all(": killed by ", 12);
  write_all(name, std::strlen(name));
  write_all("\n", 1);
  write_text(outside ? g_outside_advice : g_in_plugin_advice);
  ::_exit(1);
}

}  // namespace

CrashReport::CrashReport(const std::string& command, const std::filesystem::path& plugin,
                         const std::string& in_plugin) {
  if (g_active) throw std::logic_error("CrashReport: one at a time");
  g_in_plugin.set(in_plugin);
  g_in_plugin_advice.set("`backhaul plugin validate " + plugin.string() +
                         "` runs it in child processes and says where\n");
  g_command.set(command);
  g_outside.set(command + ": crashed outside the code of the plugin " + plugin.string() +
                ", which was loaded");
  g_outside_advice.set("that is a bug in backhaul, not in the plugin: please report it\n");
  g_entered = 0;
  void* warm[1];
  ::backtrace(warm, 1);  // its first call loads the unwinder, which a signal handler must not
  stack_t stack{};
  stack.ss_sp = g_stack;
  stack.ss_size = sizeof g_stack;
  ::sigaltstack(&stack, nullptr);
  struct sigaction action {};
  action.sa_sigaction = on_crash;
  // SA_NODEFER: a crash while the handler reads the stack enters it again, which then says less.
  action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
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
