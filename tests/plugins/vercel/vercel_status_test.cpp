// How Vercel's answers map to the statuses the host acts on, for fetch_page and validate_scopes.
#include <limits>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "vercel_test_support.h"

namespace backhaul::vercel::testing {
namespace {

class VercelStatusTest : public VercelTest {
 protected:
  // Answers the first-page request of project prj_1 with `status`, `body` and `headers`, fetches,
  // and returns the failure. Every failure message must be free of the token.
  plugins::ConnectorFailure fetch_failure(int status, std::string body,
                                          http::Headers headers = rate_limit_headers(42)) {
    reply(list_url("prj_1"), status, std::move(body), std::move(headers));
    plugins::ConnectorFailure failure =
        failure_of([&] { connector().fetch_page(params("prj_1")); });
    EXPECT_EQ(std::string(failure.what()).find(kToken), std::string::npos) << failure.what();
    return failure;
  }
  plugins::ConnectorFailure scope_failure(int status, std::string body,
                                          http::Headers headers = rate_limit_headers(42)) {
    reply("https://api.vercel.com/v9/projects/prj_1", status, std::move(body), std::move(headers));
    plugins::ConnectorFailure failure =
        failure_of([&] { connector().validate_scopes(unit("prj_1")); });
    EXPECT_EQ(std::string(failure.what()).find(kToken), std::string::npos) << failure.what();
    return failure;
  }
  static bool contains(const plugins::ConnectorFailure& failure, std::string_view text) {
    return std::string(failure.what()).find(text) != std::string::npos;
  }
};

// --- auth --------------------------------------------------------------------------------------

TEST_F(VercelStatusTest, Http401IsAuthExpired) {
  const auto failure = fetch_failure(401, R"({"error":{"code":"unauthorized","message":"x"}})");
  EXPECT_EQ(failure.status(), BACKHAUL_AUTH_EXPIRED);
}

TEST_F(VercelStatusTest, Http403WithRecordedInvalidTokenBodyIsAuthExpired) {
  const auto failure = fetch_failure(403, recorded_error_body(0));
  EXPECT_EQ(failure.status(), BACKHAUL_AUTH_EXPIRED);
  EXPECT_TRUE(contains(failure, "forbidden: Not authorized")) << failure.what();
}

TEST_F(VercelStatusTest, Http403WithoutInvalidTokenIsAFatalScopeProblem) {
  const auto failure = fetch_failure(403, recorded_error_body(1));
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "HTTP 403 forbidden: Not authorized")) << failure.what();
  EXPECT_TRUE(contains(failure, "lacks access")) << failure.what();
}

TEST_F(VercelStatusTest, Http403WithExhaustedRateLimitIsRateLimited) {
  // The same rule as every connector (SPEC C1/C2): a 403 that says the limit is spent waits.
  const auto failure =
      fetch_failure(403, R"({"error":{"code":"forbidden","message":"Rate limit exceeded"}})",
                    rate_limit_headers(0, 100, kResetSeconds));
  EXPECT_EQ(failure.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(failure.retry_after_ms(), 60'000 + 1'000) << "the reset, and a second more";
}

// --- rate limits -------------------------------------------------------------------------------

TEST_F(VercelStatusTest, Http429WithRetryAfterWaitsThatManySeconds) {
  http::Headers headers = rate_limit_headers(0, 100, kResetSeconds + 3600);
  headers.emplace_back("retry-after", "17");
  const auto failure = fetch_failure(429, recorded_error_body(4), headers);
  EXPECT_EQ(failure.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(failure.retry_after_ms(), 17'000);
  EXPECT_TRUE(contains(failure, "too_many_requests: Rate limit exceeded")) << failure.what();
}

TEST_F(VercelStatusTest, Http429WithOnlyResetWaitsUntilTheResetByTheHostClock) {
  clock_.set_ms(kResetSeconds * 1000 - 42'500);
  const auto failure = fetch_failure(429, recorded_error_body(4), rate_limit_headers(0));
  EXPECT_EQ(failure.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(failure.retry_after_ms(), 42'500 + 1'000) << "the reset, and a second more";
}

// The reset is on Vercel's clock, measured against the response's Date: a host clock 10 minutes
// ahead of Vercel's took a reset a minute away as long past, and retried a second later, into the
// limit, again and again. Its wait was 1 s.
TEST_F(VercelStatusTest, Http429WithOnlyResetWaitsUntilTheResetByVercelsClock) {
  clock_.set_ms(kNowMs + 600'000);
  http::Headers headers = rate_limit_headers(0, 100, kResetSeconds);
  headers.emplace_back("date", "Sun, 19 Jul 2026 14:06:40 GMT");  // kNowMs, 60 s before the reset
  const auto failure = fetch_failure(429, recorded_error_body(4), headers);
  EXPECT_EQ(failure.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(failure.retry_after_ms(), 60'000 + 1'000) << "the reset, and a second more";
  // A 403 that is a rate limit, and validate_scopes, wait the same.
  const auto forbidden = scope_failure(403, recorded_error_body(1), headers);
  EXPECT_EQ(forbidden.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(forbidden.retry_after_ms(), 60'000 + 1'000);
}

// Answered 429 all the same: the reset's second (by Vercel's clock) may not be over.
TEST_F(VercelStatusTest, Http429WithResetInThePastWaitsASecond) {
  clock_.set_ms(kResetSeconds * 1000 + 5'000);
  const auto failure = fetch_failure(429, recorded_error_body(4), rate_limit_headers(0));
  EXPECT_EQ(failure.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(failure.retry_after_ms(), 1'000);
}

// Retry-After in its other forms (RFC 9110 10.2.3): an HTTP-date, measured against the response's
// Date as a reset is (here 10 minutes after it, with the host's clock 10 minutes ahead); a
// fraction of a second (not RFC 9110's, but read), rounded up; and "0" or blank, which name no
// wait: the reset, or the default minute, then. Only whole seconds were read: the date waited the
// default minute and was retried 9 minutes early, the fraction a minute, and "0" nothing at all.
TEST_F(VercelStatusTest, Http429RetryAfterAsADateAFractionOrZero) {
  clock_.set_ms(kNowMs + 600'000);
  const http::Headers dated = {{"date", "Sun, 19 Jul 2026 14:06:40 GMT"}};  // kNowMs
  http::Headers headers = dated;
  headers.emplace_back("retry-after", "Sun, 19 Jul 2026 14:16:40 GMT");  // kNowMs + 10 min
  EXPECT_EQ(fetch_failure(429, recorded_error_body(4), headers).retry_after_ms(), 600'000);

  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"2.5", 3'000},
      {"9223372036854775807.5", 86'400'000},  // rounded up, not over: a day, the host's most
      {"0", 60'000 + 1'000},
      {" ", 60'000 + 1'000},
      {"Sun, 19 Jul 2026 14:06:00 GMT", 60'000 + 1'000}};  // a date already past: the reset
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string project = "prj_r" + std::to_string(i);
    headers = rate_limit_headers(0, 100, kResetSeconds);  // kNowMs + 60 s
    headers.insert(headers.end(), dated.begin(), dated.end());
    headers.emplace_back("retry-after", cases[i].first);
    reply(list_url(project), 429, recorded_error_body(4), headers);
    const plugins::ConnectorFailure failure =
        failure_of([&] { connector().fetch_page(params(project)); });
    EXPECT_EQ(failure.status(), BACKHAUL_RATE_LIMITED) << cases[i].first;
    EXPECT_EQ(failure.retry_after_ms(), cases[i].second) << "retry-after: " << cases[i].first;
  }
}

TEST_F(VercelStatusTest, Http429WithoutHeadersWaitsOneMinute) {
  const auto failure = fetch_failure(429, recorded_error_body(4), {});
  EXPECT_EQ(failure.status(), BACKHAUL_RATE_LIMITED);
  EXPECT_EQ(failure.retry_after_ms(), 60'000);
}

// --- permanent failures ----------------------------------------------------------------------

TEST_F(VercelStatusTest, Http404IsFatalWithVercelsMessage) {
  const auto failure = fetch_failure(404, recorded_error_body(2));
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "HTTP 404 not_found: Not Found")) << failure.what();
}

TEST_F(VercelStatusTest, Http400IsFatalWithTheCode) {
  const auto failure = fetch_failure(400, R"({"error":{"code":"bad_request"}})");
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "HTTP 400 bad_request")) << failure.what();
}

TEST_F(VercelStatusTest, Http410IsFatal) {
  EXPECT_EQ(fetch_failure(410, R"({"error":{"code":"gone","message":"Gone"}})").status(),
            BACKHAUL_FATAL);
}

TEST_F(VercelStatusTest, Http422IsFatal) {
  const auto failure = fetch_failure(
      422, R"({"error":{"code":"invalid_query","message":"until must be a number"}})");
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "until must be a number")) << failure.what();
}

TEST_F(VercelStatusTest, ErrEnvelopeIsReadLikeError) {
  const auto failure =
      fetch_failure(400, R"({"err":{"code":"bad_request","message":"Invalid projectId"}})");
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "bad_request: Invalid projectId")) << failure.what();
}

TEST_F(VercelStatusTest, TokenEchoedByTheProviderIsRedacted) {
  const auto failure = fetch_failure(400, R"({"error":{"code":"bad_request","message":"token )" +
                                              std::string(kToken) + R"( is malformed"}})");
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "token [redacted] is malformed")) << failure.what();
}

// Review: the provider's message was cut to 200 characters before the token was taken out, so a
// token echoed across the cut left its first 31 of 32 characters in the message. No 8 characters
// of it may be left, wherever the provider puts it.
TEST_F(VercelStatusTest, ATokenEchoedAcrossTheCutOfTheMessageLeavesNoPartOfItIn) {
  // Of no shape the host's own redaction knows (a vcp_ token's start it would mask itself).
  const std::string token = "Zq8mT3wLk9Rx2VbN7cJpYh4s";
  for (const size_t pad : {160u, 180u, 190u, 199u}) {
    const std::string project = "prj_" + std::to_string(pad);
    const std::string body = R"({"error":{"code":"bad_request","message":")" +
                             std::string(pad, 'x') + " " + token + R"( is invalid"}})";
    reply(list_url(project), 400, body, rate_limit_headers(42));
    reply("https://api.vercel.com/v9/projects/" + project, 400, body, rate_limit_headers(42));
    plugins::FetchParams p = params(project);
    p.unit.access_token = token;
    for (const bool scopes : {false, true}) {
      const plugins::ConnectorFailure failure = failure_of([&] {
        if (scopes) {
          connector().validate_scopes(p.unit);
        } else {
          connector().fetch_page(p);
        }
      });
      EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
      const std::string what = failure.what();
      EXPECT_NE(what.find("xxxx"), std::string::npos) << what;
      for (size_t at = 0; at + 8 <= token.size(); ++at)
        EXPECT_EQ(what.find(token.substr(at, 8)), std::string::npos) << pad << ": " << what;
    }
  }
}

// Review: copying or dumping a parsed value recurses once per level: a 200 body nesting 100 000
// arrays (200 KB) overflowed the stack and ended the host. Such a body is a malformed response.
TEST_F(VercelStatusTest, ABodyNestedDeeperThanAnyApiNestsIsMalformedNotACrash) {
  const size_t depth = 100'000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  const auto failure =
      fetch_failure(200, R"({"deployments":[{"uid":"dpl_a","created":1,"x":)" + deep + R"(}]})");
  EXPECT_EQ(failure.status(), BACKHAUL_RETRYABLE);
  EXPECT_TRUE(contains(failure, "nested more than 256 levels deep")) << failure.what();
  // In an error body too: its message is not read, and the status still says what to do.
  const auto refused = fetch_failure(500, R"({"error":)" + deep + "}");
  EXPECT_EQ(refused.status(), BACKHAUL_RETRYABLE);
  // 256 levels are read as ever.
  const std::string fine = std::string(250, '[') + std::string(250, ']');
  reply(list_url("prj_2"), 200,
        R"({"deployments":[{"uid":"dpl_a","created":1,"x":)" + fine + R"(}]})",
        rate_limit_headers(42));
  EXPECT_EQ(connector().fetch_page(params("prj_2")).size(), 1u);
}

// Review: pagination.next (or a deployment's created) of INT64_MAX made a cursor continuing from
// INT64_MAX + 1 (an overflow), which the connector then refused as a cursor of its own. It is a
// malformed page.
TEST_F(VercelStatusTest, ATimestampOfInt64MaxIsMalformedNotAnOverflow) {
  const std::string max = std::to_string(std::numeric_limits<int64_t>::max());
  const auto next = fetch_failure(
      200, R"({"deployments":[{"uid":"dpl_a","created":5}],"pagination":{"next":)" + max + "}}");
  EXPECT_EQ(next.status(), BACKHAUL_RETRYABLE);
  EXPECT_TRUE(contains(next, "pagination.next is not a timestamp")) << next.what();
  reply(list_url("prj_2"), 200, R"({"deployments":[{"uid":"dpl_a","created":)" + max + "}]}",
        rate_limit_headers(42));
  const plugins::ConnectorFailure created =
      failure_of([&] { connector().fetch_page(params("prj_2")); });
  EXPECT_EQ(created.status(), BACKHAUL_FATAL);  // a bad deployment: see VercelBadItemTest
  EXPECT_TRUE(contains(created, "dpl_a")) << created.what();
}

// --- transient failures ----------------------------------------------------------------------

TEST_F(VercelStatusTest, Http500IsRetryable) {
  const auto failure = fetch_failure(
      500,
      R"({"error":{"code":"internal_server_error","message":"An unexpected error occurred"}})");
  EXPECT_EQ(failure.status(), BACKHAUL_RETRYABLE);
  EXPECT_TRUE(contains(failure, "HTTP 500")) << failure.what();
}

TEST_F(VercelStatusTest, Http502WithHtmlBodyIsRetryable) {
  const auto failure = fetch_failure(502, "<html><body><h1>502 Bad Gateway</h1></body></html>",
                                     {{"content-type", "text/html"}});
  EXPECT_EQ(failure.status(), BACKHAUL_RETRYABLE);
  EXPECT_TRUE(contains(failure, "HTTP 502")) << failure.what();
}

TEST_F(VercelStatusTest, Http503PassesItsRetryAfterAlong) {
  http::Headers headers = rate_limit_headers(42);
  headers.emplace_back("retry-after", "5");
  const auto failure = fetch_failure(503, "", headers);
  EXPECT_EQ(failure.status(), BACKHAUL_RETRYABLE);
  EXPECT_EQ(failure.retry_after_ms(), 5'000);
}

// 408 Request Timeout and 425 Too Early say "send it again" (RFC 9110 15.5.9, RFC 8470 5.2); a
// proxy in front of Vercel answers them too. They were FATAL, as every other 4xx, and failed the
// unit for good on a moment's trouble. Their retry-after, if any, is passed along as a 5xx's is.
TEST_F(VercelStatusTest, Http408And425AreRetryable) {
  const auto timeout =
      fetch_failure(408, R"({"error":{"code":"request_timeout","message":"Request Timeout"}})");
  EXPECT_EQ(timeout.status(), BACKHAUL_RETRYABLE);
  EXPECT_TRUE(contains(timeout, "HTTP 408 request_timeout")) << timeout.what();
  http::Headers headers = rate_limit_headers(42);
  headers.emplace_back("retry-after", "3");
  reply(list_url("prj_2"), 425, "", headers);
  const plugins::ConnectorFailure early =
      failure_of([&] { connector().fetch_page(params("prj_2")); });
  EXPECT_EQ(early.status(), BACKHAUL_RETRYABLE);
  EXPECT_EQ(early.retry_after_ms(), 3'000);
  EXPECT_EQ(scope_failure(408, "").status(), BACKHAUL_RETRYABLE);
}

TEST_F(VercelStatusTest, NetworkErrorIsRetryable) {
  // Nothing recorded: the transport fails as a refused connection would.
  const plugins::ConnectorFailure failure =
      failure_of([&] { connector().fetch_page(params("prj_1")); });
  EXPECT_EQ(failure.status(), BACKHAUL_RETRYABLE);
  EXPECT_TRUE(contains(failure, "request failed")) << failure.what();
}

TEST_F(VercelStatusTest, MalformedJsonIsRetryable) {
  const std::string truncated =
      fixture("recorded/v6-deployments.page1.limit3.recorded-redacted.json").substr(0, 700);
  const auto failure = fetch_failure(200, truncated);
  EXPECT_EQ(failure.status(), BACKHAUL_RETRYABLE);
  EXPECT_TRUE(contains(failure, "not JSON")) << failure.what();
}

TEST_F(VercelStatusTest, EmptyBodyIsRetryable) {
  EXPECT_EQ(fetch_failure(200, "").status(), BACKHAUL_RETRYABLE);
}

TEST_F(VercelStatusTest, MissingDeploymentsArrayIsRetryable) {
  const auto failure = fetch_failure(200, R"({"pagination":null})");
  EXPECT_EQ(failure.status(), BACKHAUL_RETRYABLE);
  EXPECT_TRUE(contains(failure, "no deployments array")) << failure.what();
}

struct MalformedBody {
  const char* name;
  const char* body;
};

void PrintTo(const MalformedBody& param, std::ostream* out) { *out << param.name; }

class VercelMalformedBodyTest : public VercelStatusTest,
                                public ::testing::WithParamInterface<MalformedBody> {};

TEST_P(VercelMalformedBodyTest, IsRetryableWithAMessage) {
  const auto failure = fetch_failure(200, GetParam().body);
  EXPECT_EQ(failure.status(), BACKHAUL_RETRYABLE);
  EXPECT_TRUE(contains(failure, "malformed response")) << failure.what();
}

INSTANTIATE_TEST_SUITE_P(
    Status, VercelMalformedBodyTest,
    ::testing::Values(
        MalformedBody{"JsonArray", R"([{"uid":"dpl_a","created":1}])"},
        MalformedBody{"DeploymentsIsObject", R"({"deployments":{"uid":"dpl_a"}})"},
        MalformedBody{"PaginationIsString", R"({"deployments":[],"pagination":"next"})"},
        MalformedBody{"NextIsString",
                      R"({"deployments":[],"pagination":{"next":"1784463388997"}})"},
        MalformedBody{"NextIsNegative", R"({"deployments":[],"pagination":{"next":-1}})"}),
    [](const ::testing::TestParamInfo<MalformedBody>& param_info) {
      return std::string(param_info.param.name);
    });

// A well-formed page with a bad deployment in it is sent again as it is: retrying it burnt every
// attempt of the unit (RETRYABLE, "malformed response"). It is FATAL, naming the deployment by its
// place in the page. A body cut short (MalformedJsonIsRetryable) stays RETRYABLE.
class VercelBadItemTest : public VercelStatusTest,
                          public ::testing::WithParamInterface<MalformedBody> {};

TEST_P(VercelBadItemTest, IsFatalNamingTheItemsIndex) {
  const auto failure = fetch_failure(200, R"({"deployments":[{"uid":"dpl_ok","created":2},)" +
                                              std::string(GetParam().body) + "]}");
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "deployment #1 of the page")) << failure.what();
}

INSTANTIATE_TEST_SUITE_P(
    Status, VercelBadItemTest,
    ::testing::Values(MalformedBody{"ItemIsString", R"("dpl_a")"},
                      MalformedBody{"ItemWithoutUid", R"({"created":1})"},
                      MalformedBody{"UidWithComma", R"({"uid":"dpl_a,b","created":1})"},
                      MalformedBody{"ItemWithoutCreated", R"({"uid":"dpl_a"})"},
                      MalformedBody{"CreatedIsString", R"({"uid":"dpl_a","created":"1"})"},
                      MalformedBody{"CreatedIsInt64Max",
                                    R"({"uid":"dpl_a","created":9223372036854775807})"}),
    [](const ::testing::TestParamInfo<MalformedBody>& param_info) {
      return std::string(param_info.param.name);
    });

// A lone surrogate escape (a commit message cut inside an emoji, "\ud83d") is refused by the
// parser, and comes back the same on every retry: RETRYABLE ("not JSON") burnt every attempt of
// the unit. It is FATAL, naming the deployment; a body cut short inside the same escape, or
// anywhere, is still RETRYABLE.
TEST_F(VercelStatusTest, ALoneSurrogateInADeploymentIsFatalNamingItButABodyCutShortIsNot) {
  const std::string body =
      R"({"deployments":[{"uid":"dpl_ok","created":2,"meta":{"m":"ok \ud83d\ude00"}},)"
      R"({"uid":"dpl_b","created":1,"meta":{"githubCommitMessage":"fix \ud83d"}}],)"
      R"("pagination":{"count":2,"next":1,"prev":2}})";
  const auto failure = fetch_failure(200, body);
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "deployment #1 of the page")) << failure.what();
  EXPECT_TRUE(contains(failure, "surrogate")) << failure.what();

  // One after the list (in a key of the page) is the page's, not a deployment past the last.
  reply(list_url("prj_3"), 200,
        R"({"deployments":[{"uid":"dpl_ok","created":2}],"\ud83d":1,)"
        R"("pagination":{"count":1,"next":null,"prev":2}})",
        rate_limit_headers(42));
  const plugins::ConnectorFailure after_the_list =
      failure_of([&] { connector().fetch_page(params("prj_3")); });
  EXPECT_EQ(after_the_list.status(), BACKHAUL_FATAL) << after_the_list.what();
  EXPECT_TRUE(contains(after_the_list, "the page has a lone surrogate")) << after_the_list.what();

  const std::string cut = body.substr(0, body.find(R"(\ud83d"}})") + 6);  // ends in "\ud83d"
  reply(list_url("prj_2"), 200, cut, rate_limit_headers(42));
  const plugins::ConnectorFailure short_body =
      failure_of([&] { connector().fetch_page(params("prj_2")); });
  EXPECT_EQ(short_body.status(), BACKHAUL_RETRYABLE) << short_body.what();
  EXPECT_TRUE(contains(short_body, "not JSON")) << short_body.what();
}

// --- validate_scopes ---------------------------------------------------------------------------

TEST_F(VercelStatusTest, ValidateScopesAcceptsAReadableProject) {
  reply("https://api.vercel.com/v9/projects/prj_1", 200,
        R"({"id":"prj_1","name":"storefront","accountId":"team_a1B2c3","framework":"nextjs"})");
  EXPECT_NO_THROW(connector().validate_scopes(unit("prj_1")));
  const std::vector<http::Request> asked = requests();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(header_of(asked[0], "authorization"), "Bearer " + std::string(kToken));
}

TEST_F(VercelStatusTest, ValidateScopesAsksWithTheTeamAndEncodesTheProject) {
  reply("https://api.vercel.com/v9/projects/my%20app%2Fx?teamId=team_a1B2c3", 200,
        R"({"id":"my app/x"})");
  EXPECT_NO_THROW(connector(R"({"team_id":"team_a1B2c3"})").validate_scopes(unit("my app/x")));
}

// The API finds a project by its name too; a unit naming it so would build its delivery ids from
// the name, which a rename changes. It is refused, naming the project's id. Before, it passed.
TEST_F(VercelStatusTest, ValidateScopesOfAProjectGivenByItsNameIsFatalNamingItsId) {
  reply("https://api.vercel.com/v9/projects/storefront", 200,
        R"({"id":"prj_1","name":"storefront","accountId":"team_a1B2c3"})");
  const plugins::ConnectorFailure failure =
      failure_of([&] { connector().validate_scopes(unit("storefront")); });
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure,
                       "resource \"storefront\" is the name of project prj_1: give the "
                       "project's id"))
      << failure.what();
  reply("https://api.vercel.com/v9/projects/prj_2", 200, R"({"name":"no id"})");
  EXPECT_NO_THROW(connector().validate_scopes(unit("prj_2"))) << "an answer without an id";
}

TEST_F(VercelStatusTest, ValidateScopesOfAMissingProjectIsFatal) {
  const auto failure =
      scope_failure(404, R"({"error":{"code":"not_found","message":"Project not found"}})");
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "project not found: prj_1")) << failure.what();
}

TEST_F(VercelStatusTest, ValidateScopesWithAnInvalidTokenIsAuthExpired) {
  EXPECT_EQ(scope_failure(403, recorded_error_body(0)).status(), BACKHAUL_AUTH_EXPIRED);
}

TEST_F(VercelStatusTest, ValidateScopesWithoutAccessIsFatal) {
  const auto failure = scope_failure(403, recorded_error_body(1));
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_TRUE(contains(failure, "forbidden")) << failure.what();
}

TEST_F(VercelStatusTest, ValidateScopesMapsTransientFailures) {
  EXPECT_EQ(scope_failure(503, "").status(), BACKHAUL_RETRYABLE);
}

TEST_F(VercelStatusTest, ValidateScopesOfAnEmptyProjectIdIsInvalid) {
  const plugins::ConnectorFailure failure =
      failure_of([&] { connector().validate_scopes(unit("")); });
  EXPECT_EQ(failure.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_EQ(transport_.request_count(), 0u);
}

}  // namespace
}  // namespace backhaul::vercel::testing
