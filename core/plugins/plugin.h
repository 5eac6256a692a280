// A loaded connector library, instances created from it, and the pages they return. Each object
// holds a shared_ptr to its library, so the library stays mapped while anything from it lives.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backhaul/backhaul.h"

#include "core/common/errors.h"

namespace backhaul::plugins {

// What breaks the ABI's rules in a page a plugin returned with BACKHAUL_OK: a struct too small for
// this host, events missing for a count, NULL strings, a delivery id, event type or next cursor
// that is not UTF-8 (the host sends them as JSON). Empty when nothing does. The daemon refuses
// such a page (a FATAL failure of the job); `backhaul plugin validate` reports every problem.
std::vector<std::string> page_problems(const backhaul_page_t& page);

class LoadedLibrary;      // the mapped library and its checked entry (loaded_library.h)
struct HostServices;      // plugin_loader.h
struct LoadOptions;       // plugin_loader.h
struct IsolationOptions;  // isolation.h
struct OwnedPage;         // isolation.h
class WorkerPool;         // isolation.h
struct IsolatedPlugin;    // isolation.h

// A library the plugin brings along, found through $ORIGIN in its RUNPATH/RPATH and loaded with
// it (plugin_loader.h).
struct BundledLibrary {
  std::filesystem::path path;
  std::string sha256;  // of the file as loaded (lower-case hex)
};

struct PluginInfo {
  std::string id;
  std::string version;
  std::string display_name;
  std::string description;
  std::vector<std::string> entity_types;
  std::vector<std::string> default_entity_types;
  std::string config_schema_json;
  backhaul_version_t abi_version{};
  std::filesystem::path path;
  std::string sha256;  // of the file as loaded (lower-case hex)
  // What it brought along through $ORIGIN, or shares with a plugin that brought it before.
  std::vector<BundledLibrary> bundled_libraries;
};

// A plugin call returned something other than BACKHAUL_OK.
class ConnectorFailure : public Error {
 public:
  ConnectorFailure(backhaul_status_t status, const std::string& message, int64_t retry_after_ms)
      : Error(message), status_(status), retry_after_ms_(retry_after_ms) {}
  backhaul_status_t status() const noexcept { return status_; }
  int64_t retry_after_ms() const noexcept { return retry_after_ms_; }
  bool is_retryable() const noexcept {
    return status_ == BACKHAUL_RETRYABLE || status_ == BACKHAUL_RATE_LIMITED ||
           status_ == BACKHAUL_AUTH_EXPIRED;
  }

 private:
  backhaul_status_t status_;
  int64_t retry_after_ms_;
};

// A plugin's failure as the host takes it, wherever the plugin ran: a status the ABI does not
// define is FATAL (`who` names the plugin and the call, the message is kept), and the wait is
// clamped to [0, one day] (a bigger one, INT64_MAX say, would overflow the time a job waits to).
ConnectorFailure plugin_failure(std::string_view who, backhaul_status_t status, std::string message,
                                int64_t retry_after_ms);

// Throws a FATAL ConnectorFailure naming the first thing wrong with a page the plugin `plugin_id`
// returned with BACKHAUL_OK: page_problems(), or two different events under one delivery id.
void check_page(std::string_view plugin_id, const backhaul_page_t& page);

// A call that ended the worker process it ran in (isolation.h): the plugin crashed, exited or
// hung there. RETRYABLE, as another attempt runs in a new worker; it says nothing about the
// provider, so it is no failure on the provider's circuit and no transient error to retry in place.
class PluginCrashed final : public ConnectorFailure {
 public:
  explicit PluginCrashed(const std::string& message)
      : ConnectorFailure(BACKHAUL_RETRYABLE, message, 0) {}
};

// What making a connector in worker processes does when its first worker crashes or hangs while
// starting (in the plugin's init() or create(), say; PluginCrashed): throw, or leave it to the
// calls. Deferred, the first worker starts on a thread of its own, and the making waits for it
// only up to IsolationOptions::start_wait. A crash is logged and the connector is made with no
// worker, so that each call starts one, failing RETRYABLE while starts crash, as a later start
// does. A start still under way then goes on without the making: its worker serves once it has
// started. A daemon defers: a crash or a hang costs attempts of that connector's jobs, not its
// start-up (SPEC B4), and one that does not come back (a network timeout, say) costs no more.
enum class FirstWorkerCrash { kThrow, kDefer };

// "OK", "RETRYABLE", ... for messages and reports.
std::string_view status_name(backhaul_status_t status);

struct Unit {
  std::string installation_id;
  std::string resource_id;
  std::optional<std::string> resource_name;
  std::string access_token;
};

struct FetchParams {
  Unit unit;
  std::string entity_type;
  int64_t since_unix_ms = 0;
  std::optional<std::string> cursor;  // nullopt: first page
};

struct EventView {
  std::string_view delivery_id;
  std::string_view event_type;
  std::string_view payload_json;
};

// A page returned by fetch_page; released back to the plugin when destroyed (a page from a worker
// process is the host's own copy). Move-only. [thread-safe] to read from several threads; destroy
// on any thread.
class Page {
 public:
  Page(Page&&) noexcept;
  Page& operator=(Page&&) noexcept;
  Page(const Page&) = delete;
  Page& operator=(const Page&) = delete;
  ~Page();

  size_t size() const noexcept { return page_->event_count; }
  EventView event(size_t i) const noexcept;
  std::optional<std::string_view> next_cursor() const noexcept;
  uint64_t raw_count() const noexcept { return page_->raw_count; }
  std::optional<backhaul_rate_limit_t> rate_limit() const noexcept;

 private:
  friend class Connector;
  Page(std::shared_ptr<const LoadedLibrary> library, std::shared_ptr<backhaul_instance_t> instance,
       backhaul_page_t* page) noexcept;
  explicit Page(std::shared_ptr<OwnedPage> owned) noexcept;
  std::shared_ptr<const LoadedLibrary> library_;
  std::shared_ptr<backhaul_instance_t> instance_;  // null for a page from a worker process
  std::shared_ptr<OwnedPage> owned_;               // only for a page from a worker process
  backhaul_page_t* page_;
};

// Why a worker process of a connector in isolation mode was lost (the /metrics label `reason`).
enum class WorkerLoss : uint8_t {
  kCrashed,    // it died (a signal, an exit) during a call or while starting
  kTimedOut,   // it did not answer a call within the call timeout, and was killed
  kMemory,     // it grew past the memory limit, during a call or while idle, and was killed
  kStopped,    // a stop that could wait no longer killed it (WorkerPool::interrupt)
  kMalformed,  // it answered what is not a frame of the protocol, and was killed
  kDiedIdle,   // it was found dead while idle
};
constexpr size_t kWorkerLossCount = 6;
// "crashed", "timed_out", "memory", "stopped", "malformed", "died_idle".
const char* loss_name(WorkerLoss loss) noexcept;

// The worker processes of a connector in isolation mode (isolation.h), for /metrics.
struct WorkerStats {
  size_t busy = 0;                                // running a call, or starting for one
  size_t idle = 0;                                // waiting for one
  std::array<uint64_t, kWorkerLossCount> lost{};  // by WorkerLoss
  uint64_t lost_total() const noexcept {
    uint64_t n = 0;
    for (uint64_t k : lost) n += k;
    return n;
  }
};

// One connector instance (a config applied to a plugin), in this process or in worker processes
// (Plugin::create_isolated). [thread-safe]: fetch_page and validate_scopes may be called from many
// threads at once, as the ABI promises.
class Connector {
 public:
  // Throws ConnectorFailure with the plugin's message.
  Page fetch_page(const FetchParams& params) const;
  void validate_scopes(const Unit& unit) const;
  const PluginInfo& info() const noexcept;
  // Its worker processes; nullopt when its calls run in this process.
  std::optional<WorkerStats> worker_stats() const;
  // Kills the worker processes running its calls (WorkerPool::interrupt); 0 in this process.
  size_t interrupt_calls() const;

 private:
  friend class Plugin;
  Connector(std::shared_ptr<const LoadedLibrary> library,
            std::shared_ptr<backhaul_instance_t> instance) noexcept;
  Connector(std::shared_ptr<const LoadedLibrary> library,
            std::shared_ptr<WorkerPool> workers) noexcept;
  std::shared_ptr<const LoadedLibrary> library_;   // null when its plugin is isolated too
  std::shared_ptr<backhaul_instance_t> instance_;  // null when isolated
  std::shared_ptr<WorkerPool> workers_;            // only when isolated
};

// A plugin library that passed every check and whose init() succeeded: in this process
// (load_plugin), or only in a worker process (load_isolated, plugin_loader.h), when none of its
// code runs here. Cheap to copy (shared).
class Plugin {
 public:
  const PluginInfo& info() const noexcept;
  // Throws ConnectorFailure (INVALID_ARGUMENT) with the plugin's message on a bad config. Of an
  // isolated plugin, in a worker process of its own (validate_config_in_worker, isolation.h).
  void validate_config(std::string_view config_json) const;
  // Of an isolated plugin, as create_isolated() with the options it was loaded with.
  Connector create(std::string_view config_json,
                   FirstWorkerCrash on_crash = FirstWorkerCrash::kThrow) const;
  // The same instance in worker processes (isolation.h, SPEC B4): its calls cannot crash this
  // process. Starts the first worker; throws as WorkerPool's constructor does.
  Connector create_isolated(std::string_view config_json, const IsolationOptions& options,
                            FirstWorkerCrash on_crash = FirstWorkerCrash::kThrow) const;
  // Non-null iff the plugin is ABI >= 1.1, has the extension and is loaded in this process.
  const void* extension(const char* id) const;
  // True when it was loaded in a worker process only (load_isolated).
  bool isolated() const noexcept { return isolated_ != nullptr; }

 private:
  friend class PluginRegistry;
  friend Plugin load_plugin(const std::filesystem::path&, const HostServices&, const LoadOptions&);
  friend Plugin load_isolated(const std::filesystem::path&, const IsolationOptions&,
                              const LoadOptions&);
  explicit Plugin(std::shared_ptr<const LoadedLibrary> library) noexcept;
  explicit Plugin(std::shared_ptr<const IsolatedPlugin> isolated) noexcept;
  std::shared_ptr<const LoadedLibrary> library_;    // null when isolated
  std::shared_ptr<const IsolatedPlugin> isolated_;  // only when isolated
};

}  // namespace backhaul::plugins
