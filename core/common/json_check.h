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
#include <string_view>

namespace backhaul {

bool is_json(std::string_view text);

// How deeply `text` nests its objects and arrays: the most brackets open at once, outside strings
// ("{}" and "[1]" are 1, a scalar 0). Valid JSON or not. nlohmann parses (and destroys) values
// with a stack of its own, but copies and dumps them recursively: a value nested a million deep
// is read fine and then overflows the call stack at its first copy or dump. Check this first.
size_t json_depth(std::string_view text);

// True when `text` is well-formed UTF-8 (RFC 3629), as every JSON string must be.
bool is_utf8(std::string_view text);

}  // namespace backhaul
