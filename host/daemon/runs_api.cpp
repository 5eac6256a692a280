// /v1/runs, /v1/installations/{id}/cancel and /v1/rate-limits: a thin layer over
// pipeline::Pipeline, which validates requests and owns the run model.
#include <set>

#include "core/gateway/gateway_client.h"
#include "core/pipeline/pipeline.h"
#include "host/daemon/api_support.h"

namespace backhaul::daemon {
namespace {

using host::Response;
using nlohmann::json;

pipeline::Pipeline& require_pipeline(Call& call) {
  if (call.deps.pipeline == nullptr) {
    throw ApiError(503, "UNAVAILABLE", "pipeline: not running in this process", json::object(),
                   /*retryable=*/true);
  }
  return *call.deps.pipeline;
}

// Runs the pipeline call, turning its InvalidRequest into VALIDATION_ERROR on the same field.
template <typename F>
auto validated(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const pipeline::InvalidRequest& e) {
    throw ApiError(400, "VALIDATION_ERROR", e.what(), {{"field", e.field()}});
  }
}

std::string required_string(const json& body, const char* field) {
  if (!body.contains(field)) throw validation_error(field, "is required");
  if (!body[field].is_string() || body[field].get<std::string>().empty()) {
    throw validation_error(field, "must be a non-empty string");
  }
  return body[field].get<std::string>();
}

pipeline::RunRequest run_request(const json& body) {
  require_known_fields(body, {"installationId", "provider", "orgId", "depth", "entityTypes"});
  pipeline::RunRequest r;
  r.installation_id = required_string(body, "installationId");
  r.provider = required_string(body, "provider");
  if (body.contains("orgId") && !body["orgId"].is_null()) {
    if (!body["orgId"].is_string() || body["orgId"].get_ref<const std::string&>().empty()) {
      throw validation_error("orgId", "must be a non-empty string (or left out: the connection's)");
    }
    r.org_id = body["orgId"].get<std::string>();
  }
  if (!body.contains("depth")) throw validation_error("depth", "is required (7, 30 or 90)");
  if (!body["depth"].is_number_integer()) {
    throw validation_error("depth", "must be 7, 30 or 90 (got " + body["depth"].dump() + ")");
  }
  const json& depth = body["depth"];
  if (depth.is_number_unsigned() ? depth.get<uint64_t>() > 90
                                 : depth.get<int64_t>() < 0 || depth.get<int64_t>() > 90) {
    // Not narrowed to int first: 2^32 + 7 is not 7.
    throw validation_error("depth", "must be 7, 30 or 90 (got " + depth.dump() + ")");
  }
  r.depth_days = depth.get<int>();
  if (body.contains("entityTypes") && !body["entityTypes"].is_null()) {
    const json& types = body["entityTypes"];
    if (!types.is_array()) throw validation_error("entityTypes", "must be an array of strings");
    // The pipeline reads no types as the connector's defaults: [] would run every default type.
    if (types.empty()) {
      throw validation_error("entityTypes",
                             "must name at least one entity type (or be left out: the "
                             "connector's defaults)");
    }
    for (const json& t : types) {
      if (!t.is_string()) throw validation_error("entityTypes", "must be an array of strings");
      r.entity_types.push_back(t.get<std::string>());
    }
  }
  return r;
}

json request_json(const pipeline::RunRequest& r) {
  return {{"installationId", r.installation_id},
          {"provider", r.provider},
          {"orgId", r.org_id ? json(*r.org_id) : json(nullptr)},
          {"depth", r.depth_days},
          {"entityTypes", r.entity_types}};
}

json unit_json(const pipeline::UnitProgress& u) {
  return {{"jobId", u.job_id},
          {"resourceId", u.resource_id},
          {"resourceName", u.resource_name ? json(*u.resource_name) : json(nullptr)},
          {"entityType", u.entity_type},
          {"status", u.status},
          {"attempts", u.attempts},
          {"pages", u.pages},
          {"eventsProduced", u.events_produced},
          {"eventsDispatched", u.events_dispatched},
          {"rateLimitWaits", u.rate_limit_waits},
          {"error", u.error ? json(*u.error) : json(nullptr)}};
}

json run_json(const pipeline::RunView& run, bool with_units) {
  json body = {{"id", run.id},
               {"request", request_json(run.request)},
               {"status", run.status},
               {"error", run.error ? json(*run.error) : json(nullptr)},
               {"sinceMs", run.since_ms},
               {"createdMs", run.created_ms},
               {"startedMs", run.started_ms},
               {"finishedMs", run.finished_ms},
               {"unitsTotal", run.units_total},
               {"unitsDone", run.units_done},
               {"unitsFailed", run.units_failed},
               {"pages", run.pages},
               {"eventsProduced", run.events_produced},
               {"eventsDispatched", run.events_dispatched},
               {"rateLimitWaits", run.rate_limit_waits}};
  if (with_units) {
    json units = json::array();
    for (const pipeline::UnitProgress& u : run.units) units.push_back(unit_json(u));
    body["units"] = std::move(units);
  }
  return body;
}

std::string run_status(pipeline::Pipeline& p, jobs::JobId id) {
  const std::optional<pipeline::RunView> view = p.get_run(id, /*with_units=*/false);
  return view ? view->status : "unknown";
}

Response start_run(Call& call) {
  pipeline::Pipeline& p = require_pipeline(call);
  const pipeline::RunRequest request = run_request(call.json_body());
  const pipeline::RunStart start = validated([&] { return p.start_run(request); });
  call.summary = (start.created ? "start run " : "active run ") + std::to_string(start.run_id) +
                 " for " + request.installation_id + " (" + request.provider + ")";
  return call.ok(start.created ? 202 : 200, {{"runId", start.run_id},
                                             {"created", start.created},
                                             {"status", run_status(p, start.run_id)}});
}

Response preview(Call& call) {
  pipeline::Pipeline& p = require_pipeline(call);
  const pipeline::RunRequest request = run_request(call.json_body());
  const pipeline::Preview preview = validated([&] { return p.preview(request); });
  json units = json::array();
  for (const pipeline::PreviewUnit& u : preview.units) {
    units.push_back({{"resourceId", u.resource_id},
                     {"resourceName", u.resource_name ? json(*u.resource_name) : json(nullptr)},
                     {"entityType", u.entity_type}});
  }
  call.summary = "preview run for " + request.installation_id + ": " +
                 std::to_string(preview.units.size()) + " units";
  return call.ok(200, {{"installationId", preview.installation_id},
                       {"provider", preview.provider},
                       {"orgId", preview.org_id},
                       {"sinceMs", preview.since_ms},
                       {"since", gateway::iso8601_ms(preview.since_ms)},
                       {"units", std::move(units)},
                       {"unitCount", preview.units.size()},
                       {"estimatedRequests", preview.estimated_requests}});
}

Response list_runs(Call& call) {
  pipeline::Pipeline& p = require_pipeline(call);
  require_known_parameters(call.request, {"status", "installationId", "before", "limit"});
  pipeline::RunQuery query;
  query.status = query_string(call.request, "status");
  query.installation_id = query_string(call.request, "installationId");
  query.before_id = query_int(call.request, "before", 1, INT64_MAX);
  query.limit = query_limit(call.request);
  const pipeline::RunPage page = validated([&] { return p.list_runs(query); });
  json items = json::array();
  // Pipeline::list_runs leaves unit totals and counts out (they live in the units' jobs); each
  // listed run is read again with them, so list and get agree.
  for (const pipeline::RunView& listed : page.runs) {
    const std::optional<pipeline::RunView> run = p.get_run(listed.id, /*with_units=*/false);
    items.push_back(run_json(run ? *run : listed, false));
  }
  return call.ok(200, page_json(std::move(items), page.next_before));
}

pipeline::RunView require_run(pipeline::Pipeline& p, jobs::JobId id) {
  std::optional<pipeline::RunView> run = p.get_run(id, /*with_units=*/true);
  if (!run) throw not_found("RUN_NOT_FOUND", "run " + std::to_string(id) + " does not exist");
  return *run;
}

Response cancel_run(Call& call, jobs::JobId id) {
  pipeline::Pipeline& p = require_pipeline(call);
  const std::optional<jobs::CancelOutcome> outcome = p.cancel_run(id);
  if (!outcome) throw not_found("RUN_NOT_FOUND", "run " + std::to_string(id) + " does not exist");
  call.summary =
      "cancel run " + std::to_string(id) + ": " + std::string(cancel_outcome_name(*outcome));
  return call.ok(
      200,
      {{"runId", id}, {"outcome", cancel_outcome_name(*outcome)}, {"status", run_status(p, id)}});
}

json caps_json(const jobs::Caps& caps) {
  return {{"perInstallation", caps.per_key}, {"global", caps.global}};
}

json settings_json(const pipeline::RateLimitSettings& s) {
  return {{"throttlePerHour", s.throttle_per_hour},
          {"throttleBurst", s.throttle_burst},
          {"rateLimitFloor", s.rate_limit_floor},
          {"entityCaps", caps_json(s.entity_caps)},
          {"runCaps", caps_json(s.run_caps)}};
}

void read_number(const json& body, const char* field, double* out) {
  if (!body.contains(field)) return;
  if (!body[field].is_number()) throw validation_error(field, "must be a number");
  *out = body[field].get<double>();
}

void read_caps(const json& body, const char* field, jobs::Caps* caps) {
  if (!body.contains(field)) return;
  const json& value = body[field];
  if (!value.is_object()) throw validation_error(field, "must be an object");
  for (const auto& [key, item] : value.items()) {
    const std::string path = std::string(field) + "." + key;
    if (key != "perInstallation" && key != "global") {
      throw validation_error(path, "is not a known field");
    }
    if (!item.is_number_integer() || item.get<int64_t>() < 0 || item.get<int64_t>() > 100'000) {
      throw validation_error(path, "must be an integer between 0 and 100000");
    }
    (key == "global" ? caps->global : caps->per_key) = item.get<int>();
  }
}

Response rate_limits(Call& call) {
  pipeline::Pipeline& p = require_pipeline(call);
  if (call.request.method == "GET") return call.ok(200, settings_json(p.rate_limits()));
  allow_only(call, {"GET", "PUT"});
  const json body = call.json_body();
  for (const auto& [key, value] : body.items()) {
    // "metadata": a GET's answer sent back as it is (ignored).
    static const std::set<std::string> known = {
        "throttlePerHour", "throttleBurst", "rateLimitFloor", "entityCaps", "runCaps", "metadata"};
    if (!known.count(key)) throw validation_error(key, "is not a known field");
  }
  // Fields left out keep their current values.
  const pipeline::RateLimitSettings settings = validated([&] {
    return p.update_rate_limits([&](pipeline::RateLimitSettings& s) {
      read_number(body, "throttlePerHour", &s.throttle_per_hour);
      read_number(body, "throttleBurst", &s.throttle_burst);
      read_number(body, "rateLimitFloor", &s.rate_limit_floor);
      read_caps(body, "entityCaps", &s.entity_caps);
      read_caps(body, "runCaps", &s.run_caps);
    });
  });
  call.summary = "set rate limits " + settings_json(settings).dump();
  return call.ok(200, settings_json(settings));
}

}  // namespace

Response handle_runs(Call& call, Route rest) {
  const std::string& method = call.request.method;
  auto only = [&](std::string_view allowed) { allow_only(call, {allowed}); };
  if (rest.empty()) {
    if (method == "POST") return start_run(call);
    allow_only(call, {"GET", "POST"});
    return list_runs(call);
  }
  if (rest.size() == 1 && rest[0] == "preview") {
    only("POST");
    return preview(call);
  }
  const jobs::JobId id = path_id(call, rest[0]);
  if (rest.size() == 1) {
    only("GET");
    return call.ok(200, run_json(require_run(require_pipeline(call), id), true));
  }
  if (rest.size() == 2 && rest[1] == "cancel") {
    only("POST");
    return cancel_run(call, id);
  }
  throw not_found("NOT_FOUND", "no route for " + call.request.path);
}

Response handle_installations(Call& call, Route rest) {
  if (rest.size() != 2 || rest[1] != "cancel") {
    throw not_found("NOT_FOUND", "no route for " + call.request.path);
  }
  allow_only(call, {"POST"});
  const std::string installation(rest[0]);
  const int cancelled =
      validated([&] { return require_pipeline(call).cancel_installation(installation); });
  call.summary = "cancel installation " + installation + ": " + std::to_string(cancelled) + " jobs";
  return call.ok(200, {{"installationId", installation}, {"cancelled", cancelled}});
}

Response handle_rate_limits(Call& call, Route rest) {
  if (!rest.empty()) throw not_found("NOT_FOUND", "no route for " + call.request.path);
  return rate_limits(call);
}

void append_pipeline_metrics(Call& call, std::string* out) {
  if (call.deps.pipeline == nullptr) return;
  const pipeline::PipelineMetrics m = call.deps.pipeline->metrics();
  const std::pair<const char*, int64_t> counters[] = {
      {"backhaul_pipeline_pages_total", m.pages},
      {"backhaul_pipeline_events_dispatched_total", m.events_dispatched},
      {"backhaul_pipeline_events_duplicate_total", m.events_duplicate},
      {"backhaul_pipeline_rate_limit_waits_total", m.rate_limit_waits},
      {"backhaul_pipeline_gateway_rate_limit_waits_total", m.gateway_rate_limit_waits},
      {"backhaul_pipeline_throttle_waits_total", m.throttle_waits},
      {"backhaul_pipeline_circuit_deferrals_total", m.circuit_deferrals},
      {"backhaul_pipeline_token_refreshes_total", m.token_refreshes},
      {"backhaul_pipeline_transient_retries_total", m.transient_retries}};
  for (const auto& [name, value] : counters) {
    *out +=
        "# TYPE " + std::string(name) + " counter\n" + name + " " + std::to_string(value) + "\n";
  }
  *out +=
      "# HELP backhaul_plugin_call_seconds Wall time of connector fetch_page calls.\n"
      "# TYPE backhaul_plugin_call_seconds summary\n"
      "backhaul_plugin_call_seconds_sum " +
      std::to_string(static_cast<double>(m.plugin_call_us) / 1e6) +
      "\nbackhaul_plugin_call_seconds_count " + std::to_string(m.plugin_calls) + "\n";
}

}  // namespace backhaul::daemon
