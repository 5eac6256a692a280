// The HTTP side of the connector: requests go through the host with GitHub's mandatory headers,
// and every answer that is not a 2xx becomes the backhaul::sdk::Error the ABI prescribes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "backhaul/connector.hpp"
#include "backhaul/host.hpp"

#include "config.h"

namespace backhaul::github {

// Stateless apart from the (immutable) config it points to. [thread-safe]
class GithubClient {
 public:
  explicit GithubClient(const Config& config) noexcept : config_(config) {}

  // GETs an absolute URL with the token and returns whatever HTTP response arrived. Throws
  // sdk::Error with the host's status (RETRYABLE for refused, reset, DNS, TLS, timeout) when none
  // did.
  sdk::HttpResponse send(const std::string& url, std::string_view token) const;

  // As send(), but returns only 2xx responses (204 included) and those whose status is in `also`,
  // and throws error_for_response() for the others. Messages name the status, the request and
  // GitHub's message.
  sdk::HttpResponse get(const std::string& url, std::string_view token,
                        std::initializer_list<int> also = {}) const;

 private:
  const Config& config_;
};

// The x-ratelimit-* headers of a response, when all three are present and numeric. The reset is
// on the host's clock (`now_ms`): as far after it as after the response's Date, when it has one.
std::optional<sdk::RateLimit> rate_limit_of(const sdk::HttpResponse& response, int64_t now_ms);

// The error for a non-2xx response to `request` ("GET <url>"), at host time `now_ms`:
//   401 -> AUTH_EXPIRED
//   403/429 -> RATE_LIMITED when x-ratelimit-remaining is "0" (wait until x-ratelimit-reset + 1 s),
//              or there is a retry-after (seconds, rounded up; or an HTTP-date), or the message
//              says "rate limit" or "abuse detection"; the longer wait when several apply, 60 s
//              when none gives one. Reset and HTTP-dates are measured against the response's Date
//              when it has an IMF-fixdate one, else `now_ms`. Otherwise 403 -> FATAL (permission)
//              and 429 -> RATE_LIMITED 60 s
//   408, 425 -> RETRYABLE;  other 4xx (404, 410, 422, ...) -> FATAL
//   5xx, 3xx and anything else -> RETRYABLE
// `token` (the request's) is taken out of the body before its message is read and shortened.
sdk::Error error_for_response(const sdk::HttpResponse& response, std::string_view request,
                              int64_t now_ms, std::string_view token);

// GitHub's "message" field of an error body (shortened, one line), or "" when there is none.
std::string github_message(std::string_view body);

}  // namespace backhaul::github
