// backhauld as a real process: a bad config exits 2 naming the field, SIGTERM drains and exits 0.
#include <filesystem>
#include <fstream>
#include <random>

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

}  // namespace
}  // namespace backhaul::daemon::testing
