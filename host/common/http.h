// Transport-neutral HTTP request/response values for the servers in host/ (the sandbox and the
// daemon's admin API), the small parsing helpers they share, and the glue to and from Poco's
// HTTPServer. Handlers are plain functions of values, so they are testable without sockets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace Poco::Net {
class HTTPServerRequest;
class HTTPServerResponse;
}  // namespace Poco::Net

namespace backhaul::host {

// A query string that remembers each parameter as received, so pagination links can carry the
// caller's parameters verbatim (as GitHub's do).
class Query {
 public:
  Query() = default;
  static Query parse(std::string_view raw_query);

  // The decoded value of the first parameter named `key`.
  std::optional<std::string> get(std::string_view key) const;
  // Every parameter's decoded name, in received order (repeats included).
  std::vector<std::string> names() const;
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
  // The path as sent, without the query ("/v1/installations/a%2Fb/cancel", whose `path` reads
  // as another route's): for the audit log. Empty for a request made in code.
  std::string raw_path;
  // The path's segments, each decoded on its own: "/v1/installations/org%2F1/cancel" has four,
  // the third "org/1" (`path` reads as five). Empty for a request made in code: split `path`.
  std::vector<std::string> segments;
  Query query;
  std::map<std::string, std::string> headers;  // names in lower case
  std::string body;
  bool body_too_large = false;  // the body was longer than the reader's limit (and truncated)
  std::optional<std::string> unreadable;  // why the request could not be read, if it could not

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
// slash does not match a route.
std::vector<std::string_view> split_path(std::string_view path);
// `request.segments` as views, or split_path(request.path) when it has none.
std::vector<std::string_view> path_segments(const Request& request);
// `segment`, one of path_segments(request) (a view of one of `request.segments`), as the client
// sent it, before it was decoded: "%31" of "1". `segment` itself for a request made in code (no
// `segments`) or a view of anything else.
std::string_view raw_segment(const Request& request, std::string_view segment);

std::string percent_decode(std::string_view text, bool plus_is_space);

// Decimal integer with optional sign and nothing else.
std::optional<int64_t> parse_int(std::string_view text);

// Converts a Poco request into a Request, reading at most `max_body_bytes` + 1 bytes of body: a
// longer body sets body_too_large and is never buffered whole. [handler-thread]
Request read_request(Poco::Net::HTTPServerRequest& in, size_t max_body_bytes);
// Sends `response`. A 413 closes the connection, since the rest of the body was never read.
// [handler-thread]
void write_response(const Response& response, Poco::Net::HTTPServerResponse& out);

}  // namespace backhaul::host
