// The circuit breaker of seed 001 as a pure function over a stored CircuitRecord (SPEC E4):
// closed --(N consecutive failures)--> open --(after open_ms)--> half_open (one probe allowed)
// half_open --success--> closed ; half_open --failure--> open again.
#pragma once

#include <cstdint>

#include "core/jobs/job_store.h"

namespace backhaul::jobs {

struct CircuitPolicy {
  int failure_threshold = 5;  // consecutive failures that open the circuit
  int64_t open_ms = 30'000;   // how long it stays open before a probe
};

enum class CircuitEvent { kSuccess = 1, kFailure };

// May a call go through now? closed: yes. open: no until retry_at, then yes (as the half-open
// probe; the caller records the result). half_open: a probe is in flight; others wait.
struct CircuitDecision {
  bool allowed = true;
  int64_t retry_at_ms = 0;  // when not allowed: when to try again
};

CircuitDecision decide(const CircuitRecord& record, int64_t now_ms);
// Marks the record half-open when an open circuit's time has come (the probe is about to run).
CircuitRecord begin_probe(const CircuitRecord& record, int64_t now_ms);
CircuitRecord record_event(const CircuitRecord& record, CircuitEvent event,
                           const CircuitPolicy& policy, int64_t now_ms);

}  // namespace backhaul::jobs
