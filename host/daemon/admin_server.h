// The admin API on a Poco HTTPServer: binds the configured address (127.0.0.1 by default),
// bounds connections, timeouts and body size, and hands plain request values to AdminApi.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <Poco/Net/ServerSocket.h>

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

  // A socket bound to `listen`:`port` (0: a free port) and listening, for start(). Taken before
  // anything else a daemon starts: a fixed port is its mark that no other daemon serves this
  // config, whose jobs it would otherwise recover and claim first, then fail to bind. Connections
  // wait in the backlog until start(). Throws Poco::Exception when the address cannot be bound.
  static Poco::Net::ServerSocket listen(const std::string& address, uint16_t port);
  // Starts serving on `listening` (from listen()); start() binds the options' address first.
  // [main-thread]
  void start(Poco::Net::ServerSocket listening);
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
