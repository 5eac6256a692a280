// A validator of JSON values against the subset of JSON Schema that schemas/config.schema.json
// uses: type, properties, required, additionalProperties (false or a schema), enum, minimum,
// maximum, minLength, pattern, items, and local "$ref": "#/$defs/<name>". Other keywords are
// ignored. Not a general validator; core/validate/json_schema_lint.h checks schemas themselves.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace backhaul::daemon {

struct SchemaViolation {
  std::string path;     // "scheduler.workers", "plugins.directories[0]"; "" for the root
  std::string message;  // "must be an integer >= 1 (got \"eight\")"
};

// Every violation; properties are visited in name order. `schema` must be the root
// document (for $ref). Throws std::invalid_argument for a $ref that does not resolve.
std::vector<SchemaViolation> validate_json(const nlohmann::json& schema,
                                           const nlohmann::json& value);

}  // namespace backhaul::daemon
