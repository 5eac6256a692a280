#include "core/jobs/circuit_breaker.h"

#include <algorithm>

namespace backhaul::jobs {

int64_t open_period_ms(const CircuitPolicy& p, int failures) {
  const int64_t longest = std::max(p.max_open_ms, p.open_ms);
  int64_t period = p.open_ms;
  for (int n = p.failure_threshold; n < failures && period < longest; ++n) {
    period = period > longest / 2 ? longest : period * 2;
  }
  return std::min(period, longest);
}

CircuitDecision decide(const CircuitRecord& r, int64_t now_ms) {
  if (r.state == "closed") return {true, 0};
  if (r.state == "open") {
    if (now_ms >= r.retry_at_ms) return {true, 0};
    return {false, r.retry_at_ms};
  }
  // half_open: one probe is running; if it never reported (crashed host), allow another after
  // the same wait so the circuit cannot stay stuck.
  if (now_ms >= r.retry_at_ms) return {true, 0};
  // The probe usually reports within moments: look again in a tenth of the open period (at least
  // a second), not only when the next probe would be due.
  const int64_t period = r.retry_at_ms - r.updated_ms;  // begin_probe: updated_ms + the period
  const int64_t recheck = std::max<int64_t>(kHalfOpenRecheckMinMs, period / 10);
  return {false, std::min(r.retry_at_ms, now_ms + recheck)};
}

CircuitRecord begin_probe(const CircuitRecord& r, int64_t now_ms) {
  CircuitRecord next = r;
  // Open and its time has come, or half-open with a probe that never reported back within the
  // open period: this call is the (next) probe, and the others wait again for its period.
  if ((r.state == "open" || r.state == "half_open") && now_ms >= r.retry_at_ms) {
    next.state = "half_open";
    // Another probe may start if this one does not report back within the open period (open:
    // from its opening; half-open: from the start of the probe that did not report, updated_ms).
    const int64_t period = r.retry_at_ms - (r.state == "open" ? r.opened_ms : r.updated_ms);
    next.retry_at_ms = now_ms + period;
    next.updated_ms = now_ms;
  }
  return next;
}

CircuitRecord give_back_probe(const CircuitRecord& current, const CircuitRecord& before,
                              const CircuitRecord& begun) {
  const bool unchanged = current.state == begun.state && current.failures == begun.failures &&
                         current.opened_ms == begun.opened_ms &&
                         current.retry_at_ms == begun.retry_at_ms &&
                         current.updated_ms == begun.updated_ms;
  return unchanged && begun.state == "half_open" ? before : current;
}

CircuitRecord record_event(const CircuitRecord& r, CircuitEvent event, const CircuitPolicy& p,
                           int64_t call_started_ms, int64_t now_ms) {
  // Open: no probe is running, so no success speaks of the service now, and a failure of a call
  // begun before the opening is the outage that opened it. Half-open: the probe began at
  // updated_ms (begin_probe), and only calls begun since then speak of the recovery.
  if (r.state == "open" && (event == CircuitEvent::kSuccess || call_started_ms < r.opened_ms))
    return r;
  if (r.state == "half_open" && call_started_ms < r.updated_ms) return r;
  // Closed: updated_ms is when the last failure was recorded (failures > 0), or when the circuit
  // closed or a success cleared the failures (none). A result of a call begun before then is of
  // the time before that change, and does not undo it.
  if (r.state == "closed" && call_started_ms < r.updated_ms &&
      (event == CircuitEvent::kSuccess) == (r.failures > 0))
    return r;
  CircuitRecord next = r;
  next.updated_ms = now_ms;
  if (event == CircuitEvent::kSuccess) {
    next.state = "closed";
    next.failures = 0;
    next.opened_ms = 0;
    next.retry_at_ms = 0;
    return next;
  }
  if (r.state == "closed") {
    next.failures = r.failures + 1;
    if (next.failures < p.failure_threshold) return next;
    // The first period, whatever count a higher threshold of the past left (a config changed).
    next.failures = p.failure_threshold;
  } else {
    // A failed probe doubles the next period; a failure of a host that had not seen the circuit
    // open yet is no probe, and opens it again for the same period from now.
    next.failures = std::max(r.failures, p.failure_threshold) + (r.state == "half_open" ? 1 : 0);
  }
  // A failure that trips the threshold, or any failure while open or half-open, (re)opens it.
  next.state = "open";
  next.opened_ms = now_ms;
  next.retry_at_ms = later_by(now_ms, open_period_ms(p, next.failures));
  return next;
}

}  // namespace backhaul::jobs
