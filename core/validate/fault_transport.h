// A Transport that answers every request with one chosen fault: an error status with the headers
// the providers send, a broken body, a timeout or a connection error. The fault checks hand it to
// the plugin as the host's HTTP service, so they need no fixtures and work for any connector.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "core/common/clock.h"
#include "core/http/http.h"

namespace backhaul::validate {

enum class Fault {
  kHttp401 = 1,   // "Bad credentials"
  kRateLimit403,  // 403 + x-ratelimit-remaining: 0 + x-ratelimit-reset (now + 120 s)
  kRateLimit429,  // 429 + retry-after: 37
  kHttp500,
  kHttp502,  // an HTML page from a proxy
  kHttp404,
  kHttp422,
  kTruncatedBody,    // 200, JSON cut off mid-string
  kNonJsonBody,      // 200, an HTML login page
  kEmptyBody,        // 200, no body at all
  kHugeBody,         // 200, a 50 MB JSON document
  kSlowResponse,     // no answer within the request's timeout
  kConnectionError,  // connection refused
};

// "http_401", "rate_limit_403", ... (used in check names).
std::string_view fault_name(Fault fault);

// [thread-safe]
class FaultTransport final : public http::Transport {
 public:
  static constexpr int64_t kResetAfterS = 120;  // x-ratelimit-reset = now + this
  static constexpr int64_t kRetryAfterS = 37;   // retry-after of the 429
  static constexpr size_t kHugeBodyBytes = size_t{50} << 20;
  // Real time a slow response takes before it "times out" (the fake clock moves by the request's
  // whole timeout): long enough to be a real wait, short enough to keep validation fast.
  static constexpr int64_t kSlowResponseMaxMs = 200;

  // `clock` is the host clock the plugin sees; it must outlive this object.
  FaultTransport(Fault fault, FakeClock& clock) : fault_(fault), clock_(clock) {}

  void set_fault(Fault fault) { fault_.store(fault); }
  Fault fault() const { return fault_.load(); }

  // Throws http::TransportError for kSlowResponse and kConnectionError.
  http::Response perform(const http::Request& request) override;

  size_t request_count() const { return requests_.load(); }
  // The x-ratelimit-reset (epoch seconds) the last 403 carried, for checking the plugin's wait.
  std::optional<int64_t> last_reset_s() const;
  // The host clock when the last request arrived.
  int64_t last_request_ms() const { return last_request_ms_.load(); }

 private:
  http::Response rate_limited_403(const http::Request& request);
  const std::string& huge_body();

  std::atomic<Fault> fault_;
  FakeClock& clock_;
  std::atomic<size_t> requests_{0};
  std::atomic<int64_t> last_request_ms_{0};
  mutable std::mutex mutex_;
  std::optional<int64_t> last_reset_s_;
  std::string huge_body_;  // built on first use: only the huge-body check pays for it
};

// A Transport that passes the first `replayed` requests since its last reset() to `before` (the
// fixtures) and answers every later one with `faults`: a fault on any request of a call, the
// second of a page that makes two, say, not only its first. [thread-safe], but for reset(), which
// must not race a request.
class FaultAfterTransport final : public http::Transport {
 public:
  // Both must outlive this object.
  FaultAfterTransport(http::Transport& before, FaultTransport& faults)
      : before_(before), faults_(faults) {}

  // From now on: `replayed` requests to the fixtures, then faults. Counts requests from 0 again.
  void reset(size_t replayed) {
    replayed_.store(replayed);
    requests_.store(0);
  }
  size_t request_count() const { return requests_.load(); }

  http::Response perform(const http::Request& request) override {
    return requests_.fetch_add(1) < replayed_.load() ? before_.perform(request)
                                                     : faults_.perform(request);
  }

 private:
  http::Transport& before_;
  FaultTransport& faults_;
  std::atomic<size_t> replayed_{0};
  std::atomic<size_t> requests_{0};
};

}  // namespace backhaul::validate
