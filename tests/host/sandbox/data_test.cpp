// Unit tests of the deterministic data model and the parsing helpers (no HTTP).
#include "host/sandbox/data.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "host/sandbox/http.h"
#include "host/sandbox/rng.h"

namespace backhaul::sandbox {
namespace {

constexpr int64_t kAnchor = 1'800'000'000'000;

DataModel make_model(int64_t items = 250, uint64_t seed = 7) {
  return DataModel(DataConfig{seed, 2, 3, 2, items, kAnchor});
}

TEST(RngTest, UnmixInvertsMix) {
  SplitMix64 rng(42);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t value = rng.next();
    EXPECT_EQ(unmix64(mix64(value)), value);
  }
}

TEST(RngTest, Base62RoundTripsExtremes) {
  for (uint64_t value : {uint64_t{0}, uint64_t{61}, UINT64_MAX, uint64_t{0x0123456789abcdef}}) {
    uint64_t decoded = 1;
    ASSERT_TRUE(parse_base62_fixed11(base62_fixed11(value), &decoded));
    EXPECT_EQ(decoded, value);
  }
  uint64_t ignored = 0;
  EXPECT_FALSE(parse_base62_fixed11("zzzzzzzzzzz", &ignored));  // above 2^64
  EXPECT_FALSE(parse_base62_fixed11("abc", &ignored));
}

TEST(HttpHelpersTest, Iso8601RoundTripsAndAcceptsOffsets) {
  EXPECT_EQ(format_iso8601(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(format_iso8601(1'658'208'999'123), "2022-07-19T05:36:39Z");
  EXPECT_EQ(parse_iso8601("2022-07-19T05:36:39Z"), 1'658'208'999'000);
  EXPECT_EQ(parse_iso8601("2022-07-19T05:36:39.5Z"), 1'658'208'999'500);
  EXPECT_EQ(parse_iso8601("2022-07-19T07:36:39+02:00"), 1'658'208'999'000);
  EXPECT_EQ(parse_iso8601("2022-07-19"), 1'658'188'800'000);
  EXPECT_FALSE(parse_iso8601("yesterday"));
  EXPECT_FALSE(parse_iso8601("2022-13-01T00:00:00Z"));
}

TEST(HttpHelpersTest, QueryKeepsRawPairsForLinks) {
  const Query query = Query::parse("per_page=3&since=2024-01-01T00%3A00%3A00Z&page=2");
  EXPECT_EQ(query.get("since"), "2024-01-01T00:00:00Z");
  EXPECT_EQ(query.raw_without("page"), "per_page=3&since=2024-01-01T00%3A00%3A00Z");
  EXPECT_FALSE(query.get("state"));
}

// --first-installation-repos: inst-1 alone is larger; everything that counts repositories agrees.
TEST(DataModelTest, TheFirstInstallationCanOwnMoreRepositoriesThanTheOthers) {
  DataConfig config{1, 2, 3, 0, 10, kAnchor};
  config.first_repos = 7;
  const DataModel model(config);
  EXPECT_EQ(model.repos_of(1), 7);
  EXPECT_EQ(model.repos_of(2), 3);
  EXPECT_EQ(model.connection_json({1, Provider::kGithub})["resources"].size(), 7u);
  EXPECT_EQ(model.connection_json({2, Provider::kGithub})["resources"].size(), 3u);
  EXPECT_EQ(model.expected_count(1, Provider::kGithub), 7 * 3 * 10);
  EXPECT_EQ(model.expected_count(2, Provider::kGithub), 3 * 3 * 10);
  EXPECT_TRUE(model.find_repo(100'000 + 7).has_value());
  EXPECT_FALSE(model.find_repo(200'000 + 7).has_value());
  int64_t visited = 0;
  model.for_each_expected(1, [&](const std::string&, Provider) { ++visited; });
  EXPECT_EQ(visited, 7 * 3 * 10);
}

TEST(DataModelTest, TimestampsLieInTheFiveDaysBeforeTheAnchorNewestFirst) {
  const DataModel model = make_model();
  const RepoRef repo = *model.find_repo("org-1", "repo-2");
  for (GithubList list : {GithubList::kPulls, GithubList::kIssues, GithubList::kReleases}) {
    int64_t previous = kAnchor;
    for (int64_t position = 0; position < model.list_size(list); ++position) {
      const int64_t updated = model.updated_ms(repo, list, position);
      EXPECT_LE(updated, previous);
      EXPECT_GT(updated, kAnchor - DataModel::kWindowMs - 1000);
      previous = updated;
    }
  }
}

TEST(DataModelTest, DeploymentsShareTheCreatedMillisecondAtEveryHundredthBoundary) {
  const DataModel model = make_model();
  const ProjectRef project{1, 1};
  EXPECT_EQ(model.deployment_created_ms(project, 99), model.deployment_created_ms(project, 100));
  EXPECT_EQ(model.deployment_created_ms(project, 199), model.deployment_created_ms(project, 200));
  EXPECT_GT(model.deployment_created_ms(project, 98), model.deployment_created_ms(project, 99));
  EXPECT_GT(model.deployment_created_ms(project, 100), model.deployment_created_ms(project, 101));
  EXPECT_NE(model.deployment_uid(project, 99), model.deployment_uid(project, 100));
}

TEST(DataModelTest, ExpectedIdsAreUniqueClassifiedAndCounted) {
  const DataModel model = make_model(40);
  for (int installation = 1; installation <= 2; ++installation) {
    std::set<std::string> ids;
    int64_t github = 0;
    int64_t vercel = 0;
    model.for_each_expected(installation, [&](const std::string& id, Provider provider) {
      EXPECT_TRUE(ids.insert(id).second) << id;
      auto owner = model.classify_delivery(id);
      ASSERT_TRUE(owner) << id;
      EXPECT_EQ(owner->installation, installation);
      EXPECT_EQ(owner->provider, provider);
      (provider == Provider::kGithub ? github : vercel) += 1;
    });
    EXPECT_EQ(github, model.expected_count(installation, Provider::kGithub));
    EXPECT_EQ(vercel, model.expected_count(installation, Provider::kVercel));
    EXPECT_EQ(github, 3 * 3 * 40);
    EXPECT_EQ(vercel, 2 * 40);
  }
}

TEST(DataModelTest, RejectsIdsOutsideTheDataSet) {
  const DataModel model = make_model(40);
  const std::string uid = model.deployment_uid({1, 1}, 5);
  EXPECT_TRUE(model.classify_delivery("backfill-inst-1-100001-pr-40"));
  EXPECT_TRUE(model.classify_delivery("backfill-inst-1-prj_1_1-deploy-" + uid));
  for (const std::string& id : std::vector<std::string>{
           "backfill-inst-1-100001-pr-41",           // past the last number
           "backfill-inst-1-100001-pr-040",          // not canonical
           "backfill-inst-1-200001-pr-1",            // another installation's repo
           "backfill-inst-3-300001-pr-1",            // no such installation
           "backfill-inst-1-100004-pr-1",            // no such repo
           "backfill-inst-1-100001-issue-1",         // a pull request number
           "backfill-inst-1-100001-issue-53",        // a PR-shaped entry of the issues list
           "backfill-inst-1-100001-release-1",       // not a release id
           "backfill-inst-1-prj_1_1-deploy-dpl_x",   // malformed uid
           "backfill-inst-1-prj_1_2-deploy-" + uid,  // another project's uid
           "backfill-inst-2-prj_2_1-deploy-" + uid,  // another installation's uid
           "inst-1-100001-pr-1",                     // no prefix
       }) {
    EXPECT_FALSE(model.classify_delivery(id)) << id;
  }
}

TEST(DataModelTest, IssuesListInterleavesOnePullRequestAfterEveryFiveIssues) {
  const DataModel model = make_model(50);
  const RepoRef repo = *model.find_repo(100001);
  EXPECT_EQ(model.list_size(GithubList::kIssues), 60);
  int pull_requests = 0;
  for (int64_t position = 0; position < 60; ++position) {
    const auto item = model.item_json(repo, GithubList::kIssues, position);
    pull_requests += item.contains("pull_request") ? 1 : 0;
    EXPECT_EQ(item.contains("pull_request"), DataModel::is_pull_request_entry(position));
  }
  EXPECT_EQ(pull_requests, 10);
}

TEST(DataModelTest, SameSeedSameDocumentsOtherSeedOtherDocuments) {
  const RepoRef repo{1, 1, 100001};
  EXPECT_EQ(make_model(50, 1).item_json(repo, GithubList::kPulls, 3),
            make_model(50, 1).item_json(repo, GithubList::kPulls, 3));
  EXPECT_NE(make_model(50, 1).item_json(repo, GithubList::kPulls, 3),
            make_model(50, 2).item_json(repo, GithubList::kPulls, 3));
  EXPECT_NE(make_model(50, 1).deployment_uid({1, 1}, 0),
            make_model(50, 2).deployment_uid({1, 1}, 0));
}

}  // namespace
}  // namespace backhaul::sandbox
