#include "host/sandbox/provider_state.h"

#include <algorithm>
#include <random>
#include <utility>

namespace backhaul::sandbox {
namespace {

constexpr uint64_t kFaultStream = 0xfa017;
constexpr uint64_t kTokenStream = 0x70ce2;

// GitHub's documented rate limit for unauthenticated callers.
constexpr int64_t kAnonymousLimit = 60;

}  // namespace

ProviderState::ProviderState(const DataModel& data, std::function<int64_t()> now_ms, Faults faults,
                             int64_t token_lifetime_s)
    : data_(data),
      now_ms_(std::move(now_ms)),
      token_lifetime_ms_(token_lifetime_s * 1000),
      seed_(data.config().seed),
      faults_(faults),
      fault_rng_(hash64({seed_, kFaultStream})),
      // Tokens are not part of the deterministic data: they differ between runs, so a client
      // holding a token from an earlier sandbox process is rejected rather than silently accepted.
      token_rng_(hash64({seed_, kTokenStream, std::random_device{}(), std::random_device{}()})),
      windows_(static_cast<size_t>(data.installations())),
      rule_matches_(faults_.resource_faults.size(), 0) {
  request_counts_.by_installation.resize(static_cast<size_t>(data.installations()));
}

std::string ProviderState::new_token_locked(Provider provider) {
  // Opaque and of varying length, like real tokens: ghs_ + 36..59, vcp_ + 24..35 characters.
  while (true) {
    std::string token = provider == Provider::kGithub
                            ? "ghs_" + random_alnum(token_rng_, 36 + token_rng_.below(24))
                            : "vcp_" + random_alnum(token_rng_, 24 + token_rng_.below(12));
    if (!tokens_.contains(token)) return token;
  }
}

IssuedToken ProviderState::issue_token(Connection connection) {
  const int64_t now = now_ms_();
  std::lock_guard lock(mutex_);
  std::string token = new_token_locked(connection.provider);
  const int64_t expires_at_ms = now + token_lifetime_ms_;
  tokens_.emplace(token, TokenRecord{connection.installation, connection.provider, expires_at_ms});
  return {std::move(token), expires_at_ms};
}

ProviderState::Window& ProviderState::window_locked(int installation, Provider provider,
                                                    int64_t now) {
  Window& window = windows_[static_cast<size_t>(installation - 1)][provider_index(provider)];
  // A window opens with the first request after the previous one ended (as GitHub's do).
  if (window.start_ms < 0 || now >= window.start_ms + faults_.rate_window_s * 1000) {
    window = {now, 0};
  }
  return window;
}

RateSnapshot ProviderState::snapshot_locked(const Window& window) const {
  const int64_t limit = faults_.rate_limit;
  const int64_t end_ms = window.start_ms + faults_.rate_window_s * 1000;
  return {limit, std::max<int64_t>(0, limit - window.used), window.used, (end_ms + 999) / 1000};
}

RateSnapshot ProviderState::anonymous_rate() const {
  const int64_t now = now_ms_();
  return {kAnonymousLimit, kAnonymousLimit, 0, now / 1000 + 3600};
}

Admission ProviderState::admit(Provider provider, std::string_view token) {
  const int64_t now = now_ms_();
  Admission result;
  std::lock_guard lock(mutex_);
  result.slow_ms = faults_.slow_ms;
  ++request_counts_.by_provider[provider_index(provider)];

  auto it = tokens_.find(std::string(token));
  if (it == tokens_.end() || it->second.provider != provider || now >= it->second.expires_at_ms) {
    ++request_counts_.unauthorized;
    result.verdict = Verdict::kBadToken;
    result.rate = {kAnonymousLimit, kAnonymousLimit, 0, now / 1000 + 3600};
    return result;
  }
  TokenRecord& record = it->second;
  result.installation = record.installation;
  ++request_counts_
        .by_installation[static_cast<size_t>(record.installation - 1)][provider_index(provider)];
  Window& window = window_locked(record.installation, provider, now);
  result.rate = snapshot_locked(window);

  ++record.uses;
  if (faults_.token_ttl_requests > 0 && record.uses > faults_.token_ttl_requests) {
    // Count each token's death once, not every later request that still uses it (a TTL lowered
    // below a token's uses retires it too).
    if (!record.retired) ++fault_counts_.token_expired;
    record.retired = true;
    ++request_counts_.unauthorized;
    result.verdict = Verdict::kBadToken;
    return result;
  }
  record.retired = false;  // a TTL raised or turned off gives it back: a next death counts
  if (window.used >= faults_.rate_limit) {
    ++fault_counts_.rate_limited;
    result.verdict = Verdict::kRateLimited;
    return result;
  }
  // Requests every, 2*every, ... each start a burst covering burst_len requests.
  const int64_t sequence = ++burst_sequence_;
  const int64_t every = faults_.burst_429_every;
  if (every > 0 && sequence >= every && sequence % every < faults_.burst_len) {
    ++fault_counts_.burst_429;
    result.verdict = Verdict::kBurst429;
    result.retry_after_s = faults_.retry_after_s;
    return result;
  }
  if (faults_.fail_rate > 0.0 && fault_rng_.unit() < faults_.fail_rate) {
    ++fault_counts_.provider_5xx;
    result.verdict = Verdict::kServerError;
    result.server_error_status = fault_rng_.below(2) == 0 ? 502 : 503;
    return result;
  }
  ++window.used;
  result.rate = snapshot_locked(window);
  return result;
}

int ProviderState::visit(Provider provider, const Target& target) {
  int status = 0;
  {
    std::lock_guard lock(mutex_);
    ResourceRequests& requests = resource_requests_[target.resource];
    requests.installation = target.installation;
    ++requests.by_list[target.list];
    for (size_t i = 0; i < faults_.resource_faults.size(); ++i) {
      const ResourceFault& rule = faults_.resource_faults[i];
      if (rule.resource != target.resource && rule.resource != target.alias) continue;
      if (!rule.list.empty() && rule.list != target.list) continue;
      if (rule.per_page_over > 0 && target.per_page <= rule.per_page_over) continue;
      const int64_t seen = rule_matches_[i]++;
      if (seen < rule.skip || (rule.count > 0 && seen - rule.skip >= rule.count)) continue;
      ++fault_counts_.resource;
      status = rule.status;
      break;
    }
  }
  if (status != 0) refund(provider, target.installation);
  return status;
}

std::map<std::string, ResourceRequests> ProviderState::resource_requests() const {
  std::lock_guard lock(mutex_);
  return resource_requests_;
}

void ProviderState::refund(Provider provider, int installation) {
  if (installation < 1 || installation > data_.installations()) return;
  std::lock_guard lock(mutex_);
  Window& window = windows_[static_cast<size_t>(installation - 1)][provider_index(provider)];
  if (window.used > 0) --window.used;
}

ProviderState::GatewayFault ProviderState::gateway_fault() {
  const int64_t now = now_ms_();
  std::lock_guard lock(mutex_);
  const int64_t sequence = ++webhook_sequence_;
  if (faults_.gateway_busy_every > 0 && sequence % faults_.gateway_busy_every == 0 &&
      now >= busy_until_ms_) {
    busy_until_ms_ = now + faults_.gateway_busy_ms;
  }
  if (now < busy_until_ms_) {
    ++fault_counts_.gateway_429;
    return {429, (busy_until_ms_ - now + 999) / 1000};
  }
  if (faults_.gateway_fail_rate > 0.0 && fault_rng_.unit() < faults_.gateway_fail_rate) {
    ++fault_counts_.gateway_5xx;
    return {503, 0};
  }
  return {};
}

void ProviderState::set_faults(const Faults& faults) {
  validate(faults);
  std::lock_guard lock(mutex_);
  // Rules that change start counting their matches afresh.
  if (faults.resource_faults != faults_.resource_faults) {
    rule_matches_.assign(faults.resource_faults.size(), 0);
  }
  faults_ = faults;
}

Faults ProviderState::faults() const {
  std::lock_guard lock(mutex_);
  return faults_;
}

FaultCounts ProviderState::fault_counts() const {
  std::lock_guard lock(mutex_);
  return fault_counts_;
}

RequestCounts ProviderState::request_counts() const {
  std::lock_guard lock(mutex_);
  return request_counts_;
}

void ProviderState::reset() {
  std::lock_guard lock(mutex_);
  fault_counts_ = {};
  request_counts_.by_provider = {};
  request_counts_.unauthorized = 0;
  std::fill(request_counts_.by_installation.begin(), request_counts_.by_installation.end(),
            std::array<int64_t, 2>{});
  std::fill(windows_.begin(), windows_.end(), std::array<Window, 2>{});
  burst_sequence_ = 0;
  webhook_sequence_ = 0;
  busy_until_ms_ = 0;
  std::fill(rule_matches_.begin(), rule_matches_.end(), 0);
  // Tokens start afresh too: one retired by token_ttl_requests before the reset answers again.
  for (auto& [token, record] : tokens_) {
    record.uses = 0;
    record.retired = false;
  }
  resource_requests_.clear();
  fault_rng_ = SplitMix64(hash64({seed_, kFaultStream}));
}

}  // namespace backhaul::sandbox
