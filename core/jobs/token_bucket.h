// The token bucket of the per-key throttle (SPEC D8) as a pure function over the stored bucket;
// each store loads the bucket under its lock, takes, and saves what this returns.
#pragma once

#include <cstdint>
#include <optional>

namespace backhaul::jobs {

struct Bucket {
  double tokens = 0;
  int64_t updated_ms = 0;
};

struct Take {
  Bucket bucket;        // to save
  int64_t wait_ms = 0;  // 0: granted; else when a token may be there (INT64_MAX: never)
};

// Throws std::invalid_argument unless 0 <= cost <= capacity, capacity is finite and > 0, and
// refill_per_hour is finite and >= 0 (NaN refused).
void check_take(double cost, double capacity, double refill_per_hour);
// Refills `stored` (full when absent) for the time since it was saved, up to `capacity`, then
// takes `cost` if it is there; a refused take consumes nothing. Time never runs backwards for a
// bucket: hosts' clocks may disagree a little.
Take take_from(const std::optional<Bucket>& stored, double cost, double capacity,
               double refill_per_hour, int64_t now_ms);

}  // namespace backhaul::jobs
