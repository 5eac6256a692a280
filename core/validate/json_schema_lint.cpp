#include "core/validate/json_schema_lint.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <regex>
#include <set>

namespace backhaul::validate {
namespace {

constexpr size_t kMaxPatternChars = 2000;

using nlohmann::json;

constexpr size_t kMaxProblems = 20;
constexpr int kMaxDepth = 64;

class Linter {
 public:
  std::vector<std::string> problems;
  std::vector<std::string> notes;

  void schema(const json& s, const std::string& at, int depth) {
    if (problems.size() >= kMaxProblems) return;
    if (depth > kMaxDepth) return report(at, "nested too deeply");
    if (s.is_boolean()) return;
    if (!s.is_object()) return report(at, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) keyword(key, value, at + "/" + key, depth);
  }

  void root_type_object(const json& s) {
    auto type = s.find("type");
    if (type == s.end()) return;
    const bool object =
        (type->is_string() && *type == "object") ||
        (type->is_array() && std::find(type->begin(), type->end(), "object") != type->end());
    if (!object)
      report("/type", "the config is a JSON object, so the root type must be \"object\"");
  }

 private:
  void report(const std::string& at, const std::string& what) {
    if (problems.size() < kMaxProblems) problems.push_back((at.empty() ? "/" : at) + ": " + what);
  }

  void keyword(const std::string& key, const json& v, const std::string& at, int depth) {
    static const std::set<std::string> kSchemaValued = {"additionalProperties",
                                                        "additionalItems",
                                                        "not",
                                                        "if",
                                                        "then",
                                                        "else",
                                                        "contains",
                                                        "propertyNames",
                                                        "unevaluatedProperties",
                                                        "unevaluatedItems"};
    static const std::set<std::string> kSchemaMaps = {"properties", "patternProperties", "$defs",
                                                      "definitions", "dependentSchemas"};
    static const std::set<std::string> kSchemaLists = {"allOf", "anyOf", "oneOf", "prefixItems"};
    static const std::set<std::string> kCounts = {"minLength",   "maxLength",     "minItems",
                                                  "maxItems",    "minProperties", "maxProperties",
                                                  "minContains", "maxContains"};
    static const std::set<std::string> kNumbers = {"minimum", "maximum", "multipleOf"};
    static const std::set<std::string> kStrings = {"$schema",     "$id",    "$ref",    "title",
                                                   "description", "format", "$comment"};
    if (key == "type") return type(v, at);
    if (kSchemaValued.count(key)) return schema(v, at, depth + 1);
    if (kSchemaMaps.count(key)) return schema_map(v, at, depth);
    if (kSchemaLists.count(key)) return schema_list(v, at, depth);
    if (key == "items") return v.is_array() ? schema_list(v, at, depth) : schema(v, at, depth + 1);
    if (key == "required") return string_set(v, at);
    if (key == "enum" && !v.is_array()) return report(at, "must be an array");
    if (kCounts.count(key) && !(v.is_number_unsigned() || (v.is_number_integer() && v >= 0)))
      return report(at, "must be a non-negative integer");
    if (kNumbers.count(key) && !v.is_number()) return report(at, "must be a number");
    if (key == "multipleOf" && v.is_number() && v.get<double>() <= 0)
      return report(at, "must be greater than 0");
    if ((key == "exclusiveMinimum" || key == "exclusiveMaximum") && !v.is_number() &&
        !v.is_boolean())
      return report(at, "must be a number (or a boolean in draft 4)");
    if (kStrings.count(key) && !v.is_string()) return report(at, "must be a string");
    if (key == "pattern") return pattern(v, at);
  }

  void type(const json& v, const std::string& at) {
    static const std::set<std::string> kTypes = {"null",   "boolean", "object", "array",
                                                 "number", "string",  "integer"};
    auto known = [&](const json& t) { return t.is_string() && kTypes.count(t.get<std::string>()); };
    if (v.is_string()) {
      if (!known(v)) report(at, "unknown type " + v.dump());
      return;
    }
    if (!v.is_array() || v.empty()) return report(at, "must be a type name or a non-empty array");
    for (const json& t : v) {
      if (!known(t)) report(at, "unknown type " + t.dump());
    }
  }

  void schema_map(const json& v, const std::string& at, int depth) {
    if (!v.is_object()) return report(at, "must be an object of schemas");
    for (const auto& [name, sub] : v.items()) schema(sub, at + "/" + name, depth + 1);
  }

  void schema_list(const json& v, const std::string& at, int depth) {
    if (!v.is_array() || v.empty()) return report(at, "must be a non-empty array of schemas");
    for (size_t i = 0; i < v.size(); ++i) schema(v[i], at + "/" + std::to_string(i), depth + 1);
  }

  void string_set(const json& v, const std::string& at) {
    if (!v.is_array()) return report(at, "must be an array of strings");
    std::set<std::string> seen;
    for (const json& s : v) {
      if (!s.is_string()) return report(at, "must be an array of strings");
      if (!seen.insert(s.get<std::string>()).second) report(at, "lists " + s.dump() + " twice");
    }
  }

  void pattern(const json& v, const std::string& at) {
    if (!v.is_string()) return report(at, "must be a string");
    // std::regex compiles by recursion per element: a pattern of 100 000 nested groups or
    // alternatives overflowed the validator's stack. No real pattern comes near this length.
    if (const size_t size = v.get<std::string>().size(); size > kMaxPatternChars) {
      return report(at, "is " + std::to_string(size) + " characters long: more than " +
                            std::to_string(kMaxPatternChars) + " is not checked");
    }
    if (auto error = ecma262_syntax_error(v.get<std::string>()))
      return report(at, "is not a valid regular expression: " + *error);
    // libstdc++'s ECMAScript grammar is a subset of ECMA-262's: what it cannot compile past the
    // scan above is most likely valid, and noted as not checked rather than failed.
    try {
      std::regex re(v.get<std::string>(), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      note(at, "not compiled (std::regex: " + std::string(e.what()) +
                   "), ECMA-262 syntax not checked further");
    }
  }

  void note(const std::string& at, const std::string& what) {
    if (notes.size() < kMaxProblems) notes.push_back(at + ": " + what);
  }
};

}  // namespace

SchemaLint lint_json_schema(const json& schema, bool root_is_config) {
  Linter linter;
  linter.schema(schema, "", 0);
  if (root_is_config && schema.is_object()) linter.root_type_object(schema);
  return {std::move(linter.problems), std::move(linter.notes)};
}

std::optional<std::string> ecma262_syntax_error(std::string_view p) {
  size_t open_groups = 0;
  bool can_repeat = false;        // the last term is an atom a quantifier may follow
  bool after_quantifier = false;  // ... or a quantifier, which one '?' may follow (lazy)
  auto nothing_to_repeat = [&](size_t at) {
    return "nothing to repeat at " + std::to_string(at) + " ('" + std::string(1, p[at]) + "')";
  };
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '?' && after_quantifier) {
      after_quantifier = false;
      continue;
    }
    after_quantifier = false;
    if (c == '*' || c == '+' || c == '?') {
      if (!can_repeat) return nothing_to_repeat(i);
      can_repeat = false;
      after_quantifier = true;
    } else if (c == '{') {
      // {n}, {n,} or {n,m} is a quantifier; any other brace is a literal (Annex B).
      size_t j = i + 1;
      auto number = [&](uint64_t& value) {
        const size_t start = j;
        for (value = 0; j < p.size() && p[j] >= '0' && p[j] <= '9'; ++j)
          value = std::min<uint64_t>(value * 10 + static_cast<uint64_t>(p[j] - '0'), UINT32_MAX);
        return j > start;
      };
      uint64_t min = 0, max = UINT64_MAX;
      bool quantifier = number(min);
      if (quantifier && j < p.size() && p[j] == ',') {
        ++j;
        if (!number(max)) max = UINT64_MAX;
      } else {
        max = min;
      }
      quantifier = quantifier && j < p.size() && p[j] == '}';
      if (!quantifier) {
        can_repeat = true;
        continue;
      }
      if (!can_repeat) return nothing_to_repeat(i);
      if (min > max) return "numbers out of order in " + std::string(p.substr(i, j + 1 - i));
      i = j;
      can_repeat = false;
      after_quantifier = true;
    } else if (c == '\\') {
      if (++i == p.size()) return std::string("\\ at end of pattern");
      // \u{...} (with the u flag) is one atom, braces and all: they are no quantifier.
      if (p[i] == 'u' && i + 1 < p.size() && p[i + 1] == '{') {
        size_t j = i + 2;
        while (j < p.size() && std::isxdigit(static_cast<unsigned char>(p[j]))) ++j;
        if (j > i + 2 && j < p.size() && p[j] == '}') i = j;
      }
      can_repeat = true;
    } else if (c == '[') {
      size_t j = i + 1;
      if (j < p.size() && p[j] == '^') ++j;
      for (; j < p.size() && p[j] != ']'; ++j) {
        if (p[j] == '\\') ++j;
      }
      if (j >= p.size()) return "unterminated character class at " + std::to_string(i);
      i = j;
      can_repeat = true;
    } else if (c == '(') {
      ++open_groups;
      // (?:, (?=, (?!, (?<=, (?<!, (?<name>, and modifiers such as (?i: in newer editions: the
      // '?' is no quantifier.
      if (i + 1 < p.size() && p[i + 1] == '?') ++i;
      can_repeat = false;
    } else if (c == ')') {
      if (open_groups == 0) return "unmatched ')' at " + std::to_string(i);
      --open_groups;
      can_repeat = true;
    } else if (c == '|' || c == '^' || c == '$') {
      can_repeat = false;
    } else {
      can_repeat = true;
    }
  }
  if (open_groups > 0) return std::to_string(open_groups) + " unclosed '('";
  return std::nullopt;
}

}  // namespace backhaul::validate
