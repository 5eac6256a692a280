// Parsing JSON that people send (an API body, a config file) so that mistakes are named, not
// guessed around: nlohmann reports a syntax error with the input it last read (which may be
// anything, a secret among it), and takes an object that names a key twice, keeping the last
// value, so {"depth": 7, "depth": 30} reads as 30 without a word.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "backhaul/json_depth.hpp"

namespace backhaul {

// Thrown by parse_strict_json(); what() says what is wrong and where, and quotes none of the text
// but a repeated key's name (escaped).
class JsonTextError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses `text` as one JSON value. Throws JsonTextError for text that is empty or not JSON
// ("not valid JSON at byte 6: syntax error while parsing value - invalid literal"), for a number
// past what a double holds ("number out of range at byte 5: ..." of 1e999), for an object that
// holds a key twice ("an object holds the key \"depth\" twice"), and, before any parsing, for
// arrays and objects nested more than `max_depth` deep ("nests 300001 levels deep, more than
// 64"): copying or dumping a value recurses once per level (json_depth).
nlohmann::json parse_strict_json(std::string_view text, size_t max_depth = sdk::kMaxJsonDepth);

}  // namespace backhaul
