// Transport-neutral request/response values and the small parsing helpers the fake APIs share.
// The Poco server converts to and from these, so handlers are plain functions of values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace backhaul::sandbox {

// A query string that remembers each parameter as received, so pagination links can carry the
// caller's parameters verbatim (as GitHub's do).
class Query {
 public:
  Query() = default;
  static Query parse(std::string_view raw_query);

  // The decoded value of the first parameter named `key`.
  std::optional<std::string> get(std::string_view key) const;
  // The raw "key=value" pairs except those named `skip_key`, joined with '&', in received order.
  std::string raw_without(std::string_view skip_key) const;

 private:
  struct Param {
    std::string key;    // decoded
    std::string value;  // decoded
    std::string raw;    // "key=value" as received
  };
  std::vector<Param> params_;
};

struct Request {
  std::string method;
  std::string path;  // decoded, without the query
  Query query;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;

  // The value of header `lower_case_name`, or nullptr.
  const std::string* header(const std::string& lower_case_name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  void add_header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
  }
  // The value of the first header named `name` (exact match), or nullptr. For tests and glue.
  const std::string* find_header(std::string_view name) const;
};

Response json_response(int status, const nlohmann::json& body);

// "/a/b/c" -> {"a", "b", "c"}; empty segments (from "//" or a trailing "/") are kept, so a trailing
// slash does not match a route (GitHub answers 404 to it too).
std::vector<std::string_view> split_path(std::string_view path);

std::string percent_decode(std::string_view text, bool plus_is_space);

// Decimal integer with optional sign and nothing else.
std::optional<int64_t> parse_int(std::string_view text);

// "2024-05-01T12:34:56Z" (seconds precision, UTC).
std::string format_iso8601(int64_t epoch_ms);

// ISO 8601 date-time: YYYY-MM-DDTHH:MM:SS, optional fraction, then Z or +hh:mm / -hh:mm (a bare
// date YYYY-MM-DD means midnight UTC). Returns milliseconds since the epoch.
std::optional<int64_t> parse_iso8601(std::string_view text);

}  // namespace backhaul::sandbox
