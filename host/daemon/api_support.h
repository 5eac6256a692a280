// Internal to the admin API: the error type handlers throw, the envelope, parameter parsing and
// the JSON shapes of jobs and dead letters. Not included outside host/daemon.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/common/errors.h"
#include "core/jobs/job_store.h"
#include "host/common/http.h"
#include "host/daemon/admin_api.h"

namespace backhaul::daemon {

// A failure with its stable code (SPEC F2): VALIDATION_ERROR 400, UNAUTHORIZED 401, *_NOT_FOUND
// 404, METHOD_NOT_ALLOWED 405, CONFLICT 409, PAYLOAD_TOO_LARGE 413, HEADERS_TOO_LARGE 431,
// INTERNAL_ERROR 500, GATEWAY_ERROR 502, STORAGE_ERROR / UNAVAILABLE 503.
class ApiError : public Error {
 public:
  ApiError(int status, std::string code, const std::string& message,
           nlohmann::json details = nlohmann::json::object(), bool retryable = false)
      : Error(message),
        status_(status),
        code_(std::move(code)),
        details_(std::move(details)),
        retryable_(retryable) {}
  int status() const noexcept { return status_; }
  const std::string& code() const noexcept { return code_; }
  const nlohmann::json& details() const noexcept { return details_; }
  bool retryable() const noexcept { return retryable_; }
  // Headers the error's response carries (a 405's Allow).
  const std::vector<std::pair<std::string, std::string>>& headers() const noexcept {
    return headers_;
  }
  ApiError& with_header(std::string name, std::string value) {
    headers_.emplace_back(std::move(name), std::move(value));
    return *this;
  }

 private:
  int status_;
  std::string code_;
  nlohmann::json details_;
  bool retryable_;
  std::vector<std::pair<std::string, std::string>> headers_;
};

// 400 VALIDATION_ERROR whose message starts with the field name.
ApiError validation_error(const std::string& field, const std::string& reason);
ApiError not_found(const std::string& code, const std::string& message);

using Route = std::span<const std::string_view>;

// One request in flight: what handlers read, and what they leave for the audit log.
struct Call {
  AdminApiDeps& deps;
  const AdminApiOptions& options;
  const host::Request& request;
  std::string operation_id;
  std::string summary;  // set by mutating handlers; the audit line's "summary"

  int64_t now_ms() const { return deps.clock.now_ms(); }
  // `body` plus "metadata": {operationId, timestamp}.
  host::Response ok(int status, nlohmann::json body) const;
  // The request body as a JSON object ({} when empty). Throws validation_error("body", ...).
  nlohmann::json json_body() const;
  // json_body() with `what` in the error: "must be <what>".
  nlohmann::json json_body(const char* what) const;
};

// Throws 405 METHOD_NOT_ALLOWED, with an Allow header listing `allowed` (and HEAD beside GET),
// unless the request's method is one of them.
void allow_only(const Call& call, std::initializer_list<std::string_view> allowed);
// The 405 allow_only() throws, for a route that has already served the methods it takes.
ApiError method_not_allowed(const Call& call, std::initializer_list<std::string_view> allowed);

// How deeply a request body, or stored JSON shown, may nest. nlohmann copies and dumps values
// recursively: a body nested 300 000 deep ended the daemon at its first dump (a stack overflow),
// and again at every start once stored as a checkpoint. No document of the API needs more than 5.
inline constexpr size_t kMaxJsonDepth = 64;

// A body's fields are only `known` ones: one it does not know (a misspelt filter, "entity_types"
// for "entityTypes") would otherwise be ignored and widen the operation. Throws validation_error
// naming it.
void require_known_fields(const nlohmann::json& body, std::initializer_list<const char*> known);

// A list's query names only `known` parameters, each once: a misspelt filter ("state" for
// "status") or a repeated one would otherwise be ignored and list more than was asked. Throws
// validation_error naming it.
void require_known_parameters(const host::Request& request,
                              std::initializer_list<const char*> known);

// Query parameters. Each throws validation_error naming the parameter. query_int() takes a positive
// integer in plain decimal (no sign, no leading zero) from min (>= 1) to max.
std::optional<int64_t> query_int(const host::Request& request, const char* name, int64_t min,
                                 int64_t max);
size_t query_limit(const host::Request& request);  // "limit", 1..500, default 50
// A query parameter's value; present and empty is refused (it would filter nothing).
std::optional<std::string> query_string(const host::Request& request, const char* name);
// "key", the concurrency key: present and empty selects the jobs without one.
std::optional<std::string> query_key(const host::Request& request);
// A path id: a positive integer in plain decimal as sent ("7", not "+7", "007" or "%37"), else
// validation_error("id"). `segment` is one of the request's path_segments().
int64_t path_id(const Call& call, std::string_view segment);

// "cancelled", "requested", "already_finished".
std::string_view cancel_outcome_name(jobs::CancelOutcome outcome);
// {"items": items, "nextBefore": id or null}: one page of a newest-first list.
nlohmann::json page_json(nlohmann::json items, const std::optional<int64_t>& next_before);
nlohmann::json job_json(const jobs::Job& job);
nlohmann::json attempt_json(const jobs::Attempt& attempt);
// Sets body["attemptHistory"] to the job's newest kMaxAttemptHistory attempts, oldest first, and
// body["attemptHistoryTruncated"] to whether older ones were left out. Every wait of a job is an
// attempt row: a backfill throttled for days had tens of thousands, all in one answer.
inline constexpr size_t kMaxAttemptHistory = 100;
void add_attempt_history(nlohmann::json& body, jobs::JobStore& store, jobs::JobId id);
nlohmann::json dead_letter_json(const jobs::DeadLetter& letter);
// JSON text stored by the queue, parsed; the raw string when it is not valid JSON or nests
// deeper than kMaxJsonDepth.
nlohmann::json parse_stored(const std::string& text);

// Route groups (each answers for the path below /v1/<group>).
host::Response handle_jobs(Call& call, Route rest);
host::Response handle_dead_letters(Call& call, Route rest);
host::Response handle_plugins(Call& call, Route rest);
host::Response handle_runs(Call& call, Route rest);
host::Response handle_installations(Call& call, Route rest);
host::Response handle_rate_limits(Call& call, Route rest);
host::Response handle_health(Call& call, Route rest);  // below /health
host::Response handle_metrics(Call& call);
// The pipeline's counters in Prometheus text, appended to `out` (nothing without a pipeline).
void append_pipeline_metrics(Call& call, std::string* out);

}  // namespace backhaul::daemon
