// Isolation mode (SPEC B4): the fake plugin's calls run in real backhaul-plugin-worker processes.
#include "core/plugins/isolation.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/proc.h"
#include "core/http/replay_transport.h"
#include "core/plugins/plugin_loader.h"
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace backhaul::plugins {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path plugin_path(const std::string& name) { return fs::path(TEST_PLUGIN_DIR) / (name + ".so"); }

FetchParams params(std::optional<std::string> cursor = std::nullopt,
                   std::string token = "secret-token") {
  FetchParams p;
  p.unit = {"inst-1", "repo-9", "org/repo", std::move(token)};
  p.entity_type = "item";
  p.cursor = std::move(cursor);
  return p;
}

// True while a process with this PID exists (a reaped worker does not).
bool alive(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// True once the process (a child of this one) has ended and waits to be reaped: all of its
// threads, so its descriptors are closed too. (/proc/PID/stat says 'Z' as soon as the main thread
// has ended, while the others may still hold them.)
bool zombie(pid_t pid) {
  siginfo_t info{};
  return ::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
         info.si_pid == pid;
}

ConnectorFailure failure_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const ConnectorFailure& e) {
    return e;
  }
  ADD_FAILURE() << "expected a ConnectorFailure";
  return ConnectorFailure(BACKHAUL_OK, "", 0);
}

// A fetch_page on another thread; `message` gets what its PluginCrashed says.
std::thread fetch_in_background(WorkerPool& workers, std::string* message) {
  return std::thread([&workers, message] {
    try {
      workers.fetch_page(params());
    } catch (const PluginCrashed& e) {
      *message = e.what();
    }
  });
}

// Kills an idle worker and returns once it has ended, left to its pool to reap.
void kill_idle_worker(pid_t pid) {
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  while (!zombie(pid)) std::this_thread::yield();
}

// The one reason the pool lost a worker for, when it lost exactly one.
std::optional<WorkerLoss> only_loss(const WorkerPool& workers) {
  const WorkerStats stats = workers.stats();
  if (stats.lost_total() != 1) {
    ADD_FAILURE() << stats.lost_total() << " workers lost, not 1";
    return std::nullopt;
  }
  for (size_t r = 0; r < kWorkerLossCount; ++r) {
    if (stats.lost[r] == 1) return static_cast<WorkerLoss>(r);
  }
  return std::nullopt;
}

class IsolatedConnector : public ::testing::Test {
 protected:
  http::ReplayTransport transport_;
  FakeClock clock_{1'700'000'123'456};
  HostServices services_{transport_, clock_};
  Plugin plugin_ = load_plugin(plugin_path("fake"), services_);

  static IsolationOptions options(size_t max_workers = 2) {
    IsolationOptions o;
    o.worker_path = PLUGIN_WORKER;
    o.max_workers = max_workers;
    o.call_timeout = std::chrono::milliseconds(10'000);
    o.log_level = "warn";
    return o;
  }
  std::unique_ptr<WorkerPool> pool(const std::string& config, IsolationOptions o = options()) {
    return std::make_unique<WorkerPool>(plugin_.info(), config, o);
  }
};

// A worker does not inherit the variables the daemon hides (its secrets: the store's connection
// string, the gateway key, the admin token); it inherits the rest. Before, the plugins' code could
// read every secret of the daemon with getenv().
TEST_F(IsolatedConnector, AWorkerDoesNotInheritTheVariablesTheDaemonHides) {
  ::setenv("BACKHAUL_TEST_HIDDEN_SECRET", "s3cret", 1);
  ::setenv("BACKHAUL_TEST_PLAIN", "plain", 1);
  IsolationOptions o = options(1);
  o.hidden_env = {"BACKHAUL_TEST_HIDDEN_SECRET"};
  auto env_seen = [&](const std::string& name) {
    const Connector isolated =
        plugin_.create_isolated(R"({"pages": 1, "per_page": 1, "env": ")" + name + "\"}", o);
    return nlohmann::json::parse(isolated.fetch_page(params()).event(0).payload_json)["env"];
  };
  EXPECT_EQ(env_seen("BACKHAUL_TEST_HIDDEN_SECRET"), nullptr);
  EXPECT_EQ(env_seen("BACKHAUL_TEST_PLAIN"), "plain");
  ::unsetenv("BACKHAUL_TEST_HIDDEN_SECRET");
  ::unsetenv("BACKHAUL_TEST_PLAIN");
}

// The proxy's user:password is the worker's to read, for its transport, and not the plugin's: the
// worker takes the variable out of its environment once read, and wipes it from the process's
// initial environment block too (/proc/self/environ), which unsetenv() leaves as it was.
TEST_F(IsolatedConnector, APluginCannotReadTheProxysCredentials) {
  ::setenv("BACKHAUL_TEST_PROXY_AUTH", "user:s3cret", 1);
  IsolationOptions o = options(1);
  o.proxy_url = "http://127.0.0.1:9";
  o.proxy_credentials_env = "BACKHAUL_TEST_PROXY_AUTH";
  const Connector isolated = plugin_.create_isolated(
      R"({"pages": 1, "per_page": 1, "env": "BACKHAUL_TEST_PROXY_AUTH", "environ_grep": "s3cret"})",
      o);
  const nlohmann::json payload =
      nlohmann::json::parse(isolated.fetch_page(params()).event(0).payload_json);
  EXPECT_EQ(payload["env"], nullptr);
  EXPECT_EQ(payload["environ_has"], false) << "the password is in /proc/self/environ";
  ::unsetenv("BACKHAUL_TEST_PROXY_AUTH");
}

TEST_F(IsolatedConnector, ServesTheSamePagesAsTheConnectorInThisProcess) {
  const std::string config = R"({"pages": 3, "per_page": 2, "rate_limit_remaining": 7})";
  const Connector here = plugin_.create(config);
  const Connector isolated = plugin_.create_isolated(config, options());
  std::optional<std::string> cursor;
  int pages = 0;
  do {
    const Page a = here.fetch_page(params(cursor));
    const Page b = isolated.fetch_page(params(cursor));
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a.event(i).delivery_id, b.event(i).delivery_id);
      EXPECT_EQ(a.event(i).event_type, b.event(i).event_type);
      nlohmann::json pa = nlohmann::json::parse(a.event(i).payload_json);
      nlohmann::json pb = nlohmann::json::parse(b.event(i).payload_json);
      // The worker's plugin reads the worker's clock, the system's; the rest is the same.
      EXPECT_EQ(pa["now_ms"], 1'700'000'123'456);
      EXPECT_GT(pb["now_ms"].get<int64_t>(), 1'700'000'123'456);
      pa.erase("now_ms");
      pb.erase("now_ms");
      EXPECT_EQ(pa, pb);
    }
    EXPECT_EQ(a.next_cursor(), b.next_cursor());
    EXPECT_EQ(a.raw_count(), b.raw_count());
    ASSERT_TRUE(b.rate_limit());
    EXPECT_EQ(b.rate_limit()->remaining, 7);
    EXPECT_EQ(b.rate_limit()->limit, 5000);
    EXPECT_EQ(b.rate_limit()->reset_at_unix_ms, 1234000);
    cursor = b.next_cursor() ? std::optional<std::string>(*b.next_cursor()) : std::nullopt;
    ++pages;
  } while (cursor);
  EXPECT_EQ(pages, 3);
}

TEST_F(IsolatedConnector, APluginFailureComesBackWithItsOwnStatusAndKeepsTheWorker) {
  auto workers = pool(R"({"fail": "rate_limited"})");
  const std::vector<pid_t> before = workers->idle_pids();
  ASSERT_EQ(before.size(), 1u);
  ConnectorFailure e = failure_of([&] { workers->fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_STREQ(e.what(), "slow down");
  EXPECT_EQ(e.retry_after_ms(), 5000);
  EXPECT_EQ(workers->idle_pids(), before);
  EXPECT_EQ(workers->stats().lost_total(), 0u) << "the plugin's own failure ends no worker";

  e = failure_of([&] { pool(R"({"fail": "fatal"})")->fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_FATAL);
  EXPECT_STREQ(e.what(), "repository is gone");
}

TEST_F(IsolatedConnector, AnAbortInAPluginCostsTheCallNotTheCallerAndTheNextCallGetsANewWorker) {
  auto workers = pool(R"({"pages": 3, "crash_on_page": 2})");
  EXPECT_EQ(workers->fetch_page(params())->events.size(), 2u);
  const pid_t first = workers->idle_pids().at(0);

  const ConnectorFailure e = failure_of([&] { workers->fetch_page(params("2")); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr("plugin 'fake': worker process " + std::to_string(first) +
                                  " ended during fetch_page: it was killed by SIGABRT"));
  EXPECT_EQ(workers->live(), 0u);
  EXPECT_FALSE(alive(first));
  EXPECT_EQ(only_loss(*workers), WorkerLoss::kCrashed);

  EXPECT_EQ(workers->fetch_page(params("3"))->events.size(), 2u);
  ASSERT_EQ(workers->idle_pids().size(), 1u);
  EXPECT_NE(workers->idle_pids()[0], first);
}

// True once `pid` has ended (gone, or a zombie left to whoever reaps it), within 10 s.
bool ends(pid_t pid) {
  for (int i = 0; i < 1000; ++i) {
    if (!alive(pid) || zombie(pid)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The PID the fake plugin's fork_sleeper wrote to `file`; 0 before it has.
pid_t pid_in(const fs::path& file) {
  std::ifstream in(file);
  pid_t pid = 0;
  in >> pid;
  return pid;
}

// A plugin's own processes (a helper it started, say) end with its worker: its process group is
// killed when the worker is reaped, whether it crashed, hung or was interrupted.
TEST_F(IsolatedConnector, WhatAPluginStartedEndsWithItsWorker) {
  const fs::path pid_file =
      fs::temp_directory_path() / ("backhaul-sleeper-" + std::to_string(::getpid()));
  auto sleeper = [&] { return pid_in(pid_file); };
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::milliseconds(300);
  for (const char* fail : {"abort", "hang"}) {
    fs::remove(pid_file);
    auto workers = pool(std::string(R"({"fail": ")") + fail + R"(", "fork_sleeper": ")" +
                            pid_file.string() + R"("})",
                        o);
    EXPECT_EQ(failure_of([&] { workers->fetch_page(params()); }).status(), BACKHAUL_RETRYABLE);
    const pid_t pid = sleeper();
    ASSERT_GT(pid, 0) << fail;
    EXPECT_TRUE(ends(pid)) << fail << ": the plugin's process " << pid << " outlived its worker";
    if (alive(pid)) ::kill(pid, SIGKILL);
  }
  fs::remove(pid_file);
}

// Review: every kill went to the worker's process group. A plugin that moved its worker into
// another group (setpgid) escaped the call timeout, and the wait for its end never ended. The
// worker itself is killed too.
TEST_F(IsolatedConnector, AWorkerThatLeftItsGroupIsStillKilledAtTheCallTimeout) {
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::milliseconds(300);
  auto workers = pool(R"({"fail": "leave_group"})", o);
  const ConnectorFailure e = failure_of([&] { workers->fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr("300 ms")) << "ended by the call timeout";
}

// A worker keeps none of the daemon's descriptors but its socket (and the sealed files): not even
// one another thread opened without close-on-exec, or has not marked yet (a socket still
// connecting, say), which the plugin could read and keep open. The worker closes them as it
// starts, before it loads the plugin.
TEST_F(IsolatedConnector, AWorkerInheritsNoDescriptorLeftOpenOnExec) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);  // no O_CLOEXEC
  const std::string pipe_link = fs::read_symlink("/proc/self/fd/" + std::to_string(pipe_fds[0]));
  auto workers = pool("{}", options(1));
  const pid_t pid = workers->idle_pids().at(0);
  std::vector<std::string> inherited;
  for (const auto& entry : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(entry.path(), ec);
    if (!ec && target.string() == pipe_link) inherited.push_back(entry.path().filename());
  }
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  EXPECT_TRUE(inherited.empty()) << "the worker has the pipe as descriptor " << inherited.at(0);
  EXPECT_EQ(workers->fetch_page(params())->events.size(), 2u) << "and works";
}

// A process the plugin forked holds the worker's socket open, so the socket reads no
// end-of-file when the worker ends: the pool still sees the worker end at once (its pidfd), and
// the call fails saying how, not at the call timeout. interrupt() ends such a call at once too:
// it kills the worker's process group, the forked process with it.
TEST_F(IsolatedConnector, AWorkerIsSeenToEndThoughAProcessItForkedHoldsItsSocket) {
  const fs::path pid_file =
      fs::temp_directory_path() / ("backhaul-holder-" + std::to_string(::getpid()));
  auto sleeper = [&] { return pid_in(pid_file); };
  const std::string forks = R"(", "fork_sleeper": ")" + pid_file.string() + R"("})";
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::seconds(60);

  fs::remove(pid_file);
  auto aborts = pool(R"({"fail": "abort)" + forks, o);
  auto before = std::chrono::steady_clock::now();
  const ConnectorFailure e = failure_of([&] { aborts->fetch_page(params()); });
  EXPECT_LT(std::chrono::steady_clock::now() - before, o.call_timeout / 2);
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr(" ended during fetch_page: it was killed by SIGABRT"));
  EXPECT_EQ(only_loss(*aborts), WorkerLoss::kCrashed);
  EXPECT_TRUE(ends(sleeper())) << "the forked process outlived its worker";

  fs::remove(pid_file);
  auto hangs = pool(R"({"fail": "hang)" + forks, o);
  std::string message;
  std::thread caller = fetch_in_background(*hangs, &message);
  while (sleeper() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  before = std::chrono::steady_clock::now();
  EXPECT_EQ(hangs->interrupt(), 1u);
  caller.join();
  EXPECT_LT(std::chrono::steady_clock::now() - before, o.call_timeout / 2);
  EXPECT_THAT(message, HasSubstr("was stopped during fetch_page: the daemon could not wait for it "
                                 "any longer"));
  EXPECT_TRUE(ends(sleeper())) << "the forked process outlived its worker";
  fs::remove(pid_file);
}

// A worker that writes a frame length of almost 1 GiB and then nothing costs this process no
// memory for it: the body grows as its bytes come. The call fails at its timeout.
TEST_F(IsolatedConnector, AFrameLengthWithoutItsBytesCostsNoMemory) {
  auto peak_kb = [] {  // VmHWM: this process's peak resident set
    std::ifstream status("/proc/self/status");
    std::string key;
    int64_t kb = 0;
    while (status >> key && key != "VmHWM:") status.ignore(1 << 20, '\n');
    status >> kb;
    return kb;
  };
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::milliseconds(500);
  auto workers = pool(R"({"fail": "garble"})", o);
  const int64_t before_kb = peak_kb();
  ASSERT_GT(before_kb, 0);
  const ConnectorFailure e = failure_of([&] { workers->fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr("did not answer fetch_page within 500 ms"));
  EXPECT_LT(peak_kb() - before_kb, 256 * 1024) << "KiB more at the peak";
  EXPECT_EQ(only_loss(*workers), WorkerLoss::kTimedOut);
}

// With a memory limit, an answer bigger than the limit is no page the worker held: it is refused
// at its length, before any of it is read in here (this process has no limit of its own, and
// took up to 1 GiB per call).
TEST_F(IsolatedConnector, AnAnswerLongerThanTheMemoryLimitIsRefusedAtItsLength) {
  IsolationOptions o = options(1);
  o.memory_limit_mb = 64;
  o.call_timeout = std::chrono::seconds(60);
  auto workers = pool(R"({"fail": "garble"})", o);
  const pid_t pid = workers->idle_pids().at(0);
  const ConnectorFailure e = failure_of([&] { workers->fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr("worker process " + std::to_string(pid) +
                                  " answered fetch_page with an oversized frame (over 64 MiB, its "
                                  "memory limit) and was killed"));
  EXPECT_FALSE(alive(pid));
  EXPECT_EQ(only_loss(*workers), WorkerLoss::kMalformed);
}

// interrupt() also ends the calls waiting for a worker (every worker of the pool is busy): each
// fails at once, saying so, and starts no worker.
TEST_F(IsolatedConnector, InterruptEndsTheCallsWaitingForAWorker) {
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::seconds(60);
  auto workers = pool(R"({"fail": "hang"})", o);
  std::string running, waiting;
  std::thread first = fetch_in_background(*workers, &running);
  while (workers->stats().busy == 0) std::this_thread::yield();
  std::thread second = fetch_in_background(*workers, &waiting);
  while (workers->waiting() == 0) std::this_thread::yield();
  const auto before = std::chrono::steady_clock::now();
  EXPECT_EQ(workers->interrupt(), 1u);
  first.join();
  second.join();
  EXPECT_LT(std::chrono::steady_clock::now() - before, o.call_timeout / 2);
  EXPECT_THAT(running, HasSubstr("was stopped during fetch_page"));
  EXPECT_EQ(waiting,
            "plugin 'fake': a call waiting for a worker was stopped: the daemon could not "
            "wait for it any longer");
  EXPECT_EQ(workers->live(), 0u);
  EXPECT_EQ(workers->waiting(), 0u);
  EXPECT_TRUE(child_pids(::getpid()).empty()) << "a worker started after the interrupt";
  EXPECT_EQ(only_loss(*workers), WorkerLoss::kStopped);
}

TEST_F(IsolatedConnector, AnExitInAPluginIsReportedWithItsStatus) {
  auto workers = pool(R"({"fail": "exit"})");
  const ConnectorFailure e = failure_of([&] { workers->fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr("ended during fetch_page: it exited with status 3"));
}

// A worker that takes nothing from its socket (here, still in an init() that never returns) holds
// the sender no longer than the call timeout, however large the request: the send has the call's
// deadline too. Before, a config larger than the socket's buffer blocked the sending thread for
// ever (the admin API's validate-config, or a pool starting a worker, say).
TEST_F(IsolatedConnector, ARequestTheWorkerDoesNotTakeEndsAtTheCallTimeout) {
  ASSERT_EQ(std::getenv("MISBEHAVING_INIT_WAIT_MS"), nullptr);
  ::setenv("MISBEHAVING_INIT_WAIT_MS", "0", 1);  // loaded here at once, in the worker for ever
  const Plugin waits =
      load_plugin(fs::path(TEST_PLUGIN_DIR) / "init_waits" / "init_waits.so", services_);
  ::unsetenv("MISBEHAVING_INIT_WAIT_MS");
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::milliseconds(300);
  const std::string config = R"({"pad": ")" + std::string(size_t{16} << 20, 'x') + "\"}";
  const ConnectorFailure e = failure_of([&] { waits.create_isolated(config, o); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr(" did not take create within 300 ms"));
  EXPECT_TRUE(child_pids(::getpid()).empty()) << "the worker is reaped";
}

// The worker here ends in init(), before it has read the request, while a process it forked holds
// its socket: the send is not left to wait for room the worker will never make until the call
// timeout, and the call says the worker ended. Before, the start failed at the timeout, as if the
// worker had hung.
TEST_F(IsolatedConnector, AWorkerThatEndsBeforeTakingARequestIsSeenToEndThoughItsChildHoldsIt) {
  ASSERT_EQ(std::getenv("MISBEHAVING_INIT_WAIT_MS"), nullptr);
  ::setenv("MISBEHAVING_INIT_WAIT_MS", "0", 1);
  const Plugin ends_in_init =
      load_plugin(fs::path(TEST_PLUGIN_DIR) / "init_waits" / "init_waits.so", services_);
  const fs::path pid_file =
      fs::temp_directory_path() / ("backhaul-init-child-" + std::to_string(::getpid()));
  fs::remove(pid_file);
  ::setenv("MISBEHAVING_INIT_WAIT_MS", "300", 1);  // in the worker: fork, wait, _exit(5)
  ::setenv("MISBEHAVING_INIT_FORKS_TO", pid_file.c_str(), 1);
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::seconds(30);
  const std::string config = R"({"pad": ")" + std::string(size_t{16} << 20, 'x') + "\"}";
  const auto before = std::chrono::steady_clock::now();
  const ConnectorFailure e = failure_of([&] { ends_in_init.create_isolated(config, o); });
  ::unsetenv("MISBEHAVING_INIT_WAIT_MS");
  ::unsetenv("MISBEHAVING_INIT_FORKS_TO");
  EXPECT_LT(std::chrono::steady_clock::now() - before, o.call_timeout / 2);
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr(" ended before it took create while starting: it exited with "
                                  "status 5"));
  const pid_t child = pid_in(pid_file);
  EXPECT_GT(child, 0) << "init() forked";
  EXPECT_TRUE(child <= 0 || ends(child)) << "the forked process outlived its worker";
  EXPECT_TRUE(child_pids(::getpid()).empty()) << "the worker is reaped";
  fs::remove(pid_file);
}

// An interrupt() that comes after a call has counted the worker it starts, but before that worker
// is spawned (so before interrupt() can see it), kills it all the same once spawned: the call fails
// at once, saying the daemon stopped it. Before, the worker was missed, and the call ran on.
TEST_F(IsolatedConnector, AnInterruptWhileAWorkerIsSpawnedForACallKillsItToo) {
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::seconds(5);
  std::atomic<WorkerPool*> interrupt_at_spawn{nullptr};
  std::atomic<size_t> killed_at_spawn{99};
  o.on_spawn = [&](pid_t) {
    if (WorkerPool* workers = interrupt_at_spawn.load()) killed_at_spawn = workers->interrupt();
  };
  auto workers = pool(R"({"fail": "hang"})", o);
  kill_idle_worker(workers->idle_pids().at(0));
  interrupt_at_spawn = workers.get();
  const auto before = std::chrono::steady_clock::now();
  const ConnectorFailure e = failure_of([&] { workers->fetch_page(params()); });
  interrupt_at_spawn = nullptr;
  EXPECT_LT(std::chrono::steady_clock::now() - before, o.call_timeout / 2);
  EXPECT_EQ(killed_at_spawn, 0u) << "interrupt() itself saw no worker";
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr("was stopped while starting: the daemon could not wait for it "
                                  "any longer"));
  EXPECT_EQ(workers->live(), 0u);
  const WorkerStats lost = workers->stats();
  EXPECT_EQ(lost.lost[static_cast<size_t>(WorkerLoss::kDiedIdle)], 1u) << "the one killed above";
  EXPECT_EQ(lost.lost[static_cast<size_t>(WorkerLoss::kStopped)], 1u);
  EXPECT_TRUE(child_pids(::getpid()).empty()) << "the worker is reaped";
}

TEST_F(IsolatedConnector, ACallThatDoesNotReturnIsKilledAtTheCallTimeout) {
  IsolationOptions o = options();
  o.call_timeout = std::chrono::milliseconds(300);
  auto workers = pool(R"({"fail": "hang"})", o);
  const pid_t pid = workers->idle_pids().at(0);
  const ConnectorFailure e = failure_of([&] { workers->fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr("worker process " + std::to_string(pid) +
                                  " did not answer fetch_page within 300 ms and was killed"));
  EXPECT_FALSE(alive(pid));
  EXPECT_EQ(workers->live(), 0u);
  EXPECT_EQ(only_loss(*workers), WorkerLoss::kTimedOut);
}

// For a stop that cannot wait any longer: the workers running a call are killed, and each call
// says the daemon stopped it; idle workers are left alone.
TEST_F(IsolatedConnector, InterruptKillsTheWorkersRunningACallAndTheirCallsSaySo) {
  IsolationOptions o = options(2);
  o.call_timeout = std::chrono::milliseconds(120'000);
  auto workers = pool(R"({"fail": "hang"})", o);
  EXPECT_EQ(workers->interrupt(), 0u) << "no call under way";
  std::string message;
  std::thread caller = fetch_in_background(*workers, &message);
  while (workers->stats().busy == 0) std::this_thread::yield();
  const pid_t busy = workers->idle_pids().empty() ? 0 : workers->idle_pids()[0];
  EXPECT_EQ(busy, 0) << "the pool's one worker runs the call";
  EXPECT_EQ(workers->interrupt(), 1u);
  caller.join();
  EXPECT_THAT(message, HasSubstr("was stopped during fetch_page: the daemon could not wait for it "
                                 "any longer"));
  EXPECT_EQ(workers->stats().busy, 0u);
  EXPECT_EQ(only_loss(*workers), WorkerLoss::kStopped);
  EXPECT_EQ(workers->live(), 0u);
}

// A stop may come while a call waits for a new worker whose plugin is still starting (its init()
// or create() stuck on the network, say): that worker is killed too, not left to the call timeout.
TEST_F(IsolatedConnector, InterruptKillsAWorkerStillStartingForACall) {
  const fs::path marker =
      fs::temp_directory_path() / ("backhaul-hang-in-create-" + std::to_string(::getpid()));
  fs::remove(marker);
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::milliseconds(15'000);  // not reached: the caller's end comes first
  auto workers = pool(R"({"hang_in_create_if": ")" + marker.string() + R"("})", o);
  const pid_t first = workers->idle_pids().at(0);
  std::ofstream(marker) << "hang";
  kill_idle_worker(first);

  std::string message;
  std::thread caller = fetch_in_background(*workers, &message);
  // The call has reaped the worker killed above and counted the one it starts: an interrupt
  // before that (during the reap) stops the call before any worker is started.
  const auto losses = [&](WorkerLoss loss) {
    return workers->stats().lost[static_cast<size_t>(loss)];
  };
  const auto until = [](const std::function<bool()>& done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!done() && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return done();
  };
  ASSERT_TRUE(until([&] { return losses(WorkerLoss::kDiedIdle) == 1 && workers->live() == 1; }));
  // Then interrupts until one reaches it. One that lands while it is being spawned returns 0 and
  // still stops it once spawned (the interrupt generation); one that finds it busy returns 1.
  size_t killed = 0;
  EXPECT_TRUE(until([&] {
    if (losses(WorkerLoss::kStopped) > 0) return true;
    killed += workers->interrupt();
    return killed > 0;
  }));
  EXPECT_TRUE(until([&] { return losses(WorkerLoss::kStopped) > 0; }))
      << "the worker starting for the call";
  caller.join();
  EXPECT_THAT(message, HasSubstr("was stopped while starting: the daemon could not wait for it "
                                 "any longer"));
  EXPECT_EQ(workers->live(), 0u);
  const WorkerStats lost = workers->stats();
  EXPECT_EQ(lost.lost[static_cast<size_t>(WorkerLoss::kDiedIdle)], 1u) << "the one killed above";
  EXPECT_EQ(lost.lost[static_cast<size_t>(WorkerLoss::kStopped)], 1u);
  EXPECT_EQ(lost.lost_total(), 2u);
  EXPECT_EQ(workers->stats().busy, 0u);

  fs::remove(marker);
  EXPECT_EQ(workers->fetch_page(params())->events.size(), 2u) << "the next call starts a worker";
}

TEST_F(IsolatedConnector, AWorkerThatOutgrowsTheMemoryLimitIsKilledAndTheCallFailsRetryable) {
  IsolationOptions o = options(1);
  o.memory_limit_mb = 256;
  EXPECT_EQ(pool("{}", o)->fetch_page(params())->events.size(), 2u) << "a call within the limit";

  auto workers = pool(R"({"grow_mb": 512})", o);
  const pid_t pid = workers->idle_pids().at(0);
  const ConnectorFailure e = failure_of([&] { workers->fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(),
              HasSubstr("plugin 'fake': worker process " + std::to_string(pid) + " used "));
  EXPECT_THAT(e.what(),
              HasSubstr(" MB during fetch_page, over the memory limit of 256 MB, and was killed"));
  EXPECT_FALSE(alive(pid));
  EXPECT_EQ(workers->live(), 0u);
  EXPECT_EQ(only_loss(*workers), WorkerLoss::kMemory);
}

// A worker that grew past the limit between calls (its plugin's own thread allocated) is replaced
// when a call would take it, and the call runs in the new one. Before, it went on serving calls
// over the limit for as long as each answered before the watch's first look (10 ms).
TEST_F(IsolatedConnector, AnIdleWorkerOverTheMemoryLimitIsReplacedBeforeItGetsACall) {
  IsolationOptions o = options(1);
  o.memory_limit_mb = 256;
  auto workers = pool(R"({"grow_later_mb": 384})", o);
  EXPECT_EQ(workers->fetch_page(params())->events.size(), 2u);
  const pid_t grown = workers->idle_pids().at(0);
  for (int i = 0; i < 1000 && resident_kb(grown) <= 256 * 1024; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GT(resident_kb(grown), 256 * 1024) << "the plugin's thread did not grow its worker";

  EXPECT_EQ(workers->fetch_page(params())->events.size(), 2u) << "the call did not fail";
  EXPECT_FALSE(alive(grown));
  ASSERT_EQ(workers->idle_pids().size(), 1u);
  EXPECT_NE(workers->idle_pids()[0], grown);
  EXPECT_EQ(only_loss(*workers), WorkerLoss::kMemory);
}

TEST_F(IsolatedConnector, WhatAPluginPrintsToStdoutDoesNotCorruptTheAnswers) {
  auto workers = pool(R"({"fail": "stdout", "pages": 2})");
  const auto page = workers->fetch_page(params());
  ASSERT_EQ(page->events.size(), 2u);
  EXPECT_EQ(std::string_view(page->page.next_cursor.data, page->page.next_cursor.size), "2");
}

TEST_F(IsolatedConnector, ValidateScopesRunsInTheWorker) {
  auto workers = pool("{}");
  workers->validate_scopes(params().unit);
  const ConnectorFailure e =
      failure_of([&] { workers->validate_scopes(params(std::nullopt, "bad-token").unit); });
  EXPECT_EQ(e.status(), BACKHAUL_FATAL);
  EXPECT_STREQ(e.what(), "token cannot read resource");
  EXPECT_EQ(workers->idle_pids().size(), 1u);
}

TEST_F(IsolatedConnector, ABadConfigIsRefusedAtCreateWithThePluginsMessage) {
  const ConnectorFailure e =
      failure_of([&] { plugin_.create_isolated(R"({"pages": 0})", options()); });
  EXPECT_EQ(e.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_STREQ(e.what(), "config.pages must be >= 1");
}

TEST_F(IsolatedConnector, AWorkerThatCannotStartIsAClearError) {
  IsolationOptions o = options();
  o.worker_path = "/nonexistent/backhaul-plugin-worker";
  const ConnectorFailure e = failure_of([&] { plugin_.create_isolated("{}", o); });
  EXPECT_EQ(e.status(), BACKHAUL_FATAL);
  EXPECT_STREQ(e.what(),
               "plugin 'fake': cannot start the worker /nonexistent/backhaul-plugin-worker: No "
               "such file or directory");
}

TEST_F(IsolatedConnector, AWorkerRefusesAPluginFileThatChangedSinceTheDaemonLoadedIt) {
  const fs::path dir =
      fs::temp_directory_path() / ("backhaul-isolation-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path copy = dir / "fake.so";
  fs::copy_file(plugin_path("fake"), copy, fs::copy_options::overwrite_existing);
  const Plugin loaded = load_plugin(copy, services_);
  fs::copy_file(plugin_path("c_current"), copy, fs::copy_options::overwrite_existing);
  std::string message;
  try {
    loaded.create_isolated("{}", options());
  } catch (const ConnectorFailure& e) {
    EXPECT_EQ(e.status(), BACKHAUL_FATAL);
    message = e.what();
  }
  fs::remove_all(dir);
  EXPECT_THAT(message, HasSubstr("a worker process could not load the files the daemon loaded: "));
  EXPECT_THAT(message, HasSubstr("is not in the plugin allow-list"));
}

TEST_F(IsolatedConnector, ManyThreadsShareAtMostMaxWorkersAndEachGetsItsOwnAnswer) {
  auto workers = pool(R"({"pages": 5, "per_page": 3})", options(3));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        const int page = 1 + (t + i) % 5;
        const auto got = workers->fetch_page(params(std::to_string(page)));
        const std::string first(got->events.at(0).delivery_id.data,
                                got->events.at(0).delivery_id.size);
        if (first != "fake-inst-1-repo-9-item-" + std::to_string((page - 1) * 3 + 1)) ++wrong;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(workers->live(), 3u);
  EXPECT_GE(workers->live(), 1u);
  EXPECT_EQ(workers->idle_pids().size(), workers->live());
  const WorkerStats stats = workers->stats();
  EXPECT_EQ(stats.busy, 0u);
  EXPECT_EQ(stats.idle, workers->live());
  EXPECT_EQ(stats.lost_total(), 0u);
}

TEST_F(IsolatedConnector, AnIdleWorkerThatDiedIsReplacedWithoutFailingACall) {
  auto workers = pool("{}");
  const pid_t pid = workers->idle_pids().at(0);
  kill_idle_worker(pid);
  EXPECT_EQ(workers->fetch_page(params())->events.size(), 2u);
  ASSERT_EQ(workers->idle_pids().size(), 1u);
  EXPECT_NE(workers->idle_pids()[0], pid);
  EXPECT_EQ(only_loss(*workers), WorkerLoss::kDiedIdle);
}

// A worker that dies while it starts (in the plugin's init() or create()) is a crash like any
// other, RETRYABLE, and not taken for a refused config: the next call may start one that lives.
TEST_F(IsolatedConnector, AWorkerThatCrashesWhileStartingFailsTheCallRetryable) {
  const fs::path marker =
      fs::temp_directory_path() / ("backhaul-abort-in-create-" + std::to_string(::getpid()));
  fs::remove(marker);
  auto workers = pool(R"({"abort_in_create_if": ")" + marker.string() + R"("})", options(1));
  const pid_t pid = workers->idle_pids().at(0);
  std::ofstream(marker) << "abort";
  kill_idle_worker(pid);

  const ConnectorFailure e = failure_of([&] { workers->fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr(" ended during create while starting: it was killed by SIGABRT"));
  EXPECT_EQ(workers->live(), 0u);
  const WorkerStats lost = workers->stats();
  EXPECT_EQ(lost.lost[static_cast<size_t>(WorkerLoss::kDiedIdle)], 1u) << "the one killed above";
  EXPECT_EQ(lost.lost[static_cast<size_t>(WorkerLoss::kCrashed)], 1u) << "the one that started";
  EXPECT_EQ(lost.lost_total(), 2u);

  fs::remove(marker);
  EXPECT_EQ(workers->fetch_page(params())->events.size(), 2u);
}

// A first worker that crashes while starting fails the connector's making, unless deferred: then
// the connector is made with no worker, its calls fail RETRYABLE while starts crash, and the first
// start that lives serves them. A refused config is no crash and fails the making either way.
TEST_F(IsolatedConnector, AFirstWorkerThatCrashesWhileStartingCanBeLeftToTheCalls) {
  const fs::path marker =
      fs::temp_directory_path() / ("backhaul-abort-in-first-" + std::to_string(::getpid()));
  std::ofstream(marker) << "abort";
  const std::string config = R"({"abort_in_create_if": ")" + marker.string() + R"("})";

  try {
    plugin_.create_isolated(config, options(1));
    ADD_FAILURE() << "made a connector whose only worker crashed";
  } catch (const PluginCrashed& e) {
    EXPECT_THAT(e.what(), HasSubstr(" ended during create while starting: it was killed by "
                                    "SIGABRT"));
  }

  const Connector deferred = plugin_.create_isolated(config, options(1), FirstWorkerCrash::kDefer);
  ASSERT_TRUE(deferred.worker_stats());
  WorkerStats stats = *deferred.worker_stats();
  EXPECT_EQ(stats.busy + stats.idle, 0u);
  EXPECT_EQ(stats.lost[static_cast<size_t>(WorkerLoss::kCrashed)], 1u);
  EXPECT_EQ(stats.lost_total(), 1u);

  const ConnectorFailure e = failure_of([&] { deferred.fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
  EXPECT_THAT(e.what(), HasSubstr(" ended during create while starting: it was killed by SIGABRT"));
  fs::remove(marker);
  EXPECT_EQ(deferred.fetch_page(params()).size(), 2u);
  stats = *deferred.worker_stats();
  EXPECT_EQ(stats.idle, 1u);
  EXPECT_EQ(stats.lost[static_cast<size_t>(WorkerLoss::kCrashed)], 2u);
  EXPECT_EQ(stats.lost_total(), 2u);

  const ConnectorFailure refused = failure_of(
      [&] { plugin_.create_isolated(R"({"pages": 0})", options(1), FirstWorkerCrash::kDefer); });
  EXPECT_EQ(refused.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_STREQ(refused.what(), "config.pages must be >= 1");
}

// A deferred first worker that has not started within start_wait is left to start: the connector
// is made without it, a call meanwhile waits for it (one worker at most here), and it serves once
// started. Destroying a pool whose first worker is still starting kills that worker rather than
// waiting out the call timeout for it.
TEST_F(IsolatedConnector, AFirstWorkerSlowerThanTheStartWaitIsLeftToStart) {
  const fs::path marker =
      fs::temp_directory_path() / ("backhaul-wait-in-first-" + std::to_string(::getpid()));
  std::ofstream(marker) << "wait";
  const std::string config = R"({"hang_in_create_if": ")" + marker.string() + R"("})";
  IsolationOptions o = options(1);
  o.call_timeout = std::chrono::seconds(60);  // what the making would wait without start_wait
  o.start_wait = std::chrono::milliseconds(100);

  const Connector connector = plugin_.create_isolated(config, o, FirstWorkerCrash::kDefer);
  WorkerStats stats = *connector.worker_stats();
  EXPECT_EQ(stats.busy, 1u) << "the first worker, still in create()";
  EXPECT_EQ(stats.idle, 0u);
  const std::vector<pid_t> first = child_pids(::getpid());
  ASSERT_EQ(first.size(), 1u);
  fs::remove(marker);
  EXPECT_EQ(connector.fetch_page(params()).size(), 2u);
  EXPECT_EQ(child_pids(::getpid()), first) << "the call ran in the first worker";
  stats = *connector.worker_stats();
  EXPECT_EQ(stats.idle, 1u);
  EXPECT_EQ(stats.lost_total(), 0u);

  std::ofstream(marker) << "wait";
  auto starting =
      std::make_unique<WorkerPool>(plugin_.info(), config, o, nullptr, FirstWorkerCrash::kDefer);
  std::vector<pid_t> pids = child_pids(::getpid());
  ASSERT_EQ(pids.size(), 2u);
  const pid_t pid = pids[0] == first[0] ? pids[1] : pids[0];
  const auto before = std::chrono::steady_clock::now();
  starting.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - before, o.call_timeout / 2) << "it was killed";
  EXPECT_FALSE(alive(pid));
  fs::remove(marker);
}

TEST_F(IsolatedConnector, DestroyingThePoolEndsItsWorkers) {
  auto workers = pool("{}", options(3));
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) threads.emplace_back([&] { workers->fetch_page(params()); });
  for (auto& thread : threads) thread.join();
  const std::vector<pid_t> pids = workers->idle_pids();
  ASSERT_FALSE(pids.empty());
  workers.reset();
  for (pid_t pid : pids) EXPECT_FALSE(alive(pid)) << pid;
}

// --- load_isolated: no code of the plugin runs in this process --------------------------------

class LoadIsolated : public IsolatedConnector {
 protected:
  static void expect_workers_run_the_loaded_files(
      const std::string& name, const std::function<void(const fs::path&)>& change);
  static IsolationOptions options(
      std::chrono::milliseconds call_timeout = std::chrono::seconds(10)) {
    IsolationOptions o = IsolatedConnector::options();
    o.call_timeout = call_timeout;
    return o;
  }
  // What loading `path` here says, and what loading it in a worker says (PluginLoadError's text).
  std::pair<std::string, std::string> refusals(const fs::path& path) {
    std::pair<std::string, std::string> said;
    try {
      load_plugin(path, services_);
    } catch (const PluginLoadError& e) {
      said.first = e.what();
    }
    try {
      load_isolated(path, options());
    } catch (const PluginLoadError& e) {
      said.second = e.what();
    }
    return said;
  }
};

void expect_same_info(const PluginInfo& here, const PluginInfo& there) {
  EXPECT_EQ(there.id, here.id);
  EXPECT_EQ(there.version, here.version);
  EXPECT_EQ(there.display_name, here.display_name);
  EXPECT_EQ(there.description, here.description);
  EXPECT_EQ(there.entity_types, here.entity_types);
  EXPECT_EQ(there.default_entity_types, here.default_entity_types);
  EXPECT_EQ(there.config_schema_json, here.config_schema_json);
  EXPECT_EQ(there.abi_version.major, here.abi_version.major);
  EXPECT_EQ(there.abi_version.minor, here.abi_version.minor);
  EXPECT_EQ(there.path, here.path);
  EXPECT_EQ(there.sha256, here.sha256);
  ASSERT_EQ(there.bundled_libraries.size(), here.bundled_libraries.size());
  for (size_t i = 0; i < here.bundled_libraries.size(); ++i) {
    EXPECT_EQ(there.bundled_libraries[i].path, here.bundled_libraries[i].path);
    EXPECT_EQ(there.bundled_libraries[i].sha256, here.bundled_libraries[i].sha256);
  }
}

TEST_F(LoadIsolated, DescribesThePluginAsLoadingItHereDoes) {
  const Plugin there = load_isolated(plugin_path("fake"), options());
  EXPECT_TRUE(there.isolated());
  EXPECT_FALSE(plugin_.isolated());
  EXPECT_EQ(there.extension("anything"), nullptr);
  expect_same_info(plugin_.info(), there.info());

  // One that brings a library along, through $ORIGIN: its hash is pinned too.
  const fs::path origin = fs::path(TEST_PLUGIN_DIR) / "origin" / "origin_runpath.so";
  const Plugin origin_there = load_isolated(origin, options());
  const Plugin origin_here = load_plugin(origin, services_);
  ASSERT_EQ(origin_here.info().bundled_libraries.size(), 1u);
  expect_same_info(origin_here.info(), origin_there.info());
  const Connector connector = origin_there.create("{}");
  ASSERT_TRUE(connector.worker_stats());
  EXPECT_EQ(connector.worker_stats()->idle, 1u) << "a worker loaded it, pinned by those hashes";
}

TEST_F(LoadIsolated, ItsInstancesAndItsConfigCheckRunInWorkerProcesses) {
  const Plugin plugin = load_isolated(plugin_path("fake"), options());
  const Connector connector = plugin.create(R"({"pages": 2, "per_page": 3})");
  EXPECT_EQ(connector.info().id, "fake");
  ASSERT_TRUE(connector.worker_stats()) << "create() of an isolated plugin is create_isolated()";
  const Page page = connector.fetch_page(params());
  EXPECT_EQ(page.size(), 3u);
  EXPECT_EQ(page.next_cursor(), "2");

  EXPECT_NO_THROW(plugin.validate_config(R"({"pages": 2})"));
  const ConnectorFailure e = failure_of([&] { plugin.validate_config(R"({"pages": 0})"); });
  EXPECT_EQ(e.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_STREQ(e.what(), "config.pages must be >= 1");
}

// The plugin shares its worker's process, so it can write an answer of its own past the checks
// the worker makes (fake: "forge_*"). This process takes that answer as it takes a plugin's here:
// a wait of INT64_MAX ms is a day (it would overflow the time the job waits to), a status the ABI
// does not define is FATAL, and a page with two different events under one delivery id is
// refused.
TEST_F(LoadIsolated, AnAnswerThePluginForgedIsCheckedAsItsCallsAreHere) {
  const Plugin plugin = load_isolated(plugin_path("fake"), options());
  ConnectorFailure e =
      failure_of([&] { plugin.create(R"({"fail": "forge_wait"})").fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_STREQ(e.what(), "slow down");
  EXPECT_EQ(e.retry_after_ms(), 24LL * 60 * 60 * 1000);

  e = failure_of([&] { plugin.create(R"({"fail": "forge_status"})").fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_FATAL);
  EXPECT_STREQ(e.what(), "a worker process answered with unknown status 77: odd");

  e = failure_of([&] { plugin.create(R"({"fail": "forge_page"})").fetch_page(params()); });
  EXPECT_EQ(e.status(), BACKHAUL_FATAL);
  EXPECT_STREQ(e.what(),
               "plugin 'fake' returned a malformed page: event 1: delivery id \"same-id\" is also "
               "an earlier, different event's");
}

// Review: the answer describing what a worker loaded may be the plugin's own (it runs in that
// process and can write to the socket first), and was taken as given: an id, a schema or a list
// of bundled libraries the loader would refuse here. It is checked as a loaded descriptor is.
TEST_F(LoadIsolated, ADescriptionThePluginForgedIsCheckedAsALoadedOneIs) {
  const std::string sha256 = seal_file(plugin_path("fake")).sha256;
  ::setenv("FAKE_FORGE_DESCRIBE", sha256.c_str(), 1);
  const auto refusal = [&](const char* id, const char* bundled) {
    if (id) ::setenv("FAKE_FORGE_ID", id, 1);
    if (bundled) ::setenv("FAKE_FORGE_BUNDLED", bundled, 1);
    std::string why = "loaded";
    try {
      load_isolated(plugin_path("fake"), options());
    } catch (const PluginLoadError& e) {
      why = e.what();
    }
    ::unsetenv("FAKE_FORGE_ID");
    ::unsetenv("FAKE_FORGE_BUNDLED");
    return why;
  };
  EXPECT_THAT(refusal(nullptr, nullptr),
              HasSubstr("fake.so: plugin id 'Not An Id' does not match [a-z][a-z0-9_-]*"));
  EXPECT_THAT(refusal("forged", "65"),
              HasSubstr("the worker's answer lists 65 bundled libraries; at most 64"));
  ::unsetenv("FAKE_FORGE_DESCRIBE");
  // Without it, the plugin loads as ever.
  EXPECT_EQ(load_isolated(plugin_path("fake"), options()).info().id, "fake");
}

TEST_F(LoadIsolated, RefusesWhatLoadingItHereRefusesWithTheSameReason) {
  for (const char* name : {"bad_magic", "newer_major", "init_fails", "bad_id", "init_throws",
                           "no_entry", "bad_utf8_name"}) {
    const auto [here, there] = refusals(plugin_path(name));
    EXPECT_FALSE(here.empty()) << name;
    EXPECT_EQ(there, here) << name;
  }
  const auto [here, there] = refusals(plugin_path("no_such_plugin"));
  EXPECT_THAT(there, HasSubstr("no_such_plugin.so: file does not exist"));
}

TEST_F(LoadIsolated, TheAllowListIsCheckedInTheWorker) {
  LoadOptions pinned;
  pinned.allowed_sha256 = {std::string(64, '0')};
  try {
    load_isolated(plugin_path("fake"), options(), pinned);
    ADD_FAILURE() << "loaded a plugin the allow-list does not name";
  } catch (const PluginLoadError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("sha256 " + plugin_.info().sha256 + " is not in the plugin allow-list"));
  }
  pinned.allowed_sha256 = {plugin_.info().sha256};
  EXPECT_EQ(load_isolated(plugin_path("fake"), options(), pinned).info().id, "fake");
}

// In this process, such a plugin would end the process (a daemon, at start-up).
TEST_F(LoadIsolated, APluginThatCrashesWhileLoadingIsRefusedAndThisProcessGoesOn) {
  const fs::path path = fs::path(TEST_PLUGIN_DIR) / "init_aborts" / "init_aborts.so";
  try {
    load_isolated(path, options());
    ADD_FAILURE() << "loaded a plugin whose init() aborts";
  } catch (const PluginLoadError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path.string() + ": in isolation mode, worker process "));
    EXPECT_THAT(e.what(), HasSubstr(" ended during load: it was killed by SIGABRT"));
  }
  EXPECT_TRUE(child_pids(::getpid()).empty()) << "the worker is reaped";
}

TEST_F(LoadIsolated, APluginThatHangsWhileLoadingIsKilledAtTheCallTimeout) {
  ASSERT_EQ(std::getenv("MISBEHAVING_INIT_WAIT_MS"), nullptr) << "its init() must wait for ever";
  const fs::path path = fs::path(TEST_PLUGIN_DIR) / "init_waits" / "init_waits.so";
  try {
    load_isolated(path, options(std::chrono::milliseconds(300)));
    ADD_FAILURE() << "loaded a plugin whose init() never returns";
  } catch (const PluginLoadError& e) {
    EXPECT_THAT(e.what(), HasSubstr(" did not answer load within 300 ms and was killed"));
  }
  EXPECT_TRUE(child_pids(::getpid()).empty()) << "the worker is reaped";
}

TEST_F(LoadIsolated, ARegistryInIsolationModeReportsWhatItSkipsAndLoadsTheRest) {
  const fs::path dir =
      fs::temp_directory_path() / ("backhaul-load-isolated-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(plugin_path("fake"), dir / "a_fake.so");
  fs::copy_file(plugin_path("fake_dup"), dir / "b_fake_dup.so");
  fs::copy_file(fs::path(TEST_PLUGIN_DIR) / "init_aborts" / "init_aborts.so", dir / "c_aborts.so");
  PluginRegistry registry(services_);
  registry.set_isolation(options());
  const std::vector<LoadProblem> problems = registry.load_directory(dir);
  fs::remove_all(dir);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0].path, dir / "b_fake_dup.so");
  EXPECT_EQ(problems[0].reason, "duplicate plugin id 'fake' (already loaded from " +
                                    (dir / "a_fake.so").string() + ")");
  EXPECT_EQ(problems[1].path, dir / "c_aborts.so");
  EXPECT_THAT(problems[1].reason, HasSubstr("it was killed by SIGABRT"));
  ASSERT_EQ(registry.plugins().size(), 1u);
  EXPECT_TRUE(registry.plugins()[0].isolated());
}

// The files of a directory load in worker processes at once: the two rendezvous plugins each wait
// in init() for the other to get there, and fail alone after 20 s, as one load after the other has
// them do.
TEST_F(LoadIsolated, ARegistryLoadsTheFilesOfADirectoryInWorkersAtOnce) {
  const fs::path meeting =
      fs::temp_directory_path() / ("backhaul-rendezvous-" + std::to_string(::getpid()));
  fs::remove_all(meeting);
  fs::create_directories(meeting);
  ASSERT_EQ(::setenv("MISBEHAVING_RENDEZVOUS_DIR", meeting.c_str(), 1), 0);  // workers inherit it
  PluginRegistry registry(services_);
  registry.set_isolation(options(std::chrono::seconds(30)));
  const std::vector<LoadProblem> problems =
      registry.load_directory(fs::path(TEST_PLUGIN_DIR) / "rendezvous");
  ::unsetenv("MISBEHAVING_RENDEZVOUS_DIR");
  fs::remove_all(meeting);
  for (const LoadProblem& problem : problems)
    ADD_FAILURE() << problem.path << ": " << problem.reason;
  std::vector<std::string> ids;
  for (const Plugin& plugin : registry.plugins()) ids.push_back(plugin.info().id);
  EXPECT_EQ(ids, (std::vector<std::string>{"rendezvousa", "rendezvousb"}));
}

// Loads copies of the fake and of a plugin that bundles a library, from a directory of their
// own, in workers; lets `change` do what it does to the files; then checks that new workers still
// run what the load checked (the daemon's sealed copies).
void LoadIsolated::expect_workers_run_the_loaded_files(
    const std::string& name, const std::function<void(const fs::path&)>& change) {
  const fs::path dir =
      fs::temp_directory_path() / ("backhaul-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path origin_dir = fs::path(TEST_PLUGIN_DIR) / "origin";
  fs::copy_file(plugin_path("fake"), dir / "fake.so");
  fs::copy_file(origin_dir / "origin_runpath.so", dir / "origin_runpath.so");
  fs::copy_file(origin_dir / "libbhtestdep.so", dir / "libbhtestdep.so");
  const Plugin fake = load_isolated(dir / "fake.so", options());
  const Plugin origin = load_isolated(dir / "origin_runpath.so", options());
  ASSERT_EQ(origin.info().bundled_libraries.size(), 1u);

  change(dir);

  const Connector connector = fake.create(R"({"pages": 2})");
  const Page page = connector.fetch_page(params());
  ASSERT_EQ(page.size(), 2u);
  EXPECT_EQ(page.event(0).delivery_id, "fake-inst-1-repo-9-item-1");
  const ConnectorFailure e = failure_of([&] { fake.validate_config(R"({"pages": 0})"); });
  EXPECT_STREQ(e.what(), "config.pages must be >= 1");
  const Connector with_library = origin.create("{}");
  EXPECT_NO_THROW(with_library.fetch_page(params()));
  fs::remove_all(dir);
}

// An upgrade in place (here each file is written over) after the load reaches no worker: they load
// the sealed copies of what the load checked. Before, every new worker refused the new bytes, so
// every call failed FATAL until a restart.
TEST_F(LoadIsolated, ItsWorkersRunWhatTheLoadCheckedAfterItsFilesAreWrittenOver) {
  expect_workers_run_the_loaded_files("sealed", [](const fs::path& dir) {
    fs::copy_file(plugin_path("c_current"), dir / "fake.so", fs::copy_options::overwrite_existing);
    std::ofstream(dir / "libbhtestdep.so", std::ios::trunc) << "not a library any more";
  });
}

// The same when the files are deleted (a package removed while the daemon runs): the workers
// load the sealed copies. They refused the missing path before looking at the copy ("file does
// not exist", FATAL), and a missing bundled library was passed over, so every new worker failed.
TEST_F(LoadIsolated, ItsWorkersRunWhatTheLoadCheckedAfterItsFilesAreDeleted) {
  expect_workers_run_the_loaded_files("sealed-deleted",
                                      [](const fs::path& dir) { fs::remove_all(dir); });
}

// A worker maps the daemon's sealed copy itself (the same inode in /proc/PID/maps) rather than a
// copy of it: one copy of the plugin's code in memory, however many workers run it.
TEST_F(LoadIsolated, AWorkerMapsTheSealedCopyItWasGivenWithoutCopyingItAgain) {
  auto sealed = std::make_shared<SealedFiles>();
  sealed->push_back(seal_file(plugin_path("fake")));
  EXPECT_EQ(sealed->back().sha256, plugin_.info().sha256);
  struct stat copy {};
  ASSERT_EQ(::fstat(sealed->back().fd.get(), &copy), 0);
  WorkerPool workers(plugin_.info(), "{}", options(), sealed);
  const pid_t worker = workers.idle_pids().at(0);

  std::ifstream maps("/proc/" + std::to_string(worker) + "/maps");
  int mapped = 0;
  for (std::string line; std::getline(maps, line);) {
    std::istringstream fields(line);
    std::string range, perms, offset, device;
    unsigned long inode = 0;
    fields >> range >> perms >> offset >> device >> inode;
    mapped += inode == copy.st_ino && line.find("backhaul-plugin:") != std::string::npos;
  }
  EXPECT_GT(mapped, 0) << "the worker did not map the daemon's copy";
  EXPECT_EQ(workers.fetch_page(params())->events.size(), 2u);
}

// A worker executable of another build than the daemon's (replaced by an upgrade while the daemon
// runs) refuses to start, naming both wire versions, rather than talk past the daemon: each answer
// it sent would be taken for a malformed frame, and the worker killed.
TEST(WorkerExecutable, RefusesAnotherWireVersionNamingBoth) {
  const std::string run = std::string(PLUGIN_WORKER) + " --plugin x.so --sha256 00";
  const std::pair<std::string, std::string> cases[] = {
      {" --wire 1", "this worker speaks wire version " + std::to_string(kWorkerWire) +
                        ", the daemon 1: restart the daemon after an upgrade"},
      {"", "the daemon an older one: restart the daemon"},
  };
  for (const auto& [flag, expected] : cases) {
    std::FILE* out = ::popen((run + flag + " 2>&1").c_str(), "r");
    ASSERT_NE(out, nullptr);
    std::string text;
    char buffer[512];
    while (std::fgets(buffer, sizeof buffer, out) != nullptr) text += buffer;
    const int status = ::pclose(out);
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_EQ(WEXITSTATUS(status), 2) << text;
    EXPECT_NE(text.find(expected), std::string::npos) << text;
  }
}

// The worker's own watch: the daemon's end of its socket closes while the plugin is busy (here in
// an init() that never returns). Nobody is left to wait for the plugin, so the worker ends.
TEST_F(LoadIsolated, AWorkerWhoseDaemonGoesAwayWhileItIsBusyEnds) {
  const fs::path marker =
      fs::temp_directory_path() / ("backhaul-orphan-" + std::to_string(::getpid()));
  fs::remove(marker);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  std::string plugin = (fs::path(TEST_PLUGIN_DIR) / "init_waits" / "init_waits.so").string();
  std::string worker = PLUGIN_WORKER, sha256 = "--sha256", any = "", option = "--plugin";
  std::string wire = "--wire", version = std::to_string(kWorkerWire);
  char* argv[] = {worker.data(), option.data(), plugin.data(),  sha256.data(),
                  any.data(),    wire.data(),   version.data(), nullptr};
  std::vector<std::string> env_strings = {"MISBEHAVING_INIT_MARKER=" + marker.string()};
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  std::vector<char*> env;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, pair[1], 3);
  ::posix_spawnattr_init(&attributes);
  ::posix_spawnattr_setpgroup(&attributes, 0);
  ::posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, &attributes, argv, env.data());
  ::posix_spawn_file_actions_destroy(&actions);
  ::posix_spawnattr_destroy(&attributes);
  ::close(pair[1]);
  ASSERT_EQ(rc, 0);
  for (int i = 0; i < 3000 && !fs::exists(marker); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(fs::exists(marker)) << "the plugin's init() did not start";
  ::close(pair[0]);  // as a daemon killed with SIGKILL would

  // It ends on its own, within a few seconds at most (readiness, not timing).
  for (int i = 0; i < 1000 && !zombie(pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(zombie(pid)) << "the worker outlived its daemon's socket";
  if (!zombie(pid)) ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  fs::remove(marker);
}

}  // namespace
}  // namespace backhaul::plugins
