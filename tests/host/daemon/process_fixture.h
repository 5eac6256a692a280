// backhaul-sandbox and backhauld as child processes on 127.0.0.1, for tests that drive whole
// backfills from outside: a temp directory, the sandbox started with the test's flags, the daemon
// started from a config JSON the test writes (SQLite store in the temp directory, admin token from
// an environment variable), and helpers for the admin API, the sandbox's control API, /metrics and
// the `backhaul` CLI. Every wait polls with a deadline; none is a timing assertion.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/host/daemon/child_process.h"
#include "tests/host/sandbox/test_client.h"

namespace backhaul::daemon::testing {

class ProcessTest : public ::testing::Test {
 protected:
  static constexpr const char* kTokenEnv = "BACKHAUL_PROCESS_FIXTURE_TOKEN";
  static constexpr const char* kToken = "process-fixture-token";

  void SetUp() override;     // a fresh temp directory
  void TearDown() override;  // kills what is still running (by PID), removes the directory

  // Starts backhaul-sandbox with `flags` (the port flags are added); returns its port, 0 when it
  // did not come up (its stderr is in sandbox_->stderr_text()).
  uint16_t start_sandbox(const std::vector<std::string>& flags);
  std::string sandbox_url() const;

  // A config for a daemon against the sandbox: store dir_/jobs.db, both connectors, the sandbox's
  // gateway, admin port 0 with the token from kTokenEnv, the throttle out of the way, short
  // heartbeats, logging at warn. Tests edit it before start_daemon().
  nlohmann::json daemon_config() const;
  // Writes `config` to dir_/config.json and starts backhauld with it; returns the admin port, 0
  // when it did not come up. Called again (after the previous one exited), it restarts the
  // daemon on the same store.
  uint16_t start_daemon(const nlohmann::json& config);
  uint16_t start_daemon();  // with dir_/config.json as it is
  // Starts one more backhauld, named `name`, with `config` (written to dir_/<name>.json): for
  // tests that run several daemons on one store, as several hosts do. It writes its admin port to
  // dir_/<name>.port (wait_port) and its stderr to dir_/<name>.stderr. The api() helpers talk to
  // admin_port_ only.
  std::unique_ptr<ChildProcess> launch_daemon(const std::string& name,
                                              const nlohmann::json& config);
  // SIGTERM, then waits for the exit; true when it exited with status 0.
  bool stop_daemon();

  // The admin API of the daemon on admin_port_, with the bearer token.
  sandbox::testing::HttpResult api(const std::string& method, const std::string& target,
                                   const std::string& body = "");
  // POST /v1/runs for `connection` with depth 30 (and `entity_types` when not empty); returns the
  // run id, or 0 after a test failure.
  int64_t start_run(const std::string& connection, const std::string& provider,
                    const std::vector<std::string>& entity_types = {});
  nlohmann::json get_run(int64_t run_id);
  // Polls GET /v1/runs/{id} until `done(run)` holds or `timeout` passes (a test failure); returns
  // the last view.
  nlohmann::json wait_run(int64_t run_id, const std::function<bool(const nlohmann::json&)>& done,
                          std::chrono::seconds timeout = std::chrono::seconds(30));
  // Until the run is succeeded, failed or cancelled and none of its units is still running.
  nlohmann::json wait_finished(int64_t run_id,
                               std::chrono::seconds timeout = std::chrono::seconds(30));
  static bool is_finished(const nlohmann::json& run);

  // GET/POST on the sandbox.
  nlohmann::json sandbox_get(const std::string& target);
  sandbox::testing::HttpResult sandbox_post(const std::string& target, const std::string& body);
  // GET /_sandbox/report, for one installation ("inst-1") or all ("").
  nlohmann::json report(const std::string& installation = "");
  // GET /_sandbox/requests: admitted provider requests by resource and list.
  nlohmann::json resource_requests();

  // The value of the unlabelled series `name` in /metrics; -1 when absent.
  double metric(const std::string& name);

  // Runs `backhaul` with `args` (the daemon's --url is added after the subcommand pair) and the
  // token in BACKHAUL_ADMIN_TOKEN.
  CommandResult cli(std::vector<std::string> args,
                    std::chrono::seconds timeout = std::chrono::seconds(60));

  std::filesystem::path dir_;
  std::unique_ptr<ChildProcess> sandbox_;
  std::unique_ptr<ChildProcess> daemon_;
  uint16_t sandbox_port_ = 0;
  uint16_t admin_port_ = 0;  // tests running the daemon in-process set it themselves
  int daemon_starts_ = 0;
  std::vector<std::string> daemon_env_;         // NAME=value added to the daemon's environment
  std::vector<std::string> daemon_env() const;  // daemon_env_ and the admin token
};

}  // namespace backhaul::daemon::testing
