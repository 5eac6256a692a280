#include "core/plugins/host_services.h"

#include <chrono>
#include <cstring>
#include <new>

#include "core/common/logging.h"
#include "core/common/redact.h"
#include "core/http/http.h"

namespace backhaul::plugins {
namespace {

// A response as the plugin sees it, with the storage its pointers point into. The C struct is
// the first member, so the pointer handed out is the address of the whole object.
struct OwnedResponse {
  backhaul_http_response_t c{};
  http::Response response;
  std::vector<backhaul_http_header_t> headers;
};

static_assert(std::is_standard_layout_v<backhaul_http_response_t>);

void write_error(backhaul_error_t* error, std::string_view message) noexcept {
  if (!error) return;
  size_t n = std::min(message.size(), sizeof(error->message) - 1);
  std::memcpy(error->message, message.data(), n);
  error->message[n] = '\0';
  error->retry_after_ms = 0;
}

std::string_view view(backhaul_string_t s) {
  return s.data ? std::string_view(s.data, s.size) : std::string_view();
}

// The smallest request struct a plugin of ABI 1.0 can hand us.
constexpr size_t kMinRequestSize = offsetof(backhaul_http_request_t, timeout_ms) + sizeof(uint32_t);

}  // namespace

HostBinding::HostBinding(const HostServices& services, const std::string& plugin_id)
    : services_(services),
      metered_(services.http_metrics
                   ? std::make_unique<http::MeteredTransport>(
                         services.transport, *services.http_metrics, "plugin:" + plugin_id)
                   : nullptr),
      log_(logging::get("plugin." + plugin_id)),
      http_log_(logging::get("http")) {
  host_.struct_size = sizeof(backhaul_host_t);
  host_.abi_version = BACKHAUL_ABI_VERSION_INIT;
  host_.host_data = this;
  host_.log = &HostBinding::log;
  host_.http = &HostBinding::http;
  host_.http_release = &HostBinding::http_release;
  host_.now_ms = &HostBinding::now_ms;
  host_.get_extension = &HostBinding::get_extension;
}

HostBinding::~HostBinding() {
  for (const void* response : responses_) {
    delete static_cast<OwnedResponse*>(const_cast<void*>(response));
  }
}

void HostBinding::log(const backhaul_host_t* host, int32_t level,
                      backhaul_string_t message) noexcept {
  try {
    const HostBinding* me = self(host);
    if (!me) {
      logging::get("plugins")->warn("a plugin called host->log with a NULL host; ignored");
      return;
    }
    if (me->services_.on_plugin_log) me->services_.on_plugin_log(view(message));
    const auto& logger = me->log_;
    spdlog::level::level_enum l = spdlog::level::info;
    switch (level) {
      case BACKHAUL_LOG_DEBUG:
        l = spdlog::level::debug;
        break;
      case BACKHAUL_LOG_INFO:
        l = spdlog::level::info;
        break;
      case BACKHAUL_LOG_WARN:
        l = spdlog::level::warn;
        break;
      case BACKHAUL_LOG_ERROR:
        l = spdlog::level::err;
        break;
      default:
        l = spdlog::level::info;
        break;
    }
    // The sink redacts; the plugin's text is never trusted to be clean.
    logger->log(l, "{}", view(message));
  } catch (...) {
    // Logging must never take a plugin call down.
  }
}

backhaul_status_t HostBinding::http(const backhaul_host_t* host,
                                    const backhaul_http_request_t* request,
                                    backhaul_http_response_t** response,
                                    backhaul_error_t* error) noexcept {
  if (!response) {
    write_error(error, "http: response out-pointer is null");
    return BACKHAUL_INVALID_ARGUMENT;
  }
  *response = nullptr;
  if (!request || request->struct_size < kMinRequestSize) {
    write_error(error, "http: request is null or its struct_size is too small");
    return BACKHAUL_INVALID_ARGUMENT;
  }
  const HostBinding* binding = self(host);
  if (!binding) {
    write_error(error, "http: host is null (pass the host given to init)");
    return BACKHAUL_INVALID_ARGUMENT;
  }
  if (request->header_count > 0 && !request->headers) {
    write_error(error, "http: headers is null but header_count is " +
                           std::to_string(request->header_count));
    return BACKHAUL_INVALID_ARGUMENT;
  }
  const HostBinding& me = *binding;
  http::Request r;
  try {
    r.method = std::string(view(request->method));
    if (r.method.empty()) r.method = "GET";
    r.url = std::string(view(request->url));
    r.headers.reserve(request->header_count);
    for (size_t i = 0; i < request->header_count; ++i) {
      const backhaul_http_header_t& h = request->headers[i];
      r.headers.emplace_back(std::string(view(h.name)), std::string(view(h.value)));
    }
    if (request->body.data) r.body = std::string(view(request->body));
    r.timeout = request->timeout_ms ? std::chrono::milliseconds(request->timeout_ms)
                                    : me.services_.default_http_timeout;

    const auto started = std::chrono::steady_clock::now();
    auto owned = std::make_unique<OwnedResponse>();
    owned->response = http::send(me.transport(), std::move(r));
    me.http_log_->debug("{} {} -> {} ({} bytes, {} us)", view(request->method),
                        redact(owned->response.url), owned->response.status,
                        owned->response.body.size(),
                        std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::steady_clock::now() - started)
                            .count());

    const http::Response& resp = owned->response;
    owned->headers.reserve(resp.headers.size());
    for (const auto& [name, value] : resp.headers) {
      owned->headers.push_back({{name.data(), name.size()}, {value.data(), value.size()}});
    }
    owned->c.status = resp.status;
    owned->c.headers = owned->headers.data();
    owned->c.header_count = owned->headers.size();
    owned->c.body = {resp.body.data(), resp.body.size()};
    owned->c.final_url = {resp.url.data(), resp.url.size()};
    {
      std::lock_guard lock(me.responses_mutex_);
      me.responses_.insert(owned.get());
    }
    *response = &owned.release()->c;
    return BACKHAUL_OK;
  } catch (const http::RequestError& e) {
    write_error(error, redact(e.what()));
    return BACKHAUL_INVALID_ARGUMENT;
  } catch (const std::bad_alloc&) {
    write_error(error, "http: out of memory");
    return BACKHAUL_RETRYABLE;
  } catch (const std::exception& e) {
    // TransportError and anything unexpected: the request may succeed later.
    write_error(error, redact(e.what()));
    return BACKHAUL_RETRYABLE;
  }
}

void HostBinding::http_release(const backhaul_host_t* host,
                               backhaul_http_response_t* response) noexcept {
  if (!response) return;
  const HostBinding* me = self(host);
  bool known = false;
  if (me) {
    std::lock_guard lock(me->responses_mutex_);
    known = me->responses_.erase(reinterpret_cast<OwnedResponse*>(response)) == 1;
  }
  if (!known) {
    try {
      logging::get("plugins")->error(
          "a plugin released an HTTP response {}; not freed",
          me ? "the host does not hold (released twice, or not from this host)"
             : "with a NULL host");
    } catch (...) {
    }
    return;
  }
  delete reinterpret_cast<OwnedResponse*>(response);
}

int64_t HostBinding::now_ms(const backhaul_host_t* host) noexcept {
  if (const HostBinding* me = self(host)) return me->services_.clock.now_ms();
  // No binding to ask: the real time is still the best answer a plugin can get.
  return SystemClock::instance().now_ms();
}

const void* HostBinding::get_extension(const backhaul_host_t*, const char*) noexcept {
  // No host extensions are defined yet; new services will be added under versioned ids.
  return nullptr;
}

}  // namespace backhaul::plugins
