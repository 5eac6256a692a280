// A connector written against the raw C ABI (no C++ SDK layer, so nothing catches for it) that
// breaks the contract in the way its create() config names, for the host's robustness tests.
//
// Config: any text containing one of the mode names below in double quotes, e.g.
// {"mode": "null_events"}; without one it behaves (one page, one event).
//   "null_events"        fetch_page returns OK and a page of 2 events whose events pointer is NULL
//   "utf8_delivery_id"   the event's delivery id is not valid UTF-8
//   "utf8_cursor"        the page's next cursor is not valid UTF-8
//   "throw_in_release"   release_page throws a C++ exception
//   "throw_in_destroy"   destroy throws a C++ exception
//   "log_null_host"      fetch_page calls host->log with a NULL host
//   "now_null_host"      fetch_page calls host->now_ms with a NULL host
//   "http_null_host"     fetch_page calls host->http with a NULL host
//   "http_null_headers"  fetch_page calls host->http with headers NULL and header_count 3
//   "http_double_release" fetch_page GETs MISBEHAVING_URL and releases the response twice
//   "rate_limited_forever" fetch_page returns RATE_LIMITED with retry_after_ms = INT64_MAX
// What fetch_page learnt from the host (status, message, clock) goes into the event's payload.
//
//   MISBEHAVING_INIT_THROWS  init() throws an int (not a std::exception)
//   MISBEHAVING_BAD_UTF8_NAME the display name is not valid UTF-8
//   MISBEHAVING_DEINIT_HANGS  deinit() never returns
//   MISBEHAVING_INIT_WAITS   init() creates the file named by the environment variable
//                            MISBEHAVING_INIT_MARKER (if set), then waits MISBEHAVING_INIT_WAIT_MS
//                            milliseconds, or for ever when that is not set; with
//                            MISBEHAVING_INIT_FORKS_TO (a file) set, it first forks a child that
//                            sleeps for ever (holding what the process has open) and writes its
//                            PID there, and ends the process with _exit(5) after the wait
//   MISBEHAVING_INIT_ABORTS  init() calls abort(), as a plugin that crashes while loading
//   MISBEHAVING_INIT_SPAWNS  init() starts `/bin/sleep 60` with posix_spawn (as a plugin starting a
//                            helper would) and writes its PID to the file named by the environment
//                            variable MISBEHAVING_SPAWN_PID_FILE (via a rename)
//   MISBEHAVING_RENDEZVOUS   while the environment variable MISBEHAVING_RENDEZVOUS_DIR is set,
//                            init() and create() each wait there until another process has
//                            reached the same step: each leaves a file "<step>-<pid>" (never
//                            removed) and waits until two are there, and fails after 20 s. Of two
//                            plugins a host runs one after the other, the first fails.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

#include "backhaul/backhaul.h"

#include <spawn.h>
#include <unistd.h>

extern char** environ;

#ifndef MISBEHAVING_ID
#define MISBEHAVING_ID "misbehaving"
#endif
#ifdef MISBEHAVING_BAD_UTF8_NAME
#define MISBEHAVING_DISPLAY_NAME "Bad \xff name"
#else
#define MISBEHAVING_DISPLAY_NAME "Misbehaving"
#endif
#define MISBEHAVING_URL "https://api.example.test/misbehaving"

namespace {

const backhaul_host_t* g_host = nullptr;

const char* const kTypes[] = {"item"};

const backhaul_descriptor_t kDescriptor = {sizeof(backhaul_descriptor_t),
                                           MISBEHAVING_ID,
                                           "1.0.0",
                                           MISBEHAVING_DISPLAY_NAME,
                                           "breaks the ABI contract on purpose",
                                           kTypes,
                                           1,
                                           kTypes,
                                           1,
                                           "{\"type\":\"object\"}"};

struct Instance {
  std::string mode;
};

struct OwnPage {
  backhaul_page_t page{};
  backhaul_event_t event{};
  std::string delivery_id;
  std::string payload;
  std::string cursor;
};

backhaul_string_t str(const std::string& s) { return {s.data(), s.size()}; }
backhaul_string_t lit(const char* s) { return {s, std::strlen(s)}; }

const char* const kModes[] = {"null_events",         "utf8_delivery_id",    "utf8_cursor",
                              "throw_in_release",    "throw_in_destroy",    "log_null_host",
                              "now_null_host",       "http_null_host",      "http_null_headers",
                              "http_double_release", "rate_limited_forever"};

// MISBEHAVING_RENDEZVOUS: true once two processes have reached `step`, false after 20 s alone.
bool rendezvous([[maybe_unused]] const char* step) {
#ifdef MISBEHAVING_RENDEZVOUS
  const char* dir = std::getenv("MISBEHAVING_RENDEZVOUS_DIR");
  if (!dir) return true;
  namespace fs = std::filesystem;
  const std::string prefix = std::string(step) + "-";
  std::FILE* file = std::fopen((fs::path(dir) / (prefix + std::to_string(getpid()))).c_str(), "w");
  if (!file) return false;
  std::fclose(file);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < give_up) {
    int arrived = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().filename().string().rfind(prefix, 0) == 0) ++arrived;
    }
    if (arrived >= 2) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
#else
  return true;
#endif
}

int32_t init(const backhaul_host_t* host, backhaul_error_t* error) {
  if (!rendezvous("init")) {
    std::snprintf(error->message, sizeof error->message, "no other plugin came within 20 s");
    return 0;
  }
#ifdef MISBEHAVING_INIT_WAITS
  if (const char* marker = std::getenv("MISBEHAVING_INIT_MARKER")) {
    if (FILE* file = std::fopen(marker, "w")) std::fclose(file);
  }
  const char* forks_to = std::getenv("MISBEHAVING_INIT_FORKS_TO");
  if (forks_to) {
    const pid_t child = fork();
    if (child == 0) {
      for (;;) pause();
    }
    const std::string temporary = std::string(forks_to) + ".tmp";
    if (FILE* file = std::fopen(temporary.c_str(), "w")) {
      std::fprintf(file, "%d\n", static_cast<int>(child));
      std::fclose(file);
      std::rename(temporary.c_str(), forks_to);
    }
  }
  const char* wait_ms = std::getenv("MISBEHAVING_INIT_WAIT_MS");
  if (!wait_ms) {
    for (;;) pause();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(wait_ms)));
  if (forks_to) _exit(5);
#endif
#ifdef MISBEHAVING_INIT_SPAWNS
  if (const char* pid_file = std::getenv("MISBEHAVING_SPAWN_PID_FILE")) {
    char sleep_path[] = "/bin/sleep";
    char seconds[] = "60";
    char* argv[] = {sleep_path, seconds, nullptr};
    pid_t pid = -1;
    if (posix_spawn(&pid, sleep_path, nullptr, nullptr, argv, environ) == 0) {
      const std::string temporary = std::string(pid_file) + ".tmp";
      if (FILE* file = std::fopen(temporary.c_str(), "w")) {
        std::fprintf(file, "%d\n", static_cast<int>(pid));
        std::fclose(file);
        std::rename(temporary.c_str(), pid_file);
      }
    }
  }
#endif
#ifdef MISBEHAVING_INIT_ABORTS
  std::abort();
#endif
#ifdef MISBEHAVING_INIT_THROWS
  (void)host;
  throw 42;
#else
  g_host = host;
  return 1;
#endif
}

void deinit() {
#ifdef MISBEHAVING_DEINIT_HANGS
  for (;;) pause();
#endif
  g_host = nullptr;
}

backhaul_status_t validate_config(backhaul_string_t, backhaul_error_t*) { return BACKHAUL_OK; }

backhaul_status_t create(backhaul_string_t config, backhaul_instance_t** instance,
                         backhaul_error_t* error) {
  if (!rendezvous("create")) {
    std::snprintf(error->message, sizeof error->message, "no other instance came within 20 s");
    return BACKHAUL_FATAL;
  }
  std::string text(config.data ? config.data : "", config.data ? config.size : 0);
  auto* self = new Instance;
  for (const char* mode : kModes) {
    if (text.find("\"" + std::string(mode) + "\"") != std::string::npos) self->mode = mode;
  }
  *instance = reinterpret_cast<backhaul_instance_t*>(self);
  return BACKHAUL_OK;
}

void destroy(backhaul_instance_t* instance) {
  auto* self = reinterpret_cast<Instance*>(instance);
  bool do_throw = self->mode == "throw_in_destroy";
  delete self;
  if (do_throw) throw std::runtime_error("destroy failed");
}

backhaul_status_t validate_scopes(backhaul_instance_t*, const backhaul_unit_t*, backhaul_error_t*) {
  return BACKHAUL_OK;
}

// Calls the host the way `mode` says; returns what it saw as JSON text.
std::string use_host(const std::string& mode) {
  backhaul_error_t error{};
  backhaul_http_response_t* response = nullptr;
  backhaul_http_request_t request{};
  request.struct_size = sizeof(request);
  request.method = lit("GET");
  request.url = lit(MISBEHAVING_URL);
  if (mode == "log_null_host") {
    g_host->log(nullptr, BACKHAUL_LOG_INFO, lit("hello"));
    return "{\"logged\":true}";
  }
  if (mode == "now_null_host") {
    return "{\"now_ms\":" + std::to_string(g_host->now_ms(nullptr)) + "}";
  }
  backhaul_status_t status = BACKHAUL_OK;
  if (mode == "http_null_host") {
    status = g_host->http(nullptr, &request, &response, &error);
  } else if (mode == "http_null_headers") {
    request.headers = nullptr;
    request.header_count = 3;
    status = g_host->http(g_host, &request, &response, &error);
  } else if (mode == "http_double_release") {
    status = g_host->http(g_host, &request, &response, &error);
    if (response) {
      g_host->http_release(g_host, response);
      g_host->http_release(g_host, response);  // the contract breach
      response = nullptr;
    }
  } else {
    return "{}";
  }
  if (response) g_host->http_release(g_host, response);
  error.message[sizeof(error.message) - 1] = '\0';
  std::string message;
  for (const char* p = error.message; *p; ++p) {
    if (*p != '"' && *p != '\\') message += *p;
  }
  return "{\"status\":" + std::to_string(status) + ",\"message\":\"" + message + "\"}";
}

backhaul_status_t fetch_page(backhaul_instance_t* instance, const backhaul_fetch_request_t*,
                             backhaul_page_t** out, backhaul_error_t* error) {
  const std::string& mode = reinterpret_cast<Instance*>(instance)->mode;
  if (mode == "rate_limited_forever") {
    std::snprintf(error->message, sizeof error->message, "wait for ever");
    error->retry_after_ms = INT64_MAX;
    return BACKHAUL_RATE_LIMITED;
  }
  auto* p = new OwnPage;
  p->page.struct_size = sizeof(backhaul_page_t);
  p->delivery_id = mode == "utf8_delivery_id" ? "misbehaving-\xff\xfe-1" : "misbehaving-1";
  p->payload = use_host(mode);
  p->event.delivery_id = str(p->delivery_id);
  p->event.event_type = lit("item");
  p->event.payload_json = str(p->payload);
  p->page.events = &p->event;
  p->page.event_count = 1;
  p->page.raw_count = 1;
  if (mode == "null_events") {
    p->page.events = nullptr;
    p->page.event_count = 2;
    p->page.raw_count = 2;
  }
  if (mode == "utf8_cursor") {
    p->cursor = "page-\xc3\x28";
    p->page.next_cursor = str(p->cursor);
  }
  *out = &p->page;
  return BACKHAUL_OK;
}

void release_page(backhaul_instance_t* instance, backhaul_page_t* page) {
  if (!page) return;
  delete reinterpret_cast<OwnPage*>(page);  // page is the first member
  if (reinterpret_cast<Instance*>(instance)->mode == "throw_in_release")
    throw std::runtime_error("release_page failed");
}

const void* get_extension(const char*) { return nullptr; }

}  // namespace

extern "C" BACKHAUL_EXPORT const backhaul_entry_t backhaul_entry = {sizeof(backhaul_entry_t),
                                                                    BACKHAUL_ABI_VERSION_INIT,
                                                                    BACKHAUL_MAGIC_INIT,
                                                                    &kDescriptor,
                                                                    &init,
                                                                    &deinit,
                                                                    &validate_config,
                                                                    &create,
                                                                    &destroy,
                                                                    &validate_scopes,
                                                                    &fetch_page,
                                                                    &release_page,
                                                                    &get_extension};
