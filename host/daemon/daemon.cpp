#include "host/daemon/daemon.h"

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "core/common/errors.h"
#include "core/common/logging.h"
#include "core/gateway/gateway_client.h"
#include "core/http/http_metrics.h"
#include "core/http/poco_transport.h"
#include "core/jobs/scheduler.h"
#include "core/pipeline/pipeline.h"
#include "core/plugins/isolation.h"
#include "host/daemon/admin_api.h"
#include "host/daemon/admin_server.h"
#include "host/daemon/audit_log.h"

namespace backhaul::daemon {

struct Daemon::Impl {
  Impl(DaemonConfig c, const Clock& k) : config(std::move(c)), clock(k) {}

  DaemonConfig config;
  const Clock& clock;
  std::shared_ptr<spdlog::logger> log = logging::get("daemon");
  // Declaration order is teardown order reversed: the server goes first, the store last.
  http::HttpMetrics http_metrics;  // of the plugins' requests and the gateway's
  std::unique_ptr<http::PocoTransport> transport;
  std::unique_ptr<http::MeteredTransport> gateway_transport;  // transport, counted as "gateway"
  std::unique_ptr<jobs::JobStore> store;
  std::unique_ptr<plugins::PluginRegistry> registry;
  std::map<std::string, plugins::Connector> connectors;  // by provider id
  std::unique_ptr<gateway::GatewayClient> gateway;
  std::unique_ptr<pipeline::Pipeline> pipeline;
  std::unique_ptr<jobs::Scheduler> scheduler;
  std::unique_ptr<AuditLog> audit;
  std::unique_ptr<AdminApi> api;
  std::unique_ptr<AdminServer> server;
  Poco::Net::ServerSocket listener;  // the admin port, bound first; the server's once it starts
  bool started = false;
  bool stopped = false;
  std::atomic<const char*> start_step{""};

  void open_store();
  void load_plugins();
  void start_pipeline();
};

void Daemon::Impl::open_store() {
  if (config.store.backend == "mysql") {
    store = jobs::open_mysql_store(config.store.connection,
                                   static_cast<size_t>(config.store.pool_size));
  } else {
    store = jobs::open_sqlite_store(config.store.path);
  }
  log->info("store: {} (schema migrated)", store->backend());
}

std::optional<plugins::IsolationOptions> isolation_options(const DaemonConfig& config) {
  const DaemonConfig::Plugins::Isolation& c = config.plugins.isolation;
  if (c.mode != "process") return std::nullopt;
  plugins::IsolationOptions options;
  options.worker_path = c.worker_path;
  options.max_workers = static_cast<size_t>(c.workers > 0 ? c.workers : config.scheduler.workers);
  options.call_timeout = std::chrono::milliseconds(c.call_timeout_ms);
  options.start_wait = std::chrono::milliseconds(c.start_wait_ms);
  options.memory_limit_mb = static_cast<size_t>(c.memory_limit_mb);
  options.http_timeout = std::chrono::milliseconds(config.gateway.timeout_ms);
  options.ca_file = config.gateway.ca_file;
  options.proxy_url = config.proxy.url;
  options.no_proxy = config.proxy.options.no_proxy;
  options.proxy_credentials_env = config.proxy.credentials_env;
  options.log_level = config.logging.level;
  options.log_json = config.logging.format == "json";
  for (const std::string* secret :
       {&config.store.connection_env, &config.gateway.api_key_env, &config.admin.token_env}) {
    if (!secret->empty()) options.hidden_env.push_back(*secret);
  }
  return options;
}

namespace {

std::unique_ptr<http::PocoTransport> make_transport(const DaemonConfig& config) {
  http::PocoTransportOptions options;
  options.ca_file = config.gateway.ca_file;
  options.proxy = config.proxy.options;
  return std::make_unique<http::PocoTransport>(options);
}

// The plugin directories loaded as the config says (allow-list, isolation); returns the files that
// were not loaded, and why.
std::vector<plugins::LoadProblem> load_plugin_directories(const DaemonConfig& config,
                                                          plugins::PluginRegistry& registry,
                                                          http::HttpMetrics* http_metrics) {
  if (!config.plugins.allowed_sha256.empty()) {
    registry.set_allowed_sha256(
        {config.plugins.allowed_sha256.begin(), config.plugins.allowed_sha256.end()});
  }
  // In isolation mode, no code of a plugin runs here: each loads in a worker process.
  std::optional<plugins::IsolationOptions> isolation = isolation_options(config);
  if (isolation) {
    isolation->http_metrics = http_metrics;
    registry.set_isolation(*isolation);
  }
  std::vector<plugins::LoadProblem> problems;
  for (const auto& dir : config.plugins.directories) {
    for (plugins::LoadProblem& problem : registry.load_directory(dir)) {
      problems.push_back(std::move(problem));
    }
  }
  return problems;
}

// "plugins.connectors.<id>: no such plugin is loaded", for each config no loaded plugin takes.
std::vector<std::string> configs_of_no_plugin(const DaemonConfig& config,
                                              const plugins::PluginRegistry& registry) {
  std::vector<std::string> unused;
  for (const auto& [id, settings] : config.plugins.connectors) {
    if (!registry.find(id))
      unused.push_back("plugins.connectors." + id + ": no such plugin is loaded");
  }
  return unused;
}

std::string connector_config(const DaemonConfig& config, const std::string& id) {
  auto settings = config.plugins.connectors.find(id);
  return settings == config.plugins.connectors.end() ? "{}" : settings->second.dump();
}

}  // namespace

PluginCheck check_plugins(const DaemonConfig& config, const Clock& clock) {
  const std::unique_ptr<http::PocoTransport> transport = make_transport(config);
  plugins::PluginRegistry registry(plugins::HostServices{
      *transport, clock, std::chrono::milliseconds(config.gateway.timeout_ms), nullptr});
  PluginCheck check;
  for (const plugins::LoadProblem& problem : load_plugin_directories(config, registry, nullptr)) {
    check.warnings.push_back("plugin " + problem.path.string() + " not loaded: " + problem.reason);
  }
  for (const plugins::Plugin& plugin : registry.plugins()) {
    const std::string& id = plugin.info().id;
    try {
      plugin.validate_config(connector_config(config, id));
    } catch (const plugins::PluginCrashed& e) {
      check.warnings.push_back("plugins.connectors." + id +
                               ": the plugin could not check it: " + e.what());
    } catch (const plugins::ConnectorFailure& e) {
      check.errors.push_back("config: plugins.connectors." + id + ": " + e.what());
    }
  }
  for (std::string& unused : configs_of_no_plugin(config, registry)) {
    check.warnings.push_back(std::move(unused));
  }
  return check;
}

void Daemon::Impl::load_plugins() {
  transport = make_transport(config);
  registry = std::make_unique<plugins::PluginRegistry>(plugins::HostServices{
      *transport, clock, std::chrono::milliseconds(config.gateway.timeout_ms), &http_metrics});
  for (const plugins::LoadProblem& problem :
       load_plugin_directories(config, *registry, &http_metrics)) {
    log->error("plugin {} not loaded: {}", problem.path.string(), problem.reason);
  }
  // Isolated or not, as it was loaded. An isolated plugin that crashes while starting costs
  // attempts of its jobs (SPEC B4), not the daemon's start; a refused config still ends it.
  // Isolated ones each start their first worker at once; the rest are created here, in turn.
  const std::vector<plugins::Plugin> loaded = registry->plugins();
  std::vector<std::future<plugins::Connector>> created;
  for (const plugins::Plugin& plugin : loaded) {
    std::string json = connector_config(config, plugin.info().id);
    created.push_back(std::async(plugin.isolated() ? std::launch::async : std::launch::deferred,
                                 [&plugin, json = std::move(json)] {
                                   return plugin.create(json, plugins::FirstWorkerCrash::kDefer);
                                 }));
  }
  for (size_t i = 0; i < loaded.size(); ++i) {
    const plugins::PluginInfo& info = loaded[i].info();
    try {
      connectors.emplace(info.id, created[i].get());
    } catch (const plugins::ConnectorFailure& e) {
      throw ConfigError("config: plugins.connectors." + info.id + ": " + e.what());
    }
    log->info("plugin {} {} loaded from {}{}", info.id, info.version, info.path.string(),
              loaded[i].isolated() ? " (in worker processes)" : "");
  }
  for (const std::string& unused : configs_of_no_plugin(config, *registry)) log->warn("{}", unused);
}

void Daemon::Impl::start_pipeline() {
  gateway_transport = std::make_unique<http::MeteredTransport>(*transport, http_metrics, "gateway");
  gateway = std::make_unique<gateway::GatewayClient>(
      *gateway_transport, config.gateway.url, config.gateway.api_key, clock,
      std::chrono::milliseconds(config.gateway.timeout_ms));
  const DaemonConfig::Pipeline& p = config.pipeline;
  pipeline::PipelineOptions options;
  options.unit_timeout_ms = p.unit_timeout_ms;
  options.throttle_per_hour = p.throttle_per_hour;
  options.throttle_burst = p.throttle_burst;
  options.rate_limit_floor = p.rate_limit_floor;
  options.transient_retries = p.transient_retries;
  options.transient_retry_ms = p.transient_retry_ms;
  options.dispatch_concurrency = p.dispatch_concurrency;
  options.entity_caps = {p.entity_caps.per_installation, p.entity_caps.global};
  options.run_caps = {p.run_caps.per_installation, p.run_caps.global};
  options.provider_circuit = {p.provider_circuit.failure_threshold, p.provider_circuit.open_ms};
  options.gateway_circuit = {p.gateway_circuit.failure_threshold, p.gateway_circuit.open_ms};
  // The connector map is complete before the pipeline exists and never changes afterwards, so
  // lookups from worker threads need no lock.
  pipeline = std::make_unique<pipeline::Pipeline>(
      *store, clock, *gateway,
      [this](const std::string& provider) -> const plugins::Connector* {
        auto it = connectors.find(provider);
        return it == connectors.end() ? nullptr : &it->second;
      },
      options);
  pipeline->apply_caps();

  const DaemonConfig::Scheduler& s = config.scheduler;
  jobs::SchedulerOptions scheduler_options;
  scheduler_options.owner = s.owner;
  scheduler_options.workers = s.workers;
  scheduler_options.claim_batch = static_cast<size_t>(s.claim_batch);
  scheduler_options.prefetch = s.prefetch;
  scheduler_options.idle_poll_ms = s.idle_poll_ms;
  scheduler_options.lease_ms = s.lease_ms;
  scheduler_options.heartbeat_interval_ms = s.heartbeat_ms;
  scheduler_options.heartbeat_lanes = s.heartbeat_lanes;
  scheduler_options.sweep_interval_ms = s.sweep_ms;
  scheduler_options.retention_ms = int64_t{s.retention_days} * 86'400'000;
  scheduler_options.recover_own_leases = s.recover_own_leases;
  scheduler_options.retry.initial_ms = s.retry_initial_ms;
  scheduler_options.retry.max_ms = s.retry_max_ms;
  scheduler = std::make_unique<jobs::Scheduler>(*store, clock, scheduler_options);
  pipeline->register_handlers(*scheduler);
  scheduler->start();
  log->info("scheduler started: owner {}, {} workers", s.owner, s.workers);
}

Daemon::Daemon(DaemonConfig config, const Clock& clock)
    : impl_(std::make_unique<Impl>(std::move(config), clock)) {}

Daemon::~Daemon() { stop(); }

void Daemon::start() {
  Impl& d = *impl_;
  if (d.started) throw std::logic_error("daemon already started");
  d.started = true;
  // A start that fails closes the port it took: not left listening, taking connections nobody
  // answers, while the failed daemon unloads its plugins.
  struct Steps {
    std::atomic<const char*>& step;
    Poco::Net::ServerSocket& listener;
    bool done = false;
    ~Steps() {
      step = "";
      if (!done) listener.close();
    }
  } steps{d.start_step, d.listener};
  // The port first (on a fixed admin.port; 0 takes any free one): a second daemon started on this
  // config (by mistake, while the service runs) stops here. Bound last, it failed only after its
  // scheduler had recovered the running jobs of the first (same owner), each at the cost of an
  // attempt, and claimed some.
  d.start_step = "binding the admin API's port";
  d.listener =
      AdminServer::listen(d.config.admin.listen, static_cast<uint16_t>(d.config.admin.port));
  d.start_step = "opening the audit log";
  d.audit = std::make_unique<AuditLog>(d.config.admin.audit_log);
  d.start_step = "opening the store";
  d.open_store();
  d.start_step = "loading plugins";
  d.load_plugins();
  d.start_step = "starting the scheduler";
  d.start_pipeline();
  d.start_step = "starting the admin API";

  AdminApiOptions api_options;
  api_options.token = d.config.admin.token;
  api_options.backlog_threshold = d.config.health.backlog_threshold;
  api_options.store_failure_grace_ms = d.config.health.store_failure_ms;
  api_options.max_body_bytes = static_cast<size_t>(d.config.admin.max_body_bytes);
  api_options.max_header_bytes = static_cast<size_t>(d.config.admin.max_header_bytes);
  d.api = std::make_unique<AdminApi>(
      AdminApiDeps{*d.store, d.clock, *d.registry, *d.audit, [&d] { return d.scheduler->stats(); },
                   d.pipeline.get(), [&d] { return d.scheduler->kinds(); },
                   [&d] {
                     std::map<std::string, plugins::WorkerStats> workers;
                     for (const auto& [id, connector] : d.connectors) {
                       if (auto stats = connector.worker_stats()) workers.emplace(id, *stats);
                     }
                     return workers;
                   },
                   &d.http_metrics},
      api_options);
  d.server = std::make_unique<AdminServer>(
      *d.api, AdminServerOptions{d.config.admin.listen, static_cast<uint16_t>(d.config.admin.port),
                                 d.config.admin.max_connections, d.config.admin.timeout_ms});
  d.server->start(d.listener);
  steps.done = true;
  d.log->info("admin api listening on {}:{}", d.config.admin.listen, d.server->port());
}

void Daemon::stop() {
  Impl& d = *impl_;
  if (!d.started || d.stopped) return;
  d.stopped = true;
  const auto grace = std::chrono::milliseconds(d.config.shutdown.grace_ms);
  const auto grace_ends = std::chrono::steady_clock::now() + grace;
  // No new API requests from here on; those under way are answered within the grace too.
  if (d.server) d.server->stop_taking_requests();
  if (d.scheduler) {
    d.log->info("draining: up to {} ms for in-flight pages", grace.count());
    d.scheduler->drain(grace);
    const jobs::SchedulerStats stats = d.scheduler->stats();
    d.log->info("drained: {} jobs released, {} interrupted", stats.released, stats.interrupted);
  }
  if (d.server) {
    if (const size_t requests = d.server->requests_under_way(); requests > 0)
      d.log->info("stop: waiting for {} admin requests under way to be answered", requests);
    d.server->stop(grace_ends);
  }
  d.log->info("stopped");
}

void Daemon::hurry() {
  if (impl_->scheduler) impl_->scheduler->hurry();
  if (impl_->server) impl_->server->hurry();
}

size_t Daemon::interrupt_plugin_calls() {
  size_t killed = 0;
  for (const auto& [id, connector] : impl_->connectors) killed += connector.interrupt_calls();
  return killed;
}

const char* Daemon::start_step() const { return impl_->start_step; }

int64_t Daemon::in_flight() const {
  return impl_->scheduler ? impl_->scheduler->stats().in_flight : 0;
}

size_t Daemon::admin_requests_under_way() const {
  return impl_->server ? impl_->server->requests_under_way() : 0;
}

uint16_t Daemon::port() const { return impl_->server ? impl_->server->port() : 0; }

const DaemonConfig& Daemon::config() const noexcept { return impl_->config; }

jobs::JobStore& Daemon::store() { return *impl_->store; }

const plugins::PluginRegistry& Daemon::plugins() const { return *impl_->registry; }

}  // namespace backhaul::daemon
