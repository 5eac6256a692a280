// How every HTTP outcome maps to a status (SPEC C1, API-FACTS A4/A5), and validate_scopes.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "github_test_support.h"

namespace backhaul::github_test {
namespace {

class GithubStatusTest : public GithubPluginTest {
 protected:
  // Fetches the first pull request page, answered by the named scenario of errors.json.
  plugins::ConnectorFailure fetch_failure(const std::string& scenario) {
    add_scenario(scenario, pulls_url());
    return failure_of([&] { connect().fetch_page(params("pull_request")); });
  }
  // Each call asks with a per_page of its own: the transport answers a URL with its first
  // recording, so the calls of one test would otherwise all get the first call's answer.
  plugins::ConnectorFailure fetch_failure_for(int status, std::string body,
                                              http::Headers headers = {}) {
    const int per_page = next_per_page_--;
    add_get(pulls_url(per_page), status, std::move(body), std::move(headers));
    return failure_of([&] {
      connect("{\"per_page\":" + std::to_string(per_page) + "}").fetch_page(params("pull_request"));
    });
  }

 private:
  int next_per_page_ = 100;
};

void expect_message(const plugins::ConnectorFailure& f, const std::string& part) {
  EXPECT_NE(std::string(f.what()).find(part), std::string::npos)
      << "\"" << f.what() << "\" lacks \"" << part << "\"";
  EXPECT_EQ(std::string(f.what()).find(kToken), std::string::npos) << f.what();
}

TEST_F(GithubStatusTest, UnauthorizedIsAuthExpired) {
  const auto f = fetch_failure("401-bad-credentials");
  EXPECT_EQ(f.status(), BACKHAUL_AUTH_EXPIRED);
  expect_message(f, "HTTP 401");
  expect_message(f, "Bad credentials");
}

TEST_F(GithubStatusTest, PrimaryLimitWaitsUntilResetPlusOneSecond) {
  // reset 1700000120 s; the clock is at 1'700'000'000'000 ms.
  auto f = fetch_failure("403-primary-rate-limit");
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 121'000);
  expect_message(f, "API rate limit exceeded");

  clock_.advance_ms(100'500);
  f = failure_of([&] { connect().fetch_page(params("pull_request")); });
  EXPECT_EQ(f.retry_after_ms(), 20'500);

  clock_.set_ms(1'800'000'000'000);  // long past the reset: just the margin
  f = failure_of([&] { connect().fetch_page(params("pull_request")); });
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 1'000);
}

TEST_F(GithubStatusTest, PrimaryLimitAlsoComesAs429) {
  const auto f = fetch_failure("429-primary-rate-limit");
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 121'000);
}

TEST_F(GithubStatusTest, SecondaryLimitHonoursRetryAfter) {
  // The real capture: retry-after: 60 and no x-ratelimit-* headers.
  const auto f = fetch_failure("403-secondary-retry-after");
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 60'000);
  expect_message(f, "secondary rate limit");
}

// A secondary limit hit while the primary window is also spent gives both signs: the longer
// wait holds, whichever it is (the clock is at 1'700'000'000 s).
constexpr const char* kSecondaryBody = R"({"message":"You have exceeded a secondary rate limit."})";

TEST_F(GithubStatusTest, ARetryAfterLongerThanTheExhaustedWindowHolds) {
  const auto f = fetch_failure_for(
      403, kSecondaryBody,
      {{"retry-after", "60"}, {"x-ratelimit-remaining", "0"}, {"x-ratelimit-reset", "1700000005"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 60'000);
}

TEST_F(GithubStatusTest, AnExhaustedWindowLongerThanTheRetryAfterHolds) {
  const auto f = fetch_failure_for(
      429, kSecondaryBody,
      {{"retry-after", "60"}, {"x-ratelimit-remaining", "0"}, {"x-ratelimit-reset", "1700000120"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 121'000);
}

TEST_F(GithubStatusTest, SecondaryLimitWithoutRetryAfterWaitsOneMinute) {
  const auto f = fetch_failure("403-secondary-no-retry-after");
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 60'000);
}

TEST_F(GithubStatusTest, TooManyRequestsHonoursRetryAfter) {
  const auto f = fetch_failure("429-retry-after");
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 30'000);
}

TEST_F(GithubStatusTest, BareTooManyRequestsWaitsOneMinute) {
  const auto f = fetch_failure_for(429, "");
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 60'000);
}

TEST_F(GithubStatusTest, ExhaustedWindowWithoutResetWaitsOneMinute) {
  const auto f = fetch_failure_for(403, R"({"message":"API rate limit exceeded"})",
                                   {{"x-ratelimit-remaining", "0"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 60'000);
}

TEST_F(GithubStatusTest, AnAbsurdResetOrRetryAfterIsIgnored) {
  const auto f = fetch_failure_for(403, R"({"message":"API rate limit exceeded"})",
                                   {{"x-ratelimit-remaining", "0"},
                                    {"x-ratelimit-limit", "5000"},
                                    {"x-ratelimit-reset", "9223372036854775807"},
                                    {"retry-after", "-5"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 60'000);
}

// GitHub's own client takes any retry-after for a limit ("The Retry-After header can sometimes be
// blank"): a 403 read as a permission error instead dead-lettered a unit that only had to wait.
TEST_F(GithubStatusTest, ABlankRetryAfterIsARateLimitOfOneMinute) {
  const auto f = fetch_failure_for(403, "", {{"retry-after", ""}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 60'000);
}

// RFC 9110 allows an HTTP-date: the wait runs until then by the response's own clock (its Date),
// since the host's may be off by minutes.
TEST_F(GithubStatusTest, AnHttpDateRetryAfterWaitsUntilThatDateByTheResponsesClock) {
  const auto f = fetch_failure_for(403, "",
                                   {{"date", "Tue, 14 Nov 2023 22:11:40 GMT"},  // host - 100 s
                                    {"retry-after", "Tue, 14 Nov 2023 22:13:20 GMT"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 100'000);
}

TEST_F(GithubStatusTest, AnHttpDateRetryAfterWithoutADateIsMeasuredByTheHostClock) {
  // The clock is at 1'700'000'000 s = Tue, 14 Nov 2023 22:13:20 GMT.
  const auto f = fetch_failure_for(429, "", {{"retry-after", "Tue, 14 Nov 2023 22:15:00 GMT"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 100'000);
}

// Rounded up: retrying half a second early is retrying while still limited.
TEST_F(GithubStatusTest, AFractionalRetryAfterIsRoundedUpToWholeSeconds) {
  const auto f = fetch_failure_for(403, "", {{"retry-after", "1.5"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 2'000);
}

TEST_F(GithubStatusTest, AnUnreadableRetryAfterIsARateLimitOfOneMinute) {
  for (const char* value : {"soon", "-5", "1e3", "Tue, 14 Nov 2023 22:15:00 UTC"}) {
    const auto f = fetch_failure_for(403, "", {{"retry-after", value}});
    EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED) << value;
    EXPECT_EQ(f.retry_after_ms(), 60'000) << value;
  }
}

// Seen in the wild without x-ratelimit-remaining (API-FACTS A4 quotes the message).
TEST_F(GithubStatusTest, ARateLimitMessageWithoutRemainingIsARateLimit) {
  const auto f = fetch_failure_for(
      403, R"({"message":"API rate limit exceeded for user ID 1.","status":"403"})",
      {{"x-ratelimit-limit", "5000"}, {"x-ratelimit-reset", "1700000120"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 60'000);
}

// GitHub's wording for secondary limits before "secondary rate limit".
TEST_F(GithubStatusTest, TheOlderAbuseDetectionWordingIsARateLimit) {
  const auto f = fetch_failure_for(
      403,
      R"({"message":"You have triggered an abuse detection mechanism. Please wait a few minutes before you try again."})");
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 60'000);
}

// retry_after_ms 0 means "unknown" to the host (status.h), which then retried every second for as
// long as the limit lasted. octokit reads it as absent: Number(retry-after) || 60.
TEST_F(GithubStatusTest, ARetryAfterOfZeroWaitsTheDefaultMinuteNotZero) {
  for (const int status : {403, 429}) {
    const auto f = fetch_failure_for(status, "", {{"retry-after", "0"}});
    EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED) << status;
    EXPECT_EQ(f.retry_after_ms(), 60'000) << status;
  }
}

// ... and a retry-after of 0 beside an exhausted window leaves the window's wait.
TEST_F(GithubStatusTest, ARetryAfterOfZeroLeavesTheWaitForTheReset) {
  const auto f = fetch_failure_for(
      403, "",
      {{"retry-after", "0"}, {"x-ratelimit-remaining", "0"}, {"x-ratelimit-reset", "1700000120"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 121'000);
}

// x-ratelimit-reset is GitHub's clock: a host clock 100 s ahead saw the reset as past and waited
// only the 1 s margin, a minute and a half early. The response's Date is GitHub's clock too.
TEST_F(GithubStatusTest, TheResetIsMeasuredAgainstTheResponsesDateNotTheHostClock) {
  const auto f = fetch_failure_for(403, R"({"message":"API rate limit exceeded"})",
                                   {{"date", "Tue, 14 Nov 2023 22:11:40 GMT"},  // host - 100 s
                                    {"x-ratelimit-remaining", "0"},
                                    {"x-ratelimit-limit", "5000"},
                                    {"x-ratelimit-reset", "1699999990"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 91'000);
}

// Only the IMF-fixdate of RFC 9110 is read; any other Date leaves the host clock (reset 120 s
// ahead of it: 121 s).
class GithubDateHeaderTest : public GithubStatusTest,
                             public ::testing::WithParamInterface<const char*> {};

TEST_P(GithubDateHeaderTest, AnythingButAnImfFixdateLeavesTheHostClock) {
  const auto f = fetch_failure_for(
      403, "",
      {{"date", GetParam()}, {"x-ratelimit-remaining", "0"}, {"x-ratelimit-reset", "1700000120"}});
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 121'000) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(
    NotImfFixdate, GithubDateHeaderTest,
    ::testing::Values("", "garbage", "Tuesday, 14-Nov-23 22:11:40 GMT",  // RFC 850
                      "Tue Nov 14 22:11:40 2023",                        // asctime
                      "Tue, 14 Nov 2023 22:11:40 UTC", "Tue, 14 Nov 2023 22:11:40 gmt",
                      "Tue, 14 nov 2023 22:11:40 GMT", "Wed, 14 Nov 2023 22:11:40 GMT",
                      "Tue, 4 Nov 2023 22:11:40 GMT", "Fri, 31 Nov 2023 22:11:40 GMT",
                      "Tue, 14 Nov 2023 24:11:40 GMT", "Tue, 14 Nov 2023 22:11:40 GMT x",
                      "Tue,  14 Nov 2023 22:11:40 GMT", "Tue, 14 Nov 2023 22:11:4x GMT"));

// A 408 or 425 says "send it again", not that the request is wrong.
TEST_F(GithubStatusTest, RequestTimeoutAndTooEarlyAreRetryable) {
  for (const int status : {408, 425}) {
    const auto f = fetch_failure_for(status, "");
    EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE) << status;
    expect_message(f, "HTTP " + std::to_string(status));
  }
}

TEST_F(GithubStatusTest, ForbiddenWithoutRateLimitSignsIsAPermissionError) {
  const auto f = fetch_failure("403-permission");
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, "HTTP 403");
  expect_message(f, "Resource not accessible by integration");
  expect_message(f, "pull_requests=read");
}

TEST_F(GithubStatusTest, NotFoundIsFatal) {
  const auto f = fetch_failure("404-not-found");
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, "HTTP 404");
  expect_message(f, "Not Found");
}

TEST_F(GithubStatusTest, GoneIsFatal) {
  const auto f = fetch_failure("410-issues-disabled");
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, "HTTP 410");
  expect_message(f, "Issues are disabled for this repo");
}

// Except on the issues list, where it means the repository has issues turned off: none to fetch.
// Such a repository's issue unit failed for good on every backfill, and its run with it.
TEST_F(GithubStatusTest, AnIssuesListThatIsGoneIsAnEmptyLastPage) {
  const std::string issues =
      repo_by_id() + "/issues?state=all&sort=updated&direction=desc&per_page=100";
  add_get(issues, 410, R"({"message":"Issues are disabled for this repo"})");
  const plugins::Page page = connect().fetch_page(params("issue"));
  EXPECT_EQ(page.size(), 0u);
  EXPECT_FALSE(page.next_cursor());
}

// The 410 cost a request like any other answer, and a page reports the rate limit of its answer
// (connector.h); the early return for it came before the headers were read (review).
TEST_F(GithubStatusTest, AnIssuesListThatIsGoneStillReportsItsRateLimit) {
  add_scenario("410-issues-disabled",
               repo_by_id() + "/issues?state=all&sort=updated&direction=desc&per_page=100");
  const plugins::Page page = connect().fetch_page(params("issue"));
  EXPECT_EQ(page.size(), 0u);
  ASSERT_TRUE(page.rate_limit());
  EXPECT_EQ(page.rate_limit()->remaining, 4997);
  EXPECT_EQ(page.rate_limit()->limit, 5000);
  EXPECT_EQ(page.rate_limit()->reset_at_unix_ms, 1'710'075'600'000);
}

TEST_F(GithubStatusTest, ValidationFailedIsFatalWithTheRecordedErrors) {
  // The real 422 recording (a POST in octokit's scenario), replayed for our GET.
  http::Exchange e = load_nock("recorded/errors-422.normalized-fixture.json", "POST").at(0);
  e.method = "GET";
  e.url = pulls_url();
  e.response.url = e.url;
  add(std::move(e));
  const auto f = failure_of([&] { connect().fetch_page(params("pull_request")); });
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, "HTTP 422");
  expect_message(f, "Validation Failed");
  expect_message(f, "Label.color invalid");
}

TEST_F(GithubStatusTest, OtherClientErrorsAreFatal) {
  const auto f = fetch_failure_for(400, R"({"message":"Problems parsing JSON"})");
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, "Problems parsing JSON");
}

TEST_F(GithubStatusTest, ServerErrorsAreRetryable) {
  const auto e500 = fetch_failure("500-server-error");
  EXPECT_EQ(e500.status(), BACKHAUL_RETRYABLE);
  expect_message(e500, "HTTP 500");
  expect_message(e500, "Server Error");
}

TEST_F(GithubStatusTest, BadGatewayWithAnHtmlBodyIsRetryable) {
  const auto f = fetch_failure("502-bad-gateway");
  EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE);
  expect_message(f, "HTTP 502");
}

TEST_F(GithubStatusTest, UnavailableIsRetryable) {
  const auto f = fetch_failure("503-unavailable");
  EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE);
  expect_message(f, "HTTP 503");
}

TEST_F(GithubStatusTest, NetworkErrorsAreRetryable) {
  http::Exchange reset;
  reset.method = "GET";
  reset.url = pulls_url();
  reset.error = "connection reset by peer";  // the transport throws TransportError
  add(std::move(reset));
  const auto f = failure_of([&] { connect().fetch_page(params("pull_request")); });
  EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE);
  expect_message(f, "connection reset by peer");
}

TEST_F(GithubStatusTest, MalformedJsonIsRetryable) {
  const auto f = fetch_failure("200-truncated-json");
  EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE);
  expect_message(f, "malformed JSON");
}

TEST_F(GithubStatusTest, AnObjectInsteadOfAnArrayIsRetryable) {
  const auto f = fetch_failure("200-object-not-array");
  EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE);
  expect_message(f, "expected a JSON array");
}

TEST_F(GithubStatusTest, AnEmptyBodyOn200IsRetryable) {
  const auto f = fetch_failure("200-empty-body");
  EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE);
  expect_message(f, "malformed JSON");
}

// Well-formed pages whose items lack what a delivery id needs: GitHub answers the same again.
TEST_F(GithubStatusTest, ItemsWithoutTheirIdFieldAreFatal) {
  const auto f = fetch_failure_for(200, R"([{"id":1,"title":"no number"}])");
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, "item 0 of the page");
  expect_message(f, "number");
  const auto g = failure_of([&] {
    add_get(repo_by_id() + "/releases?per_page=100", 200, R"([{"id":1},42])");
    connect().fetch_page(params("release"));
  });
  EXPECT_EQ(g.status(), BACKHAUL_FATAL);
  expect_message(g, "item 1 of the page");
  expect_message(g, "not an object");
}

// A well-formed page with one bad item comes back the same on every retry: RETRYABLE burnt every
// attempt of the unit on it (review). The message says which item, for the report to GitHub.
TEST_F(GithubStatusTest, AnItemWhoseNumberIsNotAnIntegerIsFatalAndNamedByItsIndex) {
  for (const char* number : {R"("2")", "2.5", "null", "true"}) {
    const auto f = fetch_failure_for(
        200, std::string(R"([{"number":1,"title":"fine"},{"number":)") + number + "}]");
    EXPECT_EQ(f.status(), BACKHAUL_FATAL) << number;
    expect_message(f, "item 1 of the page");
    expect_message(f, "\"number\"");
  }
}

TEST_F(GithubStatusTest, AReleaseWhoseIdIsNotAnIntegerIsFatalAndNamedByItsIndex) {
  add_get(repo_by_id() + "/releases?per_page=100", 200, R"([{"id":1},{"id":2},{"id":"3"}])");
  const auto f = failure_of([&] { connect().fetch_page(params("release")); });
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, "item 2 of the page");
  expect_message(f, "\"id\"");
}

// GitHub has sent half of a surrogate pair (a title cut inside an emoji); the JSON parser refuses
// the whole page, and so it will on every retry.
TEST_F(GithubStatusTest, ALoneSurrogateEscapeInAnItemIsFatalAndNamedByItsIndex) {
  for (const char* escape : {R"(\ud83d)", R"(\ude00 after)", R"(\ud83d\u0041)"}) {
    const auto f = fetch_failure_for(
        200, std::string(R"([{"number":1,"title":"ok"},{"number":2,"title":"cut )") + escape +
                 R"("},{"number":3}])");
    EXPECT_EQ(f.status(), BACKHAUL_FATAL) << escape;
    expect_message(f, "item 1 of the page");
    expect_message(f, "surrogate");
  }
}

// A body cut short is the transfer's fault, not GitHub's answer: the next attempt gets it whole.
TEST_F(GithubStatusTest, ABodyCutShortStaysRetryableWhereverItIsCut) {
  const std::string whole = R"([{"number":1,"title":"ok \ud83d\ude00"},{"number":2}])";
  for (size_t cut = 1; cut < whole.size(); ++cut) {
    const auto f = fetch_failure_for(200, whole.substr(0, cut));
    EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE) << whole.substr(0, cut);
  }
}

TEST_F(GithubStatusTest, ARedirectTheHostGaveUpOnIsRetryable) {
  // Redirects to itself until the host's limit is reached.
  const auto f = fetch_failure_for(302, "", {{"location", pulls_url()}});
  EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE);
  expect_message(f, "HTTP 302");
}

TEST_F(GithubStatusTest, MessagesNeverContainTheToken) {
  const std::string body = std::string(R"({"message":"token )") + kToken + R"( is not valid"})";
  const auto f = fetch_failure_for(401, body);
  EXPECT_EQ(f.status(), BACKHAUL_AUTH_EXPIRED);
  expect_message(f, "[redacted]");

  // A token that occurs in the replacement text itself must not make redaction loop forever.
  plugins::Unit u = unit();
  u.access_token = "e";
  const auto g =
      failure_of([&] { connect().fetch_page(params("pull_request", std::nullopt, 0, u)); });
  EXPECT_EQ(g.status(), BACKHAUL_AUTH_EXPIRED);
}

// A short token (a test value) is taken out of messages only where it stands alone: the token "e"
// once turned "Bad credentials" into "Bad cr[redacted]d[redacted]ntials".
TEST_F(GithubStatusTest, AShortTokenIsRedactedWithoutManglingTheMessage) {
  plugins::Unit u = unit();
  u.access_token = "e";
  add_get(pulls_url(), 401, R"({"message":"Bad credentials: token e"})");
  const auto f =
      failure_of([&] { connect().fetch_page(params("pull_request", std::nullopt, 0, u)); });
  EXPECT_EQ(f.status(), BACKHAUL_AUTH_EXPIRED);
  EXPECT_NE(std::string(f.what()).find("Bad credentials: token [redacted]"), std::string::npos)
      << f.what();
}

// Review: GitHub's message was cut to 300 characters before the token was taken out, so a token
// echoed across the cut left its first part in the message. No 8 characters of it may be left.
TEST_F(GithubStatusTest, ATokenEchoedAcrossTheCutOfTheMessageLeavesNoPartOfItIn) {
  plugins::Unit u = unit();
  u.access_token = "Zq8mT3wLk9Rx2VbN7cJpYh4s";  // of no shape the host's redaction knows
  add_get(pulls_url(), 400,
          R"({"message":")" + std::string(290, 'x') + " " + u.access_token + R"( is invalid"})");
  const auto f =
      failure_of([&] { connect().fetch_page(params("pull_request", std::nullopt, 0, u)); });
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  const std::string what = f.what();
  EXPECT_NE(what.find("xxxx"), std::string::npos) << what;
  for (size_t at = 0; at + 8 <= u.access_token.size(); ++at)
    EXPECT_EQ(what.find(u.access_token.substr(at, 8)), std::string::npos) << what;
}

// A page nesting 100 000 arrays (200 KB) is malformed, refused before it is parsed: copying or
// dumping such a value recurses once per level (the vercel connector's copy of an item overflowed
// the stack and ended the host).
TEST_F(GithubStatusTest, APageNestedDeeperThanAnyApiNestsIsRetryableNotACrash) {
  const size_t depth = 100'000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  const auto f = fetch_failure_for(200, R"([{"id":1,"x":)" + deep + "}]");
  EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE);
  expect_message(f, "nested more than 256 levels deep");
}

// --- validate_scopes -----------------------------------------------------------------------------

using GithubScopesTest = GithubStatusTest;

const std::string kRepoUrl = std::string(kApi) + "/repos/" + kRepo;

TEST_F(GithubScopesTest, AReadableRepositoryPasses) {
  add_all(load_nock("recorded/get-repository.normalized-fixture.json"));
  EXPECT_NO_THROW(connect().validate_scopes(unit()));
  EXPECT_EQ(requested_urls(), std::vector<std::string>{kRepoUrl});
}

TEST_F(GithubScopesTest, ARenamedRepositoryPassesThroughTheHostsRedirect) {
  add_all(load_nock("recorded/rename-repository-301.normalized-fixture.json"));
  EXPECT_NO_THROW(connect().validate_scopes(
      unit("1000", std::string("octokit-fixture-org/rename-repository"))));
  EXPECT_EQ(
      requested_urls(),
      (std::vector<std::string>{kApi + std::string("/repos/octokit-fixture-org/rename-repository"),
                                kApi + std::string("/repositories/1000")}));
}

// The name now belongs to another repository (the unit's was renamed and its old name taken):
// its items would be delivered as the unit's. The id is the unit's identity, not the name.
TEST_F(GithubScopesTest, ARepositoryWhoseIdIsNotTheUnitsIsFatal) {
  add_get(kRepoUrl, 200,
          R"({"id":2000,"full_name":"octokit-fixture-org/hello-world",)"
          R"("permissions":{"admin":false,"push":false,"pull":true}})");
  const auto f = failure_of([&] { connect().validate_scopes(unit()); });
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, kRepo);
  expect_message(f, "id 2000");
  expect_message(f, "1000");
}

// Ids that are not numbers (node ids) cannot be compared with the numeric "id".
TEST_F(GithubScopesTest, ANonNumericResourceIdIsNotComparedWithTheRepositoryId) {
  add_get(kRepoUrl, 200,
          R"({"id":2000,"node_id":"R_kgDOH","full_name":"octokit-fixture-org/hello-world"})");
  EXPECT_NO_THROW(connect().validate_scopes(unit("R_kgDOH")));
}

TEST_F(GithubScopesTest, NoPullPermissionIsFatal) {
  add_get(kRepoUrl, 200,
          R"({"id":1000,"full_name":"octokit-fixture-org/hello-world",)"
          R"("permissions":{"admin":false,"push":false,"pull":false}})");
  const auto f = failure_of([&] { connect().validate_scopes(unit()); });
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, "permissions.pull");
}

TEST_F(GithubScopesTest, AMissingOrHiddenRepositoryIsFatal) {
  add_scenario("404-not-found", kRepoUrl);
  const auto f = failure_of([&] { connect().validate_scopes(unit()); });
  EXPECT_EQ(f.status(), BACKHAUL_FATAL);
  expect_message(f, "not found or not readable with this token");
  expect_message(f, kRepo);
}

TEST_F(GithubScopesTest, BadCredentialsAreAuthExpired) {
  add_scenario("401-bad-credentials", kRepoUrl);
  const auto f = failure_of([&] { connect().validate_scopes(unit()); });
  EXPECT_EQ(f.status(), BACKHAUL_AUTH_EXPIRED);
}

TEST_F(GithubScopesTest, OtherStatusesMapAsForPages) {
  add_scenario("403-primary-rate-limit", kRepoUrl);
  const auto f = failure_of([&] { connect().validate_scopes(unit()); });
  EXPECT_EQ(f.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(f.retry_after_ms(), 121'000);
}

TEST_F(GithubScopesTest, AMalformedRepositoryBodyIsRetryable) {
  add_get(kRepoUrl, 200, "<html>");
  const auto f = failure_of([&] { connect().validate_scopes(unit()); });
  EXPECT_EQ(f.status(), BACKHAUL_RETRYABLE);
}

TEST_F(GithubScopesTest, NeedsOwnerSlashRepo) {
  const auto f = failure_of([&] { connect().validate_scopes(unit("1000", std::nullopt)); });
  EXPECT_EQ(f.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_EQ(transport_.request_count(), 0u);
}

}  // namespace
}  // namespace backhaul::github_test
