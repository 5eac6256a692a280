// The real Transport: HTTP/1.1 over Poco Net, HTTPS over Poco NetSSL, with keep-alive connection
// reuse per (scheme, host, port).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/http/http.h"

namespace backhaul::http {

// An HTTP proxy for the requests the host sends (SPEC A3). Plain HTTP goes to it in absolute form;
// HTTPS goes through a CONNECT tunnel, so TLS is still end to end and the origin's certificate is
// what gets verified. Empty host: no proxy.
struct ProxyOptions {
  std::string host;
  uint16_t port = 0;
  std::string username;  // Basic proxy authentication when not empty
  std::string password;
  // Hosts reached directly: "*" (all), a host name ("example.com": it and its subdomains, as
  // ".example.com"), or an IP address. Matched without regard to case.
  std::vector<std::string> no_proxy;
};

// Parses "http://[user:password@]host:port[/]" (credentials percent-decoded). Throws
// std::invalid_argument naming the problem: another scheme (a TLS proxy is not supported), no
// port, a path, a bad port.
ProxyOptions parse_proxy_url(std::string_view url);

// Checks and normalizes no_proxy entries (trimmed, lower case, "*.corp" as ".corp", "[::1]" as
// "::1"). Throws std::invalid_argument naming an entry that is empty, holds several hosts, has a
// port, or a wildcard elsewhere than in front.
std::vector<std::string> parse_no_proxy(const std::vector<std::string>& entries);

// Sets the proxy's credentials from "user:password" (as an environment variable holds them).
// Throws std::invalid_argument, without the text, when there is no colon or no user.
void set_proxy_credentials(ProxyOptions& proxy, std::string_view user_colon_password);

// Whether a request to `host` (lower case, an IPv6 address without brackets) goes through the
// proxy.
bool goes_through_proxy(const ProxyOptions& proxy, std::string_view host);

struct PocoTransportOptions {
  std::chrono::milliseconds connect_timeout{5'000};
  size_t max_idle_per_origin = 8;  // idle keep-alive sessions kept per (scheme, host, port)
  size_t max_response_bytes = 64 * 1024 * 1024;  // a larger body is a TransportError
  // TLS: a CA bundle (PEM file) trusted besides the system's default CA store.
  std::string ca_file;
  bool verify_peer = true;
  std::string user_agent = "backhaul";  // sent when the request has no User-Agent
  ProxyOptions proxy;
};

// [thread-safe]: any number of perform() calls may run at once; each takes an idle session for its
// origin or opens a new one, and gives it back after reading the whole body.
class PocoTransport final : public Transport {
 public:
  explicit PocoTransport(PocoTransportOptions options = {});
  ~PocoTransport() override;
  PocoTransport(const PocoTransport&) = delete;
  PocoTransport& operator=(const PocoTransport&) = delete;

  Response perform(const Request& request) override;
  // Plain HTTP to one origin: pipelined on one kept-alive connection (see Transport). Otherwise,
  // one by one.
  std::vector<BatchResult> perform_batch(const std::vector<Request>& requests) override;

  // Number of TCP connections opened so far (to prove keep-alive reuse in tests).
  size_t connections_opened() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace backhaul::http
