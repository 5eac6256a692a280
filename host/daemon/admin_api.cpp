#include "host/daemon/admin_api.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>

#include <Poco/UUIDGenerator.h>

#include "core/common/json_check.h"
#include "core/common/logging.h"
#include "core/common/strict_json.h"
#include "core/gateway/gateway_client.h"
#include "core/jobs/token_bucket.h"
#include "host/daemon/api_support.h"

namespace backhaul::daemon {
namespace {

using host::Request;
using host::Response;
using nlohmann::json;

// Compares in time that depends only on the lengths, so a wrong token leaks no prefix.
bool constant_time_equal(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// "Bearer <token>"; the scheme's name is case-insensitive (RFC 9110 11.1), and spaces may follow
// it.
// The path of a request without a valid token, in its audit line, at most.
constexpr size_t kMaxUnauthorizedPathBytes = 200;

bool authorized(const Request& request, const std::string& token) {
  const std::string* header = request.header("authorization");
  const std::string_view scheme = "bearer";
  if (header == nullptr || header->size() <= scheme.size() || (*header)[scheme.size()] != ' ' ||
      !std::equal(scheme.begin(), scheme.end(), header->begin(), [](char a, char b) {
        return a == std::tolower(static_cast<unsigned char>(b));
      })) {
    return false;
  }
  const size_t credentials = header->find_first_not_of(' ', scheme.size());
  if (credentials == std::string::npos) return false;
  return constant_time_equal(std::string_view(*header).substr(credentials), token);
}

bool is_mutation(const std::string& method) {
  return method == "POST" || method == "PUT" || method == "DELETE" || method == "PATCH";
}

size_t header_bytes(const Request& request) {
  size_t total = request.method.size() + request.path.size();
  for (const auto& [name, value] : request.headers) total += name.size() + value.size() + 4;
  return total;
}

Response error_response(const Call& call, const ApiError& error) {
  json body = {{"error",
                {{"code", error.code()},
                 {"message", error.what()},
                 {"details", error.details()},
                 {"retryable", error.retryable()}}}};
  Response response = call.ok(error.status(), std::move(body));
  for (const auto& [name, value] : error.headers()) response.add_header(name, value);
  return response;
}

Response route(Call& call) {
  const Request& request = call.request;
  if (request.unreadable) {
    throw ApiError(400, "VALIDATION_ERROR", "request: could not be read: " + *request.unreadable);
  }
  if (request.body_too_large) {
    throw ApiError(413, "PAYLOAD_TOO_LARGE",
                   "body: larger than " + std::to_string(call.options.max_body_bytes) + " bytes",
                   {{"maxBodyBytes", call.options.max_body_bytes}});
  }
  if (header_bytes(request) > call.options.max_header_bytes) {
    throw ApiError(
        431, "HEADERS_TOO_LARGE",
        "headers: larger than " + std::to_string(call.options.max_header_bytes) + " bytes",
        {{"maxHeaderBytes", call.options.max_header_bytes}});
  }
  const std::vector<std::string_view> segments = host::path_segments(request);
  // "/v1/jobs/" and "/v1//jobs" name no resource (an empty id is no id to validate).
  if (std::any_of(segments.begin(), segments.end(), [](std::string_view s) { return s.empty(); })) {
    throw not_found("NOT_FOUND", "no route for " + request.path);
  }
  const Route all(segments);
  if (!segments.empty() && segments[0] == "health") return handle_health(call, all.subspan(1));
  if (segments.size() == 1 && segments[0] == "metrics") {
    allow_only(call, {"GET"});
    return handle_metrics(call);
  }
  if (segments.empty() || segments[0] != "v1") {
    throw not_found("NOT_FOUND", "no route for " + request.path);
  }
  if (!authorized(request, call.options.token)) {
    throw ApiError(401, "UNAUTHORIZED", "authorization: a valid bearer token is required")
        .with_header("WWW-Authenticate", "Bearer");  // RFC 9110 11.6.1: a 401 names its scheme
  }
  if (segments.size() < 2) throw not_found("NOT_FOUND", "no route for " + request.path);
  const std::string_view group = segments[1];
  const Route rest = all.subspan(2);
  if (group == "jobs") return handle_jobs(call, rest);
  if (group == "dead-letters") return handle_dead_letters(call, rest);
  if (group == "plugins") return handle_plugins(call, rest);
  if (group == "runs") return handle_runs(call, rest);
  if (group == "installations") return handle_installations(call, rest);
  if (group == "rate-limits") return handle_rate_limits(call, rest);
  throw not_found("NOT_FOUND", "no route for " + request.path);
}

}  // namespace

struct AdminApi::RefusedAudit {
  std::mutex mutex;
  std::optional<jobs::Bucket> bucket;  // none: full
  int64_t left_out = 0;                // since the last line written
};

AdminApi::AdminApi(AdminApiDeps deps, AdminApiOptions options)
    : deps_(std::move(deps)),
      options_(std::move(options)),
      refused_(std::make_unique<RefusedAudit>()) {
  jobs::check_take(1, options_.unauthorized_audit_burst, options_.unauthorized_audit_per_hour);
}

AdminApi::~AdminApi() = default;

bool AdminApi::audit_refused(int64_t now_ms, std::string& summary) {
  std::lock_guard lock(refused_->mutex);
  const jobs::Take take = jobs::take_from(refused_->bucket, 1, options_.unauthorized_audit_burst,
                                          options_.unauthorized_audit_per_hour, now_ms);
  refused_->bucket = take.bucket;
  if (take.wait_ms > 0) {
    if (refused_->left_out++ == 0) {
      logging::get("admin_api")
          ->warn(
              "audit log: mutations without a valid token come faster than {} an hour; the "
              "next audit line of one counts those left out",
              options_.unauthorized_audit_per_hour);
    }
    return false;
  }
  if (refused_->left_out > 0) {
    summary += " (and " + std::to_string(refused_->left_out) +
               " more without a valid token since the last such line, not written)";
    refused_->left_out = 0;
  }
  return true;
}

Response AdminApi::handle(const Request& request) {
  if (request.method == "HEAD") {  // a GET whose body the server leaves out (RFC 9110 9.3.2)
    Request get = request;
    get.method = "GET";
    return handle(get);
  }
  static const auto log = logging::get("admin_api");
  Call call{deps_,
            options_,
            request,
            Poco::UUIDGenerator::defaultGenerator().createRandom().toString(),
            {}};
  Response response;
  try {
    response = route(call);
  } catch (const ApiError& e) {
    response = error_response(call, e);
    call.summary = e.code();
  } catch (const jobs::JobNotFound& e) {
    response = error_response(call, not_found("JOB_NOT_FOUND", e.what()));
    call.summary = "JOB_NOT_FOUND";
  } catch (const jobs::InvalidTransition& e) {
    response = error_response(call, ApiError(409, "CONFLICT", e.what()));
    call.summary = "CONFLICT";
  } catch (const jobs::LeaseLost& e) {
    response = error_response(call, ApiError(409, "CONFLICT", e.what()));
    call.summary = "CONFLICT";
  } catch (const StorageError& e) {
    log->error("{} {}: storage error: {}", request.method, request.path, e.what());
    // Only an error that may pass (the store unreachable, locked, out of disk) is worth the
    // client's retry; one the store will give again for the same request is not.
    response = error_response(
        call, ApiError(e.transient() ? 503 : 500, "STORAGE_ERROR",
                       std::string("store: ") + e.what(), json::object(), e.transient()));
    call.summary = "STORAGE_ERROR";
  } catch (const gateway::GatewayError& e) {
    response = error_response(
        call, ApiError(502, "GATEWAY_ERROR", e.what(), {{"status", e.status()}}, e.retryable()));
    call.summary = "GATEWAY_ERROR";
  } catch (const std::exception& e) {
    log->error("{} {}: internal error: {}", request.method, request.path, e.what());
    response = error_response(call, ApiError(500, "INTERNAL_ERROR", "internal error"));
    call.summary = "INTERNAL_ERROR";
  }
  response.add_header("X-Operation-Id", call.operation_id);
  // By its segments, not its text: a target without its leading '/' ("v1/runs", refused as
  // unreadable) is a mutation of /v1 all the same.
  const std::vector<std::string_view> segments = host::path_segments(request);
  if (is_mutation(request.method) && !segments.empty() && segments.front() == "v1") {
    const int64_t now = deps_.clock.now_ms();
    // Without a valid token, whatever the answer (401, or a 400, 404, 413 or 431 refused before
    // the token is looked at): bounded, and its path cut, as anyone reaching the port sends these.
    std::string path = request.raw_path.empty() ? request.path : request.raw_path;
    if (!authorized(request, options_.token)) {
      if (!audit_refused(now, call.summary)) return response;
      if (path.size() > kMaxUnauthorizedPathBytes)
        path = path.substr(0, kMaxUnauthorizedPathBytes) + "...";
    }
    try {
      deps_.audit.append(
          {now, call.operation_id, request.method, std::move(path), response.status, call.summary});
    } catch (const std::exception& e) {
      log->error("audit log {}: {}", deps_.audit.path().string(), e.what());
    }
  }
  return response;
}

// --- support ---------------------------------------------------------------------------------

ApiError validation_error(const std::string& field, const std::string& reason) {
  return ApiError(400, "VALIDATION_ERROR", field + ": " + reason, {{"field", field}});
}

ApiError not_found(const std::string& code, const std::string& message) {
  return ApiError(404, code, message);
}

void allow_only(const Call& call, std::initializer_list<std::string_view> allowed) {
  const std::string& method = call.request.method;
  if (std::find(allowed.begin(), allowed.end(), method) == allowed.end()) {
    throw method_not_allowed(call, allowed);
  }
}

ApiError method_not_allowed(const Call& call, std::initializer_list<std::string_view> allowed) {
  const std::string& method = call.request.method;
  std::string allow;
  for (std::string_view name : allowed) {
    allow += (allow.empty() ? "" : ", ") + std::string(name);
    if (name == "GET") allow += ", HEAD";  // answered as GET is, without the body
  }
  return ApiError(405, "METHOD_NOT_ALLOWED",
                  method + " is not allowed on " + call.request.path + " (allowed: " + allow + ")")
      .with_header("Allow", allow);
}

Response Call::ok(int status, json body) const {
  body["metadata"] = {{"operationId", operation_id},
                      {"timestamp", gateway::iso8601_ms(deps.clock.now_ms())}};
  return host::json_response(status, body);
}

json Call::json_body() const {
  if (request.body.empty()) return json::object();
  return json_body("a JSON object");
}

json Call::json_body(const char* what) const {
  json body;
  try {
    body = parse_strict_json(request.body, kMaxJsonDepth);
  } catch (const JsonTextError& e) {
    throw validation_error("body", e.what());
  }
  if (!body.is_object()) throw validation_error("body", std::string("must be ") + what);
  return body;
}

namespace {

// A positive integer in plain decimal: digits only, the first not 0. An id spelled "+7" or "007"
// would reach job 7 while the audit log and any cache keyed by path saw another name for it.
std::optional<int64_t> parse_positive(std::string_view text) {
  if (text.empty() || text.front() == '0') return std::nullopt;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  return host::parse_int(text);  // nullopt past INT64_MAX
}

constexpr const char* kPlainDecimal = "digits only, with no sign or leading zero";

}  // namespace

std::optional<int64_t> query_int(const Request& request, const char* name, int64_t min,
                                 int64_t max) {
  const std::optional<std::string> text = request.query.get(name);
  if (!text) return std::nullopt;
  const std::optional<int64_t> value = parse_positive(*text);
  if (!value || *value < min || *value > max) {
    const std::string range =
        min == 1 && max == INT64_MAX
            ? "a positive integer"
            : "an integer between " + std::to_string(min) + " and " + std::to_string(max);
    throw validation_error(name,
                           "must be " + range + ", " + kPlainDecimal + " (got \"" + *text + "\")");
  }
  return value;
}

size_t query_limit(const Request& request) {
  return static_cast<size_t>(query_int(request, "limit", 1, 500).value_or(50));
}

std::optional<std::string> query_string(const Request& request, const char* name) {
  std::optional<std::string> value = request.query.get(name);
  if (value && value->empty()) throw validation_error(name, "must not be empty");
  return value;
}

namespace {
std::string joined(std::initializer_list<const char*> names) {
  std::string text;
  for (const char* name : names) text += (text.empty() ? "" : ", ") + std::string(name);
  return text;
}
bool is_one_of(std::string_view name, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return name == n; });
}
}  // namespace

void require_known_fields(const json& body, std::initializer_list<const char*> known) {
  for (const auto& [key, value] : body.items()) {
    if (!is_one_of(key, known)) {
      throw validation_error(key, "is not a known field (known: " + joined(known) + ")");
    }
  }
}

void require_known_parameters(const Request& request, std::initializer_list<const char*> known) {
  std::set<std::string> seen;
  for (const std::string& name : request.query.names()) {
    if (!is_one_of(name, known)) {
      throw validation_error(name,
                             "is not a parameter of this list (known: " + joined(known) + ")");
    }
    if (!seen.insert(name).second) throw validation_error(name, "is given more than once");
  }
}

std::optional<std::string> query_key(const Request& request) { return request.query.get("key"); }

int64_t path_id(const Call& call, std::string_view segment) {
  const std::optional<int64_t> id = parse_positive(segment);
  if (!id) {
    throw validation_error("id", std::string("must be a positive integer, ") + kPlainDecimal +
                                     " (got \"" + std::string(segment) + "\")");
  }
  // The segment is decoded: "%31" read as 1, another name for the id than the path the audit log
  // keeps.
  if (const std::string_view raw = host::raw_segment(call.request, segment); raw != segment) {
    throw validation_error("id", std::string("must be a positive integer, ") + kPlainDecimal +
                                     ", and not percent-encoded (got \"" + std::string(raw) +
                                     "\")");
  }
  return *id;
}

json parse_stored(const std::string& text) {
  if (json_depth(text) > kMaxJsonDepth) return json(text);
  json value = json::parse(text, nullptr, false);
  return value.is_discarded() ? json(text) : value;
}

namespace {
json optional_text(const std::optional<std::string>& value) {
  return value ? json(*value) : json(nullptr);
}
}  // namespace

std::string_view cancel_outcome_name(jobs::CancelOutcome outcome) {
  switch (outcome) {
    case jobs::CancelOutcome::kCancelled:
      return "cancelled";
    case jobs::CancelOutcome::kRequested:
      return "requested";
    case jobs::CancelOutcome::kAlreadyFinished:
      return "already_finished";
  }
  return "unknown";
}

json page_json(json items, const std::optional<int64_t>& next_before) {
  return {{"items", std::move(items)},
          {"nextBefore", next_before ? json(*next_before) : json(nullptr)}};
}

json job_json(const jobs::Job& job) {
  return {{"id", job.id},
          {"kind", job.kind},
          {"status", jobs::to_string(job.status)},
          {"concurrencyKey", job.concurrency_key},
          {"dedupeKey", optional_text(job.dedupe_key)},
          {"payload", parse_stored(job.payload)},
          {"priority", job.priority},
          {"attempts", job.attempts},
          {"maxAttempts", job.max_attempts},
          {"runAfterMs", job.run_after_ms},
          {"leaseOwner", optional_text(job.lease_owner)},
          {"leaseExpiresMs", job.lease_expires_ms},
          {"checkpoint", job.checkpoint ? parse_stored(*job.checkpoint) : json(nullptr)},
          {"result", job.result ? parse_stored(*job.result) : json(nullptr)},
          {"lastError", optional_text(job.last_error)},
          {"parentId", job.parent_id ? json(*job.parent_id) : json(nullptr)},
          {"pendingChildren", job.pending_children},
          {"timeoutMs", job.timeout_ms},
          {"cancelRequested", job.cancel_requested},
          {"createdMs", job.created_ms},
          {"startedMs", job.started_ms},
          {"finishedMs", job.finished_ms},
          {"updatedMs", job.updated_ms}};
}

json attempt_json(const jobs::Attempt& attempt) {
  return {{"attempt", attempt.attempt},      {"owner", attempt.owner},
          {"startedMs", attempt.started_ms}, {"finishedMs", attempt.finished_ms},
          {"outcome", attempt.outcome},      {"error", optional_text(attempt.error)}};
}

void add_attempt_history(json& body, jobs::JobStore& store, jobs::JobId id) {
  std::vector<jobs::Attempt> attempts = store.newest_attempts(id, kMaxAttemptHistory + 1);
  const bool truncated = attempts.size() > kMaxAttemptHistory;
  json history = json::array();
  for (size_t i = truncated ? 1 : 0; i < attempts.size(); ++i) {
    history.push_back(attempt_json(attempts[i]));
  }
  body["attemptHistory"] = std::move(history);
  body["attemptHistoryTruncated"] = truncated;
}

json dead_letter_json(const jobs::DeadLetter& letter) {
  return {{"id", letter.id},
          {"jobId", letter.job_id},
          {"kind", letter.kind},
          {"concurrencyKey", letter.concurrency_key},
          {"status", jobs::to_string(letter.status)},
          {"error", letter.error},
          {"retries", letter.retries},
          {"createdMs", letter.created_ms},
          {"updatedMs", letter.updated_ms}};
}

}  // namespace backhaul::daemon
