#include "host/daemon/json_schema.h"

#include <cmath>
#include <regex>
#include <stdexcept>

namespace backhaul::daemon {
namespace {

using nlohmann::json;

// The value as the message quotes it: JSON text, shortened.
std::string quote(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

std::string number_text(const json& n) {
  if (n.is_number_integer() || n.is_number_unsigned()) return n.dump();
  const double d = n.get<double>();
  if (std::floor(d) == d && std::fabs(d) < 1e15) return std::to_string(static_cast<int64_t>(d));
  return n.dump();
}

bool is_type(const json& value, const std::string& type) {
  if (type == "object") return value.is_object();
  if (type == "array") return value.is_array();
  if (type == "string") return value.is_string();
  if (type == "boolean") return value.is_boolean();
  if (type == "null") return value.is_null();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    if (value.is_number_integer() || value.is_number_unsigned()) return true;
    if (!value.is_number_float()) return false;
    const double d = value.get<double>();
    return std::floor(d) == d;
  }
  return true;  // unknown type names constrain nothing
}

std::string article(const std::string& type) {
  return (type == "object" || type == "array" || type == "integer") ? "an " + type : "a " + type;
}

// "an integer >= 1", "a number between 0 and 1", "a non-empty string".
std::string expectation(const json& schema) {
  std::string phrase;
  if (schema.contains("type")) {
    const json& type = schema["type"];
    if (type.is_string()) {
      phrase = article(type.get<std::string>());
    } else if (type.is_array()) {
      for (size_t i = 0; i < type.size(); ++i) {
        if (i > 0) phrase += i + 1 == type.size() ? " or " : ", ";
        phrase += article(type[i].get<std::string>());
      }
    }
  }
  if (phrase.empty()) phrase = "a value";
  const bool has_min = schema.contains("minimum");
  const bool has_max = schema.contains("maximum");
  if (has_min && has_max) {
    phrase +=
        " between " + number_text(schema["minimum"]) + " and " + number_text(schema["maximum"]);
  } else if (has_min) {
    phrase += " >= " + number_text(schema["minimum"]);
  } else if (has_max) {
    phrase += " <= " + number_text(schema["maximum"]);
  }
  if (schema.value("minLength", 0) == 1 && phrase == "a string") phrase = "a non-empty string";
  return "must be " + phrase;
}

class Validator {
 public:
  explicit Validator(const json& root) : root_(root) {}

  void check(const json& schema, const json& value, const std::string& path) {
    const json& s = resolve(schema);
    if (!s.is_object()) return;
    if (s.contains("type")) {
      const json& type = s["type"];
      bool ok = false;
      if (type.is_string()) ok = is_type(value, type.get<std::string>());
      if (type.is_array()) {
        for (const json& t : type) ok = ok || is_type(value, t.get<std::string>());
      }
      if (!ok) {
        add(path, expectation(s) + " (got " + quote(value) + ")");
        return;
      }
    }
    if (s.contains("enum") && s["enum"].is_array()) {
      bool found = false;
      std::string options;
      for (const json& option : s["enum"]) {
        found = found || option == value;
        if (!options.empty()) options += ", ";
        options += option.dump();
      }
      if (!found) add(path, "must be one of " + options + " (got " + quote(value) + ")");
    }
    if (value.is_number()) {
      const double v = value.get<double>();
      if ((s.contains("minimum") && v < s["minimum"].get<double>()) ||
          (s.contains("maximum") && v > s["maximum"].get<double>())) {
        add(path, expectation(s) + " (got " + quote(value) + ")");
      }
    }
    if (value.is_string()) check_string(s, value.get<std::string>(), value, path);
    if (value.is_array() && s.contains("items")) {
      for (size_t i = 0; i < value.size(); ++i) {
        check(s["items"], value[i], path + "[" + std::to_string(i) + "]");
      }
    }
    if (value.is_object()) check_object(s, value, path);
  }

  std::vector<SchemaViolation> take() { return std::move(violations_); }

 private:
  const json& resolve(const json& schema) {
    if (!schema.is_object() || !schema.contains("$ref")) return schema;
    const std::string ref = schema["$ref"].get<std::string>();
    const std::string prefix = "#/$defs/";
    if (ref.rfind(prefix, 0) != 0) throw std::invalid_argument("unsupported $ref " + ref);
    const std::string name = ref.substr(prefix.size());
    if (!root_.contains("$defs") || !root_["$defs"].contains(name)) {
      throw std::invalid_argument("unresolved $ref " + ref);
    }
    return root_["$defs"][name];
  }

  void check_string(const json& s, const std::string& text, const json& value,
                    const std::string& path) {
    if (s.contains("minLength") && text.size() < s["minLength"].get<size_t>()) {
      add(path, expectation(s) + " (got " + quote(value) + ")");
    }
    if (s.contains("pattern")) {
      const std::string pattern = s["pattern"].get<std::string>();
      if (!std::regex_search(text, std::regex(pattern, std::regex::ECMAScript))) {
        add(path, "must match " + pattern + " (got " + quote(value) + ")");
      }
    }
  }

  void check_object(const json& s, const json& value, const std::string& path) {
    const std::string prefix = path.empty() ? "" : path + ".";
    if (s.contains("required")) {
      for (const json& name : s["required"]) {
        const std::string key = name.get<std::string>();
        if (!value.contains(key)) add(prefix + key, "is required");
      }
    }
    const json empty = json::object();
    const json& properties = s.contains("properties") ? s["properties"] : empty;
    for (const auto& [key, property] : properties.items()) {
      if (value.contains(key)) check(property, value[key], prefix + key);
    }
    if (!s.contains("additionalProperties")) return;
    const json& additional = s["additionalProperties"];
    for (const auto& [key, item] : value.items()) {
      if (properties.contains(key)) continue;
      if (additional.is_boolean() && !additional.get<bool>()) {
        add(prefix + key, "is not a known field");
      } else if (additional.is_object()) {
        check(additional, item, prefix + key);
      }
    }
  }

  void add(const std::string& path, std::string message) {
    violations_.push_back({path, std::move(message)});
  }

  const json& root_;
  std::vector<SchemaViolation> violations_;
};

}  // namespace

std::vector<SchemaViolation> validate_json(const nlohmann::json& schema,
                                           const nlohmann::json& value) {
  Validator validator(schema);
  validator.check(schema, value, "");
  return validator.take();
}

}  // namespace backhaul::daemon
