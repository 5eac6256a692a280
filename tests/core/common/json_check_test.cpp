// is_json() against nlohmann::json::accept(): hand-picked cases, then random documents and
// thousands of random mutations of them, which must get the same verdict from both.
#include "core/common/json_check.h"

#include <optional>
#include <random>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace backhaul {
namespace {

using nlohmann::json;

// nlohmann's verdict, or nothing where it cannot be compared: it rejects a number too large for
// a double (as soon as it reads it, whatever follows), which RFC 8259 and is_json() accept.
std::optional<bool> reference(const std::string& text) {
  if (json::accept(text)) return true;
  try {
    json parsed = json::parse(text);
    (void)parsed;
  } catch (const json::out_of_range&) {
    return std::nullopt;
  } catch (const json::exception&) {
  }
  return false;
}

TEST(JsonCheckTest, HandPickedCases) {
  for (const char* valid :
       {"{}", "[]", " {\"a\" : [1, -2.5e+3, true, false, null, \"x\"]} ", "0", "-0.0", "\"\"",
        "\"\\u00e9\\ud83d\\ude00\\n\\\"\"", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", "[[[[]]]]",
        "{\"a\":{\"b\":{}}}", "1e400", "\t\r\n[1]\n"}) {
    EXPECT_TRUE(is_json(valid)) << valid;
  }
  for (const char* invalid : {"",
                              " ",
                              "{",
                              "}",
                              "[1,]",
                              "{\"a\":1,}",
                              "{\"a\"}",
                              "{1:2}",
                              "01",
                              "1.",
                              ".5",
                              "-",
                              "1e",
                              "+1",
                              "tru",
                              "nul",
                              "\"abc",
                              "\"\\x\"",
                              "\"\\u12\"",
                              "\"\\ud800\"",
                              "\"\\udc00\"",
                              "\"\\ud800\\u0041\"",
                              "\"\x01\"",
                              "\"\xc0\xaf\"",
                              "\"\xed\xa0\x80\"",
                              "\"\xf4\x90\x80\x80\"",
                              "\"\xe2\x82\"",
                              "[1] [2]",
                              "{} x",
                              "[1 2]",
                              "{\"a\" 1}",
                              "NaN",
                              "'a'",
                              "[\"a\":1]"}) {
    EXPECT_FALSE(is_json(invalid)) << invalid;
  }
}

TEST(JsonCheckTest, DeepNestingNeedsNoCallStack) {
  const int depth = 200'000;
  EXPECT_TRUE(is_json(std::string(depth, '[') + std::string(depth, ']')));
  EXPECT_FALSE(is_json(std::string(depth, '[') + std::string(depth - 1, ']')));
}

TEST(JsonCheckTest, DepthCountsTheBracketsOpenAtOnceOutsideStrings) {
  EXPECT_EQ(json_depth("1"), 0u);
  EXPECT_EQ(json_depth(R"("[{[{")"), 0u);
  EXPECT_EQ(json_depth("{}"), 1u);
  EXPECT_EQ(json_depth("[1,[2],{\"a\":[3]}]"), 3u);
  EXPECT_EQ(json_depth(R"({"a\"[":[{"b":"]]]\\"}],"c":[]})"), 3u);  // escapes end no string
  EXPECT_EQ(json_depth("]]]][["), 2u);  // not JSON: counted all the same
  const size_t deep = 300'000;
  EXPECT_EQ(json_depth("{\"x\":" + std::string(deep, '[') + std::string(deep, ']') + "}"),
            deep + 1);
}

json random_value(std::mt19937& rng, int depth) {
  std::uniform_int_distribution<int> pick(0, depth > 4 ? 5 : 7);
  switch (pick(rng)) {
    case 0:
      return nullptr;
    case 1:
      return rng() % 2 == 0;
    case 2:
      return static_cast<int64_t>(rng()) - (1LL << 31);
    case 3:
      return std::ldexp(static_cast<double>(rng()) / 7.0, static_cast<int>(rng() % 80) - 40);
    case 4:
    case 5: {
      static const std::string alphabet[] = {"a",
                                             "Z",
                                             "\"",
                                             "\\",
                                             "/",
                                             "\n",
                                             "\t",
                                             "\x01",
                                             "\xc3\xa9",
                                             "\xe2\x82\xac",
                                             "\xf0\x9f\x98\x80",
                                             " "};
      std::string s;
      for (unsigned n = rng() % 12; n > 0; --n) s += alphabet[rng() % std::size(alphabet)];
      return s;
    }
    case 6: {
      json a = json::array();
      for (unsigned n = rng() % 5; n > 0; --n) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (unsigned n = rng() % 5; n > 0; --n) {
        o["k" + std::to_string(rng() % 100)] = random_value(rng, depth + 1);
      }
      return o;
    }
  }
}

std::string mutate(std::string text, std::mt19937& rng) {
  static const std::string bytes = "{}[],:\"\\ 0123456789.eE+-tfnul\x01\x7f\x80\xbf\xc3\xed\xf4";
  for (unsigned edits = 1 + rng() % 3; edits > 0; --edits) {
    const size_t at = text.empty() ? 0 : rng() % text.size();
    switch (rng() % 4) {
      case 0:  // replace
        if (!text.empty()) text[at] = bytes[rng() % bytes.size()];
        break;
      case 1:  // insert
        text.insert(text.begin() + static_cast<ptrdiff_t>(at), bytes[rng() % bytes.size()]);
        break;
      case 2:  // delete
        if (!text.empty()) text.erase(at, 1);
        break;
      default:  // truncate
        text.resize(at);
        break;
    }
  }
  return text;
}

TEST(JsonCheckTest, AgreesWithNlohmannOnRandomDocumentsAndMutations) {
  std::mt19937 rng(20261126);
  int valid = 0;
  int invalid = 0;
  for (int i = 0; i < 10000; ++i) {
    const std::string doc = random_value(rng, 0).dump(rng() % 2 == 0 ? -1 : 1);
    ASSERT_TRUE(is_json(doc)) << doc;
    for (int m = 0; m < 5; ++m) {
      const std::string text = mutate(doc, rng);
      const std::optional<bool> expected = reference(text);
      if (!expected) continue;
      ASSERT_EQ(is_json(text), *expected) << "document: " << doc << "\nmutated: " << text;
      ++(*expected ? valid : invalid);
    }
  }
  // The mutations exercise both verdicts.
  EXPECT_GT(valid, 3000);
  EXPECT_GT(invalid, 15000);
}

}  // namespace
}  // namespace backhaul
