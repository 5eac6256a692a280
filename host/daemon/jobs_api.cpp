// /v1/jobs: list, get (with attempt history), cancel, and the checkpoint of a job that is not
// running (read, replace, reset).
#include "core/jobs/job_store.h"
#include "core/pipeline/pipeline.h"
#include "host/daemon/api_support.h"

namespace backhaul::daemon {
namespace {

using host::Response;
using nlohmann::json;

jobs::Job require_job(Call& call, jobs::JobId id) {
  std::optional<jobs::Job> job = call.deps.store.get(id);
  if (!job) throw not_found("JOB_NOT_FOUND", "job " + std::to_string(id) + " does not exist");
  return *job;
}

Response list_jobs(Call& call) {
  require_known_parameters(call.request, {"status", "kind", "key", "parent", "before", "limit"});
  jobs::JobQuery query;
  if (auto status = query_string(call.request, "status")) {
    query.status = jobs::parse_job_status(*status);
    if (!query.status) {
      throw validation_error("status",
                             "must be one of queued, running, waiting, succeeded, dead, cancelled "
                             "(got \"" +
                                 *status + "\")");
    }
  }
  query.kind = query_string(call.request, "kind");
  query.concurrency_key = query_key(call.request);
  query.parent_id = query_int(call.request, "parent", 1, INT64_MAX);
  query.before_id = query_int(call.request, "before", 1, INT64_MAX);
  query.limit = query_limit(call.request);
  const jobs::JobPage page = call.deps.store.list(query);
  json items = json::array();
  for (const jobs::Job& job : page.jobs) items.push_back(job_json(job));
  return call.ok(200, page_json(std::move(items), page.next_before));
}

Response get_job(Call& call, jobs::JobId id) {
  json body = job_json(require_job(call, id));
  add_attempt_history(body, call.deps.store, id);
  return call.ok(200, std::move(body));
}

Response cancel_job(Call& call, jobs::JobId id) {
  require_job(call, id);
  const jobs::CancelOutcome outcome = call.deps.store.cancel(id, call.now_ms());
  call.summary =
      "cancel job " + std::to_string(id) + ": " + std::string(cancel_outcome_name(outcome));
  const jobs::Job job = require_job(call, id);
  return call.ok(200, {{"jobId", id},
                       {"outcome", cancel_outcome_name(outcome)},
                       {"status", jobs::to_string(job.status)}});
}

Response checkpoint(Call& call, jobs::JobId id) {
  const std::string& method = call.request.method;
  if (method == "GET") {
    const jobs::Job job = require_job(call, id);
    return call.ok(
        200, {{"jobId", id},
              {"status", jobs::to_string(job.status)},
              {"checkpoint", job.checkpoint ? parse_stored(*job.checkpoint) : json(nullptr)}});
  }
  if (method == "PUT") {
    const json body = call.json_body("a JSON object (the new checkpoint)");
    // A body admin.max_body_bytes lets through may still be more than a store keeps (being JSON,
    // it is UTF-8).
    if (call.request.body.size() > jobs::kMaxTextBytes) {
      throw ApiError(413, "PAYLOAD_TOO_LARGE",
                     *jobs::text_problem("body: the checkpoint", call.request.body),
                     {{"maxBytes", jobs::kMaxTextBytes}});
    }
    const jobs::Job job = require_job(call, id);
    try {
      // A checkpoint its handler could not resume from is refused here, naming the field, rather
      // than stored and then ignored (the unit silently starting over) at the next attempt.
      pipeline::check_checkpoint(job.kind, call.request.body);
    } catch (const pipeline::InvalidRequest& e) {
      throw ApiError(400, "VALIDATION_ERROR", e.what(), {{"field", e.field()}});
    }
    // Stored as sent: a re-serialization would sort its keys and round numbers beyond 64 bits.
    call.deps.store.set_checkpoint(id, call.request.body, call.now_ms());
    call.summary = "replace checkpoint of job " + std::to_string(id);
    return call.ok(200,
                   {{"jobId", id}, {"status", jobs::to_string(job.status)}, {"checkpoint", body}});
  }
  if (method == "DELETE") {
    const jobs::Job job = require_job(call, id);
    call.deps.store.set_checkpoint(id, std::nullopt, call.now_ms());
    call.summary = "reset checkpoint of job " + std::to_string(id);
    return call.ok(
        200, {{"jobId", id}, {"status", jobs::to_string(job.status)}, {"checkpoint", nullptr}});
  }
  throw method_not_allowed(call, {"GET", "PUT", "DELETE"});
}

}  // namespace

Response handle_jobs(Call& call, Route rest) {
  if (rest.empty()) {
    allow_only(call, {"GET"});
    return list_jobs(call);
  }
  const jobs::JobId id = path_id(call, rest[0]);
  if (rest.size() == 1) {
    allow_only(call, {"GET"});
    return get_job(call, id);
  }
  if (rest.size() == 2 && rest[1] == "cancel") {
    allow_only(call, {"POST"});
    return cancel_job(call, id);
  }
  if (rest.size() == 2 && rest[1] == "checkpoint") return checkpoint(call, id);
  throw not_found("NOT_FOUND", "no route for " + call.request.path);
}

}  // namespace backhaul::daemon
