// Retry delays (SPEC D4): min(initial * base^attempt * jitter, max), jitter uniform in [0.5, 1.5].
#pragma once

#include <cstdint>
#include <functional>

namespace backhaul::jobs {

struct RetryPolicy {
  int64_t initial_ms = 1'000;
  double base = 2.0;
  int64_t max_ms = 15 * 60 * 1'000;

  // Delay before the retry that follows failed attempt number `attempt` (1-based). `unit_random`
  // returns a value in [0, 1) (injected so tests are deterministic).
  int64_t delay_ms(int attempt, const std::function<double()>& unit_random) const;
};

// A thread-safe source of uniform [0, 1) values for production use.
double default_unit_random();

}  // namespace backhaul::jobs
