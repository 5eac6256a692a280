// A backfill through the admin API: backhaul-sandbox runs as a process (fake GitHub, Vercel and
// gateway on 127.0.0.1), the daemon runs in-process with the real connector plugins and a temp
// SQLite store. The run must end succeeded with counts that match what the sandbox's gateway
// received.
#include <filesystem>
#include <fstream>
#include <optional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/logging.h"
#include "core/common/proc.h"
#include "host/daemon/config.h"
#include "host/daemon/daemon.h"
#include "tests/host/daemon/process_fixture.h"
#include <unistd.h>

namespace backhaul::daemon::testing {
namespace {

using nlohmann::json;
using sandbox::testing::HttpResult;
using sandbox::testing::TestClient;

class RunApiTest : public ProcessTest {
 protected:
  void SetUp() override {
    logging::configure(logging::Format::kText, "warn");
    ProcessTest::SetUp();
    ASSERT_NE(start_sandbox({"--installations", "2", "--repos", "2", "--projects", "2", "--items",
                             "120", "--max-per-page", "50"}),
              0)
        << sandbox_->stderr_text();
    json config = daemon_config();
    config["store"]["path"] = "jobs.db";  // relative to the config's directory
    config["scheduler"] = {{"workers", 4}, {"heartbeat_ms", 1000}, {"sweep_ms", 1000}};
    config["pipeline"] = json::object();  // the defaults: RateLimitsReadAndReplace reads them
    config["shutdown"] = {{"grace_ms", 5000}};
    configure(config);
    auto env = [](const std::string& name) -> std::optional<std::string> {
      if (name == kTokenEnv) return std::string(kToken);
      return std::nullopt;
    };
    local_daemon_ = std::make_unique<Daemon>(parse_config(config.dump(), dir_, env));
    local_daemon_->start();
    admin_port_ = local_daemon_->port();
    client_ = std::make_unique<TestClient>(admin_port_);
  }

  void TearDown() override {
    client_.reset();
    local_daemon_.reset();
    ProcessTest::TearDown();
  }

  virtual void configure(json& /*config*/) {}

  HttpResult call(const std::string& method, const std::string& target,
                  const std::string& body = "") {
    return client_->request(method, target, {{"Authorization", std::string("Bearer ") + kToken}},
                            body);
  }

  std::unique_ptr<Daemon> local_daemon_;  // in-process, on admin_port_
  std::unique_ptr<TestClient> client_;
};

TEST_F(RunApiTest, GithubRunSucceedsWithCountsMatchingTheGateway) {
  const std::string body = R"({"installationId":"gh-inst-1","provider":"github","depth":30})";
  const json preview = call("POST", "/v1/runs/preview", body).json();
  ASSERT_TRUE(preview.contains("units")) << preview.dump();
  EXPECT_EQ(preview["unitCount"], preview["units"].size());
  EXPECT_GE(preview["estimatedRequests"].get<int64_t>(), preview["unitCount"].get<int64_t>());
  EXPECT_EQ(call("GET", "/v1/runs").json()["items"].size(), 0u) << "preview enqueued nothing";

  const HttpResult started = call("POST", "/v1/runs", body);
  ASSERT_EQ(started.status, 202) << started.body;
  const int64_t run_id = started.json()["runId"];
  EXPECT_TRUE(started.json()["created"].get<bool>());
  const HttpResult again = call("POST", "/v1/runs", body);  // D10: the active run, not a second
  if (again.status == 200) {
    EXPECT_FALSE(again.json()["created"].get<bool>());
    EXPECT_EQ(again.json()["runId"], run_id);
  } else {
    // The first run already finished: a new one may start, it is never a duplicate of an active
    // one.
    EXPECT_EQ(again.status, 202) << again.body;
  }

  const json run = wait_finished(run_id);
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  EXPECT_EQ(run["unitsTotal"], preview["unitCount"]);
  EXPECT_EQ(run["unitsDone"], run["unitsTotal"]);
  EXPECT_EQ(run["unitsFailed"], 0);
  ASSERT_EQ(run["units"].size(), preview["units"].size());
  int64_t pages = 0, dispatched = 0;
  for (const json& unit : run["units"]) {
    EXPECT_EQ(unit["status"], "succeeded") << unit.dump();
    EXPECT_GT(unit["pages"].get<int64_t>(), 0) << unit.dump();
    pages += unit["pages"].get<int64_t>();
    dispatched += unit["eventsDispatched"].get<int64_t>();
  }
  EXPECT_EQ(run["pages"], pages);
  EXPECT_EQ(run["eventsDispatched"], dispatched);

  // Wait for the second run too, if it started, so the gateway's count is final.
  if (again.status == 202) wait_finished(again.json()["runId"]);
  const json gateway_report = report("inst-1");
  const json& github = gateway_report["gateway"]["by_provider"]["github"];
  EXPECT_EQ(github["missing"], 0) << gateway_report.dump(2);
  EXPECT_EQ(github["unexpected"], 0) << gateway_report.dump(2);
  EXPECT_EQ(run["eventsDispatched"], github["unique"]) << gateway_report.dump(2);
  EXPECT_GT(github["unique"].get<int64_t>(), 0);

  const json list = call("GET", "/v1/runs?installationId=gh-inst-1").json();
  ASSERT_FALSE(list["items"].empty());
  EXPECT_EQ(list["items"].back()["id"], run_id);
  EXPECT_EQ(list["items"].back()["eventsDispatched"], run["eventsDispatched"]);
  EXPECT_EQ(list["items"].back()["unitsTotal"], run["unitsTotal"]);
  EXPECT_EQ(call("GET", "/v1/runs?status=succeeded&limit=1").json()["items"].size(), 1u);
  EXPECT_EQ(call("POST", "/v1/runs/" + std::to_string(run_id) + "/cancel").json()["outcome"],
            "already_finished");

  const std::string metrics = client_->get("/metrics").body;
  EXPECT_NE(metrics.find("backhaul_pipeline_pages_total "), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("backhaul_pipeline_pages_total 0\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("backhaul_plugin_call_seconds_count "), std::string::npos);
  EXPECT_NE(metrics.find("backhaul_scheduler_jobs_total{event=\"succeeded\"} "), std::string::npos);
  EXPECT_NE(metrics.find("backhaul_jobs{kind=\"backfill.entity\",status=\"succeeded\"} "),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("# TYPE backhaul_job_wait_seconds summary\n"), std::string::npos);
  EXPECT_NE(metrics.find("backhaul_job_run_seconds_count{kind=\"backfill.entity\"} "),
            std::string::npos)
      << metrics;
  EXPECT_NE(metrics.find("backhaul_job_wait_seconds_sum{kind=\"backfill.run\"} "),
            std::string::npos);
}

// With --json, --wait prints the finished run's JSON alone on stdout (the progress goes to
// stderr), for a pipe to parse; the progress lines came first on stdout before.
TEST_F(RunApiTest, CliRunStartWaitJsonPrintsOnlyTheRunsJson) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  const std::string url = "http://127.0.0.1:" + std::to_string(local_daemon_->port());
  const CommandResult started =
      run_command(BACKHAUL_CLI_PATH,
                  {"run", "start", "--url", url, "--installation", "vc-inst-1", "--provider",
                   "vercel", "--depth", "30", "--wait", "--interval-ms", "100", "--json"},
                  env, dir_, std::chrono::seconds(120));
  ASSERT_EQ(started.exit_code, 0) << started.out << started.err;
  const json run = json::parse(started.out, nullptr, false);
  ASSERT_FALSE(run.is_discarded()) << started.out;
  EXPECT_EQ(run["status"], "succeeded") << started.out;
  EXPECT_NE(started.err.find(" succeeded: units "), std::string::npos) << started.err;
}

TEST_F(RunApiTest, CliRunStartWaitShowsProgressAndExits0OnSuccess) {
  const std::vector<std::string> env = {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken};
  const std::string url = "http://127.0.0.1:" + std::to_string(local_daemon_->port());
  const CommandResult started =
      run_command(BACKHAUL_CLI_PATH,
                  {"run", "start", "--url", url, "--installation", "vc-inst-1", "--provider",
                   "vercel", "--depth", "30", "--wait", "--interval-ms", "100"},
                  env, dir_, std::chrono::seconds(120));
  ASSERT_EQ(started.exit_code, 0) << started.out << started.err;
  EXPECT_NE(started.out.find("started"), std::string::npos) << started.out;
  EXPECT_NE(started.out.find(" succeeded: units "), std::string::npos) << started.out;
  EXPECT_NE(started.out.find("rate-limit waits 0, ETA done in"), std::string::npos) << started.out;
  const json runs = call("GET", "/v1/runs?installationId=vc-inst-1").json();
  ASSERT_EQ(runs["items"].size(), 1u);
  const std::string id = std::to_string(runs["items"][0]["id"].get<int64_t>());
  EXPECT_EQ(runs["items"][0]["eventsDispatched"],
            report("inst-1")["gateway"]["by_provider"]["vercel"]["unique"]);

  const CommandResult status =
      run_command(BACKHAUL_CLI_PATH, {"run", "status", id, "--url", url}, env, dir_);
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_NE(status.out.find("run " + id + " succeeded"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("deployment"), std::string::npos) << status.out;
  const CommandResult list =
      run_command(BACKHAUL_CLI_PATH, {"run", "list", "--url", url}, env, dir_);
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_NE(list.out.find("vc-inst-1"), std::string::npos) << list.out;
  const CommandResult cancel =
      run_command(BACKHAUL_CLI_PATH, {"run", "cancel", id, "--url", url}, env, dir_);
  ASSERT_EQ(cancel.exit_code, 0) << cancel.err;
  EXPECT_NE(cancel.out.find("already_finished"), std::string::npos) << cancel.out;
  // A run that does not succeed makes --wait exit 1.
  const CommandResult failing =
      run_command(BACKHAUL_CLI_PATH,
                  {"run", "start", "--url", url, "--installation", "no-such-connection",
                   "--provider", "github", "--wait", "--interval-ms", "100"},
                  env, dir_, std::chrono::seconds(120));
  EXPECT_EQ(failing.exit_code, 1) << failing.out << failing.err;
}

TEST_F(RunApiTest, RunRequestsAreValidatedAndRunsCanBeCancelled) {
  const HttpResult bad_depth =
      call("POST", "/v1/runs", R"({"installationId":"gh-inst-1","provider":"github","depth":8})");
  EXPECT_EQ(bad_depth.status, 400) << bad_depth.body;
  EXPECT_EQ(bad_depth.json()["error"]["code"], "VALIDATION_ERROR");
  EXPECT_EQ(bad_depth.json()["error"]["details"]["field"], "depth");
  const HttpResult no_provider = call("POST", "/v1/runs", R"({"installationId":"x","depth":7})");
  EXPECT_EQ(no_provider.json()["error"]["details"]["field"], "provider") << no_provider.body;
  const HttpResult unknown_provider =
      call("POST", "/v1/runs", R"({"installationId":"x","provider":"gitlab","depth":7})");
  EXPECT_EQ(unknown_provider.status, 400);
  EXPECT_EQ(unknown_provider.json()["error"]["details"]["field"], "provider");
  const HttpResult bad_types =
      call("POST", "/v1/runs",
           R"({"installationId":"x","provider":"github","depth":7,"entityTypes":["nope"]})");
  EXPECT_EQ(bad_types.json()["error"]["details"]["field"], "entityTypes") << bad_types.body;
  // A misspelt field would be ignored and widen the run to every entity type (review: the run
  // started, with 3 types instead of the 1 meant); the preview refuses it alike.
  for (const char* target : {"/v1/runs", "/v1/runs/preview"}) {
    const HttpResult misspelt = call("POST", target,
                                     R"({"installationId":"gh-inst-1","provider":"github",)"
                                     R"("depth":7,"entity_types":["release"]})");
    EXPECT_EQ(misspelt.status, 400) << target << ": " << misspelt.body;
    EXPECT_EQ(misspelt.json()["error"]["details"]["field"], "entity_types") << misspelt.body;
  }
  // An empty orgId would stamp every event with "" (left out, it is the connection's).
  const HttpResult empty_org =
      call("POST", "/v1/runs",
           R"({"installationId":"gh-inst-1","provider":"github","depth":7,"orgId":""})");
  EXPECT_EQ(empty_org.status, 400) << empty_org.body;
  EXPECT_EQ(empty_org.json()["error"]["details"]["field"], "orgId") << empty_org.body;
  EXPECT_EQ(call("GET", "/v1/runs?installationId=gh-inst-1").json()["items"].size(), 0u)
      << "no run started";
  EXPECT_EQ(call("GET", "/v1/runs/123456").json()["error"]["code"], "RUN_NOT_FOUND");
  EXPECT_EQ(call("POST", "/v1/runs/123456/cancel").status, 404);
  EXPECT_EQ(call("GET", "/v1/runs?status=sleeping").json()["error"]["details"]["field"], "status");
  EXPECT_EQ(call("GET", "/v1/runs?installation=gh-inst-1").json()["error"]["details"]["field"],
            "installation");

  const HttpResult started =
      call("POST", "/v1/runs", R"({"installationId":"vc-inst-2","provider":"vercel","depth":90})");
  ASSERT_EQ(started.status, 202) << started.body;
  const HttpResult cancelled = call("POST", "/v1/installations/vc-inst-2/cancel");
  ASSERT_EQ(cancelled.status, 200) << cancelled.body;
  const json run = wait_finished(started.json()["runId"]);
  // Cancelled at once, or (if it raced to the end) finished: never left running.
  EXPECT_TRUE(run["status"] == "cancelled" || run["status"] == "succeeded") << run.dump();
}

TEST_F(RunApiTest, RateLimitsReadAndReplace) {
  const json limits = call("GET", "/v1/rate-limits").json();
  EXPECT_EQ(limits["entityCaps"]["perInstallation"], 5);
  EXPECT_EQ(limits["entityCaps"]["global"], 30);
  EXPECT_EQ(limits["runCaps"]["perInstallation"], 1);
  EXPECT_DOUBLE_EQ(limits["throttlePerHour"].get<double>(), 4000);
  const HttpResult put =
      call("PUT", "/v1/rate-limits", R"({"throttlePerHour":1200,"entityCaps":{"global":12}})");
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_DOUBLE_EQ(put.json()["throttlePerHour"].get<double>(), 1200);
  EXPECT_EQ(put.json()["entityCaps"]["global"], 12);
  EXPECT_EQ(put.json()["entityCaps"]["perInstallation"], 5);
  EXPECT_EQ(local_daemon_->store().caps().at("backfill.entity").global, 12);
  const HttpResult bad = call("PUT", "/v1/rate-limits", R"({"rateLimitFloor":2})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_EQ(bad.json()["error"]["details"]["field"], "rateLimitFloor");
  EXPECT_EQ(call("PUT", "/v1/rate-limits", R"({"speed":1})").json()["error"]["details"]["field"],
            "speed");
  // Below the configuration's minimum of 1 an hour (5e-324 was taken, and parked the units).
  const HttpResult slow = call("PUT", "/v1/rate-limits", R"({"throttlePerHour":0.5})");
  EXPECT_EQ(slow.status, 400) << slow.body;
  EXPECT_EQ(slow.json()["error"]["details"]["field"], "throttlePerHour") << slow.body;
  EXPECT_DOUBLE_EQ(call("GET", "/v1/rate-limits").json()["throttlePerHour"].get<double>(), 1200);
}

// A preview of an installation the gateway does not know is the request's mistake, a 400 on
// installationId (as a run of it dies "connection not found"), not a 502 GATEWAY_ERROR that sets
// off alerts meant for a failing gateway.
TEST_F(RunApiTest, APreviewOfAnUnknownInstallationIsA400) {
  const HttpResult preview = call("POST", "/v1/runs/preview",
                                  R"({"installationId":"nope","provider":"github","depth":7})");
  EXPECT_EQ(preview.status, 400) << preview.body;
  EXPECT_EQ(preview.json()["error"]["details"]["field"], "installationId") << preview.body;
  EXPECT_EQ(preview.json()["error"]["message"],
            "installationId: the gateway has no connection nope")
      << preview.body;
}

// Caps live in the store, shared by every host on it. GET shows the caps in force there, and a
// PUT writes only the caps it names: before, it wrote back this daemon's own copy of every
// setting, so another host's cap change was undone by any PUT here (of the throttle, say), and GET
// showed caps no longer in force. A GET's answer, metadata included, can be sent back as it is.
TEST_F(RunApiTest, RateLimitsChangeOnlyWhatAPutNamesAndShowTheCapsOtherHostsSet) {
  jobs::JobStore& store = local_daemon_->store();
  store.set_caps("backfill.entity", {7, 50});  // another host's PUT
  const json limits = call("GET", "/v1/rate-limits").json();
  EXPECT_EQ(limits["entityCaps"]["perInstallation"], 7) << limits.dump();
  EXPECT_EQ(limits["entityCaps"]["global"], 50) << limits.dump();

  const HttpResult put = call("PUT", "/v1/rate-limits", R"({"throttlePerHour":1000})");
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(store.caps().at("backfill.entity").global, 50);
  EXPECT_EQ(store.caps().at("backfill.entity").per_key, 7);
  EXPECT_EQ(put.json()["entityCaps"]["global"], 50);
  EXPECT_DOUBLE_EQ(put.json()["throttlePerHour"].get<double>(), 1000);

  store.set_caps("backfill.run", {2, 20});
  const HttpResult caps = call("PUT", "/v1/rate-limits", R"({"entityCaps":{"global":60}})");
  ASSERT_EQ(caps.status, 200) << caps.body;
  EXPECT_EQ(store.caps().at("backfill.entity").per_key, 7);
  EXPECT_EQ(store.caps().at("backfill.entity").global, 60);
  EXPECT_EQ(store.caps().at("backfill.run").per_key, 2) << "a kind not named is not written";
  EXPECT_EQ(store.caps().at("backfill.run").global, 20);

  const HttpResult echo = call("PUT", "/v1/rate-limits", caps.body);
  ASSERT_EQ(echo.status, 200) << echo.body;
  EXPECT_EQ(echo.json()["entityCaps"], caps.json()["entityCaps"]);
  EXPECT_EQ(echo.json()["runCaps"], caps.json()["runCaps"]);
}

// SPEC B4: the same daemon with its plugins' calls in worker processes.
class IsolatedRunApiTest : public RunApiTest {
 protected:
  void configure(json& config) override {
    config["plugins"]["isolation"] = {{"mode", "process"}, {"workers", 2}};
  }

  // This process's children that run backhaul-plugin-worker.
  static std::vector<pid_t> plugin_workers() {
    std::vector<pid_t> found;
    for (pid_t child : child_pids(::getpid())) {
      const std::optional<ProcStat> stat = read_proc_stat(child);
      if (stat && stat->comm == "backhaul-plugin") found.push_back(child);  // cut to 15 characters
    }
    return found;
  }
};

TEST_F(IsolatedRunApiTest, AGithubRunSucceedsWithCountsMatchingTheGatewayAndTheWorkersEndWithIt) {
  const std::vector<pid_t> at_start = plugin_workers();
  EXPECT_EQ(at_start.size(), 2u) << "one per connector (github, vercel), started with the daemon";
  const HttpResult started =
      call("POST", "/v1/runs", R"({"installationId":"gh-inst-1","provider":"github","depth":30})");
  ASSERT_EQ(started.status, 202) << started.body;
  const json run = wait_finished(started.json()["runId"]);
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  EXPECT_EQ(run["unitsFailed"], 0);
  const json gateway_report = report("inst-1");
  const json& github = gateway_report["gateway"]["by_provider"]["github"];
  EXPECT_EQ(github["missing"], 0) << gateway_report.dump(2);
  EXPECT_EQ(github["unexpected"], 0) << gateway_report.dump(2);
  EXPECT_EQ(run["eventsDispatched"], github["unique"]);
  EXPECT_GT(github["unique"].get<int64_t>(), 0);
  const size_t during = plugin_workers().size();
  EXPECT_GE(during, 2u);
  EXPECT_LE(during, 4u) << "at most 2 per connector";
  const std::string metrics = client_->get("/metrics").body;
  EXPECT_NE(metrics.find("backhaul_plugin_workers{plugin=\"github\",state=\"busy\"} 0\n"),
            std::string::npos)
      << metrics;
  EXPECT_NE(
      metrics.find("backhaul_plugin_workers_lost_total{plugin=\"github\",reason=\"crashed\"} 0\n"),
      std::string::npos)
      << metrics;

  client_.reset();
  local_daemon_.reset();
  EXPECT_TRUE(plugin_workers().empty()) << "a stopped daemon leaves no worker behind";
}

}  // namespace
}  // namespace backhaul::daemon::testing
