// backhauld as a real process: a bad config exits 2 naming the field, SIGTERM drains and exits 0.
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/proc.h"
#include "core/common/unique_fd.h"
#include "core/jobs/job_store.h"
#include "tests/host/daemon/process_fixture.h"
#include "tests/host/sandbox/test_client.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace backhaul::daemon::testing {
namespace {

using nlohmann::json;

// A TCP connection to 127.0.0.1:`port`; an empty descriptor, errno saying why, when there is none.
UniqueFd connect_loopback(uint16_t port) {
  UniqueFd client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(port);
  if (::connect(client.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    const int saved = errno;
    client = UniqueFd();
    errno = saved;
  }
  return client;
}

// A socket listening on 127.0.0.1 at a port of the kernel's choosing that nobody answers on;
// closed at the end of the scope.
struct Listener {
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(fd, 4) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      throw std::runtime_error("cannot listen on 127.0.0.1");
    }
    port = ntohs(address.sin_port);
  }
  ~Listener() { ::close(fd); }
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;
  int fd = -1;
  uint16_t port = 0;
};

class DaemonProcessTest : public ProcessTest {
 protected:
  void write_config(const json& config) { std::ofstream(dir_ / "config.json") << config.dump(); }

  json good_config() const {
    return {{"plugins", {{"directories", {BACKHAUL_TEST_PLUGIN_DIR}}}},
            {"gateway", {{"url", "http://127.0.0.1:9/gateway"}}},
            {"admin", {{"port", 0}, {"token_env", "BACKHAUL_PROCESS_TEST_TOKEN"}}},
            {"shutdown", {{"grace_ms", 2000}}}};
  }

  // SIGTERM, then the daemon exits with status 1 within 10 s.
  // A run against a provider that takes 20 s per answer, with shutdown.grace_ms 100 and
  // abandon_ms 400, and the plugins' calls in worker processes when `isolated`: returns once a
  // handler is inside a plugin call, where no drain reaches it.
  void start_a_run_stuck_in_plugin_calls(bool isolated) {
    ASSERT_NE(start_sandbox({"--repos", "1", "--items", "20", "--slow-ms", "20000"}), 0)
        << sandbox_->stderr_text();
    json config = daemon_config();
    if (isolated) config["plugins"]["isolation"] = {{"mode", "process"}};
    config["shutdown"] = {{"grace_ms", 100}, {"abandon_ms", 400}};
    ASSERT_NE(start_daemon(config), 0) << daemon_->stderr_text();
    ASSERT_NE(start_run("gh-inst-1", "github"), 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (metric("backhaul_scheduler_in_flight") < 1 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_GE(metric("backhaul_scheduler_in_flight"), 1) << daemon_->stderr_text();
  }

  // Jobs left running (under a lease) in the stopped daemon's store.
  int64_t running_jobs() const {
    auto store = jobs::open_sqlite_store((dir_ / "jobs.db").string());
    int64_t running = 0;
    for (const auto& [key, count] : store->counts()) {
      if (key.second == jobs::JobStatus::kRunning) running += count;
    }
    return running;
  }

  void expect_exit_1_within_10s_of_sigterm() {
    const auto signalled = std::chrono::steady_clock::now();
    ASSERT_TRUE(daemon_->signal(SIGTERM));
    const int status = daemon_->wait_exit(std::chrono::seconds(60));
    const auto took = std::chrono::steady_clock::now() - signalled;
    ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << daemon_->stderr_text();
    EXPECT_EQ(WEXITSTATUS(status), 1) << daemon_->stderr_text();
    EXPECT_LT(took, std::chrono::seconds(10));
  }

  // Spawns backhauld with only the init_waits plugin, whose init() waits `init_wait_ms` (for
  // ever when empty), and returns once start-up is in that init() (in a worker process when
  // `isolated`): a file the plugin creates there, polled for at most 30 s (readiness, not timing).
  void spawn_into_a_waiting_init(int64_t abandon_ms, const std::string& init_wait_ms,
                                 bool isolated = false) {
    json config = good_config();
    if (isolated) config["plugins"]["isolation"] = {{"mode", "process"}};
    config["plugins"]["directories"] = {INIT_WAITS_PLUGIN_DIR};
    config["shutdown"] = {{"grace_ms", 100}, {"abandon_ms", abandon_ms}};
    write_config(config);
    const auto marker = dir_ / "in-init";
    std::vector<std::string> env = {"BACKHAUL_PROCESS_TEST_TOKEN=process-token",
                                    "MISBEHAVING_INIT_MARKER=" + marker.string()};
    if (!init_wait_ms.empty()) env.push_back("MISBEHAVING_INIT_WAIT_MS=" + init_wait_ms);
    spawn(env);
    for (int i = 0; i < 3000 && !std::filesystem::exists(marker); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(std::filesystem::exists(marker)) << daemon_->stderr_text();
  }

  // Starts the sandbox (3 repositories of `items` items each, 10 per page, `slow_ms` per answer),
  // the daemon with 4 workers and `overrides` merged into daemon_config(), and a GitHub run;
  // returns the run's id once its units have made progress and none has finished (bounded polling,
  // no fixed sleep), or 0 after reporting why not.
  int64_t start_a_run_in_progress(const std::string& items, const std::string& slow_ms,
                                  const json& overrides) {
    if (start_sandbox({"--repos", "3", "--items", items, "--max-per-page", "10", "--slow-ms",
                       slow_ms}) == 0) {
      ADD_FAILURE() << sandbox_->stderr_text();
      return 0;
    }
    json config = daemon_config();  // after the sandbox: it names the sandbox's port
    config["scheduler"] = {{"workers", 4}, {"heartbeat_ms", 500}};
    config.merge_patch(overrides);
    if (start_daemon(config) == 0) {
      ADD_FAILURE() << daemon_->stderr_text();
      return 0;
    }
    const int64_t run_id = start_run("gh-inst-1", "github");
    if (run_id == 0) return 0;
    const json progressing = wait_run(run_id, [](const json& run) {
      return run.value("unitsDone", 0) > 0 || run.value("pages", 0) >= 3;
    });
    if (progressing["unitsDone"] != 0) {
      ADD_FAILURE() << "the run finished a unit before SIGTERM; make the data larger";
      return 0;
    }
    return run_id;
  }

  // Of the store of the daemon that just stopped: checks that no job is still running and that
  // each released unit is queued with no attempt counted for its release; returns how many units
  // were released.
  int released_units_of_a_stopped_daemon() {
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
    return released_jobs;
  }

  // An isolated daemon (mode process, and `isolation`) against the sandbox, with the fake plugin
  // too, configured with `fake`; a test failure when either does not start.
  void start_isolated_with_fake(const json& fake, json isolation) {
    isolation["mode"] = "process";
    start_with_fake(fake, {{"plugins", {{"isolation", std::move(isolation)}}}});
  }

  // A daemon against the sandbox with the fake plugin too, configured with `fake`, and the
  // config's objects replaced by those of `overrides` (one level down); a test failure when
  // either does not start.
  void start_with_fake(const json& fake, const json& overrides = json::object()) {
    ASSERT_NE(start_sandbox({"--repos", "1", "--items", "20"}), 0) << sandbox_->stderr_text();
    const std::filesystem::path fake_dir = dir_ / "fake";
    std::filesystem::create_directories(fake_dir);
    std::filesystem::copy_file(FAKE_PLUGIN_PATH, fake_dir / "fake.so");
    json config = daemon_config();
    config["plugins"]["directories"].push_back(fake_dir.string());
    config["plugins"]["connectors"]["fake"] = fake;
    for (const auto& [section, fields] : overrides.items()) {
      for (const auto& [name, value] : fields.items()) config[section][name] = value;
    }
    ASSERT_NE(start_daemon(config), 0) << daemon_->stderr_text();
  }

  // A daemon (plugins in-process, logging at info, `shutdown`) with the fake plugin, and a
  // POST /v1/plugins/fake/validate-config on a thread of its own, held inside the plugin while the
  // file held_ exists. Returns once the request is inside (readiness, at most 30 s).
  void hold_an_api_request_inside_the_plugin(const json& shutdown) {
    start_with_fake(json::object(), {{"shutdown", shutdown}, {"logging", {{"level", "info"}}}});
    if (HasFatalFailure()) return;
    held_ = dir_ / "held";
    std::ofstream(held_) << "held";
    const json body = {{"config", {{"wait_in_validate_if", held_.string()}}}};
    answer_ = std::async(std::launch::async, [this, body] {
      try {
        const sandbox::testing::HttpResult got =
            api("POST", "/v1/plugins/fake/validate-config", body.dump());
        return std::to_string(got.status) + " " + got.body;
      } catch (const std::exception& e) {
        return std::string("no answer: ") + e.what();
      }
    });
    const std::filesystem::path entered = held_.string() + ".entered";
    for (int i = 0; i < 3000 && !std::filesystem::exists(entered); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_TRUE(std::filesystem::exists(entered)) << daemon_->stderr_text();
  }

  // Polls the daemon's log for `line` for at most 30 s (readiness, not timing).
  bool wait_for_log(const std::string& line) const {
    for (int i = 0; i < 3000 && daemon_->stderr_text().find(line) == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return daemon_->stderr_text().find(line) != std::string::npos;
  }

  std::filesystem::path held_;       // dir_/held, once a request is held
  std::future<std::string> answer_;  // of the held request: "<status> <body>" or "no answer: ..."

  // start_isolated_with_fake(), with a fake plugin whose create() waits while the file
  // dir_/wait-in-create exists: the daemon has started (start_wait_ms 200, call_timeout_ms 10
  // minutes), and fake's first worker is still in create().
  void start_with_a_first_worker_waiting_in_create() {
    const std::filesystem::path marker = dir_ / "wait-in-create";
    std::ofstream(marker) << "wait";
    start_isolated_with_fake({{"hang_in_create_if", marker.string()}},
                             {{"call_timeout_ms", 600'000}, {"start_wait_ms", 200}});
    if (HasFatalFailure()) return;
    const std::string log = daemon_->stderr_text();
    EXPECT_NE(log.find("plugin 'fake': its first worker has not started within 200 ms; going on "
                       "without it"),
              std::string::npos)
        << log;
    const json fake = api("GET", "/v1/plugins/fake").json();
    EXPECT_EQ(fake["workers"]["busy"], 1) << fake.dump();
    EXPECT_EQ(fake["workers"]["idle"], 0) << fake.dump();
  }

  // The daemon's plugin worker processes (isolation mode); at least one, or a failure.
  std::vector<pid_t> plugin_workers() const {
    std::vector<pid_t> workers;
    for (pid_t pid : child_pids(daemon_->pid())) {
      const std::optional<ProcStat> stat = read_proc_stat(pid);
      if (stat && stat->comm == "backhaul-plugin") workers.push_back(pid);  // 15 characters kept
    }
    EXPECT_FALSE(workers.empty()) << "no plugin worker process\n" << daemon_->stderr_text();
    return workers;
  }

  // Each of `workers` ends within 10 s (readiness, not timing): gone, or a zombie nobody reaps.
  static void expect_ended(const std::vector<pid_t>& workers) {
    for (pid_t pid : workers) {
      auto running = [pid] {
        const std::optional<ProcStat> stat = read_proc_stat(pid);
        return stat && stat->state != 'Z';
      };
      for (int i = 0; i < 1000 && running(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      EXPECT_FALSE(running()) << "worker process " << pid << " outlived its daemon";
      if (running()) ::kill(pid, SIGKILL);  // by PID: it is ours to clean up
    }
  }

  void spawn(const std::vector<std::string>& env) {
    daemon_ = std::make_unique<ChildProcess>(
        BACKHAULD_PATH,
        std::vector<std::string>{"--config", (dir_ / "config.json").string(), "--port-file",
                                 (dir_ / "port").string()},
        env, dir_ / "stderr");
  }
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

// --check-config has each loaded plugin check its connector config, as a start does: it passed a
// config the plugin refuses, and the start then exited 2. A config for no loaded plugin is a
// warning, as in a start's log.
TEST_F(DaemonProcessTest, CheckConfigHasEachPluginCheckItsConnectorConfig) {
  json config = good_config();
  config["plugins"]["connectors"] = {{"github", {{"api_base_url", "http://127.0.0.1:9"}}},
                                     {"gitlab", json::object()}};
  write_config(config);
  const std::vector<std::string> args = {"--config", (dir_ / "config.json").string(),
                                         "--check-config"};
  const std::vector<std::string> env = {"BACKHAUL_PROCESS_TEST_TOKEN=t"};
  const CommandResult refused = run_command(BACKHAULD_PATH, args, env, dir_);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("config: plugins.connectors.github: "), std::string::npos)
      << refused.err;
  EXPECT_NE(refused.err.find("unknown key \"api_base_url\""), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find("warning: plugins.connectors.gitlab: no such plugin is loaded"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(refused.out.find("is valid"), std::string::npos) << refused.out;

  config["plugins"]["connectors"].erase("github");
  for (const char* mode : {"none", "process"}) {
    config["plugins"]["isolation"] = {{"mode", mode}};
    write_config(config);
    const CommandResult valid = run_command(BACKHAULD_PATH, args, env, dir_);
    EXPECT_EQ(valid.exit_code, 0) << mode << ": " << valid.err;
    EXPECT_NE(valid.out.find("is valid"), std::string::npos) << mode << ": " << valid.out;
    EXPECT_NE(valid.err.find("warning: plugins.connectors.gitlab"), std::string::npos) << valid.err;
  }
  // Neither store nor port file: the check touches neither.
  EXPECT_FALSE(std::filesystem::exists(dir_ / "backhaul.db"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "port"));
}

// A number past what a double holds was no ConfigError but nlohmann's out_of_range, which
// nothing caught: `--check-config` and a start died of SIGABRT (status 134 in a shell), saying
// only "terminate called after throwing an instance of ...". They exit 2 naming the problem.
TEST_F(DaemonProcessTest, AConfigNumberTooLargeForADoubleExits2NamingItNotAnAbort) {
  std::string text = good_config().dump();
  text.insert(1, R"("pipeline":{"throttle_per_hour":1e999},)");
  std::ofstream(dir_ / "config.json") << text;
  const std::vector<std::string> env = {"BACKHAUL_PROCESS_TEST_TOKEN=t"};
  for (const bool check : {true, false}) {
    std::vector<std::string> args = {"--config", (dir_ / "config.json").string()};
    if (check) args.push_back("--check-config");
    const CommandResult refused = run_command(BACKHAULD_PATH, args, env, dir_);
    EXPECT_EQ(refused.exit_code, 2) << "check " << check << ": " << refused.err;
    EXPECT_NE(refused.err.find("config: (root): number out of range at byte 38: a double holds "
                               "up to about 1.8e308"),
              std::string::npos)
        << refused.err;
    EXPECT_EQ(refused.err.find("terminate"), std::string::npos) << refused.err;
  }
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

// A request that cannot be read was logged at warn level with its target as sent: anyone reaching
// the port wrote raw terminal escapes (and up to 16 KB a line) into the daemon's log, as often as
// they liked. It is logged at debug level now, escaped and cut to 200 bytes.
TEST_F(DaemonProcessTest, AnUnreadableRequestIsLoggedAtDebugLevelEscapedAndCut) {
  for (const std::string level : {"warn", "debug"}) {
    json config = good_config();
    config["logging"] = {{"level", level}};
    write_config(config);
    std::filesystem::remove(dir_ / "port");  // the last daemon's
    spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
    const uint16_t port = daemon_->wait_port(dir_ / "port", std::chrono::seconds(30));
    ASSERT_NE(port, 0) << daemon_->stderr_text();
    const std::string target = "\x1b[31mEVIL\x1b[0m\x07" + std::string(400, 'a');
    {
      UniqueFd client = connect_loopback(port);
      ASSERT_TRUE(client) << std::strerror(errno);
      const std::string request = "GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n";
      ASSERT_EQ(::send(client.get(), request.data(), request.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(request.size()));
      char answer[512];
      ASSERT_GT(::recv(client.get(), answer, sizeof answer, 0), 0) << "a 400 comes back";
      EXPECT_EQ(std::string(answer, 12), "HTTP/1.1 400");
    }
    ASSERT_TRUE(daemon_->signal(SIGTERM));
    ASSERT_NE(daemon_->wait_exit(std::chrono::seconds(30)), -1);
    const std::string log = daemon_->stderr_text();
    EXPECT_EQ(log.find('\x1b'), std::string::npos) << level;
    EXPECT_EQ(log.find('\x07'), std::string::npos) << level;
    const size_t line = log.find("reading request ");
    if (level == "warn") {
      EXPECT_EQ(line, std::string::npos) << log;
      continue;
    }
    ASSERT_NE(line, std::string::npos) << log;
    EXPECT_NE(log.find("reading request \\x1b[31mEVIL\\x1b[0m\\x07aaa", line), std::string::npos)
        << log;
    EXPECT_NE(log.find(std::string(182, 'a') + "... failed: ", line), std::string::npos) << log;
    EXPECT_EQ(log.find(std::string(190, 'a'), line), std::string::npos) << "cut at 200 bytes";
  }
}

// A second daemon on a port the first listens on does not start (exit 1): Poco's bind(address,
// true) set SO_REUSEPORT as well, so both listened and the kernel shared the requests between them.
// Nor does it touch the store first: started on the same config by mistake (same store, same
// owner, recovering its own leases), it recovered the first daemon's running jobs, each at the
// cost of an attempt, and claimed some, and only then failed to bind.
TEST_F(DaemonProcessTest, ASecondDaemonOnTheSameAdminPortCannotStart) {
  json config = good_config();
  config["store"] = {{"path", (dir_ / "store.db").string()}};
  config["scheduler"] = {{"owner", "host-a"}, {"recover_own_leases", true}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
  const uint16_t port = daemon_->wait_port(dir_ / "port", std::chrono::seconds(30));
  ASSERT_NE(port, 0) << daemon_->stderr_text();
  json second = config;
  second["admin"] = {{"port", port}, {"token_env", kTokenEnv}};
  const std::unique_ptr<ChildProcess> other = launch_daemon("second", second);
  const int status = other->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "; " << other->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 1) << other->stderr_text();
  EXPECT_NE(other->stderr_text().find("cannot start"), std::string::npos) << other->stderr_text();
  EXPECT_NE(other->stderr_text().find("in use"), std::string::npos) << other->stderr_text();
  for (const char* step : {"store: ", "scheduler started", "start-up recovery", "drained"}) {
    EXPECT_EQ(other->stderr_text().find(step), std::string::npos)
        << step << " in: " << other->stderr_text();
  }
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  EXPECT_EQ(daemon_->wait_exit(std::chrono::seconds(30)), 0) << daemon_->stderr_text();
}

// Started with fds 0-2 closed and SIGCHLD ignored (a careless service wrapper), the daemon has
// /dev/null on 0-2 and SIGCHLD's default action. Before, the signal pipe took fds 0 and 1, the
// next admin connection took fd 2 and got the daemon's log lines, and the kernel reaped the
// plugin workers, so how one ended could not be told.
TEST_F(DaemonProcessTest, AStartWithoutFds0To2OrWithSigchldIgnoredPutsBothRight) {
  write_config(good_config());
  const std::string config = (dir_ / "config.json").string();
  const std::string port_file = (dir_ / "port").string();
  std::vector<std::string> words = {BACKHAULD_PATH, "--config", config, "--port-file", port_file};
  std::vector<char*> argv;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  std::string token = "BACKHAUL_PROCESS_TEST_TOKEN=process-token";
  char* envp[] = {token.data(), nullptr};
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGCHLD, SIG_IGN);
    ::close(0);
    ::close(1);
    ::close(2);
    ::execve(argv[0], argv.data(), envp);
    ::_exit(127);
  }
  // Readiness: the port file, polled for at most 30 s.
  for (int i = 0; i < 3000 && !std::filesystem::exists(port_file); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool up = std::filesystem::exists(port_file);
  for (int fd = 0; up && fd <= 2; ++fd) {
    const std::string link = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    std::error_code ec;
    EXPECT_EQ(std::filesystem::read_symlink(link, ec).string(), "/dev/null")
        << link << ": " << ec.message();
  }
  std::ifstream status_file("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  std::string ignored;
  while (std::getline(status_file, line)) {
    if (line.rfind("SigIgn:", 0) == 0) ignored = line.substr(7);
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(up) << "backhauld did not come up (exit status " << status << ")";
  ASSERT_FALSE(ignored.empty());
  const unsigned long long mask = std::stoull(ignored, nullptr, 16);
  EXPECT_EQ(mask & (1ULL << (SIGCHLD - 1)), 0u) << "SigIgn:" << ignored;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A SIGTERM while an API request is under way answers it before the daemon exits 0. The stop
// aborted every connection at once: the request went on (a run being started committed), and its
// client saw the connection reset.
TEST_F(DaemonProcessTest, AnApiRequestUnderWayAtSigtermIsAnsweredBeforeTheExit) {
  hold_an_api_request_inside_the_plugin({{"grace_ms", 30'000}});
  if (HasFatalFailure()) return;
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  EXPECT_TRUE(wait_for_log("stop: waiting for 1 admin requests under way to be answered"))
      << daemon_->stderr_text();
  // Meanwhile the port is closed: a new connection is refused at once, not taken by the kernel
  // and left unread (a health probe hung until its own timeout).
  EXPECT_FALSE(connect_loopback(admin_port_)) << "a new connection was taken during the stop";
  EXPECT_EQ(errno, ECONNREFUSED);
  std::filesystem::remove(held_);  // the plugin returns
  ASSERT_EQ(answer_.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const std::string answer = answer_.get();
  EXPECT_EQ(answer.substr(0, 4), "200 ") << answer;
  EXPECT_NE(answer.find(R"("valid":true)"), std::string::npos) << answer;
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();
}

// An API request stuck inside a plugin (a validate-config that never returns) holds the stop no
// longer than shutdown.grace_ms + abandon_ms: the daemon exits 1, naming it. The stop's watchdog
// looked at jobs only, and with none in a handler the daemon waited for the request for ever.
TEST_F(DaemonProcessTest, AnApiRequestStuckInAPluginHoldsTheStopNoLongerThanGraceAndAbandon) {
  hold_an_api_request_inside_the_plugin({{"grace_ms", 100}, {"abandon_ms", 400}});
  if (HasFatalFailure()) return;
  expect_exit_1_within_10s_of_sigterm();
  EXPECT_NE(daemon_->stderr_text().find("0 jobs and 1 API requests still in a handler"),
            std::string::npos)
      << daemon_->stderr_text();
  EXPECT_NE(daemon_->stderr_text().find("1 admin requests still under way; closing"),
            std::string::npos)
      << daemon_->stderr_text();
  std::filesystem::remove(held_);
  ASSERT_EQ(answer_.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_EQ(answer_.get().substr(0, 10), "no answer:");
}

// F6 with work in flight: SIGTERM mid-run exits 0, leaves nothing running, and releases the
// interrupted units without counting an attempt; a restarted daemon finishes the run from the
// checkpoints and the gateway receives every event.
TEST_F(DaemonProcessTest, SigtermMidRunReleasesUnitsAndARestartFinishesTheRun) {
  const int64_t run_id = start_a_run_in_progress("200", "20", {{"shutdown", {{"grace_ms", 100}}}});
  ASSERT_NE(run_id, 0);
  EXPECT_TRUE(stop_daemon()) << daemon_->stderr_text();
  EXPECT_GT(released_units_of_a_stopped_daemon(), 0) << daemon_->stderr_text();

  ASSERT_NE(start_daemon(), 0) << daemon_->stderr_text();  // the same store: the run resumes
  const json run = wait_finished(run_id, std::chrono::seconds(120));
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  const json gateway_report = report("inst-1");
  const json& github = gateway_report["gateway"]["by_provider"]["github"];
  EXPECT_EQ(github["missing"], 0) << gateway_report.dump(2);
  EXPECT_EQ(github["unexpected"], 0) << gateway_report.dump(2);
  EXPECT_TRUE(stop_daemon()) << daemon_->stderr_text();
}

// An operator who will not wait out the grace sends SIGTERM again: the jobs in flight are asked
// to stop at their next page boundary and released, and the daemon exits 0. The grace here is
// ten minutes and the units would page for half a minute or more: without the second signal the
// drain lets them finish, and releases none.
TEST_F(DaemonProcessTest, ASecondSigtermEndsTheGraceAtOnce) {
  // At info, the "draining" line tells that the first signal is in.
  ASSERT_NE(
      start_a_run_in_progress(
          "2000", "50", {{"shutdown", {{"grace_ms", 600'000}}}, {"logging", {{"level", "info"}}}}),
      0);

  ASSERT_TRUE(daemon_->signal(SIGTERM));
  for (int i = 0; i < 3000 && daemon_->stderr_text().find("draining") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // readiness, not timing
  }
  ASSERT_NE(daemon_->stderr_text().find("draining"), std::string::npos) << daemon_->stderr_text();
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int status = daemon_->wait_exit(std::chrono::seconds(120));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();
  EXPECT_NE(daemon_->stderr_text().find("signal 15 again"), std::string::npos)
      << daemon_->stderr_text();
  EXPECT_GT(released_units_of_a_stopped_daemon(), 0) << daemon_->stderr_text();
}

// A provider that takes 20 s per answer keeps every handler inside a plugin call, where no drain
// reaches it. SIGTERM still ends the daemon after shutdown.grace_ms + abandon_ms, with status 1,
// the job left running under its lease for a sweep to take back.
TEST_F(DaemonProcessTest, AHandlerStuckInAPluginCallHoldsTheStopNoLongerThanGraceAndAbandon) {
  start_a_run_stuck_in_plugin_calls(false);
  if (HasFatalFailure()) return;

  // Well before the provider answers (20 s); the bound is the point, not a speed goal.
  expect_exit_1_within_10s_of_sigterm();
  EXPECT_NE(daemon_->stderr_text().find("exiting without them"), std::string::npos)
      << daemon_->stderr_text();

  EXPECT_GE(running_jobs(), 1) << "the abandoned job keeps its lease until it expires";
}

// The same stuck calls in isolation mode: after shutdown.grace_ms + abandon_ms the daemon kills the
// worker processes running them. Each call fails (an attempt of its job), every handler returns,
// and the daemon stops cleanly (status 0) with no job left running under a lease.
TEST_F(DaemonProcessTest, InIsolationModeAStopKillsTheWorkersOfCallsThatOutlastGraceAndAbandon) {
  start_a_run_stuck_in_plugin_calls(true);
  if (HasFatalFailure()) return;

  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int status = daemon_->wait_exit(std::chrono::seconds(60));
  // Well before the provider answers (20 s); the bound is the point, not a speed goal.
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, std::chrono::seconds(10));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();
  EXPECT_NE(daemon_->stderr_text().find("plugin worker processes running their calls"),
            std::string::npos)
      << daemon_->stderr_text();
  EXPECT_EQ(daemon_->stderr_text().find("exiting without them"), std::string::npos)
      << daemon_->stderr_text();

  EXPECT_EQ(running_jobs(), 0) << "every stopped call ended its job's attempt";
  auto store = jobs::open_sqlite_store((dir_ / "jobs.db").string());
  jobs::JobQuery stopped;
  stopped.limit = 100;
  int with_the_reason = 0;
  for (const jobs::Job& job : store->list(stopped).jobs) {
    with_the_reason += job.last_error && job.last_error->find(
                                             "the daemon could not wait for it "
                                             "any longer") != std::string::npos;
  }
  EXPECT_GE(with_the_reason, 1) << daemon_->stderr_text();
}

// A plugin whose deinit() never returns would hold the exit forever, after a stop that released
// everything: unloading gets shutdown.abandon_ms, then the daemon exits with status 1 saying why.
TEST_F(DaemonProcessTest, APluginWhoseDeinitDoesNotReturnHoldsTheExitNoLongerThanAbandon) {
  json config = good_config();
  config["plugins"]["directories"] = {BACKHAUL_TEST_PLUGIN_DIR, DEINIT_HANGS_PLUGIN_DIR};
  config["shutdown"] = {{"grace_ms", 100}, {"abandon_ms", 1'000}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
  const uint16_t port = daemon_->wait_port(dir_ / "port", std::chrono::seconds(30));
  ASSERT_NE(port, 0) << daemon_->stderr_text();
  sandbox::testing::TestClient client(port);
  const json plugins =
      client.get("/v1/plugins", {{"Authorization", "Bearer process-token"}}).json();
  ASSERT_NE(plugins.dump().find("deinithangs"), std::string::npos) << plugins.dump();

  expect_exit_1_within_10s_of_sigterm();  // the bound is the point, not a speed goal
  EXPECT_NE(daemon_->stderr_text().find("unloading did not end within 1000 ms"), std::string::npos)
      << daemon_->stderr_text();
}

// A start that fails once the plugins are loaded (here github refuses its config, after the
// plugin whose deinit() hangs was loaded) unloads them under the same bound: a plugin whose
// deinit() never returns does not hold the process (found by review: it did, forever, without even
// logging "cannot start"). The admin port, taken before anything else, cannot fail it there.
TEST_F(DaemonProcessTest, AFailedStartWithAPluginWhoseDeinitHangsStillExits) {
  json config = good_config();
  config["plugins"]["directories"] = {BACKHAUL_TEST_PLUGIN_DIR, DEINIT_HANGS_PLUGIN_DIR};
  config["plugins"]["connectors"] = {{"github", {{"base_url", "not a url"}}}};
  config["shutdown"] = {{"grace_ms", 100}, {"abandon_ms", 1'000}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
  const int status = daemon_->wait_exit(std::chrono::seconds(15));
  ASSERT_NE(status, -1) << "still running 15 s after a failed start (deinit() of deinithangs)\n"
                        << daemon_->stderr_text();
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << daemon_->stderr_text();
  // 1, not the config error's 2: the unload that did not end ends the process (status 1).
  EXPECT_EQ(WEXITSTATUS(status), 1) << daemon_->stderr_text();
  EXPECT_NE(daemon_->stderr_text().find("config: plugins.connectors.github: github config: "
                                        "base_url must be an absolute"),
            std::string::npos)
      << daemon_->stderr_text();
  EXPECT_NE(daemon_->stderr_text().find("unloading did not end within 1000 ms"), std::string::npos)
      << daemon_->stderr_text();
}

// A start stuck in a plugin's init() used to ignore SIGTERM for ever (the signal was blocked
// until start() returned): now the signal is taken at once, and if start-up has not ended
// shutdown.abandon_ms later, backhauld exits 1 saying where it was.
TEST_F(DaemonProcessTest, ASignalDuringAStartStuckInAPluginsInitEndsTheProcessAfterAbandon) {
  spawn_into_a_waiting_init(1'000, "");
  if (HasFatalFailure()) return;

  expect_exit_1_within_10s_of_sigterm();  // the bound is the point, not a speed goal
  const std::string log = daemon_->stderr_text();
  EXPECT_NE(log.find("signal 15 during start-up (loading plugins)"), std::string::npos) << log;
  EXPECT_NE(log.find("start-up did not end within 1000 ms of it"), std::string::npos) << log;
  EXPECT_NE(log.find("still loading plugins"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "port")) << "never ready, so no port file";
}

// In isolation mode no code of a plugin runs in the daemon: each loads in a worker process first.
// One that crashes while loading (here its init() aborts) is reported and skipped, as a broken
// plugin is, instead of taking the daemon down; the others serve, and their config check runs in
// a worker too.
TEST_F(DaemonProcessTest, InIsolationModeAPluginThatCrashesWhileLoadingIsSkippedAndTheRestServe) {
  json config = good_config();
  config["plugins"]["directories"] = {BACKHAUL_TEST_PLUGIN_DIR, INIT_ABORTS_PLUGIN_DIR};
  config["plugins"]["isolation"] = {{"mode", "process"}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
  const uint16_t port = daemon_->wait_port(dir_ / "port", std::chrono::seconds(30));
  ASSERT_NE(port, 0) << daemon_->stderr_text();
  const std::string log = daemon_->stderr_text();
  EXPECT_NE(log.find("init_aborts.so not loaded: in isolation mode, worker process "),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("ended during load: it was killed by SIGABRT"), std::string::npos) << log;

  sandbox::testing::TestClient client(port);
  const sandbox::testing::Headers auth = {{"Authorization", "Bearer process-token"}};
  const json plugins = client.get("/v1/plugins", auth).json();
  std::set<std::string> ids;
  for (const json& plugin : plugins["items"]) {
    ids.insert(plugin["id"].get<std::string>());
    EXPECT_EQ(plugin["isolated"], true) << plugin.dump();
  }
  EXPECT_EQ(ids, (std::set<std::string>{"github", "vercel"})) << plugins.dump();
  const json invalid =
      client.post("/v1/plugins/github/validate-config", R"({"config":{"per_page":1000}})", auth)
          .json();
  EXPECT_FALSE(invalid["valid"].get<bool>()) << invalid.dump();
  ASSERT_EQ(invalid["errors"].size(), 1u) << invalid.dump();
  EXPECT_NE(invalid["errors"][0].get<std::string>().find("per_page"), std::string::npos)
      << invalid.dump();
  EXPECT_TRUE(client
                  .post("/v1/plugins/github/validate-config",
                        R"({"config":{"base_url":"http://127.0.0.1:1/github"}})", auth)
                  .json()["valid"]
                  .get<bool>());

  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();
}

// A plugin whose create() crashes in the first worker an isolated daemon starts for it costs
// attempts of its jobs (SPEC B4), not the daemon's start: the plugin is listed, the crash is
// logged and counted, and the other plugins serve runs.
TEST_F(DaemonProcessTest, InIsolationModeAPluginThatCrashesInCreateAtStartLeavesTheDaemonServing) {
  const std::filesystem::path marker = dir_ / "abort-in-create";
  std::ofstream(marker) << "abort";
  start_isolated_with_fake({{"abort_in_create_if", marker.string()}}, json::object());
  if (HasFatalFailure()) return;
  const std::string log = daemon_->stderr_text();
  EXPECT_NE(log.find("plugin 'fake': worker process "), std::string::npos) << log;
  EXPECT_NE(log.find(" ended during create while starting: it was killed by SIGABRT (Aborted); "
                     "each call will start a new worker"),
            std::string::npos)
      << log;
  EXPECT_EQ(metric(R"(backhaul_plugin_workers_lost_total{plugin="fake",reason="crashed"})"), 1);
  EXPECT_EQ(metric(R"(backhaul_plugin_workers{plugin="fake",state="idle"})"), 0);
  EXPECT_EQ(metric(R"(backhaul_plugin_workers{plugin="github",state="idle"})"), 1);

  std::set<std::string> ids;
  const json plugins = api("GET", "/v1/plugins").json();
  for (const json& plugin : plugins["items"]) {
    ids.insert(plugin["id"].get<std::string>());
  }
  EXPECT_EQ(ids, (std::set<std::string>{"fake", "github", "vercel"})) << plugins.dump();
  // The API says it too: no live worker, one crashed.
  const json fake = api("GET", "/v1/plugins/fake").json();
  ASSERT_TRUE(fake.contains("workers")) << fake.dump();
  EXPECT_EQ(fake["workers"]["busy"], 0) << fake.dump();
  EXPECT_EQ(fake["workers"]["idle"], 0) << fake.dump();
  EXPECT_EQ(fake["workers"]["lost"]["crashed"], 1) << fake.dump();
  EXPECT_EQ(fake["workers"]["lost"]["timed_out"], 0) << fake.dump();
  const json github = api("GET", "/v1/plugins/github").json();
  ASSERT_TRUE(github.contains("workers")) << github.dump();
  EXPECT_EQ(github["workers"]["idle"], 1) << github.dump();
  EXPECT_EQ(github["workers"]["lost"]["crashed"], 0) << github.dump();
  const int64_t run = start_run("gh-inst-1", "github");
  ASSERT_NE(run, 0);
  EXPECT_EQ(wait_finished(run)["status"], "succeeded");
  EXPECT_TRUE(stop_daemon()) << daemon_->stderr_text();
}

// A plugin whose create() hangs in the first worker an isolated daemon starts for it holds the
// start for start_wait_ms, not for call_timeout_ms (10 minutes here): the daemon serves, the
// worker is left starting, and it serves once create() returns. Until then, the fake plugin's
// create() waits while the file dir_/wait-in-create exists.
TEST_F(DaemonProcessTest, InIsolationModeAPluginThatHangsInCreateAtStartLeavesTheDaemonServing) {
  start_with_a_first_worker_waiting_in_create();
  if (HasFatalFailure()) return;
  const int64_t run = start_run("gh-inst-1", "github");
  ASSERT_NE(run, 0);
  EXPECT_EQ(wait_finished(run)["status"], "succeeded");

  std::filesystem::remove(dir_ / "wait-in-create");
  json fake = api("GET", "/v1/plugins/fake").json();
  for (int i = 0; i < 3000 && fake["workers"]["idle"] != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    fake = api("GET", "/v1/plugins/fake").json();
  }
  EXPECT_EQ(fake["workers"]["idle"], 1) << fake.dump();
  EXPECT_EQ(fake["workers"]["busy"], 0) << fake.dump();
  EXPECT_EQ(fake["workers"]["lost"]["timed_out"], 0) << fake.dump();
  EXPECT_TRUE(stop_daemon()) << daemon_->stderr_text();
}

// A daemon stopped while a first worker is still starting does not wait out call_timeout_ms for
// it: the worker is killed, and the daemon exits 0 (stop_daemon() waits 30 s of the 10 minutes).
TEST_F(DaemonProcessTest, InIsolationModeADaemonStopsWhileAFirstWorkerIsStillStarting) {
  start_with_a_first_worker_waiting_in_create();
  if (HasFatalFailure()) return;
  const std::vector<pid_t> workers = plugin_workers();
  EXPECT_TRUE(stop_daemon()) << daemon_->stderr_text();
  expect_ended(workers);
}

// validate-config in isolation mode: a plugin whose worker dies checking a config gives no verdict
// on it (503, retryable), where it said "valid": false with the crash as the config's error. The
// daemon goes on serving, and a config the plugin refuses is still reported invalid.
TEST_F(DaemonProcessTest, InIsolationModeAPluginThatCrashesCheckingAConfigGivesNoVerdict) {
  start_isolated_with_fake(json::object(), json::object());
  if (HasFatalFailure()) return;
  const sandbox::testing::HttpResult crashed =
      api("POST", "/v1/plugins/fake/validate-config", R"({"config":{"abort_in_validate":"yes"}})");
  EXPECT_EQ(crashed.status, 503) << crashed.body;
  const json error = crashed.json()["error"];
  EXPECT_EQ(error["code"], "UNAVAILABLE") << crashed.body;
  EXPECT_EQ(error["retryable"], true) << crashed.body;
  EXPECT_NE(error["message"].get<std::string>().find("plugin fake could not check the config: "),
            std::string::npos)
      << crashed.body;

  const sandbox::testing::HttpResult invalid =
      api("POST", "/v1/plugins/fake/validate-config", R"({"config":{"pages":0}})");
  ASSERT_EQ(invalid.status, 200) << invalid.body;
  EXPECT_EQ(invalid.json()["valid"], false) << invalid.body;
  const sandbox::testing::HttpResult valid =
      api("POST", "/v1/plugins/fake/validate-config", R"({"config":{"pages":2}})");
  ASSERT_EQ(valid.status, 200) << valid.body;
  EXPECT_EQ(valid.json()["valid"], true) << valid.body;
}

// An isolated daemon loads its plugins, and then starts their first workers, at once: the two
// rendezvous plugins each wait in init() and in create() for the other to get there, and fail
// alone after 20 s, as one after the other has them do.
TEST_F(DaemonProcessTest, InIsolationModePluginsLoadAndStartTheirWorkersAtOnce) {
  const std::filesystem::path meeting = dir_ / "rendezvous";
  std::filesystem::create_directories(meeting);
  json config = good_config();
  config["plugins"]["directories"] = {RENDEZVOUS_PLUGIN_DIR};
  config["plugins"]["isolation"] = {{"mode", "process"}, {"call_timeout_ms", 60'000}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token",
         "MISBEHAVING_RENDEZVOUS_DIR=" + meeting.string()});
  const uint16_t port = daemon_->wait_port(dir_ / "port", std::chrono::seconds(60));
  ASSERT_NE(port, 0) << daemon_->stderr_text();
  sandbox::testing::TestClient client(port);
  const json plugins =
      client.get("/v1/plugins", {{"Authorization", "Bearer process-token"}}).json();
  std::vector<std::string> ids;
  for (const json& plugin : plugins["items"]) ids.push_back(plugin["id"].get<std::string>());
  EXPECT_EQ(ids, (std::vector<std::string>{"rendezvousa", "rendezvousb"}))
      << daemon_->stderr_text();
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();
}

// A daemon killed outright (SIGKILL, the OOM killer) leaves workers inside calls that may never
// return (here the provider takes 20 s per answer). Each worker sees its socket's other end close
// and ends its process group: none outlives the daemon by more than moments.
TEST_F(DaemonProcessTest, InIsolationModeNoWorkerOutlivesADaemonKilledWithSigkill) {
  start_a_run_stuck_in_plugin_calls(true);
  if (HasFatalFailure()) return;
  // Readiness: a worker's request has reached the provider, so that worker is inside its call.
  auto provider_requests = [this] { return report()["provider_requests"]["github"].get<int>(); };
  for (int i = 0; i < 1500 && provider_requests() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(provider_requests(), 0) << daemon_->stderr_text();
  const std::vector<pid_t> workers = plugin_workers();
  ASSERT_TRUE(daemon_->signal(SIGKILL));
  ASSERT_NE(daemon_->wait_exit(std::chrono::seconds(30)), -1);
  expect_ended(workers);
}

// The start-up of ASignalDuringAStartStuckInAPluginsInitEndsTheProcessAfterAbandon in isolation
// mode: the init() that never returns is in a worker process, which the abandoned start-up leaves
// behind; it ends with its daemon.
TEST_F(DaemonProcessTest, InIsolationModeAStartAbandonedInAPluginsInitLeavesNoWorkerBehind) {
  spawn_into_a_waiting_init(1'000, "", true);
  if (HasFatalFailure()) return;
  const std::vector<pid_t> workers = plugin_workers();

  expect_exit_1_within_10s_of_sigterm();  // the bound is the point, not a speed goal
  EXPECT_NE(daemon_->stderr_text().find("still loading plugins"), std::string::npos)
      << daemon_->stderr_text();
  expect_ended(workers);
}

// The same for a start waiting on a MySQL server that takes the connection and never answers: the
// signal ends the process shutdown.abandon_ms later, not connect-timeout (60 s here) later.
TEST_F(DaemonProcessTest, ASignalDuringAStartWaitingOnAStoreThatDoesNotAnswerEndsAfterAbandon) {
  const Listener silent;

  json config = good_config();
  config["store"] = {{"backend", "mysql"}, {"connection_env", "BACKHAUL_PROCESS_TEST_DSN"}};
  config["shutdown"] = {{"grace_ms", 100}, {"abandon_ms", 1'000}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token",
         "BACKHAUL_PROCESS_TEST_DSN=host=127.0.0.1;port=" + std::to_string(silent.port) +
             ";user=u;password=p;db=d;connect-timeout=60;read-timeout=60"});
  pollfd waiting{silent.fd, POLLIN, 0};  // the store's first session, within 30 s
  ASSERT_EQ(::poll(&waiting, 1, 30'000), 1) << daemon_->stderr_text();
  const int connection = ::accept(silent.fd, nullptr, nullptr);
  ASSERT_GE(connection, 0);
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_connection{connection};

  expect_exit_1_within_10s_of_sigterm();
  const std::string log = daemon_->stderr_text();
  EXPECT_NE(log.find("signal 15 during start-up (opening the store)"), std::string::npos) << log;
  EXPECT_NE(log.find("still opening the store"), std::string::npos) << log;
}

// A signal during a start-up that does end is not lost: the daemon stops as soon as start() has
// returned, cleanly, with status 0, and never writes its port file (it was never ready).
TEST_F(DaemonProcessTest, ASignalDuringASlowStartStopsTheDaemonOnceStartUpEnds) {
  spawn_into_a_waiting_init(20'000, "1000");
  if (HasFatalFailure()) return;

  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int status = daemon_->wait_exit(std::chrono::seconds(60));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();
  const std::string log = daemon_->stderr_text();
  EXPECT_NE(log.find("signal 15 during start-up (loading plugins)"), std::string::npos) << log;
  EXPECT_NE(log.find("plugin initwaits 1.0.0 loaded"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped"), std::string::npos) << log;
  EXPECT_EQ(log.find("start-up did not end"), std::string::npos) << log;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "port"));
}

// The stop's bound applies to jobs in a handler, not to the stop itself: an idle daemon with
// shutdown {grace_ms 0, abandon_ms 0} stops cleanly with 0 (found by review: it exited 1 while
// stop() was still running).
TEST_F(DaemonProcessTest, AnIdleDaemonWithZeroGraceAndAbandonStopsWithExit0) {
  json config = good_config();
  config["shutdown"] = {{"grace_ms", 0}, {"abandon_ms", 0}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
  ASSERT_NE(daemon_->wait_port(dir_ / "port", std::chrono::seconds(30)), 0)
      << daemon_->stderr_text();
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "; " << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();
  EXPECT_EQ(daemon_->stderr_text().find("exiting without them"), std::string::npos)
      << daemon_->stderr_text();
}

// Review: the descriptors backhauld opens (the admin API's listening socket, the audit log, the
// store) must not leak into a process a plugin starts: a helper outliving a restart would hold
// the admin port, and the new backhauld could not bind it. Nor may a connection the admin API
// accepted: a helper holding it would keep its client from seeing it close. /proc/PID/fdinfo
// shows O_CLOEXEC.
TEST_F(DaemonProcessTest, TheDaemonsOwnDescriptorsAreClosedOnExec) {
  json config = good_config();
  config["admin"]["listen"] = "127.0.0.1";
  config["admin"]["audit_log"] = (dir_ / "audit.log").string();
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
  const uint16_t port = daemon_->wait_port(dir_ / "port", std::chrono::seconds(30));
  ASSERT_NE(port, 0) << daemon_->stderr_text();
  // A kept-alive connection, answered: backhauld holds its end open while the fds are read.
  const UniqueFd client = connect_loopback(port);
  ASSERT_TRUE(client) << std::strerror(errno);
  const std::string request = "GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_EQ(::send(client.get(), request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  char reply[512];
  ASSERT_GT(::recv(client.get(), reply, sizeof reply, 0), 0) << daemon_->stderr_text();
  const std::filesystem::path fds = "/proc/" + std::to_string(daemon_->pid()) + "/fd";
  const std::string own_dir = std::filesystem::canonical(dir_).string();
  std::vector<std::string> leaking;
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(fds)) {
    const std::string fd = entry.path().filename().string();
    if (std::stoi(fd) <= 2) continue;  // stdin, stdout, stderr: inherited on purpose
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec) continue;  // closed meanwhile
    // Only what backhauld itself opens: sockets, and files in the test's directory.
    if (target.rfind("socket:", 0) != 0 && target.rfind(own_dir, 0) != 0) continue;
    std::ifstream info("/proc/" + std::to_string(daemon_->pid()) + "/fdinfo/" + fd);
    std::string line;
    while (std::getline(info, line)) {
      if (line.rfind("flags:", 0) != 0) continue;
      ++checked;
      const unsigned long flags = std::strtoul(line.c_str() + 6, nullptr, 8);
      if ((flags & 02000000UL) == 0) leaking.push_back(fd + " -> " + target);
    }
  }
  EXPECT_GE(checked, 3) << "expected at least the admin socket, a connection and the audit log";
  std::string list;
  for (const std::string& fd : leaking) list += "  " + fd + "\n";
  EXPECT_TRUE(leaking.empty()) << "descriptors without O_CLOEXEC:\n" << list;
}

// Review: a process a plugin starts (a helper, say) must be stoppable like any other. Under
// systemd, `systemctl stop` sends SIGTERM to every process of the unit: a helper that inherited
// backhauld's blocked SIGTERM/SIGINT ignores it and holds the stop until TimeoutStopSec's SIGKILL.
TEST_F(DaemonProcessTest, AProcessAPluginStartsCanBeStoppedWithSigterm) {
  json config = good_config();
  config["plugins"]["directories"] = {INIT_SPAWNS_PLUGIN_DIR};
  write_config(config);
  const auto pid_file = dir_ / "helper.pid";
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token",
         "MISBEHAVING_SPAWN_PID_FILE=" + pid_file.string()});
  ASSERT_NE(daemon_->wait_port(dir_ / "port", std::chrono::seconds(30)), 0)
      << daemon_->stderr_text();
  int helper = 0;
  std::ifstream(pid_file) >> helper;
  ASSERT_GT(helper, 0) << daemon_->stderr_text();
  struct Kill {  // by its PID only; a no-op once it has ended
    pid_t pid;
    ~Kill() { ::kill(pid, SIGKILL); }
  } kill_helper{helper};
  const std::string status_path = "/proc/" + std::to_string(helper) + "/status";
  std::string blocked;
  {
    std::ifstream status(status_path);
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("SigBlk:", 0) == 0) blocked = line;
    }
  }
  ASSERT_EQ(::kill(helper, SIGTERM), 0);
  // Ended: gone, or a zombie backhauld has not reaped. At most 10 s (readiness, not timing).
  const auto ended = [&] {
    std::ifstream status(status_path);
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("State:", 0) == 0) return line.find('Z') != std::string::npos;
    }
    return true;
  };
  for (int i = 0; i < 1000 && !ended(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(ended()) << "the helper ignored SIGTERM; its " << blocked;
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  const int status = daemon_->wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status << "\n" << daemon_->stderr_text();
  EXPECT_EQ(WEXITSTATUS(status), 0) << daemon_->stderr_text();
}

// Review: start-up can be stuck before its first named step too: opening admin.audit_log, which
// blocks for ever on a FIFO nobody reads. The signal's log lines must say where start-up is, not
// "during start-up ()" and "still : a plugin's init() or a store that does not answer?".
TEST_F(DaemonProcessTest, ASignalDuringAStartStuckOnTheAuditLogSaysSo) {
  const auto fifo = dir_ / "audit.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  json config = good_config();
  config["admin"]["audit_log"] = fifo.string();
  config["shutdown"] = {{"grace_ms", 100}, {"abandon_ms", 1'000}};
  write_config(config);
  spawn({"BACKHAUL_PROCESS_TEST_TOKEN=process-token"});
  // Readiness: the daemon waits for a reader of the FIFO (at most 30 s).
  const std::string wchan = "/proc/" + std::to_string(daemon_->pid()) + "/wchan";
  const auto waiting = [&] {
    std::string text;
    std::ifstream(wchan) >> text;
    return text == "wait_for_partner";
  };
  for (int i = 0; i < 3000 && !waiting(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(waiting()) << "the daemon is not seen waiting on the FIFO (" << wchan << ")\n"
                         << daemon_->stderr_text();

  expect_exit_1_within_10s_of_sigterm();
  const std::string log = daemon_->stderr_text();
  EXPECT_NE(log.find("signal 15 during start-up (opening the audit log)"), std::string::npos)
      << log;
  EXPECT_NE(log.find("still opening the audit log"), std::string::npos) << log;
}

}  // namespace
}  // namespace backhaul::daemon::testing
