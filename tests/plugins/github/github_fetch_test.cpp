// Fetching pages: request URLs and headers, Link pagination, `since`, events and their payloads.
#include <algorithm>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "github_test_support.h"

namespace backhaul::github_test {
namespace {

using nlohmann::json;

// The recorded paginate-issues scenario (octokit/fixtures raw recording, 2022-07-19): a
// repository with id 515435940 and 13 issues, fetched 3 per page.
constexpr const char* kRecordedRepo =
    "octokit-fixture-org/tmp-scenario-paginate-issues-20220719043836917-izyoe";
constexpr const char* kRecordedRepoId = "515435940";
constexpr const char* kRecordedPage =
    "https://api.github.com/repositories/515435940/issues?per_page=3&page=";

std::string header(const http::Request& request, std::string_view name) {
  for (const auto& [n, v] : request.headers) {
    if (http::to_lower(n) == http::to_lower(name)) return v;
  }
  return "<absent>";
}

json payload_of(const plugins::Page& page, size_t i) {
  return json::parse(page.event(i).payload_json);
}

std::vector<std::string> delivery_ids(const plugins::Page& page) {
  std::vector<std::string> ids;
  for (size_t i = 0; i < page.size(); ++i) ids.emplace_back(page.event(i).delivery_id);
  return ids;
}

// Everything a walk over all pages produced.
struct Walk {
  std::vector<std::string> delivery_ids;
  std::vector<std::string> cursors;  // the next_cursor of every page but the last
  std::vector<backhaul_rate_limit_t> rate_limits;
  uint64_t raw_count = 0;
  int pages = 0;
};

Walk walk(const plugins::Connector& connector, plugins::FetchParams params, int max_pages = 20) {
  Walk w;
  while (w.pages < max_pages) {
    const plugins::Page page = connector.fetch_page(params);
    ++w.pages;
    for (auto& id : delivery_ids(page)) w.delivery_ids.push_back(std::move(id));
    if (const auto rl = page.rate_limit()) w.rate_limits.push_back(*rl);
    w.raw_count += page.raw_count();
    const auto next = page.next_cursor();
    if (!next) break;
    w.cursors.emplace_back(*next);
    params.cursor = std::string(*next);
  }
  return w;
}

class GithubFetchTest : public GithubPluginTest {
 protected:
  // The raw recording's five issue GETs, the first re-keyed to the URL this connector asks for
  // (octokit asked for "/repos/{owner}/{repo}/issues?per_page=3"; we ask by the repository's
  // number and add state/sort/direction). Pages 2-5 stay verbatim.
  void add_recorded_issue_pages() {
    std::vector<http::Exchange> pages = load_nock("recorded/paginate-issues.raw-fixture.json");
    ASSERT_EQ(pages.size(), 5u);
    pages[0].url = std::string(kApi) + "/repositories/" + kRecordedRepoId +
                   "/issues?state=all&sort=updated&direction=desc&per_page=3";
    pages[0].response.url = pages[0].url;
    add_all(std::move(pages));
  }
  // The recording asked for 3 per page.
  plugins::Connector recorded_connector(const std::string& extra = "") const {
    return connect("{\"per_page\":3" + extra + "}");
  }
  static plugins::FetchParams recorded_issues(std::optional<std::string> cursor = std::nullopt) {
    return params("issue", std::move(cursor), 0, unit(kRecordedRepoId, std::string(kRecordedRepo)));
  }
};

// --- requests ------------------------------------------------------------------------------------

TEST_F(GithubFetchTest, FirstPageUrlsFollowTheSpecPerEntityType) {
  const std::string base = "https://ghe.example.com/api/v3";
  const std::string repo = base + "/repositories/1000";
  const std::string pulls = repo + "/pulls?state=all&sort=updated&direction=desc&per_page=50";
  const std::string issues = repo + "/issues?state=all&sort=updated&direction=desc&per_page=50";
  const std::string issues_since = issues + "&since=2024-03-01T00:00:00Z";
  const std::string releases = repo + "/releases?per_page=50";
  for (const auto& url : {pulls, issues, issues_since, releases}) add_get(url, 200, "[]");

  // A trailing slash on base_url is tolerated (GitHub answers 404 to "//").
  const auto connector = connect(R"({"base_url":"https://ghe.example.com/api/v3/","per_page":50})");
  for (const char* type : {"pull_request", "issue", "release"}) {
    const plugins::Page page = connector.fetch_page(params(type));
    EXPECT_EQ(page.size(), 0u);
    EXPECT_FALSE(page.next_cursor());
  }
  // since: a parameter for issues (milliseconds dropped), never for pulls or releases.
  for (const char* type : {"pull_request", "issue", "release"}) {
    connector.fetch_page(params(type, std::nullopt, kSince20240301Ms + 999));
  }
  EXPECT_EQ(requested_urls(),
            (std::vector<std::string>{pulls, issues, releases, pulls, issues_since, releases}));
}

TEST_F(GithubFetchTest, DefaultsToApiGithubComAndOneHundredPerPage) {
  add_get(pulls_url(100), 200, "[]");
  connect("{}").fetch_page(params("pull_request"));
  EXPECT_EQ(requested_urls(), std::vector<std::string>{pulls_url(100)});
}

TEST_F(GithubFetchTest, SendsGithubHeadersWithEveryRequest) {
  add_recorded_issue_pages();
  walk(recorded_connector(R"(,"user_agent":"acme-backfill/2.1","timeout_ms":1234)"),
       recorded_issues());
  const auto requests = transport_.requests();
  ASSERT_EQ(requests.size(), 5u);
  for (const http::Request& r : requests) {
    EXPECT_EQ(r.method, "GET");
    EXPECT_EQ(header(r, "accept"), "application/vnd.github+json");
    EXPECT_EQ(header(r, "authorization"), std::string("Bearer ") + kToken);
    EXPECT_EQ(header(r, "x-github-api-version"), "2022-11-28");
    EXPECT_EQ(header(r, "user-agent"), "acme-backfill/2.1");
    EXPECT_EQ(r.timeout, std::chrono::milliseconds(1234));
  }
}

TEST_F(GithubFetchTest, DefaultUserAgentIsSent) {
  add_get(pulls_url(), 200, "[]");
  connect().fetch_page(params("pull_request"));
  EXPECT_EQ(header(transport_.requests().at(0), "user-agent"), "backhaul-github/1.0");
}

TEST_F(GithubFetchTest, TokensAreOpaque) {
  // The stateless installation token format (ghs_APPID_JWT) is long and has dots: send as is.
  const std::string token = "ghs_123456_eyJhbGciOiJSUzI1NiJ9." + std::string(400, 'x') + ".sig";
  add_get(pulls_url(), 200, "[]");
  plugins::Unit u = unit();
  u.access_token = token;
  connect().fetch_page(params("pull_request", std::nullopt, 0, u));
  EXPECT_EQ(header(transport_.requests().at(0), "authorization"), "Bearer " + token);
}

// (A list by name: the unit's resource id is a node id, not a number.)
TEST_F(GithubFetchTest, PercentEncodesOwnerAndRepoSegments) {
  const std::string url = std::string(kApi) + "/repos/o%26x/r%3Fy%20z.git_~-/releases?per_page=100";
  add_get(url, 200, "[]");
  connect().fetch_page(
      params("release", std::nullopt, 0, unit("R_kgDOH", std::string("o&x/r?y z.git_~-"))));
  EXPECT_EQ(requested_urls(), std::vector<std::string>{url});
}

// --- pagination ----------------------------------------------------------------------------------

TEST_F(GithubFetchTest, FollowsRecordedLinkHeadersToTheLastPage) {
  add_recorded_issue_pages();
  const Walk w = walk(recorded_connector(), recorded_issues());

  EXPECT_EQ(w.pages, 5);
  // The next URLs are used verbatim, although they switch to /repositories/{id}/.
  EXPECT_EQ(w.cursors, (std::vector<std::string>{
                           std::string(kRecordedPage) + "2", std::string(kRecordedPage) + "3",
                           std::string(kRecordedPage) + "4", std::string(kRecordedPage) + "5"}));
  const auto urls = requested_urls();
  EXPECT_EQ(std::vector<std::string>(urls.begin() + 1, urls.end()), w.cursors);

  std::vector<std::string> expected_ids;
  for (int n = 13; n >= 1; --n) {
    expected_ids.push_back("backfill-inst-42-515435940-issue-" + std::to_string(n));
  }
  EXPECT_EQ(w.delivery_ids, expected_ids);
  EXPECT_EQ(w.raw_count, 13u);
  EXPECT_TRUE(transport_.unmatched().empty());
}

// The reset is on the host's clock: as far after it as the recorded reset (1658208999) is after
// each page's Date (04:39:16 for the first two, 04:39:17 for the rest). Read as GitHub's epoch
// against a host clock ahead of GitHub's (here by 10 minutes), the reset looked nearer or past,
// and the rate-limit floor's wait (E2) was cut short or skipped.
TEST_F(GithubFetchTest, ReportsTheRateLimitOfEveryPage) {
  clock_.set_ms(1'658'205'556'000 + 600'000);  // the recording's 04:39:16, and 10 minutes
  add_recorded_issue_pages();
  const Walk w = walk(recorded_connector(), recorded_issues());
  ASSERT_EQ(w.rate_limits.size(), 5u);
  const int64_t host_now = clock_.now_ms();
  for (size_t i = 0; i < w.rate_limits.size(); ++i) {
    EXPECT_EQ(w.rate_limits[i].remaining, 4922 - static_cast<int64_t>(i));
    EXPECT_EQ(w.rate_limits[i].limit, 5000);
    EXPECT_EQ(w.rate_limits[i].reset_at_unix_ms, host_now + (i < 2 ? 3443 : 3442) * 1000) << i;
  }
}

// A Date more than a day from the host's clock is no skew (a broken proxy's, say): the reset is
// then read as it is, not moved by days. The recording's Date is 16 months before the host's here.
TEST_F(GithubFetchTest, AResetIsReadAsItIsWhenTheDateIsDaysAway) {
  add_recorded_issue_pages();
  const Walk w = walk(recorded_connector(), recorded_issues());
  ASSERT_EQ(w.rate_limits.size(), 5u);
  for (const backhaul_rate_limit_t& rl : w.rate_limits)
    EXPECT_EQ(rl.reset_at_unix_ms, 1'658'208'999'000);
}

TEST_F(GithubFetchTest, ResumesFromACursorInAFreshInstance) {
  add_recorded_issue_pages();
  const plugins::Page page =
      recorded_connector().fetch_page(recorded_issues(std::string(kRecordedPage) + "3"));
  EXPECT_EQ(delivery_ids(page), (std::vector<std::string>{"backfill-inst-42-515435940-issue-7",
                                                          "backfill-inst-42-515435940-issue-6",
                                                          "backfill-inst-42-515435940-issue-5"}));
  EXPECT_EQ(page.next_cursor(), std::string(kRecordedPage) + "4");
}

TEST_F(GithubFetchTest, NoRateLimitWithoutRateLimitHeaders) {
  add_get(pulls_url(), 200, "[]", {{"content-type", "application/json"}});
  const plugins::Page page = connect().fetch_page(params("pull_request"));
  EXPECT_FALSE(page.rate_limit());
}

TEST_F(GithubFetchTest, NoRateLimitFromMalformedRateLimitHeaders) {
  add_get(pulls_url(), 200, "[]",
          {{"x-ratelimit-limit", "5000"},
           {"x-ratelimit-remaining", "many"},
           {"x-ratelimit-reset", "1710075600"}});
  EXPECT_FALSE(connect().fetch_page(params("pull_request")).rate_limit());
}

TEST_F(GithubFetchTest, NoContentIsAnEmptyLastPageWithItsRateLimit) {
  add_scenario("204-no-content", pulls_url());
  const plugins::Page page = connect().fetch_page(params("pull_request"));
  EXPECT_EQ(page.size(), 0u);
  EXPECT_EQ(page.raw_count(), 0u);
  EXPECT_FALSE(page.next_cursor());
  ASSERT_TRUE(page.rate_limit());
  EXPECT_EQ(page.rate_limit()->remaining, 4957);
}

class GithubLinkHeaderTest : public GithubPluginTest,
                             public ::testing::WithParamInterface<const char*> {};

// Only the rel="next" target counts, however the header is laid out (RFC 8288).
TEST_P(GithubLinkHeaderTest, FindsTheNextLink) {
  add_get(pulls_url(), 200, "[]", {{"link", GetParam()}});
  const plugins::Page page = connect().fetch_page(params("pull_request"));
  EXPECT_EQ(page.next_cursor(),
            std::string("https://api.github.com/repositories/1000/pulls?page=2"))
      << GetParam();
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GithubLinkHeaderTest,
    ::testing::Values(
        R"(<https://api.github.com/repositories/1000/pulls?page=2>; rel="next", <https://api.github.com/repositories/1000/pulls?page=9>; rel="last")",
        R"(<https://api.github.com/repositories/1000/pulls?page=9>; rel="last", <https://api.github.com/repositories/1000/pulls?page=2>; rel="next")",
        R"(<https://api.github.com/repositories/1000/pulls?page=1>; rel="prev",<https://api.github.com/repositories/1000/pulls?page=2>;rel=next)",
        R"(  <https://api.github.com/repositories/1000/pulls?page=2> ;  title="a, b; c" ; rel = "next"  )",
        R"(<https://api.github.com/repositories/1000/pulls?page=2>; REL="Next Last")",
        R"(<https://api.github.com/repositories/1000/pulls?page=1>; title="rel=\"next\""; rel="first", <https://api.github.com/repositories/1000/pulls?page=2>; rel="next"; rel="prev")",
        R"(garbage, <https://api.github.com/repositories/1000/pulls?page=2>; rel="next")"));

// The host hands a repeated header over as it came, one entry per line (host.h); a next link in
// the second of two link lines ended the walk silently after the first page (review).
TEST_F(GithubFetchTest, ANextLinkInALaterLinkHeaderIsFollowed) {
  add_get(pulls_url(), 200, "[]",
          {{"link", R"(<https://api.github.com/repositories/1000/pulls?page=1>; rel="first")"},
           {"link", R"(<https://api.github.com/repositories/1000/pulls?page=3>; rel="next")"}});
  EXPECT_EQ(connect().fetch_page(params("pull_request")).next_cursor(),
            std::string("https://api.github.com/repositories/1000/pulls?page=3"));
}

TEST_F(GithubFetchTest, LastPageHasNoNextLink) {
  add_get(pulls_url(), 200, "[]",
          {{"link", R"(<https://api.github.com/repositories/1/pulls?page=4>; rel="prev", )"
                    R"(<https://api.github.com/repositories/1/pulls?page=1>; rel="first")"}});
  EXPECT_FALSE(connect().fetch_page(params("pull_request")).next_cursor());
}

// --- pages too heavy to answer in time -----------------------------------------------------------

// GitHub ends a request it cannot answer in 10 s with a 502 (or 504) and asks for a smaller
// per_page (API-FACTS A1). A list of heavy items failed so on every attempt until its unit was
// dead. Each failure is still RETRYABLE (the host retries the page and counts it), and the next
// call for the list's first page asks for half as many items; the walk goes on at that size.
TEST_F(GithubFetchTest, AFirstPageTooHeavyToAnswerInTimeIsAskedForAtHalfTheSize) {
  add_get(pulls_url(100), 502, "<html>Server Error</html>");
  add_get(pulls_url(50), 504, R"({"message":"We couldn't respond in time"})");
  add_get(pulls_url(25), 200, R"([{"number": 7, "user": {"login": "a"}}])",
          {{"link", "<" + pulls_url(25) + "&page=2>; rel=\"next\""}});
  const auto connector = connect();
  const auto first = failure_of([&] { connector.fetch_page(params("pull_request")); });
  EXPECT_EQ(first.status(), BACKHAUL_RETRYABLE);
  EXPECT_NE(std::string(first.what()).find("HTTP 502"), std::string::npos) << first.what();
  EXPECT_NE(std::string(first.what()).find("the next try asks for " + pulls_url(50)),
            std::string::npos)
      << first.what();
  EXPECT_EQ(failure_of([&] { connector.fetch_page(params("pull_request")); }).status(),
            BACKHAUL_RETRYABLE);
  const plugins::Page page = connector.fetch_page(params("pull_request"));
  ASSERT_EQ(page.size(), 1u);
  EXPECT_EQ(payload_of(page, 0)["number"], 7);
  EXPECT_EQ(page.next_cursor(), std::optional<std::string_view>(pulls_url(25) + "&page=2"));
  // The list's next walk begins at the size that worked, for a day; then at its own size again.
  connector.fetch_page(params("pull_request"));
  clock_.advance_ms(24LL * 3600 * 1000);
  EXPECT_EQ(failure_of([&] { connector.fetch_page(params("pull_request")); }).status(),
            BACKHAUL_RETRYABLE);
  EXPECT_EQ(requested_urls(),
            (std::vector<std::string>{pulls_url(100), pulls_url(50), pulls_url(25), pulls_url(25),
                                      pulls_url(100)}));
}

// A cursor to the first page (page=1) halves too, an odd per_page rounds down, and halving ends at
// 10 a page: 25, 12, and 12 again; the 502 stays RETRYABLE throughout.
TEST_F(GithubFetchTest, HalvingRoundsDownAndEndsAtTenAPage) {
  const std::string first = pulls_url(25) + "&page=1";
  add_get(first, 502, "");
  add_get(pulls_url(12) + "&page=1", 502, "");
  const auto connector = connect(R"({"per_page":25})");
  for (int call = 0; call < 3; ++call) {
    const auto f = failure_of([&] { connector.fetch_page(params("pull_request", first)); });
    EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE) << call;
    EXPECT_NE(std::string(f.what()).find("HTTP 502"), std::string::npos) << f.what();
  }
  EXPECT_EQ(requested_urls(), (std::vector<std::string>{first, pulls_url(12) + "&page=1",
                                                        pulls_url(12) + "&page=1"}));
}

// A later page keeps its size: where it starts at another size depends on how many items the
// server really puts on a page (a server's cap may be below per_page), and a guess could skip
// items. Nor are other server errors or pages of GitHub's own cursors (after=) halved.
TEST_F(GithubFetchTest, OnlyTimeoutsOfFirstPagesAreHalved) {
  const std::string third = pulls_url(100) + "&page=3";
  add_get(third, 502, "");
  add_get(pulls_url(100), 500, "");
  const std::string after = repo_by_id() + "/pulls?per_page=100&after=Y3Vyc29y";
  add_get(after, 502, "");
  const auto connector = connect();
  for (int call = 0; call < 2; ++call) {
    for (const std::optional<std::string>& cursor :
         {std::optional<std::string>(third), std::optional<std::string>(),
          std::optional<std::string>(after)}) {
      EXPECT_EQ(failure_of([&] { connector.fetch_page(params("pull_request", cursor)); }).status(),
                BACKHAUL_RETRYABLE);
    }
  }
  EXPECT_EQ(requested_urls(),
            (std::vector<std::string>{third, pulls_url(100), after, third, pulls_url(100), after}));
}

// --- cursors and units ---------------------------------------------------------------------------

TEST_F(GithubFetchTest, RejectsACursorThatIsNotAnAbsoluteHttpUrl) {
  const auto connector = connect();
  for (const char* cursor : {"page=2", "/repositories/1000/pulls?page=2", "ftp://api.github.com/x",
                             "", "https://", "https://api.github.com/repos/a b"}) {
    const auto f = failure_of([&] { connector.fetch_page(params("pull_request", cursor)); });
    EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT) << cursor;
    EXPECT_NE(std::string(f.what()).find("cursor"), std::string::npos) << f.what();
  }
  EXPECT_EQ(transport_.request_count(), 0u);
}

TEST_F(GithubFetchTest, NeverSendsTheTokenToAnotherHost) {
  const auto f = failure_of([&] {
    connect().fetch_page(params("pull_request", "https://attacker.example/repositories/1/pulls"));
  });
  EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_EQ(transport_.request_count(), 0u);
}

TEST_F(GithubFetchTest, AcceptsACursorOnTheSameOriginSpelledDifferently) {
  for (const std::string cursor : {"HTTPS://API.GITHUB.COM/repositories/1000/pulls?page=2",
                                   "https://api.github.com:443/repositories/1000/pulls?page=2"}) {
    add_get(cursor, 200, "[]");
    EXPECT_NO_THROW(connect().fetch_page(params("pull_request", cursor))) << cursor;
  }
}

// The token goes with the request, so a cursor must be a page of this unit's own list: not of
// another repository's, another kind's, or any other path of the same host (whose items would be
// delivered as this unit's). Found by review: only the host was compared.
TEST_F(GithubFetchTest, NeverFollowsACursorOutsideTheUnitsList) {
  const auto connector = connect();
  for (const char* path :
       {"/repositories/1001/pulls?page=2", "/repos/octokit-fixture-org/other/pulls?page=2",
        "/repositories/1000/issues?page=2", "/user/repos?page=2", "/repositories/1000/pulls/x",
        "/repositories/1000/pulls/../../../user/repos?page=2", "/repositories/1000/pullsx",
        "/api/v3/repositories/1000/pulls?page=2"}) {
    const std::string cursor = std::string(kApi) + path;
    const auto f = failure_of([&] { connector.fetch_page(params("pull_request", cursor)); });
    EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT) << cursor;
    EXPECT_NE(std::string(f.what()).find("is not a page of this unit's list"), std::string::npos)
        << f.what();
  }
  EXPECT_EQ(transport_.request_count(), 0u);

  // By name (ignoring case, as GitHub does) or by id; the query is GitHub's.
  for (const char* path : {"/repos/OctoKit-Fixture-Org/Hello-World/pulls?page=2&per_page=100",
                           "/repositories/1000/pulls"}) {
    const std::string cursor = std::string(kApi) + path;
    add_get(cursor, 200, "[]");
    EXPECT_NO_THROW(connector.fetch_page(params("pull_request", cursor))) << cursor;
  }
}

// GitHub Enterprise Server: base_url has a path, which a cursor's path starts with.
TEST_F(GithubFetchTest, ACursorKeepsToTheEnterpriseBasePath) {
  const auto connector = connect(R"({"base_url":"https://ghe.example/api/v3"})");
  const auto f = failure_of([&] {
    connector.fetch_page(params("issue", "https://ghe.example/repositories/1000/issues?page=2"));
  });
  EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(f.what()).find("/api/v3/repositories/1000/issues"), std::string::npos)
      << f.what();
  const std::string cursor = "https://ghe.example/api/v3/repositories/1000/issues?page=2";
  add_get(cursor, 200, "[]");
  EXPECT_NO_THROW(connector.fetch_page(params("issue", cursor)));
}

TEST_F(GithubFetchTest, ANextLinkToAnotherHostIsFatal) {
  add_get(pulls_url(), 200, "[]",
          {{"link", R"(<https://attacker.example/repositories/1/pulls?page=2>; rel="next")"}});
  const auto f = failure_of([&] { connect().fetch_page(params("pull_request")); });
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  EXPECT_NE(std::string(f.what()).find("rel=\"next\""), std::string::npos) << f.what();
}

TEST_F(GithubFetchTest, RequiresOwnerSlashRepoAndAResourceId) {
  const auto connector = connect();
  const auto missing = failure_of(
      [&] { connector.fetch_page(params("issue", std::nullopt, 0, unit("1", std::nullopt))); });
  EXPECT_EQ(missing.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(missing.what()).find("owner/repo"), std::string::npos) << missing.what();

  for (const char* name : {"", "hello-world", "a/b/c", "/repo", "owner/"}) {
    const auto f = failure_of([&] {
      connector.fetch_page(params("issue", std::nullopt, 0, unit("1", std::string(name))));
    });
    EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT) << name;
  }
  const auto no_id =
      failure_of([&] { connector.fetch_page(params("issue", std::nullopt, 0, unit(""))); });
  EXPECT_EQ(no_id.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_EQ(transport_.request_count(), 0u);
}

// A repository's name can change hands: renamed, its old name taken by a new repository. The
// first page asked by name then came from the new one, its items delivered with this unit's id
// (review). The id never changes hands, and next links use it already.
TEST_F(GithubFetchTest, TheFirstPageIsAskedForByTheRepositoryIdWhenItIsANumber) {
  const std::string by_id = std::string(kApi) + "/repositories/1000";
  const std::vector<std::string> urls = {
      by_id + "/pulls?state=all&sort=updated&direction=desc&per_page=100",
      by_id + "/issues?state=all&sort=updated&direction=desc&per_page=100",
      by_id + "/releases?per_page=100"};
  for (const auto& url : urls) add_get(url, 200, "[]");
  const auto connector = connect();
  for (const char* type : {"pull_request", "issue", "release"}) {
    EXPECT_NO_THROW(connector.fetch_page(params(type))) << type;
  }
  EXPECT_EQ(requested_urls(), urls);
}

// A unit whose resource id is not the repository's number (a node id) has only the name to go by.
TEST_F(GithubFetchTest, TheFirstPageIsAskedForByNameWhenTheResourceIdIsNotANumber) {
  const std::string url = std::string(kApi) + "/repos/" + kRepo + "/releases?per_page=100";
  add_get(url, 200, "[]");
  EXPECT_NO_THROW(connect().fetch_page(params("release", std::nullopt, 0, unit("R_kgDOH"))));
  EXPECT_EQ(requested_urls(), std::vector<std::string>{url});
}

TEST_F(GithubFetchTest, RejectsAnUnknownEntityType) {
  const auto f = failure_of([&] { connect().fetch_page(params("deployment")); });
  EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(f.what()).find("deployment"), std::string::npos);
}

// --- filtering and since -------------------------------------------------------------------------

TEST_F(GithubFetchTest, SkipsPullRequestsReturnedByTheIssuesEndpoint) {
  add_all(load_nock("synthetic/issues-with-pulls.json"));
  const plugins::Page page = connect().fetch_page(params("issue", std::nullopt, kSince20240301Ms));
  EXPECT_EQ(delivery_ids(page), (std::vector<std::string>{"backfill-inst-42-1000-issue-12",
                                                          "backfill-inst-42-1000-issue-10",
                                                          "backfill-inst-42-1000-issue-8"}));
  EXPECT_EQ(page.raw_count(), 5u);  // the two pull requests still count as fetched
  EXPECT_FALSE(page.next_cursor());
  for (size_t i = 0; i < page.size(); ++i) {
    EXPECT_EQ(page.event(i).event_type, "issues");
    EXPECT_FALSE(payload_of(page, i)["issue"].contains("pull_request"));
  }
}

TEST_F(GithubFetchTest, WalksAllPullRequestsWithoutSince) {
  add_all(load_nock("synthetic/pulls.json"));
  const Walk w = walk(connect(R"({"per_page":3})"), params("pull_request"));
  EXPECT_EQ(w.pages, 2);
  EXPECT_EQ(w.cursors, std::vector<std::string>{
                           "https://api.github.com/repositories/1000/pulls?state=all&sort=updated&"
                           "direction=desc&per_page=3&page=2"});
  EXPECT_EQ(w.delivery_ids,
            (std::vector<std::string>{"backfill-inst-42-1000-pr-7", "backfill-inst-42-1000-pr-6",
                                      "backfill-inst-42-1000-pr-5", "backfill-inst-42-1000-pr-4",
                                      "backfill-inst-42-1000-pr-3"}));
}

TEST_F(GithubFetchTest, StopsPullRequestsAtTheFirstOneOlderThanSince) {
  add_all(load_nock("synthetic/pulls.json"));
  const plugins::Page page =
      connect(R"({"per_page":3})")
          .fetch_page(params("pull_request", std::nullopt, kSince20240301Ms));
  // #5 was updated 2024-02-20: dropped, and page 2 (all older) is never requested.
  EXPECT_EQ(delivery_ids(page),
            (std::vector<std::string>{"backfill-inst-42-1000-pr-7", "backfill-inst-42-1000-pr-6"}));
  EXPECT_EQ(page.raw_count(), 3u);
  EXPECT_FALSE(page.next_cursor());
  EXPECT_EQ(transport_.request_count(), 1u);
}

TEST_F(GithubFetchTest, SinceIsInclusive) {
  add_all(load_nock("synthetic/pulls.json"));
  // #6 was updated at exactly 2024-03-05T08:00:00Z.
  const int64_t at_pr6 = 1'709'625'600'000;
  const plugins::Page page =
      connect(R"({"per_page":3})").fetch_page(params("pull_request", std::nullopt, at_pr6));
  EXPECT_EQ(page.size(), 2u);
  EXPECT_FALSE(page.next_cursor());
}

TEST_F(GithubFetchTest, ReleasesDropOlderOnesOnEveryPage) {
  add_all(load_nock("synthetic/releases.json"));
  const Walk w =
      walk(connect(R"({"per_page":3})"), params("release", std::nullopt, kSince20240301Ms));
  // Page 1: the draft (created 03-12) and v3.0.0 (published 03-10) stay, v2.0.0 goes. Pages 2
  // and 3 are all older, and walked all the same.
  EXPECT_EQ(w.delivery_ids, (std::vector<std::string>{"backfill-inst-42-1000-release-1004",
                                                      "backfill-inst-42-1000-release-1003"}));
  EXPECT_EQ(w.pages, 3);
  EXPECT_EQ(w.raw_count, 6u);
  EXPECT_EQ(transport_.request_count(), 3u);
}

// Releases are listed by `created_at`, the date of the tag's commit: a release published inside
// the window from an old commit (a maintenance branch's patch) comes after a page of releases
// older than the window. The walk stopped at that page, and the release was never fetched.
TEST_F(GithubFetchTest, AReleasePublishedLateFromAnOldCommitIsFoundAfterAPageOfOlderOnes) {
  const std::string first = repo_by_id() + "/releases?per_page=2";
  const std::string second = std::string(kApi) + "/repositories/1000/releases?per_page=2&page=2";
  auto release = [](int id, const char* created, const char* published) {
    return json{{"id", id},
                {"tag_name", "v" + std::to_string(id)},
                {"draft", false},
                {"created_at", created},
                {"published_at", published}};
  };
  add_get(first, 200,
          json::array({release(10, "2024-02-20T00:00:00Z", "2024-02-20T00:00:00Z"),
                       release(9, "2024-02-10T00:00:00Z", "2024-02-10T00:00:00Z")})
              .dump(),
          {{"link", "<" + second + R"(>; rel="next")"}});
  add_get(second, 200,
          json::array({release(8, "2023-04-01T00:00:00Z", "2024-03-15T00:00:00Z")}).dump());
  const Walk w =
      walk(connect(R"({"per_page":2})"), params("release", std::nullopt, kSince20240301Ms));
  EXPECT_EQ(w.delivery_ids, (std::vector<std::string>{"backfill-inst-42-1000-release-8"}));
  EXPECT_EQ(transport_.request_count(), 2u);
}

TEST_F(GithubFetchTest, ReleasesWithoutSinceFollowEveryPage) {
  add_all(load_nock("synthetic/releases.json"));
  const Walk w = walk(connect(R"({"per_page":3})"), params("release"));
  EXPECT_EQ(w.pages, 3);
  EXPECT_EQ(w.delivery_ids.size(), 6u);
  EXPECT_EQ(w.delivery_ids.back(), "backfill-inst-42-1000-release-999");
}

// --- delivery ids and payloads -------------------------------------------------------------------

// The recordings as another repository of the installation would answer them: the same items,
// under the name "octokit-fixture-org/other" and the id 2000 (each cursor is its own list's).
std::vector<http::Exchange> as_repository_2000(std::vector<http::Exchange> exchanges) {
  const auto replace_all = [](std::string& text, const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  };
  for (http::Exchange& e : exchanges) {
    for (std::string* text : {&e.url, &e.response.url}) {
      replace_all(*text, "/repos/octokit-fixture-org/hello-world/",
                  "/repos/octokit-fixture-org/other/");
      replace_all(*text, "/repositories/1000/", "/repositories/2000/");
    }
    for (auto& [name, value] : e.response.headers) {
      if (name == "link") replace_all(value, "/repositories/1000/", "/repositories/2000/");
    }
  }
  return exchanges;
}

TEST_F(GithubFetchTest, DeliveryIdsAreUniqueDeterministicAndContainTheResourceId) {
  for (const char* file : {"synthetic/pulls.json", "synthetic/releases.json"}) {
    add_all(load_nock(file));
    add_all(as_repository_2000(load_nock(file)));
  }
  const auto connector = connect(R"({"per_page":3})");
  const auto all_ids = [&](const plugins::Unit& u) {
    std::vector<std::string> ids;
    for (const char* type : {"pull_request", "release"}) {
      const Walk w = walk(connector, params(type, std::nullopt, 0, u));
      EXPECT_GT(w.cursors.size(), 0u) << type << ": more than one page";
      ids.insert(ids.end(), w.delivery_ids.begin(), w.delivery_ids.end());
    }
    return ids;
  };
  const std::vector<std::string> first = all_ids(unit("1000"));
  EXPECT_EQ(all_ids(unit("1000")), first);  // deterministic
  EXPECT_EQ(std::set<std::string>(first.begin(), first.end()).size(), first.size());
  for (const auto& id : first) {
    EXPECT_EQ(id.rfind("backfill-inst-42-1000-", 0), 0u) << id;
  }
  // The same items in another repository of the installation never collide (seed 000).
  const std::vector<std::string> other = all_ids(unit("2000", "octokit-fixture-org/other"));
  EXPECT_EQ(other.size(), first.size());
  for (const auto& id : other) {
    EXPECT_EQ(id.rfind("backfill-inst-42-2000-", 0), 0u) << id;
    EXPECT_EQ(std::find(first.begin(), first.end(), id), first.end()) << id;
  }
}

// A next link off the unit's list is FATAL when it comes, not saved as the checkpoint to be
// refused as the next call's cursor (a unit then stuck until an operator reset it).
TEST_F(GithubFetchTest, ANextLinkOffTheUnitsListIsFatalBeforeItIsSaved) {
  add_get(pulls_url(), 200, "[]",
          {{"link", R"(<https://api.github.com/repositories/1001/pulls?page=2>; rel="next")"}});
  const auto f = failure_of([&] { connect().fetch_page(params("pull_request")); });
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  EXPECT_NE(std::string(f.what()).find("is not a page of this unit's list"), std::string::npos)
      << f.what();
}

TEST_F(GithubFetchTest, PullRequestEventsAreWebhookShaped) {
  const auto recorded = load_nock("synthetic/pulls.json");
  add_all(recorded);
  const plugins::Page page = connect(R"({"per_page":3})").fetch_page(params("pull_request"));
  ASSERT_EQ(page.size(), 3u);
  const json items = json::parse(recorded[0].response.body);

  for (size_t i = 0; i < page.size(); ++i) {
    EXPECT_EQ(page.event(i).event_type, "pull_request");
    const json payload = payload_of(page, i);
    ASSERT_TRUE(payload.is_object());
    EXPECT_EQ(payload.size(), 5u) << payload.dump().substr(0, 200);
    EXPECT_EQ(payload["number"], items[i]["number"]);
    json item = items[i];
    item["merged"] = !item["merged_at"].is_null();
    EXPECT_TRUE(payload["pull_request"] == item)  // the list item, with the webhook's `merged`
        << payload["pull_request"].dump().substr(0, 200);
    EXPECT_TRUE(payload["sender"] == items[i]["user"]) << payload["sender"].dump();
    EXPECT_EQ(payload["repository"],
              json::parse(R"({"id":1000,"full_name":"octokit-fixture-org/hello-world",)"
                          R"("name":"hello-world","owner":{"login":"octokit-fixture-org"}})"));
  }
  EXPECT_EQ(payload_of(page, 0)["action"], "opened");  // #7 open
  EXPECT_EQ(payload_of(page, 1)["action"], "closed");  // #6 merged
  EXPECT_EQ(payload_of(page, 2)["action"], "closed");  // #5 closed
}

// What receivers of real webhooks read must be where they expect it, with the same JSON types.
TEST_F(GithubFetchTest, PayloadsMatchRealWebhookDeliveries) {
  add_all(load_nock("synthetic/pulls.json"));
  add_all(load_nock("synthetic/releases.json"));
  add_all(load_nock("synthetic/issues-with-pulls.json"));
  const struct {
    const char* config;  // the recordings' page sizes
    const char* entity_type;
    int64_t since;
    std::optional<std::string> cursor;  // release page 2 starts with a published release
    const char* webhook;
    const char* item_key;
  } cases[] = {
      {R"({"per_page":3})", "pull_request", 0, std::nullopt, "pull_request-opened", "pull_request"},
      {"{}", "issue", kSince20240301Ms, std::nullopt, "issues-opened", "issue"},
      {R"({"per_page":3})", "release", 0,
       "https://api.github.com/repositories/1000/releases?per_page=3&page=2", "release-published",
       "release"}};
  for (const auto& c : cases) {
    const json real =
        read_json(fixture_path(std::string("recorded/webhooks/") + c.webhook + ".payload.json"));
    const plugins::Page page =
        connect(c.config).fetch_page(params(c.entity_type, c.cursor, c.since));
    ASSERT_GT(page.size(), 0u) << c.entity_type;
    const json ours = payload_of(page, 0);
    for (const auto& [key, value] : ours.items()) {
      ASSERT_TRUE(real.contains(key)) << c.webhook << " has no " << key;
      EXPECT_EQ(value.type(), real[key].type()) << key;
    }
    EXPECT_EQ(page.event(0).event_type, real.contains("pull_request") ? "pull_request"
                                        : real.contains("issue")      ? "issues"
                                                                      : "release");
    EXPECT_EQ(ours["action"], real["action"]) << c.webhook;
    for (const char* key : {"id", "full_name", "name"}) {
      EXPECT_EQ(ours["repository"][key].type(), real["repository"][key].type()) << key;
    }
    EXPECT_EQ(ours["repository"]["owner"]["login"].type(),
              real["repository"]["owner"]["login"].type());
    EXPECT_EQ(ours[c.item_key]["id"].type(), real[c.item_key]["id"].type());
    // The keys every delivery has, and the pull request's `merged` (a list item lacks it).
    for (const char* key : {"action", "repository", "sender"})
      EXPECT_TRUE(ours.contains(key)) << c.webhook << ": ours has no " << key;
    EXPECT_EQ(ours["sender"]["login"].type(), real["sender"]["login"].type()) << c.webhook;
    EXPECT_EQ(ours[c.item_key].contains("merged"), real[c.item_key].contains("merged"))
        << c.webhook;
  }
}

// `merged`, which a receiver of a "closed" pull_request reads, is derived from `merged_at`.
TEST_F(GithubFetchTest, APullRequestsMergedComesFromItsMergedAt) {
  add_get(pulls_url(), 200, R"([
    {"number": 2, "state": "closed", "merged_at": "2024-03-01T00:00:00Z", "user": {"login": "a"}},
    {"number": 1, "state": "closed", "merged_at": null, "user": {"login": "b"}}])");
  const plugins::Page page = connect().fetch_page(params("pull_request"));
  ASSERT_EQ(page.size(), 2u);
  EXPECT_EQ(payload_of(page, 0)["pull_request"]["merged"], true);
  EXPECT_EQ(payload_of(page, 1)["pull_request"]["merged"], false);
  EXPECT_EQ(payload_of(page, 0)["sender"]["login"], "a");
  EXPECT_EQ(payload_of(page, 1)["sender"]["login"], "b");
}

TEST_F(GithubFetchTest, DraftReleasesAreCreatedAndOthersPublished) {
  add_all(load_nock("synthetic/releases.json"));
  const plugins::Page page = connect(R"({"per_page":3})").fetch_page(params("release"));
  ASSERT_EQ(page.size(), 3u);
  EXPECT_EQ(page.event(0).event_type, "release");
  EXPECT_EQ(payload_of(page, 0)["action"], "created");  // the draft
  EXPECT_EQ(payload_of(page, 0)["release"]["draft"], true);
  EXPECT_EQ(payload_of(page, 1)["action"], "published");
  EXPECT_EQ(payload_of(page, 1)["release"]["tag_name"], "v3.0.0");
  EXPECT_FALSE(payload_of(page, 1).contains("number"));
}

TEST_F(GithubFetchTest, IssueEventsCarryTheIssueAndItsState) {
  add_recorded_issue_pages();
  const plugins::Page page = recorded_connector().fetch_page(recorded_issues());
  const json payload = payload_of(page, 0);
  EXPECT_EQ(payload["action"], "opened");
  EXPECT_EQ(payload["issue"]["number"], 13);
  EXPECT_EQ(payload["issue"]["title"], "Test issue 13");
  EXPECT_EQ(payload["repository"]["id"], 515435940);
  EXPECT_EQ(payload["repository"]["full_name"], kRecordedRepo);
  EXPECT_FALSE(payload.contains("number"));
}

TEST_F(GithubFetchTest, ANonNumericResourceIdStaysAString) {
  // A node id tells no number to ask by: the first page is asked for by name.
  std::vector<http::Exchange> pages = load_nock("synthetic/releases.json");
  pages[0].url = std::string(kApi) + "/repos/" + kRepo + "/releases?per_page=3";
  pages[0].response.url = pages[0].url;
  add_all(std::move(pages));
  const plugins::Page page =
      connect(R"({"per_page":3})").fetch_page(params("release", std::nullopt, 0, unit("R_kgDOH")));
  EXPECT_EQ(payload_of(page, 0)["repository"]["id"], "R_kgDOH");
  EXPECT_EQ(page.event(0).delivery_id, "backfill-inst-42-R_kgDOH-release-1004");
  // Its list by id is any repository number's (GitHub's next links name the number, which a node
  // id does not tell): the next page is fetched. By name, only its own list.
  const std::optional<std::string> next(page.next_cursor());
  ASSERT_TRUE(next.has_value());
  EXPECT_NE(next->find("/repositories/1000/releases?"), std::string::npos) << *next;
  const plugins::Page second =
      connect(R"({"per_page":3})").fetch_page(params("release", next, 0, unit("R_kgDOH")));
  EXPECT_GT(second.size(), 0u);
  for (const char* path : {"/repositories/1001/pulls?page=2", "/repositories//releases?page=2",
                           "/repositories/1x/releases?page=2", "/repositories/1/2/releases?page=2",
                           "/repos/octokit-fixture-org/other/releases?page=2"}) {
    const std::string cursor = std::string(kApi) + path;
    const auto f =
        failure_of([&] { connect().fetch_page(params("release", cursor, 0, unit("R_kgDOH"))); });
    EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT) << cursor;
    EXPECT_NE(std::string(f.what()).find(" or /repositories/{id}/releases)"), std::string::npos)
        << f.what();
  }
}

// --- concurrency ---------------------------------------------------------------------------------

TEST_F(GithubFetchTest, ConcurrentFetchesOnOneInstanceAreIndependent) {
  add_recorded_issue_pages();
  add_all(load_nock("synthetic/pulls.json"));
  const auto connector = recorded_connector();
  std::vector<std::thread> threads;
  std::vector<Walk> results(8);
  std::vector<std::string> errors(results.size());
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      try {
        results[t] =
            t % 2 ? walk(connector, recorded_issues()) : walk(connector, params("pull_request"));
      } catch (const std::exception& e) {
        errors[t] = e.what();  // gtest assertions are not for other threads
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t t = 0; t < results.size(); ++t) {
    EXPECT_EQ(errors[t], "") << t;
    EXPECT_EQ(results[t].delivery_ids.size(), t % 2 ? 13u : 5u) << t;
    EXPECT_EQ(results[t].pages, t % 2 ? 5 : 2) << t;
  }
}

}  // namespace
}  // namespace backhaul::github_test
