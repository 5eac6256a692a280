// Config validation (SPEC F1): the schema subset validator, defaults, paths, secrets, and that
// every bad field is named with its reason.
#include "host/daemon/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "core/common/errors.h"
#include "host/daemon/daemon.h"
#include "host/daemon/json_schema.h"
#include <unistd.h>

namespace backhaul::daemon {
namespace {

using nlohmann::json;

EnvLookup env_with(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const EnvLookup kEnv = env_with({{"ADMIN_TOKEN", "t0ken"},
                                 {"GW_KEY", "gw-secret"},
                                 {"MYSQL_DSN", "host=127.0.0.1;db=b;user=u;password=p"}});

json minimal() {
  return {{"admin", {{"token_env", "ADMIN_TOKEN"}}},
          {"gateway", {{"url", "http://127.0.0.1:9/gateway"}}}};
}

// The ConfigError text for `config`, or "" when it loads.
std::string error_of(const json& config, const EnvLookup& env = kEnv) {
  try {
    parse_config(config.dump(), "/srv/backhaul", env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigTest, MinimalConfigGetsDefaultsAndSecretsFromTheEnvironment) {
  const DaemonConfig c = parse_config(minimal().dump(), "/srv/backhaul", kEnv);
  EXPECT_EQ(c.admin.token, "t0ken");
  EXPECT_EQ(c.admin.listen, "127.0.0.1");
  EXPECT_EQ(c.admin.port, 8470);
  EXPECT_EQ(c.admin.max_body_bytes, 1 << 20);
  EXPECT_EQ(c.admin.audit_log, std::filesystem::path("/srv/backhaul/audit.log"));
  EXPECT_EQ(c.store.backend, "sqlite");
  EXPECT_EQ(c.store.path, "/srv/backhaul/backhaul.db");
  EXPECT_EQ(c.scheduler.workers, 8);
  EXPECT_EQ(c.scheduler.retry_initial_ms, 1000);
  EXPECT_EQ(c.scheduler.claim_batch, 16);
  EXPECT_EQ(c.scheduler.prefetch, 0);
  EXPECT_EQ(c.scheduler.idle_poll_ms, 200);
  EXPECT_EQ(c.scheduler.heartbeat_lanes, 4);
  EXPECT_EQ(c.pipeline.transient_retries, 2);
  EXPECT_FALSE(c.scheduler.owner.empty());
  EXPECT_EQ(c.pipeline.entity_caps.per_installation, 5);
  EXPECT_EQ(c.pipeline.entity_caps.global, 30);
  EXPECT_EQ(c.pipeline.run_caps.per_installation, 1);
  EXPECT_EQ(c.pipeline.run_caps.global, 10);
  EXPECT_EQ(c.shutdown.grace_ms, 30'000);
  EXPECT_EQ(c.shutdown.abandon_ms, 30'000);
  EXPECT_EQ(c.logging.format, "text");
  EXPECT_FALSE(c.gateway.api_key.has_value());
}

// SPEC B4. The worker executable is looked for beside the daemon's own (this test's, here), and
// a relative worker_path is the config directory's.
TEST(ConfigTest, IsolationDefaultsToNoneAndFindsTheWorkerBesideTheDaemon) {
  const DaemonConfig none = parse_config(minimal().dump(), "/srv/backhaul", kEnv);
  EXPECT_EQ(none.plugins.isolation.mode, "none");
  EXPECT_EQ(none.plugins.isolation.workers, 0);
  EXPECT_EQ(none.plugins.isolation.call_timeout_ms, 120'000);
  EXPECT_EQ(none.plugins.isolation.start_wait_ms, 10'000);
  EXPECT_EQ(none.plugins.isolation.memory_limit_mb, 1024);
  EXPECT_EQ(
      none.plugins.isolation.worker_path,
      std::filesystem::read_symlink("/proc/self/exe").parent_path() / "backhaul-plugin-worker");

  json config = minimal();
  config["plugins"]["isolation"] = {{"mode", "process"},       {"workers", 3},
                                    {"call_timeout_ms", 5000}, {"start_wait_ms", 0},
                                    {"memory_limit_mb", 0},    {"worker_path", "w/worker"}};
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("backhaul-config-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "w");
  std::filesystem::copy_file(BACKHAUL_PLUGIN_WORKER_PATH, dir / "w" / "worker",
                             std::filesystem::copy_options::overwrite_existing);
  const DaemonConfig c = parse_config(config.dump(), dir, kEnv);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(c.plugins.isolation.mode, "process");
  EXPECT_EQ(c.plugins.isolation.workers, 3);
  EXPECT_EQ(c.plugins.isolation.call_timeout_ms, 5000);
  EXPECT_EQ(c.plugins.isolation.start_wait_ms, 0) << "no wait";
  EXPECT_EQ(c.plugins.isolation.memory_limit_mb, 0) << "no limit";
  EXPECT_EQ(c.plugins.isolation.worker_path, dir / "w" / "worker");
}

// What each connector's worker pool gets: plugins.isolation, and the settings the workers share
// with the daemon.
TEST(ConfigTest, IsolationOptionsComeFromTheConfig) {
  EXPECT_FALSE(isolation_options(parse_config(minimal().dump(), "/srv/backhaul", kEnv)));

  json config = minimal();
  config["plugins"]["isolation"] = {{"mode", "process"}, {"memory_limit_mb", 300}};
  config["scheduler"] = {{"workers", 6}};
  config["gateway"]["timeout_ms"] = 7000;
  // Checked at load: a file that is there (its contents are OpenSSL's to judge).
  const std::string ca_file =
      (std::filesystem::temp_directory_path() / ("config-ca-" + std::to_string(::getpid())))
          .string();
  std::ofstream(ca_file) << "-----BEGIN CERTIFICATE-----\n";
  config["gateway"]["ca_file"] = ca_file;
  config["logging"] = {{"level", "debug"}, {"format", "json"}};
  const DaemonConfig c = parse_config(config.dump(), "/srv/backhaul", kEnv);
  const std::optional<plugins::IsolationOptions> o = isolation_options(c);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->worker_path, c.plugins.isolation.worker_path);
  EXPECT_EQ(o->max_workers, 6u) << "workers 0: scheduler.workers";
  EXPECT_EQ(o->call_timeout, std::chrono::milliseconds(120'000));
  EXPECT_EQ(o->start_wait, std::chrono::milliseconds(10'000));
  EXPECT_EQ(o->memory_limit_mb, 300u);
  EXPECT_EQ(o->http_timeout, std::chrono::milliseconds(7000));
  EXPECT_EQ(o->ca_file, ca_file);
  EXPECT_EQ(o->log_level, "debug");
  EXPECT_TRUE(o->log_json);

  config["plugins"]["isolation"]["workers"] = 2;
  EXPECT_EQ(isolation_options(parse_config(config.dump(), "/srv/backhaul", kEnv))->max_workers, 2u);

  // The daemon's secrets are hidden from the workers (the plugins' code).
  EXPECT_EQ(o->hidden_env, std::vector<std::string>{"ADMIN_TOKEN"});
  config["gateway"]["api_key_env"] = "GW_KEY";
  config["store"] = {{"backend", "mysql"}, {"connection_env", "MYSQL_DSN"}};
  EXPECT_EQ(isolation_options(parse_config(config.dump(), "/srv/backhaul", kEnv))->hidden_env,
            (std::vector<std::string>{"MYSQL_DSN", "GW_KEY", "ADMIN_TOKEN"}));
  std::filesystem::remove(ca_file);
}

// The proxy serves every request of the daemon and of its workers; its credentials come from the
// environment, and reach the workers, which send the plugins' requests.
TEST(ConfigTest, TheProxyComesFromTheConfigAndItsCredentialsFromTheEnvironment) {
  EXPECT_TRUE(parse_config(minimal().dump(), "/srv/backhaul", kEnv).proxy.options.host.empty());

  json config = minimal();
  config["proxy"] = {{"url", "http://proxy.corp:3128"},
                     {"credentials_env", "PROXY_AUTH"},
                     {"no_proxy", {"127.0.0.1", "*.Corp"}}};
  config["plugins"]["isolation"] = {{"mode", "process"}};
  config["gateway"]["api_key_env"] = "GW_KEY";
  const DaemonConfig c =
      parse_config(config.dump(), "/srv/backhaul",
                   env_with({{"ADMIN_TOKEN", "t"}, {"GW_KEY", "k"}, {"PROXY_AUTH", "me:pa:ss"}}));
  EXPECT_EQ(c.proxy.options.host, "proxy.corp");
  EXPECT_EQ(c.proxy.options.port, 3128);
  EXPECT_EQ(c.proxy.options.username, "me");
  EXPECT_EQ(c.proxy.options.password, "pa:ss");
  EXPECT_EQ(c.proxy.options.no_proxy, (std::vector<std::string>{"127.0.0.1", ".corp"}));

  const std::optional<plugins::IsolationOptions> o = isolation_options(c);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->proxy_url, "http://proxy.corp:3128");
  EXPECT_EQ(o->no_proxy, (std::vector<std::string>{"127.0.0.1", ".corp"}));
  EXPECT_EQ(o->proxy_credentials_env, "PROXY_AUTH");
  EXPECT_EQ(o->hidden_env, (std::vector<std::string>{"GW_KEY", "ADMIN_TOKEN"}))
      << "the workers need the proxy's credentials";
}

TEST(ConfigTest, FullConfigLoads) {
  json config = minimal();
  config["store"] = {{"backend", "mysql"}, {"connection_env", "MYSQL_DSN"}, {"pool_size", 4}};
  config["plugins"] = {{"directories", {"plugins", "/opt/backhaul/plugins"}},
                       {"allowed_sha256", {std::string(64, 'a')}},
                       {"connectors", {{"github", {{"base_url", "http://127.0.0.1:1/github"}}}}}};
  config["gateway"]["api_key_env"] = "GW_KEY";
  config["admin"].update({{"port", 0}, {"max_connections", 4}, {"audit_log", "/var/log/a.log"}});
  config["scheduler"] = {{"workers", 2},           {"lease_ms", 5000},    {"heartbeat_ms", 1000},
                         {"retry_initial_ms", 50}, {"retry_max_ms", 400}, {"owner", "host-a"},
                         {"claim_batch", 64},      {"prefetch", 128},     {"idle_poll_ms", 20},
                         {"heartbeat_lanes", 2}};
  config["pipeline"] = {{"entity_caps", {{"per_installation", 2}, {"global", 4}}},
                        {"rate_limit_floor", 0.2},
                        {"transient_retries", 0},
                        {"transient_retry_ms", 5},
                        {"dispatch_concurrency", 2},
                        {"gateway_circuit", {{"failure_threshold", 3}, {"open_ms", 1000}}}};
  config["health"] = {{"backlog_threshold", 5}};
  config["shutdown"] = {{"grace_ms", 100}, {"abandon_ms", 250}};
  config["logging"] = {{"level", "debug"}, {"format", "json"}};
  const DaemonConfig c = parse_config(config.dump(), "/srv/backhaul", kEnv);
  EXPECT_EQ(c.store.backend, "mysql");
  EXPECT_EQ(c.store.connection, "host=127.0.0.1;db=b;user=u;password=p");
  ASSERT_EQ(c.plugins.directories.size(), 2u);
  EXPECT_EQ(c.plugins.directories[0], std::filesystem::path("/srv/backhaul/plugins"));
  EXPECT_EQ(c.plugins.directories[1], std::filesystem::path("/opt/backhaul/plugins"));
  EXPECT_EQ(c.plugins.connectors.at("github").at("base_url"), "http://127.0.0.1:1/github");
  EXPECT_EQ(c.gateway.api_key, "gw-secret");
  EXPECT_EQ(c.admin.port, 0);
  EXPECT_EQ(c.admin.audit_log, std::filesystem::path("/var/log/a.log"));
  EXPECT_EQ(c.scheduler.owner, "host-a");
  EXPECT_EQ(c.scheduler.retry_initial_ms, 50);
  EXPECT_EQ(c.scheduler.retry_max_ms, 400);
  EXPECT_EQ(c.scheduler.claim_batch, 64);
  EXPECT_EQ(c.scheduler.prefetch, 128);
  EXPECT_EQ(c.scheduler.idle_poll_ms, 20);
  EXPECT_EQ(c.scheduler.heartbeat_lanes, 2);
  EXPECT_EQ(c.pipeline.transient_retries, 0);
  EXPECT_EQ(c.pipeline.transient_retry_ms, 5);
  EXPECT_EQ(c.pipeline.dispatch_concurrency, 2);
  EXPECT_EQ(c.pipeline.entity_caps.per_installation, 2);
  EXPECT_EQ(c.pipeline.run_caps.per_installation, 1);  // untouched default
  EXPECT_DOUBLE_EQ(c.pipeline.rate_limit_floor, 0.2);
  EXPECT_EQ(c.pipeline.gateway_circuit.failure_threshold, 3);
  EXPECT_EQ(c.health.backlog_threshold, 5);
  EXPECT_EQ(c.shutdown.grace_ms, 100);
  EXPECT_EQ(c.shutdown.abandon_ms, 250);
  EXPECT_EQ(c.logging.format, "json");
}

struct BadField {
  const char* name;
  std::function<void(json&)> edit;
  const char* expected;  // a substring of the error
};

class ConfigBadFieldTest : public ::testing::TestWithParam<BadField> {};

TEST_P(ConfigBadFieldTest, ErrorNamesTheFieldAndTheReason) {
  json config = minimal();
  GetParam().edit(config);
  const std::string error = error_of(config);
  EXPECT_NE(error.find(GetParam().expected), std::string::npos) << error;
  EXPECT_EQ(error.rfind("config: ", 0), 0u) << error;
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ConfigBadFieldTest,
    ::testing::Values(
        BadField{"WorkersNotAnInteger", [](json& c) { c["scheduler"]["workers"] = "eight"; },
                 "config: scheduler.workers: must be an integer between 1 and 1024 (got "
                 "\"eight\")"},
        // An empty allow-list switched the check off: every plugin loaded.
        BadField{"EmptyAllowList", [](json& c) { c["plugins"]["allowed_sha256"] = json::array(); },
                 "config: plugins.allowed_sha256: is empty, so no plugin could load"},
        BadField{"WorkersZero", [](json& c) { c["scheduler"]["workers"] = 0; },
                 "config: scheduler.workers: must be an integer between 1 and 1024 (got 0)"},
        BadField{"WorkersFraction", [](json& c) { c["scheduler"]["workers"] = 2.5; },
                 "config: scheduler.workers: must be an integer"},
        BadField{"NegativePrefetch", [](json& c) { c["scheduler"]["prefetch"] = -1; },
                 "config: scheduler.prefetch: must be an integer between 0 and 65536 (got -1)"},
        BadField{"ZeroHeartbeatLanes", [](json& c) { c["scheduler"]["heartbeat_lanes"] = 0; },
                 "config: scheduler.heartbeat_lanes: must be an integer between 1 and 64 (got 0)"},
        BadField{"NegativeAbandonMs", [](json& c) { c["shutdown"]["abandon_ms"] = -5; },
                 "config: shutdown.abandon_ms: must be an integer between 0 and 3600000 (got -5)"},
        BadField{"ZeroClaimBatch", [](json& c) { c["scheduler"]["claim_batch"] = 0; },
                 "config: scheduler.claim_batch: must be an integer between 1 and 4096 (got 0)"},
        // Durations past a year, counts past what their type holds, whole-number floats past
        // int64: each was read, then wrapped or overflowed (a sweep_ms of 1e13 ms made the sweep
        // loop's wait overflow and spin; a cap of 2^32 became 0, unlimited).
        BadField{"SweepMsBeyondAYear",
                 [](json& c) { c["scheduler"]["sweep_ms"] = 10'000'000'000'000LL; },
                 "config: scheduler.sweep_ms: must be an integer between 100 and 31536000000 (got "
                 "10000000000000)"},
        BadField{"CapBeyondInt",
                 [](json& c) { c["pipeline"]["entity_caps"] = {{"global", 4294967296LL}}; },
                 "config: pipeline.entity_caps.global: must be an integer between 0 and 100000 "
                 "(got 4294967296)"},
        BadField{"LeaseAsAHugeFloat", [](json& c) { c["scheduler"]["lease_ms"] = 1e19; },
                 "config: scheduler.lease_ms: must be an integer between 1000 and 31536000000"},
        BadField{"RetentionBeyondACentury",
                 [](json& c) { c["scheduler"]["retention_days"] = 100'000; },
                 "config: scheduler.retention_days: must be an integer between 0 and 36500"},
        BadField{"LogFormat", [](json& c) { c["logging"]["format"] = "xml"; },
                 "config: logging.format: must be one of \"text\", \"json\" (got \"xml\")"},
        BadField{"UnknownField", [](json& c) { c["admin"]["prot"] = 1; },
                 "config: admin.prot: is not a known field"},
        BadField{"UnknownSection", [](json& c) { c["schedular"] = json::object(); },
                 "config: schedular: is not a known field"},
        BadField{"MissingTokenEnv", [](json& c) { c["admin"].erase("token_env"); },
                 "config: admin.token_env: is required"},
        BadField{"MissingGateway", [](json& c) { c.erase("gateway"); },
                 "config: gateway: is required"},
        BadField{"GatewayUrlScheme", [](json& c) { c["gateway"]["url"] = "ftp://x"; },
                 "config: gateway.url: must match ^https?://"},
        BadField{"TokenEnvUnset", [](json& c) { c["admin"]["token_env"] = "NOT_SET_ANYWHERE"; },
                 "config: admin.token_env: environment variable NOT_SET_ANYWHERE is not set"},
        BadField{"GatewayKeyUnset", [](json& c) { c["gateway"]["api_key_env"] = "NOPE"; },
                 "config: gateway.api_key_env: environment variable NOPE is not set"},
        BadField{"ProxyOverTls", [](json& c) { c["proxy"]["url"] = "https://proxy:3128"; },
                 "config: proxy.url: invalid proxy url: the scheme must be http:// (a proxy "
                 "reached over TLS is not supported)"},
        BadField{"ProxyWithoutPort", [](json& c) { c["proxy"]["url"] = "http://proxy"; },
                 "config: proxy.url: invalid proxy url: http://proxy has no port"},
        BadField{"ProxyCredentialsInTheFile",
                 [](json& c) { c["proxy"]["url"] = "http://me:secret@proxy:3128"; },
                 "config: proxy.url: holds credentials: put user:password in the variable "
                 "proxy.credentials_env names"},
        BadField{"ProxyCredentialsUnset",
                 [](json& c) {
                   c["proxy"] = {{"url", "http://proxy:3128"}, {"credentials_env", "NOPE"}};
                 },
                 "config: proxy.credentials_env: environment variable NOPE is not set"},
        BadField{"ProxyCredentialsWithoutAUser",
                 [](json& c) {
                   c["proxy"] = {{"url", "http://proxy:3128"}, {"credentials_env", "GW_KEY"}};
                 },
                 "config: proxy.credentials_env: environment variable GW_KEY must hold "
                 "user:password"},
        BadField{"NoProxyWithAPort",
                 [](json& c) {
                   c["proxy"] = {{"url", "http://proxy:3128"}, {"no_proxy", {"db:5432"}}};
                 },
                 "config: proxy.no_proxy: no_proxy entry \"db:5432\": give the host without a "
                 "port"},
        BadField{"ProxyCredentialsWithoutAProxy",
                 [](json& c) { c["proxy"]["credentials_env"] = "GW_KEY"; },
                 "config: proxy.credentials_env: is set without proxy.url"},
        BadField{"NoProxyWithoutAProxy",
                 [](json& c) { c["proxy"]["no_proxy"] = {"internal.example"}; },
                 "config: proxy.no_proxy: is set without proxy.url"},
        BadField{"MysqlWithoutDsn", [](json& c) { c["store"]["backend"] = "mysql"; },
                 "config: store.connection_env: is required when store.backend is \"mysql\""},
        BadField{"StoreBackend", [](json& c) { c["store"]["backend"] = "postgres"; },
                 "config: store.backend: must be one of \"sqlite\", \"mysql\""},
        BadField{"Port", [](json& c) { c["admin"]["port"] = 70000; },
                 "config: admin.port: must be an integer between 0 and 65535 (got 70000)"},
        BadField{"PluginDirectoryItem",
                 [](json& c) {
                   c["plugins"]["directories"] = {"ok", 7};
                 },
                 "config: plugins.directories[1]: must be a non-empty string (got 7)"},
        BadField{"Sha256Pattern", [](json& c) { c["plugins"]["allowed_sha256"] = {"abc"}; },
                 "config: plugins.allowed_sha256[0]: must match ^[0-9a-f]{64}$"},
        BadField{"ConnectorNotObject",
                 [](json& c) {
                   c["plugins"]["connectors"] = {{"github", "x"}};
                 },
                 "config: plugins.connectors.github: must be an object (got \"x\")"},
        BadField{"CapsViaRef",
                 [](json& c) {
                   c["pipeline"]["entity_caps"] = {{"global", -1}};
                 },
                 "config: pipeline.entity_caps.global: must be an integer between 0 and 100000 (got -1)"},
        BadField{"Floor", [](json& c) { c["pipeline"]["rate_limit_floor"] = 2; },
                 "config: pipeline.rate_limit_floor: must be a number between 0 and 1 (got 2)"},
        BadField{"HeartbeatVsLease",
                 [](json& c) {
                   c["scheduler"]["lease_ms"] = 2000;
                   c["scheduler"]["heartbeat_ms"] = 2000;
                 },
                 "config: scheduler.heartbeat_ms: must be at most half of scheduler.lease_ms (2000)"},
        // A beat due just before the lease ends comes after it: each job ran on 3 workers at once.
        BadField{"HeartbeatJustUnderTheLease",
                 [](json& c) {
                   c["scheduler"]["lease_ms"] = 1000;
                   c["scheduler"]["heartbeat_ms"] = 999;
                 },
                 "config: scheduler.heartbeat_ms: must be at most half of scheduler.lease_ms (1000)"},
        BadField{"RetryInitialOverMax",
                 [](json& c) {
                   c["scheduler"]["retry_initial_ms"] = 2000;
                   c["scheduler"]["retry_max_ms"] = 1000;
                 },
                 "config: scheduler.retry_initial_ms: must not be more than "
                 "scheduler.retry_max_ms (1000)"},
        BadField{"TransientRetries", [](json& c) { c["pipeline"]["transient_retries"] = 11; },
                 "config: pipeline.transient_retries: must be an integer between 0 and 10 (got "
                 "11)"},
        BadField{"RecoverWithoutOwner",
                 [](json& c) { c["scheduler"]["recover_own_leases"] = true; },
                 "config: scheduler.recover_own_leases: needs scheduler.owner: the default owner "
                 "(hostname:pid) changes every start"},
        BadField{"SectionNotObject", [](json& c) { c["health"] = 5; },
                 "config: health: must be an object (got 5)"},
        BadField{"IsolationMode", [](json& c) { c["plugins"]["isolation"]["mode"] = "thread"; },
                 "config: plugins.isolation.mode: must be one of \"none\", \"process\""},
        BadField{"IsolationWorkerMissing",
                 [](json& c) {
                   c["plugins"]["isolation"] = {{"mode", "process"},
                                                {"worker_path", "/nonexistent/worker"}};
                 },
                 "config: plugins.isolation.worker_path: /nonexistent/worker is not an executable "
                 "file (No such file or directory): process isolation needs "
                 "backhaul-plugin-worker"},
        BadField{"IsolationWorkerIsADirectory",
                 [](json& c) {
                   c["plugins"]["isolation"] = {{"mode", "process"}, {"worker_path", "/"}};
                 },
                 "config: plugins.isolation.worker_path: / is not an executable file (not a "
                 "regular file): process isolation needs backhaul-plugin-worker"},
        BadField{"IsolationCallTimeout",
                 [](json& c) { c["plugins"]["isolation"]["call_timeout_ms"] = 10; },
                 "config: plugins.isolation.call_timeout_ms: must be an integer between 100 and "
                 "3600000 (got 10)"},
        BadField{"IsolationStartWait",
                 [](json& c) { c["plugins"]["isolation"]["start_wait_ms"] = -1; },
                 "config: plugins.isolation.start_wait_ms: must be an integer between 0 and "
                 "3600000 (got -1)"},
        BadField{"HeartbeatLanesTakeEveryConnection",
                 [](json& c) {
                   c["store"] = {
                       {"backend", "mysql"}, {"connection_env", "MYSQL_DSN"}, {"pool_size", 4}};
                   c["scheduler"]["heartbeat_lanes"] = 4;
                 },
                 "config: scheduler.heartbeat_lanes: must be less than store.pool_size (4) with "
                 "the mysql backend: a heartbeat that waits for a row holds a connection, and "
                 "claims and completions need one too"},
        BadField{"IsolationMemoryLimitTooSmall",
                 [](json& c) { c["plugins"]["isolation"]["memory_limit_mb"] = 8; },
                 "config: plugins.isolation.memory_limit_mb: must be 0 (no limit) or at least 32 "
                 "(got 8)"},
        BadField{"IsolationMemoryLimitNegative",
                 [](json& c) { c["plugins"]["isolation"]["memory_limit_mb"] = -1; },
                 "config: plugins.isolation.memory_limit_mb: must be an integer between 0 and "
                 "1048576 (got -1)"}),
    [](const ::testing::TestParamInfo<BadField>& param) { return param.param.name; });

// The MySQL connection string is configuration too: one the store will refuse at open (an unknown
// key, a value that is not one, no db=) is reported by the config check, naming the field, as
// every other bad field is. It passed, so `backhauld --check-config` said "valid" and the start
// then failed.
TEST(ConfigTest, ABadMysqlConnectionStringIsReportedNamingTheFieldAndTheProblem) {
  json config = minimal();
  config["store"] = {{"backend", "mysql"}, {"connection_env", "DSN"}};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"host=127.0.0.1;dbname=b;user=u;password=p", "unknown key 'dbname'"},
      {"host=127.0.0.1;db=b;port=33o6;user=u", "port must be a number, not '33o6'"},
      {"host=127.0.0.1;user=u;password=p", "db= is required"},
      {"host=127.0.0.1;db=b;character-set=latin1", "character-set must be utf8mb4"},
  };
  for (const auto& [dsn, problem] : cases) {
    const std::string error = error_of(config, env_with({{"ADMIN_TOKEN", "t0ken"}, {"DSN", dsn}}));
    EXPECT_EQ(error.rfind("config: store.connection_env: ", 0), 0u) << dsn << ": " << error;
    EXPECT_NE(error.find(problem), std::string::npos) << dsn << ": " << error;
  }
  EXPECT_EQ(error_of(config, env_with({{"ADMIN_TOKEN", "t0ken"},
                                       {"DSN", "host=127.0.0.1;db=b;user=u;password=p"}})),
            "");
}

// A value after password= may be the rest of a password holding ';': no error quotes it, whatever
// is wrong with it (the unknown-key check hid it; the number, flag and range checks quoted it).
TEST(ConfigTest, AValueThatMayBePartOfThePasswordIsNeverQuoted) {
  json config = minimal();
  config["store"] = {{"backend", "mysql"}, {"connection_env", "DSN"}};
  for (const std::string tail :
       {"connect-timeout=Hunter2secret", "port=Hunter2secret", "compress=Hunter2secret",
        "character-set=Hunter2secret", "port=99999Hunter2secret"}) {
    const std::string dsn = "host=127.0.0.1;db=b;user=u;password=Xy;" + tail;
    const std::string error = error_of(config, env_with({{"ADMIN_TOKEN", "t0ken"}, {"DSN", dsn}}));
    EXPECT_EQ(error.rfind("config: store.connection_env: mysql connection string: ", 0), 0u)
        << error;
    EXPECT_EQ(error.find("Hunter2"), std::string::npos) << error;
    EXPECT_NE(error.find("its value (not shown"), std::string::npos) << error;
  }
  // Not after a password, the value is shown.
  EXPECT_NE(error_of(config, env_with({{"ADMIN_TOKEN", "t0ken"},
                                       {"DSN", "host=h;connect-timeout=soon;db=b;password=p"}}))
                .find("connect-timeout must be a number, not 'soon'"),
            std::string::npos);
}

// gateway.ca_file is relative to the config file's directory, as every other path is, and a file
// that cannot be read is a problem of the config, not a failure at the first HTTPS request.
TEST(ConfigTest, TheCaFileIsFoundBesideTheConfigAndMustBeReadable) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("config-ca-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "ca.pem") << "-----BEGIN CERTIFICATE-----\n";
  json config = minimal();
  config["gateway"]["ca_file"] = "ca.pem";
  EXPECT_EQ(parse_config(config.dump(), dir, kEnv).gateway.ca_file, (dir / "ca.pem").string());
  config["gateway"]["ca_file"] = "missing.pem";
  try {
    parse_config(config.dump(), dir, kEnv);
    ADD_FAILURE() << "a missing CA file passed";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "config: gateway.ca_file: " + (dir / "missing.pem").string() +
                                         " cannot be read (No such file or directory)");
  }
  config["gateway"]["ca_file"] = ".";
  try {
    parse_config(config.dump(), dir, kEnv);
    ADD_FAILURE() << "a directory passed as the CA file";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "config: gateway.ca_file: " + (dir / ".").string() + " is not a regular file");
  }
  std::filesystem::remove_all(dir);
}

// A config file that is a directory, empty or missing is refused saying which (a directory and
// an empty file read as "(root): not valid JSON", a missing one gave no reason).
TEST(ConfigTest, AConfigFileThatIsADirectoryEmptyOrMissingIsRefusedSayingWhich) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("config-file-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "empty.json").flush();
  auto error = [](const std::filesystem::path& path) {
    try {
      load_config(path, kEnv);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  EXPECT_EQ(error(dir), "config: cannot read " + dir.string() + ": it is a directory");
  EXPECT_EQ(error(dir / "empty.json"), "config: " + (dir / "empty.json").string() + " is empty");
  EXPECT_EQ(error(dir / "missing.json"), "config: cannot read " + (dir / "missing.json").string() +
                                             ": No such file or directory");
  std::filesystem::remove_all(dir);
}

// A secret that goes into a header: one with a line break (read from a file with its newline) made
// every gateway call fail as "gateway unreachable", retried for ever, and every admin request 401.
// It is refused at start, naming the variable and not the value. The store's connection string
// is not a header, and its parser drops the whitespace around its items: it may keep its newline.
TEST(ConfigTest, ASecretWithALineBreakIsRefusedNamingTheVariable) {
  const std::string error =
      error_of(minimal(), env_with({{"ADMIN_TOKEN", "t0ken\n"}, {"GW_KEY", "gw\r-secret"}}));
  json with_key = minimal();
  with_key["gateway"]["api_key_env"] = "GW_KEY";
  const std::string both =
      error_of(with_key, env_with({{"ADMIN_TOKEN", "t0ken\n"}, {"GW_KEY", "gw\r-secret"}}));
  EXPECT_NE(error.find("admin.token_env: environment variable ADMIN_TOKEN holds a control "
                       "character (a line break from a file?)"),
            std::string::npos)
      << error;
  EXPECT_NE(both.find("gateway.api_key_env: environment variable GW_KEY holds a control character"),
            std::string::npos)
      << both;
  EXPECT_EQ(both.find("t0ken"), std::string::npos) << both;
  EXPECT_EQ(both.find("secret"), std::string::npos) << both;

  json mysql = minimal();
  mysql["store"] = {{"backend", "mysql"}, {"connection_env", "MYSQL_DSN"}};
  const DaemonConfig c =
      parse_config(mysql.dump(), "/srv/backhaul",
                   env_with({{"ADMIN_TOKEN", "t0ken"},
                             {"MYSQL_DSN", "host=127.0.0.1;db=b;user=u;password=p\n"}}));
  EXPECT_EQ(c.store.backend, "mysql");
}

// A secret that goes into a header with a space at either end was taken, and could never match:
// the server's HTTP parser (Poco's, here) drops the spaces around a header's value, so an admin
// token "t0ken " answered every request 401. It is refused at start, naming the variable and not
// the value; a space inside is the secret's own, and so is one at the end of the proxy's password,
// which goes base64-encoded.
TEST(ConfigTest, ASecretThatBeginsOrEndsWithASpaceIsRefusedNamingTheVariable) {
  json with_key = minimal();
  with_key["gateway"]["api_key_env"] = "GW_KEY";
  for (const char* token : {"t0ken ", " t0ken", "  t0ken  "}) {
    const std::string error =
        error_of(with_key, env_with({{"ADMIN_TOKEN", token}, {"GW_KEY", " gw-secret"}}));
    EXPECT_NE(error.find("config: admin.token_env: environment variable ADMIN_TOKEN begins or "
                         "ends with a space, which an HTTP header drops (it could never match)"),
              std::string::npos)
        << error;
    EXPECT_NE(error.find("config: gateway.api_key_env: environment variable GW_KEY begins or ends "
                         "with a space"),
              std::string::npos)
        << error;
    EXPECT_EQ(error.find("t0ken"), std::string::npos) << error;
    EXPECT_EQ(error.find("secret"), std::string::npos) << error;
  }
  EXPECT_EQ(parse_config(with_key.dump(), "/srv/backhaul",
                         env_with({{"ADMIN_TOKEN", "t0 ken"}, {"GW_KEY", "gw secret"}}))
                .admin.token,
            "t0 ken");
  json proxied = minimal();
  proxied["proxy"] = {{"url", "http://proxy.corp:3128"}, {"credentials_env", "PROXY_AUTH"}};
  EXPECT_EQ(parse_config(proxied.dump(), "/srv/backhaul",
                         env_with({{"ADMIN_TOKEN", "t0ken"}, {"PROXY_AUTH", "me:pass "}}))
                .proxy.options.password,
            "pass ");
}

TEST(ConfigTest, EveryProblemIsReportedOnItsOwnLine) {
  json config = minimal();
  config["scheduler"]["workers"] = "eight";
  config["logging"]["level"] = "loud";
  const std::string error = error_of(config);
  EXPECT_NE(error.find("config: scheduler.workers: "), std::string::npos) << error;
  EXPECT_NE(error.find("config: logging.level: "), std::string::npos) << error;
  EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << error;
}

TEST(ConfigTest, InvalidJsonAndMissingFileFail) {
  EXPECT_THROW(parse_config("{not json", "/tmp", kEnv), ConfigError);
  EXPECT_THROW(load_config("/nonexistent/backhaul/config.json", kEnv), ConfigError);
  EXPECT_EQ(error_of(json::array()), "config: (root): must be an object (got [])");
}

// A number past what a double holds threw nlohmann's out_of_range, no ConfigError: a start or
// `--check-config` ended on an uncaught exception (SIGABRT) instead of naming the problem.
TEST(ConfigTest, ANumberTooLargeForADoubleIsAConfigErrorSayingWhere) {
  const std::string text = R"({"pipeline":{"throttle_per_hour":1e999}})";
  try {
    parse_config(text, "/tmp", kEnv);
    ADD_FAILURE() << "loaded";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "config: (root): number out of range at byte 38: a double holds up to about "
                 "1.8e308");
  }
}

// A file nested absurdly deep is refused with the depth, not a stack overflow in the schema check.
TEST(ConfigTest, AConfigNestedTooDeepIsRefused) {
  const size_t deep = 300'000;
  const std::string text = R"({"plugins":{"github":{"config":)" + std::string(deep, '[') +
                           std::string(deep, ']') + "}}}";
  try {
    parse_config(text, "/tmp", kEnv);
    ADD_FAILURE() << "loaded";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(), "config: (root): nests 300003 levels deep, more than 256");
  }
}

TEST(ConfigTest, SchemaIsBuiltInAndDescribesEverySection) {
  const json schema = json::parse(config_schema_text());
  for (const char* section : {"store", "plugins", "gateway", "proxy", "admin", "scheduler",
                              "pipeline", "health", "shutdown", "logging"}) {
    EXPECT_TRUE(schema["properties"].contains(section)) << section;
  }
  EXPECT_FALSE(schema["additionalProperties"].get<bool>());
}

TEST(JsonSchemaTest, ValidatesTheSubsetItUses) {
  const json schema = {{"type", "object"},
                       {"required", {"a"}},
                       {"additionalProperties", false},
                       {"properties",
                        {{"a", {{"type", "array"}, {"items", {{"$ref", "#/$defs/n"}}}}},
                         {"b", {{"type", {"string", "null"}}}}}},
                       {"$defs", {{"n", {{"type", "number"}, {"maximum", 3}}}}}};
  EXPECT_TRUE(validate_json(schema, {{"a", {1, 2.5}}, {"b", nullptr}}).empty());
  const auto violations = validate_json(schema, {{"a", {1, 4, "x"}}, {"b", 1}, {"c", true}});
  ASSERT_EQ(violations.size(), 4u);
  EXPECT_EQ(violations[0].path, "a[1]");
  EXPECT_EQ(violations[0].message, "must be a number <= 3 (got 4)");
  EXPECT_EQ(violations[1].path, "a[2]");
  EXPECT_EQ(violations[2].path, "b");
  EXPECT_EQ(violations[2].message, "must be a string or a null (got 1)");
  EXPECT_EQ(violations[3].path, "c");
  EXPECT_EQ(validate_json(schema, json::object()).at(0).message, "is required");
  EXPECT_THROW(validate_json({{"$ref", "#/$defs/missing"}}, 1), std::invalid_argument);
}

}  // namespace
}  // namespace backhaul::daemon

namespace backhaul::daemon {
namespace {

// The committed OpenAPI description names every route the API serves.
TEST(OpenApiTest, DescribesEveryRoute) {
  std::ifstream in(std::string(BACKHAUL_SOURCE_DIR) + "/schemas/openapi.yaml");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  for (const char* route : {"/v1/runs",
                            "/v1/runs/preview",
                            "/v1/runs/{id}",
                            "/v1/runs/{id}/cancel",
                            "/v1/installations/{id}/cancel",
                            "/v1/jobs",
                            "/v1/jobs/{id}",
                            "/v1/jobs/{id}/cancel",
                            "/v1/jobs/{id}/checkpoint",
                            "/v1/dead-letters",
                            "/v1/dead-letters/stats",
                            "/v1/dead-letters/retry",
                            "/v1/dead-letters/purge",
                            "/v1/dead-letters/{id}",
                            "/v1/dead-letters/{id}/retry",
                            "/v1/dead-letters/{id}/ignore",
                            "/v1/plugins",
                            "/v1/plugins/{id}",
                            "/v1/plugins/{id}/validate-config",
                            "/v1/rate-limits",
                            "/health/live",
                            "/health/ready",
                            "/metrics"}) {
    EXPECT_NE(text.str().find(std::string("\n  ") + route + ":\n"), std::string::npos) << route;
  }
  for (const char* code :
       {"VALIDATION_ERROR", "UNAUTHORIZED", "JOB_NOT_FOUND", "RUN_NOT_FOUND",
        "DEAD_LETTER_NOT_FOUND", "PLUGIN_NOT_FOUND", "METHOD_NOT_ALLOWED", "CONFLICT",
        "PAYLOAD_TOO_LARGE", "STORAGE_ERROR", "GATEWAY_ERROR", "INTERNAL_ERROR"}) {
    EXPECT_NE(text.str().find(code), std::string::npos) << code;
  }
}

}  // namespace
}  // namespace backhaul::daemon
