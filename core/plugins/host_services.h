// The backhaul_host_t handed to one plugin: logging into spdlog ("plugin.<id>"), HTTP through the
// host's Transport (redirects followed, errors mapped to statuses), and the injected clock.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include <spdlog/logger.h>

#include "backhaul/host.h"

#include "core/plugins/plugin_loader.h"

namespace backhaul::plugins {

class HostBinding {
 public:
  // `services` must outlive this object. The plugin id names the logger.
  HostBinding(const HostServices& services, const std::string& plugin_id);
  HostBinding(const HostBinding&) = delete;
  HostBinding& operator=(const HostBinding&) = delete;
  // Frees the HTTP responses the plugin never released.
  ~HostBinding();

  // Valid as long as this object lives. [thread-safe]
  const backhaul_host_t* c_host() const noexcept { return &host_; }

 private:
  static void log(const backhaul_host_t* host, int32_t level, backhaul_string_t message) noexcept;
  static backhaul_status_t http(const backhaul_host_t* host, const backhaul_http_request_t* request,
                                backhaul_http_response_t** response,
                                backhaul_error_t* error) noexcept;
  static void http_release(const backhaul_host_t* host,
                           backhaul_http_response_t* response) noexcept;
  static int64_t now_ms(const backhaul_host_t* host) noexcept;
  static const void* get_extension(const backhaul_host_t* host, const char* id) noexcept;
  // The binding behind `host`, or nullptr when the plugin passed no host (a contract breach
  // the host survives). A pointer that is not a host struct cannot be told apart.
  static const HostBinding* self(const backhaul_host_t* host) noexcept {
    return host ? static_cast<const HostBinding*>(host->host_data) : nullptr;
  }

  // The host's transport, counted in its HTTP metrics as "plugin:<id>" when it keeps them.
  http::Transport& transport() const {
    return metered_ ? static_cast<http::Transport&>(*metered_) : services_.transport;
  }

  backhaul_host_t host_{};
  HostServices services_;
  const std::unique_ptr<http::MeteredTransport> metered_;
  std::shared_ptr<spdlog::logger> log_;
  std::shared_ptr<spdlog::logger> http_log_;
  // Responses handed out and not yet released: http_release() frees only these, so a response
  // released twice (or a pointer the host never handed out) is refused, not freed again.
  mutable std::mutex responses_mutex_;
  mutable std::unordered_set<const void*> responses_;
};

}  // namespace backhaul::plugins
