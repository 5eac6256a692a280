// Walking a project's deployments page by page: pagination.next -> until, the end of the walk,
// cursors, and the same-millisecond page boundary.
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "vercel_test_support.h"

namespace backhaul::vercel::testing {
namespace {

using nlohmann::json;

class VercelPaginationTest : public VercelTest {
 protected:
  static json synthetic_page(const std::string& prefix, int number) {
    return read_json(kFixtureDir / "synthetic" /
                     (prefix + ".page" + std::to_string(number) + ".json"));
  }

  // Records the three pages of synthetic/<prefix>.page{1,2,3}.json as the answers to the requests
  // the connector makes with limit 3: each page after the first answers until=<next + 1> of the
  // page before. Page N carries x-ratelimit-remaining 100 - N. Returns the `until` values.
  std::vector<std::string> reply_synthetic_pages(const std::string& prefix) {
    std::vector<std::string> untils;
    std::string until_query;
    for (int number = 1; number <= 3; ++number) {
      const json page = synthetic_page(prefix, number);
      reply(list_url(kSyntheticProject, until_query, 3), 200, page.dump(2),
            rate_limit_headers(100 - number));
      const json& next = page["pagination"]["next"];
      if (next.is_null()) break;
      untils.push_back(std::to_string(next.get<int64_t>() + 1));
      until_query = "&until=" + untils.back();
    }
    return untils;
  }

  // Every distinct uid of the three pages, in page order.
  static std::vector<std::string> synthetic_uids(const std::string& prefix) {
    std::vector<std::string> uids;
    std::set<std::string> seen;
    for (int number = 1; number <= 3; ++number) {
      const json page = synthetic_page(prefix, number);  // outlives the loop below
      for (const json& item : page["deployments"]) {
        if (seen.insert(item["uid"].get<std::string>()).second) uids.push_back(item["uid"]);
      }
    }
    return uids;
  }

  std::vector<std::optional<std::string>> until_of_requests() const {
    std::vector<std::optional<std::string>> untils;
    for (const http::Request& request : requests()) {
      const std::map<std::string, std::string> query = query_of(request.url);
      const auto it = query.find("until");
      untils.push_back(it == query.end() ? std::nullopt : std::optional(it->second));
    }
    return untils;
  }
};

TEST_F(VercelPaginationTest, WalksThreePagesFromNextToUntilUntilNextIsNull) {
  const std::vector<std::string> untils = reply_synthetic_pages("walk");
  ASSERT_EQ(untils.size(), 2u);
  const Walk result = walk(connector(R"({"limit":3})"), params(kSyntheticProject));

  EXPECT_EQ(result.pages, 3u);
  EXPECT_EQ(uids_of(result.events), synthetic_uids("walk"));
  std::vector<std::string> types;
  for (const Event& event : result.events) types.push_back(event.event_type);
  EXPECT_EQ(types, (std::vector<std::string>{"deployment.succeeded", "deployment.error",
                                             "deployment.canceled", "deployment.created",
                                             "deployment.created", "deployment.succeeded",
                                             "deployment.created"}));
  EXPECT_EQ(until_of_requests(),
            (std::vector<std::optional<std::string>>{std::nullopt, untils[0], untils[1]}));
}

TEST_F(VercelPaginationTest, CursorIsNextTimestampPlusTheBoundaryUid) {
  reply_synthetic_pages("walk");
  const Walk result = walk(connector(R"({"limit":3})"), params(kSyntheticProject));
  ASSERT_EQ(result.cursors.size(), 2u);
  for (int number = 1; number <= 2; ++number) {
    const json page = synthetic_page("walk", number);
    const std::string next = std::to_string(page["pagination"]["next"].get<int64_t>());
    const std::string last_uid = page["deployments"].back()["uid"];
    EXPECT_EQ(result.cursors[number - 1], next + ":" + last_uid);
  }
}

TEST_F(VercelPaginationTest, ReportsTheRateLimitOfEveryPage) {
  reply_synthetic_pages("walk");
  const plugins::Connector vercel = connector(R"({"limit":3})");
  plugins::FetchParams request = params(kSyntheticProject);
  for (int64_t expected_remaining : {99, 98, 97}) {
    const plugins::Page page = vercel.fetch_page(request);
    ASSERT_TRUE(page.rate_limit().has_value()) << "page with remaining " << expected_remaining;
    EXPECT_EQ(page.rate_limit()->remaining, expected_remaining);
    EXPECT_EQ(page.rate_limit()->limit, 100);
    EXPECT_EQ(page.rate_limit()->reset_at_unix_ms, kResetSeconds * 1000);
    if (!page.next_cursor()) break;
    request.cursor = std::string(*page.next_cursor());
  }
  EXPECT_EQ(transport_.request_count(), 3u);
}

TEST_F(VercelPaginationTest, SameMillisecondBoundaryNeitherRepeatsNorLoses) {
  const std::vector<std::string> untils = reply_synthetic_pages("same-ms");
  const Walk result = walk(connector(R"({"limit":3})"), params(kSyntheticProject));

  // Page 1 ends with one of two deployments created at 1784468217313; the other is on page 2.
  EXPECT_EQ(result.cursors.at(0).substr(0, 14), "1784468217313:");
  EXPECT_EQ(untils.at(0), "1784468217314");  // re-asks for the boundary millisecond
  const std::vector<std::string> uids = uids_of(result.events);
  EXPECT_EQ(uids, synthetic_uids("same-ms"));  // all six, each once, newest first
  EXPECT_EQ(std::set<std::string>(uids.begin(), uids.end()).size(), 6u);
  EXPECT_EQ(transport_.request_count(), 3u);
  EXPECT_TRUE(transport_.unmatched().empty());
}

TEST_F(VercelPaginationTest, CursorResumesTheWalkInAFreshInstance) {
  reply_synthetic_pages("same-ms");
  const Walk whole = walk(connector(R"({"limit":3})"), params(kSyntheticProject));

  const plugins::Page first = connector(R"({"limit":3})").fetch_page(params(kSyntheticProject));
  std::vector<Event> events = events_of(first);
  ASSERT_TRUE(first.next_cursor().has_value());
  // A different instance, as after a host restart, continues from the checkpointed cursor.
  const Walk rest = walk(connector(R"({"limit":3})"),
                         params(kSyntheticProject, std::string(*first.next_cursor())));
  events.insert(events.end(), rest.events.begin(), rest.events.end());
  EXPECT_EQ(uids_of(events), uids_of(whole.events));
}

struct LastPage {
  const char* name;
  const char* body;
};

void PrintTo(const LastPage& param, std::ostream* out) { *out << param.name; }

class VercelLastPageTest : public VercelTest, public ::testing::WithParamInterface<LastPage> {};

TEST_P(VercelLastPageTest, EndsTheWalk) {
  reply(list_url("prj_1"), 200, GetParam().body);
  const plugins::Page page = connector().fetch_page(params("prj_1"));
  EXPECT_EQ(page.size(), 1u);
  EXPECT_FALSE(page.next_cursor().has_value());
}

INSTANTIATE_TEST_SUITE_P(
    Pagination, VercelLastPageTest,
    ::testing::Values(
        LastPage{"MissingPagination", R"({"deployments":[{"uid":"dpl_a","created":5}]})"},
        LastPage{"NullPagination",
                 R"({"deployments":[{"uid":"dpl_a","created":5}],"pagination":null})"},
        LastPage{"NullNext", R"({"deployments":[{"uid":"dpl_a","created":5}],
                 "pagination":{"count":1,"next":null,"prev":5}})"},
        LastPage{"MissingNext", R"({"deployments":[{"uid":"dpl_a","created":5}],
                 "pagination":{"count":1,"prev":5}})"},
        // Vercel's own CLI pages `while (next)`: 0 ends the walk there too.
        LastPage{"ZeroNext", R"({"deployments":[{"uid":"dpl_a","created":5}],
                 "pagination":{"count":1,"next":0,"prev":5}})"}),
    [](const ::testing::TestParamInfo<LastPage>& param_info) {
      return std::string(param_info.param.name);
    });

TEST_F(VercelPaginationTest, BareTimestampCursorAsksForUntilThatTimestamp) {
  // A `next` that matches no deployment on the page gives a bare cursor, used as is.
  reply(list_url("prj_1", "&until=1784454000000"), 200,
        R"({"deployments":[{"uid":"dpl_a","created":1784453000000}],
            "pagination":{"count":1,"next":1784452999999,"prev":1784453000000}})");
  const plugins::Page page = connector().fetch_page(params("prj_1", "1784454000000"));
  EXPECT_EQ(page.size(), 1u);
  EXPECT_EQ(page.next_cursor(), "1784452999999");
}

TEST_F(VercelPaginationTest, NextThatDoesNotAdvanceIsFatalInsteadOfALoop) {
  reply(list_url("prj_1", "&until=1784454000001"), 200,
        R"({"deployments":[{"uid":"dpl_b","created":1784453000000}],
            "pagination":{"count":1,"next":1784454000001,"prev":1784453000000}})");
  const plugins::ConnectorFailure failure =
      failure_of([&] { connector().fetch_page(params("prj_1", "1784454000000:dpl_a")); });
  EXPECT_EQ(failure.status(), BACKHAUL_FATAL);
  EXPECT_NE(std::string(failure.what()).find("does not move past"), std::string::npos);
}

class VercelBadCursorTest : public VercelTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(VercelBadCursorTest, IsInvalidArgumentAndAsksNothing) {
  const plugins::ConnectorFailure failure =
      failure_of([&] { connector().fetch_page(params("prj_1", GetParam())); });
  EXPECT_EQ(failure.status(), BACKHAUL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(failure.what()).find("cursor"), std::string::npos) << failure.what();
  EXPECT_EQ(transport_.request_count(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Pagination, VercelBadCursorTest,
                         ::testing::Values("", "abc", "-5", "+5", " 5", "12x", "1.5", "0x10",
                                           "99999999999999999999", "1:", "1:dpl_a,,dpl_b",
                                           "1:dpl a", "1:dpl_a,", "9223372036854775807:dpl_a",
                                           "https://api.vercel.com/v6/deployments?until=5"));

// --- a simulated API -------------------------------------------------------------------------

struct SimDeployment {
  std::string uid;
  int64_t created = 0;
};

// `count` deployments, newest first, with runs of up to `max_same_ms` sharing one millisecond and
// gaps of 1-3 ms between runs (so `until` and `until + 1` both matter). Deterministic per seed.
std::vector<SimDeployment> make_deployments(uint32_t seed, size_t count, size_t max_same_ms) {
  std::mt19937 rng(seed);
  std::vector<SimDeployment> deployments;
  int64_t created = 1'784'400'000'000;
  size_t run = 0;
  for (size_t i = 0; i < count; ++i) {
    if (i > 0 && run < max_same_ms && rng() % 100 < 45) {
      ++run;
    } else {
      if (i > 0) created -= 1 + static_cast<int64_t>(rng() % 3);
      run = 1;
    }
    deployments.push_back({"dpl_sim" + std::to_string(seed) + "n" + std::to_string(i), created});
  }
  return deployments;
}

// What Vercel documents: the newest `limit` deployments created strictly before `until`, and
// pagination.next = the last one's `created` while more remain.
std::string simulated_page(const std::vector<SimDeployment>& all, std::optional<int64_t> until,
                           size_t limit) {
  json items = json::array();
  size_t matching = 0;
  for (const SimDeployment& d : all) {
    if (until && d.created >= *until) continue;
    ++matching;
    if (items.size() < limit)
      items.push_back({{"uid", d.uid}, {"created", d.created}, {"readyState", "READY"}});
  }
  json pagination = nullptr;
  if (!items.empty()) {
    pagination = {{"count", items.size()},
                  {"next", matching > limit ? items.back()["created"] : json(nullptr)},
                  {"prev", items.front()["created"]}};
  }
  return json{{"deployments", items}, {"pagination", pagination}}.dump();
}

struct SimCase {
  uint32_t seed;
  size_t limit;
  size_t max_same_ms;
};

void PrintTo(const SimCase& c, std::ostream* out) {
  *out << "{seed " << c.seed << ", limit " << c.limit << ", max_same_ms " << c.max_same_ms << "}";
}

class VercelSimulatedApiTest : public VercelTest, public ::testing::WithParamInterface<SimCase> {
 protected:
  // Records the answer to every request a walk can make: no until, until=t and until=t+1.
  void reply_simulated_api(const std::vector<SimDeployment>& all, size_t limit) {
    const std::string project = "prj_sim";
    reply(list_url(project, "", static_cast<int>(limit)), 200, simulated_page(all, {}, limit));
    std::set<int64_t> untils;
    for (const SimDeployment& d : all) untils.insert({d.created, d.created + 1});
    for (int64_t until : untils) {
      reply(list_url(project, "&until=" + std::to_string(until), static_cast<int>(limit)), 200,
            simulated_page(all, until, limit));
    }
  }
  Walk walk_simulated(size_t limit) {
    return walk(connector(R"({"limit":)" + std::to_string(limit) + "}"), params("prj_sim"), 1000);
  }
};

TEST_P(VercelSimulatedApiTest, EveryDeploymentExactlyOnceInOrder) {
  const SimCase c = GetParam();
  const std::vector<SimDeployment> all = make_deployments(c.seed, 40, c.max_same_ms);
  reply_simulated_api(all, c.limit);
  const Walk result = walk_simulated(c.limit);
  std::vector<std::string> expected;
  for (const SimDeployment& d : all) expected.push_back(d.uid);
  EXPECT_EQ(uids_of(result.events), expected);
  for (size_t i = 1; i < result.cursors.size(); ++i)
    EXPECT_NE(result.cursors[i], result.cursors[i - 1]) << "cursor " << i << " repeats";
}

// Up to `limit` deployments per millisecond: nothing is lost.
INSTANTIATE_TEST_SUITE_P(Pagination, VercelSimulatedApiTest,
                         ::testing::Values(SimCase{1, 1, 1}, SimCase{2, 2, 1}, SimCase{3, 2, 2},
                                           SimCase{4, 3, 3}, SimCase{5, 3, 2}, SimCase{6, 5, 4},
                                           SimCase{7, 10, 10}, SimCase{8, 100, 6}, SimCase{9, 4, 4},
                                           SimCase{10, 7, 3}),
                         [](const ::testing::TestParamInfo<SimCase>& param_info) {
                           const SimCase& c = param_info.param;
                           return "Seed" + std::to_string(c.seed) + "Limit" +
                                  std::to_string(c.limit) + "SameMs" +
                                  std::to_string(c.max_same_ms);
                         });

TEST_F(VercelSimulatedApiTest, MoreDeploymentsInOneMillisecondThanAPageStillTerminate) {
  // 6 deployments per millisecond, 3 per page: some are unreachable through the API, but the
  // walk ends and never emits a deployment twice.
  std::vector<SimDeployment> all;
  for (int ms = 0; ms < 4; ++ms) {
    for (int i = 0; i < 6; ++i)
      all.push_back(
          {"dpl_ms" + std::to_string(ms) + "n" + std::to_string(i), 1'784'400'000'000 - ms});
  }
  reply_simulated_api(all, 3);
  const Walk result = walk_simulated(3);
  const std::vector<std::string> uids = uids_of(result.events);
  EXPECT_EQ(std::set<std::string>(uids.begin(), uids.end()).size(), uids.size());
  EXPECT_GE(uids.size(), 12u);  // at least one page's worth of every millisecond
  EXPECT_LT(result.pages, 20u);
}

}  // namespace
}  // namespace backhaul::vercel::testing
