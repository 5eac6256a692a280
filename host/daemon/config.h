// The daemon's configuration (SPEC F1): read from a JSON file, validated against
// schemas/config.schema.json (embedded at build time), defaults applied, relative paths resolved
// against the file's directory, and secrets read from the environment variables it names.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/http/poco_transport.h"

namespace backhaul::daemon {

// The text of schemas/config.schema.json as built into this binary.
const std::string& config_schema_text();

struct CapsConfig {
  int per_installation = 0;
  int global = 0;
};

struct CircuitConfig {
  int failure_threshold = 5;
  int64_t open_ms = 30'000;
};

struct DaemonConfig {
  struct Store {
    std::string backend = "sqlite";  // "sqlite" | "mysql"
    std::string path = "backhaul.db";
    std::string connection_env;
    std::string connection;  // the secret, from connection_env (mysql)
    int pool_size = 8;
  } store;

  struct Plugins {
    std::vector<std::filesystem::path> directories;
    std::vector<std::string> allowed_sha256;
    std::map<std::string, nlohmann::json> connectors;  // by provider id
    // SPEC B4: "process" runs every fetch_page and validate_scopes call in worker processes
    // (core/plugins/isolation.h); "none" runs them in the daemon.
    struct Isolation {
      std::string mode = "none";
      int workers = 0;  // per connector; 0: scheduler.workers
      int64_t call_timeout_ms = 120'000;
      int64_t start_wait_ms = 10'000;     // for each connector's first worker, at start
      int64_t memory_limit_mb = 1024;     // per worker process; 0: no limit
      std::filesystem::path worker_path;  // default: backhaul-plugin-worker beside the daemon
    } isolation;
  } plugins;

  struct Gateway {
    std::string url;
    std::string api_key_env;
    std::optional<std::string> api_key;  // the secret
    int64_t timeout_ms = 30'000;
    std::string ca_file;
  } gateway;

  // The HTTP proxy of every request the daemon and its plugins send (gateway and providers).
  struct Proxy {
    std::string url;  // http://host:port; empty: none
    std::string credentials_env;
    // Parsed from the above and proxy.no_proxy, with the credentials (the secret).
    http::ProxyOptions options;
  } proxy;

  struct Admin {
    std::string listen = "127.0.0.1";
    int port = 8470;
    std::string token_env;
    std::string token;  // the secret
    int64_t max_body_bytes = 1 << 20;
    int64_t max_header_bytes = 16 * 1024;
    int max_connections = 16;
    int64_t timeout_ms = 30'000;
    std::filesystem::path audit_log = "audit.log";
  } admin;

  struct Scheduler {
    int workers = 8;
    int claim_batch = 16;        // jobs per claim call at most
    int prefetch = 0;            // jobs claimed ahead of free workers
    int64_t idle_poll_ms = 200;  // claim again after this long when nothing was due
    int64_t lease_ms = 30'000;
    int64_t heartbeat_ms = 10'000;
    int heartbeat_lanes = 4;  // heartbeats under way at once, at most
    int64_t sweep_ms = 5'000;
    int retention_days = 30;
    int64_t retry_initial_ms = 1'000;  // backoff of failed attempts (jobs::RetryPolicy)
    int64_t retry_max_ms = 15 * 60 * 1'000;
    std::string owner;  // default: hostname:pid
    bool recover_own_leases = false;
  } scheduler;

  struct Pipeline {
    int64_t unit_timeout_ms = 4LL * 3600 * 1000;
    double throttle_per_hour = 4000;
    double throttle_burst = 100;
    double rate_limit_floor = 0.10;
    int transient_retries = 2;
    int64_t transient_retry_ms = 100;
    int dispatch_concurrency = 4;  // slices of a page sent to the gateway side by side
    CapsConfig entity_caps{5, 30};
    CapsConfig run_caps{1, 10};
    CircuitConfig provider_circuit;
    CircuitConfig gateway_circuit;
  } pipeline;

  struct Health {
    int64_t backlog_threshold = 10'000;
    int64_t store_failure_ms = 10'000;
  } health;

  struct Shutdown {
    int64_t grace_ms = 30'000;
    // After the grace, how long the jobs asked to stop may take before backhauld exits without
    // them (status 1): a call into a plugin that does not return would hold the stop forever.
    // Also the bound (at least 1 s) on unloading the plugins afterwards (a deinit() that hangs).
    int64_t abandon_ms = 30'000;
  } shutdown;

  struct Logging {
    std::string level = "info";
    std::string format = "text";
  } logging;
};

// Reads an environment variable; nullopt when unset. Injected so tests need no real environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

// Parses and validates `text`; relative paths resolve against `base_dir`. Throws ConfigError with
// one line per problem, each "config: <field path>: <reason>", e.g.
// "config: scheduler.workers: must be an integer >= 1 (got \"eight\")".
DaemonConfig parse_config(const std::string& text, const std::filesystem::path& base_dir,
                          const EnvLookup& env);
// Reads `path` and parses it; a missing or unreadable file is a ConfigError too.
DaemonConfig load_config(const std::filesystem::path& path, const EnvLookup& env);

}  // namespace backhaul::daemon
