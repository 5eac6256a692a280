// The admin API on a Poco HTTPServer: binds the configured address (127.0.0.1 by default),
// bounds connections, timeouts and body size, and hands plain request values to AdminApi.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "host/daemon/admin_api.h"

namespace backhaul::daemon {

struct AdminServerOptions {
  std::string listen = "127.0.0.1";
  uint16_t port = 0;  // 0 = a free port
  int max_connections = 16;
  int64_t timeout_ms = 30'000;
};

class AdminServer {
 public:
  // `api` must outlive the server.
  AdminServer(AdminApi& api, AdminServerOptions options);
  ~AdminServer();  // stops
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Binds and starts serving. Throws Poco::Exception when the address cannot be bound.
  // [main-thread]
  void start();
  // Stops accepting connections and reading requests: a connection waiting for one ends, and one
  // handling a request answers it and then ends. Idempotent. [main-thread]
  void stop_taking_requests();
  // stop_taking_requests(), then waits until the requests under way are answered, `answer_until`
  // passes or hurry() is called; then closes every connection and waits for the handler threads
  // (a handler stuck in a call into a plugin holds it up). Idempotent. [main-thread]
  void stop(std::chrono::steady_clock::time_point answer_until = {});
  // Ends the wait of the stop() under way now (or of the next one). [thread-safe]
  void hurry();
  // The requests being handled now (read, not yet answered). [thread-safe]
  size_t requests_under_way() const;
  // The bound port; 0 before start(). [thread-safe]
  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace backhaul::daemon
