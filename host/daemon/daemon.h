// backhauld wired together: the job store, the connector plugins and one connector per plugin,
// the gateway client, the pipeline and the scheduler, and the admin API server. Everything but
// main() lives here so tests can run a whole daemon in-process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/common/clock.h"
#include "core/jobs/job_store.h"
#include "core/plugins/isolation.h"
#include "core/plugins/plugin_loader.h"
#include "host/daemon/config.h"

namespace backhaul::daemon {

// The options of each connector's worker pool, from plugins.isolation and the settings the workers
// share with the daemon (log, HTTP timeout, CA file); nullopt when the mode is "none".
std::optional<plugins::IsolationOptions> isolation_options(const DaemonConfig& config);

// What `backhauld --check-config` checks beyond the file: the plugin directories loaded as start()
// loads them (allow-list and isolation mode included, so a plugin's init() runs), and each loaded
// plugin's check of its connector config (plugins.connectors.<id>, "{}" when absent). `errors`
// are what would end start() ("config: plugins.connectors.<id>: why"); `warnings` what start()
// logs and goes on after (a file not loaded, a config for no loaded plugin, a plugin whose worker
// died checking). No store, gateway or port is touched.
struct PluginCheck {
  std::vector<std::string> errors;
  std::vector<std::string> warnings;
};
PluginCheck check_plugins(const DaemonConfig& config, const Clock& clock = SystemClock::instance());

class Daemon {
 public:
  // `clock` must outlive the daemon. Nothing is opened before start().
  explicit Daemon(DaemonConfig config, const Clock& clock = SystemClock::instance());
  ~Daemon();  // stop()s
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Opens (and migrates) the store, loads the plugin directories and creates each plugin's
  // connector from its config object, starts the scheduler and the admin server. Throws
  // ConfigError (a connector config the plugin refuses, an unusable audit log), StorageError,
  // Poco::Exception (the admin address cannot be bound). [main-thread]
  void start();
  // Graceful shutdown (SPEC F6): stops accepting API requests, then drains the scheduler within
  // shutdown.grace_ms (in-flight pages finish, the rest is released without counting an
  // attempt); the API requests under way are answered within that grace too (then their
  // connections are closed, and their handlers waited for). Idempotent. [main-thread]
  void stop();
  // Ends the grace of the stop() under way now (or of the next one): the jobs still in a handler
  // are asked to stop at their next page boundary and released, and the connections of API
  // requests under way are closed. For a second SIGTERM. Call it
  // only after start() has returned. [thread-safe]
  void hurry();

  // Isolation mode: kills the plugin worker processes that are running a call, so that the
  // handlers waiting on them get a failure (an attempt) and return. For a stop that cannot wait for
  // a plugin any longer. Returns how many were killed; 0 without isolation. Call it only after
  // start() has returned. [thread-safe]
  size_t interrupt_plugin_calls();

  // What start() is doing ("opening the audit log", "opening the store", "loading plugins",
  // "starting the scheduler", "starting the admin API"), for a log line when it takes too long; ""
  // when it is not running. [thread-safe]
  const char* start_step() const;

  // Jobs the scheduler has claimed and not finished (in a handler, or about to be); 0 before
  // start(). [thread-safe]
  int64_t in_flight() const;
  // API requests being handled (read, not yet answered); 0 before start(). [thread-safe]
  size_t admin_requests_under_way() const;
  // The admin API's bound port; 0 before start(). [thread-safe]
  uint16_t port() const;
  const DaemonConfig& config() const noexcept;
  // Valid between start() and destruction.
  jobs::JobStore& store();
  const plugins::PluginRegistry& plugins() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace backhaul::daemon
