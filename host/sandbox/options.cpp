#include "host/sandbox/options.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace backhaul::sandbox {
namespace {

// The longest span a knob in seconds may ask for: ten years, so that its milliseconds, added to
// any clock's now, never overflow.
constexpr int64_t kMaxSpanS = 10LL * 366 * 24 * 3600;

void require(bool ok, std::string_view name, std::string_view rule) {
  if (!ok) throw std::invalid_argument(std::string(name) + " " + std::string(rule));
}

// Whether the JSON integer `value` is a value of T.
template <typename T>
bool fits(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    return value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  }
  const int64_t v = value.get<int64_t>();
  return v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max();
}

template <typename T>
void patch_field(const nlohmann::json& patch, std::string_view key, T* field) {
  auto it = patch.find(key);
  if (it == patch.end()) return;
  if (!it->is_number()) throw std::invalid_argument(std::string(key) + " must be a number");
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) {
      throw std::invalid_argument(std::string(key) + " must be an integer");
    }
    // Read whole, so that a value past the field's range is refused, not wrapped into it.
    if (!fits<T>(*it)) throw std::invalid_argument(std::string(key) + " is out of range");
  }
  *field = it->get<T>();
}

constexpr std::string_view kLists[] = {"",           "pulls",       "issues", "releases",
                                       "repository", "deployments", "project"};

nlohmann::json to_json(const ResourceFault& r) {
  return {{"resource", r.resource}, {"list", r.list},     {"skip", r.skip},
          {"count", r.count},       {"status", r.status}, {"per_page_over", r.per_page_over}};
}

ResourceFault resource_fault_from(const nlohmann::json& rule, size_t index) {
  const std::string where = "resource_faults[" + std::to_string(index) + "]";
  if (!rule.is_object()) throw std::invalid_argument(where + " must be an object");
  ResourceFault r;
  for (const auto& [key, value] : rule.items()) {
    const std::string field = where + "." + key;
    if (key == "resource" || key == "list") {
      if (!value.is_string()) throw std::invalid_argument(field + " must be a string");
      (key == "resource" ? r.resource : r.list) = value.get<std::string>();
    } else if (key == "skip" || key == "count" || key == "status" || key == "per_page_over") {
      if (!value.is_number_integer()) throw std::invalid_argument(field + " must be an integer");
      if (!fits<int64_t>(value) || (key == "status" && !fits<int>(value))) {
        throw std::invalid_argument(field + " is out of range");
      }
      if (key == "per_page_over") r.per_page_over = value.get<int64_t>();
      if (key == "skip") r.skip = value.get<int64_t>();
      if (key == "count") r.count = value.get<int64_t>();
      if (key == "status") r.status = value.get<int>();
    } else {
      throw std::invalid_argument("unknown fault knob: " + field);
    }
  }
  return r;
}

}  // namespace

void validate(const Faults& f) {
  require(f.fail_rate >= 0.0 && f.fail_rate <= 1.0, "fail_rate", "must be in [0, 1]");
  require(f.gateway_fail_rate >= 0.0 && f.gateway_fail_rate <= 1.0, "gateway_fail_rate",
          "must be in [0, 1]");
  require(f.gateway_busy_every >= 0, "gateway_busy_every", "must be >= 0");
  require(f.gateway_busy_ms >= 1 && f.gateway_busy_ms <= 3'600'000, "gateway_busy_ms",
          "must be in [1, 3600000]");
  require(f.burst_429_every >= 0, "burst_429_every", "must be >= 0");
  require(f.burst_len >= 1, "burst_len", "must be >= 1");
  require(f.retry_after_s >= 0 && f.retry_after_s <= kMaxSpanS, "retry_after_s",
          "must be in [0, " + std::to_string(kMaxSpanS) + "]");
  require(f.token_ttl_requests >= 0, "token_ttl_requests", "must be >= 0");
  require(f.slow_ms >= 0 && f.slow_ms <= 60'000, "slow_ms", "must be in [0, 60000]");
  require(f.rate_limit >= 1, "rate_limit", "must be >= 1");
  require(f.rate_window_s >= 1 && f.rate_window_s <= kMaxSpanS, "rate_window_s",
          "must be in [1, " + std::to_string(kMaxSpanS) + "]");
  for (size_t i = 0; i < f.resource_faults.size(); ++i) {
    const ResourceFault& r = f.resource_faults[i];
    const std::string name = "resource_faults[" + std::to_string(i) + "]";
    require(!r.resource.empty(), name + ".resource", "must not be empty");
    require(std::find(std::begin(kLists), std::end(kLists), r.list) != std::end(kLists),
            name + ".list",
            "must be one of pulls, issues, releases, repository, deployments, project");
    require(r.skip >= 0, name + ".skip", "must be >= 0");
    require(r.count >= 0, name + ".count", "must be >= 0");
    require(r.status >= 400 && r.status <= 599, name + ".status", "must be in [400, 599]");
    require(r.per_page_over >= 0, name + ".per_page_over", "must be >= 0");
  }
}

nlohmann::json to_json(const Faults& f) {
  return {{"fail_rate", f.fail_rate},
          {"gateway_fail_rate", f.gateway_fail_rate},
          {"gateway_busy_every", f.gateway_busy_every},
          {"gateway_busy_ms", f.gateway_busy_ms},
          {"burst_429_every", f.burst_429_every},
          {"burst_len", f.burst_len},
          {"retry_after_s", f.retry_after_s},
          {"token_ttl_requests", f.token_ttl_requests},
          {"slow_ms", f.slow_ms},
          {"rate_limit", f.rate_limit},
          {"rate_window_s", f.rate_window_s},
          {"resource_faults", [&] {
             nlohmann::json rules = nlohmann::json::array();
             for (const ResourceFault& r : f.resource_faults) rules.push_back(to_json(r));
             return rules;
           }()}};
}

Faults apply_patch(Faults base, const nlohmann::json& patch) {
  if (!patch.is_object()) throw std::invalid_argument("faults must be a JSON object");
  const nlohmann::json known = to_json(base);
  for (const auto& [key, value] : patch.items()) {
    if (!known.contains(key)) throw std::invalid_argument("unknown fault knob: " + key);
  }
  patch_field(patch, "fail_rate", &base.fail_rate);
  patch_field(patch, "gateway_fail_rate", &base.gateway_fail_rate);
  patch_field(patch, "gateway_busy_every", &base.gateway_busy_every);
  patch_field(patch, "gateway_busy_ms", &base.gateway_busy_ms);
  patch_field(patch, "burst_429_every", &base.burst_429_every);
  patch_field(patch, "burst_len", &base.burst_len);
  patch_field(patch, "retry_after_s", &base.retry_after_s);
  patch_field(patch, "token_ttl_requests", &base.token_ttl_requests);
  patch_field(patch, "slow_ms", &base.slow_ms);
  patch_field(patch, "rate_limit", &base.rate_limit);
  patch_field(patch, "rate_window_s", &base.rate_window_s);
  if (auto it = patch.find("resource_faults"); it != patch.end()) {
    if (!it->is_array()) throw std::invalid_argument("resource_faults must be an array");
    base.resource_faults.clear();
    for (size_t i = 0; i < it->size(); ++i) {
      base.resource_faults.push_back(resource_fault_from((*it)[i], i));
    }
  }
  validate(base);
  return base;
}

void validate(const SandboxOptions& o) {
  // The id formulas (repo id = 100000 * i + r, release id = repo id * 10^7 + n) must stay unique
  // and below 2^53 so that JSON readers using doubles see them exactly.
  require(o.installations >= 1 && o.installations <= 1000, "installations", "must be in [1, 1000]");
  require(o.repos >= 0 && o.repos <= 9999, "repos", "must be in [0, 9999]");
  require(o.first_installation_repos >= -1 && o.first_installation_repos <= 9999,
          "first_installation_repos", "must be -1 (same as repos) or in [0, 9999]");
  require(o.projects >= 0 && o.projects <= 9999, "projects", "must be in [0, 9999]");
  require(o.items >= 0 && o.items <= 1'000'000, "items", "must be in [0, 1000000]");
  require(o.max_per_page >= 1 && o.max_per_page <= 1000, "max_per_page", "must be in [1, 1000]");
  require(o.threads >= 1 && o.threads <= 1024, "threads", "must be in [1, 1024]");
  require(o.token_lifetime_s >= 1 && o.token_lifetime_s <= kMaxSpanS, "token_lifetime_s",
          "must be in [1, " + std::to_string(kMaxSpanS) + "]");
  validate(o.faults);
}

}  // namespace backhaul::sandbox
