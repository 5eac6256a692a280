// Configuration of the sandbox: the data set it generates (fixed at construction) and the fault
// knobs (changeable while it runs).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace backhaul::sandbox {

// One resource made to fail: provider requests for `resource` (a GitHub repository's full name
// "org-1/repo-2" or id "100002", a Vercel project's id "prj_1_1" or name "project-1"), only those
// for `list` when set ("pulls", "issues", "releases", "repository" for the repository itself;
// "deployments", "project"), and with `per_page_over` only those asking for larger pages, are
// answered with `status` after the first `skip` matching requests, for `count` requests (0: every
// one from then on).
struct ResourceFault {
  std::string resource;
  std::string list;  // empty: any request for the resource
  int64_t skip = 0;
  int64_t count = 0;
  int status = 500;  // 400..599
  // > 0: only list requests for more than this many items a page (a page too heavy for GitHub to
  // answer in time, which it ends with a 502 and asks for a smaller per_page).
  int64_t per_page_over = 0;
  bool operator==(const ResourceFault&) const = default;
};

// Fault knobs. All default to "no faults"; a zero count disables its knob.
struct Faults {
  double fail_rate = 0.0;          // probability that a provider request gets a 502/503
  double gateway_fail_rate = 0.0;  // probability that a webhook POST gets a 503
  // Every Nth webhook POST starts a busy period of gateway_busy_ms (sandbox clock) in which every
  // webhook POST gets a 429 with a retry-after (seconds, rounded up) for the rest of it (0 = off).
  int64_t gateway_busy_every = 0;
  int64_t gateway_busy_ms = 1000;
  int64_t burst_429_every = 0;     // every Nth provider request starts a burst of 429s
  int64_t burst_len = 1;           // requests per 429 burst
  int64_t retry_after_s = 1;       // retry-after sent with 429s
  int64_t token_ttl_requests = 0;  // a token answers N provider requests, then gets 401/403
  int64_t slow_ms = 0;             // added latency per provider request
  int64_t rate_limit = 5000;       // x-ratelimit-limit per installation per provider per window
  int64_t rate_window_s = 3600;    // length of a rate-limit window
  std::vector<ResourceFault> resource_faults;  // checked in order; the first match answers
};

// Throws std::invalid_argument naming the offending knob.
void validate(const Faults& faults);

// {"fail_rate":..., "burst_429_every":..., ...}: one key per field, snake_case.
nlohmann::json to_json(const Faults& faults);

// Returns `base` with the keys present in `patch` applied. Throws std::invalid_argument on an
// unknown key, a wrong type or an invalid value (the result is validated).
Faults apply_patch(Faults base, const nlohmann::json& patch);

struct SandboxOptions {
  uint16_t port = 0;  // 0 = pick an ephemeral port; the server binds 127.0.0.1 only
  int installations = 1;
  int repos = 3;                      // GitHub repositories per installation
  int first_installation_repos = -1;  // repositories of inst-1 (a huge tenant); -1 = repos
  int projects = 1;                   // Vercel projects per installation
  int64_t items = 250;                // items per entity type per resource
  uint64_t seed = 1;  // all generated data is a pure function of the seed and the counts
  int max_per_page = 100;
  int threads = 64;                 // HTTP worker threads (one per open keep-alive connection)
  int64_t token_lifetime_s = 3600;  // expiresAt of gateway tokens (GitHub installation tokens: 1 h)
  std::string gateway_api_key;      // when set, /gateway requires X-Api-Key with this value
  Faults faults;
  // Milliseconds since the epoch; used for rate-limit windows, token expiry and the data anchor.
  // Called concurrently from server threads, so it must be thread-safe. Default: system clock.
  std::function<int64_t()> now_ms;
  // Generated timestamps lie in the 5 days before this instant. Default: now_ms() at construction
  // rounded down to the hour, so sandboxes started in the same hour serve identical data.
  std::optional<int64_t> anchor_ms;
};

// Throws std::invalid_argument naming the offending option.
void validate(const SandboxOptions& options);

}  // namespace backhaul::sandbox
