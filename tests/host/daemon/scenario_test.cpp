// The backfill scenarios of the pipeline (tests/core/pipeline/pipeline_test.cpp runs them
// in-process on a fake clock) with everything real: backhaul-sandbox and backhauld as processes on
// 127.0.0.1, runs started and read over the admin API or with the `backhaul` CLI. Each test checks
// the run's view (GET /v1/runs/{id}) against what the sandbox saw (GET /_sandbox/report and the
// per-resource request counts of GET /_sandbox/requests).
#include <algorithm>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/jobs/job_store.h"
#include "tests/host/daemon/child_process.h"
#include "tests/host/daemon/process_fixture.h"
#include "tests/host/daemon/sql_client.h"
#include "tests/support/scripted_http_server.h"
#include "tests/support/test_proxy.h"

namespace backhaul::daemon::testing {
namespace {

using nlohmann::json;

int64_t pages_for(int64_t entries, int64_t per_page) { return (entries + per_page - 1) / per_page; }

// GitHub list entries per repository for --items n: pulls and releases n, issues n + n/5 (the
// PR-shaped entries the connector skips); list names as in /_sandbox/requests.
struct GithubType {
  const char* entity_type;
  const char* list;
  int64_t (*entries)(int64_t items);
};
constexpr GithubType kGithubTypes[] = {
    {"pull_request", "pulls", [](int64_t n) { return n; }},
    {"issue", "issues", [](int64_t n) { return n + n / 5; }},
    {"release", "releases", [](int64_t n) { return n; }},
};

const json& unit_of(const json& run, const std::string& resource_name,
                    const std::string& entity_type) {
  for (const json& unit : run["units"]) {
    if (unit["resourceName"] == resource_name && unit["entityType"] == entity_type) return unit;
  }
  static const json none;
  ADD_FAILURE() << "no unit " << resource_name << " " << entity_type << " in " << run.dump(2);
  return none;
}

int64_t count(const json& object, const std::string& key) {
  return object.contains(key) ? object[key].get<int64_t>() : 0;
}

class ScenarioTest : public ProcessTest {
 protected:
  // Every GitHub unit of a run over `repos` repositories of inst-1 with `items` items in pages of
  // `per_page`: succeeded, its pages equal to the list pages and to the sandbox's list requests
  // for its repository (plus `refused` requests for `refused_repo`), its events to the items.
  void expect_github_units(const json& run, int repos, int64_t items, int64_t per_page,
                           const std::string& refused_repo = "", int64_t refused = 0) {
    const json requests = resource_requests();
    for (int r = 1; r <= repos; ++r) {
      const std::string repo = "org-1/repo-" + std::to_string(r);
      for (const GithubType& type : kGithubTypes) {
        SCOPED_TRACE(repo + " " + type.entity_type);
        const json& unit = unit_of(run, repo, type.entity_type);
        EXPECT_EQ(unit["status"], "succeeded") << unit.dump();
        EXPECT_EQ(unit["pages"], pages_for(type.entries(items), per_page));
        EXPECT_EQ(unit["pages"].get<int64_t>() + (repo == refused_repo ? refused : 0),
                  count(requests[repo], type.list))
            << requests.dump();
        EXPECT_EQ(unit["eventsProduced"], type.entries(items)) << "what the provider returned";
        EXPECT_EQ(unit["eventsDispatched"], items);
      }
    }
  }

  // `backhaul fetch` of every resource of gh-inst-1 from the sandbox (depth 30), with `extra`.
  std::vector<std::string> fetch_github(const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {"fetch",
                                     "--plugin",
                                     "github",
                                     "--plugin-dir",
                                     BACKHAUL_TEST_PLUGIN_DIR,
                                     "--base-url",
                                     sandbox_url() + "/github",
                                     "--gateway",
                                     sandbox_url() + "/gateway",
                                     "--connection",
                                     "gh-inst-1",
                                     "--all-resources",
                                     "--depth",
                                     "30"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  // Starts the sandbox (one repository of 30 items of each type, 10 per page) and a daemon with
  // `overrides` merged into daemon_config(), the plugins' calls in worker processes when
  // `isolated`; backfills gh-inst-1 to a success (or a fatal test failure), and sets `sandbox` to
  // the sandbox's report of inst-1.
  void backfill_one_repository(bool isolated, const json& overrides, json* sandbox) {
    ASSERT_NE(start_sandbox({"--repos", "1", "--items", "30", "--max-per-page", "10"}), 0)
        << sandbox_->stderr_text();
    json config = daemon_config();
    config.merge_patch(overrides);
    if (isolated) config["plugins"]["isolation"] = {{"mode", "process"}};
    ASSERT_NE(start_daemon(config), 0) << daemon_->stderr_text();
    const int64_t run_id = start_run("gh-inst-1", "github");
    ASSERT_NE(run_id, 0);
    const json run = wait_finished(run_id);
    ASSERT_EQ(run["status"], "succeeded") << run.dump(2) << daemon_->stderr_text();
    *sandbox = report("inst-1");
  }

  // SPEC A3. A GitHub run (the plugins' calls in worker processes when `isolated`), then
  // /metrics: every exchange of the plugin counted as "plugin:github", every one of the gateway
  // client as "gateway", with their time.
  void expect_http_metrics_of_a_run(bool isolated) {
    json sandbox;
    backfill_one_repository(isolated, json::object(), &sandbox);
    if (HasFatalFailure()) return;
    const double provider = sandbox["provider_requests"]["github"].get<double>();
    const auto series = [this](const std::string& client, const std::string& outcome) {
      return metric("backhaul_http_requests_total{client=\"" + client + "\",outcome=\"" + outcome +
                    "\"}");
    };
    EXPECT_EQ(series("plugin:github", "2xx"), provider) << "each provider request the sandbox saw";
    EXPECT_GE(series("gateway", "2xx"), 3.0 * 30) << "every delivery, and the lookups";
    for (const char* client : {"plugin:github", "gateway"}) {
      for (const char* outcome : {"1xx", "3xx", "4xx", "5xx", "error"}) {
        EXPECT_EQ(series(client, outcome), 0) << client << " " << outcome;
      }
    }
    EXPECT_EQ(metric("backhaul_http_request_seconds_count{client=\"plugin:github\"}"), provider);
    EXPECT_GT(metric("backhaul_http_request_seconds_sum{client=\"plugin:github\"}"), 0);
    EXPECT_TRUE(stop_daemon()) << daemon_->stderr_text();
  }

  // SPEC A3. A GitHub run with the daemon's proxy set to a test proxy that requires credentials,
  // which come from the variable proxy.credentials_env names; the plugins' calls in worker
  // processes when `isolated`. Every request of the run, the provider's and the gateway's, goes
  // through the proxy with the credentials, and the run's counts are the sandbox's.
  void run_through_a_proxy(bool isolated) {
    backhaul::testing::TestProxy proxy("Basic dXNlcjpwQHNz");  // user:p@ss
    const http::ProxyOptions where = proxy.options();
    daemon_env_ = {"BACKHAUL_TEST_PROXY_AUTH=user:p@ss"};
    json sandbox;
    backfill_one_repository(isolated,
                            {{"proxy",
                              {{"url", "http://" + where.host + ":" + std::to_string(where.port)},
                               {"credentials_env", "BACKHAUL_TEST_PROXY_AUTH"}}}},
                            &sandbox);
    if (HasFatalFailure()) return;
    const json& github = sandbox["gateway"]["by_provider"]["github"];
    EXPECT_EQ(github["missing"], 0) << sandbox.dump(2);
    EXPECT_EQ(github["received"], 3 * 30) << sandbox.dump(2);
    const std::vector<backhaul::testing::TestProxy::Seen> seen = proxy.seen();
    for (const backhaul::testing::TestProxy::Seen& request : seen) {
      EXPECT_NE(request.request_line.find(" " + sandbox_url() + "/"), std::string::npos)
          << request.request_line;
      EXPECT_EQ(request.authorization, "Basic dXNlcjpwQHNz") << request.request_line;
    }
    EXPECT_EQ(proxy.seen_containing(sandbox_url() + "/github/"),
              sandbox["provider_requests"]["github"].get<size_t>())
        << "every provider request went through the proxy";
    EXPECT_EQ(proxy.seen_containing(sandbox_url() + "/gateway/webhooks/"), size_t{3 * 30})
        << "every delivery went through the proxy";
    EXPECT_TRUE(stop_daemon()) << daemon_->stderr_text();
  }
};

// 1. Both connectors, side by side: 3 repositories x 3 entity types = 9 GitHub units and 1
// Vercel unit; every expected delivery exactly once, and the run's counts are the sandbox's.
TEST_F(ScenarioTest, HappyPathAcrossBothConnectorsDeliversEveryIdExactlyOnce) {
  constexpr int64_t kItems = 120, kPerPage = 25;
  ASSERT_NE(start_sandbox({"--repos", "3", "--projects", "1", "--items", std::to_string(kItems),
                           "--max-per-page", std::to_string(kPerPage)}),
            0)
      << sandbox_->stderr_text();
  ASSERT_NE(start_daemon(daemon_config()), 0) << daemon_->stderr_text();
  const int64_t github_run = start_run("gh-inst-1", "github");
  const int64_t vercel_run = start_run("vc-inst-1", "vercel");
  ASSERT_NE(github_run, 0);
  ASSERT_NE(vercel_run, 0);
  const json github = wait_finished(github_run);
  const json vercel = wait_finished(vercel_run);
  ASSERT_EQ(github["status"], "succeeded") << github.dump(2);
  ASSERT_EQ(vercel["status"], "succeeded") << vercel.dump(2);

  EXPECT_EQ(github["unitsTotal"], 9);
  EXPECT_EQ(github["unitsDone"], 9);
  EXPECT_EQ(github["unitsFailed"], 0);
  ASSERT_EQ(github["units"].size(), 9u);
  expect_github_units(github, 3, kItems, kPerPage);
  EXPECT_EQ(github["pages"], 3 * (5 + 6 + 5));
  EXPECT_EQ(github["eventsDispatched"], 9 * kItems);

  EXPECT_EQ(vercel["unitsTotal"], 1);
  ASSERT_EQ(vercel["units"].size(), 1u);
  const json& deployments = vercel["units"][0];
  EXPECT_EQ(deployments["entityType"], "deployment");
  EXPECT_EQ(deployments["eventsDispatched"], kItems);
  EXPECT_GE(deployments["pages"].get<int64_t>(), pages_for(kItems, kPerPage));
  EXPECT_EQ(deployments["pages"], count(resource_requests()["prj_1_1"], "deployments"));

  const json sandbox = report("inst-1");
  const json& gateway = sandbox["gateway"];
  EXPECT_TRUE(sandbox["complete"].get<bool>()) << sandbox.dump(2);
  EXPECT_EQ(gateway["expected"], 10 * kItems);
  EXPECT_EQ(gateway["unique"], 10 * kItems);
  EXPECT_EQ(gateway["received"], 10 * kItems) << "every delivery exactly once";
  EXPECT_EQ(gateway["duplicates"], 0);
  EXPECT_EQ(gateway["missing"], 0);
  EXPECT_EQ(gateway["unexpected"], 0);
  EXPECT_EQ(gateway["by_provider"]["github"]["unique"], github["eventsDispatched"]);
  EXPECT_EQ(gateway["by_provider"]["vercel"]["unique"], vercel["eventsDispatched"]);
  EXPECT_EQ(gateway["by_provider"]["github"]["by_event_type"],
            (json{{"issues", 3 * kItems}, {"pull_request", 3 * kItems}, {"release", 3 * kItems}}));
  EXPECT_EQ(sandbox_get("/_sandbox/missing?installation=inst-1")["count"], 0);
  // Provider requests: the pages, plus one scope check per run, nothing else.
  EXPECT_EQ(sandbox["provider_requests"]["github"], github["pages"].get<int64_t>() + 1);
  EXPECT_EQ(sandbox["provider_requests"]["vercel"], vercel["pages"].get<int64_t>() + 1);
  EXPECT_EQ(metric("backhaul_pipeline_pages_total"),
            github["pages"].get<double>() + vercel["pages"].get<double>());
  EXPECT_EQ(metric("backhaul_pipeline_events_dispatched_total"), 10.0 * kItems);
}

// 2. `backhaul run cancel` mid-run: the run ends cancelled, no unit is left to run, the units that
// had not finished are cancelled, and the gateway stops receiving.
TEST_F(ScenarioTest, CliCancelMidRunStopsTheRunAndTheGatewayStopsGrowing) {
  ASSERT_NE(start_sandbox({"--repos", "3", "--projects", "0", "--items", "200", "--max-per-page",
                           "10", "--slow-ms", "30"}),
            0)
      << sandbox_->stderr_text();
  ASSERT_NE(start_daemon(daemon_config()), 0) << daemon_->stderr_text();
  const int64_t run_id = start_run("gh-inst-1", "github");
  ASSERT_NE(run_id, 0);
  const json before = wait_run(run_id, [](const json& run) {
    return run.value("eventsDispatched", 0) > 0 || is_finished(run);
  });
  ASSERT_EQ(before["status"], "running") << before.dump(2);
  ASSERT_LT(before["unitsDone"], 9) << "the run must still be going when it is cancelled";

  const CommandResult cancel = cli({"run", "cancel", std::to_string(run_id), "--json"});
  ASSERT_EQ(cancel.exit_code, 0) << cancel.out << cancel.err;
  const std::string outcome = json::parse(cancel.out)["outcome"];
  EXPECT_TRUE(outcome == "cancelled" || outcome == "requested") << cancel.out;

  const json run = wait_finished(run_id);
  ASSERT_EQ(run["status"], "cancelled") << run.dump(2);
  int cancelled = 0;
  for (const json& unit : run["units"]) {
    const std::string status = unit["status"];
    EXPECT_TRUE(status == "cancelled" || status == "succeeded") << unit.dump();
    cancelled += status == "cancelled";
    // A unit that did not finish stopped at a page boundary: part of its items, never more.
    if (status == "cancelled") {
      EXPECT_LT(unit["eventsDispatched"], 200) << unit.dump();
    }
  }
  EXPECT_GT(cancelled, 0) << run.dump(2);
  EXPECT_EQ(run["unitsDone"], 9);

  const json first = report("inst-1");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // would anything still arrive?
  const json second = report("inst-1");
  EXPECT_EQ(second["gateway"]["received"], first["gateway"]["received"]);
  EXPECT_EQ(second["provider_requests"]["github"], first["provider_requests"]["github"]);
  EXPECT_GT(second["gateway"]["missing"], 0) << "the run was cut short";
  EXPECT_EQ(second["gateway"]["duplicates"], 0);
  EXPECT_EQ(run["eventsDispatched"], second["gateway"]["unique"])
      << "the cancelled units kept the pages they delivered";
  EXPECT_EQ(get_run(run_id)["status"], "cancelled");
}

// 2b. `backhaul run start --wait` outlives a restart of backhauld (an upgrade, say): while the
// daemon is down its polls get no answer, and it polls on until the new daemon, on the same port
// and store, finishes the run. It used to exit 1 at the first poll that failed, as if the run had.
TEST_F(ScenarioTest, CliRunWaitOutlivesARestartOfTheDaemon) {
  ASSERT_NE(start_sandbox({"--repos", "3", "--projects", "0", "--items", "200", "--max-per-page",
                           "10", "--slow-ms", "30"}),
            0)
      << sandbox_->stderr_text();
  json config = daemon_config();
  ASSERT_NE(start_daemon(config), 0) << daemon_->stderr_text();
  const uint16_t port = admin_port_;
  config["admin"]["port"] = port;  // the restarted daemon takes the same port
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  ChildProcess waiting(BACKHAUL_CLI_PATH,
                       {"run", "start", "--url", url, "--installation", "gh-inst-1", "--provider",
                        "github", "--wait", "--interval-ms", "50"},
                       {std::string("BACKHAUL_ADMIN_TOKEN=") + kToken}, dir_ / "wait.stderr",
                       dir_ / "wait.stdout");
  const json before = [&] {
    json runs;
    for (int i = 0; i < 600; ++i) {  // the CLI's start, then a first page delivered
      runs = api("GET", "/v1/runs").json();
      if (!runs["items"].empty() && runs["items"][0].value("eventsDispatched", 0) > 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return runs["items"].empty() ? json() : runs["items"][0];
  }();
  ASSERT_TRUE(before.is_object()) << "no run started: " << waiting.stderr_text();
  ASSERT_EQ(before["status"], "running") << before.dump(2);

  ASSERT_TRUE(stop_daemon()) << daemon_->stderr_text();
  ASSERT_EQ(start_daemon(config), port) << daemon_->stderr_text();
  const int status = waiting.wait_exit(std::chrono::seconds(120));
  ASSERT_NE(status, -1) << "the CLI is still waiting: " << waiting.stdout_text();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << status << "\n"
      << waiting.stdout_text() << waiting.stderr_text();
  const std::string out = waiting.stdout_text();
  EXPECT_NE(out.find("run " + std::to_string(before["id"].get<int64_t>()) + " started"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(": polling again for up to "), std::string::npos)
      << "the restart was seen: " << out;
  EXPECT_NE(out.find(" succeeded: units 9/9 (0 failed)"), std::string::npos) << out;
  const json gateway = report("inst-1")["gateway"];
  EXPECT_EQ(gateway["missing"], 0) << gateway.dump(2);
  EXPECT_EQ(gateway["unique"], 3 * 3 * 200) << gateway.dump(2);
}

// 3. One repository answers 404 to everything: its 3 units die (FATAL, one attempt) and are
// reported in the aggregate, the other 6 complete. With the fault gone, `backhaul dlq retry`
// replays them and the run ends succeeded with exact counts.
TEST_F(ScenarioTest, AFailingUnitIsReportedAndADlqRetryCompletesTheRun) {
  constexpr int64_t kItems = 60, kPerPage = 20;
  ASSERT_NE(start_sandbox({"--repos", "3", "--projects", "0", "--items", std::to_string(kItems),
                           "--max-per-page", std::to_string(kPerPage)}),
            0)
      << sandbox_->stderr_text();
  ASSERT_EQ(sandbox_post("/_sandbox/faults",
                         R"({"resource_faults":[{"resource":"org-1/repo-2","status":404}]})")
                .status,
            200);
  ASSERT_NE(start_daemon(daemon_config()), 0) << daemon_->stderr_text();
  const int64_t run_id = start_run("gh-inst-1", "github");
  ASSERT_NE(run_id, 0);
  const json failed = wait_finished(run_id);
  ASSERT_EQ(failed["status"], "failed") << failed.dump(2);
  EXPECT_EQ(failed["unitsTotal"], 9);
  EXPECT_EQ(failed["unitsDone"], 9);
  EXPECT_EQ(failed["unitsFailed"], 3);
  for (const json& unit : failed["units"]) {
    if (unit["resourceName"] == "org-1/repo-2") {
      EXPECT_EQ(unit["status"], "dead") << unit.dump();
      EXPECT_EQ(unit["attempts"], 1) << "FATAL: no retry burnt";
      EXPECT_EQ(unit["eventsDispatched"], 0);
      EXPECT_NE(unit["error"].get<std::string>().find("404"), std::string::npos) << unit.dump();
    } else {
      EXPECT_EQ(unit["status"], "succeeded") << unit.dump();
      EXPECT_EQ(unit["eventsDispatched"], kItems) << unit.dump();
    }
  }
  EXPECT_EQ(failed["eventsDispatched"], 6 * kItems);
  json sandbox = report("inst-1");
  EXPECT_EQ(sandbox["gateway"]["unique"], 6 * kItems);
  EXPECT_EQ(sandbox["gateway"]["missing"], 3 * kItems);
  EXPECT_EQ(sandbox["faults_injected"]["resource"], 3);

  const CommandResult letters = cli({"dlq", "list", "--kind", "backfill.entity", "--json"});
  ASSERT_EQ(letters.exit_code, 0) << letters.err;
  ASSERT_EQ(json::parse(letters.out)["items"].size(), 3u) << letters.out;

  ASSERT_EQ(sandbox_post("/_sandbox/faults", R"({"resource_faults":[]})").status, 200);
  const CommandResult retry = cli({"dlq", "retry", "--all", "--kind", "backfill.entity"});
  ASSERT_EQ(retry.exit_code, 0) << retry.out << retry.err;
  EXPECT_NE(retry.out.find("retried 3 dead letters"), std::string::npos) << retry.out;

  const json run =
      wait_run(run_id, [](const json& r) { return r["status"] == "succeeded" && is_finished(r); });
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  EXPECT_EQ(run["unitsFailed"], 0);
  EXPECT_EQ(run["unitsDone"], 9);
  // repo-2's lists each had the one request its dead unit made.
  expect_github_units(run, 3, kItems, kPerPage, "org-1/repo-2", 1);
  EXPECT_EQ(run["eventsDispatched"], 9 * kItems);
  sandbox = report("inst-1");
  EXPECT_TRUE(sandbox["complete"].get<bool>()) << sandbox.dump(2);
  EXPECT_EQ(sandbox["gateway"]["unique"], 9 * kItems);
  EXPECT_EQ(sandbox["gateway"]["duplicates"], 0);
  const json resolved = api("GET", "/v1/dead-letters").json();
  ASSERT_EQ(resolved["items"].size(), 3u);
  for (const json& letter : resolved["items"]) {
    EXPECT_EQ(letter["status"], "resolved") << letter.dump();
  }
}

// 4. Tokens die after 7 provider requests: every unit meets a 401 mid-pagination, refreshes its
// token once and fetches the same page again; the run succeeds with exact counts.
TEST_F(ScenarioTest, ATokenExpiringMidPaginationIsRefreshedAndTheRunSucceeds) {
  constexpr int64_t kItems = 100, kPerPage = 10;
  ASSERT_NE(
      start_sandbox({"--repos", "1", "--projects", "0", "--items", std::to_string(kItems),
                     "--max-per-page", std::to_string(kPerPage), "--token-ttl-requests", "7"}),
      0)
      << sandbox_->stderr_text();
  ASSERT_NE(start_daemon(daemon_config()), 0) << daemon_->stderr_text();
  const int64_t run_id = start_run("gh-inst-1", "github");
  ASSERT_NE(run_id, 0);
  const json run = wait_finished(run_id);
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  expect_github_units(run, 1, kItems, kPerPage);
  for (const json& unit : run["units"]) EXPECT_EQ(unit["attempts"], 1) << "no failed attempt";

  const json sandbox = report();
  EXPECT_TRUE(sandbox["complete"].get<bool>()) << sandbox.dump(2);
  EXPECT_EQ(sandbox["gateway"]["duplicates"], 0);
  const int64_t expired = sandbox["faults_injected"]["token_expired"];
  // 10 + 12 + 10 pages: each unit's token dies after 7 of its requests.
  EXPECT_EQ(expired, 1 + 1 + 1) << sandbox.dump(2);
  EXPECT_EQ(sandbox["provider_requests"]["unauthorized"], expired) << "one 401 per dead token";
  EXPECT_EQ(metric("backhaul_pipeline_token_refreshes_total"), static_cast<double>(expired));
  EXPECT_EQ(sandbox["provider_requests"]["github"], run["pages"].get<int64_t>() + 1 + expired)
      << "every page once, the scope check, and the rejected requests";
}

// `backhaul fetch` shares a refreshed token with the units after it: each of them began with the
// first token and spent a 401 on it. And a refresh the gateway refuses fails that unit only: the
// gateway's 503 ended the whole command, with no summary and the other units never fetched.
TEST_F(ScenarioTest, FetchSharesARefreshedTokenAndARefusedRefreshFailsOnlyItsUnits) {
  ASSERT_NE(start_sandbox({"--repos", "3", "--projects", "0", "--items", "30", "--max-per-page",
                           "10", "--token-ttl-requests", "4"}),
            0)
      << sandbox_->stderr_text();
  const CommandResult fetched =
      run_command(BACKHAUL_CLI_PATH, fetch_github({"--json", "--quiet"}), {}, dir_);
  ASSERT_EQ(fetched.exit_code, 0) << fetched.err;
  const json sandbox = report();
  const int64_t expired = sandbox["faults_injected"]["token_expired"];
  EXPECT_GE(expired, 2) << sandbox.dump(2);
  int64_t refreshes = 0;
  for (size_t at = 0;
       (at = fetched.err.find("token expired, refreshing once", at)) != std::string::npos; ++at) {
    ++refreshes;
  }
  EXPECT_EQ(refreshes, expired) << fetched.err;
  EXPECT_EQ(sandbox["provider_requests"]["unauthorized"], expired) << "one 401 per dead token";

  // A gateway that hands out one token, then answers 503.
  int tokens = 0;
  backhaul::testing::ScriptedHttpServer gateway([&](const std::string& line) {
    using Answer = backhaul::testing::ScriptedHttpServer::Answer;
    if (line == "GET /connections/gh-inst-1 HTTP/1.1") {
      return Answer{200, sandbox_get("/gateway/connections/gh-inst-1").dump()};
    }
    if (line == "GET /connections/gh-inst-1/token HTTP/1.1" && tokens++ == 0) {
      return Answer{200, sandbox_get("/gateway/connections/gh-inst-1/token").dump()};
    }
    return Answer{503, R"({"error": {"code": "UNAVAILABLE", "message": "down"}})"};
  });
  std::vector<std::string> args = fetch_github({"--json", "--quiet", "--retries", "0"});
  *(std::find(args.begin(), args.end(), "--gateway") + 1) = gateway.url();
  const CommandResult refused = run_command(BACKHAUL_CLI_PATH, args, {}, dir_);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  const json summary = json::parse(refused.out, nullptr, false);
  ASSERT_TRUE(summary.is_object()) << "the summary: " << refused.out << refused.err;
  EXPECT_EQ(summary["units"], 9) << "every unit was tried";
  EXPECT_GE(summary["failed_units"], 1);
  EXPECT_LT(summary["failed_units"], 9) << "the units before the token died succeeded";
  EXPECT_NE(refused.err.find("; refreshing the token failed: "), std::string::npos) << refused.err;
}

// SIGINT (or SIGTERM) stops `fetch` at the next page boundary: the summary says so, every line of
// --events is whole, and then it dies of the signal. Before, the process died mid-line with up to
// 4 KB of events still in its buffer, and no summary.
TEST_F(ScenarioTest, FetchStopsAtAPageBoundaryOnSigintWithEveryLineWhole) {
  ASSERT_NE(start_sandbox({"--repos", "1", "--projects", "0", "--items", "300", "--max-per-page",
                           "10", "--slow-ms", "50"}),
            0)
      << sandbox_->stderr_text();
  ChildProcess fetch(BACKHAUL_CLI_PATH, fetch_github({"--events", "--json"}), {},
                     dir_ / "fetch.stderr", dir_ / "fetch.stdout");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (fetch.stdout_text().size() < 4096 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(fetch.stdout_text().size(), 4096u) << fetch.stderr_text();
  ASSERT_TRUE(fetch.signal(SIGINT));
  // It dies of the signal once the summary is out, as a shell loop expects of a Ctrl-C.
  const int status = fetch.wait_exit(std::chrono::seconds(30));
  ASSERT_TRUE(WIFSIGNALED(status)) << status << " " << fetch.stderr_text();
  EXPECT_EQ(WTERMSIG(status), SIGINT) << fetch.stderr_text();
  EXPECT_NE(fetch.stderr_text().find(": stopped by signal 2 after "), std::string::npos)
      << fetch.stderr_text();
  std::istringstream lines(fetch.stdout_text());
  std::vector<json> parsed;
  for (std::string line; std::getline(lines, line);) {
    parsed.push_back(json::parse(line, nullptr, false));
    ASSERT_FALSE(parsed.back().is_discarded()) << "a line cut short: " << line;
  }
  ASSERT_GE(parsed.size(), 2u);
  const json& summary = parsed.back();
  EXPECT_EQ(summary["stopped_by_signal"], SIGINT) << summary.dump();
  EXPECT_EQ(summary["events"], static_cast<int64_t>(parsed.size()) - 1) << "every event printed";
  EXPECT_LT(summary["events"], 3 * 300) << "stopped before the end";
}

// 5. A unit failing at page 40 of 50 resumes at page 40: the sandbox sees 50 list requests plus
// the one that failed, not 90.
TEST_F(ScenarioTest, AUnitFailingAtPage40Of50ResumesThere) {
  ASSERT_NE(
      start_sandbox({"--repos", "1", "--projects", "0", "--items", "500", "--max-per-page", "10"}),
      0)
      << sandbox_->stderr_text();
  ASSERT_EQ(sandbox_post("/_sandbox/faults", R"({"resource_faults":[{"resource":"org-1/repo-1",)"
                                             R"("list":"releases","skip":39,"count":1}]})")
                .status,
            200);
  json config = daemon_config();
  config["pipeline"]["transient_retries"] = 0;  // the 500 fails the attempt at once
  config["scheduler"]["retry_initial_ms"] = 50;
  ASSERT_NE(start_daemon(config), 0) << daemon_->stderr_text();
  const int64_t run_id = start_run("gh-inst-1", "github", {"release"});
  ASSERT_NE(run_id, 0);
  const json run = wait_finished(run_id);
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  ASSERT_EQ(run["units"].size(), 1u);
  const json& unit = run["units"][0];
  EXPECT_EQ(unit["pages"], 50);
  EXPECT_EQ(unit["eventsDispatched"], 500);

  const json requests = resource_requests()["org-1/repo-1"];
  EXPECT_EQ(requests["releases"], 50 + 1) << "every page once, plus page 40 again";
  EXPECT_EQ(requests["repository"], 1) << "the scope check";
  const json sandbox = report("inst-1");
  EXPECT_EQ(sandbox["faults_injected"]["resource"], 1);
  EXPECT_EQ(sandbox["gateway"]["unique"], 500);
  EXPECT_EQ(sandbox["gateway"]["duplicates"], 0) << "no page was delivered twice";

  const json job = api("GET", "/v1/jobs/" + std::to_string(unit["jobId"].get<int64_t>())).json();
  ASSERT_EQ(job["attemptHistory"].size(), 2u) << job.dump(2);
  EXPECT_EQ(job["attemptHistory"][0]["outcome"], "failed");
  EXPECT_NE(job["attemptHistory"][0]["error"].get<std::string>().find("500"), std::string::npos)
      << job.dump(2);
  EXPECT_EQ(job["attemptHistory"][1]["outcome"], "succeeded") << job.dump(2);
}

// 6. Tenancy: inst-1 has 8 repositories (24 units), inst-2 one (3 units); with 2 running units per
// installation (daemon config), the small run finishes while the huge one is still going.
TEST_F(ScenarioTest, ASmallInstallationFinishesWhileAHugeOneIsStillRunning) {
  ASSERT_NE(start_sandbox({"--installations", "2", "--repos", "1", "--first-installation-repos",
                           "8", "--projects", "0", "--items", "100", "--max-per-page", "10",
                           "--slow-ms", "15"}),
            0)
      << sandbox_->stderr_text();
  json config = daemon_config();
  config["pipeline"]["entity_caps"] = {{"per_installation", 2}, {"global", 30}};
  ASSERT_NE(start_daemon(config), 0) << daemon_->stderr_text();
  const int64_t huge = start_run("gh-inst-1", "github");
  const int64_t small = start_run("gh-inst-2", "github");
  ASSERT_NE(huge, 0);
  ASSERT_NE(small, 0);

  const json small_run = wait_finished(small);
  const json huge_then = get_run(huge);
  ASSERT_EQ(small_run["status"], "succeeded") << small_run.dump(2);
  EXPECT_EQ(small_run["unitsDone"], 3);
  EXPECT_EQ(huge_then["status"], "running") << huge_then.dump(2);
  EXPECT_LT(huge_then["unitsDone"], 24) << "the small run did not wait for the huge one";

  const json huge_run = wait_finished(huge);
  ASSERT_EQ(huge_run["status"], "succeeded") << huge_run.dump(2);
  EXPECT_EQ(huge_run["unitsTotal"], 24);
  EXPECT_EQ(huge_run["eventsDispatched"], 24 * 100);
  EXPECT_EQ(small_run["eventsDispatched"], 3 * 100);
  for (const char* installation : {"inst-1", "inst-2"}) {
    const json sandbox = report(installation);
    EXPECT_TRUE(sandbox["complete"].get<bool>()) << sandbox.dump(2);
    EXPECT_EQ(sandbox["gateway"]["duplicates"], 0);
  }
  ASSERT_TRUE(stop_daemon()) << daemon_->stderr_text();
  auto store = jobs::open_sqlite_store((dir_ / "jobs.db").string());
  EXPECT_EQ(store->max_running_seen("backfill.entity", "gh-inst-1"), 2) << "the cap held";
  EXPECT_GE(store->max_running_seen("backfill.entity", "gh-inst-2"), 1);
  EXPECT_LE(store->max_running_seen("backfill.entity", "gh-inst-2"), 2);
}

// 7. A small provider rate limit (30 requests per 2 s window): units wait for the reset when fewer
// than 10% are left, as a run-after (no failed attempt), and the provider never has to refuse a
// request.
TEST_F(ScenarioTest, ALowRateLimitMakesUnitsWaitForTheResetWithoutEverHittingIt) {
  constexpr int64_t kItems = 150, kPerPage = 10;
  ASSERT_NE(start_sandbox({"--repos", "1", "--projects", "0", "--items", std::to_string(kItems),
                           "--max-per-page", std::to_string(kPerPage), "--rate-limit", "30",
                           "--rate-window-s", "2"}),
            0)
      << sandbox_->stderr_text();
  ASSERT_NE(start_daemon(daemon_config()), 0) << daemon_->stderr_text();
  const int64_t run_id = start_run("gh-inst-1", "github");
  ASSERT_NE(run_id, 0);
  const json run = wait_finished(run_id);
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  expect_github_units(run, 1, kItems, kPerPage);
  // 15 + 18 + 15 pages and a scope check: 49 requests need at least two windows of 30.
  EXPECT_GE(run["rateLimitWaits"].get<int64_t>(), 1) << run.dump(2);
  for (const json& unit : run["units"]) EXPECT_EQ(unit["attempts"], 1) << unit.dump();
  EXPECT_GE(metric("backhaul_pipeline_rate_limit_waits_total"), 1.0);

  const json sandbox = report("inst-1");
  EXPECT_TRUE(sandbox["complete"].get<bool>()) << sandbox.dump(2);
  EXPECT_EQ(sandbox["gateway"]["duplicates"], 0);
  EXPECT_EQ(sandbox["faults_injected"]["rate_limited"], 0) << "never ran into the limit";
  EXPECT_EQ(sandbox["provider_requests"]["github"], run["pages"].get<int64_t>() + 1)
      << "no request was refused and made again";
}

// 8. Provider 5xx (10%), gateway 5xx (10%), provider 429 bursts and gateway busy periods (429s
// with a retry-after) together: the run still succeeds with every expected id and exact counts.
TEST_F(ScenarioTest, UnderProviderAndGatewayFaultsTheRunSucceedsWithExactCounts) {
  constexpr int64_t kItems = 150;
  ASSERT_NE(start_sandbox({"--repos",
                           "2",
                           "--projects",
                           "0",
                           "--items",
                           std::to_string(kItems),
                           "--max-per-page",
                           "10",
                           "--fail-rate",
                           "0.1",
                           "--gateway-fail-rate",
                           "0.1",
                           "--burst-429-every",
                           "15",
                           "--burst-len",
                           "1",
                           "--retry-after",
                           "1",
                           "--gateway-busy-every",
                           "400",
                           "--gateway-busy-ms",
                           "300"}),
            0)
      << sandbox_->stderr_text();
  json config = daemon_config();
  config["pipeline"]["transient_retries"] = 3;
  config["pipeline"]["transient_retry_ms"] = 5;
  config["pipeline"]["provider_circuit"] = {{"failure_threshold", 5}, {"open_ms", 100}};
  config["pipeline"]["gateway_circuit"] = {{"failure_threshold", 5}, {"open_ms", 100}};
  config["scheduler"]["retry_initial_ms"] = 50;
  config["scheduler"]["retry_max_ms"] = 200;
  ASSERT_NE(start_daemon(config), 0) << daemon_->stderr_text();
  const int64_t run_id = start_run("gh-inst-1", "github");
  ASSERT_NE(run_id, 0);
  const json run = wait_finished(run_id);
  ASSERT_EQ(run["status"], "succeeded") << run.dump(2);
  EXPECT_EQ(run["unitsTotal"], 6);
  for (const json& unit : run["units"]) {
    EXPECT_EQ(unit["status"], "succeeded") << unit.dump();
    EXPECT_EQ(unit["eventsDispatched"], kItems) << unit.dump();
  }
  EXPECT_EQ(run["eventsDispatched"], 6 * kItems);

  const json sandbox = report("inst-1");
  EXPECT_TRUE(sandbox["complete"].get<bool>()) << sandbox.dump(2);
  EXPECT_EQ(sandbox["gateway"]["unique"], 6 * kItems);
  EXPECT_EQ(sandbox["gateway"]["unexpected"], 0);
  EXPECT_EQ(run["eventsDispatched"], sandbox["gateway"]["unique"])
      << "a page fetched again is not counted twice";
  EXPECT_GT(sandbox["faults_injected"]["provider_5xx"], 0) << sandbox.dump(2);
  EXPECT_GT(sandbox["faults_injected"]["gateway_5xx"], 0) << sandbox.dump(2);
  EXPECT_GT(sandbox["faults_injected"]["burst_429"], 0) << sandbox.dump(2);
  EXPECT_GT(sandbox["faults_injected"]["gateway_429"], 0) << sandbox.dump(2);
  EXPECT_GT(metric("backhaul_pipeline_transient_retries_total"), 0.0);
  EXPECT_GT(metric("backhaul_pipeline_gateway_rate_limit_waits_total"), 0.0)
      << "each unit that met the gateway's 429 waited";
}

// 9. /health/ready answers 503 naming "store" while the store cannot answer its queries (here the
// jobs table is renamed away under the running daemon by another client of the SQLite file), and
// 200 again once it can. The daemon itself keeps running.
TEST_F(ScenarioTest, ReadyAnswers503NamingTheStoreWhileTheStoreIsUnusable) {
  ASSERT_NE(start_daemon(daemon_config()), 0) << daemon_->stderr_text();
  sandbox::testing::TestClient client(admin_port_);
  const sandbox::testing::HttpResult healthy = client.get("/health/ready");
  ASSERT_EQ(healthy.status, 200) << healthy.body;
  EXPECT_EQ(healthy.json()["components"]["store"]["status"], "healthy");

  const std::string db = (dir_ / "jobs.db").string();
  run_sql(db, "ALTER TABLE jobs RENAME TO jobs_moved_away");
  const sandbox::testing::HttpResult broken = client.get("/health/ready");
  EXPECT_EQ(broken.status, 503) << broken.body;
  const json body = broken.json();
  EXPECT_EQ(body["status"], "unhealthy");
  EXPECT_EQ(body["failing"], json::array({"store"})) << broken.body;
  EXPECT_EQ(body["components"]["store"]["status"], "unhealthy");
  EXPECT_NE(body["components"]["store"]["error"].get<std::string>().find("no such table: jobs"),
            std::string::npos)
      << broken.body;
  EXPECT_EQ(body["components"]["plugins"]["status"], "healthy") << "only the store is named";
  EXPECT_EQ(client.get("/health/live").status, 200) << "alive, not ready";

  run_sql(db, "ALTER TABLE jobs_moved_away RENAME TO jobs");
  const sandbox::testing::HttpResult recovered = client.get("/health/ready");
  EXPECT_EQ(recovered.status, 200) << recovered.body;
  EXPECT_EQ(recovered.json()["status"], "healthy");
  EXPECT_TRUE(stop_daemon()) << daemon_->stderr_text();
}

TEST_F(ScenarioTest, MetricsCountEveryHttpRequestOfARunByClientAndOutcome) {
  expect_http_metrics_of_a_run(false);
}

TEST_F(ScenarioTest, InIsolationModeMetricsCountTheRequestsTheWorkersMade) {
  expect_http_metrics_of_a_run(true);
}

TEST_F(ScenarioTest, WithAProxyEveryRequestOfARunGoesThroughIt) { run_through_a_proxy(false); }

TEST_F(ScenarioTest, InIsolationModeTheWorkersRequestsGoThroughTheProxyToo) {
  run_through_a_proxy(true);
}

// `backhaul fetch --proxy`: the provider's requests and the gateway's connection lookup go
// through the proxy, with the credentials $BACKHAUL_PROXY_CREDENTIALS holds; a host in --no-proxy
// is reached directly.
TEST_F(ScenarioTest, FetchSendsItsRequestsThroughTheProxyItIsGiven) {
  backhaul::testing::TestProxy proxy("Basic dXNlcjpwQHNz");  // user:p@ss
  ASSERT_NE(start_sandbox({"--repos", "1", "--items", "30", "--max-per-page", "10"}), 0)
      << sandbox_->stderr_text();
  // The credentials in the environment, off the command line.
  const std::string proxy_url = "http://127.0.0.1:" + std::to_string(proxy.options().port);
  std::vector<std::string> args = fetch_github({"--quiet", "--json", "--proxy", proxy_url});
  const CommandResult fetched =
      run_command(BACKHAUL_CLI_PATH, args, {"BACKHAUL_PROXY_CREDENTIALS=user:p@ss"}, dir_);
  ASSERT_EQ(fetched.exit_code, 0) << fetched.err;
  const json summary = json::parse(fetched.out);
  EXPECT_EQ(summary["events"], 3 * 30) << fetched.out;
  EXPECT_EQ(proxy.seen_containing(sandbox_url() + "/github/"),
            report("inst-1")["provider_requests"]["github"].get<size_t>());
  EXPECT_EQ(proxy.seen_containing(sandbox_url() + "/gateway/connections/gh-inst-1"), 2u)
      << "the connection and its token";
  for (const auto& request : proxy.seen()) {
    EXPECT_EQ(request.authorization, "Basic dXNlcjpwQHNz") << request.request_line;
  }

  const size_t before = proxy.seen().size();
  args.insert(args.end(), {"--no-proxy", "example.com,127.0.0.1"});
  const CommandResult direct = run_command(BACKHAUL_CLI_PATH, args, {}, dir_);
  ASSERT_EQ(direct.exit_code, 0) << direct.err;
  EXPECT_EQ(proxy.seen().size(), before);

  *(std::find(args.begin(), args.end(), "--proxy") + 1) = "https://127.0.0.1:1";
  const CommandResult refused = run_command(BACKHAUL_CLI_PATH, args, {}, dir_);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("--proxy: invalid proxy url: the scheme must be http://"),
            std::string::npos)
      << refused.err;
}

// `backhaul fetch --json`: stdout is the summary alone, whatever else is printed (the
// --max-pages line came out on stdout even under --quiet, and the page lines without it). A page
// whose events the gateway will not take fails its unit, which is counted and reported, and the
// other units go on: before, the gateway's error ended the command with no summary.
TEST_F(ScenarioTest, FetchJsonIsTheSummaryAloneAndAGatewayFailureFailsItsUnit) {
  ASSERT_NE(start_sandbox({"--repos", "1", "--items", "30", "--max-per-page", "10",
                           "--gateway-fail-rate", "1"}),
            0)
      << sandbox_->stderr_text();
  const std::vector<std::string> fetch = fetch_github({"--json"});
  for (const char* quiet : {"--quiet", "--events"}) {
    std::vector<std::string> args = fetch;
    args.insert(args.end(), {"--max-pages", "1", quiet});
    const CommandResult limited = run_command(BACKHAUL_CLI_PATH, args, {}, dir_);
    ASSERT_EQ(limited.exit_code, 0) << limited.err;
    std::istringstream lines(limited.out);
    std::vector<json> parsed;
    for (std::string line; std::getline(lines, line);) {
      ASSERT_TRUE(json::accept(line)) << quiet << ": not JSON on stdout: " << line;
      parsed.push_back(json::parse(line));
    }
    ASSERT_FALSE(parsed.empty());
    EXPECT_EQ(parsed.back()["pages"], 3) << parsed.back().dump();
    const size_t events = parsed.back()["events"].get<size_t>();
    EXPECT_GT(events, 0u);
    EXPECT_EQ(parsed.size(), std::string(quiet) == "--events" ? events + 1 : 1u) << quiet;
    if (std::string(quiet) == "--events") {
      EXPECT_NE(limited.err.find("stopped at --max-pages 1"), std::string::npos) << limited.err;
    }
  }

  std::vector<std::string> args = fetch;
  args.insert(args.end(), {"--dispatch", "--retries", "1", "--quiet"});
  const CommandResult failed = run_command(BACKHAUL_CLI_PATH, args, {}, dir_);
  EXPECT_EQ(failed.exit_code, 2) << failed.err;
  const json summary = json::parse(failed.out);
  EXPECT_EQ(summary["units"], 3) << failed.out;
  EXPECT_EQ(summary["failed_units"], 3) << failed.out;
  EXPECT_EQ(summary["pages"], 3) << "each unit stops at its first page";
  EXPECT_EQ(summary["accepted"], 0);
  EXPECT_NE(failed.err.find("org-1/repo-1 pull_request: failed: page 1 could not be dispatched: "),
            std::string::npos)
      << failed.err;
}

}  // namespace
}  // namespace backhaul::daemon::testing
