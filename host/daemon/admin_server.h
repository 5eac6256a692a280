// The admin API on a Poco HTTPServer: binds the configured address (127.0.0.1 by default),
// bounds connections, timeouts and body size, and hands plain request values to AdminApi.
#pragma once

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
  // Stops accepting, aborts open connections and waits for handler threads. Idempotent.
  // [main-thread]
  void stop();
  // The bound port; 0 before start(). [thread-safe]
  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace backhaul::daemon
