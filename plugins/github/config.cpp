#include "config.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "backhaul/connector.hpp"

#include "url.h"

namespace backhaul::github {

// Kept in step with parse_config() below and with schemas/connectors/github.schema.json.
const char kConfigSchemaJson[] = R"json({
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "GitHub connector configuration",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "base_url": {
      "description": "REST API root, e.g. https://api.github.com or https://ghe.example.com/api/v3 (a trailing slash is ignored)",
      "type": "string",
      "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^/?#\\s]+[^?#\\s]*$",
      "default": "https://api.github.com"
    },
    "user_agent": {
      "description": "User-Agent header sent with every request (GitHub rejects requests without one)",
      "type": "string",
      "minLength": 1,
      "default": "backhaul-github/1.0"
    },
    "per_page": {
      "description": "Items requested per page (GitHub caps it at 100)",
      "type": "integer",
      "minimum": 1,
      "maximum": 100,
      "default": 100
    },
    "timeout_ms": {
      "description": "Whole-request timeout in milliseconds",
      "type": "integer",
      "minimum": 1,
      "maximum": 4294967295,
      "default": 30000
    }
  }
})json";

namespace {

using nlohmann::json;

[[noreturn]] void fail(const std::string& message) {
  throw sdk::Error(BACKHAUL_INVALID_ARGUMENT, "github config: " + message);
}

// The value as an integer within [min, max], or nullopt (floats and booleans are not integers).
std::optional<int64_t> integer_in(const json& value, int64_t min, int64_t max) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();  // json::parse stores every n >= 0 as unsigned
    if (u < static_cast<uint64_t>(std::max<int64_t>(min, 0)) || u > static_cast<uint64_t>(max)) {
      return std::nullopt;
    }
    return static_cast<int64_t>(u);
  }
  const auto i = value.get<int64_t>();
  if (i < min || i > max) return std::nullopt;
  return i;
}

// Accepts an absolute http(s) URL without query or fragment; drops trailing slashes so that
// "{base}/repos/..." never contains "//" (GitHub answers 404 to a doubled or trailing slash).
std::string parse_base_url(const json& value) {
  if (!value.is_string()) fail("base_url must be a string");
  std::string url = value.get<std::string>();
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (!http_origin(url) || url.find_first_of("?# \t\r\n") != std::string::npos) {
    fail("base_url must be an absolute http:// or https:// URL without query or fragment");
  }
  return url;
}

std::string parse_user_agent(const json& value) {
  if (!value.is_string() || value.get_ref<const std::string&>().empty()) {
    fail("user_agent must be a non-empty string");
  }
  const auto& agent = value.get_ref<const std::string&>();
  if (agent.find_first_of("\r\n") != std::string::npos) fail("user_agent must be a single line");
  return agent;
}

}  // namespace

Config parse_config(std::string_view config_json) {
  if (config_json.find_first_not_of(" \t\r\n") == std::string_view::npos) return Config{};

  json doc;
  try {
    doc = json::parse(config_json.data(), config_json.data() + config_json.size());
  } catch (const json::parse_error& e) {
    fail(std::string("not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) fail("must be a JSON object");

  Config config;
  for (const auto& [key, value] : doc.items()) {
    if (key == "base_url") {
      config.base_url = parse_base_url(value);
    } else if (key == "user_agent") {
      config.user_agent = parse_user_agent(value);
    } else if (key == "per_page") {
      const auto n = integer_in(value, 1, 100);
      if (!n) fail("per_page must be an integer from 1 to 100");
      config.per_page = static_cast<int>(*n);
    } else if (key == "timeout_ms") {
      const auto n = integer_in(value, 1, std::numeric_limits<uint32_t>::max());
      if (!n) fail("timeout_ms must be an integer from 1 to 4294967295");
      config.timeout_ms = static_cast<uint32_t>(*n);
    } else {
      // dump() quotes and escapes the key, so odd characters cannot garble the message.
      fail("unknown key " + json(key).dump(-1, ' ', false, json::error_handler_t::replace));
    }
  }
  return config;
}

}  // namespace backhaul::github
