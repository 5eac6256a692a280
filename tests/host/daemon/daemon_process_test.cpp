// backhauld as a real process: a bad config exits 2 naming the field, SIGTERM drains and exits 0.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/host/sandbox/test_client.h"
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

extern char** environ;

namespace backhaul::daemon {
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
    if (pid_ > 0) {  // never leave a daemon behind; killed by its PID only
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
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

  // Starts backhauld with `env` added to this process's environment; stderr goes to a file.
  void spawn(const std::vector<std::string>& env) {
    std::vector<std::string> args = {BACKHAULD_PATH, "--config", (dir_ / "config.json").string(),
                                     "--port-file", (dir_ / "port").string()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_storage(env);
    for (char** e = environ; *e; ++e) env_storage.emplace_back(*e);
    std::vector<char*> envp;
    for (auto& e : env_storage) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string err = (dir_ / "stderr").string();
    posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int rc = posix_spawn(&pid_, BACKHAULD_PATH, &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ASSERT_EQ(rc, 0);
  }

  // Waits for the process to exit (bounded); returns its wait status, -1 when it did not.
  int wait_exit(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  // Polls for the port file the daemon writes once it listens (readiness, not timing).
  uint16_t wait_port(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream in(dir_ / "port");
      int port = 0;
      if (in >> port && port > 0) return static_cast<uint16_t>(port);
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ADD_FAILURE() << "backhauld exited early: " << stderr_text();
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "no port file; stderr: " << stderr_text();
    return 0;
  }

  std::string stderr_text() const {
    std::ifstream in(dir_ / "stderr");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  fs::path dir_;
  pid_t pid_ = -1;
};

TEST_F(DaemonProcessTest, BadConfigExits2NamingTheField) {
  json config = good_config();
  config["scheduler"] = {{"workers", "eight"}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=t"});
  const int status = wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(stderr_text().find("config: scheduler.workers: must be an integer between 1 and 1024 "
                               "(got \"eight\")"),
            std::string::npos)
      << stderr_text();
}

TEST_F(DaemonProcessTest, MissingTokenVariableExits2NamingIt) {
  write_config(good_config());
  spawn({});
  const int status = wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(stderr_text().find("admin.token_env: environment variable "
                               "BACKHAUL_PROCESS_TEST_TOKEN is not set"),
            std::string::npos)
      << stderr_text();
}

TEST_F(DaemonProcessTest, ServesThenSigtermStopsWithExit0) {
  write_config(good_config());
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
  const uint16_t port = wait_port(std::chrono::seconds(30));
  ASSERT_NE(port, 0);
  {
    sandbox::testing::TestClient client(port);
    EXPECT_EQ(client.get("/health/live").status, 200);
    EXPECT_EQ(client.get("/v1/plugins", {{"Authorization", "Bearer process-token"}}).status, 200);
    EXPECT_EQ(client.get("/v1/plugins").status, 401);
  }
  ASSERT_EQ(kill(pid_, SIGTERM), 0);
  const int status = wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "; stderr: " << stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << stderr_text();
  EXPECT_NE(stderr_text().find("signal 15: stopping"), std::string::npos) << stderr_text();
}

}  // namespace
}  // namespace backhaul::daemon
