// A connector for a made-up ticketing API, as a starting point for your own: rename it, point it at
// your provider, keep the shape. It shows what every connector does:
//   - reads and checks its config (validate_config, and the constructor);
//   - checks that a unit's token can read its resource (validate_scopes);
//   - fetches one page per call through the host's HTTP (fetch_page), with an opaque cursor for
//     the next page, and one event per item under a delivery id that is the same on every run;
//   - maps the provider's answers to statuses: 401 AUTH_EXPIRED, rate limits RATE_LIMITED with the
//     time to wait, 5xx and network errors RETRYABLE, the rest FATAL.
// The API: GET {base_url}/v1/resources/{id} (the resource), and
// GET {base_url}/v1/resources/{id}/{tickets|notes}?limit=N[&page=P], answering
// {"items": [{"id": 1, ...}, ...], "next_page": 2} (no next_page on the last page).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <backhaul/connector.hpp>

namespace {

namespace sdk = backhaul::sdk;
using nlohmann::json;
using sdk::Error;

struct Config {
  std::string base_url = "https://tickets.example.com";
  int page_size = 50;
};

// The config the host hands create() and validate_config(): the object the operator wrote under
// plugins.connectors.tickets. Unknown keys are refused, naming them.
Config parse_config(std::string_view text) {
  Config config;
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return config;
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) throw Error(BACKHAUL_INVALID_ARGUMENT, "tickets: config is no JSON object");
  for (const auto& [key, value] : doc.items()) {
    if (key == "base_url" && value.is_string()) {
      config.base_url = value.get<std::string>();
    } else if (key == "page_size" && value.is_number_unsigned() && value.get<uint64_t>() >= 1 &&
               value.get<uint64_t>() <= 100) {
      config.page_size = value.get<int>();
    } else {
      throw Error(BACKHAUL_INVALID_ARGUMENT,
                  "tickets: config key \"" + key + "\" is unknown or " +
                      "out of range (base_url: a string, page_size: " + "1 to 100)");
    }
  }
  return config;
}

std::optional<int64_t> header_number(const sdk::HttpResponse& response, std::string_view name) {
  const std::optional<std::string_view> value = response.header(name);
  if (!value || value->empty() || value->size() > 18 ||
      value->find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  return std::stoll(std::string(*value));
}

// The status of an answer that is not a success.
[[noreturn]] void fail_for(const sdk::HttpResponse& response, const std::string& request) {
  const int status = response.status();
  const std::string message = "tickets: HTTP " + std::to_string(status) + " for " + request;
  if (status == 401) throw Error(BACKHAUL_AUTH_EXPIRED, message);
  if (status == 403 || status == 429) {
    const std::optional<int64_t> remaining = header_number(response, "x-ratelimit-remaining");
    const std::optional<int64_t> reset = header_number(response, "x-ratelimit-reset");
    if (remaining == 0 && reset) {  // wait for the reset (epoch seconds), a second more
      const int64_t wait = *reset * 1000 - sdk::Host::now_ms();
      throw Error(BACKHAUL_RATE_LIMITED, message, (wait > 0 ? wait : 0) + 1000);
    }
    if (const std::optional<int64_t> seconds = header_number(response, "retry-after"))
      throw Error(BACKHAUL_RATE_LIMITED, message, *seconds * 1000);
    if (status == 429) throw Error(BACKHAUL_RATE_LIMITED, message, 60'000);
    throw Error(BACKHAUL_FATAL, message + " (the token may not read this resource)");
  }
  if (status >= 500) throw Error(BACKHAUL_RETRYABLE, message);
  throw Error(BACKHAUL_FATAL, message);
}

sdk::HttpResponse get(const std::string& url, std::string_view token) {
  sdk::HttpRequest request;
  request.url = url;
  request.headers = {{"Authorization", "Bearer " + std::string(token)},
                     {"Accept", "application/json"}};
  request.timeout_ms = 30'000;
  try {
    sdk::HttpResponse response = sdk::Host::http(request);
    if (response.status() < 200 || response.status() >= 300) fail_for(response, "GET " + url);
    return response;
  } catch (const sdk::HostError& e) {  // refused, reset, timed out: no answer at all
    throw Error(BACKHAUL_RETRYABLE, "tickets: GET " + url + " failed: " + e.what());
  }
}

// The cursor is this connector's own text; the host stores it and hands it back unread.
int page_of(const std::optional<std::string_view>& cursor) {
  if (!cursor) return 1;
  const std::string_view digits = cursor->substr(cursor->rfind(':') + 1);
  if (cursor->substr(0, 5) != "page:" || digits.empty() || digits.size() > 9 ||
      digits.find_first_not_of("0123456789") != std::string_view::npos)
    throw Error(BACKHAUL_INVALID_ARGUMENT,
                "tickets: cursor \"" + std::string(*cursor) + "\" is not one of this connector's");
  return std::stoi(std::string(digits));
}

class TicketsConnector final : public sdk::Connector {
 public:
  explicit TicketsConnector(std::string_view config_json) : config_(parse_config(config_json)) {}

  static void validate_config(std::string_view config_json) { parse_config(config_json); }

  void validate_scopes(const sdk::Unit& unit) override {
    get(resource_url(unit), unit.access_token);
  }

  // Called for many units at once: everything per call lives on the stack.
  sdk::Page fetch_page(const sdk::FetchRequest& request) override {
    if (request.entity_type != "ticket" && request.entity_type != "note")
      throw Error(BACKHAUL_INVALID_ARGUMENT,
                  "tickets: unknown entity type \"" + std::string(request.entity_type) + "\"");
    const int page = page_of(request.cursor);
    std::string url = resource_url(request.unit) + "/" + std::string(request.entity_type) +
                      "s?limit=" + std::to_string(config_.page_size);
    if (page > 1) url += "&page=" + std::to_string(page);

    const sdk::HttpResponse response = get(url, request.unit.access_token);
    const json doc = json::parse(response.body(), nullptr, /*allow_exceptions=*/false);
    if (!doc.is_object() || !doc.contains("items") || !doc["items"].is_array())
      throw Error(BACKHAUL_RETRYABLE, "tickets: GET " + url + " answered no {\"items\": [...]}");

    sdk::Page out;
    out.raw_count = doc["items"].size();
    for (const json& item : doc["items"]) {
      if (!item.is_object() || !item.contains("id"))
        throw Error(BACKHAUL_RETRYABLE, "tickets: GET " + url + " answered an item without id");
      // The same item gets the same delivery id on every run, so the gateway drops repeats; the
      // resource id keeps two resources' items apart.
      const std::string delivery_id = "backfill-" + std::string(request.unit.installation_id) +
                                      "-" + std::string(request.unit.resource_id) + "-" +
                                      std::string(request.entity_type) + "-" + item["id"].dump();
      const json payload = {{"action", "backfill"},
                            {"entity", request.entity_type},
                            {"item", item},
                            {"resource", {{"id", request.unit.resource_id}}}};
      out.events.push_back({delivery_id, std::string(request.entity_type), payload.dump()});
    }
    if (const auto next = doc.find("next_page"); next != doc.end() && next->is_number_unsigned())
      out.next_cursor = "page:" + next->dump();
    const std::optional<int64_t> remaining = header_number(response, "x-ratelimit-remaining");
    const std::optional<int64_t> limit = header_number(response, "x-ratelimit-limit");
    const std::optional<int64_t> reset = header_number(response, "x-ratelimit-reset");
    if (remaining && limit && reset)  // lets the host wait for the reset before the limit is hit
      out.rate_limit = sdk::RateLimit{*remaining, *limit, *reset * 1000};
    return out;
  }

 private:
  std::string resource_url(const sdk::Unit& unit) const {
    return config_.base_url + "/v1/resources/" + std::string(unit.resource_id);
  }

  const Config config_;
};

const char* const kEntityTypes[] = {"ticket", "note"};
const char* const kDefaultEntityTypes[] = {"ticket"};

const backhaul_descriptor_t kDescriptor = {
    sizeof(backhaul_descriptor_t),
    "tickets",
    "0.1.0",
    "Tickets",
    "Tickets and notes from a made-up ticketing API (the connector template).",
    kEntityTypes,
    2,
    kDefaultEntityTypes,
    1,
    R"({"type":"object","additionalProperties":false,"properties":{)"
    R"("base_url":{"type":"string"},"page_size":{"type":"integer","minimum":1,"maximum":100}}})"};

}  // namespace

BACKHAUL_DEFINE_CONNECTOR(TicketsConnector, kDescriptor);
