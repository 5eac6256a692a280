#include "github_connector.h"

#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "backhaul/json_depth.hpp"

#include "events.h"
#include "iso8601.h"
#include "link_header.h"
#include "url.h"

namespace backhaul::github {
namespace {

using nlohmann::json;

// The smallest page asked for when GitHub cannot answer a larger one in time (100, 50, 25, 12).
constexpr int64_t kMinPerPage = 10;

enum class EntityKind { kPullRequest = 1, kIssue, kRelease };

EntityKind parse_entity_kind(std::string_view entity_type) {
  if (entity_type == "pull_request") return EntityKind::kPullRequest;
  if (entity_type == "issue") return EntityKind::kIssue;
  if (entity_type == "release") return EntityKind::kRelease;
  throw sdk::Error(BACKHAUL_INVALID_ARGUMENT, "github: unknown entity type \"" +
                                                  std::string(entity_type) +
                                                  "\" (expected pull_request, issue or release)");
}

RepositoryName require_repository(const sdk::Unit& unit) {
  if (!unit.resource_name || unit.resource_name->empty()) {
    throw sdk::Error(BACKHAUL_INVALID_ARGUMENT,
                     "github: the work unit has no resource name; GitHub needs \"owner/repo\"");
  }
  std::optional<RepositoryName> name = parse_repository_name(*unit.resource_name);
  if (!name) {
    throw sdk::Error(BACKHAUL_INVALID_ARGUMENT, "github: resource name \"" +
                                                    std::string(*unit.resource_name) +
                                                    "\" is not of the form \"owner/repo\"");
  }
  return std::move(*name);
}

// "{base}/repos/{owner}/{repo}", segments percent-encoded.
std::string repository_url(const Config& config, const RepositoryName& name) {
  return config.base_url + "/repos/" + percent_encode(name.owner) + "/" + percent_encode(name.repo);
}

// A resource id that is a repository's number ("1296269"), not a node id ("R_kgDOH").
bool is_repository_number(std::string_view resource_id) {
  return !resource_id.empty() &&
         resource_id.find_first_not_of("0123456789") == std::string_view::npos;
}

// The unit's repository for its lists: by number when the resource id is one, else by name. A
// name can change hands (a repository renamed, its old name taken by a new one), and a list asked
// for by it would then be another repository's, its items delivered with this unit's id; the
// number never does, and GitHub's next links use it already.
std::string list_base_url(const Config& config, const RepositoryName& name,
                          std::string_view resource_id) {
  if (is_repository_number(resource_id)) {
    return config.base_url + "/repositories/" + std::string(resource_id);
  }
  return repository_url(config, name);
}

// Pull requests and issues come most recently updated first, so `since` can stop the walk
// (pulls have no `since` parameter); releases take no parameters at all, and are all walked.
std::string first_page_url(const Config& config, EntityKind kind, const RepositoryName& name,
                           std::string_view resource_id, int64_t since_ms) {
  const std::string repo = list_base_url(config, name, resource_id);
  const std::string per_page = "per_page=" + std::to_string(config.per_page);
  switch (kind) {
    case EntityKind::kPullRequest:
      return repo + "/pulls?state=all&sort=updated&direction=desc&" + per_page;
    case EntityKind::kIssue: {
      std::string url = repo + "/issues?state=all&sort=updated&direction=desc&" + per_page;
      if (since_ms > 0) url += "&since=" + format_iso8601(since_ms);
      return url;
    }
    case EntityKind::kRelease:
      return repo + "/releases?" + per_page;
  }
  throw sdk::Error(BACKHAUL_INVALID_ARGUMENT, "github: unhandled entity kind");
}

bool has_whitespace_or_control(std::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7F) return true;
  }
  return false;
}

// The last path segment of a kind's list: /repos/{owner}/{repo}/{segment}.
std::string_view list_segment(EntityKind kind) {
  switch (kind) {
    case EntityKind::kPullRequest:
      return "pulls";
    case EntityKind::kIssue:
      return "issues";
    case EntityKind::kRelease:
      return "releases";
  }
  return "";
}

// The pages a cursor may name: the unit's list, by the repository's name (ours, and older GitHub
// links) or by its id (GitHub's next links: /repositories/{id}/issues?page=2), compared ignoring
// case as GitHub does. A unit whose resource id is not the repository's number (a node id,
// "R_kgDOH") takes any number there: its list by id is {base}/repositories/{digits}/{list}.
struct UnitList {
  std::string by_name;
  std::string by_id;         // the whole path; or, with any_id, its part before the number
  std::string list_segment;  // "/pulls"
  bool any_id = false;
};

UnitList unit_list(const Config& config, EntityKind kind, const RepositoryName& name,
                   std::string_view repository_id) {
  const std::string base(url_path(config.base_url));
  const std::string segment = "/" + std::string(list_segment(kind));
  UnitList list;
  list.by_name =
      base + "/repos/" + percent_encode(name.owner) + "/" + percent_encode(name.repo) + segment;
  list.list_segment = segment;
  list.any_id = !is_repository_number(repository_id);
  list.by_id = base + "/repositories/" + (list.any_id ? "" : std::string(repository_id) + segment);
  return list;
}

// Why `url` must not be fetched with the token, or "". The request carries the token, so a URL
// must be a page of the unit's list on base_url's origin: not another host, nor another
// repository's list or any other path of the same host, whose items would be delivered as this
// unit's.
std::string off_the_list(std::string_view url, const Config& config, const UnitList& list) {
  const std::optional<std::string> origin = http_origin(url);
  if (!origin || has_whitespace_or_control(url)) return "is not an absolute http(s) URL";
  if (*origin != http_origin(config.base_url)) {
    return "is on " + *origin + ", not on base_url " + config.base_url;
  }
  const std::string_view path = url_path(url);
  if (iequals(path, list.by_name)) return "";
  if (!list.any_id && iequals(path, list.by_id)) return "";
  if (list.any_id && path.size() > list.by_id.size() + list.list_segment.size() &&
      iequals(path.substr(0, list.by_id.size()), list.by_id) &&
      iequals(path.substr(path.size() - list.list_segment.size()), list.list_segment)) {
    const std::string_view id =
        path.substr(list.by_id.size(), path.size() - list.by_id.size() - list.list_segment.size());
    if (id.find_first_not_of("0123456789") == std::string_view::npos) return "";
  }
  return "is not a page of this unit's list (" + list.by_name + " or " + list.by_id +
         (list.any_id ? "{id}" + list.list_segment : "") + ")";
}

// A cursor is a next URL this connector returned earlier: one pointing elsewhere (a corrupted or
// tampered checkpoint, a config moved to another GitHub, a mistyped --cursor) is never followed.
std::string checked_cursor(std::string_view cursor, const Config& config, const UnitList& list) {
  if (const std::string problem = off_the_list(cursor, config, list); !problem.empty()) {
    throw sdk::Error(BACKHAUL_INVALID_ARGUMENT,
                     "github: cursor \"" + std::string(cursor.substr(0, 200)) + "\" " + problem);
  }
  return std::string(cursor);
}

// The rel="next" URL of a response, verbatim (GitHub docs: never construct page URLs; it may move
// from /repos/{owner}/{repo}/... to /repositories/{id}/...). nullopt on the last page. One the
// next call would refuse as its cursor is FATAL now, before it is saved as the checkpoint.
// Every link header counts: several lines are one comma-separated list (RFC 9110 5.3), and the
// host hands them over one by one.
std::optional<std::string> next_cursor(const sdk::HttpResponse& response, const Config& config,
                                       const UnitList& list) {
  std::optional<std::string_view> next;
  for (const std::string_view link : response.headers("link")) {
    if ((next = find_link(link, "next"))) break;
  }
  if (!next) return std::nullopt;
  if (const std::string problem = off_the_list(*next, config, list); !problem.empty()) {
    throw sdk::Error(BACKHAUL_FATAL, "github: rel=\"next\" link \"" +
                                         std::string(next->substr(0, 200)) + "\" " + problem);
  }
  return std::string(*next);
}

// Which element of a top-level array the parser was in when `body` stopped parsing: the index
// of the last one begun if it is an object or array not yet closed, else of the next one.
size_t failing_item_index(std::string_view body) {
  size_t begun = 0;
  bool open = false;
  const json::parser_callback_t count = [&](int depth, json::parse_event_t event, json&) {
    if (depth != 1) return true;  // 0: the array itself; 2 and deeper: inside an element
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        ++begun;
        open = true;
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        open = false;
        break;
      case json::parse_event_t::value:  // a string, number, ... element, once it is read
        ++begun;
        break;
      case json::parse_event_t::key:
        break;
    }
    return true;
  };
  const json discarded =
      json::parse(body.data(), body.data() + body.size(), count, /*allow_exceptions=*/false);
  return open ? begun - 1 : begun;
}

// The page body as a JSON array of objects. What another attempt may mend is RETRYABLE: a body
// cut short (the parser ran out of input: the transfer's fault) or garbled, or of another shape
// than an array (an error page from a proxy in front of GitHub). What it cannot is FATAL: a page
// GitHub would send again as it is, with an item that is not an object, or with a lone surrogate
// escape ("\ud83d", a text cut inside an emoji) that the parser refuses. Retrying those burnt
// every attempt of the unit.
json parse_array(std::string_view body, std::string_view url) {
  if (sdk::json_depth(body) > sdk::kMaxJsonDepth) {
    throw sdk::Error(BACKHAUL_RETRYABLE, "github: malformed JSON from GET " + std::string(url) +
                                             ": nested more than " +
                                             std::to_string(sdk::kMaxJsonDepth) + " levels deep");
  }
  json items;
  try {
    items = json::parse(body.data(), body.data() + body.size());
  } catch (const json::parse_error& e) {
    // e.byte is past the end of the body when the parser ran out of input, wherever the cut.
    const bool cut_short = e.byte > body.size();
    if (!cut_short && std::string_view(e.what()).find("surrogate") != std::string_view::npos) {
      throw sdk::Error(BACKHAUL_FATAL, "github: item " + std::to_string(failing_item_index(body)) +
                                           " of the page from GET " + std::string(url) +
                                           " has a lone surrogate escape in a string: " + e.what());
    }
    throw sdk::Error(BACKHAUL_RETRYABLE,
                     "github: malformed JSON from GET " + std::string(url) + ": " + e.what());
  }
  if (!items.is_array()) {
    throw sdk::Error(BACKHAUL_RETRYABLE, "github: expected a JSON array from GET " +
                                             std::string(url) + ", got " + items.type_name());
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_object()) {
      throw sdk::Error(BACKHAUL_FATAL, "github: item " + std::to_string(i) +
                                           " of the page from GET " + std::string(url) + " is a " +
                                           items[i].type_name() + ", not an object");
    }
  }
  return items;
}

// Milliseconds of a timestamp field, or nullopt when it is absent, null or unparseable.
std::optional<int64_t> timestamp(const json& item, const char* key) {
  const auto it = item.find(key);
  if (it == item.end() || !it->is_string()) return std::nullopt;
  return parse_iso8601(it->get_ref<const std::string&>());
}

// What the page contributes and whether `since` ends the walk here.
struct Filtered {
  std::vector<sdk::Event> events;
  bool reached_since = false;
};

// Sorted by updated_at descending: the first item older than `since` ends the walk. Items
// without a usable updated_at are kept (never silently dropped).
Filtered pull_requests(json& items, const EventBuilder& builder, int64_t since_ms) {
  Filtered out;
  out.events.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const std::optional<int64_t> updated = timestamp(items[i], "updated_at");
    if (since_ms > 0 && updated && *updated < since_ms) {
      out.reached_since = true;
      continue;
    }
    out.events.push_back(builder.pull_request(std::move(items[i]), i));
  }
  return out;
}

// GitHub filters by `since` itself; items with a "pull_request" key are pull requests (they come
// through the pull_request entity type, with their PR numbers' delivery ids).
Filtered issues(json& items, const EventBuilder& builder) {
  Filtered out;
  out.events.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].contains("pull_request")) continue;
    out.events.push_back(builder.issue(std::move(items[i]), i));
  }
  return out;
}

// A release's date is when it was published (a draft's: when created); older ones are dropped.
// The list is in `created_at` order, the date of the tag's commit (GitHub's docs), not of the
// publishing: a release published today from an old commit (a patch of a maintenance branch)
// comes after pages of older ones. So no page ends the walk before the last: releases are few.
Filtered releases(json& items, const EventBuilder& builder, int64_t since_ms) {
  Filtered out;
  out.events.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    std::optional<int64_t> date = timestamp(items[i], "published_at");
    if (!date) date = timestamp(items[i], "created_at");
    if (since_ms > 0 && date && *date < since_ms) continue;
    out.events.push_back(builder.release(std::move(items[i]), i));
  }
  return out;
}

Filtered filter(EntityKind kind, json& items, const EventBuilder& builder, int64_t since_ms) {
  switch (kind) {
    case EntityKind::kPullRequest:
      return pull_requests(items, builder, since_ms);
    case EntityKind::kIssue:
      return issues(items, builder);
    case EntityKind::kRelease:
      return releases(items, builder, since_ms);
  }
  return {};
}

// GitHub timestamps have one-second resolution: compare at that resolution, so that the
// pull-request and release filters agree with the issues endpoint's `since` (inclusive).
int64_t since_floor_seconds_ms(int64_t since_unix_ms) {
  return since_unix_ms > 0 ? since_unix_ms - since_unix_ms % 1000 : 0;
}

// One page. Pages are numbered, so an item updated during a walk can move to a page already
// fetched and be missed; its update also produced a real webhook, which is why that is
// acceptable. Items can equally be seen twice; their delivery ids make that harmless.
sdk::Page fetch(const Config& config, const GithubClient& client, HeavyLists& heavy,
                const sdk::FetchRequest& request) {
  const EntityKind kind = parse_entity_kind(request.entity_type);
  const RepositoryName name = require_repository(request.unit);
  if (request.unit.resource_id.empty()) {
    throw sdk::Error(BACKHAUL_INVALID_ARGUMENT,
                     "github: the work unit has no resource id (the repository id)");
  }
  const int64_t since_ms = since_floor_seconds_ms(request.since_unix_ms);
  const UnitList list = unit_list(config, kind, name, request.unit.resource_id);
  const std::string asked =
      request.cursor ? checked_cursor(*request.cursor, config, list)
                     : first_page_url(config, kind, name, request.unit.resource_id, since_ms);
  // GitHub ends a request it cannot answer within 10 s with a 502 or 504, and asks for a smaller
  // per_page (API-FACTS A1). A list of heavy items (pull requests with long bodies) failed so on
  // every attempt, until its unit was dead. Each such failure is still this call's RETRYABLE
  // error (the host retries the page, and counts the failure); when it was the list's first page,
  // the next call asks for half as many items, down to kMinPerPage, and the walk goes on at that
  // size, as GitHub's next links carry it. (A later page keeps its size: see half_first_page.)
  // The size that worked is where the list's walks begin for a day (HeavyLists).
  const std::string list_path(url_path(asked));
  const int64_t now_ms = sdk::Host::now_ms();
  const int halvings = heavy.halvings(list_path, now_ms);
  std::string url = asked;
  for (int i = 0; i < halvings; ++i) {
    std::optional<std::string> smaller = half_first_page(url, kMinPerPage);
    if (!smaller) break;
    url = std::move(*smaller);
  }

  // A repository whose issues are turned off answers its issues list 410 ("Issues are disabled
  // for this repo"): no issues, not a unit that fails for good on every backfill (forks and
  // mirrors often have them off). Every other 410 is FATAL.
  const bool issues = kind == EntityKind::kIssue;
  const std::string_view token = request.unit.access_token;
  const sdk::HttpResponse response = client.get(url, token, {issues ? 410 : 0, 502, 504});
  if (response.status() == 502 || response.status() == 504) {
    sdk::Error error = error_for_response(response, "GET " + url, sdk::Host::now_ms(), token);
    if (const std::optional<std::string> smaller = half_first_page(url, kMinPerPage)) {
      heavy.failed(list_path, halvings + 1, now_ms);
      throw sdk::Error(error.status(),
                       std::string(error.what()) + " (too heavy to answer in time? the next try " +
                           "asks for " + *smaller + ")",
                       error.retry_after_ms());
    }
    throw error;
  }
  sdk::Page page;
  page.rate_limit = rate_limit_of(
      response, sdk::Host::now_ms());  // of every answer, a 410 too: it cost a request
  if (response.status() == 410) return page;
  if (response.status() == 204) return page;  // "No Content": an empty last page

  json items = parse_array(response.body(), url);
  page.raw_count = items.size();
  const EventBuilder builder(request.unit.installation_id, request.unit.resource_id, name);
  Filtered filtered;
  try {
    filtered = filter(kind, items, builder, since_ms);
  } catch (const sdk::Error& e) {  // an item's: which page it is on
    throw sdk::Error(e.status(), std::string(e.what()) + " (GET " + url + ")", e.retry_after_ms());
  }
  page.events = std::move(filtered.events);
  if (!filtered.reached_since) page.next_cursor = next_cursor(response, config, list);
  return page;
}

// Runs `fn`, translating everything it throws into sdk::Error with the token scrubbed from the
// message (belt and braces: no message is built from the token, but a host or server message
// could echo it).
template <class Fn>
auto guarded(std::string_view token, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const sdk::Error& e) {
    throw sdk::Error(e.status(), sdk::redact_secret(e.what(), token), e.retry_after_ms());
  } catch (const sdk::HostError& e) {
    throw sdk::Error(e.status(), sdk::redact_secret(std::string("github: ") + e.what(), token));
  } catch (const json::exception& e) {
    // A field of an unexpected type somewhere in a response.
    throw sdk::Error(
        BACKHAUL_RETRYABLE,
        sdk::redact_secret(std::string("github: unexpected response: ") + e.what(), token));
  }
}

// Whether the repository's "id" is `resource_id`, when both are numbers; true when either is not
// (a node id as the resource id, or an answer without an id: nothing to compare).
bool same_repository(const json& repo, std::string_view resource_id) {
  const auto id = repo.find("id");
  if (!is_repository_number(resource_id) || id == repo.end() || !id->is_number_integer()) {
    return true;
  }
  uint64_t unit_id = 0;
  const auto [end, ec] =
      std::from_chars(resource_id.data(), resource_id.data() + resource_id.size(), unit_id);
  return ec == std::errc() && end == resource_id.data() + resource_id.size() &&
         id->is_number_unsigned() && id->get<uint64_t>() == unit_id;
}

// The answer to GET /repos/{owner}/{repo}. GitHub answers 404, not 403, for a private repository
// the token cannot see, so 404 gets a message that says both. A repository under the unit's name
// whose id is not the unit's is another one: the unit's was renamed or transferred and its old
// name taken since, and its lists by name would deliver that one's items as the unit's.
void check_repository_readable(const sdk::HttpResponse& response, const RepositoryName& name,
                               std::string_view resource_id, const std::string& url,
                               std::string_view token) {
  const std::string full_name = name.owner + "/" + name.repo;
  const int status = response.status();
  if (status == 404) {
    throw sdk::Error(BACKHAUL_FATAL, "github: repository " + full_name +
                                         " not found or not readable with this token" +
                                         " (HTTP 404 for GET " + url + ")");
  }
  if (status < 200 || status >= 300) {
    throw error_for_response(response, "GET " + url, sdk::Host::now_ms(), token);
  }
  if (status != 200) return;

  const std::string_view body = response.body();
  const json repo = sdk::json_depth(body) > sdk::kMaxJsonDepth
                        ? json()
                        : json::parse(body.data(), body.data() + body.size(), nullptr,
                                      /*allow_exceptions=*/false);
  if (!repo.is_object()) {
    throw sdk::Error(BACKHAUL_RETRYABLE, "github: expected a JSON object from GET " + url);
  }
  if (!same_repository(repo, resource_id)) {
    throw sdk::Error(BACKHAUL_FATAL, "github: repository " + full_name + " has id " +
                                         repo["id"].dump() + ", not the unit's resource id " +
                                         std::string(resource_id) +
                                         " (renamed or transferred, and the name taken by "
                                         "another repository?)");
  }
  // Present for authenticated requests; "pull" is the read permission.
  const auto permissions = repo.find("permissions");
  if (permissions == repo.end() || !permissions->is_object()) return;
  const auto pull = permissions->find("pull");
  if (pull != permissions->end() && pull->is_boolean() && !pull->get<bool>()) {
    throw sdk::Error(BACKHAUL_FATAL, "github: the token cannot read repository " + full_name +
                                         " (permissions.pull is false)");
  }
}

}  // namespace

int HeavyLists::halvings(const std::string& list_path, int64_t now_ms) {
  std::lock_guard lock(mutex_);
  const auto it = lists_.find(list_path);
  if (it == lists_.end()) return 0;
  if (now_ms < it->second.until_ms) return it->second.halvings;
  lists_.erase(it);
  return 0;
}

void HeavyLists::failed(const std::string& list_path, int halvings, int64_t now_ms) {
  std::lock_guard lock(mutex_);
  if (lists_.size() >= kMaxLists && !lists_.count(list_path)) lists_.clear();
  lists_[list_path] = {halvings, now_ms + kRememberMs};
}

void GithubConnector::validate_config(std::string_view config_json) { parse_config(config_json); }

GithubConnector::GithubConnector(std::string_view config_json)
    : config_(parse_config(config_json)) {}

void GithubConnector::validate_scopes(const sdk::Unit& unit) {
  guarded(unit.access_token, [&] {
    const RepositoryName name = require_repository(unit);
    const std::string url = repository_url(config_, name);
    check_repository_readable(client_.send(url, unit.access_token), name, unit.resource_id, url,
                              unit.access_token);
  });
}

sdk::Page GithubConnector::fetch_page(const sdk::FetchRequest& request) {
  return guarded(request.unit.access_token,
                 [&] { return fetch(config_, client_, heavy_, request); });
}

}  // namespace backhaul::github
