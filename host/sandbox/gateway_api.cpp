// The fake ingest gateway under /gateway: connections, access tokens for them, and the webhook
// endpoint a backfill delivers to (deduplicated by deliveryId).
#include <string>

#include "host/sandbox/apis.h"

namespace backhaul::sandbox {
namespace {

using nlohmann::json;

Response gateway_error(int status, std::string_view code, const std::string& message) {
  return json_response(status, {{"error", {{"code", code}, {"message", message}}}});
}

Response invalid_field(std::string_view field, const std::string& message) {
  return json_response(
      400, {{"error", {{"code", "invalid_request"}, {"message", message}, {"field", field}}}});
}

// "gh-inst-1" / "vc-inst-1", or a bare installation id with ?provider=github|vercel.
std::optional<Connection> find_connection(const Context& context, const Request& request,
                                          std::string_view id) {
  if (auto connection = context.data.find_connection(id)) return connection;
  auto installation = context.data.parse_installation_id(id);
  auto provider = parse_provider(request.query.get("provider").value_or(""));
  if (!installation || !provider) return std::nullopt;
  return Connection{*installation, *provider};
}

// Checks the webhook body; fills `hook` or returns the 400 to send, naming the field.
std::optional<Response> parse_webhook(const std::string& text, Webhook* hook) {
  const json body = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return gateway_error(400, "invalid_json", "body is not valid JSON");
  if (!body.is_object()) return gateway_error(400, "invalid_json", "body must be a JSON object");
  const std::pair<const char*, std::string*> strings[] = {{"connectionId", &hook->connection_id},
                                                          {"orgId", &hook->org_id},
                                                          {"deliveryId", &hook->delivery_id},
                                                          {"eventType", &hook->event_type}};
  for (const auto& [field, target] : strings) {
    auto it = body.find(field);
    if (it == body.end())
      return invalid_field(field, std::string("missing required field ") + field);
    if (!it->is_string() || it->get_ref<const std::string&>().empty()) {
      return invalid_field(field, std::string(field) + " must be a non-empty string");
    }
    *target = it->get<std::string>();
  }
  auto payload = body.find("payload");
  if (payload == body.end()) return invalid_field("payload", "missing required field payload");
  if (!payload->is_object()) return invalid_field("payload", "payload must be a JSON object");
  auto received_at = body.find("receivedAt");
  if (received_at == body.end()) {
    return invalid_field("receivedAt", "missing required field receivedAt");
  }
  const bool iso = received_at->is_string() &&
                   parse_iso8601(received_at->get_ref<const std::string&>()).has_value();
  if (!iso && !received_at->is_number()) {
    return invalid_field("receivedAt", "receivedAt must be an ISO 8601 string or epoch ms");
  }
  return std::nullopt;
}

Response receive_webhook(const Context& context, const Request& request,
                         std::string_view provider_name) {
  auto provider = parse_provider(provider_name);
  if (!provider) {
    return gateway_error(404, "not_found", "unknown provider " + std::string(provider_name));
  }
  if (const ProviderState::GatewayFault fault = context.state.gateway_fault();
      fault.status == 503) {
    return gateway_error(503, "service_unavailable", "injected gateway failure");
  } else if (fault.status == 429) {
    Response busy = gateway_error(429, "rate_limited", "injected gateway busy period");
    busy.add_header("retry-after", std::to_string(fault.retry_after_s));
    return busy;
  }
  Webhook hook;
  if (auto error = parse_webhook(request.body, &hook)) {
    context.deliveries.count_invalid();
    return *error;
  }
  if (context.deliveries.record(*provider, hook) == DeliveryStore::Outcome::kDuplicate) {
    return json_response(200, {{"status", "duplicate"}, {"deliveryId", hook.delivery_id}});
  }
  context.deliveries.keep_sample(*provider, request.body);
  return json_response(202, {{"status", "accepted"}, {"deliveryId", hook.delivery_id}});
}

Response connection_route(const Context& context, const Request& request, Route route) {
  if (request.method != "GET" && !(route.size() == 3 && request.method == "POST")) {
    return gateway_error(405, "method_not_allowed", "method not allowed");
  }
  auto connection = find_connection(context, request, route[1]);
  if (!connection) {
    return gateway_error(404, "not_found", "connection " + std::string(route[1]) + " not found");
  }
  if (route.size() == 2) return json_response(200, context.data.connection_json(*connection));
  const IssuedToken token = context.state.issue_token(*connection);
  return json_response(
      200, {{"accessToken", token.token}, {"expiresAt", format_iso8601(token.expires_at_ms)}});
}

}  // namespace

Response handle_gateway(const Context& context, const Request& request, Route route) {
  const std::string& api_key = context.options.gateway_api_key;
  if (!api_key.empty()) {
    const std::string* presented = request.header("x-api-key");
    if (!presented || *presented != api_key) {
      return gateway_error(401, "unauthorized", "missing or invalid X-Api-Key");
    }
  }
  if (route.size() == 2 && route[0] == "webhooks") {
    if (request.method != "POST") {
      return gateway_error(405, "method_not_allowed", "use POST");
    }
    return receive_webhook(context, request, route[1]);
  }
  const bool is_connection = route.size() == 2 && route[0] == "connections";
  const bool is_token = route.size() == 3 && route[0] == "connections" && route[2] == "token";
  if (is_connection || is_token) return connection_route(context, request, route);
  return gateway_error(404, "not_found", "no such gateway route");
}

}  // namespace backhaul::sandbox
