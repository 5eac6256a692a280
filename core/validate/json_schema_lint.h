// A structural check of a JSON Schema document (drafts 4 to 2020-12): each known keyword has a
// value of the right kind, subschemas are schemas, patterns compile. Not a validator of instances.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace backhaul::validate {

// Problems found, each naming a JSON Pointer ("/properties/per_page/minimum: must be a number").
// `root_is_config`: the root must also describe an object (a connector config is one).
std::vector<std::string> lint_json_schema(const nlohmann::json& schema, bool root_is_config);

}  // namespace backhaul::validate
