#include "core/jobs/token_bucket.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace backhaul::jobs {

void check_take(double cost, double capacity, double refill_per_hour) {
  // Negated comparisons: NaN satisfies none of the conditions and is refused too.
  if (!(capacity > 0) || !std::isfinite(capacity) || !(cost >= 0) || !(cost <= capacity)) {
    throw std::invalid_argument(
        "take_tokens: need 0 <= cost <= capacity and a finite capacity > 0");
  }
  if (!(refill_per_hour >= 0) || !std::isfinite(refill_per_hour)) {
    throw std::invalid_argument("take_tokens: need a finite refill_per_hour >= 0");
  }
}

Take take_from(const std::optional<Bucket>& stored, double cost, double capacity,
               double refill_per_hour, int64_t now_ms) {
  constexpr double kMsPerHour = 3'600'000.0;
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  Take t;
  t.bucket = {capacity, now_ms};
  if (stored) {
    const int64_t elapsed = std::max<int64_t>(now_ms - stored->updated_ms, 0);
    t.bucket.tokens = std::min(
        capacity, stored->tokens + static_cast<double>(elapsed) * refill_per_hour / kMsPerHour);
    t.bucket.updated_ms = std::max(now_ms, stored->updated_ms);
  }
  if (t.bucket.tokens >= cost) {
    t.bucket.tokens -= cost;
  } else if (refill_per_hour <= 0) {
    t.wait_ms = kNever;
  } else {
    // Capped: a wait beyond int64 (a very slow refill) must not overflow the conversion.
    const double wait = std::ceil((cost - t.bucket.tokens) * kMsPerHour / refill_per_hour);
    t.wait_ms = wait >= static_cast<double>(kNever) ? kNever : static_cast<int64_t>(wait);
    t.wait_ms = std::max<int64_t>(t.wait_ms, 1);
  }
  return t;
}

}  // namespace backhaul::jobs
