// The fake GitHub API over real HTTP: pagination links, filters, auth, rate limits and faults.
#include <algorithm>
#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "host/sandbox/sandbox.h"
#include "tests/host/sandbox/test_client.h"

namespace backhaul::sandbox {
namespace {

using testing::FakeClock;
using testing::github_headers;
using testing::HttpResult;
using testing::parse_link;
using testing::TestClient;

class GithubApiTest : public ::testing::Test {
 protected:
  void start(SandboxOptions options = {}) {
    options.now_ms = clock_.function();
    sandbox_ = std::make_unique<Sandbox>(std::move(options));
    sandbox_->start();
    client_ = std::make_unique<TestClient>(sandbox_->port());
    token_ = client_->token("gh-inst-1");
  }
  HttpResult get(const std::string& target) { return client_->get(target, github_headers(token_)); }

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

TEST_F(GithubApiTest, LinkWalkOverPullsVisitsEveryNumberOnceWithGithubLinkShapes) {
  start(with_items(95));
  std::string next = "/github/repos/org-1/repo-1/pulls?per_page=10&state=all";
  HttpResult page = get(next);
  std::set<int64_t> numbers;
  int64_t items_seen = 0;
  for (int page_number = 1;; ++page_number) {
    ASSERT_EQ(page.status, 200) << page.body;
    for (const auto& pull : page.json()) {
      numbers.insert(pull.at("number").get<int64_t>());
      ++items_seen;
    }
    const auto link = parse_link(page.header("link"));
    const std::string base =
        sandbox_->base_url() + "/github/repositories/100001/pulls?per_page=10&state=all&page=";
    if (page_number == 1) {
      EXPECT_EQ(link.rels, (std::vector<std::string>{"next", "last"}));
    } else if (page_number < 10) {
      EXPECT_EQ(link.rels, (std::vector<std::string>{"prev", "next", "last", "first"}));
      EXPECT_EQ(link.urls.at("prev"), base + std::to_string(page_number - 1));
      EXPECT_EQ(link.urls.at("first"), base + "1");
    } else {
      EXPECT_EQ(link.rels, (std::vector<std::string>{"prev", "first"}));
    }
    if (link.urls.count("last")) {
      EXPECT_EQ(link.urls.at("last"), base + "10");
    }
    if (!link.urls.count("next")) break;
    EXPECT_EQ(link.urls.at("next"), base + std::to_string(page_number + 1));
    page = client_->get_url(link.urls.at("next"), github_headers(token_));
  }
  EXPECT_EQ(items_seen, 95);
  ASSERT_EQ(numbers.size(), 95u);
  EXPECT_EQ(*numbers.begin(), 1);
  EXPECT_EQ(*numbers.rbegin(), 95);
}

TEST_F(GithubApiTest, SinglePageHasNoLinkAndPerPageIsCapped) {
  start(with_items(150));
  HttpResult single = get("/github/repos/org-1/repo-1/releases?per_page=100&page=2");
  EXPECT_EQ(single.json().size(), 50u);
  HttpResult capped = get("/github/repos/org-1/repo-1/releases?per_page=500");
  EXPECT_EQ(capped.json().size(), 100u);
  HttpResult defaulted = get("/github/repositories/100001/releases");
  EXPECT_EQ(defaulted.json().size(), 30u);

  start(with_items(20));
  HttpResult one_page = get("/github/repos/org-1/repo-1/releases?per_page=100");
  EXPECT_EQ(one_page.json().size(), 20u);
  EXPECT_FALSE(one_page.has_header("link"));
}

TEST_F(GithubApiTest, StateDefaultsToOpenLikeGithub) {
  start(with_items(100));
  const auto open = get("/github/repos/org-1/repo-1/pulls?per_page=100").json();
  const auto closed = get("/github/repos/org-1/repo-1/pulls?per_page=100&state=closed").json();
  EXPECT_EQ(open.size() + closed.size(), 100u);
  EXPECT_GT(open.size(), 0u);
  for (const auto& pull : open) EXPECT_EQ(pull["state"], "open");
  for (const auto& pull : closed) EXPECT_EQ(pull["state"], "closed");
  EXPECT_EQ(get("/github/repos/org-1/repo-1/pulls?state=bogus").status, 422);
}

TEST_F(GithubApiTest, PullsSortByUpdatedHonoursDirection) {
  start(with_items(60));
  const auto desc =
      get("/github/repos/org-1/repo-1/pulls?state=all&sort=updated&direction=desc&per_page=100")
          .json();
  const auto asc =
      get("/github/repos/org-1/repo-1/pulls?state=all&sort=updated&per_page=100").json();
  ASSERT_EQ(desc.size(), 60u);
  ASSERT_EQ(asc.size(), 60u);
  for (size_t k = 1; k < desc.size(); ++k) {
    EXPECT_GE(desc[k - 1]["updated_at"].get<std::string>(),
              desc[k]["updated_at"].get<std::string>());
  }
  // sort=updated without direction defaults to ascending (GitHub's rule).
  EXPECT_EQ(asc.front()["number"], desc.back()["number"]);
  EXPECT_EQ(asc.back()["number"], desc.front()["number"]);
}

TEST_F(GithubApiTest, IssuesIncludePullRequestEntriesAndHonourSince) {
  start(with_items(100));
  const auto all = get("/github/repos/org-1/repo-1/issues?state=all&per_page=100").json();
  const auto rest = get("/github/repos/org-1/repo-1/issues?state=all&per_page=100&page=2").json();
  ASSERT_EQ(all.size() + rest.size(), 120u);
  const auto pull_requests =
      std::count_if(all.begin(), all.end(),
                    [](const auto& i) { return i.contains("pull_request"); }) +
      std::count_if(rest.begin(), rest.end(),
                    [](const auto& i) { return i.contains("pull_request"); });
  EXPECT_EQ(pull_requests, 20);

  const std::string since = all[37]["updated_at"].get<std::string>();
  const auto expected = std::count_if(all.begin(), all.end(), [&](const auto& issue) {
    return issue["updated_at"].template get<std::string>() >= since;
  });
  const auto filtered =
      get("/github/repos/org-1/repo-1/issues?state=all&per_page=100&since=" + since).json();
  EXPECT_EQ(static_cast<int64_t>(filtered.size()), expected);
  for (const auto& issue : filtered) EXPECT_GE(issue["updated_at"].get<std::string>(), since);
  EXPECT_EQ(get("/github/repos/org-1/repo-1/issues?since=last-week").status, 422);
}

TEST_F(GithubApiTest, SinceIsCarriedVerbatimInLinks) {
  start(with_items(100));
  HttpResult page =
      get("/github/repos/org-1/repo-1/issues?state=all&per_page=5&since=2020-01-01T00%3A00%3A00Z");
  const auto link = parse_link(page.header("link"));
  EXPECT_EQ(link.urls.at("next"),
            sandbox_->base_url() +
                "/github/repositories/100001/"
                "issues?state=all&per_page=5&since=2020-01-01T00%3A00%3A00Z&page=2");
}

TEST_F(GithubApiTest, RepositoryIsReadableOnlyByItsInstallation) {
  SandboxOptions options = with_items(10);
  options.installations = 2;
  start(options);
  HttpResult repo = get("/github/repos/org-1/repo-2");
  ASSERT_EQ(repo.status, 200);
  EXPECT_EQ(repo.json()["id"], 100002);
  EXPECT_EQ(repo.json()["full_name"], "org-1/repo-2");
  EXPECT_EQ(repo.json()["permissions"]["pull"], true);
  EXPECT_EQ(repo.header("content-type"), "application/json; charset=utf-8");

  for (const std::string path :
       {"/github/repos/org-2/repo-1", "/github/repos/org-1/repo-9",
        "/github/repositories/200001/pulls", "/github/repos/org-1/repo-1/",
        // (1 + 2^59) * 10^5 + 1 wraps to org-1/repo-1's id 100001
        "/github/repos/org-576460752303423489/repo-1/pulls", "/github/repos/org-1/repo-100000"}) {
    HttpResult missing = get(path);
    EXPECT_EQ(missing.status, 404) << path;
    EXPECT_EQ(missing.json()["message"], "Not Found") << path;
    EXPECT_EQ(missing.json()["status"], "404") << path;
  }
}

TEST_F(GithubApiTest, EveryResponseCarriesRateLimitHeaders) {
  start(with_items(10));
  for (const HttpResult& result :
       {get("/github/repos/org-1/repo-1"), get("/github/repos/org-9/repo-1"),
        client_->get("/github/repos/org-1/repo-1", github_headers("ghs_unknown"))}) {
    for (const char* name : {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-used",
                             "x-ratelimit-reset", "x-ratelimit-resource"}) {
      EXPECT_TRUE(result.has_header(name)) << name << " on HTTP " << result.status;
    }
  }
}

TEST_F(GithubApiTest, BadCredentialsAndMissingUserAgent) {
  start(with_items(10));
  const std::string path = "/github/repos/org-1/repo-1";
  HttpResult no_token = client_->get(path, {{"User-Agent", "t"}});
  EXPECT_EQ(no_token.status, 401);
  EXPECT_EQ(no_token.json()["message"], "Bad credentials");
  EXPECT_EQ(client_->get(path, github_headers("ghs_nope")).status, 401);
  const std::string vercel_token = client_->token("vc-inst-1");
  EXPECT_EQ(client_->get(path, github_headers(vercel_token)).status, 401);
  EXPECT_EQ(client_->get(path, {{"Authorization", "token " + token_}, {"User-Agent", "t"}}).status,
            200);

  HttpResult no_agent = client_->get(path, {{"Authorization", "Bearer " + token_}});
  EXPECT_EQ(no_agent.status, 403);
  EXPECT_NE(no_agent.body.find("User-Agent"), std::string::npos);
}

TEST_F(GithubApiTest, TokenExpiresAfterItsLifetime) {
  SandboxOptions options = with_items(10);
  options.token_lifetime_s = 3600;
  start(options);
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 200);
  clock_.advance_ms(3600 * 1000);
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 401);
  token_ = client_->token("gh-inst-1");
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 200);
}

// The Date is the sandbox's clock, the one x-ratelimit-reset counts on, as GitHub's Date is its
// own: a client measures a reset against it (the GitHub connector does). It was the wall clock,
// far from an injected now_ms, so resets looked long past.
TEST_F(GithubApiTest, TheDateHeaderIsTheSandboxsClock) {
  start(with_items(10));
  EXPECT_EQ(get("/github/repos/org-1/repo-1").header("date"), "Fri, 15 Jan 2027 08:00:00 GMT");
  clock_.advance_ms(60'000);
  EXPECT_EQ(get("/github/repos/org-9/repo-1").header("date"), "Fri, 15 Jan 2027 08:01:00 GMT");
}

TEST_F(GithubApiTest, PrimaryRateLimitGives403WithRemainingZeroUntilTheWindowResets) {
  SandboxOptions options = with_items(10);
  options.installations = 2;
  options.faults.rate_limit = 3;
  options.faults.rate_window_s = 60;
  start(options);
  const int64_t window_end_s = (clock_.now_ms() + 60'000 + 999) / 1000;
  for (int remaining = 2; remaining >= 0; --remaining) {
    HttpResult ok = get("/github/repos/org-1/repo-1");
    ASSERT_EQ(ok.status, 200);
    EXPECT_EQ(ok.header("x-ratelimit-limit"), "3");
    EXPECT_EQ(ok.header("x-ratelimit-remaining"), std::to_string(remaining));
    EXPECT_EQ(ok.header("x-ratelimit-reset"), std::to_string(window_end_s));
  }
  HttpResult limited = get("/github/repos/org-1/repo-1");
  EXPECT_EQ(limited.status, 403);
  EXPECT_EQ(limited.header("x-ratelimit-remaining"), "0");
  EXPECT_NE(limited.json()["message"].get<std::string>().find("API rate limit exceeded"),
            std::string::npos);
  // The limit belongs to the installation, not the token; another installation has its own.
  EXPECT_EQ(client_->get("/github/repos/org-1/repo-1", github_headers(client_->token("gh-inst-1")))
                .status,
            403);
  EXPECT_EQ(client_->get("/github/repos/org-2/repo-1", github_headers(client_->token("gh-inst-2")))
                .status,
            200);

  clock_.advance_ms(60'000);
  HttpResult after_reset = get("/github/repos/org-1/repo-1");
  EXPECT_EQ(after_reset.status, 200);
  EXPECT_EQ(after_reset.header("x-ratelimit-remaining"), "2");
  EXPECT_EQ(sandbox_->report().faults_injected.at("rate_limited"), 2);
}

TEST_F(GithubApiTest, BurstsOf429StartEveryNthRequest) {
  SandboxOptions options = with_items(10);
  options.faults.burst_429_every = 3;
  options.faults.burst_len = 2;
  options.faults.retry_after_s = 7;
  start(options);
  std::vector<int> statuses;
  for (int k = 0; k < 7; ++k) {
    HttpResult result = get("/github/repos/org-1/repo-1");
    statuses.push_back(result.status);
    if (result.status == 429) {
      EXPECT_EQ(result.header("retry-after"), "7");
      EXPECT_TRUE(result.has_header("x-ratelimit-remaining"));
      EXPECT_NE(result.json()["message"].get<std::string>().find("secondary rate limit"),
                std::string::npos);
    }
  }
  EXPECT_EQ(statuses, (std::vector<int>{200, 200, 429, 429, 200, 429, 429}));
  EXPECT_EQ(sandbox_->report().faults_injected.at("burst_429"), 4);
}

TEST_F(GithubApiTest, TokenDiesAfterTtlRequestsAndANewTokenWorks) {
  SandboxOptions options = with_items(10);
  options.faults.token_ttl_requests = 2;
  start(options);
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 200);
  EXPECT_EQ(get("/github/repos/org-1/repo-1/pulls").status, 200);
  HttpResult dead = get("/github/repos/org-1/repo-1/pulls");
  EXPECT_EQ(dead.status, 401);
  EXPECT_EQ(dead.json()["message"], "Bad credentials");
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 401);
  token_ = client_->token("gh-inst-1");
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 200);
  EXPECT_EQ(sandbox_->report().faults_injected.at("token_expired"), 1);
}

// A TTL lowered below a token's uses retires it, counted once; a reset gives tokens their uses
// back, as it gives back everything else it counts.
TEST_F(GithubApiTest, ATokenRetiredByALoweredTtlIsCountedAndAResetRevivesIt) {
  SandboxOptions options = with_items(10);
  options.faults.token_ttl_requests = 5;
  start(options);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(get("/github/repos/org-1/repo-1").status, 200);
  Faults lowered = sandbox_->faults();
  lowered.token_ttl_requests = 2;
  sandbox_->set_faults(lowered);
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 401);
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 401);
  EXPECT_EQ(sandbox_->report().faults_injected.at("token_expired"), 1);
  ASSERT_EQ(client_->post("/_sandbox/reset", "").status, 200);
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 200);
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 200);
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 401);
  EXPECT_EQ(sandbox_->report().faults_injected.at("token_expired"), 1);
}

TEST_F(GithubApiTest, FailRateInjectsServerErrorsWithJsonBodies) {
  SandboxOptions options = with_items(10);
  options.faults.fail_rate = 1.0;
  start(options);
  HttpResult failed = get("/github/repos/org-1/repo-1/pulls");
  EXPECT_TRUE(failed.status == 502 || failed.status == 503) << failed.status;
  EXPECT_TRUE(failed.json().contains("message"));
  sandbox_->set_faults({});
  EXPECT_EQ(get("/github/repos/org-1/repo-1/pulls").status, 200);
  EXPECT_EQ(sandbox_->report().faults_injected.at("provider_5xx"), 1);
}

// Resource faults: one repository (by name or id), one list, after `skip` requests, for `count`.
TEST_F(GithubApiTest, ResourceFaultsFailOneRepositoryOrOnePageAndRequestsAreCountedPerResource) {
  start(with_items(30));
  TestClient control(sandbox_->port());
  HttpResult set = control.post("/_sandbox/faults",
                                R"({"resource_faults":[{"resource":"org-1/repo-2","status":404},)"
                                R"({"resource":"100001","list":"releases","skip":1,"count":1}]})");
  ASSERT_EQ(set.status, 200) << set.body;
  EXPECT_EQ(set.json()["resource_faults"][1]["status"], 500);
  HttpResult gone = get("/github/repositories/100002/pulls");
  EXPECT_EQ(gone.status, 404);
  EXPECT_EQ(gone.json()["message"], "Not Found");
  EXPECT_EQ(get("/github/repos/org-1/repo-2").status, 404);
  EXPECT_EQ(get("/github/repos/org-1/repo-3/pulls").status, 200);
  EXPECT_EQ(get("/github/repos/org-1/repo-1/releases?per_page=10&page=1").status, 200);
  HttpResult failed = get("/github/repositories/100001/releases?per_page=10&page=2");
  EXPECT_EQ(failed.status, 500);
  EXPECT_EQ(failed.json()["message"], "Server Error");
  EXPECT_EQ(get("/github/repositories/100001/releases?per_page=10&page=2").status, 200);
  EXPECT_EQ(get("/github/repos/org-1/repo-1/pulls").status, 200);
  // A faulted request gives its rate-limit unit back.
  EXPECT_EQ(get("/github/repos/org-1/repo-1").header("x-ratelimit-used"), "5");

  const Report report = sandbox_->report();
  EXPECT_EQ(report.faults_injected.at("resource"), 3);
  const nlohmann::json requests = control.get("/_sandbox/requests").json()["by_resource"];
  EXPECT_EQ(requests["org-1/repo-1"],
            (nlohmann::json{{"releases", 3}, {"pulls", 1}, {"repository", 1}}));
  EXPECT_EQ(requests["org-1/repo-2"], (nlohmann::json{{"pulls", 1}, {"repository", 1}}));
  EXPECT_EQ(requests["org-1/repo-3"], (nlohmann::json{{"pulls", 1}}));
  EXPECT_EQ(control.get("/_sandbox/requests?installation=inst-1").json()["by_resource"], requests);

  EXPECT_EQ(control.post("/_sandbox/faults", R"({"resource_faults":[{"resource":"x","list":"y"}]})")
                .json()["error"]["message"],
            "resource_faults[0].list must be one of pulls, issues, releases, repository, "
            "deployments, project");
  EXPECT_EQ(
      control.post("/_sandbox/faults", R"({"resource_faults":[{"resource":"x","page":1}]})").status,
      400);
  ASSERT_EQ(control.post("/_sandbox/faults", R"({"resource_faults":[]})").status, 200);
  EXPECT_EQ(get("/github/repos/org-1/repo-2/pulls").status, 200);
  ASSERT_EQ(control.post("/_sandbox/reset", "").status, 200);
  EXPECT_EQ(control.get("/_sandbox/requests").json()["by_resource"], nlohmann::json::object());
}

// per_page_over: only list requests for larger pages fail (a list too heavy to answer in time).
TEST_F(GithubApiTest, AResourceFaultOverAPageSizeFailsOnlyLargerPages) {
  start(with_items(30));
  TestClient control(sandbox_->port());
  HttpResult set = control.post(
      "/_sandbox/faults",
      R"({"resource_faults":[{"resource":"org-1/repo-1","status":502,"per_page_over":25}]})");
  ASSERT_EQ(set.status, 200) << set.body;
  EXPECT_EQ(set.json()["resource_faults"][0]["per_page_over"], 25);
  EXPECT_EQ(get("/github/repos/org-1/repo-1/pulls?per_page=100").status, 502);
  EXPECT_EQ(get("/github/repos/org-1/repo-1/pulls?per_page=26").status, 502);
  EXPECT_EQ(get("/github/repos/org-1/repo-1/pulls").status, 502);  // GitHub's default: 30
  EXPECT_EQ(get("/github/repos/org-1/repo-1/pulls?per_page=25").status, 200);
  EXPECT_EQ(get("/github/repos/org-1/repo-2/pulls?per_page=100").status, 200);
  EXPECT_EQ(get("/github/repos/org-1/repo-1").status, 200) << "the repository is no list";
  EXPECT_EQ(
      control
          .post("/_sandbox/faults", R"({"resource_faults":[{"resource":"x","per_page_over":-1}]})")
          .json()["error"]["message"],
      "resource_faults[0].per_page_over must be >= 0");
}

TEST_F(GithubApiTest, ConditionalRequestGives304WithoutUsingTheRateLimit) {
  start(with_items(10));
  HttpResult first = get("/github/repos/org-1/repo-1/pulls?state=all");
  const std::string etag = first.header("etag");
  ASSERT_FALSE(etag.empty());
  auto headers = github_headers(token_);
  headers.emplace_back("If-None-Match", etag);
  HttpResult second = client_->get("/github/repos/org-1/repo-1/pulls?state=all", headers);
  EXPECT_EQ(second.status, 304);
  EXPECT_EQ(second.header("x-ratelimit-remaining"), first.header("x-ratelimit-remaining"));
}

}  // namespace
}  // namespace backhaul::sandbox
