// The fake Vercel API over real HTTP: the until cursor and its same-millisecond boundary, filters,
// projects, auth, rate limits and faults.
#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "host/sandbox/sandbox.h"
#include "tests/host/sandbox/test_client.h"

namespace backhaul::sandbox {
namespace {

using nlohmann::json;
using testing::FakeClock;
using testing::HttpResult;
using testing::TestClient;
using testing::vercel_headers;

class VercelApiTest : public ::testing::Test {
 protected:
  void start(SandboxOptions options = {}) {
    options.now_ms = clock_.function();
    sandbox_ = std::make_unique<Sandbox>(std::move(options));
    sandbox_->start();
    client_ = std::make_unique<TestClient>(sandbox_->port());
    token_ = client_->token("vc-inst-1");
  }
  HttpResult get(const std::string& target) { return client_->get(target, vercel_headers(token_)); }

  // Walks /v6/deployments with until = pagination.next + `until_offset`; returns every uid seen
  // (with repeats) in order.
  std::vector<std::string> walk(int64_t until_offset) {
    std::vector<std::string> uids;
    std::string until;
    while (true) {
      HttpResult page = get("/vercel/v6/deployments?projectId=prj_1_1&limit=100" + until);
      EXPECT_EQ(page.status, 200) << page.body;
      const json body = page.json();
      for (const auto& deployment : body["deployments"]) uids.push_back(deployment["uid"]);
      if (body["pagination"]["next"].is_null()) return uids;
      until = "&until=" + std::to_string(body["pagination"]["next"].get<int64_t>() + until_offset);
    }
  }

  FakeClock clock_;
  std::unique_ptr<Sandbox> sandbox_;
  std::unique_ptr<TestClient> client_;
  std::string token_;
};

SandboxOptions with_items(int64_t items) {
  SandboxOptions options;
  options.items = items;
  return options;
}

TEST_F(VercelApiTest, FirstPageHasVercelShapeNewestFirst) {
  start(with_items(250));
  HttpResult page = get("/vercel/v6/deployments?projectId=prj_1_1");
  ASSERT_EQ(page.status, 200);
  const json body = page.json();
  ASSERT_EQ(body["deployments"].size(), 20u);  // default limit
  EXPECT_EQ(body["pagination"]["count"], 20);
  EXPECT_EQ(body["pagination"]["prev"], body["deployments"][0]["created"]);
  EXPECT_EQ(body["pagination"]["next"], body["deployments"][19]["created"]);
  for (size_t k = 1; k < 20; ++k) {
    EXPECT_GE(body["deployments"][k - 1]["created"], body["deployments"][k]["created"]);
  }
  const json& first = body["deployments"][0];
  EXPECT_EQ(first["uid"].get<std::string>().rfind("dpl_", 0), 0u);
  EXPECT_EQ(first["projectId"], "prj_1_1");
  EXPECT_EQ(first["name"], "project-1");
  EXPECT_TRUE(first["creator"].contains("uid"));
  EXPECT_TRUE(first["meta"].contains("githubCommitSha"));
  EXPECT_EQ(first["state"], first["readyState"]);
  for (const char* name : {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}) {
    EXPECT_TRUE(page.has_header(name)) << name;
  }
  EXPECT_EQ(get("/vercel/v6/deployments?projectId=prj_1_1&limit=1000").json()["deployments"].size(),
            100u);
}

TEST_F(VercelApiTest, UntilWalkWithDedupeReturnsEveryUidOnceAcrossTheSameMillisecondBoundary) {
  start(with_items(250));
  // The boundary pair: the last item of page 1 and the first item after it share `created`.
  const json first = get("/vercel/v6/deployments?projectId=prj_1_1&limit=100").json();
  const int64_t next = first["pagination"]["next"];
  const json overlap =
      get("/vercel/v6/deployments?projectId=prj_1_1&limit=2&until=" + std::to_string(next + 1))
          .json();
  ASSERT_EQ(overlap["deployments"].size(), 2u);
  EXPECT_EQ(overlap["deployments"][0]["created"], next);
  EXPECT_EQ(overlap["deployments"][1]["created"], next);
  EXPECT_NE(overlap["deployments"][0]["uid"], overlap["deployments"][1]["uid"]);

  // until = next + 1 re-reads the boundary millisecond; de-duplicating by uid yields each once.
  const auto robust = walk(1);
  const std::set<std::string> unique(robust.begin(), robust.end());
  EXPECT_EQ(unique.size(), 250u);
  EXPECT_GT(robust.size(), unique.size());

  // Passing pagination.next verbatim ("strictly before") skips the boundary twin: the trap the
  // sandbox exists to expose.
  const auto verbatim = walk(0);
  const std::set<std::string> verbatim_unique(verbatim.begin(), verbatim.end());
  EXPECT_EQ(verbatim_unique.size(), verbatim.size());
  EXPECT_EQ(verbatim_unique.size(), 249u);
  EXPECT_FALSE(verbatim_unique.contains(overlap["deployments"][1]["uid"].get<std::string>()));
}

TEST_F(VercelApiTest, SinceIsStrictlyAfter) {
  start(with_items(50));
  const json all = get("/vercel/v6/deployments?projectId=prj_1_1&limit=100").json();
  ASSERT_EQ(all["deployments"].size(), 50u);
  EXPECT_TRUE(all["pagination"]["next"].is_null());
  const int64_t since = all["deployments"][10]["created"];
  const json newer =
      get("/vercel/v6/deployments?projectId=prj_1_1&limit=100&since=" + std::to_string(since))
          .json();
  EXPECT_EQ(newer["deployments"].size(), 10u);
  EXPECT_EQ(newer["pagination"]["count"], 10);
}

TEST_F(VercelApiTest, ProjectsByIdOrNameAndErrors) {
  SandboxOptions options = with_items(5);
  options.installations = 2;
  options.projects = 2;
  start(options);
  HttpResult by_id = get("/vercel/v9/projects/prj_1_2");
  ASSERT_EQ(by_id.status, 200);
  EXPECT_EQ(by_id.json()["name"], "project-2");
  EXPECT_EQ(get("/vercel/v9/projects/project-2?teamId=team_x").json()["id"], "prj_1_2");

  HttpResult missing = get("/vercel/v9/projects/prj_1_9");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.json()["error"]["code"], "not_found");
  HttpResult foreign = get("/vercel/v9/projects/prj_2_1");
  EXPECT_EQ(foreign.status, 403);
  EXPECT_FALSE(foreign.json()["error"].contains("invalidToken"));
  EXPECT_EQ(get("/vercel/v6/deployments").status, 400);
  EXPECT_EQ(get("/vercel/v6/deployments?projectId=prj_1_1&until=soon").status, 400);
  EXPECT_EQ(get("/vercel/v2/nothing").json()["error"]["code"], "not_found");
}

TEST_F(VercelApiTest, InvalidTokenIs403WithInvalidTokenFlag) {
  start(with_items(5));
  const std::string path = "/vercel/v6/deployments?projectId=prj_1_1";
  for (const HttpResult& result :
       {client_->get(path), client_->get(path, vercel_headers("vcp_unknown")),
        client_->get(path, vercel_headers(client_->token("gh-inst-1")))}) {
    EXPECT_EQ(result.status, 403);
    EXPECT_EQ(
        result.json(),
        json::parse(
            R"({"error":{"code":"forbidden","message":"Not authorized","invalidToken":true}})"));
    EXPECT_TRUE(result.has_header("x-ratelimit-limit"));
  }
}

TEST_F(VercelApiTest, RateLimitAndBurstsAnswer429WithRetryAfter) {
  SandboxOptions options = with_items(5);
  options.faults.rate_limit = 2;
  options.faults.rate_window_s = 60;
  start(options);
  EXPECT_EQ(get("/vercel/v9/projects/prj_1_1").status, 200);
  EXPECT_EQ(get("/vercel/v9/projects/prj_1_1").status, 200);
  HttpResult limited = get("/vercel/v9/projects/prj_1_1");
  EXPECT_EQ(limited.status, 429);
  EXPECT_EQ(limited.json()["error"]["code"], "too_many_requests");
  EXPECT_EQ(limited.header("retry-after"), "60");
  EXPECT_EQ(limited.header("x-ratelimit-remaining"), "0");

  Faults faults;
  faults.burst_429_every = 1;
  faults.retry_after_s = 3;
  sandbox_->set_faults(faults);
  HttpResult burst = get("/vercel/v9/projects/prj_1_1");
  EXPECT_EQ(burst.status, 429);
  EXPECT_EQ(burst.header("retry-after"), "3");
}

TEST_F(VercelApiTest, TokenTtlTurnsTokensInvalid) {
  SandboxOptions options = with_items(5);
  options.faults.token_ttl_requests = 1;
  start(options);
  EXPECT_EQ(get("/vercel/v9/projects/prj_1_1").status, 200);
  HttpResult dead = get("/vercel/v9/projects/prj_1_1");
  EXPECT_EQ(dead.status, 403);
  EXPECT_EQ(dead.json()["error"]["invalidToken"], true);
  token_ = client_->token("vc-inst-1");
  EXPECT_EQ(get("/vercel/v9/projects/prj_1_1").status, 200);
}

// A resource fault on a project (by name here) fails its deployment list; the set of faults is
// replaced at runtime through Sandbox::set_faults().
TEST_F(VercelApiTest, ResourceFaultFailsOneProjectsDeploymentsOnly) {
  SandboxOptions options = with_items(10);
  options.projects = 2;
  options.faults.resource_faults = {{"project-2", "deployments", 0, 2, 503}};
  start(options);
  HttpResult failed = get("/vercel/v6/deployments?projectId=prj_1_2");
  EXPECT_EQ(failed.status, 503);
  EXPECT_EQ(failed.json()["error"]["code"], "internal_server_error");
  EXPECT_TRUE(failed.has_header("x-ratelimit-remaining"));
  EXPECT_EQ(get("/vercel/v9/projects/prj_1_2").status, 200);
  EXPECT_EQ(get("/vercel/v6/deployments?projectId=prj_1_1").status, 200);
  EXPECT_EQ(get("/vercel/v6/deployments?projectId=project-2").status, 503);
  EXPECT_EQ(get("/vercel/v6/deployments?projectId=prj_1_2").status, 200) << "count is 2";
  EXPECT_EQ(sandbox_->report().faults_injected.at("resource"), 2);
  Faults none;
  sandbox_->set_faults(none);
  EXPECT_EQ(to_json(sandbox_->faults())["resource_faults"], json::array());
}

}  // namespace
}  // namespace backhaul::sandbox
