// `backhaul fetch`: page through one resource's entity types with a connector plugin, print what
// comes back, and optionally deliver it to the gateway. The connector author's everyday tool.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/common/errors.h"
#include "core/common/utf8.h"
#include "core/common/watchdog.h"
#include "core/gateway/gateway_client.h"
#include "core/http/poco_transport.h"
#include "core/plugins/plugin_loader.h"
#include "host/cli/cli.h"
#include "host/cli/crash_report.h"
#include <unistd.h>

namespace backhaul::cli {
namespace {

struct FetchOptions {
  std::string plugin;
  std::vector<std::string> plugin_dirs;
  std::string config = "{}";
  std::string base_url;
  std::string installation = "cli";
  std::string resource_id;
  std::string resource_name;
  std::vector<std::string> entities;
  std::string token;
  std::string gateway;
  std::string connection;
  std::string gateway_api_key;
  bool all_resources = false;
  std::optional<std::string> since;  // given, even empty (refused then)
  int depth_days = 0;
  std::string cursor;
  int max_pages = 0;
  bool print_events = false;
  bool quiet = false;
  bool dispatch = false;
  bool json_summary = false;
  int retries = 3;
  int max_wait_s = 120;
  std::string ca_file;
  bool insecure = false;
  std::string proxy;
  std::vector<std::string> no_proxy;
  int timeout_ms = 30000;
  int call_timeout_ms = 600'000;  // of each call into the plugin (its load, create, fetch_page)
};

struct Totals {
  int units = 0;
  int64_t pages = 0;
  int64_t events = 0;
  int64_t raw = 0;
  int64_t accepted = 0;
  int64_t duplicates = 0;
  int64_t retries = 0;
  int64_t failed_units = 0;
};

// Parses "2024-01-31", "2024-01-31T12:00:00Z" (UTC) or a millisecond Unix time.
int64_t parse_since(const std::string& text) {
  // 9999-12-31T23:59:59.999Z, the last time the ISO 8601 form can name.
  constexpr int64_t kLastMs = 253'402'300'799'999;
  if (text.empty()) throw ConfigError("--since is empty: give a date and time, or a Unix ms time");
  if (text.find_first_not_of("0123456789") == std::string::npos) {
    int64_t ms = 0;
    if (std::from_chars(text.data(), text.data() + text.size(), ms).ec != std::errc() ||
        ms > kLastMs)
      throw ConfigError("--since '" + text + "' is too large for a Unix ms time");
    return ms;
  }
  // The shape first: strptime takes "2024-1-1" and "2024-01-01Z" alike.
  const std::string_view shape = "dddd-dd-ddTdd:dd:ddZ";
  const bool shaped = (text.size() == 10 || text.size() == 19 || text.size() == 20) &&
                      std::equal(text.begin(), text.end(), shape.begin(), [](char c, char s) {
                        return s == 'd' ? c >= '0' && c <= '9' : c == s;
                      });
  if (!shaped) {
    throw ConfigError("--since '" + text +
                      "' is not 2024-01-31, 2024-01-31T12:00:00Z (UTC) or a Unix ms time");
  }
  std::tm tm{};
  const char* end = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end) end = strptime(text.c_str(), "%Y-%m-%d", &tm);
  if (!end || (*end && std::string(end) != "Z"))
    throw ConfigError("--since '" + text + "' is not an ISO 8601 UTC time or a Unix ms time");
  // strptime takes any day up to 31 and timegm rolls it over: 2024-02-31 would be March 2nd.
  const std::tm asked = tm;
  const time_t seconds = timegm(&tm);
  if (tm.tm_year != asked.tm_year || tm.tm_mon != asked.tm_mon || tm.tm_mday != asked.tm_mday ||
      tm.tm_hour != asked.tm_hour || tm.tm_min != asked.tm_min || tm.tm_sec != asked.tm_sec)
    throw ConfigError("--since '" + text + "' is not a date and time of the calendar");
  if (seconds < 0) throw ConfigError("--since '" + text + "' is before 1970");
  return static_cast<int64_t>(seconds) * 1000;
}

std::string merged_config(const FetchOptions& o) {
  nlohmann::json config = nlohmann::json::parse(o.config, nullptr, false);
  if (config.is_discarded() || !config.is_object())
    throw ConfigError("--config must be a JSON object");
  if (!o.base_url.empty()) config["base_url"] = o.base_url;
  return config.dump();
}

// SIGINT or SIGTERM: the signal's number, once one came. The units stop at their next page
// boundary (or out of a wait), and the summary is printed.
std::atomic<int> g_stop_signal{0};

// A second stop signal, of either kind (Ctrl-C, then a supervisor's SIGTERM), ends the command at
// once, as the signal would have.
void on_stop_signal(int signal_number) {
  if (g_stop_signal.exchange(signal_number) != 0) {
    ::signal(signal_number, SIG_DFL);
    ::raise(signal_number);  // delivered when the handler returns (it is blocked in here)
  }
}

void catch_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  action.sa_flags = SA_RESTART;  // a plugin's own I/O sees no EINTR
  sigemptyset(&action.sa_mask);
  for (const int signal_number : {SIGINT, SIGTERM}) sigaction(signal_number, &action, nullptr);
}

// A plugin call that never returns (a plugin stuck in a loop, or waiting on what never comes)
// held the command for ever: past --call-timeout-ms it ends, saying which call. [any thread]
Watchdog call_watchdog(const FetchOptions& o, std::string call) {
  return Watchdog(std::chrono::milliseconds(o.call_timeout_ms), [&o, call = std::move(call)] {
    std::cout.flush();
    std::cerr << "fetch: the plugin " << o.plugin << " did not return from " << call << " within "
              << o.call_timeout_ms << " ms (--call-timeout-ms); ending" << std::endl;
    std::_Exit(1);
  });
}

// Sleeps `ms`, in slices, unless a stop signal comes: false then (a wait of --max-wait-s would
// otherwise hold the stop for minutes).
bool pause_unless_stopped(int64_t ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (g_stop_signal.load() == 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return true;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(until - now, std::chrono::milliseconds(100)));
  }
  return false;
}

// Thrown out of a delivery's back-off by a stop signal.
struct StopRequested {};

class FetchRun {
 public:
  FetchRun(const FetchOptions& options, const plugins::Connector& connector,
           const gateway::GatewayClient* gateway, std::optional<gateway::Connection> connection,
           std::string token)
      : o_(options),
        connector_(connector),
        gateway_(gateway),
        connection_(std::move(connection)),
        token_(std::move(token)) {}

  // Fetches one unit (its access token is the run's current one) until its last page,
  // --max-pages, a failure, or a stop signal.
  void unit(plugins::Unit unit, const std::string& entity, int64_t since_ms, Totals& totals) {
    ++totals.units;
    unit.access_token = token_;
    plugins::FetchParams params{std::move(unit), entity, since_ms, std::nullopt};
    if (!o_.cursor.empty()) params.cursor = o_.cursor;
    const std::string label = params.unit.resource_name.value_or(params.unit.resource_id);
    int page_no = 0;
    int attempts = 0;
    bool refreshed = false;
    while (o_.max_pages == 0 || page_no < o_.max_pages) {
      if (g_stop_signal.load() != 0) {
        progress() << label << " " << entity << ": stopped by signal " << g_stop_signal.load()
                   << " after " << page_no << " pages, final cursor "
                   << escape_controls(params.cursor.value_or("(none)")) << "\n";
        return;
      }
      std::optional<plugins::Page> page;
      try {
        {
          const Watchdog watchdog = call_watchdog(o_, "fetch_page (" + label + " " + entity + ")");
          page.emplace(connector_.fetch_page(params));
        }
        // (A payload that is not one JSON object, which --events would write into its line as
        // it is, was refused by fetch_page as a malformed page.)
      } catch (const plugins::ConnectorFailure& e) {
        // A token from the gateway (--connection) is refreshed there; one given with --token has
        // no connection to refresh it from.
        if (e.status() == BACKHAUL_AUTH_EXPIRED && gateway_ && !o_.connection.empty() &&
            !refreshed) {
          std::cerr << label << " " << entity << ": token expired, refreshing once\n";
          try {
            // The later units start with the new token too (each spent a 401 on the old one).
            token_ = gateway_->access_token(o_.connection);
          } catch (const gateway::GatewayError& refresh) {
            // This unit fails; the others go on (it ended the whole command, summary and all).
            ++totals.failed_units;
            std::cerr << label << " " << entity << ": failed: " << plugins::status_name(e.status())
                      << ": " << escape_controls(e.what())
                      << "; refreshing the token failed: " << escape_controls(refresh.what())
                      << "\n";
            return;
          }
          if (has_control_character(token_)) {
            ++totals.failed_units;
            std::cerr << label << " " << entity
                      << ": failed: the token the gateway refreshed holds a control character\n";
            return;
          }
          params.unit.access_token = token_;
          refreshed = true;
          continue;
        }
        if (e.is_retryable() && e.status() != BACKHAUL_AUTH_EXPIRED && attempts < o_.retries) {
          int64_t wait_ms = e.retry_after_ms() > 0 ? e.retry_after_ms() : (500LL << attempts);
          if (wait_ms > int64_t{o_.max_wait_s} * 1000) {
            report_failure(label, entity, e, totals,
                           "; asked to wait " + std::to_string((wait_ms + 999) / 1000) +
                               " s, more than --max-wait-s " + std::to_string(o_.max_wait_s));
            return;
          }
          ++attempts;
          ++totals.retries;
          std::cerr << label << " " << entity << ": " << plugins::status_name(e.status()) << " ("
                    << escape_controls(e.what()) << "), retry " << attempts << "/" << o_.retries
                    << " in " << wait_ms << " ms\n";
          pause_unless_stopped(wait_ms);  // a stop is seen at the top of the loop
          continue;
        }
        report_failure(label, entity, e, totals);
        return;
      }
      attempts = 0;
      refreshed = false;
      ++page_no;
      try {
        handle_page(label, entity, page_no, *page, totals);
      } catch (const StopRequested&) {
        progress() << label << " " << entity << ": stopped by signal " << g_stop_signal.load()
                   << " while delivering page " << page_no << ", final cursor "
                   << escape_controls(params.cursor.value_or("(none)")) << "\n";
        return;
      } catch (const gateway::GatewayError& e) {
        // The unit stops where its events could not be delivered; the other units go on.
        ++totals.failed_units;
        std::cerr << label << " " << entity << ": failed: page " << page_no
                  << " could not be dispatched: " << escape_controls(e.what()) << "\n";
        return;
      }
      auto next = page->next_cursor();
      if (!next) {
        if (!o_.quiet) {
          progress() << label << " " << entity << ": done after " << page_no
                     << " pages, final cursor (none)\n";
        }
        return;
      }
      params.cursor = std::string(*next);
    }
    if (!o_.quiet) {
      progress() << label << " " << entity << ": stopped at --max-pages " << o_.max_pages
                 << ", final cursor " << escape_controls(params.cursor.value_or("(none)")) << "\n";
    }
  }

 private:
  // A plugin's message may hold anything: escaped, it cannot forge or hide lines.
  void report_failure(const std::string& label, const std::string& entity,
                      const plugins::ConnectorFailure& e, Totals& totals,
                      const std::string& why = "") {
    ++totals.failed_units;
    std::cerr << label << " " << entity << ": failed: " << plugins::status_name(e.status()) << ": "
              << escape_controls(e.what()) << why << "\n";
  }

  void handle_page(const std::string& label, const std::string& entity, int page_no,
                   const plugins::Page& page, Totals& totals) {
    ++totals.pages;
    totals.events += static_cast<int64_t>(page.size());
    totals.raw += static_cast<int64_t>(page.raw_count());
    if (o_.print_events) {
      for (size_t i = 0; i < page.size(); ++i) {
        auto e = page.event(i);
        std::cout << R"({"deliveryId":)" << nlohmann::json(e.delivery_id).dump()
                  << R"(,"eventType":)" << nlohmann::json(e.event_type).dump() << R"(,"payload":)"
                  << e.payload_json << "}\n";
      }
      // Whole lines out per page: a stop or a crash then cuts no line in two.
      std::cout.flush();
    }
    if (gateway_ && o_.dispatch) dispatch(page, totals);
    if (o_.quiet) return;
    std::ostream& out = progress();
    out << label << " " << entity << " page " << page_no << ": events=" << page.size()
        << " raw=" << page.raw_count();
    if (auto rl = page.rate_limit()) {
      out << " rate=" << rl->remaining << "/" << rl->limit
          << " reset=" << gateway::iso8601_ms(rl->reset_at_unix_ms);
    }
    auto next = page.next_cursor();
    out << " next=" << (next ? escape_controls(*next) : std::string("(end)")) << "\n";
  }

  // Where the per-page and per-unit lines go: stderr under --json, whose summary is then all of
  // stdout (with the events of --events, JSON lines too).
  std::ostream& progress() const { return o_.json_summary ? std::cerr : std::cout; }

  void dispatch(const plugins::Page& page, Totals& totals) {
    for (size_t i = 0; i < page.size(); ++i) {
      auto e = page.event(i);
      gateway::Delivery d{connection_->id, connection_->org_id, e.delivery_id, e.event_type,
                          e.payload_json};
      for (int attempt = 0;; ++attempt) {
        try {
          if (gateway_->dispatch(connection_->provider, d) == gateway::DispatchResult::kAccepted) {
            ++totals.accepted;
          } else {
            ++totals.duplicates;
          }
          break;
        } catch (const gateway::GatewayError& err) {
          // A 429 is waited out as long as it asks, within --max-wait-s.
          const int64_t wait_ms = std::max<int64_t>(int64_t{100} << attempt, err.retry_after_ms());
          if (!err.retryable() || attempt >= o_.retries ||
              wait_ms > int64_t{o_.max_wait_s} * 1000) {
            throw;
          }
          ++totals.retries;
          if (!pause_unless_stopped(wait_ms)) throw StopRequested{};
        }
      }
    }
  }

  const FetchOptions& o_;
  const plugins::Connector& connector_;
  const gateway::GatewayClient* gateway_;
  std::optional<gateway::Connection> connection_;
  std::string token_;  // the current access token, refreshed through the gateway on a 401
};

constexpr const char* kProxyCredentialsEnv = "BACKHAUL_PROXY_CREDENTIALS";

// A token with a control character (read from a file with its line break) fails every request as
// an invalid header, which names neither the token nor where it came from.
void check_token(const std::string& token, const std::string& source) {
  if (has_control_character(token)) {
    throw ConfigError("the token from " + source +
                      " holds a control character (a line break at its end?)");
  }
}

void run_fetch(const FetchOptions& o) {
  // First: a stop signal during loading (or a gateway call) is noted, not the end of the process,
  // and the units then stop before their first page.
  catch_stop_signals();
  // The usage errors that need no plugin and no gateway are found before either is asked
  // anything: a plugin's init() may take long, or hang.
  if (!o.connection.empty() && o.gateway.empty()) throw ConfigError("--connection needs --gateway");
  if (o.dispatch && o.connection.empty()) {
    throw ConfigError("--dispatch needs --gateway and --connection");
  }
  if (o.all_resources && o.connection.empty()) {
    throw ConfigError("--all-resources needs --connection");
  }
  if (!o.all_resources && o.resource_id.empty()) {
    throw ConfigError("--resource-id is required (or --all-resources)");
  }
  int64_t since_ms = 0;
  if (o.since) since_ms = parse_since(*o.since);
  // Found now, not as a RETRYABLE failure of the first https request, retried with backoff.
  if (!o.ca_file.empty() && ::access(o.ca_file.c_str(), R_OK) != 0) {
    throw ConfigError("--ca-file " + o.ca_file + ": " + std::strerror(errno));
  }
  http::PocoTransportOptions transport_options;
  transport_options.ca_file = o.ca_file;
  transport_options.verify_peer = !o.insecure;
  if (!o.proxy.empty()) {
    try {
      transport_options.proxy = http::parse_proxy_url(o.proxy);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("--proxy: ") + e.what());
    }
    // Kept off the command line (ps, shell history) when they are in the environment.
    const char* credentials = std::getenv(kProxyCredentialsEnv);
    if (transport_options.proxy.username.empty() && credentials != nullptr && *credentials) {
      try {
        http::set_proxy_credentials(transport_options.proxy, credentials);
      } catch (const std::invalid_argument&) {
        throw ConfigError(std::string("environment variable ") + kProxyCredentialsEnv +
                          " must hold user:password");
      }
    }
    try {
      transport_options.proxy.no_proxy = http::parse_no_proxy(o.no_proxy);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string("--no-proxy: ") + e.what());
    }
  }
  http::PocoTransport transport(transport_options);
  plugins::HostServices services{transport, SystemClock::instance(),
                                 std::chrono::milliseconds(o.timeout_ms)};
  const std::filesystem::path path = resolve_plugin(o.plugin, o.plugin_dirs);
  CrashReport crash("fetch", path, "fetch: the plugin " + path.string() + " crashed");
  std::optional<plugins::Plugin> loaded;
  {
    const Watchdog watchdog = call_watchdog(o, "its init() (loading)");
    loaded.emplace(plugins::load_plugin(path, services));
  }
  plugins::Plugin& plugin = *loaded;
  const std::string config = merged_config(o);
  std::optional<plugins::Connector> connector;
  // However this ends, the plugin is unloaded under the watchdog: an error past this point (the
  // gateway refusing, say) unwound it without one, and a deinit() that hangs held the command.
  struct UnloadGuard {
    const FetchOptions& o;
    std::optional<plugins::Connector>& connector;
    std::optional<plugins::Plugin>& loaded;
    void unload() {
      if (!loaded) return;
      const Watchdog watchdog = call_watchdog(o, "destroy() or deinit() (unloading)");
      connector.reset();
      loaded.reset();
    }
    ~UnloadGuard() {
      try {
        unload();
      } catch (const std::exception&) {  // no thread for the watchdog: unloaded without it
      }
    }
  } unload_guard{o, connector, loaded};
  {
    const Watchdog watchdog = call_watchdog(o, "create()");
    try {
      connector.emplace(plugin.create(config));
    } catch (const std::exception& e) {
      throw ConfigError(escape_controls(e.what()));  // the plugin's words, which may hold any
    }
  }

  std::optional<gateway::GatewayClient> gateway;
  std::optional<gateway::Connection> connection;
  if (!o.gateway.empty()) {
    gateway.emplace(
        transport, o.gateway,
        o.gateway_api_key.empty() ? std::nullopt : std::optional<std::string>(o.gateway_api_key),
        SystemClock::instance(), std::chrono::milliseconds(o.timeout_ms));
  }
  if (!o.connection.empty()) {
    connection = gateway->connection(o.connection);
    if (connection->provider != plugin.info().id) {
      throw ConfigError("connection " + o.connection + " is for provider '" + connection->provider +
                        "', not '" + plugin.info().id + "'");
    }
  }

  std::string token = o.token;
  std::string token_source = "--token";
  if (token.empty()) {
    if (const char* env = std::getenv("BACKHAUL_TOKEN")) token = env;
    token_source = "environment variable BACKHAUL_TOKEN";
  }
  if (token.empty() && connection) {
    token = gateway->access_token(o.connection);
    token_source = "the gateway's connection " + o.connection;
  }
  if (token.empty()) throw ConfigError("no token: pass --token, BACKHAUL_TOKEN or --connection");
  check_token(token, token_source);

  std::vector<gateway::Resource> resources;
  if (o.all_resources) {
    resources = connection->resources;
  } else {
    resources.push_back({o.resource_id, o.resource_name.empty()
                                            ? std::nullopt
                                            : std::optional<std::string>(o.resource_name)});
  }
  std::vector<std::string> entities = o.entities;
  if (entities.empty()) entities = plugin.info().default_entity_types;
  // A cursor is one unit's: given to every unit, the others fetched its pages as their own.
  if (!o.cursor.empty() && resources.size() * entities.size() != 1) {
    throw ConfigError("--cursor resumes one unit: give one resource and one --entity (this is " +
                      std::to_string(resources.size()) + " resources x " +
                      std::to_string(entities.size()) + " entity types)");
  }

  if (o.depth_days > 0)
    since_ms = SystemClock::instance().now_ms() - int64_t{o.depth_days} * 86'400'000;

  std::string installation = connection ? connection->installation_id : o.installation;
  FetchRun run(o, *connector, gateway ? &*gateway : nullptr, connection, token);
  Totals totals;
  auto started = std::chrono::steady_clock::now();
  for (const auto& resource : resources) {
    for (const auto& entity : entities) {
      if (g_stop_signal.load() != 0) break;
      run.unit({installation, resource.id, resource.name, ""}, entity, since_ms, totals);
    }
  }
  const int stopped_by = g_stop_signal.load();
  const std::string plugin_id = plugin.info().id;
  unload_guard.unload();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (o.json_summary) {
    nlohmann::json j = {{"plugin", plugin_id},
                        {"units", totals.units},
                        {"pages", totals.pages},
                        {"events", totals.events},
                        {"raw", totals.raw},
                        {"accepted", totals.accepted},
                        {"duplicates", totals.duplicates},
                        {"retries", totals.retries},
                        {"failed_units", totals.failed_units},
                        {"seconds", seconds}};
    if (stopped_by != 0) j["stopped_by_signal"] = stopped_by;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "summary: plugin=" << plugin_id << " units=" << totals.units
              << " pages=" << totals.pages << " events=" << totals.events << " raw=" << totals.raw;
    if (o.dispatch) {
      std::cout << " dispatched=" << totals.accepted + totals.duplicates
                << " accepted=" << totals.accepted << " duplicates=" << totals.duplicates;
    }
    std::cout << " retries=" << totals.retries << " failed_units=" << totals.failed_units
              << " seconds=" << seconds;
    if (stopped_by != 0) std::cout << " stopped_by_signal=" << stopped_by;
    std::cout << "\n";
  }
  if (stopped_by != 0) {
    // Dying of the signal, as asked, tells a calling shell that the user stopped it (an exit
    // status of 128 + N would make a loop go on to its next command).
    std::cout.flush();
    std::cerr.flush();
    ::signal(stopped_by, SIG_DFL);
    ::raise(stopped_by);
    throw CLI::RuntimeError(128 + stopped_by);
  }
  if (totals.failed_units > 0) throw CLI::RuntimeError(2);
}

}  // namespace

void add_fetch_command(CLI::App& app) {
  auto o = std::make_shared<FetchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "fetch",
      "Page through a resource's entity types with a connector plugin and print the pages.\n"
      "Exit status: 0 when every unit reached its last page, 2 when a unit failed, 1 on bad "
      "input (100 and up: the options themselves) or a plugin call past --call-timeout-ms; on "
      "SIGINT or SIGTERM it stops at a page boundary, prints the summary, then dies of the "
      "signal.");
  cmd->add_option("--plugin,-p", o->plugin, "plugin file (.so) or plugin id (e.g. github)")
      ->required();
  cmd->add_option("--plugin-dir", o->plugin_dirs, "directory to search for a plugin id");
  cmd->add_option("--config", o->config, "connector config as a JSON object")
      ->capture_default_str();
  cmd->add_option("--base-url", o->base_url, "provider API base URL (sets config.base_url)");
  cmd->add_option("--installation", o->installation,
                  "installation id used in delivery ids (from the connection when given)")
      ->capture_default_str();
  CLI::Option* resource_id = cmd->add_option("--resource-id", o->resource_id,
                                             "provider resource id (repo id, project id)");
  CLI::Option* resource_name = cmd->add_option(
      "--resource-name", o->resource_name, "provider resource name (e.g. owner/repo for GitHub)");
  cmd->add_option("--entity,-e", o->entities,
                  "entity type to fetch; repeatable (default: the plugin's defaults)");
  cmd->add_option("--token", o->token,
                  "access token (else $BACKHAUL_TOKEN, else from the gateway connection)");
  cmd->add_option("--gateway", o->gateway, "gateway base URL, e.g. http://127.0.0.1:8080/gateway");
  cmd->add_option("--gateway-api-key", o->gateway_api_key, "sent to the gateway as X-Api-Key");
  cmd->add_option("--connection", o->connection,
                  "gateway connection id: supplies token, installation, org and resources");
  cmd->add_flag("--all-resources", o->all_resources, "fetch every resource of the connection")
      ->excludes(resource_id)
      ->excludes(resource_name);
  cmd->add_option("--since", o->since, "only items since this time (ISO 8601 UTC or Unix ms)");
  cmd->add_option("--depth", o->depth_days, "only items of the last N days (7, 30, 90, ...)")
      ->check(CLI::Range(1, 36'500))
      ->excludes("--since");
  cmd->add_option("--cursor", o->cursor, "resume from this cursor instead of the first page");
  cmd->add_option("--max-pages", o->max_pages, "stop after N pages per unit (0 = no limit)")
      ->check(CLI::Range(0, 1'000'000'000));
  cmd->add_flag("--events", o->print_events, "print every event as a JSON line");
  cmd->add_flag("--quiet,-q", o->quiet, "print only the summary");
  cmd->add_flag("--dispatch", o->dispatch,
                "deliver every event to POST {gateway}/webhooks/{provider}");
  cmd->add_flag("--json", o->json_summary,
                "print the summary as one JSON object (the progress lines go to stderr)");
  // Bounded: the backoff doubles per retry (500 ms << n), which past 2^62 would overflow.
  cmd->add_option("--retries", o->retries,
                  "retries of a RETRYABLE or RATE_LIMITED page, or of a delivery (0-30)")
      ->check(CLI::Range(0, 30))
      ->capture_default_str();
  cmd->add_option("--max-wait-s", o->max_wait_s,
                  "give up on a unit when asked to wait longer than this (1-86400)")
      ->check(CLI::Range(1, 86'400))
      ->capture_default_str();
  cmd->add_option("--ca-file", o->ca_file, "PEM CA bundle to trust for https");
  cmd->add_flag("--insecure", o->insecure, "do not verify TLS certificates");
  CLI::Option* proxy =
      cmd->add_option("--proxy", o->proxy,
                      std::string("HTTP proxy of every request, http://host:port (credentials: "
                                  "user:password in $") +
                          kProxyCredentialsEnv + ", or in the url)");
  cmd->add_option("--no-proxy", o->no_proxy,
                  "with --proxy: hosts reached without it: a name (and its subdomains), an "
                  "address, or *")
      ->delimiter(',')
      ->needs(proxy);
  cmd->add_option("--call-timeout-ms", o->call_timeout_ms,
                  "end the command (status 1) when a call into the plugin (its load, create, a "
                  "fetch_page) has not returned within this")
      ->check(CLI::Range(1, 86'400'000))
      ->capture_default_str();
  cmd->add_option("--timeout-ms", o->timeout_ms,
                  "HTTP timeout per request, for a plugin that leaves it to the host (the bundled "
                  "ones take theirs from --config's timeout_ms)")
      ->check(CLI::Range(1, 3'600'000))
      ->capture_default_str();
  cmd->callback([o] { run_fetch(*o); });
}

}  // namespace backhaul::cli
