// The fake GitHub REST API under /github: repositories and their pulls, issues and releases,
// with GitHub's pagination links, rate-limit headers, error bodies and auth rules
// (API-FACTS.md part A).
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <string>

#include "host/sandbox/apis.h"
#include "host/sandbox/rng.h"

namespace backhaul::sandbox {
namespace {

using nlohmann::json;

constexpr std::string_view kDocs = "https://docs.github.com/rest";
constexpr std::string_view kRepoDocs = "https://docs.github.com/rest/repos/repos#get-a-repository";
constexpr std::string_view kRateDocs =
    "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api";
constexpr std::string_view kSecondaryRateDocs =
    "https://docs.github.com/free-pro-team@latest/rest/overview/"
    "rate-limits-for-the-rest-api#about-secondary-rate-limits";
constexpr int64_t kDefaultPerPage = 30;

Response github_error(int status, const std::string& message, std::string_view documentation_url) {
  return json_response(status, {{"message", message},
                                {"documentation_url", documentation_url},
                                {"status", std::to_string(status)}});
}

Response not_found(std::string_view documentation_url = kDocs) {
  return github_error(404, "Not Found", documentation_url);
}

// GitHub answers a request without User-Agent from its edge, in plain text.
Response missing_user_agent() {
  Response response;
  response.status = 403;
  response.content_type = "text/plain; charset=utf-8";
  response.body =
      "Request forbidden by administrative rules. Please make sure your request has a User-Agent "
      "header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-"
      "required). Check https://developer.github.com for other possible causes.\n";
  return response;
}

// The credentials of "Authorization: Bearer <t>" or "Authorization: token <t>"; empty otherwise.
std::string_view github_token(const Request& request) {
  const std::string* header = request.header("authorization");
  if (!header) return {};
  std::string_view value = *header;
  const size_t space = value.find(' ');
  if (space == std::string_view::npos) return {};
  std::string scheme(value.substr(0, space));
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (scheme != "bearer" && scheme != "token") return {};
  value.remove_prefix(space + 1);
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  return value;
}

void add_github_headers(Response& response, const RateSnapshot& rate) {
  static std::atomic<uint64_t> request_sequence{0};
  const uint64_t id = hash64({request_sequence.fetch_add(1)});
  char request_id[48];
  std::snprintf(request_id, sizeof request_id, "%04X:%06X:%05X:%05X:%08X", unsigned(id & 0xffff),
                unsigned((id >> 16) & 0xffffff), unsigned((id >> 40) & 0xfffff),
                unsigned(id & 0xfffff), unsigned(id >> 32));
  response.add_header("x-ratelimit-limit", std::to_string(rate.limit));
  response.add_header("x-ratelimit-remaining", std::to_string(rate.remaining));
  response.add_header("x-ratelimit-reset", std::to_string(rate.reset_s));
  response.add_header("x-ratelimit-used", std::to_string(rate.used));
  response.add_header("x-ratelimit-resource", "core");
  response.add_header("x-github-api-version-selected", "2022-11-28");
  response.add_header("x-github-media-type", "github.v3; format=json");
  response.add_header("x-github-request-id", request_id);
}

std::string weak_etag(const std::string& body) {
  const uint64_t h = hash64({fnv1a(body), body.size()});
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "W/\"%016llx\"", static_cast<unsigned long long>(h));
  return buffer;
}

// A contiguous range of list positions [begin, end), newest first.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
};

// The first position in [begin, end) whose updated_at is before `since_ms` (updated_at never
// increases along positions).
int64_t first_updated_before(const Context& context, RepoRef repo, GithubList list, Range range,
                             int64_t since_ms) {
  int64_t low = range.begin;
  int64_t high = range.end;
  while (low < high) {
    const int64_t mid = low + (high - low) / 2;
    if (context.data.updated_ms(repo, list, mid) >= since_ms) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return low;
}

Response validation_failed(std::string_view resource, std::string_view field) {
  return json_response(
      422, {{"message", "Validation Failed"},
            {"errors", {{{"resource", resource}, {"field", field}, {"code", "invalid"}}}},
            {"documentation_url", kDocs},
            {"status", "422"}});
}

// Applies state= (pulls, issues) and since= (issues) to the list. Returns the error to send for
// an invalid value.
std::optional<Response> select(const Context& context, const Request& request, RepoRef repo,
                               GithubList list, Range* range) {
  *range = {0, context.data.list_size(list)};
  if (list == GithubList::kReleases) return std::nullopt;
  const char* resource = list == GithubList::kPulls ? "PullRequest" : "Issue";
  const std::string state = request.query.get("state").value_or("open");
  const int64_t open = context.data.open_count(list);
  if (state == "open") {
    range->end = open;
  } else if (state == "closed") {
    range->begin = open;
  } else if (state != "all") {
    return validation_failed(resource, "state");
  }
  if (list != GithubList::kIssues) return std::nullopt;
  if (auto since = request.query.get("since")) {
    auto since_ms = parse_iso8601(*since);
    if (!since_ms) return validation_failed(resource, "since");
    range->end = first_updated_before(context, repo, list, *range, *since_ms);
  }
  return std::nullopt;
}

// Oldest first? Pulls default to desc for sort=created (the default) and to asc for any other
// sort, issues always to desc. Every supported sort key orders positions the same way.
bool ascending(const Request& request, GithubList list) {
  if (auto direction = request.query.get("direction")) return *direction == "asc";
  if (list != GithubList::kPulls) return false;
  const std::string sort = request.query.get("sort").value_or("created");
  return sort != "created";
}

// GitHub's link header: prev, next, last, first as they apply; empty for a single page.
std::string link_header(const std::string& list_url, const Query& query, int64_t page,
                        int64_t last_page) {
  const std::string carried = query.raw_without("page");
  const std::string prefix = list_url + "?" + (carried.empty() ? "" : carried + "&") + "page=";
  std::string link;
  auto add = [&](int64_t target, std::string_view rel) {
    if (!link.empty()) link += ", ";
    link += "<" + prefix + std::to_string(target) + ">; rel=\"" + std::string(rel) + "\"";
  };
  if (page > 1) add(std::min(page - 1, last_page), "prev");  // past the end: back to the last
  if (page < last_page) {
    add(page + 1, "next");
    add(last_page, "last");
  }
  if (page > 1) add(1, "first");
  return link;
}

int64_t query_int(const Request& request, const char* key, int64_t fallback) {
  auto text = request.query.get(key);
  auto value = text ? parse_int(*text) : std::nullopt;
  return value && *value >= 1 ? *value : fallback;
}

Response list_items(const Context& context, const Request& request, RepoRef repo, GithubList list,
                    std::string_view list_name) {
  Range range;
  if (auto error = select(context, request, repo, list, &range)) return *error;
  const int64_t per_page = std::min<int64_t>(query_int(request, "per_page", kDefaultPerPage),
                                             context.options.max_per_page);
  const int64_t page = query_int(request, "page", 1);
  const int64_t total = std::max<int64_t>(0, range.end - range.begin);
  const int64_t last_page = std::max<int64_t>(1, (total + per_page - 1) / per_page);
  const bool oldest_first = ascending(request, list);

  Response response;
  response.body = "[";
  const int64_t offset = page <= last_page ? (page - 1) * per_page : total;
  const int64_t count = std::min(per_page, total - offset);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t position = oldest_first ? range.end - 1 - offset - k : range.begin + offset + k;
    if (k > 0) response.body += ',';
    response.body += context.data.item_json(repo, list, position).dump();
  }
  response.body += "]";

  const std::string list_url = context.base_url + "/github/repositories/" +
                               std::to_string(repo.id) + "/" + std::string(list_name);
  std::string link = link_header(list_url, request.query, page, last_page);
  if (!link.empty()) response.add_header("link", std::move(link));
  return response;
}

// Repositories the token's installation can access (GET /installation/repositories).
// A route under /repos/{owner}/{repo} or /repositories/{id}: whether it has that shape, the
// repository it names (if any) and the rest of the route after it.
struct RepoRoute {
  bool known = false;
  std::optional<RepoRef> repo;
  Route rest;
};

RepoRoute repo_route(const Context& context, Route route) {
  RepoRoute r;
  if (route.size() >= 3 && route[0] == "repos") {
    r = {true, context.data.find_repo(route[1], route[2]), route.subspan(3)};
  } else if (route.size() >= 2 && route[0] == "repositories") {
    r = {true, std::nullopt, route.subspan(2)};
    if (auto id = parse_int(route[1])) r.repo = context.data.find_repo(*id);
  }
  return r;
}

Response installation_repositories(const Context& context, int installation) {
  json repositories = json::array();
  for (int r = 1; r <= context.data.repos_of(installation); ++r) {
    repositories.push_back(
        context.data.repo_json(*context.data.find_repo(int64_t{installation} * 100'000 + r)));
  }
  return json_response(200, {{"total_count", repositories.size()},
                             {"repository_selection", "selected"},
                             {"repositories", repositories}});
}

// Routes a request whose token is valid for `installation`.
Response dispatch(const Context& context, const Request& request, Route route, int installation) {
  if (request.method != "GET" && request.method != "HEAD") return not_found();
  if (route.size() == 2 && route[0] == "installation" && route[1] == "repositories") {
    return installation_repositories(context, installation);
  }
  auto [known, repo, rest] = repo_route(context, route);
  if (!known) return not_found();
  // Another installation's repository is as invisible as a missing one (404, not 403).
  if (!repo || repo->installation != installation) return not_found(kRepoDocs);
  if (rest.empty()) return json_response(200, context.data.repo_json(*repo));
  if (rest.size() == 1) {
    if (rest[0] == "pulls") return list_items(context, request, *repo, GithubList::kPulls, rest[0]);
    if (rest[0] == "issues") {
      return list_items(context, request, *repo, GithubList::kIssues, rest[0]);
    }
    if (rest[0] == "releases") {
      return list_items(context, request, *repo, GithubList::kReleases, rest[0]);
    }
  }
  return not_found();
}

// The repository and list a request is about (for resource faults and per-resource counts), when
// it names a repository of `installation`.
std::optional<Target> target_of(const Context& context, Route route, int installation) {
  auto [known, repo, rest] = repo_route(context, route);
  if (!repo || repo->installation != installation || rest.size() > 1) return std::nullopt;
  return Target{installation,
                DataModel::org_login(installation) + "/" + DataModel::repo_name(repo->repo),
                std::to_string(repo->id), rest.empty() ? "repository" : std::string(rest[0])};
}

std::string_view reason(int status) {
  switch (status) {
    case 401:
      return "Bad credentials";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 422:
      return "Validation Failed";
    case 502:
      return "Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return status < 500 ? "Client Error" : "Server Error";
  }
}

// The answer for an admitted request, before the common headers.
Response answer(const Context& context, const Request& request, Route path,
                const Admission& admission) {
  switch (admission.verdict) {
    case Verdict::kBadToken:
      return github_error(401, "Bad credentials", kDocs);
    case Verdict::kRateLimited:
      return github_error(403,
                          "API rate limit exceeded for installation ID " +
                              std::to_string(admission.installation) + ".",
                          kRateDocs);
    case Verdict::kBurst429: {
      Response response = github_error(
          429,
          "You have exceeded a secondary rate limit. Please wait a few minutes before you try "
          "again.",
          kSecondaryRateDocs);
      response.add_header("retry-after", std::to_string(admission.retry_after_s));
      return response;
    }
    case Verdict::kServerError:
      return github_error(
          admission.server_error_status,
          admission.server_error_status == 502 ? "Server Error" : "Service Unavailable", kDocs);
    case Verdict::kOk:
      break;
  }
  if (auto target = target_of(context, path, admission.installation)) {
    if (target->list != "repository") {  // a list: pulls, issues, releases
      target->per_page = std::min<int64_t>(query_int(request, "per_page", kDefaultPerPage),
                                           context.options.max_per_page);
    }
    if (const int status = context.state.visit(Provider::kGithub, *target)) {
      return github_error(status, std::string(reason(status)), kDocs);
    }
  }
  Response response = dispatch(context, request, path, admission.installation);
  if (response.status != 200) return response;
  std::string etag = weak_etag(response.body);
  const std::string* if_none_match = request.header("if-none-match");
  if (if_none_match && *if_none_match == etag) {
    // A conditional hit does not count against the rate limit.
    context.state.refund(Provider::kGithub, admission.installation);
    response.status = 304;
    response.body.clear();
  }
  response.add_header("etag", std::move(etag));
  response.add_header("cache-control", "private, max-age=60, s-maxage=60");
  return response;
}

}  // namespace

Response handle_github(const Context& context, const Request& request, Route route) {
  const std::string* user_agent = request.header("user-agent");
  if (!user_agent || user_agent->empty()) return missing_user_agent();
  const Admission admission = context.state.admit(Provider::kGithub, github_token(request));
  sleep_ms(admission.slow_ms);
  Response response = answer(context, request, route, admission);
  RateSnapshot rate = admission.rate;
  if (response.status == 304) rate = {rate.limit, rate.remaining + 1, rate.used - 1, rate.reset_s};
  add_github_headers(response, rate);
  return response;
}

}  // namespace backhaul::sandbox
