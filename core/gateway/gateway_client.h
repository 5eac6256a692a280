// Client of the ingest gateway: connections, access tokens, and webhook-shaped deliveries.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/clock.h"
#include "core/common/errors.h"
#include "core/http/http.h"

namespace backhaul::gateway {

struct Resource {
  std::string id;  // providerResourceId
  std::optional<std::string> name;
};

struct Connection {
  std::string id;
  std::string installation_id;
  std::string provider;
  std::string org_id;
  std::string status;  // "active", ...
  std::vector<Resource> resources;
  // Why each item of `resources` that names no resource was left out, e.g. "resources[2]: not an
  // object (got 42)"; also "resources: not an array (got ...)". The others are still listed.
  std::vector<std::string> unusable_resources;
};

struct Delivery {
  std::string_view connection_id;
  std::string_view org_id;
  std::string_view delivery_id;
  std::string_view event_type;
  std::string_view payload_json;  // a JSON object, embedded verbatim
};

enum class DispatchResult { kAccepted = 1, kDuplicate };

// The gateway answered with an error or could not be reached. retryable(): 5xx, 429, network.
class GatewayError : public Error {
 public:
  GatewayError(const std::string& message, int status, bool retryable, int64_t retry_after_ms = 0)
      : Error(message), status_(status), retryable_(retryable), retry_after_ms_(retry_after_ms) {}
  int status() const noexcept { return status_; }  // 0 when no response arrived
  bool retryable() const noexcept { return retryable_; }
  // 429: the gateway asks us to slow down; the wait it asked for is retry_after_ms().
  bool rate_limited() const noexcept { return status_ == 429; }
  // From the answer's Retry-After (seconds, or an HTTP date); 0 when it had none.
  int64_t retry_after_ms() const noexcept { return retry_after_ms_; }

 private:
  int status_;
  bool retryable_;
  int64_t retry_after_ms_;
};

// The wait a Retry-After value asks for, in ms from `now_ms`: delta-seconds ("120") or an HTTP
// date; 0 for a date in the past, and for a value that is neither. At most a day
// (kMaxRetryAfterS), as a plugin's retry-after is: a longer wait is no wait anyone means, and
// would park a unit, with no attempt spent, until its run gave up on it.
inline constexpr int64_t kMaxRetryAfterS = 24LL * 3600;
int64_t retry_after_ms(std::string_view value, int64_t now_ms);

// [thread-safe] if the transport is.
class GatewayClient {
 public:
  // `base_url` like "http://127.0.0.1:8080/gateway" (no trailing slash needed). `api_key`, when
  // set, is sent as X-Api-Key. `timeout` bounds each exchange. The transport and clock must
  // outlive the client.
  GatewayClient(http::Transport& transport, std::string base_url,
                std::optional<std::string> api_key = std::nullopt,
                const Clock& clock = SystemClock::instance(),
                std::chrono::milliseconds timeout = std::chrono::milliseconds(30'000));

  Connection connection(std::string_view connection_id) const;
  // The token is returned, never logged. Throws GatewayError.
  std::string access_token(std::string_view connection_id) const;
  // POST {base}/webhooks/{provider}. A redirect is not followed: a delivery is a POST, which a
  // redirect would turn into a GET that delivers nothing. Throws GatewayError (FATAL-like when
  // !retryable()).
  DispatchResult dispatch(std::string_view provider, const Delivery& delivery) const;
  // Many deliveries at once, pipelined on one connection where the transport can: a delivery
  // whose answer did not arrive may be sent again, which the gateway dedupes by delivery id.
  // One outcome per delivery, in order: the result, or the error dispatch() would have thrown.
  struct Outcome {
    std::optional<DispatchResult> result;
    std::optional<GatewayError> error;
  };
  std::vector<Outcome> dispatch_batch(std::string_view provider,
                                      const std::vector<Delivery>& deliveries) const;

  // The JSON body dispatch() sends (exposed for tests and benchmarks).
  std::string delivery_body(const Delivery& delivery) const;

 private:
  http::Response get(const std::string& path) const;
  // The POST for a delivery (throws GatewayError when its payload is not JSON), and what an
  // answer to it means.
  http::Request delivery_request(std::string_view provider, const Delivery& delivery) const;
  DispatchResult interpret(const Delivery& delivery, const http::Response& response) const;
  // Throws the GatewayError for a call (`what`) the gateway answered with an error.
  [[noreturn]] void fail(const std::string& what, const http::Response& response) const;

  http::Transport& transport_;
  std::string base_url_;
  std::optional<std::string> api_key_;
  const Clock& clock_;
  const std::chrono::milliseconds timeout_;
};

// "2024-01-01T00:00:00.000Z" for a Unix time in milliseconds.
std::string iso8601_ms(int64_t unix_ms);

}  // namespace backhaul::gateway
