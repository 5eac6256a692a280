// parse_strict_json (core/common/strict_json.h): what it refuses, and that its messages name the
// problem and its place without quoting the text; and Error keeping a NUL of its message.
#include "core/common/strict_json.h"

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/common/errors.h"

namespace backhaul {
namespace {

std::string problem(std::string_view text) {
  try {
    parse_strict_json(text);
  } catch (const JsonTextError& e) {
    return e.what();
  }
  return "taken";
}

TEST(StrictJsonTest, ValidJsonIsParsedAsNlohmannParsesIt) {
  EXPECT_EQ(parse_strict_json(R"({"a": [1, {"b": null}], "c": "\u00e9"})"),
            nlohmann::json::parse(R"({"a": [1, {"b": null}], "c": "\u00e9"})"));
  EXPECT_EQ(parse_strict_json(" 7 "), 7);
  // The same key in different objects is no repeat, nor are objects side by side in an array.
  EXPECT_EQ(parse_strict_json(R"({"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]})")["b"][1]["a"], 2);
}

// {"depth": 7, "depth": 30} read as 30 (the last wins), without a word.
TEST(StrictJsonTest, AKeyTwiceInOneObjectIsRefusedNamingIt) {
  EXPECT_EQ(problem(R"({"depth": 7, "depth": 30})"), R"(an object holds the key "depth" twice)");
  EXPECT_EQ(problem(R"({"a": {"x": 1, "y": 2, "x": 3}})"), R"(an object holds the key "x" twice)");
  EXPECT_EQ(problem(R"([{"k": 1}, {"k\u0001": 1, "k\u0001": 2}])"),
            R"(an object holds the key "k\u0001" twice)")
      << "escaped";
}

// The syntax errors say where and what, not the text last read ("last read: '...'"), which may be
// anything, a secret among it.
TEST(StrictJsonTest, ASyntaxErrorSaysWhereAndWhatWithoutQuotingTheText) {
  EXPECT_EQ(problem(R"({"token":"s3cret" x})"),
            "not valid JSON at byte 19: syntax error while parsing object - invalid literal; "
            "expected '}'");
  EXPECT_EQ(problem(R"({"a":x})"),
            "not valid JSON at byte 6: syntax error while parsing value - invalid literal");
  EXPECT_EQ(problem(R"({"a":1} x)"),
            "not valid JSON at byte 9: syntax error while parsing value - invalid literal; "
            "expected end of input");
  EXPECT_EQ(problem("\"gh-\xff\""),
            "not valid JSON at byte 5: syntax error while parsing value - invalid string: "
            "ill-formed UTF-8 byte");
  EXPECT_EQ(problem(R"({"a":1,})"),
            "not valid JSON at byte 8: syntax error while parsing object key - unexpected '}'; "
            "expected string literal");
  for (const std::string_view empty : {"", "  \n"}) {
    EXPECT_EQ(problem(empty), "empty: a JSON value is required");
  }
  // Input that holds nlohmann's own marker does not get its tail through (it did, from a review).
  EXPECT_EQ(problem(R"({"password":"s3cret'; expected zz)"),
            "not valid JSON at byte 34: syntax error while parsing value - invalid string: "
            "missing closing quote");
  for (const std::string_view text :
       {R"({"token":"s3cret" x})", R"({"s3cret":})", R"({"password":"s3cret'; expected zz)"}) {
    EXPECT_EQ(problem(text).find("s3cret"), std::string::npos) << problem(text);
  }
}

// A number past what a double holds is no parse_error to nlohmann but an out_of_range.406, which
// got past the catch: every API route reading a body answered 500, and a config file holding one
// ended `backhauld --check-config` with an uncaught exception (SIGABRT). It is refused as any
// other bad text is, with its place and without the number (nlohmann's what() quotes it).
TEST(StrictJsonTest, ANumberTooLargeForADoubleIsRefusedSayingWhere) {
  EXPECT_EQ(problem("1e999"), "number out of range at byte 5: a double holds up to about 1.8e308");
  EXPECT_EQ(problem(R"({"throttlePerHour":1e999})"),
            "number out of range at byte 24: a double holds up to about 1.8e308");
  EXPECT_EQ(problem(R"({"a":[1, -2.5e400]})"),
            "number out of range at byte 17: a double holds up to about 1.8e308")
      << "negative";
  // One too small to tell from 0 reads as 0, as nlohmann reads it: no value is lost that a
  // double could hold. An integer past 64 bits is a double.
  EXPECT_EQ(parse_strict_json("1e-999"), 0.0);
  EXPECT_EQ(parse_strict_json("123456789012345678901234567890"), 1.2345678901234568e29);
}

// Copying or dumping a parsed value recurses once per level: text nested deeper than its caller
// allows (256 levels unless told) is refused before it is parsed, saying how deep it goes.
TEST(StrictJsonTest, ValuesNestedDeeperThan256LevelsAreRefused) {
  EXPECT_NO_THROW(parse_strict_json(std::string(256, '[') + std::string(256, ']')));
  for (const auto& [deep, depth] : std::vector<std::pair<std::string, int>>{
           {std::string(257, '[') + std::string(257, ']'), 257},
           {std::string(100'000, '['), 100'000},
           {"{\"a\":" + std::string(300, '[') + std::string(300, ']') + "}", 301}}) {
    try {
      parse_strict_json(deep);
      ADD_FAILURE() << "parsed " << deep.size() << " bytes";
    } catch (const JsonTextError& e) {
      EXPECT_EQ(std::string(e.what()),
                "nests " + std::to_string(depth) + " levels deep, more than 256");
    }
  }
  EXPECT_THROW(parse_strict_json("[[1]]", 1), JsonTextError) << "a caller's own limit";
}

// what() is a C string: a NUL of input quoted in a message ended it there ("no connector plugin
// is loaded for 'git" of "git\0hub").
TEST(ErrorTest, ANulInTheMessageIsKeptAsText) {
  const std::string with_nul("plugin 'git\0hub' is not loaded", 30);
  EXPECT_STREQ(Error(with_nul).what(), "plugin 'git\\u0000hub' is not loaded");
  EXPECT_STREQ(ConfigError(with_nul).what(), "plugin 'git\\u0000hub' is not loaded");
  EXPECT_STREQ(Error("plain").what(), "plain");
}

}  // namespace
}  // namespace backhaul
