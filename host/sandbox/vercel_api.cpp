// The fake Vercel REST API under /vercel: GET /v6/deployments with the until/since timestamp
// cursor, GET /v9/projects/{idOrName}, Vercel's error envelope and X-RateLimit-* headers
// (API-FACTS.md part B).
#include <algorithm>
#include <string>

#include "host/sandbox/apis.h"

namespace backhaul::sandbox {
namespace {

using nlohmann::json;

constexpr int64_t kDefaultLimit = 20;
constexpr int64_t kMaxLimit = 100;

Response vercel_error(int status, std::string_view code, std::string_view message) {
  return json_response(status, {{"error", {{"code", code}, {"message", message}}}});
}

Response invalid_token() {
  return json_response(
      403,
      {{"error", {{"code", "forbidden"}, {"message", "Not authorized"}, {"invalidToken", true}}}});
}

std::string_view bearer_token(const Request& request) {
  const std::string* header = request.header("authorization");
  if (!header) return {};
  std::string_view value = *header;
  for (std::string_view scheme : {"Bearer ", "bearer "}) {
    if (value.substr(0, scheme.size()) == scheme) return value.substr(scheme.size());
  }
  return {};
}

void add_vercel_headers(Response& response, const RateSnapshot& rate) {
  response.add_header("X-RateLimit-Limit", std::to_string(rate.limit));
  response.add_header("X-RateLimit-Remaining", std::to_string(rate.remaining));
  response.add_header("X-RateLimit-Reset", std::to_string(rate.reset_s));
}

// The first position in [0, count) whose `created` satisfies `before` — positions are ordered by
// created, newest first, so `before(created)` must be false then true along them.
template <typename Predicate>
int64_t first_position(const Context& context, ProjectRef project, Predicate before) {
  int64_t low = 0;
  int64_t high = context.data.deployment_count();
  while (low < high) {
    const int64_t mid = low + (high - low) / 2;
    if (before(context.data.deployment_created_ms(project, mid))) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  return low;
}

std::optional<int64_t> optional_int(const Request& request, const char* key, bool* invalid) {
  auto text = request.query.get(key);
  if (!text) return std::nullopt;
  auto value = parse_int(*text);
  if (!value) *invalid = true;
  return value;
}

// The project named by `id_or_name` as seen by `installation`'s token, or the error to send.
std::optional<Response> resolve_project(const Context& context, int installation,
                                        std::string_view id_or_name, ProjectRef* project) {
  auto found = context.data.find_project(installation, id_or_name);
  if (!found) return vercel_error(404, "not_found", "Project not found");
  if (found->installation != installation) {
    return vercel_error(403, "forbidden", "You don't have permission to access this project");
  }
  *project = *found;
  return std::nullopt;
}

// GET /v6/deployments?projectId=&limit=&since=&until= : newest first; until = created strictly
// before, since = created strictly after; pagination.next = created of the last item when more
// remain.
Response list_deployments(const Context& context, const Request& request, int installation) {
  auto project_id = request.query.get("projectId");
  if (!project_id || project_id->empty()) {
    return vercel_error(400, "bad_request", "backhaul-sandbox requires the projectId parameter");
  }
  ProjectRef project;
  if (auto error = resolve_project(context, installation, *project_id, &project)) return *error;
  bool invalid = false;
  const auto limit_param = optional_int(request, "limit", &invalid);
  const auto until = optional_int(request, "until", &invalid);
  const auto since = optional_int(request, "since", &invalid);
  if (invalid || (limit_param && *limit_param < 1)) {
    return vercel_error(400, "bad_request",
                        "Invalid query parameters: limit, since and until "
                        "must be integers");
  }
  const int64_t limit = std::min(
      {limit_param.value_or(kDefaultLimit), kMaxLimit, int64_t{context.options.max_per_page}});
  const int64_t begin =
      until ? first_position(context, project, [&](int64_t created) { return created < *until; })
            : 0;
  const int64_t end =
      since ? first_position(context, project, [&](int64_t created) { return created <= *since; })
            : context.data.deployment_count();
  const int64_t count = std::clamp<int64_t>(end - begin, 0, limit);

  std::string body = "{\"deployments\":[";
  for (int64_t k = 0; k < count; ++k) {
    if (k > 0) body += ',';
    body += context.data.deployment_json(project, begin + k).dump();
  }
  const bool more = begin + count < end;
  json pagination = {
      {"count", count},
      {"next",
       more ? json(context.data.deployment_created_ms(project, begin + count - 1)) : json(nullptr)},
      {"prev",
       count > 0 ? json(context.data.deployment_created_ms(project, begin)) : json(nullptr)}};
  body += "],\"pagination\":" + pagination.dump() + "}";
  Response response;
  response.body = std::move(body);
  return response;
}

Response dispatch(const Context& context, const Request& request, Route route, int installation) {
  if (request.method != "GET" && request.method != "HEAD") {
    return vercel_error(404, "not_found", "Not Found");
  }
  if (route.size() == 2 && route[0] == "v6" && route[1] == "deployments") {
    return list_deployments(context, request, installation);
  }
  if (route.size() == 3 && route[0] == "v9" && route[1] == "projects") {
    ProjectRef project;
    if (auto error = resolve_project(context, installation, route[2], &project)) return *error;
    return json_response(200, context.data.project_json(project));
  }
  return vercel_error(404, "not_found", "Not Found");
}

// The project and list a request is about (for resource faults and per-resource counts), when it
// names a project of `installation`.
std::optional<Target> target_of(const Context& context, const Request& request, Route route,
                                int installation) {
  std::optional<ProjectRef> project;
  std::string list;
  if (route.size() == 2 && route[0] == "v6" && route[1] == "deployments") {
    if (auto id = request.query.get("projectId")) {
      project = context.data.find_project(installation, *id);
    }
    list = "deployments";
  } else if (route.size() == 3 && route[0] == "v9" && route[1] == "projects") {
    project = context.data.find_project(installation, route[2]);
    list = "project";
  }
  if (!project || project->installation != installation) return std::nullopt;
  return Target{installation, DataModel::project_id(*project),
                DataModel::project_name(project->project), list};
}

Response answer(const Context& context, const Request& request, Route route,
                const Admission& admission) {
  switch (admission.verdict) {
    case Verdict::kBadToken:
      return invalid_token();
    case Verdict::kRateLimited: {
      Response response = vercel_error(429, "too_many_requests", "Rate limit exceeded");
      const int64_t wait_s =
          std::max<int64_t>(0, admission.rate.reset_s - context.state.now_ms() / 1000);
      response.add_header("Retry-After", std::to_string(wait_s));
      return response;
    }
    case Verdict::kBurst429: {
      Response response = vercel_error(429, "too_many_requests", "Rate limit exceeded");
      response.add_header("Retry-After", std::to_string(admission.retry_after_s));
      return response;
    }
    case Verdict::kServerError:
      return vercel_error(admission.server_error_status, "internal_server_error",
                          "An unexpected error occurred");
    case Verdict::kOk:
      break;
  }
  if (auto target = target_of(context, request, route, admission.installation)) {
    if (const int status = context.state.visit(Provider::kVercel, *target)) {
      return vercel_error(status, status == 404 ? "not_found" : "internal_server_error",
                          "Injected resource fault");
    }
  }
  return dispatch(context, request, route, admission.installation);
}

}  // namespace

Response handle_vercel(const Context& context, const Request& request, Route route) {
  const Admission admission = context.state.admit(Provider::kVercel, bearer_token(request));
  sleep_ms(admission.slow_ms);
  Response response = answer(context, request, route, admission);
  add_vercel_headers(response, admission.rate);
  return response;
}

}  // namespace backhaul::sandbox
