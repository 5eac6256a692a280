// The real Transport: HTTP/1.1 over Poco Net, HTTPS over Poco NetSSL, with keep-alive connection
// reuse per (scheme, host, port).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "core/http/http.h"

namespace backhaul::http {

struct PocoTransportOptions {
  std::chrono::milliseconds connect_timeout{5'000};
  size_t max_idle_per_origin = 8;  // idle keep-alive sessions kept per (scheme, host, port)
  size_t max_response_bytes = 64 * 1024 * 1024;  // a larger body is a TransportError
  // TLS: CA bundle to trust (PEM file). Empty: the system's default CA store.
  std::string ca_file;
  bool verify_peer = true;
  std::string user_agent = "backhaul";  // sent when the request has no User-Agent
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
