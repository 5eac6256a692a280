#include "host/sandbox/data.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "host/sandbox/http.h"
#include "host/sandbox/rng.h"

namespace backhaul::sandbox {
namespace {

using nlohmann::json;

// Payload URLs point at the real API hosts, not at the sandbox, so that bodies do not depend on
// the port the sandbox happens to listen on (pagination links do use the sandbox's address).
constexpr std::string_view kApi = "https://api.github.com";
constexpr std::string_view kWeb = "https://github.com";

// Hash domains, so that different kinds of values drawn for the same position are independent.
enum Domain : uint64_t {
  kTimeline = 1,
  kUpdate,
  kPullDoc,
  kIssueDoc,
  kReleaseDoc,
  kDeployDoc,
  kUidSuffix,
  kUser,
  kNodeId,
  kUidMask,
};

// The position-independent part of the GitHub ids (see validate(SandboxOptions)).
constexpr int64_t kPullIdBase = 2'000'000'000'000'000;
constexpr int64_t kIssueIdBase = 4'000'000'000'000'000;
constexpr int64_t kRepoIdFactor = 100'000;

constexpr std::array<std::string_view, 12> kLogins = {
    "octocat", "hubot",    "monalisa", "defunkt", "mojombo", "pjhyett",
    "wycats",  "ezmobius", "ivey",     "evanphx", "vanpelt", "technoweenie"};
constexpr std::array<std::string_view, 10> kVerbs = {"Fix",    "Add",      "Remove",   "Refactor",
                                                     "Update", "Document", "Speed up", "Harden",
                                                     "Test",   "Simplify"};
constexpr std::array<std::string_view, 12> kTopics = {
    "token refresh",     "pagination cursor", "rate limiter",  "retry backoff",
    "webhook signature", "cache eviction",    "login flow",    "build pipeline",
    "release notes",     "error messages",    "config loader", "metrics endpoint"};
constexpr std::array<std::string_view, 6> kLabels = {
    "bug", "enhancement", "documentation", "good first issue", "performance", "security"};

std::string pick_title(SplitMix64& rng) {
  std::string title(kVerbs[rng.below(kVerbs.size())]);
  title += ' ';
  title += kTopics[rng.below(kTopics.size())];
  if (rng.below(3) == 0) title += " on slow networks";
  return title;
}

std::string node_id(std::string_view prefix, uint64_t a, uint64_t b) {
  const uint64_t kind = fnv1a(prefix);
  return std::string(prefix) + "_kwDO" + base62_fixed11(hash64({kNodeId, kind, a, b}));
}

int64_t floor_to_second(int64_t ms) { return ms - ((ms % 1000) + 1000) % 1000; }

json labels_json(SplitMix64& rng, const std::string& repo_api_url) {
  json labels = json::array();
  const uint64_t count = rng.below(3);
  const uint64_t first = rng.below(kLabels.size());
  for (uint64_t k = 0; k < count; ++k) {
    const uint64_t index = (first + k) % kLabels.size();
    const std::string name(kLabels[index]);
    labels.push_back({{"id", 5'000'000'000 + index},
                      {"node_id", node_id("LA", index, 0)},
                      {"url", repo_api_url + "/labels/" + name},
                      {"name", name},
                      {"color", "d73a4a"},
                      {"default", index < 3},
                      {"description", nullptr}});
  }
  return labels;
}

// Strips `prefix` from the front of `*text`.
bool consume(std::string_view* text, std::string_view prefix) {
  if (text->substr(0, prefix.size()) != prefix) return false;
  text->remove_prefix(prefix.size());
  return true;
}

// Reads a canonical decimal (no sign, no leading zeros) up to the next non-digit.
bool consume_number(std::string_view* text, int64_t* value) {
  size_t digits = 0;
  while (digits < text->size() && std::isdigit(static_cast<unsigned char>((*text)[digits]))) {
    ++digits;
  }
  if (digits == 0 || digits > 18 || ((*text)[0] == '0' && digits > 1)) return false;
  *value = *parse_int(text->substr(0, digits));
  text->remove_prefix(digits);
  return true;
}

}  // namespace

std::string_view provider_name(Provider provider) {
  return provider == Provider::kGithub ? "github" : "vercel";
}

std::optional<Provider> parse_provider(std::string_view name) {
  if (name == "github") return Provider::kGithub;
  if (name == "vercel") return Provider::kVercel;
  return std::nullopt;
}

DataModel::DataModel(DataConfig config)
    : config_(config), uid_mask_(hash64({config.seed, kUidMask})) {}

// ---- names and lookups ----

std::string DataModel::installation_id(int installation) {
  return "inst-" + std::to_string(installation);
}

std::optional<int> DataModel::parse_installation_id(std::string_view id) const {
  int64_t number = 0;
  if (!consume(&id, "inst-") || !consume_number(&id, &number) || !id.empty()) return std::nullopt;
  if (number < 1 || number > config_.installations) return std::nullopt;
  return static_cast<int>(number);
}

std::string DataModel::org_login(int installation) { return "org-" + std::to_string(installation); }

std::string DataModel::repo_name(int repo) { return "repo-" + std::to_string(repo); }

std::string DataModel::project_id(ProjectRef project) {
  return "prj_" + std::to_string(project.installation) + "_" + std::to_string(project.project);
}

std::string DataModel::project_name(int project) { return "project-" + std::to_string(project); }

std::string DataModel::connection_id(Connection connection) {
  return (connection.provider == Provider::kGithub ? "gh-" : "vc-") +
         installation_id(connection.installation);
}

std::optional<RepoRef> DataModel::find_repo(std::string_view owner, std::string_view name) const {
  int64_t installation = 0;
  int64_t repo = 0;
  if (!consume(&owner, "org-") || !consume_number(&owner, &installation) || !owner.empty()) {
    return std::nullopt;
  }
  if (!consume(&name, "repo-") || !consume_number(&name, &repo) || !name.empty()) {
    return std::nullopt;
  }
  // In range before the id is formed: org-576460752303423489 would wrap into org-1's ids.
  if (installation < 1 || installation > config_.installations) return std::nullopt;
  if (repo < 1 || repo >= kRepoIdFactor) return std::nullopt;
  return find_repo(installation * kRepoIdFactor + repo);
}

std::optional<RepoRef> DataModel::find_repo(int64_t id) const {
  const int64_t installation = id / kRepoIdFactor;
  const int64_t repo = id % kRepoIdFactor;
  if (installation < 1 || installation > config_.installations) return std::nullopt;
  if (repo < 1 || repo > repos_of(static_cast<int>(installation))) return std::nullopt;
  return RepoRef{static_cast<int>(installation), static_cast<int>(repo), id};
}

std::optional<ProjectRef> DataModel::find_project(int installation,
                                                  std::string_view id_or_name) const {
  int64_t owner = installation;
  int64_t project = 0;
  std::string_view text = id_or_name;
  if (consume(&text, "prj_")) {
    if (!consume_number(&text, &owner) || !consume(&text, "_")) return std::nullopt;
  } else if (!consume(&text, "project-")) {
    return std::nullopt;
  }
  if (!consume_number(&text, &project) || !text.empty()) return std::nullopt;
  if (owner < 1 || owner > config_.installations) return std::nullopt;
  if (project < 1 || project > config_.projects) return std::nullopt;
  return ProjectRef{static_cast<int>(owner), static_cast<int>(project)};
}

std::optional<Connection> DataModel::find_connection(std::string_view id) const {
  Provider provider;
  if (consume(&id, "gh-")) {
    provider = Provider::kGithub;
  } else if (consume(&id, "vc-")) {
    provider = Provider::kVercel;
  } else {
    return std::nullopt;
  }
  auto installation = parse_installation_id(id);
  if (!installation) return std::nullopt;
  return Connection{*installation, provider};
}

// ---- list geometry ----

int64_t DataModel::list_size(GithubList list) const {
  // The issues list holds `items` issues plus one pull request after every five issues.
  return list == GithubList::kIssues ? config_.items + config_.items / 5 : config_.items;
}

int64_t DataModel::open_count(GithubList list) const {
  switch (list) {
    case GithubList::kPulls:
      return config_.items * 15 / 100;
    case GithubList::kIssues:
      return list_size(list) * 20 / 100;
    case GithubList::kReleases:
      return 0;
  }
  return 0;
}

// Item k of a list of `count` sits in slot k of `count + 1` equal slots counted back from the
// anchor, with a jitter below a quarter slot: strictly decreasing, and within the 5-day window.
int64_t DataModel::created_ms(uint64_t salt, int64_t count, int64_t position) const {
  const int64_t step = std::max<int64_t>(4, kWindowMs / (count + 1));
  const auto jitter = static_cast<int64_t>(
      hash64({config_.seed, kTimeline, salt, uint64_t(position)}) % uint64_t(step / 4));
  return config_.anchor_ms - (position + 1) * step + jitter;
}

uint64_t DataModel::list_salt(RepoRef repo, GithubList list) const {
  return hash64({uint64_t(repo.id), uint64_t(list)});
}

int64_t DataModel::updated_ms(RepoRef repo, GithubList list, int64_t position) const {
  // updated = created + less than a quarter slot, so updated order equals created order.
  const int64_t count = list_size(list);
  const uint64_t salt = list_salt(repo, list);
  const int64_t step = std::max<int64_t>(4, kWindowMs / (count + 1));
  const auto delay = static_cast<int64_t>(
      hash64({config_.seed, kUpdate, salt, uint64_t(position)}) % uint64_t(step / 4));
  return floor_to_second(created_ms(salt, count, position) + delay);
}

int64_t DataModel::deployment_created_ms(ProjectRef project, int64_t position) const {
  if (position > 0 && position % kDeploymentTieEvery == 0) --position;
  const uint64_t salt = hash64({uint64_t(project.installation), uint64_t(project.project), 7});
  return created_ms(salt, config_.items, position);
}

int64_t DataModel::issue_number(int64_t position) const {
  // Pull requests take numbers 1..items; issues-list entries the next range, newest highest.
  return config_.items + list_size(GithubList::kIssues) - position;
}

// ---- documents ----

json DataModel::user_json(uint64_t pick) const {
  const size_t index = pick % kLogins.size();
  const std::string login(kLogins[index]);
  const int64_t id = 580'000 + static_cast<int64_t>(hash64({kUser, index}) % 9'000'000);
  return {{"login", login},
          {"id", id},
          {"node_id", node_id("U", index, 0)},
          {"avatar_url", "https://avatars.githubusercontent.com/u/" + std::to_string(id) + "?v=4"},
          {"url", std::string(kApi) + "/users/" + login},
          {"html_url", std::string(kWeb) + "/" + login},
          {"type", "User"},
          {"site_admin", false}};
}

json DataModel::repo_json(RepoRef repo) const {
  const std::string org = org_login(repo.installation);
  const std::string name = repo_name(repo.repo);
  const std::string full_name = org + "/" + name;
  const std::string created = format_iso8601(config_.anchor_ms - 400LL * 24 * 3600 * 1000);
  const std::string updated = format_iso8601(floor_to_second(config_.anchor_ms - 60'000));
  const int64_t org_id = 9'000'000 + repo.installation;
  return {{"id", repo.id},
          {"node_id", node_id("R", uint64_t(repo.id), 0)},
          {"name", name},
          {"full_name", full_name},
          {"private", true},
          {"owner",
           {{"login", org},
            {"id", org_id},
            {"node_id", node_id("O", uint64_t(org_id), 0)},
            {"url", std::string(kApi) + "/users/" + org},
            {"html_url", std::string(kWeb) + "/" + org},
            {"type", "Organization"},
            {"site_admin", false}}},
          {"html_url", std::string(kWeb) + "/" + full_name},
          {"description", "Sandbox repository " + full_name},
          {"fork", false},
          {"url", std::string(kApi) + "/repos/" + full_name},
          {"created_at", created},
          {"updated_at", updated},
          {"pushed_at", updated},
          {"homepage", nullptr},
          {"size", 1024 + repo.repo},
          {"stargazers_count", repo.repo * 7},
          {"watchers_count", repo.repo * 7},
          {"language", "C++"},
          {"forks_count", 0},
          {"open_issues_count", open_count(GithubList::kIssues)},
          {"default_branch", "main"},
          {"visibility", "private"},
          {"archived", false},
          {"disabled", false},
          {"has_issues", true},
          {"permissions",
           {{"admin", false},
            {"maintain", false},
            {"push", false},
            {"triage", false},
            {"pull", true}}}};
}

json DataModel::item_json(RepoRef repo, GithubList list, int64_t position) const {
  switch (list) {
    case GithubList::kPulls:
      return pull_json(repo, position);
    case GithubList::kIssues:
      return issue_json(repo, position);
    case GithubList::kReleases:
      return release_json(repo, position);
  }
  return nullptr;
}

json DataModel::pull_json(RepoRef repo, int64_t position) const {
  SplitMix64 rng(hash64({config_.seed, kPullDoc, uint64_t(repo.id), uint64_t(position)}));
  const int64_t number = config_.items - position;
  const std::string full_name = org_login(repo.installation) + "/" + repo_name(repo.repo);
  const std::string repo_api = std::string(kApi) + "/repos/" + full_name;
  const std::string html = std::string(kWeb) + "/" + full_name + "/pull/" + std::to_string(number);
  const int64_t count = list_size(GithubList::kPulls);
  const int64_t created =
      floor_to_second(created_ms(list_salt(repo, GithubList::kPulls), count, position));
  const int64_t updated = updated_ms(repo, GithubList::kPulls, position);
  const bool open = position < open_count(GithubList::kPulls);
  const bool merged = !open && rng.below(10) < 7;
  const std::string head_sha = random_hex(rng, 40);
  json user = user_json(rng.next());
  const std::string branch = "feature/change-" + std::to_string(number);
  return {{"url", repo_api + "/pulls/" + std::to_string(number)},
          {"id", kPullIdBase + repo.id * kReleaseIdFactor + number},
          {"node_id", node_id("PR", uint64_t(repo.id), uint64_t(number))},
          {"html_url", html},
          {"diff_url", html + ".diff"},
          {"patch_url", html + ".patch"},
          {"issue_url", repo_api + "/issues/" + std::to_string(number)},
          {"number", number},
          {"state", open ? "open" : "closed"},
          {"locked", false},
          {"title", pick_title(rng)},
          {"user", user},
          {"body", rng.below(4) == 0 ? json(nullptr) : json("Generated by backhaul-sandbox.")},
          {"labels", labels_json(rng, repo_api)},
          {"milestone", nullptr},
          {"active_lock_reason", nullptr},
          {"created_at", format_iso8601(created)},
          {"updated_at", format_iso8601(updated)},
          {"closed_at", open ? json(nullptr) : json(format_iso8601(updated))},
          {"merged_at", merged ? json(format_iso8601(updated)) : json(nullptr)},
          {"merge_commit_sha", merged ? json(random_hex(rng, 40)) : json(nullptr)},
          {"assignee", nullptr},
          {"assignees", json::array()},
          {"requested_reviewers", json::array()},
          {"requested_teams", json::array()},
          {"head",
           {{"label", user["login"].get<std::string>() + ":" + branch},
            {"ref", branch},
            {"sha", head_sha},
            {"user", user}}},
          {"base",
           {{"label", org_login(repo.installation) + ":main"},
            {"ref", "main"},
            {"sha", random_hex(rng, 40)}}},
          {"author_association", "MEMBER"},
          {"auto_merge", nullptr},
          {"draft", open && rng.below(5) == 0}};
}

json DataModel::issue_json(RepoRef repo, int64_t position) const {
  SplitMix64 rng(hash64({config_.seed, kIssueDoc, uint64_t(repo.id), uint64_t(position)}));
  const int64_t number = issue_number(position);
  const std::string full_name = org_login(repo.installation) + "/" + repo_name(repo.repo);
  const std::string repo_api = std::string(kApi) + "/repos/" + full_name;
  const std::string issue_api = repo_api + "/issues/" + std::to_string(number);
  const bool is_pull = is_pull_request_entry(position);
  const std::string html = std::string(kWeb) + "/" + full_name + (is_pull ? "/pull/" : "/issues/") +
                           std::to_string(number);
  const int64_t count = list_size(GithubList::kIssues);
  const int64_t created =
      floor_to_second(created_ms(list_salt(repo, GithubList::kIssues), count, position));
  const int64_t updated = updated_ms(repo, GithubList::kIssues, position);
  const bool open = position < open_count(GithubList::kIssues);
  const int64_t comments = static_cast<int64_t>(rng.below(12));
  json issue = {{"url", issue_api},
                {"repository_url", repo_api},
                {"labels_url", issue_api + "/labels{/name}"},
                {"comments_url", issue_api + "/comments"},
                {"events_url", issue_api + "/events"},
                {"html_url", html},
                {"id", kIssueIdBase + repo.id * kReleaseIdFactor + number},
                {"node_id", node_id("I", uint64_t(repo.id), uint64_t(number))},
                {"number", number},
                {"title", pick_title(rng)},
                {"user", user_json(rng.next())},
                {"labels", labels_json(rng, repo_api)},
                {"state", open ? "open" : "closed"},
                {"state_reason", open ? json(nullptr) : json("completed")},
                {"locked", false},
                {"assignee", nullptr},
                {"assignees", json::array()},
                {"milestone", nullptr},
                {"comments", comments},
                {"created_at", format_iso8601(created)},
                {"updated_at", format_iso8601(updated)},
                {"closed_at", open ? json(nullptr) : json(format_iso8601(updated))},
                {"author_association", "CONTRIBUTOR"},
                {"active_lock_reason", nullptr},
                {"body", "Generated by backhaul-sandbox."},
                {"reactions", {{"url", issue_api + "/reactions"}, {"total_count", 0}, {"+1", 0}}},
                {"timeline_url", issue_api + "/timeline"},
                {"performed_via_github_app", nullptr}};
  if (is_pull) {
    const std::string pull_api = repo_api + "/pulls/" + std::to_string(number);
    issue["pull_request"] = {{"url", pull_api},
                             {"html_url", html},
                             {"diff_url", html + ".diff"},
                             {"patch_url", html + ".patch"},
                             {"merged_at", open ? json(nullptr) : json(format_iso8601(updated))}};
  }
  return issue;
}

json DataModel::release_json(RepoRef repo, int64_t position) const {
  SplitMix64 rng(hash64({config_.seed, kReleaseDoc, uint64_t(repo.id), uint64_t(position)}));
  const int64_t sequence = config_.items - position;
  const int64_t id = repo.id * kReleaseIdFactor + sequence;
  const std::string full_name = org_login(repo.installation) + "/" + repo_name(repo.repo);
  const std::string repo_api = std::string(kApi) + "/repos/" + full_name;
  const std::string tag = "v" + std::to_string(1 + sequence / 100) + "." +
                          std::to_string(sequence / 10 % 10) + "." + std::to_string(sequence % 10);
  const int64_t count = list_size(GithubList::kReleases);
  const int64_t created =
      floor_to_second(created_ms(list_salt(repo, GithubList::kReleases), count, position));
  const bool draft = rng.below(20) == 0;
  const bool prerelease = !draft && rng.below(10) == 0;
  const std::string release_api = repo_api + "/releases/" + std::to_string(id);
  return {{"url", release_api},
          {"assets_url", release_api + "/assets"},
          {"upload_url", "https://uploads.github.com/repos/" + full_name + "/releases/" +
                             std::to_string(id) + "/assets{?name,label}"},
          {"html_url", std::string(kWeb) + "/" + full_name + "/releases/tag/" + tag},
          {"id", id},
          {"author", user_json(rng.next())},
          {"node_id", node_id("RE", uint64_t(repo.id), uint64_t(sequence))},
          {"tag_name", tag},
          {"target_commitish", "main"},
          {"name", "Release " + tag},
          {"draft", draft},
          {"prerelease", prerelease},
          {"created_at", format_iso8601(created)},
          {"published_at", draft ? json(nullptr) : json(format_iso8601(created + 60'000))},
          {"assets", json::array()},
          {"tarball_url", repo_api + "/tarball/" + tag},
          {"zipball_url", repo_api + "/zipball/" + tag},
          {"body", "Changes in " + tag + "."}};
}

uint64_t DataModel::deployment_key(ProjectRef project, int64_t position) const {
  return (uint64_t(project.installation) << 48) | (uint64_t(project.project) << 32) |
         uint64_t(position);
}

// "dpl_" + 11 invertible base62 digits (so a uid maps back to its position in O(1)) + 13 more.
std::string DataModel::deployment_uid(ProjectRef project, int64_t position) const {
  const uint64_t key = deployment_key(project, position);
  SplitMix64 rng(hash64({config_.seed, kUidSuffix, key}));
  return "dpl_" + base62_fixed11(mix64(key ^ uid_mask_)) + random_alnum(rng, 13);
}

json DataModel::project_json(ProjectRef project) const {
  const std::string org = org_login(project.installation);
  const std::string name = project_name(project.project);
  json latest = json::array();
  for (int64_t position = 0; position < std::min<int64_t>(3, deployment_count()); ++position) {
    const json deployment = deployment_json(project, position);
    latest.push_back({{"id", deployment["uid"]},
                      {"url", deployment["url"]},
                      {"readyState", deployment["readyState"]},
                      {"target", deployment["target"]},
                      {"createdAt", deployment["created"]}});
  }
  json link = nullptr;
  if (repos_of(project.installation) > 0) {
    const int repo = (project.project - 1) % repos_of(project.installation) + 1;
    link = {{"type", "github"},
            {"org", org},
            {"repo", repo_name(repo)},
            {"repoId", int64_t{project.installation} * kRepoIdFactor + repo},
            {"productionBranch", "main"}};
  }
  return {{"id", project_id(project)},
          {"name", name},
          {"accountId",
           "team_" + base62_fixed11(hash64({config_.seed, uint64_t(project.installation)}))},
          {"createdAt", config_.anchor_ms - 300LL * 24 * 3600 * 1000},
          {"updatedAt", config_.anchor_ms - 60'000},
          {"framework", "nextjs"},
          {"nodeVersion", "20.x"},
          {"link", link},
          {"latestDeployments", latest}};
}

json DataModel::deployment_json(ProjectRef project, int64_t position) const {
  SplitMix64 rng(hash64({config_.seed, kDeployDoc, deployment_key(project, position)}));
  const std::string uid = deployment_uid(project, position);
  const std::string org = org_login(project.installation);
  const std::string name = project_name(project.project);
  const int64_t created = deployment_created_ms(project, position);
  const uint64_t roll = rng.below(100);
  const char* state = roll < 80   ? "READY"
                      : roll < 90 ? "ERROR"
                      : roll < 95 ? "CANCELED"
                                  : "BUILDING";
  const bool production = rng.below(3) == 0;
  const int64_t building_at = created + 1000 + static_cast<int64_t>(rng.below(4000));
  const uint64_t creator = rng.below(kLogins.size());
  const std::string login(kLogins[creator]);
  const std::string sha = random_hex(rng, 40);
  const int repos = repos_of(project.installation);
  const std::string repo = repos > 0 ? repo_name((project.project - 1) % repos + 1)
                                     : "site-" + std::to_string(project.project);
  json deployment = {
      {"uid", uid},
      {"name", name},
      {"projectId", project_id(project)},
      {"url", name + "-" + random_alnum(rng, 9) + "-" + org + ".vercel.app"},
      {"created", created},
      {"createdAt", created},
      {"buildingAt", building_at},
      {"source", "git"},
      {"state", state},
      {"readyState", state},
      {"type", "LAMBDAS"},
      {"target", production ? json("production") : json(nullptr)},
      {"creator",
       {{"uid", "usr_" + base62_fixed11(hash64({kUser, creator, 1}))},
        {"username", login},
        {"email", login + "@example.com"},
        {"githubLogin", login}}},
      {"meta",
       {{"githubCommitSha", sha},
        {"githubCommitRef", production ? "main" : "feature/preview-" + std::to_string(position)},
        {"githubCommitMessage", pick_title(rng)},
        {"githubOrg", org},
        {"githubRepo", repo},
        {"githubCommitAuthorLogin", login}}},
      {"inspectorUrl", "https://vercel.com/" + org + "/" + name + "/" + uid.substr(4)},
      {"isRollbackCandidate", production && std::string_view(state) == "READY"},
      {"aliasError", nullptr}};
  if (std::string_view(state) == "READY") {
    const int64_t ready = building_at + 20'000 + static_cast<int64_t>(rng.below(100'000));
    deployment["ready"] = ready;
    deployment["aliasAssigned"] = production ? json(ready) : json(nullptr);
  }
  return deployment;
}

json DataModel::connection_json(Connection connection) const {
  json resources = json::array();
  const int installation = connection.installation;
  if (connection.provider == Provider::kGithub) {
    for (int repo = 1; repo <= repos_of(installation); ++repo) {
      resources.push_back(
          {{"providerResourceId", std::to_string(int64_t{installation} * kRepoIdFactor + repo)},
           {"resourceName", org_login(installation) + "/" + repo_name(repo)}});
    }
  } else {
    for (int project = 1; project <= config_.projects; ++project) {
      resources.push_back({{"providerResourceId", project_id({installation, project})},
                           {"resourceName", project_name(project)}});
    }
  }
  return {{"id", connection_id(connection)},
          {"installationId", installation_id(installation)},
          {"provider", provider_name(connection.provider)},
          {"orgId", org_login(installation)},
          {"status", "active"},
          {"resources", resources}};
}

// ---- delivery ids ----

std::optional<DataModel::DeliveryOwner> DataModel::classify_delivery(
    std::string_view delivery_id) const {
  std::string_view rest = delivery_id;
  int64_t installation = 0;
  if (!consume(&rest, "backfill-inst-") || !consume_number(&rest, &installation) ||
      !consume(&rest, "-")) {
    return std::nullopt;
  }
  if (installation < 1 || installation > config_.installations) return std::nullopt;
  if (rest.substr(0, 4) == "prj_") return classify_vercel(static_cast<int>(installation), rest);
  return classify_github(static_cast<int>(installation), rest);
}

// `rest` is "{repoId}-pr-{number}", "{repoId}-issue-{number}" or "{repoId}-release-{id}".
std::optional<DataModel::DeliveryOwner> DataModel::classify_github(int installation,
                                                                   std::string_view rest) const {
  int64_t repo_id = 0;
  int64_t number = 0;
  if (!consume_number(&rest, &repo_id) || !consume(&rest, "-")) return std::nullopt;
  auto repo = find_repo(repo_id);
  if (!repo || repo->installation != installation) return std::nullopt;
  bool valid = false;
  if (consume(&rest, "pr-")) {
    valid = consume_number(&rest, &number) && number >= 1 && number <= config_.items;
  } else if (consume(&rest, "issue-")) {
    if (consume_number(&rest, &number)) {
      const int64_t position = issue_number(0) - number;
      valid = position >= 0 && position < list_size(GithubList::kIssues) &&
              !is_pull_request_entry(position);
    }
  } else if (consume(&rest, "release-")) {
    valid = consume_number(&rest, &number) && number / kReleaseIdFactor == repo_id &&
            number % kReleaseIdFactor >= 1 && number % kReleaseIdFactor <= config_.items;
  }
  if (!valid || !rest.empty()) return std::nullopt;
  return DeliveryOwner{installation, Provider::kGithub};
}

// `rest` is "prj_{i}_{p}-deploy-{uid}".
std::optional<DataModel::DeliveryOwner> DataModel::classify_vercel(int installation,
                                                                   std::string_view rest) const {
  const size_t separator = rest.find("-deploy-");
  if (separator == std::string_view::npos) return std::nullopt;
  auto project = find_project(installation, rest.substr(0, separator));
  if (!project || project->installation != installation) return std::nullopt;
  std::string_view uid = rest.substr(separator + 8);
  uint64_t mixed = 0;
  if (!consume(&uid, "dpl_") || !parse_base62_fixed11(uid.substr(0, 11), &mixed)) {
    return std::nullopt;
  }
  const uint64_t key = unmix64(mixed) ^ uid_mask_;
  const auto position = static_cast<int64_t>(key & 0xffffffffULL);
  if ((key >> 32) != (deployment_key(*project, 0) >> 32) || position >= config_.items) {
    return std::nullopt;
  }
  if (rest.substr(separator + 8) != deployment_uid(*project, position)) return std::nullopt;
  return DeliveryOwner{installation, Provider::kVercel};
}

int64_t DataModel::expected_count(int installation, Provider provider) const {
  if (installation < 1 || installation > config_.installations) return 0;
  if (provider == Provider::kGithub) return int64_t{repos_of(installation)} * 3 * config_.items;
  return int64_t{config_.projects} * config_.items;
}

void DataModel::for_each_expected(
    int installation, const std::function<void(const std::string&, Provider)>& visit) const {
  const std::string prefix = "backfill-" + installation_id(installation) + "-";
  for (int r = 1; r <= repos_of(installation); ++r) {
    const RepoRef repo{installation, r, int64_t{installation} * kRepoIdFactor + r};
    const std::string repo_prefix = prefix + std::to_string(repo.id);
    for (int64_t position = 0; position < config_.items; ++position) {
      visit(repo_prefix + "-pr-" + std::to_string(config_.items - position), Provider::kGithub);
    }
    for (int64_t position = 0; position < list_size(GithubList::kIssues); ++position) {
      if (is_pull_request_entry(position)) continue;
      visit(repo_prefix + "-issue-" + std::to_string(issue_number(position)), Provider::kGithub);
    }
    for (int64_t position = 0; position < config_.items; ++position) {
      const int64_t id = repo.id * kReleaseIdFactor + config_.items - position;
      visit(repo_prefix + "-release-" + std::to_string(id), Provider::kGithub);
    }
  }
  for (int p = 1; p <= config_.projects; ++p) {
    const ProjectRef project{installation, p};
    const std::string project_prefix = prefix + project_id(project) + "-deploy-";
    for (int64_t position = 0; position < config_.items; ++position) {
      visit(project_prefix + deployment_uid(project, position), Provider::kVercel);
    }
  }
}

}  // namespace backhaul::sandbox
