// Header-only C++17: how deeply a JSON text nests, for checking untrusted input before it is
// parsed. The host uses it too (core/common/json_check.h).
#ifndef BACKHAUL_JSON_DEPTH_HPP
#define BACKHAUL_JSON_DEPTH_HPP

#include <cstddef>
#include <string_view>

namespace backhaul::sdk {

// Deeper than any payload of the APIs the bundled connectors read (a few dozen levels at most).
inline constexpr std::size_t kMaxJsonDepth = 256;

// How deeply `text` nests its objects and arrays: the most brackets open at once, outside strings
// ("{}" and "[1]" are 1, a scalar 0). Valid JSON or not. nlohmann parses (and destroys) values
// with a stack of its own, but copies and dumps them recursively: a value nested a million deep
// (a 2 MB body of '[') is read fine and then overflows the call stack at its first copy or dump,
// ending the host (or the worker) with it. Check this first.
inline std::size_t json_depth(std::string_view text) noexcept {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote or a backslash included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > deepest) deepest = depth;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

}  // namespace backhaul::sdk

#endif  // BACKHAUL_JSON_DEPTH_HPP
