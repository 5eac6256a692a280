// backhauld as a real process: a bad config exits 2 naming the field, SIGTERM drains and exits 0.
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/jobs/job_store.h"
#include "tests/host/daemon/child_process.h"
#include "tests/host/sandbox/test_client.h"
#include <signal.h>
#include <sys/wait.h>

namespace backhaul::daemon::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class DaemonProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device random;
    dir_ = fs::temp_directory_path() / ("backhauld-process-" + std::to_string(random()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    daemon_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  void write_config(const json& config) { std::ofstream(dir_ / "config.json") << config.dump(); }

  json good_config() const {
    return {{"plugins", {{"directories", {BACKHAUL_TEST_PLUGIN_DIR}}}},
            {"gateway", {{"url", "http://127.0.0.1:9/gateway"}}},
            {"admin", {{"port", 0}, {"token_env", "BACKHAUL_PROCESS_TEST_TOKEN"}}},
            {"shutdown", {{"grace_ms", 2000}}}};
  }

  void spawn(const std::vector<std::string>& env) {
    daemon_ = std::make_unique<ChildProcess>(
        BACKHAULD_PATH,
        std::vector<std::string>{"--config", (dir_ / "config.json").string(), "--port-file",
                                 (dir_ / "port").string()},
        env, dir_ / "stderr");
  }

  fs::path dir_;
  std::unique_ptr<ChildProcess> daemon_;
};

TEST_F(DaemonProcessTest, BadConfigExits2NamingTheField) {
  json config = good_config();
  config["scheduler"] = {{"workers", "eight"}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=t"});
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(daemon_->stderr_text().find("config: scheduler.workers: must be an integer between 1 "
                                        "and 1024 (got \"eight\")"),
            std::string::npos)
      << daemon_->stderr_text();
}

TEST_F(DaemonProcessTest, MissingTokenVariableExits2NamingIt) {
  write_config(good_config());
  spawn({});
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(daemon_->stderr_text().find("admin.token_env: environment variable "
                                        "BACKHAUL_PROCESS_TEST_TOKEN is not set"),
            std::string::npos)
      << daemon_->stderr_text();
}

TEST_F(DaemonProcessTest, ServesThenSigtermStopsWithExit0) {
  write_config(good_config());
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
  const uint16_t port = daemon_->wait_port(dir_ / "port", std::chrono::seconds(30));
  ASSERT_NE(port, 0) << daemon_->stderr_text();
  {
    sandbox::testing::TestClient client(port);
    EXPECT_EQ(client.get("/health/live").status, 200);
    EXPECT_EQ(client.get("/v1/plugins", {{"Authorization", "Bearer process-token"}}).status, 200);
    EXPECT_EQ(client.get("/v1/plugins").status, 401);
  }
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "; " << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();
  EXPECT_NE(daemon_->stderr_text().find("signal 15: stopping"), std::string::npos)
      << daemon_->stderr_text();
  EXPECT_NE(daemon_->stderr_text().find("drained"), std::string::npos) << daemon_->stderr_text();
}

// F6 with work in flight: SIGTERM mid-run exits 0, leaves nothing running, and releases the
// interrupted units without counting an attempt; a restarted daemon finishes the run from the
// checkpoints and the gateway receives every event.
TEST_F(DaemonProcessTest, SigtermMidRunReleasesUnitsAndARestartFinishesTheRun) {
  ChildProcess sandbox(BACKHAUL_SANDBOX_PATH,
                       {"--port", "0", "--port-file", (dir_ / "sandbox.port").string(), "--repos",
                        "3", "--items", "200", "--max-per-page", "10", "--slow-ms", "20"},
                       {}, dir_ / "sandbox.stderr");
  const uint16_t sandbox_port = sandbox.wait_port(dir_ / "sandbox.port", std::chrono::seconds(30));
  ASSERT_NE(sandbox_port, 0) << sandbox.stderr_text();
  const std::string base = "http://127.0.0.1:" + std::to_string(sandbox_port);
  json config = good_config();
  config["store"] = {{"path", (dir_ / "jobs.db").string()}};
  config["plugins"]["connectors"] = {{"github", {{"base_url", base + "/github"}}}};
  config["gateway"]["url"] = base + "/gateway";
  config["scheduler"] = {{"workers", 4}, {"heartbeat_ms", 500}};
  config["shutdown"] = {{"grace_ms", 100}};
  config["pipeline"] = {{"throttle_burst", 100000}};  // 180 pages: stay clear of the throttle
  write_config(config);
  const std::vector<std::string> env = {"BACKHAUL_PROCESS_TEST_TOKEN=process-token"};
  const sandbox::testing::Headers auth = {{"Authorization", "Bearer process-token"}};

  spawn(env);
  uint16_t port = daemon_->wait_port(dir_ / "port", std::chrono::seconds(30));
  ASSERT_NE(port, 0) << daemon_->stderr_text();
  int64_t run_id = 0;
  {
    sandbox::testing::TestClient client(port);
    const auto started = client.post(
        "/v1/runs", R"({"installationId":"gh-inst-1","provider":"github","depth":30})", auth);
    ASSERT_EQ(started.status, 202) << started.body;
    run_id = started.json()["runId"];
    // Wait until units are running and have made progress (bounded polling, no fixed sleep).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool progressing = false;
    while (!progressing && std::chrono::steady_clock::now() < deadline) {
      const json run = client.get("/v1/runs/" + std::to_string(run_id), auth).json();
      progressing = run.value("pages", 0) >= 3 && run.value("unitsDone", 0) == 0;
      if (run.value("unitsDone", 0) > 0) break;
      if (!progressing) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_TRUE(progressing) << "the run finished a unit before SIGTERM; make the data larger";
  }
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "; " << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();

  {
    auto store = jobs::open_sqlite_store((dir_ / "jobs.db").string());
    int64_t running = 0;
    for (const auto& [key, count] : store->counts()) {
      if (key.second == jobs::JobStatus::kRunning) running += count;
    }
    EXPECT_EQ(running, 0);
    jobs::JobQuery query;
    query.kind = "backfill.entity";
    query.limit = 500;
    int released_jobs = 0;
    for (const jobs::Job& job : store->list(query).jobs) {
      int counted = 0;
      bool released = false;
      for (const jobs::Attempt& attempt : store->attempts(job.id)) {
        if (attempt.outcome == "released") {
          released = true;
        } else if (attempt.outcome != "deferred") {
          ++counted;
        }
      }
      if (!released) continue;
      ++released_jobs;
      EXPECT_EQ(job.attempts, counted) << "job " << job.id << ": a release counted an attempt";
      EXPECT_EQ(job.status, jobs::JobStatus::kQueued) << "job " << job.id;
    }
    EXPECT_GT(released_jobs, 0) << daemon_->stderr_text();
  }

  fs::remove(dir_ / "port");
  spawn(env);  // the same store: the run resumes
  port = daemon_->wait_port(dir_ / "port", std::chrono::seconds(30));
  ASSERT_NE(port, 0) << daemon_->stderr_text();
  sandbox::testing::TestClient client(port);
  json run;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    run = client.get("/v1/runs/" + std::to_string(run_id), auth).json();
    const std::string run_status = run.value("status", "");
    if (run_status == "succeeded" || run_status == "failed" || run_status == "cancelled") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  sandbox::testing::TestClient sandbox_client(sandbox_port);
  const json report = sandbox_client.get("/_sandbox/report?installation=inst-1").json();
  const json& github = report["gateway"]["by_provider"]["github"];
  EXPECT_EQ(github["missing"], 0) << report.dump(2);
  EXPECT_EQ(github["unexpected"], 0) << report.dump(2);
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  EXPECT_NE(daemon_->wait_exit(std::chrono::seconds(30)), -1);
}

}  // namespace
}  // namespace backhaul::daemon::testing
