#include "host/daemon/config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "core/common/errors.h"
#include "core/common/strict_json.h"
#include "core/common/utf8.h"
#include "core/jobs/job_store.h"
#include "host/daemon/json_schema.h"
#include <unistd.h>

namespace backhaul::daemon {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Collects problems so one start reports all of them, not the first only.
class Problems {
 public:
  void add(const std::string& path, const std::string& reason) {
    if (!text_.empty()) text_ += '\n';
    text_ += "config: " + (path.empty() ? std::string("(root)") : path) + ": " + reason;
  }
  void throw_if_any() const {
    if (!text_.empty()) throw ConfigError(text_);
  }

 private:
  std::string text_;
};

const json& section(const json& root, const char* name) {
  static const json empty = json::object();
  return root.contains(name) ? root[name] : empty;
}

template <typename T>
void read(const json& object, const char* key, T* out) {
  if (object.contains(key)) *out = object[key].get<T>();
}

fs::path resolve(const fs::path& base_dir, const fs::path& path) {
  return path.is_absolute() ? path : base_dir / path;
}

void read_caps(const json& object, const char* key, CapsConfig* caps) {
  if (!object.contains(key)) return;
  read(object[key], "per_installation", &caps->per_installation);
  read(object[key], "global", &caps->global);
}

void read_circuit(const json& object, const char* key, CircuitConfig* circuit) {
  if (!object.contains(key)) return;
  read(object[key], "failure_threshold", &circuit->failure_threshold);
  read(object[key], "open_ms", &circuit->open_ms);
}

constexpr const char* kPluginWorker = "backhaul-plugin-worker";

std::string default_owner() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  return std::string(host[0] ? host : "backhauld") + ":" + std::to_string(getpid());
}

// Where a secret goes, which decides what it may hold.
enum class SecretUse {
  kHeaderValue,       // a header's value as it is (a bearer token, an API key)
  kEncodedInHeader,   // a header's value once encoded (the proxy's user:password, in base64)
  kConnectionString,  // the store's, whose parser drops the whitespace around its items
};

// Reads the secret named by `env_field` (e.g. "admin.token_env"); a missing or empty variable is
// a problem naming both the field and the variable.
std::optional<std::string> secret(const EnvLookup& env, const std::string& variable,
                                  const std::string& env_field, Problems* problems,
                                  SecretUse use = SecretUse::kHeaderValue) {
  std::optional<std::string> value = env(variable);
  if (!value || value->empty()) {
    problems->add(env_field, "environment variable " + variable + " is not set or empty");
    return std::nullopt;
  }
  // A secret that goes into a header (the store's connection string does not: its parser drops
  // surrounding whitespace): one with a line break (read from a file with its newline) made every
  // gateway call fail as "gateway unreachable", retried for ever, or every admin request 401.
  if (use != SecretUse::kConnectionString && has_control_character(*value)) {
    problems->add(env_field, "environment variable " + variable +
                                 " holds a control character (a line break from a file?)");
    return std::nullopt;
  }
  // Nor, as a header's value, a space at either end: HTTP parsers (Poco's among them) drop those,
  // so the receiving side sees another secret (an admin token "t0ken " answered every request
  // 401). Encoded, as the proxy's password is, a space is kept.
  if (use == SecretUse::kHeaderValue && (value->front() == ' ' || value->back() == ' ')) {
    problems->add(env_field, "environment variable " + variable +
                                 " begins or ends with a space, which an HTTP header drops (it "
                                 "could never match)");
    return std::nullopt;
  }
  return value;
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

DaemonConfig parse_config(const std::string& text, const fs::path& base_dir, const EnvLookup& env) {
  // The schema check, and copies of plugin configs, recurse: a file nested absurdly deep is
  // refused (by parse_strict_json, 256 levels) before it can overflow the stack. No real config
  // comes near this.
  json root;
  try {
    root = parse_strict_json(text, 256);
  } catch (const JsonTextError& e) {
    throw ConfigError(std::string("config: (root): ") + e.what());
  }
  static const json schema = json::parse(config_schema_text());

  Problems problems;
  for (const SchemaViolation& v : validate_json(schema, root)) problems.add(v.path, v.message);
  problems.throw_if_any();

  DaemonConfig config;
  const json& store = section(root, "store");
  read(store, "backend", &config.store.backend);
  read(store, "path", &config.store.path);
  read(store, "connection_env", &config.store.connection_env);
  read(store, "pool_size", &config.store.pool_size);
  config.store.path = resolve(base_dir, config.store.path).string();
  if (config.store.backend == "mysql") {
    if (config.store.connection_env.empty()) {
      problems.add("store.connection_env", "is required when store.backend is \"mysql\"");
    } else if (auto dsn = secret(env, config.store.connection_env, "store.connection_env",
                                 &problems, SecretUse::kConnectionString)) {
      config.store.connection = *dsn;
      try {
        jobs::check_mysql_connection_string(*dsn);
      } catch (const ConfigError& e) {
        problems.add("store.connection_env", std::string(e.what()) + " (environment variable " +
                                                 config.store.connection_env + ")");
      }
    }
  }

  const json& plugins = section(root, "plugins");
  if (plugins.contains("directories")) {
    for (const json& dir : plugins["directories"]) {
      config.plugins.directories.push_back(resolve(base_dir, dir.get<std::string>()));
    }
  }
  read(plugins, "allowed_sha256", &config.plugins.allowed_sha256);
  if (plugins.contains("allowed_sha256") && config.plugins.allowed_sha256.empty()) {
    // An empty list would switch the check off (every plugin loads): say so rather than guess
    // whether no plugin or every plugin was meant.
    problems.add("plugins.allowed_sha256",
                 "is empty, so no plugin could load: list the hashes to allow, or remove the key "
                 "to allow every plugin");
  }
  if (plugins.contains("connectors")) {
    for (const auto& [id, settings] : plugins["connectors"].items()) {
      config.plugins.connectors[id] = settings;
    }
  }
  const json& isolation = section(plugins, "isolation");
  DaemonConfig::Plugins::Isolation& iso = config.plugins.isolation;
  read(isolation, "mode", &iso.mode);
  read(isolation, "workers", &iso.workers);
  read(isolation, "call_timeout_ms", &iso.call_timeout_ms);
  read(isolation, "start_wait_ms", &iso.start_wait_ms);
  read(isolation, "memory_limit_mb", &iso.memory_limit_mb);
  // Below this a worker that has only loaded its plugin would be over the limit at its first call.
  constexpr int64_t kLeastMemoryLimitMb = 32;
  if (iso.memory_limit_mb > 0 && iso.memory_limit_mb < kLeastMemoryLimitMb) {
    problems.add("plugins.isolation.memory_limit_mb",
                 "must be 0 (no limit) or at least " + std::to_string(kLeastMemoryLimitMb) +
                     " (got " + std::to_string(iso.memory_limit_mb) + ")");
  }
  if (isolation.contains("worker_path")) {
    iso.worker_path = resolve(base_dir, isolation["worker_path"].get<std::string>());
  } else {
    std::error_code ec;
    iso.worker_path = fs::read_symlink("/proc/self/exe", ec).parent_path() / kPluginWorker;
  }
  if (iso.mode == "process") {
    std::error_code ec;
    std::string why;
    if (::access(iso.worker_path.c_str(), X_OK) != 0) {
      why = std::strerror(errno);  // nothing in between can change errno
    } else if (!fs::is_regular_file(iso.worker_path, ec)) {
      why = "not a regular file";
    }
    if (!why.empty()) {
      problems.add(isolation.contains("worker_path") ? "plugins.isolation.worker_path"
                                                     : "plugins.isolation.mode",
                   iso.worker_path.string() + " is not an executable file (" + why +
                       "): process isolation needs " + kPluginWorker);
    }
  }

  const json& gateway = section(root, "gateway");
  read(gateway, "url", &config.gateway.url);
  read(gateway, "api_key_env", &config.gateway.api_key_env);
  read(gateway, "timeout_ms", &config.gateway.timeout_ms);
  read(gateway, "ca_file", &config.gateway.ca_file);
  if (!config.gateway.ca_file.empty()) {
    const fs::path ca_file = resolve(base_dir, config.gateway.ca_file);
    config.gateway.ca_file = ca_file.string();
    std::error_code ec;
    if (::access(ca_file.c_str(), R_OK) != 0) {
      const int error = errno;
      problems.add("gateway.ca_file",
                   ca_file.string() + " cannot be read (" + std::strerror(error) + ")");
    } else if (!fs::is_regular_file(ca_file, ec)) {
      problems.add("gateway.ca_file", ca_file.string() + " is not a regular file");
    }
  }
  if (!config.gateway.api_key_env.empty()) {
    config.gateway.api_key =
        secret(env, config.gateway.api_key_env, "gateway.api_key_env", &problems);
  }

  const json& proxy = section(root, "proxy");
  read(proxy, "url", &config.proxy.url);
  read(proxy, "credentials_env", &config.proxy.credentials_env);
  std::vector<std::string> no_proxy;  // as written; options.no_proxy holds them checked
  read(proxy, "no_proxy", &no_proxy);
  if (!config.proxy.url.empty()) {
    try {
      config.proxy.options = http::parse_proxy_url(config.proxy.url);
    } catch (const std::invalid_argument& e) {
      problems.add("proxy.url", e.what());
    }
    try {
      config.proxy.options.no_proxy = http::parse_no_proxy(no_proxy);
    } catch (const std::invalid_argument& e) {
      problems.add("proxy.no_proxy", e.what());
    }
    // Not in the file, which operators share and check in.
    if (!config.proxy.options.username.empty()) {
      problems.add("proxy.url",
                   "holds credentials: put user:password in the variable proxy.credentials_env "
                   "names");
    }
  }
  if (!no_proxy.empty() && config.proxy.url.empty()) {
    problems.add("proxy.no_proxy", "is set without proxy.url");
  }
  if (!config.proxy.credentials_env.empty()) {
    if (config.proxy.url.empty()) {
      problems.add("proxy.credentials_env", "is set without proxy.url");
    } else if (auto credentials = secret(env, config.proxy.credentials_env, "proxy.credentials_env",
                                         &problems, SecretUse::kEncodedInHeader)) {
      try {
        http::set_proxy_credentials(config.proxy.options, *credentials);
      } catch (const std::invalid_argument&) {
        problems.add(
            "proxy.credentials_env",
            "environment variable " + config.proxy.credentials_env + " must hold user:password");
      }
    }
  }

  const json& admin = section(root, "admin");
  read(admin, "listen", &config.admin.listen);
  read(admin, "port", &config.admin.port);
  read(admin, "token_env", &config.admin.token_env);
  read(admin, "max_body_bytes", &config.admin.max_body_bytes);
  read(admin, "max_header_bytes", &config.admin.max_header_bytes);
  read(admin, "max_connections", &config.admin.max_connections);
  read(admin, "timeout_ms", &config.admin.timeout_ms);
  std::string audit_log = config.admin.audit_log.string();
  read(admin, "audit_log", &audit_log);
  config.admin.audit_log = resolve(base_dir, audit_log);
  if (auto token = secret(env, config.admin.token_env, "admin.token_env", &problems)) {
    config.admin.token = *token;
  }

  const json& scheduler = section(root, "scheduler");
  read(scheduler, "workers", &config.scheduler.workers);
  read(scheduler, "claim_batch", &config.scheduler.claim_batch);
  read(scheduler, "prefetch", &config.scheduler.prefetch);
  read(scheduler, "idle_poll_ms", &config.scheduler.idle_poll_ms);
  read(scheduler, "lease_ms", &config.scheduler.lease_ms);
  read(scheduler, "heartbeat_ms", &config.scheduler.heartbeat_ms);
  read(scheduler, "heartbeat_lanes", &config.scheduler.heartbeat_lanes);
  // On MySQL a beat that waits for a row another transaction holds keeps its connection the while:
  // with as many lanes as connections, claims and completions could find none.
  if (config.store.backend == "mysql" &&
      config.scheduler.heartbeat_lanes >= config.store.pool_size) {
    problems.add("scheduler.heartbeat_lanes",
                 "must be less than store.pool_size (" + std::to_string(config.store.pool_size) +
                     ") with the mysql backend: a heartbeat that waits for a row holds a "
                     "connection, and claims and completions need one too");
  }
  read(scheduler, "sweep_ms", &config.scheduler.sweep_ms);
  read(scheduler, "retention_days", &config.scheduler.retention_days);
  read(scheduler, "retry_initial_ms", &config.scheduler.retry_initial_ms);
  read(scheduler, "retry_max_ms", &config.scheduler.retry_max_ms);
  if (config.scheduler.retry_initial_ms > config.scheduler.retry_max_ms) {
    problems.add("scheduler.retry_initial_ms", "must not be more than scheduler.retry_max_ms (" +
                                                   std::to_string(config.scheduler.retry_max_ms) +
                                                   ")");
  }
  read(scheduler, "owner", &config.scheduler.owner);
  read(scheduler, "recover_own_leases", &config.scheduler.recover_own_leases);
  if (config.scheduler.recover_own_leases && config.scheduler.owner.empty()) {
    problems.add("scheduler.recover_own_leases",
                 "needs scheduler.owner: the default owner (hostname:pid) changes every start");
  }
  if (config.scheduler.owner.empty()) config.scheduler.owner = default_owner();
  if (config.scheduler.heartbeat_ms > config.scheduler.lease_ms / 2) {
    // A beat comes a little after its interval; one due just before the lease ends comes after it.
    problems.add("scheduler.heartbeat_ms", "must be at most half of scheduler.lease_ms (" +
                                               std::to_string(config.scheduler.lease_ms) + ")");
  }

  const json& pipeline = section(root, "pipeline");
  read(pipeline, "unit_timeout_ms", &config.pipeline.unit_timeout_ms);
  read(pipeline, "throttle_per_hour", &config.pipeline.throttle_per_hour);
  read(pipeline, "throttle_burst", &config.pipeline.throttle_burst);
  read(pipeline, "rate_limit_floor", &config.pipeline.rate_limit_floor);
  read(pipeline, "transient_retries", &config.pipeline.transient_retries);
  read(pipeline, "transient_retry_ms", &config.pipeline.transient_retry_ms);
  read(pipeline, "dispatch_concurrency", &config.pipeline.dispatch_concurrency);
  read_caps(pipeline, "entity_caps", &config.pipeline.entity_caps);
  read_caps(pipeline, "run_caps", &config.pipeline.run_caps);
  read_circuit(pipeline, "provider_circuit", &config.pipeline.provider_circuit);
  read_circuit(pipeline, "gateway_circuit", &config.pipeline.gateway_circuit);

  read(section(root, "health"), "backlog_threshold", &config.health.backlog_threshold);
  read(section(root, "health"), "store_failure_ms", &config.health.store_failure_ms);
  read(section(root, "shutdown"), "grace_ms", &config.shutdown.grace_ms);
  read(section(root, "shutdown"), "abandon_ms", &config.shutdown.abandon_ms);
  read(section(root, "logging"), "level", &config.logging.level);
  read(section(root, "logging"), "format", &config.logging.format);

  problems.throw_if_any();
  return config;
}

DaemonConfig load_config(const fs::path& path, const EnvLookup& env) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    throw ConfigError("config: cannot read " + path.string() + ": it is a directory");
  }
  std::ifstream in(path);
  if (!in) {
    const int error = errno;
    throw ConfigError("config: cannot read " + path.string() + ": " + std::strerror(error));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) throw ConfigError("config: " + path.string() + " is empty");
  const fs::path base_dir = fs::absolute(path).parent_path();
  return parse_config(text.str(), base_dir, env);
}

}  // namespace backhaul::daemon
