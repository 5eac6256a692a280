// The fake gateway and the control endpoints over real HTTP: connections, tokens, webhook
// validation and dedupe, the report, faults and reset.
#include <algorithm>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "host/sandbox/sandbox.h"
#include "tests/host/sandbox/test_client.h"

namespace backhaul::sandbox {
namespace {

using nlohmann::json;
using testing::FakeClock;
using testing::HttpResult;
using testing::TestClient;
using testing::webhook_body;

class GatewayTest : public ::testing::Test {
 protected:
  void start(SandboxOptions options) {
    options.now_ms = clock_.function();
    sandbox_ = std::make_unique<Sandbox>(std::move(options));
    sandbox_->start();
    client_ = std::make_unique<TestClient>(sandbox_->port());
  }
  HttpResult deliver(const std::string& provider, const json& body) {
    return client_->post("/gateway/webhooks/" + provider, body.dump());
  }

  FakeClock clock_;
  std::unique_ptr<Sandbox> sandbox_;
  std::unique_ptr<TestClient> client_;
};

// Posts `id` of inst-1 as its own installation's delivery: under its provider, with its connection.
HttpResult post(TestClient& client, const std::string& id) {
  const bool vercel = id.find("-deploy-") != std::string::npos;
  return client.post("/gateway/webhooks/" + std::string(vercel ? "vercel" : "github"),
                     webhook_body(vercel ? "vc-inst-1" : "gh-inst-1", id).dump());
}

SandboxOptions small(int installations = 1) {
  SandboxOptions options;
  options.installations = installations;
  options.repos = 2;
  options.projects = 1;
  options.items = 12;
  return options;
}

TEST_F(GatewayTest, ConnectionsDescribeTheDataModel) {
  start(small(2));
  HttpResult github = client_->get("/gateway/connections/gh-inst-2");
  ASSERT_EQ(github.status, 200);
  EXPECT_EQ(github.json(), json::parse(R"({
    "id": "gh-inst-2", "installationId": "inst-2", "provider": "github", "orgId": "org-2",
    "status": "active",
    "resources": [{"providerResourceId": "200001", "resourceName": "org-2/repo-1"},
                  {"providerResourceId": "200002", "resourceName": "org-2/repo-2"}]})"));
  HttpResult vercel = client_->get("/gateway/connections/vc-inst-1");
  EXPECT_EQ(vercel.json()["resources"],
            json::parse(R"([{"providerResourceId": "prj_1_1", "resourceName": "project-1"}])"));
  EXPECT_EQ(client_->get("/gateway/connections/inst-1?provider=vercel").json()["id"], "vc-inst-1");

  HttpResult unknown = client_->get("/gateway/connections/gh-inst-3");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.json()["error"]["code"], "not_found");
}

TEST_F(GatewayTest, EveryTokenCallGivesANewValidToken) {
  start(small());
  const json first = client_->get("/gateway/connections/gh-inst-1/token").json();
  const json second = client_->get("/gateway/connections/gh-inst-1/token").json();
  const std::string a = first["accessToken"];
  const std::string b = second["accessToken"];
  EXPECT_NE(a, b);
  EXPECT_TRUE(std::regex_match(a, std::regex("ghs_[A-Za-z0-9]{36,59}"))) << a;
  EXPECT_TRUE(std::regex_match(first["expiresAt"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
  for (const std::string& token : {a, b}) {
    EXPECT_EQ(client_->get("/github/repos/org-1/repo-1", testing::github_headers(token)).status,
              200);
  }
  const std::string vercel = client_->token("vc-inst-1");
  EXPECT_TRUE(std::regex_match(vercel, std::regex("vcp_[A-Za-z0-9]{24,35}"))) << vercel;
}

TEST_F(GatewayTest, DedupesByDeliveryIdAndReportsAgainstExpected) {
  start(small());
  const std::string id = "backfill-inst-1-100001-pr-12";
  HttpResult accepted = deliver("github", webhook_body("gh-inst-1", id));
  EXPECT_EQ(accepted.status, 202);
  EXPECT_EQ(accepted.json()["status"], "accepted");
  HttpResult duplicate = deliver("github", webhook_body("gh-inst-1", id));
  EXPECT_EQ(duplicate.status, 200);
  EXPECT_EQ(duplicate.json()["status"], "duplicate");
  EXPECT_EQ(deliver("github", webhook_body("gh-inst-1", "backfill-inst-1-100001-pr-13")).status,
            202);  // number 13 does not exist

  const json report = client_->get("/_sandbox/report").json();
  const json& gateway = report["gateway"];
  const int64_t expected = 2 * 3 * 12 + 1 * 12;
  EXPECT_EQ(gateway["received"], 3);
  EXPECT_EQ(gateway["unique"], 2);
  EXPECT_EQ(gateway["duplicates"], 1);
  EXPECT_EQ(gateway["expected"], expected);
  EXPECT_EQ(gateway["missing"], expected - 1);
  EXPECT_EQ(gateway["unexpected"], 1);
  EXPECT_EQ(gateway["unexpected_sample"], json::array({"backfill-inst-1-100001-pr-13"}));
  EXPECT_EQ(gateway["by_provider"]["github"]["expected"], 2 * 3 * 12);
  EXPECT_EQ(gateway["by_provider"]["github"]["by_event_type"]["pull_request"], 2);
  EXPECT_EQ(gateway["by_provider"]["vercel"]["missing"], 12);
  EXPECT_EQ(report["complete"], false);

  const Report direct = sandbox_->report();
  EXPECT_EQ(direct.gateway.unique, 2);
  EXPECT_EQ(direct.gateway.missing, expected - 1);
}

TEST_F(GatewayTest, MalformedWebhooksGet400NamingTheField) {
  start(small());
  json body = webhook_body("gh-inst-1", "backfill-inst-1-100001-pr-1");
  for (const char* field :
       {"connectionId", "orgId", "deliveryId", "eventType", "payload", "receivedAt"}) {
    json broken = body;
    broken.erase(field);
    HttpResult result = deliver("github", broken);
    EXPECT_EQ(result.status, 400) << field;
    EXPECT_EQ(result.json()["error"]["field"], field);
    EXPECT_NE(result.json()["error"]["message"].get<std::string>().find(field), std::string::npos);
  }
  json not_object = body;
  not_object["payload"] = "text";
  EXPECT_EQ(deliver("github", not_object).json()["error"]["field"], "payload");
  EXPECT_EQ(client_->post("/gateway/webhooks/github", "{not json").status, 400);
  EXPECT_EQ(client_->post("/gateway/webhooks/gitlab", body.dump()).status, 404);
  EXPECT_EQ(client_->get("/_sandbox/report").json()["gateway"]["invalid"], 8);
  EXPECT_EQ(client_->get("/_sandbox/report").json()["gateway"]["received"], 0);
}

// The first accepted body per provider is kept verbatim for load tools (the pipeline benchmark).
TEST_F(GatewayTest, TheFirstAcceptedWebhookIsKeptAsASample) {
  start(small());
  EXPECT_EQ(client_->get("/_sandbox/sample-webhook?provider=github").status, 404);
  EXPECT_EQ(client_->get("/_sandbox/sample-webhook?provider=gitlab").status, 400);
  EXPECT_EQ(client_->post("/gateway/webhooks/github", "{not json").status, 400);
  const std::string first = webhook_body("gh-inst-1", "backfill-inst-1-100001-pr-12").dump(2);
  EXPECT_EQ(client_->post("/gateway/webhooks/github", first).status, 202);
  EXPECT_EQ(deliver("github", webhook_body("gh-inst-1", "backfill-inst-1-100001-pr-11")).status,
            202);
  HttpResult sample = client_->get("/_sandbox/sample-webhook?provider=github");
  EXPECT_EQ(sample.status, 200);
  EXPECT_EQ(sample.body, first) << "the first accepted body, byte for byte";
  EXPECT_EQ(client_->get("/_sandbox/sample-webhook?provider=vercel").status, 404);
  EXPECT_EQ(client_->post("/_sandbox/reset", "").status, 200);
  EXPECT_EQ(client_->get("/_sandbox/sample-webhook?provider=github").status, 404);
}

TEST_F(GatewayTest, ReportPerInstallationAndMissingList) {
  start(small(2));
  const json inst1 = client_->get("/_sandbox/expected?installation=inst-1").json();
  ASSERT_EQ(inst1["count"], 2 * 3 * 12 + 12);
  for (const auto& id : inst1["ids"]) {
    const bool vercel = id.get<std::string>().find("-deploy-") != std::string::npos;
    ASSERT_EQ(
        deliver(vercel ? "vercel" : "github", webhook_body(vercel ? "vc-inst-1" : "gh-inst-1", id))
            .status,
        202);
  }
  const json one = client_->get("/_sandbox/report?installation=inst-1").json();
  EXPECT_EQ(one["installation"], "inst-1");
  EXPECT_EQ(one["gateway"]["missing"], 0);
  EXPECT_EQ(one["complete"], true);
  const json all = client_->get("/_sandbox/report").json();
  EXPECT_EQ(all["gateway"]["missing"], inst1["count"]);

  const json missing = client_->get("/_sandbox/missing?limit=5").json();
  EXPECT_EQ(missing["count"], inst1["count"]);
  ASSERT_EQ(missing["ids"].size(), 5u);
  EXPECT_EQ(missing["ids"][0].get<std::string>().rfind("backfill-inst-2-", 0), 0u);
  EXPECT_EQ(client_->get("/_sandbox/report?installation=inst-3").status, 404);
  EXPECT_EQ(sandbox_->expected_delivery_ids().size(), 2 * inst1["ids"].size());
}

TEST_F(GatewayTest, ConcurrentDeliveriesAreCountedExactly) {
  start(small());
  const auto ids = sandbox_->expected_delivery_ids();
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      TestClient client(sandbox_->port());
      // Every thread posts every other id; each id is posted by kThreads / 2 threads.
      for (size_t k = static_cast<size_t>(t % 2); k < ids.size(); k += 2) post(client, ids[k]);
    });
  }
  for (auto& thread : threads) thread.join();
  const Report report = sandbox_->report();
  EXPECT_EQ(report.gateway.received, static_cast<int64_t>(ids.size()) * kThreads / 2);
  EXPECT_EQ(report.gateway.unique, static_cast<int64_t>(ids.size()));
  EXPECT_EQ(report.gateway.duplicates, report.gateway.received - report.gateway.unique);
  EXPECT_EQ(report.gateway.missing, 0);
  EXPECT_TRUE(report.complete());
}

// A delivery that arrived twice leaves the report complete (delivery is at least once) but not
// exactly once, which the demo requires: a run without faults sends nothing again.
TEST_F(GatewayTest, ADuplicateLeavesTheReportCompleteButNotExactlyOnce) {
  start(small());
  const auto ids = sandbox_->expected_delivery_ids();
  for (const auto& id : ids) post(*client_, id);
  EXPECT_TRUE(sandbox_->report().exactly_once());
  EXPECT_EQ(client_->get("/_sandbox/report").json()["exactly_once"], true);
  post(*client_, ids[0]);
  const Report report = sandbox_->report();
  EXPECT_TRUE(report.complete());
  EXPECT_EQ(report.gateway.duplicates, 1);
  EXPECT_FALSE(report.exactly_once());
  const nlohmann::json wire = client_->get("/_sandbox/report").json();
  EXPECT_EQ(wire["complete"], true);
  EXPECT_EQ(wire["exactly_once"], false);
}

// A delivery that reached the gateway other than as its installation's own (under the other
// provider's path, or with another connection) is a daemon's bug that exactly-once counting alone
// cannot see: the report counts it as misdirected and is not complete. The org is not checked (a
// run may name its own).
TEST_F(GatewayTest, ADeliveryUnderAnotherProviderOrConnectionIsMisdirected) {
  start(small(2));
  const auto ids = sandbox_->expected_delivery_ids();
  auto is_vercel = [](const std::string& id) { return id.find("-deploy-") != std::string::npos; };
  const std::string deployment = "backfill-inst-1-prj_1_1-deploy-";
  auto own = [&](const std::string& id) {
    const std::string inst = id.substr(9, id.find('-', 14) - 9);  // "inst-N"
    return webhook_body((is_vercel(id) ? "vc-" : "gh-") + inst, id);
  };
  auto first = [&](const std::string& prefix) {
    return *std::find_if(ids.begin(), ids.end(),
                         [&](const std::string& id) { return id.rfind(prefix, 0) == 0; });
  };
  const std::string deployment_id = first(deployment);
  const std::string pr_id = first("backfill-inst-1-100001-pr-");
  const std::string issue_id = first("backfill-inst-2-200001-issue-");
  std::vector<std::string> astray;  // in the order posted
  for (const auto& id : ids) {
    json body = own(id);
    std::string provider = is_vercel(id) ? "vercel" : "github";
    if (id == deployment_id) {
      provider = "github";  // a deployment under GitHub's path, with GitHub's connection
      body["connectionId"] = "gh-inst-1";
    } else if (id == pr_id) {
      body["connectionId"] = "gh-inst-2";  // inst-2's connection and org
      body["orgId"] = "org-2";
    } else if (id == issue_id) {
      body["connectionId"] = "vc-inst-2";  // its installation's, but the other provider's
    }
    if (id == deployment_id || id == pr_id || id == issue_id) astray.push_back(id);
    ASSERT_EQ(deliver(provider, body).status, 202) << id;
  }
  ASSERT_EQ(astray.size(), 3u);
  const Report report = sandbox_->report();
  EXPECT_EQ(report.gateway.missing, 0);
  EXPECT_EQ(report.gateway.unexpected, 0);
  EXPECT_EQ(report.gateway.duplicates, 0);
  EXPECT_EQ(report.gateway.misdirected, 3);
  EXPECT_FALSE(report.complete());
  EXPECT_FALSE(report.exactly_once());
  const json wire = client_->get("/_sandbox/report").json();
  EXPECT_EQ(wire["gateway"]["misdirected"], 3);
  EXPECT_EQ(wire["gateway"]["by_provider"]["vercel"]["misdirected"], 1);
  EXPECT_EQ(wire["gateway"]["by_provider"]["github"]["misdirected"], 2);
  EXPECT_EQ(wire["gateway"]["misdirected_sample"], json(astray));
  EXPECT_EQ(wire["complete"], false);
  const json inst2 = client_->get("/_sandbox/report?installation=inst-2").json();
  EXPECT_EQ(inst2["gateway"]["misdirected"], 1);
  EXPECT_EQ(inst2["gateway"]["misdirected_sample"], json::array({astray[2]}));
}

// Each installation's ids under their own connection, the bare installation id included, and
// with any org, are never misdirected.
TEST_F(GatewayTest, EveryDeliveryAsItsInstallationsOwnIsComplete) {
  start(small(2));
  for (const auto& id : sandbox_->expected_delivery_ids()) {
    const bool vercel = id.find("-deploy-") != std::string::npos;
    const std::string inst = id.substr(9, id.find('-', 14) - 9);
    // inst-2's deliveries name their connection by the bare installation id.
    const std::string connection = inst == "inst-2" ? inst : (vercel ? "vc-" : "gh-") + inst;
    json body = webhook_body(connection, id);
    body["orgId"] = "my-org";  // a run's own org
    ASSERT_EQ(deliver(vercel ? "vercel" : "github", body).status, 202) << id;
  }
  const Report report = sandbox_->report();
  EXPECT_EQ(report.gateway.misdirected, 0);
  EXPECT_TRUE(report.exactly_once());
}

TEST_F(GatewayTest, ApiKeyIsCheckedWhenConfigured) {
  SandboxOptions options = small();
  options.gateway_api_key = "s3cret";
  start(options);
  EXPECT_EQ(client_->get("/gateway/connections/gh-inst-1").status, 401);
  EXPECT_EQ(client_->get("/gateway/connections/gh-inst-1", {{"X-Api-Key", "wrong"}}).status, 401);
  EXPECT_EQ(client_->get("/gateway/connections/gh-inst-1", {{"X-Api-Key", "s3cret"}}).status, 200);
}

TEST_F(GatewayTest, GatewayFailRateAnswers503WithoutRecording) {
  SandboxOptions options = small();
  options.faults.gateway_fail_rate = 1.0;
  start(options);
  HttpResult failed = deliver("github", webhook_body("gh-inst-1", "backfill-inst-1-100001-pr-1"));
  EXPECT_EQ(failed.status, 503);
  const json report = client_->get("/_sandbox/report").json();
  EXPECT_EQ(report["gateway"]["received"], 0);
  EXPECT_EQ(report["faults_injected"]["gateway_5xx"], 1);
}

// Every 3rd webhook POST starts a busy period of 2.5 s (sandbox clock): the POSTs in it get 429
// with the seconds left, rounded up, and are not recorded; after it the gateway takes them again.
TEST_F(GatewayTest, AGatewayBusyPeriodAnswers429WithTheSecondsLeft) {
  SandboxOptions options = small();
  options.faults.gateway_busy_every = 3;
  options.faults.gateway_busy_ms = 2500;
  start(options);
  auto post = [&](int n) {
    return deliver("github",
                   webhook_body("gh-inst-1", "backfill-inst-1-100001-pr-" + std::to_string(n)));
  };
  EXPECT_EQ(post(1).status, 202);
  EXPECT_EQ(post(2).status, 202);
  HttpResult busy = post(3);  // the 3rd starts it
  EXPECT_EQ(busy.status, 429);
  EXPECT_EQ(busy.header("retry-after"), "3");
  EXPECT_EQ(busy.json()["error"]["code"], "rate_limited");
  clock_.advance_ms(1600);
  busy = post(3);
  EXPECT_EQ(busy.status, 429);
  EXPECT_EQ(busy.header("retry-after"), "1") << "0.9 s left";
  clock_.advance_ms(900);
  EXPECT_EQ(post(3).status, 202) << "the busy period is over";
  const json report = client_->get("/_sandbox/report").json();
  EXPECT_EQ(report["gateway"]["received"], 3);
  EXPECT_EQ(report["faults_injected"]["gateway_429"], 2);
  EXPECT_EQ(client_->post("/_sandbox/faults", R"({"gateway_busy_ms": 0})").status, 400);
}

TEST_F(GatewayTest, FaultsCanBeChangedAndStateResetAtRuntime) {
  start(small());
  HttpResult changed = client_->post("/_sandbox/faults", R"({"fail_rate": 0.25, "burst_len": 3})");
  ASSERT_EQ(changed.status, 200);
  EXPECT_EQ(changed.json()["fail_rate"], 0.25);
  EXPECT_EQ(sandbox_->faults().burst_len, 3);
  EXPECT_EQ(client_->post("/_sandbox/faults", R"({"fail_rate": 2})").status, 400);
  EXPECT_EQ(client_->post("/_sandbox/faults", R"({"nonsense": 1})").status, 400);
  // Values whose milliseconds would overflow a clock, or that do not fit their field, are
  // refused, not wrapped into range.
  for (const char* patch :
       {R"({"rate_window_s": 9223372036854775807})", R"({"retry_after_s": 9223372036854775807})",
        R"({"burst_len": 18446744073709551615})",
        R"({"resource_faults": [{"resource": "org-1/repo-1", "status": 4294967796}]})",
        R"({"resource_faults": [{"resource": "org-1/repo-1", "skip": 18446744073709551615}]})"}) {
    const HttpResult refused = client_->post("/_sandbox/faults", patch);
    EXPECT_EQ(refused.status, 400) << patch;
    EXPECT_EQ(refused.json()["error"]["code"], "invalid_request") << patch;
  }
  EXPECT_EQ(client_->post("/_sandbox/faults", R"({"rate_window_s": 316224000})").status, 200)
      << "ten years";
  EXPECT_EQ(client_->get("/_sandbox/faults").json()["fail_rate"], 0.25);

  deliver("github", webhook_body("gh-inst-1", "backfill-inst-1-100001-pr-1"));
  const std::string token = client_->token("gh-inst-1");
  sandbox_->set_faults({});
  client_->get("/github/repos/org-1/repo-1", testing::github_headers(token));
  EXPECT_EQ(client_->post("/_sandbox/reset", "").status, 200);
  const json report = client_->get("/_sandbox/report").json();
  EXPECT_EQ(report["gateway"]["received"], 0);
  EXPECT_EQ(report["provider_requests"]["github"], 0);
  // Tokens survive a reset.
  EXPECT_EQ(client_->get("/github/repos/org-1/repo-1", testing::github_headers(token)).status, 200);
}

}  // namespace
}  // namespace backhaul::sandbox
