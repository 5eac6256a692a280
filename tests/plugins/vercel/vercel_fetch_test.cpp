// One page of deployments: the request the connector builds and the events it makes of the answer.
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "vercel_test_support.h"

namespace backhaul::vercel::testing {
namespace {

using nlohmann::json;

constexpr const char* kRecordedPage = "recorded/v6-deployments.page1.limit3.recorded-redacted.json";

class VercelFetchTest : public VercelTest {
 protected:
  // The recorded page, as the answer to the default first-page request.
  void reply_recorded_page(http::Headers headers = rate_limit_headers(99)) {
    reply(list_url(kRecordedProject), 200, fixture(kRecordedPage), std::move(headers));
  }
  static json recorded_item(size_t index) {
    return read_json(kFixtureDir / kRecordedPage).at("deployments").at(index);
  }
  static std::string delivery_id(std::string_view project, std::string_view uid) {
    return "backfill-" + std::string(kInstallation) + "-" + std::string(project) + "-deploy-" +
           std::string(uid);
  }
};

// --- the request -----------------------------------------------------------------------------

TEST_F(VercelFetchTest, FirstPageAsksForProjectAndLimitWithBearerToken) {
  reply_recorded_page();
  connector().fetch_page(params());
  const std::vector<http::Request> asked = requests();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(asked[0].method, "GET");
  EXPECT_EQ(asked[0].url.rfind("https://api.vercel.com/v6/deployments?", 0), 0u) << asked[0].url;
  EXPECT_EQ(query_of(asked[0].url),
            (std::map<std::string, std::string>{{"projectId", std::string(kRecordedProject)},
                                                {"limit", "100"}}));
  EXPECT_EQ(header_of(asked[0], "authorization"), "Bearer " + std::string(kToken));
  EXPECT_EQ(header_of(asked[0], "accept"), "application/json");
  EXPECT_EQ(header_of(asked[0], "user-agent"), "backhaul-vercel/1.0");
}

TEST_F(VercelFetchTest, FirstPageCarriesSinceTeamAndConfiguredLimit) {
  const int64_t since = 1'784'000'000'000;
  reply(list_url(kRecordedProject, "&since=1783999999999&teamId=team_a1B2c3", 25), 200,
        fixture(kRecordedPage));
  connector(R"({"team_id":"team_a1B2c3","limit":25})")
      .fetch_page(params(kRecordedProject, {}, since));
  const std::vector<http::Request> asked = requests();
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_EQ(query_of(asked[0].url), (std::map<std::string, std::string>{
                                        {"projectId", std::string(kRecordedProject)},
                                        {"limit", "25"},
                                        {"since", "1783999999999"},  // strictly after, at Vercel
                                        {"teamId", "team_a1B2c3"}}));
}

TEST_F(VercelFetchTest, QueryValuesAreUrlEncoded) {
  reply(
      "https://api.vercel.com/v6/deployments?projectId=my%20app%2Fv2%C3%BC&limit=100"
      "&teamId=team%20a%26b%3Dc",
      200, R"({"deployments":[]})");
  connector(R"({"team_id":"team a&b=c"})").fetch_page(params("my app/v2\xC3\xBC"));
  EXPECT_TRUE(transport_.unmatched().empty());
}

TEST_F(VercelFetchTest, UnknownEntityTypeIsInvalidAndAsksNothing) {
  plugins::FetchParams request = params();
  request.entity_type = "pull_request";
  const plugins::ConnectorFailure failure = failure_of([&] { connector().fetch_page(request); });
  EXPECT_EQ(failure.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(failure.what()).find("pull_request"), std::string::npos);
  EXPECT_EQ(transport_.request_count(), 0u);
}

TEST_F(VercelFetchTest, EmptyProjectIdIsInvalidAndAsksNothing) {
  const plugins::ConnectorFailure failure = failure_of([&] { connector().fetch_page(params("")); });
  EXPECT_EQ(failure.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_EQ(transport_.request_count(), 0u);
}

// --- the recorded page -----------------------------------------------------------------------

TEST_F(VercelFetchTest, RecordedPageBecomesThreeErrorEvents) {
  reply_recorded_page();
  const plugins::Page page = connector().fetch_page(params());
  const std::vector<Event> events = events_of(page);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(page.raw_count(), 3u);
  const char* const uids[] = {"dpl_CgLMoBQBdjzjr9f8PCCC75CZFxki",
                              "dpl_AWzDpYxvjDTzCsoVjwUhgqCnqrZP",
                              "dpl_3k5BGqSLEMoiDQdE34i2QuDp7ahJ"};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(events[i].event_type, "deployment.error");
    EXPECT_EQ(events[i].delivery_id, delivery_id(kRecordedProject, uids[i]));
  }
  // pagination.next is the last deployment's time; that deployment travels in the cursor.
  EXPECT_EQ(page.next_cursor(), "1784463388997:dpl_3k5BGqSLEMoiDQdE34i2QuDp7ahJ");
}

TEST_F(VercelFetchTest, PayloadIsShapedLikeAVercelWebhook) {
  reply_recorded_page();
  const std::vector<Event> events = events_of(connector().fetch_page(params()));
  ASSERT_FALSE(events.empty());
  const json& event = events[0].payload;
  ASSERT_TRUE(event.is_object());
  const json item = recorded_item(0);

  EXPECT_EQ(event.at("type"), "deployment.error");
  EXPECT_EQ(event.at("id"), events[0].delivery_id);
  EXPECT_EQ(event.at("createdAt"), 1784468217313);
  const json& payload = event.at("payload");
  const json& deployment = payload.at("deployment");
  EXPECT_EQ(deployment.at("id"), "dpl_CgLMoBQBdjzjr9f8PCCC75CZFxki");
  EXPECT_EQ(deployment.at("name"), "prod");
  EXPECT_EQ(deployment.at("url"), "prod-r4z2ctc9r-example-projects-761b2f62.vercel.app");
  EXPECT_EQ(deployment.at("meta"), item.at("meta"));
  EXPECT_EQ(deployment.at("inspectorUrl"), item.at("inspectorUrl"));
  EXPECT_EQ(payload.at("project"), (json{{"id", kRecordedProject}}));
  EXPECT_EQ(payload.at("team"), (json{{"id", nullptr}}));
  EXPECT_EQ(payload.at("user"), (json{{"id", "nsTxlIyGINvTYTurdApWAy1d"}}));
  EXPECT_EQ(payload.at("target"), "production");
  EXPECT_EQ(payload.at("links").at("deployment"), item.at("inspectorUrl"));
  EXPECT_EQ(payload.at("links").at("project"), "https://vercel.com/example-projects-761b2f62/prod");
  EXPECT_EQ(event.at("raw"), item);
}

TEST_F(VercelFetchTest, PayloadNamesTheConfiguredTeam) {
  reply(list_url(kRecordedProject, "&teamId=team_a1B2c3"), 200, fixture(kRecordedPage));
  const std::vector<Event> events =
      events_of(connector(R"({"team_id":"team_a1B2c3"})").fetch_page(params()));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].payload["payload"]["team"]["id"], "team_a1B2c3");
}

TEST_F(VercelFetchTest, DeliveryIdsAreUniqueDeterministicAndContainTheProject) {
  reply_recorded_page();
  const std::vector<Event> first = events_of(connector().fetch_page(params()));
  const std::vector<Event> again = events_of(connector().fetch_page(params()));
  std::set<std::string> ids;
  ASSERT_EQ(first.size(), again.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].delivery_id, again[i].delivery_id);
    EXPECT_NE(first[i].delivery_id.find(kRecordedProject), std::string::npos);
    ids.insert(first[i].delivery_id);
  }
  EXPECT_EQ(ids.size(), first.size());
}

// --- tolerant parsing --------------------------------------------------------------------------

TEST_F(VercelFetchTest, EventTypeFollowsReadyStateThenState) {
  reply(list_url("prj_1"), 200, R"({"deployments":[
      {"uid":"dpl_1","created":9,"readyState":"READY","state":"BUILDING"},
      {"uid":"dpl_2","created":8,"readyState":"ERROR"},
      {"uid":"dpl_3","created":7,"readyState":"CANCELED"},
      {"uid":"dpl_4","created":6,"readyState":"BUILDING"},
      {"uid":"dpl_5","created":5,"readyState":"QUEUED"},
      {"uid":"dpl_6","created":4,"readyState":"INITIALIZING"},
      {"uid":"dpl_7","created":3,"state":"READY"},
      {"uid":"dpl_8","created":2},
      {"uid":"dpl_9","created":1,"readyState":"DELETED"}],"pagination":null})");
  const std::vector<Event> events = events_of(connector().fetch_page(params("prj_1")));
  std::vector<std::string> types;
  for (const Event& event : events) types.push_back(event.event_type);
  EXPECT_EQ(types, (std::vector<std::string>{
                       "deployment.succeeded", "deployment.error", "deployment.canceled",
                       "deployment.created", "deployment.created", "deployment.created",
                       "deployment.succeeded", "deployment.created", "deployment.created"}));
  for (const Event& event : events) EXPECT_EQ(event.payload["type"], event.event_type);
}

TEST_F(VercelFetchTest, ToleratesNullMetaNullUrlMissingFieldsAndUnknownKeys) {
  reply(list_url("prj_1"), 200, R"({"deployments":[
      {"uid":"dpl_a","created":1784460000000,"url":null,"meta":null,"inspectorUrl":null,
       "readyState":"READY","somethingNew":{"nested":[1,2,3]},"creator":{"uid":7}},
      {"uid":"dpl_b","createdAt":1784450000000.0,"name":"web","target":null}],
      "pagination":{"count":2,"next":null,"prev":1784460000000},"newTopLevelKey":true})");
  const std::vector<Event> events = events_of(connector().fetch_page(params("prj_1")));
  ASSERT_EQ(events.size(), 2u);
  const json& first = events[0].payload["payload"];
  EXPECT_EQ(first["deployment"]["url"], nullptr);
  EXPECT_EQ(first["deployment"]["meta"], json::object());
  EXPECT_EQ(first["deployment"]["name"], nullptr);
  EXPECT_FALSE(first.contains("links"));
  EXPECT_FALSE(first.contains("user"));
  EXPECT_EQ(events[0].payload["raw"]["somethingNew"]["nested"], json({1, 2, 3}));
  EXPECT_EQ(events[1].payload["createdAt"], 1784450000000);
  EXPECT_EQ(events[1].payload["payload"]["deployment"]["name"], "web");
  EXPECT_EQ(events[1].payload["payload"]["target"], nullptr);
  EXPECT_EQ(events[1].payload["payload"]["project"]["id"], "prj_1");
}

TEST_F(VercelFetchTest, RepeatedUidWithinAPageIsEmittedOnce) {
  reply(list_url("prj_1"), 200, R"({"deployments":[
      {"uid":"dpl_a","created":3},{"uid":"dpl_a","created":3},{"uid":"dpl_b","created":2}]})");
  const plugins::Page page = connector().fetch_page(params("prj_1"));
  EXPECT_EQ(uids_of(events_of(page)), (std::vector<std::string>{"dpl_a", "dpl_b"}));
  EXPECT_EQ(page.raw_count(), 3u);
}

// --- since ---------------------------------------------------------------------------------------

TEST_F(VercelFetchTest, SinceDropsOlderDeploymentsAndEndsTheWalk) {
  const int64_t since = 1784466735510;  // exactly the second deployment's `created`
  reply(list_url(kRecordedProject, "&since=1784466735509"), 200, fixture(kRecordedPage));
  const plugins::Page page = connector().fetch_page(params(kRecordedProject, {}, since));
  EXPECT_EQ(uids_of(events_of(page)),
            (std::vector<std::string>{"dpl_CgLMoBQBdjzjr9f8PCCC75CZFxki",
                                      "dpl_AWzDpYxvjDTzCsoVjwUhgqCnqrZP"}));
  EXPECT_EQ(page.raw_count(), 3u);
  // Every deployment after this page is older than `since`: no need to ask for it.
  EXPECT_EQ(page.next_cursor(), std::nullopt);
}

TEST_F(VercelFetchTest, SinceBeforeThePageKeepsEverythingAndContinues) {
  reply(list_url(kRecordedProject, "&since=1783999999999"), 200, fixture(kRecordedPage));
  const plugins::Page page = connector().fetch_page(params(kRecordedProject, {}, 1784000000000));
  EXPECT_EQ(page.size(), 3u);
  EXPECT_TRUE(page.next_cursor().has_value());
}

// --- rate limit ----------------------------------------------------------------------------------

TEST_F(VercelFetchTest, ReportsTheRateLimitHeaders) {
  reply_recorded_page(rate_limit_headers(42, 100, 1784470123));
  const plugins::Page page = connector().fetch_page(params());
  ASSERT_TRUE(page.rate_limit().has_value());
  EXPECT_EQ(page.rate_limit()->remaining, 42);
  EXPECT_EQ(page.rate_limit()->limit, 100);
  EXPECT_EQ(page.rate_limit()->reset_at_unix_ms, 1784470123000);
}

// The reset is Vercel's epoch seconds, on Vercel's clock; the host compares it with its own. It
// is put on the host's clock: as far after the host's now as it is after the response's Date.
// Read as it was, a host clock 10 minutes ahead of Vercel's saw a reset a minute away as 9
// minutes past, and the rate-limit floor's wait (E2) was skipped.
TEST_F(VercelFetchTest, TheResetIsOnTheHostsClockMeasuredFromTheDate) {
  clock_.set_ms(kNowMs + 600'000);  // the host is 10 minutes ahead of Vercel
  http::Headers headers = rate_limit_headers(4, 100, kResetSeconds);  // Date + 60 s
  headers.emplace_back("date", "Sun, 19 Jul 2026 14:06:40 GMT");      // kNowMs
  reply_recorded_page(headers);
  const plugins::Page page = connector().fetch_page(params());
  ASSERT_TRUE(page.rate_limit().has_value());
  EXPECT_EQ(page.rate_limit()->reset_at_unix_ms, kNowMs + 600'000 + 60'000);
}

// A Date that cannot be read, or more than a day from the host's clock (a broken proxy's), is no
// skew: the reset is read as it is, not moved by days.
TEST_F(VercelFetchTest, TheResetIsReadAsItIsWithoutADateWithinADay) {
  int project = 0;
  for (const char* date : {"Thu, 16 Jul 2026 14:06:40 GMT", "Sun, 19 Jul 2026 14:06:40",
                           "Sunday, 19-Jul-26 14:06:40 GMT"}) {
    const std::string project_id = "prj_" + std::to_string(++project);
    http::Headers headers = rate_limit_headers(4, 100, kResetSeconds);
    headers.emplace_back("date", date);
    reply(list_url(project_id), 200, R"({"deployments":[]})", headers);
    const plugins::Page page = connector().fetch_page(params(project_id));
    ASSERT_TRUE(page.rate_limit().has_value()) << date;
    EXPECT_EQ(page.rate_limit()->reset_at_unix_ms, kResetSeconds * 1000) << date;
  }
}

// An epoch that no clock reaches is held to 10^12 s (~ year 33658), then moved by the skew: adding
// the skew to INT64_MAX ms overflowed. The host still waits its most (a day) for it.
TEST_F(VercelFetchTest, AResetBeyondAnyClockIsHeldNotOverflowed) {
  clock_.set_ms(kNowMs + 600'000);
  http::Headers headers = rate_limit_headers(4, 100, std::numeric_limits<int64_t>::max());
  headers.emplace_back("date", "Sun, 19 Jul 2026 14:06:40 GMT");
  reply_recorded_page(headers);
  const plugins::Page page = connector().fetch_page(params());
  ASSERT_TRUE(page.rate_limit().has_value());
  EXPECT_EQ(page.rate_limit()->remaining, 4);
  EXPECT_EQ(page.rate_limit()->reset_at_unix_ms, 1'000'000'000'000'000 + 600'000);
}

TEST_F(VercelFetchTest, NoRateLimitHeadersMeansNoRateLimit) {
  reply_recorded_page({{"content-type", "application/json"}});
  EXPECT_FALSE(connector().fetch_page(params()).rate_limit().has_value());
}

// --- threads
// ---------------------------------------------------------------------------------------

TEST_F(VercelFetchTest, ConcurrentFetchesOnOneInstanceAgree) {
  reply_recorded_page();
  const plugins::Connector shared = connector();
  const std::vector<Event> expected = events_of(shared.fetch_page(params()));
  constexpr int kThreads = 8;
  constexpr int kFetchesPerThread = 25;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kFetchesPerThread; ++i) {
        try {
          const std::vector<Event> got = events_of(shared.fetch_page(params()));
          if (got.size() != expected.size() || got[0].delivery_id != expected[0].delivery_id ||
              got[2].payload != expected[2].payload) {
            ++mismatches[t];
          }
        } catch (const std::exception&) {
          ++mismatches[t];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(kThreads, 0));
  EXPECT_EQ(transport_.request_count(), 1u + kThreads * kFetchesPerThread);
}

}  // namespace
}  // namespace backhaul::vercel::testing
