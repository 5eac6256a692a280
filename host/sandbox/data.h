// The sandbox's deterministic data set: installations, their GitHub repositories and Vercel
// projects, and the items in them. Nothing is stored: every document is computed from
// (seed, counts, anchor, position) on demand, so a page costs O(page) whatever the data size.
//
// Lists are indexed by position, 0 = newest. Along positions, created and updated timestamps never
// increase, so every filter the fake APIs support (state, since, until) selects a contiguous
// range of positions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace backhaul::sandbox {

enum class Provider { kGithub = 1, kVercel };

std::string_view provider_name(Provider provider);
std::optional<Provider> parse_provider(std::string_view name);
// 0 for GitHub, 1 for Vercel: an index into per-provider arrays.
inline size_t provider_index(Provider provider) { return provider == Provider::kGithub ? 0 : 1; }

enum class GithubList { kPulls = 1, kIssues, kReleases };

struct DataConfig {
  uint64_t seed = 1;
  int installations = 1;
  int repos = 3;
  int projects = 1;
  int64_t items = 250;
  int64_t anchor_ms = 0;  // generated timestamps lie in (anchor - 5 days, anchor)
  int first_repos = -1;   // repositories of installation 1 (a "huge" tenant); -1 = repos
};

// Installation i (1-based) owns repos r = 1..repos_of(i) and projects p = 1..projects.
struct RepoRef {
  int installation = 0;
  int repo = 0;
  int64_t id = 0;  // 100000 * installation + repo
};

struct ProjectRef {
  int installation = 0;
  int project = 0;
};

struct Connection {
  int installation = 0;
  Provider provider = Provider::kGithub;
};

class DataModel {
 public:
  // Repositories of installation i: first_repos for the first when set, else repos.
  int repos_of(int installation) const {
    return installation == 1 && config_.first_repos >= 0 ? config_.first_repos : config_.repos;
  }
  static constexpr int64_t kWindowMs = 5LL * 24 * 3600 * 1000;
  static constexpr int64_t kReleaseIdFactor = 10'000'000;
  // Deployments at positions k*100-1 and k*100 share their `created` millisecond: Vercel's
  // until=<created> cursor (strictly before) makes that the interesting page boundary.
  static constexpr int64_t kDeploymentTieEvery = 100;

  explicit DataModel(DataConfig config);

  const DataConfig& config() const { return config_; }
  int installations() const { return config_.installations; }

  // ---- names and lookups (all return nullopt for anything outside the data set) ----
  static std::string installation_id(int installation);  // "inst-{i}"
  std::optional<int> parse_installation_id(std::string_view id) const;
  static std::string org_login(int installation);           // "org-{i}"
  static std::string repo_name(int repo);                   // "repo-{r}"
  static std::string project_id(ProjectRef project);        // "prj_{i}_{p}"
  static std::string project_name(int project);             // "project-{p}"
  static std::string connection_id(Connection connection);  // "gh-inst-{i}" / "vc-inst-{i}"

  std::optional<RepoRef> find_repo(std::string_view owner, std::string_view name) const;
  std::optional<RepoRef> find_repo(int64_t id) const;
  // `id_or_name` is "prj_{i}_{p}" (any installation) or "project-{p}" (of `installation`).
  std::optional<ProjectRef> find_project(int installation, std::string_view id_or_name) const;
  // Accepts "gh-inst-{i}" / "vc-inst-{i}".
  std::optional<Connection> find_connection(std::string_view id) const;

  // ---- list geometry ----
  int64_t list_size(GithubList list) const;
  int64_t deployment_count() const { return config_.items; }
  // Positions [0, open_count) are open, the rest are closed (recent work is still open).
  int64_t open_count(GithubList list) const;
  // updated_at as served (whole seconds), in milliseconds. Non-increasing along positions.
  int64_t updated_ms(RepoRef repo, GithubList list, int64_t position) const;
  int64_t deployment_created_ms(ProjectRef project, int64_t position) const;
  // True if the issues-list entry at `position` is a pull request (has a "pull_request" key).
  static bool is_pull_request_entry(int64_t position) { return position % 6 == 5; }

  // ---- documents ----
  nlohmann::json repo_json(RepoRef repo) const;
  nlohmann::json item_json(RepoRef repo, GithubList list, int64_t position) const;
  nlohmann::json project_json(ProjectRef project) const;
  nlohmann::json deployment_json(ProjectRef project, int64_t position) const;
  nlohmann::json connection_json(Connection connection) const;
  std::string deployment_uid(ProjectRef project, int64_t position) const;

  // ---- delivery ids a complete backfill produces ----
  struct DeliveryOwner {
    int installation = 0;
    Provider provider = Provider::kGithub;
  };
  // The owner if `delivery_id` is one the data set implies, else nullopt. O(1).
  std::optional<DeliveryOwner> classify_delivery(std::string_view delivery_id) const;
  int64_t expected_count(int installation, Provider provider) const;
  // Calls `visit` with every expected delivery id of `installation`, repos then projects.
  void for_each_expected(int installation,
                         const std::function<void(const std::string&, Provider)>& visit) const;

 private:
  int64_t issue_number(int64_t position) const;
  int64_t created_ms(uint64_t salt, int64_t count, int64_t position) const;
  uint64_t list_salt(RepoRef repo, GithubList list) const;
  uint64_t deployment_key(ProjectRef project, int64_t position) const;
  nlohmann::json pull_json(RepoRef repo, int64_t position) const;
  nlohmann::json issue_json(RepoRef repo, int64_t position) const;
  nlohmann::json release_json(RepoRef repo, int64_t position) const;
  nlohmann::json user_json(uint64_t pick) const;
  std::optional<DeliveryOwner> classify_github(int installation, std::string_view rest) const;
  std::optional<DeliveryOwner> classify_vercel(int installation, std::string_view rest) const;

  DataConfig config_;
  uint64_t uid_mask_;  // seed-dependent whitening of deployment uids
};

}  // namespace backhaul::sandbox
