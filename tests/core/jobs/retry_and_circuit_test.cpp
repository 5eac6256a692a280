// The pure pieces of the queue: retry delays (SPEC D4) and the circuit breaker state machine
// (SPEC E4, seed 001). No store, no clock: randomness and time are injected.
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "core/jobs/circuit_breaker.h"
#include "core/jobs/retry_policy.h"

namespace backhaul::jobs {
namespace {

// A unit_random that always returns `value`.
std::function<double()> fixed(double value) {
  return [value] { return value; };
}

// A unit_random replaying `values` in a loop.
std::function<double()> sequence(std::vector<double> values) {
  auto index = std::make_shared<size_t>(0);
  return [values = std::move(values), index] { return values[(*index)++ % values.size()]; };
}

RetryPolicy policy(int64_t initial_ms, double base, int64_t max_ms) {
  RetryPolicy p;
  p.initial_ms = initial_ms;
  p.base = base;
  p.max_ms = max_ms;
  return p;
}

// ===========================================================================================
// RetryPolicy: min(initial * base^attempt * jitter, max), jitter uniform in [0.5, 1.5]
// ===========================================================================================

TEST(RetryPolicyTest, WithNeutralJitterTheDelayIsInitialTimesBaseToTheAttempt) {
  // Seed 001: initialMs=100, base=2: attempt 3 has a base delay of 800 ms (100 * 2^3).
  const RetryPolicy p = policy(100, 2.0, 30'000);
  EXPECT_EQ(p.delay_ms(3, fixed(0.5)), 800);
  EXPECT_EQ(p.delay_ms(1, fixed(0.5)), 200);
  EXPECT_EQ(p.delay_ms(2, fixed(0.5)), 400);
}

TEST(RetryPolicyTest, JitterScalesTheDelayBetweenHalfAndOneAndAHalf) {
  // Seed 001: attempt 3 with jitter lands in 400-1200 ms.
  const RetryPolicy p = policy(100, 2.0, 30'000);
  const int64_t lowest = p.delay_ms(3, fixed(0.0));
  const int64_t highest = p.delay_ms(3, fixed(std::nextafter(1.0, 0.0)));
  EXPECT_EQ(lowest, p.delay_ms(3, fixed(0.5)) / 2);
  EXPECT_GE(highest, p.delay_ms(3, fixed(0.5)) * 3 / 2 - 1);
  EXPECT_LE(highest, p.delay_ms(3, fixed(0.5)) * 3 / 2);
}

TEST(RetryPolicyTest, EveryJitteredDelayStaysWithinItsBounds) {
  const RetryPolicy p = policy(1'000, 2.0, 24 * 3'600'000LL);
  for (int attempt = 1; attempt <= 12; ++attempt) {
    const double neutral = static_cast<double>(p.delay_ms(attempt, fixed(0.5)));
    for (int i = 0; i < 100; ++i) {
      const double r = i / 100.0;
      const auto d = static_cast<double>(p.delay_ms(attempt, fixed(r)));
      EXPECT_GE(d, std::floor(neutral * 0.5)) << "attempt " << attempt << " r " << r;
      EXPECT_LE(d, std::ceil(neutral * 1.5)) << "attempt " << attempt << " r " << r;
    }
  }
}

TEST(RetryPolicyTest, TheDelayGrowsWithTheAttemptForAFixedJitter) {
  const RetryPolicy p;  // defaults: 1 s, base 2, 15 min cap
  int64_t previous = 0;
  for (int attempt = 1; attempt <= 20; ++attempt) {
    const int64_t d = p.delay_ms(attempt, fixed(0.5));
    EXPECT_GE(d, previous) << attempt;
    previous = d;
  }
}

TEST(RetryPolicyTest, TheDelayNeverExceedsTheMaximumEvenWithTheHighestJitter) {
  const RetryPolicy p = policy(1'000, 2.0, 15 * 60'000);
  EXPECT_EQ(p.delay_ms(30, fixed(std::nextafter(1.0, 0.0))), 15 * 60'000);
  EXPECT_EQ(p.delay_ms(30, fixed(0.0)), 15 * 60'000) << "half of a huge delay is still capped";
  EXPECT_EQ(p.delay_ms(1'000, fixed(0.5)), 15 * 60'000) << "no overflow for absurd attempts";
  EXPECT_EQ(p.delay_ms(1'000'000, fixed(0.9)), 15 * 60'000);
}

// Review: a delay of 2^63 or more (max_ms at INT64_MAX, as "no cap") or NaN has no int64_t, and
// the conversion gave INT64_MIN: a retry at once, in a loop.
TEST(RetryPolicyTest, NoCapAndANanJitterGiveADelayNotANegativeOne) {
  const RetryPolicy uncapped = policy(1'000, 2.0, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(uncapped.delay_ms(60, fixed(0.5)), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(uncapped.delay_ms(3, fixed(0.5)), 8'000);
  const RetryPolicy p = policy(1'000, 2.0, 60'000);
  EXPECT_EQ(p.delay_ms(3, fixed(std::nan(""))), 8'000) << "a NaN jitter is the middle one";
  EXPECT_EQ(p.delay_ms(3, fixed(std::numeric_limits<double>::infinity())), 8'000);
}

TEST(RetryPolicyTest, TheSameRandomSequenceGivesTheSameDelays) {
  const RetryPolicy p;
  const std::vector<double> values = {0.13, 0.77, 0.5, 0.01, 0.99};
  auto first = sequence(values);
  auto second = sequence(values);
  for (int attempt = 1; attempt <= 10; ++attempt) {
    EXPECT_EQ(p.delay_ms(attempt, first), p.delay_ms(attempt, second)) << attempt;
  }
}

TEST(RetryPolicyTest, TheDefaultRandomSourceIsUniformInTheUnitInterval) {
  double sum = 0;
  constexpr int kSamples = 10'000;
  for (int i = 0; i < kSamples; ++i) {
    const double r = default_unit_random();
    ASSERT_GE(r, 0.0);
    ASSERT_LT(r, 1.0);
    sum += r;
  }
  EXPECT_NEAR(sum / kSamples, 0.5, 0.05);
}

// ===========================================================================================
// Circuit breaker: closed -> open -> half_open -> closed | open
// ===========================================================================================

constexpr int64_t kNow = 1'700'000'000'000;

CircuitPolicy breaker(int threshold, int64_t open_ms = 30'000) {
  CircuitPolicy p;
  p.failure_threshold = threshold;
  p.open_ms = open_ms;
  return p;
}

CircuitRecord closed_with(int failures) {
  CircuitRecord r;
  r.failures = failures;
  return r;
}

CircuitRecord fail_times(CircuitRecord r, int n, const CircuitPolicy& p, int64_t now) {
  for (int i = 0; i < n; ++i) r = record_event(r, CircuitEvent::kFailure, p, now, now);
  return r;
}

TEST(CircuitBreakerTest, ANewCircuitIsClosedAndLetsCallsThrough) {
  const CircuitRecord r;
  EXPECT_EQ(r.state, "closed");
  EXPECT_EQ(r.failures, 0);
  EXPECT_TRUE(decide(r, kNow).allowed);
}

TEST(CircuitBreakerTest, ASuccessWhileClosedResetsTheFailureCount) {
  const CircuitRecord r =
      record_event(closed_with(3), CircuitEvent::kSuccess, breaker(5), kNow, kNow);
  EXPECT_EQ(r.state, "closed");
  EXPECT_EQ(r.failures, 0);
  EXPECT_EQ(r.updated_ms, kNow);
}

TEST(CircuitBreakerTest, FailuresBelowTheThresholdKeepItClosedAndCount) {
  // Seed 001: sendgrid tolerates 10; after 5 failures it is closed with failureCount 5.
  const CircuitRecord r = fail_times(CircuitRecord{}, 5, breaker(10), kNow);
  EXPECT_EQ(r.state, "closed");
  EXPECT_EQ(r.failures, 5);
  EXPECT_TRUE(decide(r, kNow).allowed);
}

TEST(CircuitBreakerTest, TheThresholdthFailureOpensIt) {
  // Seed 001: closed with 4 failures, threshold 5, one more failure -> open at now.
  const CircuitRecord r =
      record_event(closed_with(4), CircuitEvent::kFailure, breaker(5), kNow, kNow);
  EXPECT_EQ(r.state, "open");
  EXPECT_EQ(r.opened_ms, kNow);
  EXPECT_EQ(r.retry_at_ms, kNow + 30'000);
  EXPECT_EQ(r.updated_ms, kNow);
  // Seed 001: stripe-api with threshold 3 is open after 3 consecutive failures.
  EXPECT_EQ(fail_times(CircuitRecord{}, 3, breaker(3), kNow).state, "open");
  // A count a higher threshold of the past left (a config changed) opens it for the first period.
  const CircuitRecord lowered =
      record_event(closed_with(7), CircuitEvent::kFailure, breaker(3), kNow, kNow);
  EXPECT_EQ(lowered.state, "open");
  EXPECT_EQ(lowered.failures, 3);
  EXPECT_EQ(lowered.retry_at_ms, kNow + 30'000);
}

TEST(CircuitBreakerTest, ASuccessBetweenFailuresStartsTheCountAgain) {
  CircuitRecord r = fail_times(CircuitRecord{}, 2, breaker(3), kNow);
  r = record_event(r, CircuitEvent::kSuccess, breaker(3), kNow, kNow);
  r = fail_times(r, 2, breaker(3), kNow);
  EXPECT_EQ(r.state, "closed") << "failures must be consecutive";
}

// A slow call that began before the failures and succeeds after them says the service was up
// when it began, not since: it does not clear them. A success of a call begun after the last
// failure does.
TEST(CircuitBreakerTest, ALateSuccessWhileClosedDoesNotClearTheFailuresThatCameAfterItBegan) {
  const CircuitPolicy p = breaker(5);
  CircuitRecord r = fail_times(CircuitRecord{}, 2, p, kNow);
  r = fail_times(r, 2, p, kNow + 100);
  const CircuitRecord late = record_event(r, CircuitEvent::kSuccess, p, kNow + 50, kNow + 200);
  EXPECT_EQ(late.failures, 4);
  EXPECT_EQ(late.updated_ms, kNow + 100);
  EXPECT_EQ(record_event(late, CircuitEvent::kFailure, p, kNow + 150, kNow + 300).state, "open")
      << "the fifth consecutive failure opens it";
  const CircuitRecord news = record_event(r, CircuitEvent::kSuccess, p, kNow + 100, kNow + 200);
  EXPECT_EQ(news.state, "closed");
  EXPECT_EQ(news.failures, 0);
  EXPECT_EQ(news.updated_ms, kNow + 200);
}

// A call in flight since before the circuit opened that fails after the probe closed it belongs
// to the outage that ended: it does not count toward opening it again. One begun after does.
TEST(CircuitBreakerTest, AFailureOfACallBegunBeforeTheCircuitClosedDoesNotCount) {
  const CircuitPolicy p = breaker(2, 30'000);
  const CircuitRecord open = fail_times(CircuitRecord{}, 2, p, kNow);
  const CircuitRecord closed = record_event(
      begin_probe(open, kNow + 30'000), CircuitEvent::kSuccess, p, kNow + 30'000, kNow + 30'100);
  ASSERT_EQ(closed.state, "closed");
  CircuitRecord r = closed;
  for (int i = 0; i < 2; ++i)
    r = record_event(r, CircuitEvent::kFailure, p, kNow - 100, kNow + 30'200 + i);
  EXPECT_EQ(r.state, "closed");
  EXPECT_EQ(r.failures, 0);
  r = record_event(r, CircuitEvent::kFailure, p, kNow + 30'150, kNow + 30'300);
  EXPECT_EQ(r.failures, 1);
  EXPECT_EQ(record_event(r, CircuitEvent::kFailure, p, kNow - 100, kNow + 30'400).state, "open")
      << "once a new failure counts, the failures are consecutive again";
}

// A probe whose call ended without an answer is given back: the record is as before the probe,
// so the next call probes at once. Anything recorded since -- the probe's own report, a later
// probe's start, another host's -- stands.
TEST(CircuitBreakerTest, AProbeIsGivenBackOnlyWhileNothingWasRecordedSince) {
  const CircuitPolicy p = breaker(2, 30'000);
  const CircuitRecord open = fail_times(CircuitRecord{}, 2, p, kNow);
  const CircuitRecord begun = begin_probe(open, kNow + 30'000);
  ASSERT_EQ(begun.state, "half_open");
  const CircuitRecord back = give_back_probe(begun, open, begun);
  EXPECT_EQ(back.state, "open");
  EXPECT_EQ(back.retry_at_ms, open.retry_at_ms);
  EXPECT_TRUE(decide(back, kNow + 30'001).allowed) << "the next call probes at once";

  const CircuitRecord reported =
      record_event(begun, CircuitEvent::kSuccess, p, kNow + 30'000, kNow + 30'050);
  EXPECT_EQ(give_back_probe(reported, open, begun).state, "closed");
  const CircuitRecord next_probe = begin_probe(begun, kNow + 60'000);
  EXPECT_EQ(give_back_probe(next_probe, open, begun).updated_ms, kNow + 60'000);
  EXPECT_EQ(give_back_probe(open, open, open).state, "open") << "no probe was begun";
}

TEST(CircuitBreakerTest, AnOpenCircuitFailsFastUntilItsRetryTime) {
  // Seed 001: opened 10 s ago with a 30 s reset: denied, retry in about 20 s.
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5), kNow - 10'000);
  const CircuitDecision d = decide(open, kNow);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.retry_at_ms - kNow, 20'000);
  EXPECT_FALSE(decide(open, kNow + 19'999).allowed);
  EXPECT_TRUE(decide(open, kNow + 20'000).allowed) << "the half-open probe may go";
}

TEST(CircuitBreakerTest, BeginProbeMakesAnOpenCircuitHalfOpenOnlyWhenItsTimeHasCome) {
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow);
  EXPECT_EQ(begin_probe(open, kNow + 29'999).state, "open");
  const CircuitRecord probing = begin_probe(open, kNow + 30'000);
  EXPECT_EQ(probing.state, "half_open");
  EXPECT_EQ(probing.updated_ms, kNow + 30'000);
  EXPECT_EQ(begin_probe(CircuitRecord{}, kNow).state, "closed") << "closed stays closed";
}

TEST(CircuitBreakerTest, WhileHalfOpenOnlyTheProbeRunsOthersWait) {
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow);
  const CircuitRecord probing = begin_probe(open, kNow + 30'000);
  const CircuitDecision d = decide(probing, kNow + 30'001);
  EXPECT_FALSE(d.allowed);
  EXPECT_GT(d.retry_at_ms, kNow + 30'001);
}

TEST(CircuitBreakerTest, AProbeThatNeverReportsBackDoesNotLeaveTheCircuitStuck) {
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow);
  const CircuitRecord probing = begin_probe(open, kNow + 30'000);
  EXPECT_TRUE(decide(probing, kNow + 60'000).allowed) << "another probe after the open period";
}

// Review: after a probe that never reported back, "another" probe goes -- one, and the other
// callers wait again, as while the first probe was in flight. A caller that is allowed starts
// its probe with begin_probe (as the pipeline does through update_circuit).
TEST(CircuitBreakerTest, AfterAProbeThatNeverReportedBackOnlyOneMoreProbeGoes) {
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow);
  const CircuitRecord probing = begin_probe(open, kNow + 30'000);
  ASSERT_TRUE(decide(probing, kNow + 60'000).allowed);
  const CircuitRecord second = begin_probe(probing, kNow + 60'000);
  EXPECT_EQ(second.state, "half_open");
  const CircuitDecision d = decide(second, kNow + 60'001);
  EXPECT_FALSE(d.allowed) << "the second probe is in flight: the others wait";
  EXPECT_EQ(d.retry_at_ms, kNow + 63'001) << "and look again in a tenth of the period";
  EXPECT_FALSE(decide(second, kNow + 89'999).allowed) << "no third probe before its time";
  EXPECT_TRUE(decide(second, kNow + 90'000).allowed);
}

// While the probe is in flight the others look again in a tenth of the open period (at least a
// second, and never past the next probe's time), not when the next probe would be due: a probe
// reports within moments, and a closed circuit should not keep them waiting a whole period.
// Before, each waited until the next probe's time, however soon the probe closed the circuit.
TEST(CircuitBreakerTest, WhileHalfOpenTheOthersLookAgainSoonForTheProbesReport) {
  const CircuitRecord probing =
      begin_probe(fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow), kNow + 30'000);
  EXPECT_EQ(decide(probing, kNow + 30'001).retry_at_ms, kNow + 33'001);
  EXPECT_EQ(decide(probing, kNow + 58'000).retry_at_ms, kNow + 60'000) << "not past the next probe";

  const CircuitRecord short_probe =
      begin_probe(fail_times(CircuitRecord{}, 5, breaker(5, 2'000), kNow), kNow + 2'000);
  EXPECT_EQ(decide(short_probe, kNow + 2'001).retry_at_ms, kNow + 3'001) << "at least a second";

  const CircuitRecord closed = record_event(probing, CircuitEvent::kSuccess, breaker(5, 30'000),
                                            kNow + 30'000, kNow + 30'500);
  EXPECT_TRUE(decide(closed, kNow + 33'001).allowed) << "the probe closed it: the look finds it so";
  EXPECT_EQ(decide(fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow), kNow + 1).retry_at_ms,
            kNow + 30'000)
      << "while open (no probe yet), the wait is until the probe's time";
}

// Review: a call that started before the circuit opened and succeeds after it did is no probe:
// the circuit stays open until its time, and then its probe decides.
TEST(CircuitBreakerTest, ALateSuccessWhileOpenLeavesItOpen) {
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow);
  const CircuitRecord after =
      record_event(open, CircuitEvent::kSuccess, breaker(5), kNow - 1, kNow + 1);
  EXPECT_EQ(after.state, "open");
  EXPECT_EQ(after.retry_at_ms, kNow + 30'000);
  EXPECT_FALSE(decide(after, kNow + 2).allowed);
}

TEST(CircuitBreakerTest, ASuccessfulProbeClosesTheCircuit) {
  const CircuitRecord probing =
      begin_probe(fail_times(CircuitRecord{}, 5, breaker(5), kNow), kNow + 30'000);
  const CircuitRecord r =
      record_event(probing, CircuitEvent::kSuccess, breaker(5), kNow + 30'000, kNow + 30'500);
  EXPECT_EQ(r.state, "closed");
  EXPECT_EQ(r.failures, 0);
  EXPECT_EQ(r.opened_ms, 0);
  EXPECT_EQ(r.retry_at_ms, 0);
  EXPECT_TRUE(decide(r, kNow + 30'501).allowed);
}

// Review: with a fixed period a 30-minute outage made 60 probes, each a provider's probe costing
// its job an attempt (a page that always fails must die), enough to dead-letter a backfill's units.
// Each failed probe now doubles the period, up to max_open_ms.
TEST(CircuitBreakerTest, AFailedProbeReopensTheCircuitForTwiceAsLongUpToTheLongestPeriod) {
  const CircuitRecord probing =
      begin_probe(fail_times(CircuitRecord{}, 5, breaker(5), kNow), kNow + 30'000);
  const CircuitRecord r =
      record_event(probing, CircuitEvent::kFailure, breaker(5), kNow + 30'000, kNow + 30'500);
  EXPECT_EQ(r.state, "open");
  EXPECT_EQ(r.opened_ms, kNow + 30'500);
  EXPECT_EQ(r.retry_at_ms, kNow + 90'500) << "60 s: twice the first period";
  EXPECT_EQ(r.failures, 6);
  EXPECT_FALSE(decide(r, kNow + 31'000).allowed);

  // Probe after probe fails: 30 s, 60, 120, 240, 480, 900 (the longest), 900, ...
  CircuitRecord c = fail_times(CircuitRecord{}, 5, breaker(5), kNow);
  std::vector<int64_t> periods;
  for (int probe = 0; probe < 8; ++probe) {
    periods.push_back(c.retry_at_ms - c.opened_ms);
    const int64_t at = c.retry_at_ms;
    c = record_event(begin_probe(c, at), CircuitEvent::kFailure, breaker(5), at, at);
  }
  EXPECT_EQ(periods, (std::vector<int64_t>{30'000, 60'000, 120'000, 240'000, 480'000, 900'000,
                                           900'000, 900'000}));
  // Half an hour of outage: 5 probes, where a fixed period made 60.
  int64_t elapsed = 0;
  int probes = 0;
  for (int64_t p : periods) {
    if ((elapsed += p) > 30 * 60'000) break;
    ++probes;
  }
  EXPECT_EQ(probes, 5);
  // A success closes it, and the next opening starts from the first period again.
  const CircuitRecord closed = record_event(begin_probe(c, c.retry_at_ms), CircuitEvent::kSuccess,
                                            breaker(5), c.retry_at_ms, c.retry_at_ms);
  EXPECT_EQ(closed.state, "closed");
  const CircuitRecord again = fail_times(closed, 5, breaker(5), c.retry_at_ms + 1);
  EXPECT_EQ(again.retry_at_ms - again.opened_ms, 30'000);
}

TEST(CircuitBreakerTest, TheOpenPeriodDoublesPerFailureAboveTheThresholdWithinItsBounds) {
  CircuitPolicy p = breaker(3, 1'000);
  p.max_open_ms = 5'000;
  EXPECT_EQ(open_period_ms(p, 3), 1'000);
  EXPECT_EQ(open_period_ms(p, 4), 2'000);
  EXPECT_EQ(open_period_ms(p, 5), 4'000);
  EXPECT_EQ(open_period_ms(p, 6), 5'000);
  EXPECT_EQ(open_period_ms(p, 1'000'000), 5'000);
  p.open_ms = 60'000;  // longer than max_open_ms: it stays as configured
  EXPECT_EQ(open_period_ms(p, 3), 60'000);
  EXPECT_EQ(open_period_ms(p, 9), 60'000);
  p = breaker(1, INT64_MAX / 3);  // no overflow
  p.max_open_ms = INT64_MAX;
  EXPECT_EQ(open_period_ms(p, 5), INT64_MAX);
}

// Task: a call that started before the circuit opened and succeeds once it is half-open is not
// the probe: it says nothing of the recovery, so the circuit stays half-open (the others keep
// waiting) until the probe itself reports; the probe's success then closes it.
TEST(CircuitBreakerTest, ALateSuccessWhileHalfOpenDoesNotCloseItTheProbesOwnDoes) {
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow);
  const CircuitRecord probing = begin_probe(open, kNow + 30'000);
  for (int64_t started : {kNow - 1, kNow + 10'000, kNow + 29'999}) {
    const CircuitRecord late =
        record_event(probing, CircuitEvent::kSuccess, breaker(5), started, kNow + 30'500);
    EXPECT_EQ(late.state, "half_open") << "a call begun at " << started - kNow;
    EXPECT_EQ(late.retry_at_ms, probing.retry_at_ms);
    EXPECT_EQ(late.updated_ms, probing.updated_ms) << "still the probe's start";
    EXPECT_FALSE(decide(late, kNow + 30'501).allowed) << "the others still wait for the probe";
  }
  const CircuitRecord probed =
      record_event(probing, CircuitEvent::kSuccess, breaker(5), kNow + 30'000, kNow + 30'600);
  EXPECT_EQ(probed.state, "closed");
  EXPECT_TRUE(decide(probed, kNow + 30'601).allowed);
}

// A late failure while half-open is no verdict on the recovery either: the probe decides.
TEST(CircuitBreakerTest, ALateFailureWhileHalfOpenDoesNotReopenItTheProbesOwnDoes) {
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow);
  const CircuitRecord probing = begin_probe(open, kNow + 30'000);
  const CircuitRecord late =
      record_event(probing, CircuitEvent::kFailure, breaker(5), kNow - 1, kNow + 30'200);
  EXPECT_EQ(late.state, "half_open");
  EXPECT_EQ(late.retry_at_ms, probing.retry_at_ms);
  const CircuitRecord probed =
      record_event(late, CircuitEvent::kFailure, breaker(5), kNow + 30'000, kNow + 30'500);
  EXPECT_EQ(probed.state, "open");
  EXPECT_EQ(probed.retry_at_ms, kNow + 90'500);
}

// While open, a failure of a call begun before the opening is the outage that opened it: it must
// not push the probe further away. One begun after (a host that had not seen the circuit open)
// is news, and opens it again from now.
TEST(CircuitBreakerTest, ALateFailureWhileOpenDoesNotPushTheProbeBack) {
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow);
  const CircuitRecord late =
      record_event(open, CircuitEvent::kFailure, breaker(5), kNow - 100, kNow + 20'000);
  EXPECT_EQ(late.opened_ms, kNow);
  EXPECT_EQ(late.retry_at_ms, kNow + 30'000);
  EXPECT_TRUE(decide(late, kNow + 30'000).allowed) << "the probe goes on time";
  const CircuitRecord news =
      record_event(open, CircuitEvent::kFailure, breaker(5), kNow + 5'000, kNow + 20'000);
  EXPECT_EQ(news.state, "open");
  EXPECT_EQ(news.opened_ms, kNow + 20'000);
  EXPECT_EQ(news.retry_at_ms, kNow + 50'000);
}

// A probe that did not report back within the open period was replaced by another; when it
// reports at last, the current probe is the one that decides.
TEST(CircuitBreakerTest, AReplacedProbesLateResultDoesNotDecide) {
  const CircuitRecord open = fail_times(CircuitRecord{}, 5, breaker(5, 30'000), kNow);
  const CircuitRecord first = begin_probe(open, kNow + 30'000);
  const CircuitRecord second = begin_probe(first, kNow + 60'000);
  for (CircuitEvent event : {CircuitEvent::kSuccess, CircuitEvent::kFailure}) {
    const CircuitRecord late =
        record_event(second, event, breaker(5), kNow + 30'000, kNow + 60'100);
    EXPECT_EQ(late.state, "half_open");
    EXPECT_EQ(late.retry_at_ms, kNow + 90'000);
  }
  EXPECT_EQ(
      record_event(second, CircuitEvent::kSuccess, breaker(5), kNow + 60'000, kNow + 60'200).state,
      "closed");
}

}  // namespace
}  // namespace backhaul::jobs
