// Crash safety end to end (SPEC "what done looks like", issue 5): backhauld is killed with
// SIGKILL at random points of a multi-thousand-event backfill, several times, and restarted on the
// same store each time. The gateway must end with every expected delivery id, nothing unexpected,
// every unit completed, and no more than one page fetched again per unit interrupted by a kill.
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/host/daemon/child_process.h"
#include "tests/host/sandbox/test_client.h"
#include <signal.h>
#include <sys/wait.h>

namespace backhaul::daemon::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kKills = 5;
constexpr int kPerInstallation = 5;  // entity caps: at most this many units run at once

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device random;
    seed_ = random();
    dir_ = fs::temp_directory_path() / ("backhauld-crash-" + std::to_string(seed_));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    daemon_.reset();
    sandbox_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  uint16_t start_daemon() {
    fs::remove(dir_ / "port");
    daemon_ = std::make_unique<ChildProcess>(
        BACKHAULD_PATH,
        std::vector<std::string>{"--config", (dir_ / "config.json").string(), "--port-file",
                                 (dir_ / "port").string()},
        std::vector<std::string>{"BACKHAUL_CRASH_TEST_TOKEN=crash-token"},
        dir_ / ("daemon-" + std::to_string(starts_++) + ".stderr"));
    return daemon_->wait_port(dir_ / "port", std::chrono::seconds(30));
  }

  json get_run(sandbox::testing::TestClient& client, int64_t run_id) {
    return client.get("/v1/runs/" + std::to_string(run_id), auth_).json();
  }

  uint32_t seed_ = 0;
  fs::path dir_;
  int starts_ = 0;
  std::unique_ptr<ChildProcess> sandbox_;
  std::unique_ptr<ChildProcess> daemon_;
  const sandbox::testing::Headers auth_ = {{"Authorization", "Bearer crash-token"}};
};

TEST_F(CrashTest, SigkillAtRandomPointsLosesNothingAndRefetchesAtMostOnePagePerUnit) {
  std::mt19937 rng(seed_);
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // 3 repositories x 3 entity types x 1000 items in pages of 20: 9000 events, 450 pages.
  sandbox_ = std::make_unique<ChildProcess>(
      BACKHAUL_SANDBOX_PATH,
      std::vector<std::string>{"--port", "0", "--port-file", (dir_ / "sandbox.port").string(),
                               "--repos", "3", "--projects", "0", "--items", "1000",
                               "--max-per-page", "20", "--slow-ms", "5"},
      std::vector<std::string>{}, dir_ / "sandbox.stderr");
  const uint16_t sandbox_port =
      sandbox_->wait_port(dir_ / "sandbox.port", std::chrono::seconds(30));
  ASSERT_NE(sandbox_port, 0) << sandbox_->stderr_text();
  const std::string base = "http://127.0.0.1:" + std::to_string(sandbox_port);

  json config = {
      {"store", {{"path", (dir_ / "jobs.db").string()}}},
      {"plugins",
       {{"directories", {BACKHAUL_TEST_PLUGIN_DIR}},
        {"connectors", {{"github", {{"base_url", base + "/github"}}}}}}},
      {"gateway", {{"url", base + "/gateway"}}},
      {"admin", {{"port", 0}, {"token_env", "BACKHAUL_CRASH_TEST_TOKEN"}}},
      // A stable owner: a restarted daemon takes back at once what its killed self held.
      {"scheduler", {{"workers", 8}, {"owner", "crash-test-host"}, {"recover_own_leases", true}}},
      {"pipeline",
       {{"throttle_burst", 100000},
        {"entity_caps", {{"per_installation", kPerInstallation}, {"global", 30}}}}},
      {"logging", {{"level", "warn"}}}};
  std::ofstream(dir_ / "config.json") << config.dump();

  uint16_t port = start_daemon();
  ASSERT_NE(port, 0) << daemon_->stderr_text();
  int64_t run_id = 0;
  {
    sandbox::testing::TestClient client(port);
    auto started = client.post(
        "/v1/runs", R"({"installationId":"gh-inst-1","provider":"github","depth":30})", auth_);
    ASSERT_EQ(started.status, 202) << started.body;
    run_id = started.json()["runId"];
  }

  int kills = 0;
  int64_t last_pages = 0;
  for (int k = 0; k < kKills; ++k) {
    // Kill after a random amount of further progress (0 to 60 pages), before the run ends.
    const int64_t target = last_pages + std::uniform_int_distribution<int>(0, 60)(rng);
    sandbox::testing::TestClient client(port);
    json run;
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      run = get_run(client, run_id);
      if (run.value("status", "") != "queued" && run.value("status", "") != "running") break;
      if (run.value("pages", int64_t{0}) >= target) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const std::string status = run.value("status", "");
    if (status != "queued" && status != "running") break;  // finished before this kill
    last_pages = run.value("pages", int64_t{0});
    ASSERT_TRUE(daemon_->signal(SIGKILL));
    const int exit_status = daemon_->wait_exit(std::chrono::seconds(30));
    ASSERT_TRUE(WIFSIGNALED(exit_status)) << exit_status;
    ++kills;
    port = start_daemon();
    ASSERT_NE(port, 0) << daemon_->stderr_text();
  }
  EXPECT_GE(kills, 2) << "the run ended before most kills: make the data larger";

  sandbox::testing::TestClient client(port);
  json run;
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (Clock::now() < deadline) {
    run = get_run(client, run_id);
    const std::string status = run.value("status", "");
    if (status == "succeeded" || status == "failed" || status == "cancelled") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  EXPECT_EQ(run["unitsTotal"], 9);
  EXPECT_EQ(run["unitsDone"], 9);
  EXPECT_EQ(run["unitsFailed"], 0);

  sandbox::testing::TestClient sandbox_client(sandbox_port);
  const json report = sandbox_client.get("/_sandbox/report?installation=inst-1").json();
  const json& github = report["gateway"]["by_provider"]["github"];
  EXPECT_EQ(github["missing"], 0) << report.dump(2);
  EXPECT_EQ(github["unexpected"], 0) << report.dump(2);
  EXPECT_EQ(github["unique"], github["expected"]);
  EXPECT_EQ(run["eventsDispatched"], github["unique"]) << "the run's counts are the real ones";
  // Every page of the run once, plus at most one page again for each unit a kill interrupted (at
  // most kPerInstallation run at once), plus one scope check per orchestrator attempt.
  const int64_t pages = run.value("pages", int64_t{0});
  const int64_t requests = report["provider_requests"].value("github", int64_t{0});
  EXPECT_GE(requests, pages);
  EXPECT_LE(requests, pages + kills * kPerInstallation + (1 + kills))
      << "pages " << pages << ", kills " << kills;

  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int exit_status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(exit_status)) << exit_status;
  EXPECT_EQ(WEXITSTATUS(exit_status), 0) << daemon_->stderr_text();
}

}  // namespace
}  // namespace backhaul::daemon::testing
