// The circuit breaker of seed 001 as a pure function over a stored CircuitRecord (SPEC E4):
// closed --(N consecutive failures)--> open --(after open_ms)--> half_open (one probe allowed)
// half_open --success--> closed ; half_open --failure--> open again, for twice as long each time
// (at most max_open_ms, or open_ms when that is longer).
// A failed probe of a provider costs its job an attempt, as a page that always fails must die (the
// gateway's lookups cost none: see gateway_failed in pipeline.cpp); the doubling keeps a long
// outage from spending many: 5 probes in its first half hour, then 4 an hour. Only results that
// speak of the state the circuit is in count: a result is reported with the time its call started,
// and one from a call that started before the circuit opened (or before the current half-open probe
// began) is ignored -- see record_event.
#pragma once

#include <cstdint>

#include "core/jobs/job_store.h"

namespace backhaul::jobs {

struct CircuitPolicy {
  int failure_threshold = 5;      // consecutive failures that open the circuit
  int64_t open_ms = 30'000;       // how long it stays open before the first probe
  int64_t max_open_ms = 900'000;  // the longest the doubling after failed probes leaves it open
};

// How long a circuit opened by its `failures`-th consecutive failure stays open: open_ms at the
// threshold, doubled for each failure since (each failed probe), at most max(max_open_ms,
// open_ms).
int64_t open_period_ms(const CircuitPolicy& policy, int failures);

enum class CircuitEvent { kSuccess = 1, kFailure };

// May a call go through now? closed: yes. open: no until retry_at, then yes (as the half-open
// probe; the caller records the result). half_open: a probe is in flight; others wait, and look
// again in a tenth of the open period (at least kHalfOpenRecheckMinMs), for the probe's report
// may close the circuit long before the next probe would be due.
constexpr int64_t kHalfOpenRecheckMinMs = 1000;
struct CircuitDecision {
  bool allowed = true;
  int64_t retry_at_ms = 0;  // when not allowed: when to try again
};

CircuitDecision decide(const CircuitRecord& record, int64_t now_ms);
// Marks the record half-open when an open circuit's time has come (the probe is about to run).
CircuitRecord begin_probe(const CircuitRecord& record, int64_t now_ms);
// Undoes begin_probe for a probe whose call ended without an answer that speaks of the service
// (it was deferred before it went, or it had nothing to send): `current` goes back to `before`
// (the record begin_probe was given) while it is still the record begin_probe made (`begun`), so
// the next call probes at once rather than a whole open period later. Anything recorded since
// (the probe's own report, another host's) stands.
CircuitRecord give_back_probe(const CircuitRecord& current, const CircuitRecord& before,
                              const CircuitRecord& begun);
// The result of a call that started at `call_started_ms` and ended at `now_ms`:
// - closed: a failure adds one, and the failure_threshold-th opens the circuit. A success
//   clears the failures, unless its call started before the last of them was recorded
//   (`updated_ms`): a slow call that began while the service was up says nothing of the failures
//   that came after it began, and must not keep a failing service's circuit from opening. In the
//   same way, with no failures, a failure of a call that started before the circuit closed (or
//   a success cleared the failures, `updated_ms`) is ignored: it belongs to the outage that
//   ended, and must not count toward opening a circuit that the service's recovery closed.
// - open: a success never closes it (only the half-open probe's can); a failure of a call that
//   started at or after `opened_ms` (a host that had not seen it open yet) opens it again from
//   now. `failures` goes on counting while it is open or half-open (open_period_ms). Results of
//   calls that started before it opened are ignored: they belong to the outage that opened it, and
//   must not push the probe further away.
// - half_open: only calls that started at or after the probe began (`updated_ms`) count -- the
//   probe's success closes it, its failure opens it again. A call that started before (in flight
//   when the circuit opened, or an earlier probe that did not report back in time) is ignored,
//   success or failure: it says nothing of the provider's recovery, and the probe decides.
// An ignored result returns the record unchanged.
CircuitRecord record_event(const CircuitRecord& record, CircuitEvent event,
                           const CircuitPolicy& policy, int64_t call_started_ms, int64_t now_ms);

}  // namespace backhaul::jobs
