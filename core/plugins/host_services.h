// The backhaul_host_t handed to one plugin: logging into spdlog ("plugin.<id>"), HTTP through the
// host's Transport (redirects followed, errors mapped to statuses), and the injected clock.
#pragma once

#include <memory>
#include <string>

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
  static const HostBinding& self(const backhaul_host_t* host) {
    return *static_cast<const HostBinding*>(host->host_data);
  }

  backhaul_host_t host_{};
  HostServices services_;
  std::shared_ptr<spdlog::logger> log_;
  std::shared_ptr<spdlog::logger> http_log_;
};

}  // namespace backhaul::plugins
