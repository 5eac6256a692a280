#include "tests/host/daemon/process_fixture.h"

#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include <signal.h>
#include <sys/wait.h>

namespace backhaul::daemon::testing {

namespace fs = std::filesystem;
using nlohmann::json;
using sandbox::testing::HttpResult;
using sandbox::testing::TestClient;

void ProcessTest::SetUp() {
  std::random_device random;
  dir_ = fs::temp_directory_path() / ("backhaul-process-" + std::to_string(random()));
  fs::create_directories(dir_);
}

void ProcessTest::TearDown() {
  daemon_.reset();
  sandbox_.reset();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

uint16_t ProcessTest::start_sandbox(const std::vector<std::string>& flags) {
  std::vector<std::string> args = {"--port", "0", "--port-file", (dir_ / "sandbox.port").string()};
  args.insert(args.end(), flags.begin(), flags.end());
  fs::remove(dir_ / "sandbox.port");
  sandbox_ = std::make_unique<ChildProcess>(BACKHAUL_SANDBOX_PATH, args, std::vector<std::string>{},
                                            dir_ / "sandbox.stderr");
  sandbox_port_ = sandbox_->wait_port(dir_ / "sandbox.port", std::chrono::seconds(30));
  return sandbox_port_;
}

std::string ProcessTest::sandbox_url() const {
  return "http://127.0.0.1:" + std::to_string(sandbox_port_);
}

json ProcessTest::daemon_config() const {
  const std::string base = sandbox_url();
  return {{"store", {{"path", (dir_ / "jobs.db").string()}}},
          {"plugins",
           {{"directories", {BACKHAUL_TEST_PLUGIN_DIR}},
            {"connectors",
             {{"github", {{"base_url", base + "/github"}}},
              {"vercel", {{"base_url", base + "/vercel"}}}}}}},
          {"gateway", {{"url", base + "/gateway"}}},
          {"admin",
           {{"port", 0}, {"token_env", kTokenEnv}, {"audit_log", (dir_ / "audit.log").string()}}},
          {"scheduler", {{"workers", 8}, {"heartbeat_ms", 500}, {"sweep_ms", 500}}},
          {"pipeline", {{"throttle_per_hour", 1e9}, {"throttle_burst", 1e9}}},
          {"shutdown", {{"grace_ms", 2000}}},
          {"logging", {{"level", "warn"}}}};
}

uint16_t ProcessTest::start_daemon(const json& config) {
  std::ofstream(dir_ / "config.json") << config.dump(2);
  return start_daemon();
}

namespace {

std::unique_ptr<ChildProcess> spawn_backhauld(const fs::path& config, const fs::path& port_file,
                                              const std::vector<std::string>& env,
                                              const fs::path& stderr_path) {
  fs::remove(port_file);
  return std::make_unique<ChildProcess>(
      BACKHAULD_PATH,
      std::vector<std::string>{"--config", config.string(), "--port-file", port_file.string()}, env,
      stderr_path);
}

}  // namespace

std::vector<std::string> ProcessTest::daemon_env() const {
  std::vector<std::string> env = daemon_env_;
  env.push_back(std::string(kTokenEnv) + "=" + kToken);
  return env;
}

uint16_t ProcessTest::start_daemon() {
  daemon_ = spawn_backhauld(dir_ / "config.json", dir_ / "daemon.port", daemon_env(),
                            dir_ / ("daemon-" + std::to_string(daemon_starts_++) + ".stderr"));
  admin_port_ = daemon_->wait_port(dir_ / "daemon.port", std::chrono::seconds(30));
  return admin_port_;
}

std::unique_ptr<ChildProcess> ProcessTest::launch_daemon(const std::string& name,
                                                         const json& config) {
  std::ofstream(dir_ / (name + ".json")) << config.dump(2);
  return spawn_backhauld(dir_ / (name + ".json"), dir_ / (name + ".port"), daemon_env(),
                         dir_ / (name + ".stderr"));
}

bool ProcessTest::stop_daemon() {
  if (!daemon_ || !daemon_->signal(SIGTERM)) return false;
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

HttpResult ProcessTest::api(const std::string& method, const std::string& target,
                            const std::string& body) {
  TestClient client(admin_port_);
  return client.request(method, target, {{"Authorization", std::string("Bearer ") + kToken}}, body);
}

int64_t ProcessTest::start_run(const std::string& connection, const std::string& provider,
                               const std::vector<std::string>& entity_types) {
  json body = {{"installationId", connection}, {"provider", provider}, {"depth", 30}};
  if (!entity_types.empty()) body["entityTypes"] = entity_types;
  const HttpResult started = api("POST", "/v1/runs", body.dump());
  if (started.status != 202) {
    ADD_FAILURE() << "POST /v1/runs " << body.dump() << ": " << started.status << " "
                  << started.body;
    return 0;
  }
  return started.json()["runId"].get<int64_t>();
}

json ProcessTest::get_run(int64_t run_id) {
  return api("GET", "/v1/runs/" + std::to_string(run_id)).json();
}

json ProcessTest::wait_run(int64_t run_id, const std::function<bool(const json&)>& done,
                           std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  json run;
  while (std::chrono::steady_clock::now() < deadline) {
    run = get_run(run_id);
    if (done(run)) return run;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "run " << run_id << ": condition not met within " << timeout.count()
                << " s: " << run.dump(2);
  return run;
}

bool ProcessTest::is_finished(const json& run) {
  const std::string status = run.value("status", "");
  if (status != "succeeded" && status != "failed" && status != "cancelled") return false;
  for (const json& unit : run.value("units", json::array())) {
    const std::string s = unit.value("status", "");
    if (s != "succeeded" && s != "dead" && s != "cancelled") return false;
  }
  return true;
}

json ProcessTest::wait_finished(int64_t run_id, std::chrono::seconds timeout) {
  return wait_run(run_id, is_finished, timeout);
}

json ProcessTest::sandbox_get(const std::string& target) {
  TestClient client(sandbox_port_);
  return client.get(target).json();
}

HttpResult ProcessTest::sandbox_post(const std::string& target, const std::string& body) {
  TestClient client(sandbox_port_);
  return client.post(target, body);
}

json ProcessTest::report(const std::string& installation) {
  return sandbox_get(installation.empty() ? "/_sandbox/report"
                                          : "/_sandbox/report?installation=" + installation);
}

json ProcessTest::resource_requests() { return sandbox_get("/_sandbox/requests")["by_resource"]; }

double ProcessTest::metric(const std::string& name) {
  TestClient client(admin_port_);
  std::istringstream lines(client.get("/metrics").body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  }
  return -1;
}

CommandResult ProcessTest::cli(std::vector<std::string> args, std::chrono::seconds timeout) {
  const size_t at = std::min<size_t>(2, args.size());
  args.insert(args.begin() + static_cast<std::ptrdiff_t>(at),
              {"--url", "http://127.0.0.1:" + std::to_string(admin_port_)});
  return run_command(BACKHAUL_CLI_PATH, args, {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken}, dir_,
                     timeout);
}

}  // namespace backhaul::daemon::testing
