// The sandbox's own endpoints under /_sandbox: report, expected and missing delivery ids, fault
// knobs, reset and a health check. Unauthenticated: the sandbox only listens on loopback.
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "host/sandbox/apis.h"

namespace backhaul::sandbox {
namespace {

using nlohmann::json;

constexpr size_t kDefaultMissingLimit = 100;

Response control_error(int status, std::string_view code, const std::string& message) {
  return json_response(status, {{"error", {{"code", code}, {"message", message}}}});
}

json counts_json(const DeliveryCounts& counts) {
  return {{"received", counts.received},      {"unique", counts.unique},
          {"duplicates", counts.duplicates},  {"expected", counts.expected},
          {"missing", counts.missing},        {"unexpected", counts.unexpected},
          {"misdirected", counts.misdirected}};
}

DeliveryCounts& operator+=(DeliveryCounts& to, const DeliveryCounts& from) {
  to.received += from.received;
  to.unique += from.unique;
  to.duplicates += from.duplicates;
  to.expected += from.expected;
  to.missing += from.missing;
  to.unexpected += from.unexpected;
  to.misdirected += from.misdirected;
  return to;
}

// ?installation=inst-N -> N; no parameter -> nullopt; anything else -> error.
std::optional<Response> installation_filter(const Context& context, const Request& request,
                                            std::optional<int>* installation) {
  auto id = request.query.get("installation");
  if (!id) return std::nullopt;
  *installation = context.data.parse_installation_id(*id);
  if (!*installation) return control_error(404, "not_found", "unknown installation " + *id);
  return std::nullopt;
}

Response expected_ids(const Context& context, std::optional<int> installation) {
  json ids = json::array();
  for (int i = 1; i <= context.data.installations(); ++i) {
    if (installation && *installation != i) continue;
    context.data.for_each_expected(i, [&](const std::string& id, Provider) { ids.push_back(id); });
  }
  return json_response(200, {{"count", ids.size()}, {"ids", ids}});
}

Response missing_ids(const Context& context, const Request& request,
                     std::optional<int> installation) {
  auto limit_text = request.query.get("limit");
  auto limit = limit_text ? parse_int(*limit_text) : std::optional<int64_t>(kDefaultMissingLimit);
  if (!limit || *limit < 0) return control_error(400, "bad_request", "limit must be >= 0");
  const Report report = build_report(context, installation);
  const auto ids = context.deliveries.missing(installation, static_cast<size_t>(*limit));
  return json_response(200, {{"count", report.gateway.missing}, {"ids", ids}});
}

// The first webhook body the gateway accepted for ?provider=github|vercel, verbatim.
Response sample_webhook(const Context& context, const Request& request) {
  auto provider = parse_provider(request.query.get("provider").value_or(""));
  if (!provider) return control_error(400, "bad_request", "provider must be github or vercel");
  auto body = context.deliveries.sample(*provider);
  if (!body) return control_error(404, "not_found", "no webhook accepted for this provider yet");
  Response response;
  response.body = std::move(*body);
  return response;
}

Response faults_route(const Context& context, const Request& request) {
  if (request.method == "POST") {
    const json patch = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
    if (patch.is_discarded()) return control_error(400, "invalid_json", "body is not valid JSON");
    try {
      context.state.set_faults(apply_patch(context.state.faults(), patch));
    } catch (const std::invalid_argument& error) {
      return control_error(400, "invalid_request", error.what());
    }
  }
  return json_response(200, to_json(context.state.faults()));
}

// Admitted provider requests by resource and list: {"by_resource": {"org-1/repo-1": {...}}}.
Response resource_requests(const Context& context, std::optional<int> installation) {
  json by_resource = json::object();
  for (const auto& [resource, requests] : context.state.resource_requests()) {
    if (installation && *installation != requests.installation) continue;
    by_resource[resource] = requests.by_list;
  }
  return json_response(200, {{"by_resource", by_resource}});
}

}  // namespace

void sleep_ms(int64_t ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

Report build_report(const Context& context, std::optional<int> installation) {
  Report report;
  if (installation) report.installation = DataModel::installation_id(*installation);
  const DeliveryStore::Summary summary = context.deliveries.summarize(installation);
  for (Provider provider : {Provider::kGithub, Provider::kVercel}) {
    const size_t p = provider_index(provider);
    const DeliveryTally& tally = summary.by_provider[p];
    DeliveryCounts counts{tally.received,   tally.unique,     tally.duplicates, 0, 0,
                          tally.unexpected, tally.misdirected};
    for (int i = 1; i <= context.data.installations(); ++i) {
      if (!installation || *installation == i) {
        counts.expected += context.data.expected_count(i, provider);
      }
    }
    counts.missing = counts.expected - tally.matched;
    const std::string name(provider_name(provider));
    report.gateway_by_provider[name] = counts;
    report.event_types_by_provider[name] = summary.event_types[p];
    report.gateway += counts;
  }
  report.invalid_webhooks = summary.invalid;
  report.unexpected_sample = summary.unexpected_sample;
  report.misdirected_sample = summary.misdirected_sample;

  const RequestCounts requests = context.state.request_counts();
  for (int i = 1; i <= context.data.installations(); ++i) {
    if (installation && *installation != i) continue;
    const auto& counts = requests.by_installation[static_cast<size_t>(i - 1)];
    report.provider_requests_by_installation[DataModel::installation_id(i)] = {
        {"github", counts[0]}, {"vercel", counts[1]}};
    if (installation) report.provider_requests = {{"github", counts[0]}, {"vercel", counts[1]}};
  }
  if (!installation) {
    report.provider_requests = {{"github", requests.by_provider[0]},
                                {"vercel", requests.by_provider[1]}};
    report.unauthorized_requests = requests.unauthorized;
  }
  const FaultCounts faults = context.state.fault_counts();
  report.faults_injected = {{"provider_5xx", faults.provider_5xx},
                            {"burst_429", faults.burst_429},
                            {"token_expired", faults.token_expired},
                            {"rate_limited", faults.rate_limited},
                            {"gateway_5xx", faults.gateway_5xx},
                            {"gateway_429", faults.gateway_429},
                            {"resource", faults.resource}};
  return report;
}

nlohmann::json to_json(const Report& report) {
  json by_provider = json::object();
  for (const auto& [name, counts] : report.gateway_by_provider) {
    by_provider[name] = counts_json(counts);
    auto types = report.event_types_by_provider.find(name);
    by_provider[name]["by_event_type"] =
        types == report.event_types_by_provider.end() ? json::object() : json(types->second);
  }
  json gateway = counts_json(report.gateway);
  gateway["invalid"] = report.invalid_webhooks;
  gateway["by_provider"] = by_provider;
  gateway["unexpected_sample"] = report.unexpected_sample;
  gateway["misdirected_sample"] = report.misdirected_sample;
  json requests = report.provider_requests;
  requests["unauthorized"] = report.unauthorized_requests;
  requests["by_installation"] = report.provider_requests_by_installation;
  json out = {{"gateway", gateway},
              {"provider_requests", requests},
              {"faults_injected", report.faults_injected},
              {"complete", report.complete()},
              {"exactly_once", report.exactly_once()}};
  if (report.installation) out["installation"] = *report.installation;
  return out;
}

Response handle_control(const Context& context, const Request& request, Route route) {
  if (route.size() != 1) return control_error(404, "not_found", "no such sandbox route");
  const std::string_view name = route[0];
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool post = request.method == "POST";
  std::optional<int> installation;
  if (auto error = installation_filter(context, request, &installation)) return *error;
  if (name == "health" && get) return json_response(200, {{"status", "ok"}});
  if (name == "report" && get)
    return json_response(200, to_json(build_report(context, installation)));
  if (name == "expected" && get) return expected_ids(context, installation);
  if (name == "missing" && get) return missing_ids(context, request, installation);
  if (name == "requests" && get) return resource_requests(context, installation);
  if (name == "faults" && (get || post)) return faults_route(context, request);
  if (name == "sample-webhook" && get) return sample_webhook(context, request);
  if (name == "reset" && post) {
    context.deliveries.reset();
    context.state.reset();
    return json_response(200, {{"status", "reset"}});
  }
  return control_error(404, "not_found", "no such sandbox route");
}

}  // namespace backhaul::sandbox
