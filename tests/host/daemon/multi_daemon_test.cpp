// Several daemons on one MariaDB (SPEC "what done looks like", D3, D6, D7, D10): three backhauld
// processes, each its own host (lease owner), share one database on the `mariadb` CTest fixture's
// server and the backfills of three installations. One daemon is killed with SIGKILL while it
// holds units; the other two take its jobs back once their leases expire. Checked from outside:
// the runs' views, the sandbox gateway's report, the jobs' attempt histories over the admin API,
// and the store's record of the most jobs ever running at once.
#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/pipeline/pipeline.h"
#include "tests/core/jobs/test_databases.h"
#include "tests/host/daemon/process_fixture.h"
#include <signal.h>
#include <sys/wait.h>

namespace backhaul::daemon::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kInstallations = 3;
constexpr int kRepos = 3;
constexpr int kItems = 400;
constexpr int kPerInstallation = 2;  // entity cap per installation: 3 x 2 > the global cap
constexpr int kGlobal = 5;
constexpr int kWorkers = 4;  // per daemon
constexpr const char* kDsnEnv = "BACKHAUL_MULTI_DAEMON_DSN";

struct Host {
  std::string owner;
  std::unique_ptr<ChildProcess> process;
  uint16_t port = 0;
};

// The value of the series that starts with `series` (name and labels) in /metrics on `port`; -1
// when absent.
double metric_at(uint16_t port, const std::string& series) {
  sandbox::testing::TestClient client(port);
  std::istringstream lines(client.get("/metrics").body);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

class MultiDaemonTest : public ProcessTest {
 protected:
  void SetUp() override {
    ProcessTest::SetUp();
    database_ = jobs::testing::TestDatabase::create(jobs::testing::Backend::kMysql, "daemons");
    const std::string spec = database_->store_spec();
    ASSERT_EQ(spec.rfind("mysql:", 0), 0u) << spec;
    daemon_env_.push_back(std::string(kDsnEnv) + "=" + spec.substr(6));
  }
  void TearDown() override {
    hosts_.clear();  // kills (by PID) what still runs
    ProcessTest::TearDown();
  }

  json host_config(const std::string& owner) const {
    json config = daemon_config();
    config["store"] = {{"backend", "mysql"}, {"connection_env", kDsnEnv}};
    config["scheduler"] = {{"workers", kWorkers}, {"owner", owner},  {"lease_ms", 3000},
                           {"heartbeat_ms", 500}, {"sweep_ms", 500}, {"idle_poll_ms", 50}};
    config["pipeline"]["entity_caps"] = {{"per_installation", kPerInstallation},
                                         {"global", kGlobal}};
    config["admin"]["audit_log"] = (dir_ / (owner + "-audit.log")).string();
    return config;
  }

  // The entity jobs running now, by id, with their lease owners.
  std::map<int64_t, std::string> running_units() {
    const json page =
        api("GET", std::string("/v1/jobs?status=running&limit=100&kind=") + pipeline::kEntityKind)
            .json();
    std::map<int64_t, std::string> units;
    for (const json& job : page.value("items", json::array())) {
      units[job["id"].get<int64_t>()] = job.value("leaseOwner", "");
    }
    return units;
  }

  std::unique_ptr<jobs::testing::TestDatabase> database_;
  std::vector<Host> hosts_;
};

TEST_F(MultiDaemonTest, ThreeDaemonsShareTheWorkHoldTheCapsAndRecoverAKilledOnesJobs) {
  // 3 installations x 3 repositories x 3 entity types = 27 units of 20 pages each (400 items in
  // pages of 20), 10 ms per provider request. The global cap is reached only while all three
  // installations have units to run; at 5 ms a unit, one run of 6 under a parallel build's load
  // never reached it. Units twice as long overlap for longer.
  const uint16_t sandbox_port =
      start_sandbox({"--installations", std::to_string(kInstallations), "--repos",
                     std::to_string(kRepos), "--projects", "0", "--items", std::to_string(kItems),
                     "--max-per-page", "20", "--slow-ms", "10"});
  ASSERT_NE(sandbox_port, 0) << sandbox_->stderr_text();

  // All three start at once on an empty database: they race to migrate it.
  for (const char* owner : {"host-a", "host-b", "host-c"}) {
    hosts_.push_back({owner, launch_daemon(owner, host_config(owner))});
  }
  for (Host& host : hosts_) {
    host.port = host.process->wait_port(dir_ / (host.owner + ".port"), std::chrono::seconds(60));
    ASSERT_NE(host.port, 0) << host.owner << ": " << host.process->stderr_text();
  }
  Host& a = hosts_[0];
  Host& b = hosts_[1];
  Host& c = hosts_[2];

  admin_port_ = a.port;
  std::vector<int64_t> runs;
  for (int i = 1; i <= kInstallations; ++i) {
    runs.push_back(start_run("gh-inst-" + std::to_string(i), "github"));
    ASSERT_NE(runs.back(), 0);
  }
  // D10 across hosts: another daemon asked for the same installation gets the active run.
  admin_port_ = b.port;
  const auto again =
      api("POST", "/v1/runs",
          json{{"installationId", "gh-inst-1"}, {"provider", "github"}, {"depth", 30}}.dump());
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.json()["runId"], runs[0]);
  EXPECT_EQ(again.json()["created"], false);

  // Kill host-c while it holds units.
  admin_port_ = a.port;
  std::map<int64_t, std::string> held;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Clock::now() < deadline) {
    held = running_units();
    if (std::any_of(held.begin(), held.end(), [&](const auto& u) { return u.second == c.owner; })) {
      break;
    }
    held.clear();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(held.empty()) << "host-c never held a unit: " << c.process->stderr_text();
  ASSERT_TRUE(c.process->signal(SIGKILL));
  ASSERT_TRUE(WIFSIGNALED(c.process->wait_exit(std::chrono::seconds(30))));

  int64_t pages = 0;
  for (int i = 0; i < kInstallations; ++i) {
    const json run = wait_finished(runs[static_cast<size_t>(i)], std::chrono::seconds(180));
    ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
    EXPECT_EQ(run["unitsTotal"], kRepos * 3);
    EXPECT_EQ(run["unitsDone"], kRepos * 3);
    EXPECT_EQ(run["unitsFailed"], 0);
    const json installation = report("inst-" + std::to_string(i + 1));
    const json& github = installation["gateway"]["by_provider"]["github"];
    EXPECT_EQ(github["missing"], 0) << installation.dump(2);
    EXPECT_EQ(github["unexpected"], 0) << installation.dump(2);
    EXPECT_EQ(github["unique"], github["expected"]);
    EXPECT_EQ(run["eventsDispatched"], github["unique"]) << "the run's counts are the real ones";
    pages += run.value("pages", int64_t{0});
  }

  // The units host-c held were taken back: an attempt of host-c's ended by the sweep, and
  // another host finished the job. (Each may have ended on host-c between the list and the kill:
  // at least one must not have.)
  int recovered = 0;
  for (const auto& [id, owner] : held) {
    if (owner != c.owner) continue;
    const json job = api("GET", "/v1/jobs/" + std::to_string(id)).json();
    EXPECT_EQ(job["status"], "succeeded") << job.dump(2);
    const json& history = job["attemptHistory"];
    ASSERT_FALSE(history.empty()) << job.dump(2);
    const bool expired_on_c = std::any_of(history.begin(), history.end(), [&](const json& t) {
      return t["owner"] == c.owner && t.value("error", json()).is_string() &&
             t["error"].get<std::string>().find("lease expired") != std::string::npos;
    });
    if (!expired_on_c) continue;
    ++recovered;
    EXPECT_NE(history.back()["owner"], c.owner) << job.dump(2);
    EXPECT_EQ(history.back()["outcome"], "succeeded") << job.dump(2);
  }
  EXPECT_GE(recovered, 1) << "no unit of host-c's was taken back by another host";

  // Both survivors did part of the work.
  for (const Host* host : {&a, &b}) {
    EXPECT_GT(metric_at(host->port, "backhaul_scheduler_jobs_total{event=\"succeeded\"}"), 0)
        << host->owner;
  }

  // Every page once, plus at most one page again per job host-c held at its death (at most its
  // workers), plus one scope check per run and one more for a run host-c held.
  const json sandbox_report = report();
  const int64_t requests = sandbox_report["provider_requests"].value("github", int64_t{0});
  EXPECT_GE(requests, pages);
  EXPECT_LE(requests, pages + kWorkers + kInstallations) << "pages " << pages;

  // No cap was ever exceeded, across the three hosts, and the global one was reached.
  const auto store = database_->open();
  for (int i = 1; i <= kInstallations; ++i) {
    EXPECT_LE(store->max_running_seen(pipeline::kEntityKind, "inst-" + std::to_string(i)),
              kPerInstallation);
  }
  EXPECT_EQ(store->max_running_seen(pipeline::kEntityKind, ""), kGlobal);

  for (Host* host : {&a, &b}) {
    ASSERT_TRUE(host->process->signal(SIGTERM));
    const int status = host->process->wait_exit(std::chrono::seconds(30));
    EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << host->owner << ": " << host->process->stderr_text();
  }
}

}  // namespace
}  // namespace backhaul::daemon::testing
