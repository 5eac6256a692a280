#include "core/common/strict_json.h"

#include <optional>
#include <regex>
#include <set>
#include <vector>

#include "core/common/json_check.h"

namespace backhaul {
namespace {

// nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 6: syntax error while
// parsing value - invalid literal; last read: '"a":x'" without its prefix and the text it last
// read.
std::string syntax_problem(const nlohmann::json::parse_error& e) {
  std::string what = e.what();
  if (const size_t at = what.find(": syntax error"); at != std::string::npos) {
    what = what.substr(at + 2);
  }
  // What it last read ends where "'; expected <token>" begins, if that is how the message ends:
  // the last such marker, and only with one of the lexer's token names after it (input holding
  // "'; expected x" must not have its tail kept).
  const std::string read = "; last read: '";
  if (const size_t from = what.find(read); from != std::string::npos) {
    const size_t expected = what.rfind("'; expected ");
    const bool token_follows =
        expected != std::string::npos && expected >= from + read.size() &&
        std::regex_match(
            what.substr(expected + 12),
            std::regex(R"((end of input|'.'|[a-z ]+ literal|'\[', '\{', or a literal))"));
    what.erase(from, token_follows ? expected + 1 - from : std::string::npos);
  }
  return what;
}

// Where nlohmann stops reading `text` (the byte, counted from 1, of the last one it read before it
// gave up), from its SAX parser: the exceptions of its DOM parser, but parse_error's, say no place.
class FailurePlace final : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::json::exception&) override {
    byte = position;
    return false;
  }

  std::optional<size_t> byte;
};

// The text of a JsonTextError for nlohmann's exception `e` other than a parse_error, thrown
// parsing `text`: a number past what a double holds ("1e999", out_of_range.406) is the one its
// parser throws. Its what() quotes the text it read, so it is not passed on.
std::string other_problem(std::string_view text, const nlohmann::json::exception& e) {
  FailurePlace place;
  nlohmann::json::sax_parse(text, &place);
  const std::string where = place.byte ? " at byte " + std::to_string(*place.byte) : "";
  if (e.id == 406) return "number out of range" + where + ": a double holds up to about 1.8e308";
  return "not valid JSON" + where + ": nlohmann error " + std::to_string(e.id);
}

}  // namespace

nlohmann::json parse_strict_json(std::string_view text, size_t max_depth) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
    throw JsonTextError("empty: a JSON value is required");
  }
  if (auto problem = depth_problem(text, max_depth)) throw JsonTextError(*problem);
  std::vector<std::set<std::string>> keys;  // of each object open, the innermost last
  std::optional<std::string> repeated;
  const nlohmann::json::parser_callback_t check = [&](int, nlohmann::json::parse_event_t event,
                                                      nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      keys.emplace_back();
    } else if (event == Event::object_end) {
      keys.pop_back();
    } else if (event == Event::key && !keys.back().insert(parsed.get<std::string>()).second &&
               !repeated) {
      repeated = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text, check);
  } catch (const nlohmann::json::parse_error& e) {
    throw JsonTextError("not valid JSON at byte " + std::to_string(e.byte) + ": " +
                        syntax_problem(e));
  } catch (const nlohmann::json::exception& e) {
    // Not a parse_error (a number that overflows a double): a 500 of every API route reading a
    // body, and an uncaught exception of a config's check, before this.
    throw JsonTextError(other_problem(text, e));
  }
  if (repeated) {
    throw JsonTextError("an object holds the key " + nlohmann::json(*repeated).dump() + " twice");
  }
  return value;
}

}  // namespace backhaul
