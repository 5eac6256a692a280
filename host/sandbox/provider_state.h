// Mutable state behind the fake provider APIs: issued tokens, per-installation rate-limit windows,
// fault injection and request counters. [thread-safe]: every member function may be called
// concurrently from server threads.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "host/sandbox/data.h"
#include "host/sandbox/options.h"
#include "host/sandbox/rng.h"

namespace backhaul::sandbox {

// The rate-limit state a response reports in its x-ratelimit-* headers.
struct RateSnapshot {
  int64_t limit = 0;
  int64_t remaining = 0;
  int64_t used = 0;
  int64_t reset_s = 0;  // end of the window, UTC epoch seconds
};

// What the sandbox decided about one provider request, in the order the checks run.
enum class Verdict {
  kOk = 1,
  kBadToken,     // missing, unknown, expired, other provider's, or out of requests (TTL)
  kRateLimited,  // the installation's window is used up
  kBurst429,     // an injected 429 burst
  kServerError,  // an injected 502/503
};

struct Admission {
  Verdict verdict = Verdict::kOk;
  int installation = 0;  // from the token; 0 when the token is not valid
  RateSnapshot rate;
  int server_error_status = 0;  // 502 or 503 with kServerError
  int64_t retry_after_s = 0;    // with kBurst429
  int64_t slow_ms = 0;          // latency the caller should add before answering
};

// What an admitted provider request is about: a repository or project and the list (or the
// resource itself) asked for.
struct Target {
  int installation = 0;
  std::string resource;  // "org-1/repo-2" or "prj_1_1"
  std::string alias;     // "100002" or "project-1"
  std::string list;      // "pulls", "issues", "releases", "repository", "deployments", "project"
  int64_t per_page = 0;  // a GitHub list request's per_page
};

// Admitted requests for one resource, by list.
struct ResourceRequests {
  int installation = 0;
  std::map<std::string, int64_t> by_list;
};

struct IssuedToken {
  std::string token;
  int64_t expires_at_ms = 0;
};

// Faults actually injected (and limits actually hit) since the last reset.
struct FaultCounts {
  int64_t provider_5xx = 0;
  int64_t burst_429 = 0;
  int64_t token_expired = 0;  // tokens retired by token_ttl_requests
  int64_t rate_limited = 0;
  int64_t gateway_5xx = 0;
  int64_t gateway_429 = 0;
  int64_t resource = 0;  // requests answered by a resource fault
};

// Provider requests seen since the last reset.
struct RequestCounts {
  std::array<int64_t, 2> by_provider{};  // indexed by provider_index()
  int64_t unauthorized = 0;
  // [installation - 1][provider_index()]; only requests with a valid token are attributed.
  std::vector<std::array<int64_t, 2>> by_installation;
};

class ProviderState {
 public:
  ProviderState(const DataModel& data, std::function<int64_t()> now_ms, Faults faults,
                int64_t token_lifetime_s);

  // A fresh token for `connection`; earlier tokens stay valid.
  IssuedToken issue_token(Connection connection);

  // Runs one provider request through the token check, the rate limit, then injected 429
  // bursts and 5xx faults. Counts the request and, when the verdict is kOk, uses one unit of
  // the installation's window.
  Admission admit(Provider provider, std::string_view token);

  // Counts an admitted (kOk) request for its target and applies the first matching resource
  // fault. Returns the status to answer with (the request's rate-limit unit is given back), or 0.
  int visit(Provider provider, const Target& target);
  // Admitted requests by resource ("org-1/repo-2", "prj_1_1") since the last reset.
  std::map<std::string, ResourceRequests> resource_requests() const;

  // Gives back the unit a kOk admission used (a 304 answer does not count, as on GitHub).
  void refund(Provider provider, int installation);

  // Headers for answers to requests without a valid token (GitHub's unauthenticated limit).
  RateSnapshot anonymous_rate() const;

  // A webhook POST's injected fault, counted: a 503 (drawn against gateway_fail_rate), or a 429
  // in a busy period (gateway_busy_every) with the retry-after seconds; status 0 for none.
  struct GatewayFault {
    int status = 0;
    int64_t retry_after_s = 0;
  };
  GatewayFault gateway_fault();

  void set_faults(const Faults& faults);
  Faults faults() const;
  FaultCounts fault_counts() const;
  RequestCounts request_counts() const;

  // Zeroes counters, rate-limit windows and the burst sequence, and reseeds fault draws.
  // Issued tokens stay valid.
  void reset();

  int64_t now_ms() const { return now_ms_(); }

 private:
  struct TokenRecord {
    int installation = 0;
    Provider provider = Provider::kGithub;
    int64_t expires_at_ms = 0;
    int64_t uses = 0;
    bool retired = false;  // its death by token_ttl_requests is counted
  };
  struct Window {
    int64_t start_ms = -1;
    int64_t used = 0;
  };

  Window& window_locked(int installation, Provider provider, int64_t now);
  RateSnapshot snapshot_locked(const Window& window) const;
  std::string new_token_locked(Provider provider);

  const DataModel& data_;
  const std::function<int64_t()> now_ms_;
  const int64_t token_lifetime_ms_;
  const uint64_t seed_;

  mutable std::mutex mutex_;
  Faults faults_;
  SplitMix64 fault_rng_;
  SplitMix64 token_rng_;
  std::unordered_map<std::string, TokenRecord> tokens_;
  std::vector<std::array<Window, 2>> windows_;  // [installation - 1][provider_index()]
  int64_t burst_sequence_ = 0;
  int64_t webhook_sequence_ = 0;  // webhook POSTs, for gateway_busy_every
  int64_t busy_until_ms_ = 0;     // the gateway's busy period ends then
  FaultCounts fault_counts_;
  RequestCounts request_counts_;
  std::vector<int64_t> rule_matches_;  // requests matched so far, by faults_.resource_faults index
  std::map<std::string, ResourceRequests> resource_requests_;
};

}  // namespace backhaul::sandbox
