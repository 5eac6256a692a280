// HTTP as the host performs it for plugins, the gateway client and the CLI. A Transport performs
// single exchanges; send() adds redirect following on top of any transport.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/common/errors.h"

namespace backhaul::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method = "GET";
  std::string url;  // absolute http:// or https:// URL
  Headers headers;
  std::optional<std::string> body;
  std::chrono::milliseconds timeout{30'000};  // whole exchange
};

struct Response {
  int status = 0;
  Headers headers;  // names in lower case, in arrival order
  std::string body;
  std::string url;  // the URL that answered

  // First header with this name (case-insensitive).
  std::optional<std::string_view> header(std::string_view name) const;
};

// No HTTP response could be had: refused, reset, DNS, TLS, timeout, or a malformed response.
class TransportError : public Error {
 public:
  using Error::Error;
};

// A malformed request (bad URL, unsupported scheme).
class RequestError : public Error {
 public:
  using Error::Error;
};

// One exchange of a batch: the response, or why there is none.
struct BatchResult {
  std::optional<Response> response;
  std::string error;  // set when there is no response (what perform() would have thrown)
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Performs one exchange; does not follow redirects. Throws TransportError or RequestError.
  // [thread-safe]
  virtual Response perform(const Request& request) = 0;

  // Performs requests to one origin; results in request order. A transport may pipeline them
  // (HTTP/1.1: all sent on one connection before the answers are read), and a request whose
  // answer did not arrive is sent again on a new connection even if the server may have acted on
  // it: only for requests that are safe to repeat (idempotent ones, or deliveries the server
  // deduplicates by id). No redirects are followed. The default performs them one by one.
  // [thread-safe]
  virtual std::vector<BatchResult> perform_batch(const std::vector<Request>& requests);
};

// Performs `request`, following 301/302/303/307/308 up to `max_redirects` times (303, and 301/302
// for a non-GET, continue as GET without a body, as browsers and curl do; HEAD stays HEAD).
// Relative Location values are resolved against the current URL. When a redirect leaves the
// original origin (scheme, host or port), only headers known to carry no credential go on
// (Accept*, Content-*, Cache-Control, Pragma, If-*, Range, User-Agent). A redirect without
// Location, or the one after `max_redirects`, is returned as is. [thread-safe] if the transport is.
Response send(Transport& transport, Request request, int max_redirects = 5);

// Resolves `location` (absolute, scheme-relative, absolute-path or relative) against `base`.
std::string resolve_url(std::string_view base, std::string_view location);

// Lower-cases ASCII.
std::string to_lower(std::string_view s);

}  // namespace backhaul::http
