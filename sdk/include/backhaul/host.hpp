// Header-only C++17 access to the host's services from inside a plugin.
#ifndef BACKHAUL_HOST_HPP
#define BACKHAUL_HOST_HPP

#include <atomic>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backhaul/host.h"
#include "backhaul/status.h"

namespace backhaul::sdk {

namespace detail {
// The host of this library, set by init() and cleared by deinit(). One per loaded library: hidden
// whatever the plugin's own visibility, since a static of an inline function with default
// visibility is one GNU-unique symbol for the whole process (every plugin sharing the last
// init()'s host), and it keeps its library from ever being unloaded.
#if defined(__GNUC__)
__attribute__((visibility("hidden")))
#endif
inline std::atomic<const backhaul_host_t*>&
host_slot() noexcept {
  static std::atomic<const backhaul_host_t*> slot{nullptr};
  return slot;
}
inline void set_host(const backhaul_host_t* host) noexcept { host_slot().store(host); }
}  // namespace detail

// Thrown by Host::http on a connection error or timeout; the connector layer maps it to its
// status (RETRYABLE) unless the connector catches it first.
class HostError : public std::runtime_error {
 public:
  HostError(backhaul_status_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  backhaul_status_t status() const noexcept { return status_; }

 private:
  backhaul_status_t status_;
};

// A received response; releases the host's memory when it goes out of scope. Move-only.
class HttpResponse {
 public:
  HttpResponse(const backhaul_host_t* host, backhaul_http_response_t* response) noexcept
      : host_(host), response_(response) {}
  HttpResponse(HttpResponse&& other) noexcept
      : host_(other.host_), response_(std::exchange(other.response_, nullptr)) {}
  HttpResponse& operator=(HttpResponse&&) = delete;
  HttpResponse(const HttpResponse&) = delete;
  ~HttpResponse() {
    if (response_) host_->http_release(host_, response_);
  }

  int status() const noexcept { return response_->status; }
  std::string_view body() const noexcept {
    return response_->body.data ? std::string_view(response_->body.data, response_->body.size)
                                : std::string_view();
  }
  std::string_view final_url() const noexcept {
    return response_->final_url.data
               ? std::string_view(response_->final_url.data, response_->final_url.size)
               : std::string_view();
  }
  // First header with this lower-case name.
  std::optional<std::string_view> header(std::string_view lower_name) const noexcept {
    for (size_t i = 0; i < response_->header_count; ++i) {
      const backhaul_http_header_t& h = response_->headers[i];
      if (std::string_view(h.name.data, h.name.size) == lower_name)
        return std::string_view(h.value.data, h.value.size);
    }
    return std::nullopt;
  }
  // Every header with this lower-case name, in the order received: the host passes a header that
  // came several times (several Link lines, say) as several entries, of which header() sees only
  // the first.
  std::vector<std::string_view> headers(std::string_view lower_name) const {
    std::vector<std::string_view> values;
    for (size_t i = 0; i < response_->header_count; ++i) {
      const backhaul_http_header_t& h = response_->headers[i];
      if (std::string_view(h.name.data, h.name.size) == lower_name)
        values.emplace_back(h.value.data, h.value.size);
    }
    return values;
  }

 private:
  const backhaul_host_t* host_;
  backhaul_http_response_t* response_;
};

struct HttpRequest {
  std::string method = "GET";
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::optional<std::string> body;
  uint32_t timeout_ms = 0;
};

// The host services of this library. Valid between init() and deinit().
class Host {
 public:
  static const backhaul_host_t* raw() noexcept { return detail::host_slot().load(); }

  // Throws HostError when the host could not get any response.
  static HttpResponse http(const HttpRequest& request) {
    const backhaul_host_t* host = checked();
    std::vector<backhaul_http_header_t> headers;
    headers.reserve(request.headers.size());
    for (const auto& [name, value] : request.headers) {
      headers.push_back({{name.data(), name.size()}, {value.data(), value.size()}});
    }
    backhaul_http_request_t c{};
    c.struct_size = sizeof(c);
    c.method = {request.method.data(), request.method.size()};
    c.url = {request.url.data(), request.url.size()};
    c.headers = headers.data();
    c.header_count = headers.size();
    if (request.body) c.body = {request.body->data(), request.body->size()};
    c.timeout_ms = request.timeout_ms;
    backhaul_http_response_t* response = nullptr;
    backhaul_error_t error{};
    backhaul_status_t status = host->http(host, &c, &response, &error);
    if (status != BACKHAUL_OK || !response) {
      if (response) host->http_release(host, response);
      throw HostError(status == BACKHAUL_OK ? BACKHAUL_RETRYABLE : status, error.message);
    }
    return HttpResponse(host, response);
  }

  static void log(int32_t level, std::string_view message) noexcept {
    if (const backhaul_host_t* host = raw())
      host->log(host, level, {message.data(), message.size()});
  }

  static int64_t now_ms() {
    const backhaul_host_t* host = checked();
    return host->now_ms(host);
  }

 private:
  static const backhaul_host_t* checked() {
    const backhaul_host_t* host = raw();
    if (!host) throw HostError(BACKHAUL_FATAL, "host services used before init()");
    return host;
  }
};

}  // namespace backhaul::sdk

#endif  // BACKHAUL_HOST_HPP
