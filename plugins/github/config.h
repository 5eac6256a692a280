// The GitHub connector's configuration: parsed once per instance, immutable afterwards.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace backhaul::github {

struct Config {
  std::string base_url = "https://api.github.com";  // no trailing slash
  std::string user_agent = "backhaul-github/1.0";
  int per_page = 100;
  uint32_t timeout_ms = 30'000;
};

// Parses a config document (a JSON object; empty text means "all defaults"). Throws
// backhaul::sdk::Error(BACKHAUL_INVALID_ARGUMENT) naming the offending key or field. Shared by
// validate_config() and the constructor, so both accept exactly the same documents, which are the
// documents kConfigSchemaJson describes. [thread-safe]
Config parse_config(std::string_view config_json);

// JSON Schema (draft 2020-12) of the document parse_config() accepts; a copy is installed as
// schemas/connectors/github.schema.json (a test keeps the two equal).
extern const char kConfigSchemaJson[];

}  // namespace backhaul::github
