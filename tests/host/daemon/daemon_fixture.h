// A whole daemon in-process on 127.0.0.1 (admin port 0) with a temp SQLite store, a fake clock,
// and a keep-alive client; and helpers to put jobs into given states through the JobStore API.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/clock.h"
#include "core/jobs/job_store.h"
#include "host/daemon/config.h"
#include "host/daemon/daemon.h"
#include "tests/host/sandbox/test_client.h"

namespace backhaul::daemon::testing {

using sandbox::testing::Headers;
using sandbox::testing::HttpResult;

inline constexpr const char* kToken = "test-admin-token-0123456789";

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Starts the daemon with the base config edited by `edit` (plugins loaded by default).
  void start(const std::function<void(nlohmann::json&)>& edit = {});

  HttpResult call(const std::string& method, const std::string& target,
                  const std::string& body = "", const Headers& extra = {});
  HttpResult call_without_token(const std::string& method, const std::string& target);

  jobs::JobStore& store() { return daemon_->store(); }
  int64_t now() const { return clock_.now_ms(); }

  // A queued job of `kind` under `key`.
  jobs::JobId enqueue(const std::string& kind, const std::string& key = "inst-1",
                      int max_attempts = 3);
  // Claims the job `id` (it must be the only queued one of its kind); returns the lease token.
  std::string claim(const std::string& kind);
  // A dead job with a pending dead letter; returns the letter id.
  int64_t make_dead_letter(const std::string& kind, const std::string& key,
                           const std::string& error);
  std::vector<nlohmann::json> audit_lines() const;

  std::filesystem::path dir_;
  FakeClock clock_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<sandbox::testing::TestClient> client_;
};

}  // namespace backhaul::daemon::testing
