// A configurable connector built with the C++ SDK layer, for the loader and host-service tests.
//
// Config (all optional): {"pages": 3, "per_page": 2, "fail": "<mode>", "http_url": "<url>",
//                         "rate_limit_remaining": N, "crash_on_page": N, "scopes": "abort"}
//   fail: "retryable" | "rate_limited" | "auth" | "fatal" | "invalid" | "std_exception" |
//         "unknown_exception" — every fetch_page fails that way; "forge_lines" — FATAL with a
//         message that holds a line break and terminal escapes (a line of its own in a log);
//         "long_message" — FATAL with a message of 5000 bytes (the SDK cuts it to 1024);
//         "echo_token" — fails FATAL with the unit's access token in its message, as a careless
//         plugin would; "abort" | "exit" | "hang" | "stdout" — every fetch_page calls abort(),
//         calls _Exit(3), never returns, or prints to stdout first (for isolation mode: a host
//         running it in-process ends or hangs too); "leave_group" — every fetch_page moves its
//         process into its parent's process group, then never returns (isolation mode only);
//         "garble" — every fetch_page writes a frame
//         header claiming a body of almost 1 GiB to descriptor 3 (a worker's socket, isolation.h;
//         only for isolation mode), then never returns. "forge_wait" | "forge_status" |
//         "forge_page" — every fetch_page writes an answer of its own to descriptor 3, then ends
//         its worker with _Exit(0): RATE_LIMITED with a wait of INT64_MAX ms, status 77, or a page
//         with two different events under one delivery id (what the host would refuse from
//         fetch_page, written past its checks).
//   crash_on_page: fetch_page of that page (1 is the first) calls abort().
//   scopes: "abort" — validate_scopes calls abort().
//   abort_in_validate: "yes" — validate_config (create() too) calls abort().
//   env: a variable's name — each event's payload has "env": its value (null when unset).
//   environ_grep: a text — each event's payload has "environ_has": whether the process's initial
//   environment block (/proc/self/environ, which unsetenv() does not change) contains it (null
//   when the block cannot be read).
//   grow_mb: every fetch_page allocates and writes that many MB, then never returns.
//   grow_later_mb: the first fetch_page returns its page and leaves a thread that then allocates
//   and writes that many MB (the process grows between calls); destroy() joins it.
//   fork_sleeper: every fetch_page first forks a child that sleeps for ever, and writes its PID to
//   the file of that path (for isolation mode: the plugin's own processes end with its worker).
//   abort_in_create_if: create() calls abort() while a file of that path exists.
//   hang_in_create_if: create() waits while a file of that path exists (for ever, if it is never
//   removed).
//   escape_in_create: create() forks a child that leaves the process group for a session of its
//   own (setsid()) and sleeps for ever, and appends its PID to the file of that path.
//   detach_in_create: create() starts a process as a daemon does (a session of its own, its
//   parent ended, every descriptor closed, so that it holds nothing of its caller's) that sleeps
//   for ever, and the process appends its PID to the file of that path before create() returns.
//   wait_in_validate_if: validate_config waits while a file of that path exists, having created
//   the file "<that path>.entered" (for a request of the host's held inside the plugin).
//   cut_payloads: "yes" — every payload lacks its closing brace (not JSON).
//   http_url: fetch_page first GETs this URL through the host and puts the answer in the payload.
// And, set in the environment as the library loads: FAKE_FORGE_DESCRIBE (see forged_describe).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backhaul/connector.hpp"

#include <sys/wait.h>
#include <unistd.h>

namespace {

using backhaul::sdk::Error;

const char* const kTypes[] = {"item", "other"};
const char* const kDefaults[] = {"item"};

constexpr backhaul_descriptor_t kDescriptor = {
    sizeof(backhaul_descriptor_t),
    FAKE_PLUGIN_ID,
    "2.1.0",
    "Fake",
    "generates numbered items; for tests",
    kTypes,
    2,
    kDefaults,
    1,
    R"({"type":"object","properties":{"pages":{"type":"integer"}}})"};

// A tiny reader for flat {"key": value} configs, so this plugin needs no JSON library.
std::string config_value(std::string_view config, std::string_view key) {
  std::string quoted = "\"" + std::string(key) + "\"";
  size_t k = config.find(quoted);
  if (k == std::string_view::npos) return {};
  size_t colon = config.find(':', k + quoted.size());
  size_t start = config.find_first_not_of(" \t\n", colon + 1);
  if (start == std::string_view::npos) return {};
  if (config[start] == '"') {
    size_t end = config.find('"', start + 1);
    return std::string(config.substr(start + 1, end - start - 1));
  }
  size_t end = config.find_first_of(",} \n", start);
  return std::string(config.substr(start, end - start));
}

bool exists(const std::string& path) {
  if (path.empty()) return false;
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (file) std::fclose(file);
  return file != nullptr;
}

// A worker's answer as isolation.cpp frames it: little-endian lengths and integers, the body's
// length in front, the HTTP tally (7 counts, all 0 here) at the end.
class Frame {
 public:
  Frame& u8(uint8_t v) {
    body_.push_back(static_cast<char>(v));
    return *this;
  }
  Frame& i64(int64_t v) {
    for (int i = 0; i < 8; ++i)
      body_.push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i)));
    return *this;
  }
  Frame& str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    body_ += s;
    return *this;
  }
  [[noreturn]] void send_and_exit() {
    for (int i = 0; i < 7; ++i) i64(0);
    std::string frame(4, '\0');
    for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>(body_.size() >> (8 * i));
    frame += body_;
    if (::write(3, frame.data(), frame.size()) != static_cast<ssize_t>(frame.size())) std::abort();
    std::_Exit(0);
  }

 private:
  std::string body_;
};

[[noreturn]] void hang() {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// With FAKE_FORGE_DESCRIBE set to the SHA-256 of this file (isolation mode only): as the library
// is loaded, before the worker can answer what it loaded, a description of the plugin's own goes
// to descriptor 3, and the worker ends. Its id is FAKE_FORGE_ID ("Not An Id" when unset), and it
// lists FAKE_FORGE_BUNDLED (0) bundled libraries that are not there.
[[maybe_unused]] const bool forged_describe = [] {
  const char* sha256 = std::getenv("FAKE_FORGE_DESCRIBE");
  if (!sha256) return false;
  const char* id = std::getenv("FAKE_FORGE_ID");
  const char* bundled = std::getenv("FAKE_FORGE_BUNDLED");
  const int libraries = bundled ? std::atoi(bundled) : 0;
  Frame f;
  f.u8(BACKHAUL_OK).str(id ? id : "Not An Id").str("1.0.0").str("Forged").str("");
  f.i64(1).str("issue").i64(0).str("{}").i64(1).i64(1).str(sha256).i64(libraries);
  for (int i = 0; i < libraries; ++i)
    f.str("/nonexistent/lib" + std::to_string(i) + ".so").str(sha256);
  f.send_and_exit();
}();

// detach_in_create: the process (the child of a child that has ended) writes its PID, then closes
// every descriptor, and with it its copy of `written`'s write end: the EOF that create() waits for.
void detach_sleeper(const std::string& file) {
  int written[2];
  if (::pipe(written) != 0) std::abort();
  const pid_t middle = ::fork();
  if (middle == 0) {
    ::setsid();
    if (::fork() == 0) {
      if (std::FILE* out = std::fopen(file.c_str(), "a")) {
        std::fprintf(out, "%d\n", static_cast<int>(::getpid()));
        std::fclose(out);
      }
      for (int fd = 0; fd < 1024; ++fd) ::close(fd);
      for (;;) ::pause();
    }
    ::_exit(0);
  }
  ::close(written[1]);
  char byte;
  while (::read(written[0], &byte, 1) > 0) {
  }
  ::close(written[0]);
  ::waitpid(middle, nullptr, 0);
}

// Allocates `mb` MB, written so that it is resident, and kept for good.
void grow(int mb) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<char[]>> hoard;
  std::lock_guard lock(mutex);
  for (int i = 0; i < mb; ++i) {
    hoard.push_back(std::make_unique<char[]>(size_t{1} << 20));
    std::memset(hoard.back().get(), 1, size_t{1} << 20);
  }
}

class FakeConnector final : public backhaul::sdk::Connector {
 public:
  ~FakeConnector() override {
    if (grower_.joinable()) grower_.join();
  }

  explicit FakeConnector(std::string_view config) {
    validate_config(config);
    if (exists(config_value(config, "abort_in_create_if"))) std::abort();
    while (exists(config_value(config, "hang_in_create_if"))) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (const std::string escape = config_value(config, "escape_in_create"); !escape.empty()) {
      const pid_t child = ::fork();
      if (child == 0) {
        ::setsid();
        for (;;) ::pause();
      }
      if (std::FILE* out = std::fopen(escape.c_str(), "a")) {
        std::fprintf(out, "%d\n", static_cast<int>(child));
        std::fclose(out);
      }
    }
    if (const std::string detach = config_value(config, "detach_in_create"); !detach.empty())
      detach_sleeper(detach);
    if (auto v = config_value(config, "pages"); !v.empty()) pages_ = std::atoi(v.c_str());
    if (auto v = config_value(config, "per_page"); !v.empty()) per_page_ = std::atoi(v.c_str());
    if (auto v = config_value(config, "rate_limit_remaining"); !v.empty())
      remaining_ = std::atoi(v.c_str());
    if (auto v = config_value(config, "crash_on_page"); !v.empty())
      crash_on_page_ = std::atoi(v.c_str());
    if (auto v = config_value(config, "grow_mb"); !v.empty()) grow_mb_ = std::atoi(v.c_str());
    if (auto v = config_value(config, "grow_later_mb"); !v.empty())
      grow_later_mb_ = std::atoi(v.c_str());
    fail_ = config_value(config, "fail");
    fork_sleeper_ = config_value(config, "fork_sleeper");
    abort_in_scopes_ = config_value(config, "scopes") == "abort";
    http_url_ = config_value(config, "http_url");
    env_name_ = config_value(config, "env");
    environ_grep_ = config_value(config, "environ_grep");
    cut_payloads_ = config_value(config, "cut_payloads") == "yes";
  }

  static void validate_config(std::string_view config) {
    if (config_value(config, "abort_in_validate") == "yes") std::abort();
    if (const std::string wait = config_value(config, "wait_in_validate_if"); exists(wait)) {
      if (std::FILE* entered = std::fopen((wait + ".entered").c_str(), "w")) std::fclose(entered);
      while (exists(wait)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (config.empty() || config.front() != '{') {
      throw Error(BACKHAUL_INVALID_ARGUMENT, "config must be a JSON object");
    }
    if (auto v = config_value(config, "pages"); !v.empty() && std::atoi(v.c_str()) < 1) {
      throw Error(BACKHAUL_INVALID_ARGUMENT, "config.pages must be >= 1");
    }
  }

  void validate_scopes(const backhaul::sdk::Unit& unit) override {
    if (abort_in_scopes_) std::abort();
    if (unit.access_token == "bad-token") throw Error(BACKHAUL_FATAL, "token cannot read resource");
  }

  backhaul::sdk::Page fetch_page(const backhaul::sdk::FetchRequest& request) override {
    if (!fork_sleeper_.empty()) {
      const pid_t child = ::fork();
      if (child == 0) {
        for (;;) ::pause();
      }
      if (std::FILE* out = std::fopen(fork_sleeper_.c_str(), "w")) {
        std::fprintf(out, "%d\n", static_cast<int>(child));
        std::fclose(out);
      }
    }
    if (fail_ == "echo_token") {
      throw Error(BACKHAUL_FATAL, "the provider refused token " +
                                      std::string(request.unit.access_token) + " for good");
    }
    fail_if_asked();
    if (grow_mb_ > 0) {
      grow(grow_mb_);
      hang();
    }
    if (static bool grown = false; grow_later_mb_ > 0 && !grown) {
      grown = true;
      grower_ = std::thread([mb = grow_later_mb_] { grow(mb); });
    }
    std::string http_note = "null";
    if (!http_url_.empty()) {
      backhaul::sdk::HttpRequest get;
      get.url = http_url_;
      get.headers.emplace_back("Authorization", "Bearer " + std::string(request.unit.access_token));
      auto response = backhaul::sdk::Host::http(get);
      http_note = "{\"status\":" + std::to_string(response.status()) + ",\"final_url\":\"" +
                  std::string(response.final_url()) + "\"}";
    }
    int page = request.cursor ? std::atoi(std::string(*request.cursor).c_str()) : 1;
    if (page == crash_on_page_) std::abort();
    if (page < 1 || page > pages_) throw Error(BACKHAUL_INVALID_ARGUMENT, "cursor out of range");
    backhaul::sdk::Page out;
    for (int i = 0; i < per_page_; ++i) {
      int n = (page - 1) * per_page_ + i + 1;
      std::string id = "fake-" + std::string(request.unit.installation_id) + "-" +
                       std::string(request.unit.resource_id) + "-" +
                       std::string(request.entity_type) + "-" + std::to_string(n);
      out.events.push_back({id, std::string(request.entity_type),
                            "{\"n\":" + std::to_string(n) + ",\"http\":" + http_note +
                                ",\"now_ms\":" + std::to_string(backhaul::sdk::Host::now_ms()) +
                                env_note() + "}"});
    }
    if (cut_payloads_) {  // each payload loses its last byte: no longer JSON
      for (auto& event : out.events) event.payload_json.pop_back();
    }
    out.raw_count = static_cast<uint64_t>(per_page_) + 1;  // pretend one item was filtered
    if (page < pages_) out.next_cursor = std::to_string(page + 1);
    if (remaining_ >= 0) out.rate_limit = backhaul::sdk::RateLimit{remaining_, 5000, 1234000};
    backhaul::sdk::Host::log(BACKHAUL_LOG_DEBUG, "fetched page " + std::to_string(page));
    return out;
  }

 private:
  void fail_if_asked() const {
    if (fail_.empty()) return;
    if (fail_ == "retryable") throw Error(BACKHAUL_RETRYABLE, "upstream 503");
    if (fail_ == "rate_limited") throw Error(BACKHAUL_RATE_LIMITED, "slow down", 5000);
    if (fail_ == "auth") throw Error(BACKHAUL_AUTH_EXPIRED, "token expired");
    if (fail_ == "fatal") throw Error(BACKHAUL_FATAL, "repository is gone");
    if (fail_ == "forge_lines") {
      throw Error(BACKHAUL_FATAL, "gone\nsummary: all units succeeded\x1b[2K\r");
    }
    if (fail_ == "invalid") throw Error(BACKHAUL_INVALID_ARGUMENT, "bad cursor");
    if (fail_ == "long_message") {
      throw Error(BACKHAUL_FATAL, "upstream said: " + std::string(4985, 'x'));
    }
    if (fail_ == "std_exception") throw std::logic_error("bug in connector");
    if (fail_ == "unknown_exception") throw 42;
    if (fail_ == "abort") std::abort();
    if (fail_ == "exit") std::_Exit(3);
    if (fail_ == "hang") hang();
    if (fail_ == "leave_group") {
      // Into the group of the worker's parent (same session), out of reach of a signal to its own.
      if (::setpgid(0, ::getpgid(::getppid())) != 0) std::abort();
      hang();
    }
    if (fail_ == "garble") {
      const unsigned char header[4] = {0xff, 0xff, 0xff, 0x3f};
      if (::write(3, header, sizeof header) != sizeof header) std::abort();
      hang();
    }
    if (fail_ == "forge_wait") {
      Frame().u8(BACKHAUL_RATE_LIMITED).str("slow down").i64(INT64_MAX).send_and_exit();
    }
    if (fail_ == "forge_status") Frame().u8(77).str("odd").i64(0).send_and_exit();
    if (fail_ == "forge_page") {
      Frame page;
      page.u8(BACKHAUL_OK).i64(2).u8(0).u8(0).i64(2);
      page.str("same-id").str("issue").str(R"({"n":1})");
      page.str("same-id").str("issue").str(R"({"n":2})");
      page.send_and_exit();
    }
    if (fail_ == "stdout") {
      std::fputs("a plugin's stray print\n", stdout);
      std::fflush(stdout);
    }
  }

  int pages_ = 3;
  int per_page_ = 2;
  int64_t remaining_ = -1;
  int crash_on_page_ = 0;
  int grow_mb_ = 0;
  int grow_later_mb_ = 0;
  // Joined when the instance is destroyed: its code must not run on once the library is unloaded.
  std::thread grower_;
  bool abort_in_scopes_ = false;
  std::string fail_;
  std::string fork_sleeper_;
  std::string http_url_;
  std::string env_name_;
  std::string environ_grep_;
  bool cut_payloads_ = false;

  // ",\"env\":\"<value>\"" of the variable the config names ("env"), null when unset; "" when
  // none is named.
  std::string env_note() const {
    std::string note;
    if (!env_name_.empty()) {
      const char* value = std::getenv(env_name_.c_str());
      note += value ? ",\"env\":\"" + std::string(value) + "\"" : ",\"env\":null";
    }
    if (!environ_grep_.empty()) {
      // null when the block cannot be read: no answer, rather than "not there"
      std::string block;
      FILE* f = std::fopen("/proc/self/environ", "rb");
      if (f) {
        char buffer[4096];
        size_t n;
        while ((n = std::fread(buffer, 1, sizeof buffer, f)) > 0) block.append(buffer, n);
        std::fclose(f);
      }
      const bool has = block.find(environ_grep_) != std::string::npos;
      note += std::string(",\"environ_has\":") + (!f ? "null" : has ? "true" : "false");
    }
    return note;
  }
};

}  // namespace

BACKHAUL_DEFINE_CONNECTOR(FakeConnector, kDescriptor);
