#include "core/plugins/isolation.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <utility>

#include "core/common/logging.h"
#include "core/common/proc.h"
#include "core/common/signal_name.h"
#include "core/http/http_metrics.h"
#include "core/plugins/plugin_loader.h"
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace backhaul::plugins {
namespace {

using SteadyClock = std::chrono::steady_clock;

// --- worker_wire: frames and their fields -------------------------------------------------------

enum class Op : uint8_t {
  kCreate = 1,
  kFetch = 2,
  kValidateScopes = 3,
  kDescribe = 4,        // what the worker loaded: a PluginInfo
  kValidateConfig = 5,  // the plugin's validate_config(), no instance needed
};

// A frame body bigger than this is refused (no page of a real provider comes near it).
constexpr size_t kMaxFrame = size_t{1} << 30;

struct MalformedFrame : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Writer {
 public:
  Writer() : bytes_(4, '\0') {}
  Writer& u8(uint8_t v) {
    bytes_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& i64(int64_t v) {
    char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * i));
    bytes_.append(b, 8);
    return *this;
  }
  Writer& str(std::string_view s) {
    i64(static_cast<int64_t>(s.size()));
    bytes_.append(s);
    return *this;
  }
  Writer& opt(std::optional<std::string_view> s) {
    u8(s ? 1 : 0);
    return s ? str(*s) : *this;
  }
  // The frame: the body's length in front of it.
  std::string finish() && {
    const auto n = static_cast<uint32_t>(bytes_.size() - 4);
    for (int i = 0; i < 4; ++i) bytes_[i] = static_cast<char>(n >> (8 * i));
    return std::move(bytes_);
  }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}
  uint8_t u8() {
    need(1);
    const auto v = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return v;
  }
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(rest_[i])} << (8 * i);
    rest_.remove_prefix(8);
    return static_cast<int64_t>(v);
  }
  std::string_view str() {
    const int64_t n = i64();
    if (n < 0) throw MalformedFrame("a negative string length");
    need(static_cast<uint64_t>(n));
    std::string_view s = rest_.substr(0, static_cast<size_t>(n));
    rest_.remove_prefix(static_cast<size_t>(n));
    return s;
  }
  std::optional<std::string_view> opt() { return u8() ? std::optional(str()) : std::nullopt; }
  size_t left() const noexcept { return rest_.size(); }
  void end() const {
    if (!rest_.empty()) throw MalformedFrame(std::to_string(rest_.size()) + " bytes too many");
  }

 private:
  void need(uint64_t n) const {
    if (rest_.size() < n) throw MalformedFrame("the frame ends early");
  }
  std::string_view rest_;
};

std::optional<std::string_view> view(const std::optional<std::string>& s) {
  return s ? std::optional<std::string_view>(*s) : std::nullopt;
}

void write_unit(Writer& w, const Unit& unit) {
  w.str(unit.installation_id).str(unit.resource_id).opt(view(unit.resource_name));
  w.str(unit.access_token);
}

Unit read_unit(Reader& r) {
  Unit unit;
  unit.installation_id = r.str();
  unit.resource_id = r.str();
  if (auto name = r.opt()) unit.resource_name = std::string(*name);
  unit.access_token = r.str();
  return unit;
}

// A failed call's answer: the status, the message and the wait a RATE_LIMITED asks for.
std::string failure_frame(backhaul_status_t status, std::string_view message,
                          int64_t retry_after_ms) {
  Writer w;
  w.u8(static_cast<uint8_t>(status)).str(message).i64(retry_after_ms);
  return std::move(w).finish();
}

std::string ok_frame() {
  Writer w;
  w.u8(BACKHAUL_OK);
  return std::move(w).finish();
}

// Every answer ends with the HTTP tally of the call: the plugin's exchanges by outcome and their
// summed time (http::HttpTally), counted in the worker and added to the daemon's metrics.
constexpr size_t kTallyBytes = (http::HttpTally::kOutcomes + 1) * 8;

std::string with_tally(std::string frame, const http::HttpTally& tally) {
  Writer w;
  for (uint64_t n : tally.requests) w.i64(static_cast<int64_t>(n));
  w.i64(static_cast<int64_t>(tally.micros));
  frame.append(std::move(w).finish().substr(4));
  const auto n = static_cast<uint32_t>(frame.size() - 4);
  for (int i = 0; i < 4; ++i) frame[static_cast<size_t>(i)] = static_cast<char>(n >> (8 * i));
  return frame;
}

// Takes the tally off the end of an answer's body.
http::HttpTally take_tally(std::string& body) {
  if (body.size() < kTallyBytes) throw MalformedFrame("an answer without its HTTP tally");
  Reader r(std::string_view(body).substr(body.size() - kTallyBytes));
  http::HttpTally tally;
  for (uint64_t& n : tally.requests) n = static_cast<uint64_t>(r.i64());
  tally.micros = static_cast<uint64_t>(r.i64());
  body.resize(body.size() - kTallyBytes);
  return tally;
}

// Reads an answer's status; a failure is thrown as the plugin's own ConnectorFailure, taken as
// one in this process is (plugin_failure): the plugin may have written the answer itself.
constexpr size_t kMaxAnswerMessage = 4096;
void throw_if_failed(Reader& r) {
  const auto status = static_cast<backhaul_status_t>(r.u8());
  if (status == BACKHAUL_OK) return;
  std::string message(r.str());
  // A plugin's message is at most 1023 bytes (the ABI's error buffer); one that claims more was
  // written by the plugin itself, and is cut (at a character's start) rather than kept whole.
  if (message.size() > kMaxAnswerMessage) {
    size_t cut = kMaxAnswerMessage;
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
    message.resize(cut);
    message += "...";
  }
  const int64_t retry_after_ms = r.i64();
  r.end();
  throw plugin_failure("a worker process answered with unknown status " + std::to_string(status),
                       status, std::move(message), retry_after_ms);
}

// kClosed: the other end is gone (MSG_NOSIGNAL: no SIGPIPE); kEnded: the process at the other end
// has ended, though a process it forked holds the socket open.
enum class SendEnd { kSent, kClosed, kTimedOut, kEnded };

// Sends a whole frame. With a deadline, it gives up then: a peer that takes nothing from its
// socket (a worker still in a plugin's init()) cannot hold the sender once the buffer is full.
// With `ended` (a pidfd, or -1), it gives up too when that process has ended with the frame not
// all taken: what it forked would hold the socket, and the send, until the deadline.
SendEnd send_frame(int fd, std::string_view frame,
                   std::optional<SteadyClock::time_point> deadline = std::nullopt, int ended = -1) {
  while (!frame.empty()) {
    const ssize_t n =
        ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | (deadline ? MSG_DONTWAIT : 0));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && deadline) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(*deadline - SteadyClock::now());
      if (left.count() <= 0) return SendEnd::kTimedOut;
      pollfd p[2] = {{fd, POLLOUT, 0}, {ended, POLLIN, 0}};
      const int ready = ::poll(p, ended >= 0 ? 2 : 1,
                               static_cast<int>(std::min<int64_t>(left.count(), 1'000'000)));
      if (ready > 0 && p[0].revents == 0) return SendEnd::kEnded;
      continue;
    }
    if (n <= 0) return SendEnd::kClosed;
    frame.remove_prefix(static_cast<size_t>(n));
  }
  return SendEnd::kSent;
}

enum class ReadEnd { kFrame, kClosed, kTimedOut, kTooBig };

enum class Ready { kReadable, kEnded, kNotYet };

// Waits up to `timeout_ms` for `fd` to have something to read (or an error to report). kEnded
// when it has nothing and `ended` (a pidfd, or -1) says the process at the other end has ended:
// a process that process forked may hold the socket open, so end-of-file alone would not say so.
Ready wait_readable(int fd, int ended, int timeout_ms) {
  pollfd p[2] = {{fd, POLLIN, 0}, {ended, POLLIN, 0}};
  const int ready = ::poll(p, ended >= 0 ? 2 : 1, timeout_ms);
  if (ready < 0) return errno == EINTR ? Ready::kNotYet : Ready::kReadable;  // recv says it
  if (p[0].revents != 0) return Ready::kReadable;
  if (ready > 0) return Ready::kEnded;
  return Ready::kNotYet;
}

// Reads `size` bytes. With a deadline, it gives up then, and when the process `ended` watches
// (-1: none) has ended with nothing more to read.
ReadEnd read_exact(int fd, char* out, size_t size, std::optional<SteadyClock::time_point> deadline,
                   int ended = -1) {
  while (size > 0) {
    if (deadline) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(*deadline - SteadyClock::now());
      if (left.count() <= 0) return ReadEnd::kTimedOut;
      const Ready ready =
          wait_readable(fd, ended, static_cast<int>(std::min<int64_t>(left.count(), 60'000)));
      if (ready == Ready::kEnded) return ReadEnd::kClosed;
      if (ready == Ready::kNotYet) continue;
    }
    const ssize_t n = ::recv(fd, out, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ReadEnd::kClosed;
    out += n;
    size -= static_cast<size_t>(n);
  }
  return ReadEnd::kFrame;
}

// A frame's body grows by at most this much before its bytes have come: a length that the other
// end writes and does not send the bytes of costs no memory.
constexpr size_t kReadChunk = size_t{1} << 20;

ReadEnd read_frame(int fd, std::string* body, std::optional<SteadyClock::time_point> deadline,
                   int ended = -1, size_t max_size = kMaxFrame) {
  unsigned char header[4];
  if (ReadEnd end = read_exact(fd, reinterpret_cast<char*>(header), 4, deadline, ended);
      end != ReadEnd::kFrame) {
    return end;
  }
  const size_t size = size_t{header[0]} | size_t{header[1]} << 8 | size_t{header[2]} << 16 |
                      size_t{header[3]} << 24;
  if (size > max_size) return ReadEnd::kTooBig;
  body->clear();
  while (body->size() < size) {
    const size_t got = body->size();
    const size_t chunk = std::min(size - got, kReadChunk);
    try {
      body->resize(got + chunk);
    } catch (const std::bad_alloc&) {
      return ReadEnd::kTooBig;
    }
    if (ReadEnd end = read_exact(fd, body->data() + got, chunk, deadline, ended);
        end != ReadEnd::kFrame) {
      return end;
    }
  }
  return ReadEnd::kFrame;
}

std::shared_ptr<OwnedPage> read_page(std::string body) {
  auto owned = std::make_shared<OwnedPage>();
  owned->body = std::move(body);  // the views below point into it, and it never moves again
  Reader r(owned->body);
  throw_if_failed(r);
  backhaul_page_t& page = owned->page;
  page.struct_size = sizeof(page);
  page.raw_count = static_cast<uint64_t>(r.i64());
  if (auto cursor = r.opt()) page.next_cursor = {cursor->data(), cursor->size()};
  page.has_rate_limit = r.u8();
  if (page.has_rate_limit) page.rate_limit = {r.i64(), r.i64(), r.i64()};
  const int64_t count = r.i64();
  // Each event takes at least three lengths: a count beyond that is garbage, not a reservation.
  if (count < 0 || static_cast<uint64_t>(count) > r.left() / 24) {
    throw MalformedFrame("an event count of " + std::to_string(count));
  }
  owned->events.reserve(static_cast<size_t>(count));
  auto c = [](std::string_view s) { return backhaul_string_t{s.data(), s.size()}; };
  for (int64_t i = 0; i < count; ++i) {
    const std::string_view id = r.str(), type = r.str(), payload = r.str();
    owned->events.push_back({c(id), c(type), c(payload)});
  }
  r.end();
  page.events = owned->events.data();
  page.event_count = owned->events.size();
  return owned;
}

std::string page_frame(const Page& page) {
  Writer w;
  w.u8(BACKHAUL_OK).i64(static_cast<int64_t>(page.raw_count())).opt(page.next_cursor());
  const std::optional<backhaul_rate_limit_t> limit = page.rate_limit();
  w.u8(limit ? 1 : 0);
  if (limit) w.i64(limit->remaining).i64(limit->limit).i64(limit->reset_at_unix_ms);
  w.i64(static_cast<int64_t>(page.size()));
  for (size_t i = 0; i < page.size(); ++i) {
    const EventView e = page.event(i);
    w.str(e.delivery_id).str(e.event_type).str(e.payload_json);
  }
  return std::move(w).finish();
}

// The answer to kDescribe: the PluginInfo of what the worker loaded.
std::string info_frame(const PluginInfo& info) {
  Writer w;
  w.u8(BACKHAUL_OK).str(info.id).str(info.version).str(info.display_name).str(info.description);
  auto list = [&w](const std::vector<std::string>& items) {
    w.i64(static_cast<int64_t>(items.size()));
    for (const std::string& item : items) w.str(item);
  };
  list(info.entity_types);
  list(info.default_entity_types);
  w.str(info.config_schema_json).i64(info.abi_version.major).i64(info.abi_version.minor);
  w.str(info.sha256).i64(static_cast<int64_t>(info.bundled_libraries.size()));
  for (const BundledLibrary& library : info.bundled_libraries) {
    w.str(library.path.string()).str(library.sha256);
  }
  return std::move(w).finish();
}

PluginInfo read_info(const std::string& body, const std::filesystem::path& path) {
  Reader r(body);
  throw_if_failed(r);
  PluginInfo info;
  info.id = r.str();
  info.version = r.str();
  info.display_name = r.str();
  info.description = r.str();
  auto list = [&r] {
    const int64_t count = r.i64();
    if (count < 0 || static_cast<uint64_t>(count) > r.left() / 8) {
      throw MalformedFrame("a list of " + std::to_string(count));
    }
    std::vector<std::string> items;
    for (int64_t i = 0; i < count; ++i) items.emplace_back(r.str());
    return items;
  };
  info.entity_types = list();
  info.default_entity_types = list();
  info.config_schema_json = r.str();
  info.abi_version.major = static_cast<uint16_t>(r.i64());
  info.abi_version.minor = static_cast<uint16_t>(r.i64());
  info.sha256 = r.str();
  const int64_t bundled = r.i64();
  if (bundled < 0 || static_cast<uint64_t>(bundled) > r.left() / 16) {
    throw MalformedFrame("a list of " + std::to_string(bundled) + " libraries");
  }
  for (int64_t i = 0; i < bundled; ++i) {
    const std::string_view library = r.str();
    info.bundled_libraries.push_back({std::filesystem::path(library), std::string(r.str())});
  }
  r.end();
  info.path = path;
  return info;
}

// The libraries an answer says the plugin loaded besides itself, each sealed here and passed to
// every later worker: a few, each once, and none the plugin itself.
constexpr size_t kMaxBundledLibraries = 64;
void check_bundled(const PluginInfo& info) {
  const std::string who = info.path.string() + ": in isolation mode, the worker's answer ";
  if (info.bundled_libraries.size() > kMaxBundledLibraries) {
    throw PluginLoadError(who + "lists " + std::to_string(info.bundled_libraries.size()) +
                          " bundled libraries; at most " + std::to_string(kMaxBundledLibraries));
  }
  std::set<std::filesystem::path> seen = {info.path};
  for (const BundledLibrary& library : info.bundled_libraries) {
    if (!seen.insert(library.path).second) {
      throw PluginLoadError(who + "lists " + library.path.string() + " twice");
    }
  }
}

std::string describe_end(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by " + signal_description(WTERMSIG(status));
  return "ended (wait status " + std::to_string(status) + ")";
}

// Kills a worker not yet reaped (its PID cannot be anyone else's): its process group, with what
// the plugin started, and the worker itself, which a plugin may have moved into another group
// (setpgid), where the group's signal misses it and a wait for it would never end.
void kill_worker(pid_t pid) {
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
}

// Waits for `pid` to end and says how. The end of its socket normally means it has exited, but a
// plugin could close the descriptor and live on: after a second it is killed. Whatever the plugin
// started is killed with it: the worker leads a process group of its own, and the group is killed
// once the worker has ended but before it is reaped, while its PID cannot be anyone else's.
std::string reap(pid_t pid, bool kill_now) {
  if (kill_now) kill_worker(pid);
  const auto give_up = SteadyClock::now() + std::chrono::seconds(1);
  std::string how;
  for (;;) {
    siginfo_t info{};
    const int r = ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if (r < 0 && errno != EINTR) return "ended (waitid: " + std::string(std::strerror(errno)) + ")";
    if (r == 0 && info.si_pid == pid) break;  // ended, not yet reaped
    if (SteadyClock::now() >= give_up) {
      kill_worker(pid);
      how = "closed its socket and was killed";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(-pid, SIGKILL);  // what the plugin left behind
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return how.empty() ? describe_end(status) : how;
}

// The files the worker may load, by SHA-256: those the daemon loaded, plugin and bundled libraries.
std::string sha256_list(const PluginInfo& info) {
  std::string list = info.sha256;
  for (const BundledLibrary& library : info.bundled_libraries) list += "," + library.sha256;
  return list;
}

// True when an idle worker's socket already reads end-of-file (or anything: it has no business
// talking unasked), or `ended` (its pidfd, or -1) says it has ended: it died between calls.
bool went_away(int fd, int ended) { return wait_readable(fd, ended, 0) != Ready::kNotYet; }

}  // namespace

// A worker that has to go: how it ended, for the failure's message.
struct WorkerLost {
  std::string how;
  bool kill = false;  // still running (hung, too big, or talking nonsense): kill it first
  WorkerLoss reason = WorkerLoss::kCrashed;
};

namespace {

// A worker process just started, the daemon's end of its socket, and its pidfd (or -1).
struct Spawned {
  pid_t pid = -1;
  UniqueFd socket;
  UniqueFd ended;
};

// Starts a worker of `plugin`, pinned to the files whose SHA-256 `sha256` lists (comma-separated;
// empty: any), loading the `sealed` copies (when not null) instead of those files. Throws
// ConnectorFailure, `who` in front: RETRYABLE when no socket pair can be made, FATAL when the
// worker cannot be started.
Spawned spawn_worker(const IsolationOptions& options, const std::filesystem::path& plugin,
                     const std::string& sha256, const std::string& who, const SealedFiles* sealed) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    throw ConnectorFailure(BACKHAUL_RETRYABLE,
                           who + "socketpair for a worker: " + std::strerror(errno), 0);
  }
  UniqueFd mine(pair[0]), theirs(pair[1]);
  // dup2 onto descriptor 3 clears close-on-exec only when the numbers differ.
  if (theirs.get() == kWorkerSocketFd) {
    theirs = UniqueFd(::fcntl(kWorkerSocketFd, F_DUPFD_CLOEXEC, kWorkerSocketFd + 1));
  }

  std::vector<std::string> args = {options.worker_path.string(),
                                   "--plugin",
                                   plugin.string(),
                                   "--sha256",
                                   sha256,
                                   "--wire",
                                   std::to_string(kWorkerWire),
                                   "--http-timeout-ms",
                                   std::to_string(options.http_timeout.count()),
                                   "--log-level",
                                   options.log_level,
                                   "--log-format",
                                   options.log_json ? "json" : "text"};
  if (!options.ca_file.empty()) {
    args.push_back("--ca-file");
    args.push_back(options.ca_file);
  }
  if (!options.proxy_url.empty()) {
    args.insert(args.end(), {"--proxy", options.proxy_url});
    std::string hosts;
    for (const std::string& host : options.no_proxy) hosts += (hosts.empty() ? "" : ",") + host;
    if (!hosts.empty()) args.insert(args.end(), {"--no-proxy", hosts});
    if (!options.proxy_credentials_env.empty()) {
      args.insert(args.end(), {"--proxy-credentials-env", options.proxy_credentials_env});
    }
  }
  // Each sealed copy goes to its descriptor from a number above all of theirs, so that no dup2
  // below overwrites a copy before it is moved.
  std::vector<UniqueFd> staged;
  const int count = sealed ? static_cast<int>(sealed->size()) : 0;
  for (int i = 0; i < count; ++i) {
    const SealedFile& file = (*sealed)[static_cast<size_t>(i)];
    staged.emplace_back(::fcntl(file.fd.get(), F_DUPFD_CLOEXEC, kWorkerFirstSealedFd + count));
    if (!staged.back()) {
      throw ConnectorFailure(BACKHAUL_RETRYABLE,
                             who + "a descriptor for a worker: " + std::strerror(errno), 0);
    }
    args.push_back("--sealed");
    args.push_back(file.path.string());
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawnattr_init(&attributes);
  // No stdin; a plugin's prints go to stderr, beside its logs; the socket is descriptor 3.
  ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(&actions, 2, 1);
  ::posix_spawn_file_actions_adddup2(&actions, theirs.get(), kWorkerSocketFd);
  for (int i = 0; i < count; ++i) {
    ::posix_spawn_file_actions_adddup2(&actions, staged[static_cast<size_t>(i)].get(),
                                       kWorkerFirstSealedFd + i);
  }
  // Default signal actions and no blocked signals; its own process group, so a terminal's Ctrl-C
  // reaches the daemon (which drains) and not the workers its calls still need.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  ::posix_spawnattr_setsigmask(&attributes, &none);
  ::posix_spawnattr_setsigdefault(&attributes, &all);
  ::posix_spawnattr_setpgroup(&attributes, 0);
  ::posix_spawnattr_setflags(
      &attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  // The daemon's environment but its secrets.
  std::vector<char*> envp;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view variable(*entry);
    const std::string_view name = variable.substr(0, variable.find('='));
    const bool hidden = std::find(options.hidden_env.begin(), options.hidden_env.end(), name) !=
                        options.hidden_env.end();
    if (!hidden) envp.push_back(*entry);
  }
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, &attributes, argv.data(), envp.data());
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attributes);
  if (rc != 0) {
    // Out of processes or memory for now (EAGAIN, ENOMEM) passes, as the socketpair's failures
    // do: the call is retried, its job not dead-lettered. A worker that cannot be run is not.
    const bool passes = rc == EAGAIN || rc == ENOMEM;
    throw ConnectorFailure(
        passes ? BACKHAUL_RETRYABLE : BACKHAUL_FATAL,
        who + "cannot start the worker " + options.worker_path.string() + ": " + std::strerror(rc),
        0);
  }
  // Without one (a kernel before 5.3), a worker's end is seen by its socket alone. (Debian 12's
  // <sys/pidfd.h> declares pidfd_open without C linkage.)
  return {pid, std::move(mine), UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)))};
}

// "used N MB <when>, over the memory limit of M MB", or "" while within it (or with no limit).
std::string over_memory_limit(pid_t pid, size_t limit_mb, const std::string& when) {
  if (limit_mb == 0) return {};
  const int64_t used_kb = resident_kb(pid);
  if (used_kb <= static_cast<int64_t>(limit_mb) * 1024) return {};
  return "used " + std::to_string(used_kb / 1024) + " MB " + when + ", over the memory limit of " +
         std::to_string(limit_mb) + " MB";
}

// Waits until the worker's answer starts, the worker ends or the deadline passes; throws
// WorkerLost when the worker's memory passes the limit first.
void watch_memory(pid_t pid, int fd, int ended, SteadyClock::time_point deadline, size_t limit_mb,
                  const char* what) {
  constexpr auto kTick = std::chrono::milliseconds(10);
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now());
    if (left.count() <= 0) return;
    // read_frame meets what ended the wait (an answer, an error, the end) and says so.
    if (wait_readable(fd, ended, static_cast<int>(std::min(left, kTick).count())) !=
        Ready::kNotYet) {
      return;
    }
    if (std::string too_big = over_memory_limit(pid, limit_mb, std::string("during ") + what);
        !too_big.empty()) {
      throw WorkerLost{std::move(too_big) + ",", true, WorkerLoss::kMemory};
    }
  }
}

// Sends `request` to the worker `pid` on `fd` and returns the answer's body; throws WorkerLost
// when the worker dies (`ended`: its pidfd, or -1), hangs, outgrows the memory limit or answers
// what is not a frame.
std::string exchange(pid_t pid, int fd, int ended, const std::string& request, const char* what,
                     const IsolationOptions& options, const std::string& plugin_id) {
  const auto deadline = SteadyClock::now() + options.call_timeout;
  const auto timed_out = [&](const char* doing) {
    return WorkerLost{std::string(doing) + what + " within " +
                          std::to_string(options.call_timeout.count()) + " ms",
                      true, WorkerLoss::kTimedOut};
  };
  switch (send_frame(fd, request, deadline, ended)) {
    case SendEnd::kSent:
      break;
    case SendEnd::kClosed:
      throw WorkerLost{std::string("closed its socket before ") + what};
    case SendEnd::kEnded:
      throw WorkerLost{std::string("ended before it took ") + what};
    case SendEnd::kTimedOut:
      throw timed_out("did not take ");
  }
  if (options.memory_limit_mb > 0) {
    watch_memory(pid, fd, ended, deadline, options.memory_limit_mb, what);
  }
  // A worker's answer is a page it holds in its memory: with a limit, one bigger than that is not
  // a page, and this process does not take it in (it has no limit of its own).
  const size_t max_size =
      options.memory_limit_mb > 0
          ? std::min(kMaxFrame, static_cast<size_t>(options.memory_limit_mb) << 20)
          : kMaxFrame;
  std::string body;
  switch (read_frame(fd, &body, deadline, ended, max_size)) {
    case ReadEnd::kFrame:
      try {
        const http::HttpTally tally = take_tally(body);
        if (options.http_metrics && !plugin_id.empty()) {
          options.http_metrics->merge("plugin:" + plugin_id, tally);
        }
      } catch (const MalformedFrame& e) {
        throw WorkerLost{
            std::string("answered ") + what + " with a malformed frame (" + e.what() + ")", true,
            WorkerLoss::kMalformed};
      }
      return body;
    case ReadEnd::kClosed:
      throw WorkerLost{std::string("ended during ") + what};
    case ReadEnd::kTimedOut:
      throw timed_out("did not answer ");
    case ReadEnd::kTooBig:
      break;
  }
  throw WorkerLost{std::string("answered ") + what + " with an oversized frame (over " +
                       std::to_string(max_size >> 20) + " MiB" +
                       (max_size < kMaxFrame ? ", its memory limit" : "") + ")",
                   true, WorkerLoss::kMalformed};
}

// "worker process N <how it ended>", once it is reaped (`end`: what reap() said).
std::string worker_ended(pid_t pid, const WorkerLost& e, const std::string& end) {
  const std::string worker = "worker process " + std::to_string(pid) + " ";
  return e.kill ? worker + e.how + " and was killed" : worker + e.how + ": it " + end;
}

struct WorkerEnded : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One request in a worker process of its own, which then gets end-of-file and is reaped. Returns
// the answer's body; throws ConnectorFailure as spawn_worker() does, and WorkerEnded saying how
// the worker ended when it did not answer (worker_ended()).
std::string call_in_new_worker(const IsolationOptions& options, const std::filesystem::path& plugin,
                               const std::string& sha256, const SealedFiles* sealed,
                               const std::string& who, const std::string& request,
                               const char* what) {
  Spawned worker = spawn_worker(options, plugin, sha256, who, sealed);
  try {
    // Its requests are not counted: a one-off call has no plugin id to count them as yet.
    std::string body =
        exchange(worker.pid, worker.socket.get(), worker.ended.get(), request, what, options, "");
    worker.socket.reset();
    reap(worker.pid, false);
    return body;
  } catch (const WorkerLost& e) {
    worker.socket.reset();
    throw WorkerEnded(worker_ended(worker.pid, e, reap(worker.pid, e.kill)));
  } catch (...) {  // a malformed answer, say: the worker is ended and reaped all the same
    worker.socket.reset();
    reap(worker.pid, true);
    throw;
  }
}

}  // namespace

// --- load_isolated and the one-off calls --------------------------------------------------------

Plugin load_isolated(const std::filesystem::path& path, const IsolationOptions& isolation,
                     const LoadOptions& options) {
  std::string allowed;
  for (const std::string& hash : options.allowed_sha256) {
    allowed += (allowed.empty() ? "" : ",") + hash;
  }
  Writer request;
  request.u8(static_cast<uint8_t>(Op::kDescribe));
  PluginInfo info;
  try {
    const std::string body =
        call_in_new_worker(isolation, path, allowed, nullptr, path.string() + ": ",
                           std::move(request).finish(), "load");
    info = read_info(body, path);
  } catch (const ConnectorFailure& e) {  // what the worker's loader refused, or no worker started
    throw PluginLoadError(e.what());
  } catch (const WorkerEnded& e) {  // it crashed or hung in a static constructor or init(), say
    throw PluginLoadError(path.string() + ": in isolation mode, " + e.what());
  } catch (const MalformedFrame& e) {
    throw PluginLoadError(path.string() + ": in isolation mode, a worker process answered load " +
                          "with a malformed frame (" + e.what() + ")");
  }
  // The answer may be the plugin's own (it runs in that process, and can write to the socket
  // before the worker does): what the daemon keeps of it is checked as a loaded descriptor is.
  check_plugin_info(info);
  check_bundled(info);
  if (options.before_init) options.before_init(info);
  // What the worker loaded, copied here: later workers load these copies, and no other bytes.
  auto sealed = std::make_shared<SealedFiles>();
  auto seal = [&](const std::filesystem::path& file, const std::string& sha256) {
    SealedFile copy = seal_file(file);
    if (copy.sha256 != sha256) {
      throw PluginLoadError(path.string() + ": " + file.string() +
                            " changed while it was being loaded (sha256 " + sha256 + ", then " +
                            copy.sha256 + ")");
    }
    sealed->push_back(std::move(copy));
  };
  seal(path, info.sha256);
  for (const BundledLibrary& library : info.bundled_libraries) seal(library.path, library.sha256);
  logging::get("plugins")->info("loaded plugin {} {} (abi {}.{}) from {} in a worker process",
                                info.id, info.version, info.abi_version.major,
                                info.abi_version.minor, path.string());
  return Plugin(std::make_shared<const IsolatedPlugin>(
      IsolatedPlugin{std::move(info), isolation, std::move(sealed)}));
}

void validate_config_in_worker(const IsolatedPlugin& plugin, std::string_view config_json) {
  const std::string who = "plugin '" + plugin.info.id + "': ";
  Writer request;
  request.u8(static_cast<uint8_t>(Op::kValidateConfig)).str(config_json);
  try {
    const std::string body = call_in_new_worker(plugin.options, plugin.info.path,
                                                sha256_list(plugin.info), plugin.sealed.get(), who,
                                                std::move(request).finish(), "validate_config");
    Reader answer(body);
    throw_if_failed(answer);
    answer.end();
  } catch (const WorkerEnded& e) {
    throw PluginCrashed(who + e.what());
  } catch (const MalformedFrame& e) {
    throw PluginCrashed(who + "a worker process answered validate_config with a malformed frame (" +
                        e.what() + ")");
  }
}

// --- WorkerPool (the daemon's side) -------------------------------------------------------------

WorkerPool::WorkerPool(PluginInfo info, std::string config_json, IsolationOptions options,
                       std::shared_ptr<const SealedFiles> sealed, FirstWorkerCrash on_crash)
    : info_(std::move(info)),
      config_json_(std::move(config_json)),
      options_(std::move(options)),
      sealed_(std::move(sealed)) {
  if (options_.max_workers == 0) throw std::invalid_argument("IsolationOptions: max_workers is 0");
  if (on_crash == FirstWorkerCrash::kThrow) {
    give_back(acquire());
    return;
  }
  first_start_ = std::thread([this] { start_first(); });
  std::unique_lock lock(mutex_);
  if (first_started_.wait_for(lock, options_.start_wait, [this] { return first_done_; })) {
    lock.unlock();
    first_start_.join();
    if (first_error_) std::rethrow_exception(first_error_);
    return;
  }
  first_waited_ = false;
  lock.unlock();
  logging::get("plugins")->warn(
      "plugin '{}': its first worker has not started within {} ms; going on without it (it serves "
      "once started, and calls start workers of their own meanwhile)",
      info_.id, options_.start_wait.count());
}

void WorkerPool::start_first() {
  std::exception_ptr error;
  try {
    bool start = false;
    uint64_t interrupts = 0;
    {
      std::lock_guard lock(mutex_);
      if (!closing_ && live_ < options_.max_workers) {
        ++live_;
        start = true;
        interrupts = interrupts_;
      }
    }
    if (start) give_back(start_counted(interrupts));
  } catch (const PluginCrashed& e) {  // counted by start(); a refused config is no crash
    std::unique_lock lock(mutex_);
    if (!closing_) {
      lock.unlock();
      logging::get("plugins")->error("{}; each call will start a new worker", e.what());
    }
  } catch (...) {
    error = std::current_exception();
  }
  bool waited = false;
  {
    std::lock_guard lock(mutex_);
    first_done_ = true;
    waited = first_waited_;
    if (waited) first_error_ = error;
  }
  first_started_.notify_all();
  if (!error || waited) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {  // a refused config, say: each call now says it too
    logging::get("plugins")->error("plugin '{}': its first worker did not start: {}", info_.id,
                                   e.what());
  }
}

WorkerPool::~WorkerPool() {
  if (first_start_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
      kill_busy();  // only the first start: no call outlives its pool
    }
    first_start_.join();
  }
  std::vector<std::unique_ptr<Worker>> idle = std::move(idle_);
  for (auto& worker : idle) worker->socket.reset();  // each reads end-of-file and exits
  for (auto& worker : idle) reap(worker->pid, false);
}

size_t WorkerPool::interrupt() {
  size_t killed = 0;
  {
    std::lock_guard lock(mutex_);
    killed = kill_busy();
    ++interrupts_;
  }
  idle_changed_.notify_all();  // the calls waiting for a worker fail too
  return killed;
}

size_t WorkerPool::kill_busy() {
  // A PID in busy_ is not reaped (settle() takes it out first), so it is still its group's, and
  // the group takes with it what the plugin forked, which may hold the worker's socket open.
  for (pid_t pid : busy_) {
    kill_worker(pid);
    interrupted_.insert(pid);
  }
  return busy_.size();
}

WorkerStats WorkerPool::stats() const {
  std::lock_guard lock(mutex_);
  return {live_ - idle_.size(), idle_.size(), lost_};
}

void WorkerPool::count_loss(WorkerLoss reason) {
  std::lock_guard lock(mutex_);
  ++lost_[static_cast<size_t>(reason)];
}

size_t WorkerPool::live() const {
  std::lock_guard lock(mutex_);
  return live_;
}

size_t WorkerPool::waiting() const {
  std::lock_guard lock(mutex_);
  return waiting_;
}

std::vector<pid_t> WorkerPool::idle_pids() const {
  std::lock_guard lock(mutex_);
  std::vector<pid_t> pids;
  for (const auto& worker : idle_) pids.push_back(worker->pid);
  return pids;
}

std::unique_ptr<WorkerPool::Worker> WorkerPool::start(uint64_t interrupts) {
  const std::string who = "plugin '" + info_.id + "': ";
  Spawned spawned = spawn_worker(options_, info_.path, sha256_list(info_), who, sealed_.get());
  const pid_t pid = spawned.pid;
  if (options_.on_spawn) options_.on_spawn(pid);
  auto worker = std::make_unique<Worker>();
  worker->pid = pid;
  worker->socket = std::move(spawned.socket);
  worker->ended = std::move(spawned.ended);
  {
    std::lock_guard lock(mutex_);  // a stop may kill it while the plugin starts
    busy_.insert(pid);
    // The destructor, or an interrupt() since this start was counted, has killed the busy
    // workers: not yet this one.
    if (closing_ || interrupts_ != interrupts) {
      kill_worker(pid);
      interrupted_.insert(pid);
    }
  }

  Writer request;
  request.u8(static_cast<uint8_t>(Op::kCreate)).str(config_json_);
  try {
    std::string body = exchange(pid, worker->socket.get(), worker->ended.get(),
                                std::move(request).finish(), "create", options_, info_.id);
    Reader answer(body);
    throw_if_failed(answer);
    answer.end();
  } catch (const ConnectorFailure&) {  // the plugin refused the config, or could not load
    worker->socket.reset();
    settle(pid);
    reap(pid, false);
    throw;
  } catch (const WorkerLost& e) {  // it crashed in init() or create(), say: another try may do
    const bool interrupted = settle(pid);
    count_loss(interrupted ? WorkerLoss::kStopped : e.reason);
    const std::string end = reap(pid, e.kill);
    if (interrupted) {
      throw PluginCrashed(who + "worker process " + std::to_string(pid) +
                          " was stopped while starting: the daemon could not wait for it any "
                          "longer");
    }
    throw PluginCrashed(who + "worker process " + std::to_string(pid) + " " + e.how +
                        " while starting: it " + end);
  } catch (const MalformedFrame& e) {
    count_loss(settle(pid) ? WorkerLoss::kStopped : WorkerLoss::kMalformed);
    reap(pid, true);
    throw PluginCrashed(who + "worker process " + std::to_string(pid) +
                        " answered create with a malformed frame (" + e.what() +
                        ") and was killed");
  } catch (
      ...) {  // anything else: the worker is let go all the same (start_counted frees its slot)
    count_loss(settle(pid) ? WorkerLoss::kStopped : WorkerLoss::kMalformed);
    reap(pid, true);
    throw;
  }
  logging::get("plugins")->debug("plugin '{}': worker process {} started", info_.id, pid);
  return worker;
}

std::unique_ptr<WorkerPool::Worker> WorkerPool::acquire() {
  std::unique_lock lock(mutex_);
  const uint64_t interrupts = interrupts_;
  for (;;) {
    if (interrupts_ != interrupts) {
      throw PluginCrashed("plugin '" + info_.id +
                          "': a call waiting for a worker was stopped: the daemon could not wait "
                          "for it any longer");
    }
    if (!idle_.empty()) {
      std::unique_ptr<Worker> worker = std::move(idle_.back());
      idle_.pop_back();
      const bool ended = went_away(worker->socket.get(), worker->ended.get());
      const std::string too_big =
          ended ? std::string()
                : over_memory_limit(worker->pid, options_.memory_limit_mb, "while idle");
      if (!ended && too_big.empty()) {
        busy_.insert(worker->pid);
        return worker;
      }
      --live_;
      ++lost_[static_cast<size_t>(ended ? WorkerLoss::kDiedIdle : WorkerLoss::kMemory)];
      lock.unlock();
      const std::string end = reap(worker->pid, true);
      logging::get("plugins")->warn("plugin '{}': idle worker process {} {}", info_.id, worker->pid,
                                    ended ? end : too_big + ", and was replaced");
      lock.lock();
      continue;
    }
    if (live_ < options_.max_workers) {
      ++live_;
      lock.unlock();
      return start_counted(interrupts);  // busy from its spawn on
    }
    ++waiting_;
    idle_changed_.wait(lock);
    --waiting_;
  }
}

std::unique_ptr<WorkerPool::Worker> WorkerPool::start_counted(uint64_t interrupts) {
  try {
    return start(interrupts);
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      --live_;
    }
    idle_changed_.notify_one();
    throw;
  }
}

void WorkerPool::give_back(std::unique_ptr<Worker> worker) {
  {
    std::lock_guard lock(mutex_);
    busy_.erase(worker->pid);
    interrupted_.erase(worker->pid);  // it answered first: found dead when next taken
    idle_.push_back(std::move(worker));
  }
  idle_changed_.notify_one();
}

bool WorkerPool::settle(pid_t pid) {
  std::lock_guard lock(mutex_);
  busy_.erase(pid);
  return interrupted_.erase(pid) > 0;
}

template <class Decode>
auto WorkerPool::run(const std::string& request, const char* what, Decode&& decode) {
  std::unique_ptr<Worker> worker = acquire();
  try {
    auto result = decode(exchange(worker->pid, worker->socket.get(), worker->ended.get(), request,
                                  what, options_, info_.id));
    give_back(std::move(worker));
    return result;
  } catch (const ConnectorFailure&) {  // the plugin's own answer: the worker is fine
    give_back(std::move(worker));
    throw;
  } catch (const WorkerLost& e) {
    lost(std::move(worker), e, what);
  } catch (const MalformedFrame& e) {
    lost(std::move(worker),
         WorkerLost{std::string("answered ") + what + " with a malformed frame (" + e.what() + ")",
                    true, WorkerLoss::kMalformed},
         what);
  } catch (const std::exception& e) {  // no memory for the answer, say: the worker is let go,
    lost(std::move(worker),            // not kept busy for good with its slot
         WorkerLost{std::string("answered ") + what + " with what this process could not take (" +
                        e.what() + ")",
                    true, WorkerLoss::kMalformed},
         what);
  }
}

void WorkerPool::lost(std::unique_ptr<Worker> worker, const WorkerLost& e, const char* what) {
  const bool interrupted = settle(worker->pid);
  const std::string end = reap(worker->pid, e.kill);
  {
    std::lock_guard lock(mutex_);
    --live_;
    ++lost_[static_cast<size_t>(interrupted ? WorkerLoss::kStopped : e.reason)];
  }
  idle_changed_.notify_one();
  const std::string who = "plugin '" + info_.id + "': ";
  const std::string message = interrupted ? who + "worker process " + std::to_string(worker->pid) +
                                                " was stopped during " + what +
                                                ": the daemon could not wait for it any longer"
                                          : who + worker_ended(worker->pid, e, end);
  logging::get("plugins")->error("{}", message);
  throw PluginCrashed(message);
}

std::shared_ptr<OwnedPage> WorkerPool::fetch_page(const FetchParams& params) {
  Writer request;
  request.u8(static_cast<uint8_t>(Op::kFetch));
  write_unit(request, params.unit);
  request.str(params.entity_type).i64(params.since_unix_ms).opt(view(params.cursor));
  return run(std::move(request).finish(), "fetch_page",
             [](std::string body) { return read_page(std::move(body)); });
}

void WorkerPool::validate_scopes(const Unit& unit) {
  Writer request;
  request.u8(static_cast<uint8_t>(Op::kValidateScopes));
  write_unit(request, unit);
  run(std::move(request).finish(), "validate_scopes", [](std::string body) {
    Reader answer(body);
    throw_if_failed(answer);
    answer.end();
    return true;
  });
}

// --- the worker's side --------------------------------------------------------------------------

namespace {

// Whether the worker is busy: loading the plugin, or in a call until its answer is written. Of
// static storage, as the watching thread (watch_for_orphaning) may run until the process exits.
std::atomic<bool> worker_busy{true};

constexpr auto kOrphanGrace = std::chrono::seconds(10);

// Watches the daemon's end of the socket from a thread of its own. Should it close while the
// worker is busy, the daemon is gone (killed, or its start-up abandoned): the plugin may never
// return, and nobody is left to wait for it, so the worker's process group is killed, the worker
// with whatever its plugin started. Closed while the worker is idle, it is the main loop's
// end-of-file; should the plugin's deinit() then outlast kOrphanGrace, the group is killed too.

void watch_for_orphaning(int fd) {
  std::thread([fd] {
    pollfd p{fd, POLLRDHUP, 0};
    while (::poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    const auto give_up = SteadyClock::now() + kOrphanGrace;
    while (!worker_busy.load() && SteadyClock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // The daemon makes each worker the leader of a group of its own; one started otherwise (by
    // hand) ends alone.
    ::kill(::getpgrp() == ::getpid() ? 0 : ::getpid(), SIGKILL);
  }).detach();
}

}  // namespace

int serve_plugin_worker(int fd, const std::filesystem::path& plugin_path,
                        const std::set<std::string>& sha256, const HostServices& services,
                        const std::map<std::filesystem::path, int>& sealed_sources) {
  watch_for_orphaning(fd);
  std::optional<Plugin> plugin;
  std::string load_error;
  try {
    LoadOptions options;
    options.allowed_sha256 = sha256;
    options.sealed_sources = sealed_sources;
    plugin = load_plugin(plugin_path, services, options);
  } catch (const std::exception& e) {
    load_error = e.what();
  }
  // What create and validate_config answer when the plugin did not load (describe says it as is).
  const std::string not_loaded =
      "a worker process could not load the files the daemon loaded: " + load_error;
  std::optional<Connector> connector;
  for (;;) {
    worker_busy = false;
    std::string body;
    if (read_frame(fd, &body, std::nullopt) != ReadEnd::kFrame) return 0;  // the daemon is done
    worker_busy = true;
    std::string answer;
    try {
      Reader r(body);
      const auto op = static_cast<Op>(r.u8());
      if (op == Op::kDescribe) {
        r.end();
        if (!plugin) throw ConnectorFailure(BACKHAUL_FATAL, load_error, 0);
        answer = info_frame(plugin->info());
      } else if (op == Op::kValidateConfig) {
        const std::string_view config = r.str();
        r.end();
        if (!plugin) throw ConnectorFailure(BACKHAUL_FATAL, not_loaded, 0);
        plugin->validate_config(config);
        answer = ok_frame();
      } else if (op == Op::kCreate) {
        const std::string_view config = r.str();
        r.end();
        if (!plugin) throw ConnectorFailure(BACKHAUL_FATAL, not_loaded, 0);
        connector = plugin->create(config);
        answer = ok_frame();
      } else if (op == Op::kFetch) {
        FetchParams params;
        params.unit = read_unit(r);
        params.entity_type = r.str();
        params.since_unix_ms = r.i64();
        if (auto cursor = r.opt()) params.cursor = std::string(*cursor);
        r.end();
        if (!connector) throw MalformedFrame("fetch_page before create");
        answer = page_frame(connector->fetch_page(params));
      } else if (op == Op::kValidateScopes) {
        const Unit unit = read_unit(r);
        r.end();
        if (!connector) throw MalformedFrame("validate_scopes before create");
        connector->validate_scopes(unit);
        answer = ok_frame();
      } else {
        throw MalformedFrame("unknown request " + std::to_string(static_cast<int>(op)));
      }
    } catch (const ConnectorFailure& e) {
      answer = failure_frame(e.status(), e.what(), e.retry_after_ms());
    } catch (const MalformedFrame& e) {
      logging::get("plugins")->error("plugin worker: a malformed request: {}", e.what());
      return 2;
    } catch (const std::exception& e) {
      answer = failure_frame(BACKHAUL_FATAL, std::string("plugin worker: ") + e.what(), 0);
    }
    answer = with_tally(std::move(answer), services.http_metrics ? services.http_metrics->take_all()
                                                                 : http::HttpTally{});
    // Idle from here: the daemon may close its end as soon as it has the answer.
    worker_busy = false;
    if (send_frame(fd, answer) != SendEnd::kSent) return 0;
  }
}

}  // namespace backhaul::plugins
