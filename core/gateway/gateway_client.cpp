#include "core/gateway/gateway_client.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>

#include <Poco/DateTime.h>
#include <Poco/DateTimeFormat.h>
#include <Poco/DateTimeParser.h>
#include <nlohmann/json.hpp>

#include "core/common/json_check.h"
#include "core/common/redact.h"
#include "core/common/utf8.h"

namespace backhaul::gateway {
namespace {

using nlohmann::json;

std::string url_segment(std::string_view s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

bool is_retryable_status(int status) { return status >= 500 || status == 429 || status == 408; }

json parse_object(const std::string& what, const http::Response& r) {
  json j = json::parse(r.body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    throw GatewayError(what + ": gateway sent a body that is not a JSON object", r.status, true);
  }
  return j;
}

std::string string_field(const json& j, const char* key, const std::string& what) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    throw GatewayError(what + ": gateway response lacks string field '" + key + "'", 200, false);
  }
  return it->get<std::string>();
}

// A request that could not be made (a URL of another scheme, a redirect to where none can go, a
// header value the transport refuses) is no outage: trying it again makes the same request. It
// fails for good rather than counting against the gateway's circuit.
GatewayError request_failed(const http::RequestError& e) {
  return GatewayError(std::string("a gateway request could not be made: ") + e.what(), 0, false);
}

}  // namespace

int64_t retry_after_ms(std::string_view value, int64_t now_ms) {
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front())))
    value.remove_prefix(1);
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back())))
    value.remove_suffix(1);
  if (value.empty()) return 0;
  if (std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    int64_t seconds = 0;
    for (char c : value) seconds = std::min(seconds * 10 + (c - '0'), kMaxRetryAfterS);
    return seconds * 1000;
  }
  Poco::DateTime date;
  int zone = 0;
  if (!Poco::DateTimeParser::tryParse(Poco::DateTimeFormat::HTTP_FORMAT, std::string(value), date,
                                      zone)) {
    return 0;
  }
  const int64_t at_ms = date.timestamp().epochMicroseconds() / 1000 - int64_t{zone} * 1000;
  return std::clamp<int64_t>(at_ms - now_ms, 0, kMaxRetryAfterS * 1000);
}

std::string iso8601_ms(int64_t unix_ms) {
  std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(unix_ms % 1000));
  return buf;
}

GatewayClient::GatewayClient(http::Transport& transport, std::string base_url,
                             std::optional<std::string> api_key, const Clock& clock,
                             std::chrono::milliseconds timeout)
    : transport_(transport),
      base_url_(std::move(base_url)),
      api_key_(std::move(api_key)),
      clock_(clock),
      timeout_(timeout) {
  while (!base_url_.empty() && base_url_.back() == '/') base_url_.pop_back();
}

http::Response GatewayClient::get(const std::string& path) const {
  http::Request r;
  r.url = base_url_ + path;
  r.timeout = timeout_;
  r.headers.emplace_back("Accept", "application/json");
  if (api_key_) r.headers.emplace_back("X-Api-Key", *api_key_);
  try {
    return http::send(transport_, std::move(r));
  } catch (const http::RequestError& e) {
    throw request_failed(e);
  } catch (const std::exception& e) {
    throw GatewayError(std::string("gateway unreachable: ") + e.what(), 0, true);
  }
}

void GatewayClient::fail(const std::string& what, const http::Response& r) const {
  // The start of the body says why, for a refusal; redacted, as an answer of the token endpoint
  // may hold a token.
  std::string body = redact(r.body.substr(0, 300));
  const std::optional<std::string_view> retry_after = r.header("retry-after");
  throw GatewayError(
      what + ": gateway answered " + std::to_string(r.status) + (body.empty() ? "" : ": " + body),
      r.status, is_retryable_status(r.status),
      retry_after ? retry_after_ms(*retry_after, clock_.now_ms()) : 0);
}

Connection GatewayClient::connection(std::string_view connection_id) const {
  const std::string what = "get connection " + std::string(connection_id);
  http::Response r = get("/connections/" + url_segment(connection_id));
  if (r.status < 200 || r.status > 299) fail(what, r);
  json j = parse_object(what, r);
  Connection c;
  c.id = string_field(j, "id", what);
  c.installation_id = string_field(j, "installationId", what);
  c.provider = string_field(j, "provider", what);
  c.org_id = string_field(j, "orgId", what);
  c.status = string_field(j, "status", what);
  // An item that names no resource is left out and said why, rather than skipped unsaid (a
  // non-object), failing the whole lookup (an object without providerResourceId) or becoming a
  // unit that can only fail (an empty id): the other resources are still backfilled.
  const auto got = [](const json& v) {
    const std::string text = v.dump();
    return " (got " + (text.size() > 100 ? cut_utf8(text, 100) + "..." : text) + ")";
  };
  auto resources = j.find("resources");
  if (resources != j.end() && !resources->is_null() && !resources->is_array()) {
    c.unusable_resources.push_back("resources: not an array" + got(*resources));
  } else if (resources != j.end() && resources->is_array()) {
    for (size_t i = 0; i < resources->size(); ++i) {
      const json& item = (*resources)[i];
      const std::string at = "resources[" + std::to_string(i) + "]: ";
      auto id = item.is_object() ? item.find("providerResourceId") : item.end();
      if (!item.is_object()) {
        c.unusable_resources.push_back(at + "not an object" + got(item));
      } else if (id == item.end() || !id->is_string() ||
                 id->get_ref<const std::string&>().empty()) {
        c.unusable_resources.push_back(at + "providerResourceId is not a non-empty string" +
                                       got(item));
      } else {
        Resource res;
        res.id = id->get<std::string>();
        auto name = item.find("resourceName");
        if (name != item.end() && name->is_string()) res.name = name->get<std::string>();
        c.resources.push_back(std::move(res));
      }
    }
  }
  return c;
}

std::string GatewayClient::access_token(std::string_view connection_id) const {
  const std::string what = "get token for connection " + std::string(connection_id);
  http::Response r = get("/connections/" + url_segment(connection_id) + "/token");
  if (r.status < 200 || r.status > 299) fail(what, r);
  std::string token = string_field(parse_object(what, r), "accessToken", what);
  // It goes into each provider request's Authorization header, where an empty one, or one with a
  // line break (a vault's trailing newline, say), would be refused for a reason naming no gateway.
  if (token.empty() || has_control_character(token) || token.find(' ') != std::string::npos) {
    throw GatewayError(what + ": the gateway's token is unusable: it is " +
                           (token.empty() ? "empty" : "not one word of printable characters"),
                       r.status, false);
  }
  return token;
}

std::string GatewayClient::delivery_body(const Delivery& d) const {
  // Built by hand so the payload is embedded verbatim, without a parse and re-serialisation.
  std::string body;
  body.reserve(d.payload_json.size() + 256);
  body += R"({"connectionId":)";
  body += json(d.connection_id).dump();
  body += R"(,"orgId":)";
  body += json(d.org_id).dump();
  body += R"(,"deliveryId":)";
  body += json(d.delivery_id).dump();
  body += R"(,"eventType":)";
  body += json(d.event_type).dump();
  body += R"(,"payload":)";
  body += d.payload_json;
  body += R"(,"receivedAt":)";  // epoch ms, as seed 000 sends Date.now()
  body += std::to_string(clock_.now_ms());
  body += "}";
  return body;
}

http::Request GatewayClient::delivery_request(std::string_view provider,
                                              const Delivery& delivery) const {
  if (!is_json(delivery.payload_json)) {
    throw GatewayError(
        "delivery " + std::string(delivery.delivery_id) + ": payload is not valid JSON", 0, false);
  }
  http::Request r;
  r.method = "POST";
  r.url = base_url_ + "/webhooks/" + url_segment(provider);
  r.timeout = timeout_;
  r.headers.emplace_back("Content-Type", "application/json");
  if (api_key_) r.headers.emplace_back("X-Api-Key", *api_key_);
  r.body = delivery_body(delivery);
  return r;
}

DispatchResult GatewayClient::interpret(const Delivery& delivery,
                                        const http::Response& response) const {
  if (response.status >= 200 && response.status < 300) {
    // Accepted unless the body says "duplicate"; a body of another shape (a status that is a
    // number, say) is no reason to deliver again.
    const json j = json::parse(response.body, nullptr, false);
    if (!j.is_object()) return DispatchResult::kAccepted;
    const auto status = j.find("status");
    return status != j.end() && status->is_string() && *status == "duplicate"
               ? DispatchResult::kDuplicate
               : DispatchResult::kAccepted;
  }
  fail("dispatch " + std::string(delivery.delivery_id), response);
}

DispatchResult GatewayClient::dispatch(std::string_view provider, const Delivery& delivery) const {
  http::Request r = delivery_request(provider, delivery);
  http::Response response;
  try {
    response = transport_.perform(r);  // as dispatch_batch: no redirects
  } catch (const http::RequestError& e) {
    throw request_failed(e);
  } catch (const std::exception& e) {
    throw GatewayError(std::string("gateway unreachable: ") + e.what(), 0, true);
  }
  return interpret(delivery, response);
}

std::vector<GatewayClient::Outcome> GatewayClient::dispatch_batch(
    std::string_view provider, const std::vector<Delivery>& deliveries) const {
  std::vector<Outcome> outcomes(deliveries.size());
  std::vector<http::Request> requests;
  std::vector<size_t> sent;  // index of each request's delivery
  for (size_t i = 0; i < deliveries.size(); ++i) {
    try {
      requests.push_back(delivery_request(provider, deliveries[i]));
      sent.push_back(i);
    } catch (const GatewayError& e) {
      outcomes[i].error = e;
    }
  }
  std::vector<http::BatchResult> results = transport_.perform_batch(requests);
  for (size_t k = 0; k < results.size(); ++k) {
    Outcome& outcome = outcomes[sent[k]];
    if (!results[k].response) {
      outcome.error = GatewayError("gateway unreachable: " + results[k].error, 0, true);
      continue;
    }
    try {
      outcome.result = interpret(deliveries[sent[k]], *results[k].response);
    } catch (const GatewayError& e) {
      outcome.error = e;
    }
  }
  return outcomes;
}

}  // namespace backhaul::gateway
