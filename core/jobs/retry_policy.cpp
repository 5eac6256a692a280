#include "core/jobs/retry_policy.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace backhaul::jobs {

int64_t RetryPolicy::delay_ms(int attempt, const std::function<double()>& unit_random) const {
  const double r = unit_random();
  const double jitter = 0.5 + (std::isfinite(r) ? std::clamp(r, 0.0, 1.0) : 0.5);  // [0.5, 1.5]
  // SPEC D4 / seed 001: initial * base^attempt (initial 100, base 2, attempt 3 -> 800). The
  // exponent is capped so the power never overflows.
  double exponent = std::min(std::max(attempt, 0), 62);
  double delay = static_cast<double>(initial_ms) * std::pow(base, exponent) * jitter;
  // Compared before the conversion: a delay of 2^63 or more (max_ms at INT64_MAX, "no cap", which
  // as a double is 2^63) or NaN has no int64_t, and came out negative: a retry at once.
  if (!(delay < static_cast<double>(max_ms))) return max_ms;
  return static_cast<int64_t>(delay);
}

double default_unit_random() {
  thread_local std::mt19937_64 engine{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(engine);
}

}  // namespace backhaul::jobs
