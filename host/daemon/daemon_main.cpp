#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <Poco/Exception.h>

#include "core/common/errors.h"
#include "core/common/logging.h"
#include "core/common/watchdog.h"
#include "host/common/process.h"
#include "host/daemon/daemon.h"
#include "host/daemon/main.h"

namespace backhaul::daemon {
namespace {

// Stops and destroys the daemon. A handler learns of the stop at its next page boundary; one
// stuck in a call into a plugin never gets there, and stop() would wait for it forever, as it
// would for an API request stuck in one (a validate-config). So if jobs or API requests are still
// in a handler once the grace and then shutdown.abandon_ms have passed:
// - in isolation mode, this kills the plugin worker processes running calls. Those calls fail
//   (an attempt each) and their handlers get shutdown.abandon_ms (at least 1 s) more to return;
// - otherwise, or when they still have not, this logs them and ends the process with status 1,
//   as a crash would. Those jobs keep their leases until they expire, and the sweep of any host
//   takes them back (attempt counted). An ending the finisher had not written yet (a store failing
//   at that moment) is lost the same way.
// Once neither is, stop() is only writing and releasing, and is left to finish.
// Destroying the daemon then unloads the plugins, whose deinit() may not return either: that gets
// shutdown.abandon_ms of its own (at least 1 s), after which the process ends with status 1 too.
// Also after a start that failed, once plugins may be loaded. A second signal meanwhile ends the
// grace at once (an operator who will not wait): the jobs still in a handler are asked to stop at
// their next page boundary and released. Idempotent: `daemon` is null afterwards.
void stop_and_unload(std::unique_ptr<Daemon>& daemon, const sigset_t& signals,
                     spdlog::logger& log) {
  if (!daemon) return;
  const int64_t abandon_ms = daemon->config().shutdown.abandon_ms;
  const auto limit = std::chrono::milliseconds(daemon->config().shutdown.grace_ms + abandon_ms);
  {
    Watchdog stop(limit, [&] {
      const int64_t running = daemon->in_flight();
      const size_t requests = daemon->admin_requests_under_way();
      if (running == 0 && requests == 0) return;
      auto still = [&] {
        return daemon->in_flight() > 0 || daemon->admin_requests_under_way() > 0;
      };
      if (const size_t killed = daemon->interrupt_plugin_calls(); killed > 0) {
        // Isolation mode: the calls the handlers wait on fail now (an attempt each), and the
        // handlers return. They get abandon_ms (at least 1 s) more for that.
        log.warn(
            "stop: {} jobs and {} API requests still in a handler {} ms after the signal; killed "
            "the {} plugin worker processes running their calls",
            running, requests, limit.count(), killed);
        const auto until = std::chrono::steady_clock::now() +
                           std::chrono::milliseconds(std::max<int64_t>(abandon_ms, 1'000));
        while (still() && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (!still()) return;
      }
      log.error(
          "stop: {} jobs and {} API requests still in a handler {} ms after the signal (a call "
          "into a plugin that does not return?); exiting without them: the jobs' leases expire "
          "and the sweep takes them back",
          running, requests, limit.count());
      log.flush();
      std::_Exit(1);
    });
    host::SignalWatch again(signals, [&](int number) {
      log.info("signal {} again: not waiting out the grace; asking the jobs in flight to stop",
               number);
      daemon->hurry();
    });
    daemon->stop();
  }
  const auto unload_limit = std::chrono::milliseconds(std::max<int64_t>(abandon_ms, 1'000));
  Watchdog unload(unload_limit, [&] {
    log.error(
        "stop: unloading did not end within {} ms (shutdown.abandon_ms, at least 1 s): a "
        "plugin's deinit() that does not return? exiting",
        unload_limit.count());
    log.flush();
    std::_Exit(1);
  });
  daemon.reset();
}

// What start-up is doing, for the log lines about a signal: start_step(), or "starting" before
// start() has named a step or once it has returned.
const char* start_up_step(const Daemon& daemon) {
  const char* step = daemon.start_step();
  return *step != '\0' ? step : "starting";
}

// Starts the daemon. start() can be stuck in a plugin's init() or on a store that does not answer,
// so a termination signal meanwhile is taken on a thread of its own: it is logged, and unless
// start() returns within shutdown.abandon_ms (at least 1 s) of it, the process ends with status 1
// (a job claimed by then keeps its lease until it expires, as after a crash). Returns that
// signal's number, for main to stop the daemon at once, or 0 when none came.
int start_within_reach_of_signals(Daemon& daemon, const sigset_t& signals, spdlog::logger& log) {
  const auto limit =
      std::chrono::milliseconds(std::max<int64_t>(daemon.config().shutdown.abandon_ms, 1'000));
  std::optional<Watchdog> deadline;  // armed by the signal; destroyed (disarmed) after the watch
  host::SignalWatch watch(signals, [&](int number) {
    log.info("signal {} during start-up ({}): stopping once start-up ends", number,
             start_up_step(daemon));
    deadline.emplace(limit, [&daemon, &log, number, limit] {
      log.error(
          "signal {}: start-up did not end within {} ms of it (shutdown.abandon_ms, at least 1 s), "
          "still {}: a plugin's init() or a store that does not answer? exiting",
          number, limit.count(), start_up_step(daemon));
      log.flush();
      std::_Exit(1);
    });
  });
  daemon.start();
  return watch.stop();
}

}  // namespace

int main(int argc, char** argv) {
  if (!host::start_clean()) return 1;
  CLI::App app{"backhauld: the Backhaul host daemon (admin API, job scheduler, connector plugins)"};
  app.set_version_flag("--version", BACKHAUL_VERSION);
  std::string config_path;
  std::string port_file;
  bool check_only = false;
  app.add_option("--config", config_path, "JSON configuration file (schemas/config.schema.json)")
      ->required();
  app.add_option("--port-file", port_file,
                 "write the admin API's port here once listening (with admin.port 0)");
  app.add_flag("--check-config", check_only, "validate the configuration and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }

  // First, so a signal from here on is caught (taken by SignalWatch or wait_for_termination()).
  // Not for a check, which a signal ends as it comes: nothing would take it, and a plugin's init()
  // that never returns would hold the check.
  sigset_t signals;
  sigemptyset(&signals);
  try {
    if (!check_only) signals = host::catch_termination_signals();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cannot start: %s\n", e.what());
    return 1;
  }
  DaemonConfig config;
  try {
    config = load_config(config_path, process_env());
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // Whatever else reading the configuration throws is its problem too: exit 2 saying so, not a
    // terminate() (SIGABRT) that names only the exception's type.
    std::fprintf(stderr, "config: %s: %s\n", config_path.c_str(), e.what());
    return 2;
  }
  logging::configure(
      config.logging.format == "json" ? logging::Format::kJson : logging::Format::kText,
      config.logging.level);
  if (check_only) {
    PluginCheck check;
    try {
      check = check_plugins(config);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cannot check the plugins: %s\n", e.what());
      return 1;
    }
    for (const std::string& warning : check.warnings) {
      std::fprintf(stderr, "warning: %s\n", warning.c_str());
    }
    for (const std::string& error : check.errors) std::fprintf(stderr, "%s\n", error.c_str());
    if (!check.errors.empty()) return 2;
    std::printf("config: %s is valid\n", config_path.c_str());
    return 0;
  }
  const auto log = logging::get("daemon");
  std::unique_ptr<Daemon> daemon;
  int status = 0;
  try {
    daemon = std::make_unique<Daemon>(std::move(config));
    int signal_number = start_within_reach_of_signals(*daemon, signals, *log);
    if (signal_number == 0) {
      if (!port_file.empty()) host::write_port_file(port_file, daemon->port());
      signal_number = host::wait_for_termination(signals);
    }
    log->info("signal {}: stopping", signal_number);
    stop_and_unload(daemon, signals, *log);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    status = 2;
  } catch (const Poco::Exception& e) {
    log->error("cannot start: {}", e.displayText());
    status = 1;
  } catch (const std::exception& e) {
    log->error("cannot start: {}", e.what());
    status = 1;
  }
  stop_and_unload(daemon, signals, *log);  // after a failed start: the plugins it loaded
  return status;
}

}  // namespace backhaul::daemon
