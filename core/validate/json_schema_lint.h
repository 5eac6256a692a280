// A structural check of a JSON Schema document (drafts 4 to 2020-12): each known keyword has a
// value of the right kind, subschemas are schemas, patterns compile. Not a validator of instances.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace backhaul::validate {

struct SchemaLint {
  // Each names a JSON Pointer ("/properties/per_page/minimum: must be a number").
  std::vector<std::string> problems;
  // What could not be checked, in the same form: a pattern valid in ECMA-262 (JSON Schema's
  // dialect) that std::regex cannot compile (named groups, lookbehind, \p{...}, large counts).
  std::vector<std::string> notes;
};

// `root_is_config`: the root must also describe an object (a connector config is one).
SchemaLint lint_json_schema(const nlohmann::json& schema, bool root_is_config);

// Why `pattern` is no ECMA-262 regular expression, or nullopt. Reports only what every
// ECMA-262 engine refuses, with the u flag or without it (web browsers' Annex B syntax): an
// unbalanced parenthesis, an unterminated character class, a quantifier with nothing to repeat,
// {n,m} with n > m, and a backslash at the end.
std::optional<std::string> ecma262_syntax_error(std::string_view pattern);

}  // namespace backhaul::validate
