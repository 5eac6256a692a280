// A JSON syntax check without building anything: true when `text` is exactly one JSON value
// (RFC 8259) with optional surrounding whitespace, every string well-formed UTF-8 with valid
// escapes and paired surrogates. It allocates nothing but the nesting stack and runs at memory
// speed; the pipeline checks every event payload with it before embedding the payload verbatim
// in a webhook body (an unchecked payload could close the envelope and add fields of its own).
//
// Same verdicts as nlohmann::json::accept() except for numbers too large for a double
// ("1e400"), which RFC 8259 allows and this accepts.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "backhaul/json_depth.hpp"

namespace backhaul {

bool is_json(std::string_view text);

// How deeply `text` nests its objects and arrays (the SDK's, which plugins use on the bodies
// they read). Check it before parsing anything untrusted.
using sdk::json_depth;

// "nests N levels deep, more than `max_depth`" when `text` nests deeper than that (json_depth),
// else nullopt: the reason to refuse untrusted text before parsing it.
std::optional<std::string> depth_problem(std::string_view text,
                                         size_t max_depth = sdk::kMaxJsonDepth);

// True when `text` is well-formed UTF-8 (RFC 3629), as every JSON string must be.
bool is_utf8(std::string_view text);

}  // namespace backhaul
