// Property tests of the job store (seed 004: persistence round trip, newest-first listing, status
// filter), run against every backend as part of the conformance suite. Each property runs at
// least 100 random cases from a seeded PRNG; a failure prints the seed, and
// BACKHAUL_PROPERTY_SEED=<seed> replays it.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/core/jobs/job_store_fixture.h"

namespace backhaul::jobs::testing {
namespace {

constexpr int kCases = 100;

uint64_t property_seed() {
  if (const char* text = std::getenv("BACKHAUL_PROPERTY_SEED"); text != nullptr && *text != 0) {
    return std::strtoull(text, nullptr, 10);
  }
  return std::random_device{}() * uint64_t{0x100000000} + std::random_device{}();
}

std::string seed_note(uint64_t seed) {
  return "property seed " + std::to_string(seed) +
         " (replay with BACKHAUL_PROPERTY_SEED=" + std::to_string(seed) + ")";
}

class Random {
 public:
  explicit Random(uint64_t seed) : engine_(seed) {}
  int64_t between(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(engine_);
  }
  bool chance(double p) { return std::bernoulli_distribution(p)(engine_); }
  template <typename T>
  const T& pick(const std::vector<T>& items) {
    return items[static_cast<size_t>(between(0, static_cast<int64_t>(items.size()) - 1))];
  }

  // A code point of the Basic Multilingual Plane, printable, never a surrogate; biased towards
  // the ranges real text uses (ASCII, Latin, Cyrillic, CJK, symbols, private use).
  char32_t bmp_code_point() {
    switch (between(0, 5)) {
      case 0:
      case 1:
        return static_cast<char32_t>(between(0x20, 0x7E));
      case 2:
        return static_cast<char32_t>(between(0xA0, 0x7FF));
      case 3:
        return static_cast<char32_t>(between(0x800, 0xD7FF));
      case 4:
        return static_cast<char32_t>(between(0xE000, 0xFFFD));
      default:
        return static_cast<char32_t>(between(0x4E00, 0x9FFF));
    }
  }

  // Random BMP text of up to `max_chars` code points, UTF-8 encoded. With `json`, quotes and
  // backslashes are escaped so the text can sit inside a JSON string.
  std::string text(size_t max_chars, bool json = false) {
    std::string out;
    const auto n = static_cast<size_t>(between(0, static_cast<int64_t>(max_chars)));
    for (size_t i = 0; i < n; ++i) {
      char32_t cp = bmp_code_point();
      if (json && (cp == U'"' || cp == U'\\')) out += '\\';
      append_utf8(out, cp);
    }
    return out;
  }

 private:
  static void append_utf8(std::string& out, char32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::mt19937_64 engine_;
};

// --- Property 1: persistence round trip ------------------------------------------------------

JobSpec random_spec(Random& rng, int case_index, const std::vector<JobId>& earlier) {
  static const std::vector<std::string> kinds = {"backfill.run", "backfill.entity", "x",
                                                 "release.sync", "a.very.long.kind.name.v2"};
  JobSpec s;
  s.kind = rng.pick(kinds);
  s.payload = R"({"text":")" + rng.text(300, true) + R"(","n":)" +
              std::to_string(rng.between(-1'000'000, 1'000'000)) + "}";
  s.concurrency_key = rng.text(40);
  // Unique per case: the round trip is not about deduplication.
  if (rng.chance(0.5)) s.dedupe_key = "d" + std::to_string(case_index) + "-" + rng.text(30);
  s.priority = static_cast<int>(rng.between(-1000, 1000));
  s.max_attempts = static_cast<int>(rng.between(1, 25));
  s.run_after_ms = kT0 + rng.between(-kDay, 30 * kDay);
  if (!earlier.empty() && rng.chance(0.3)) s.parent_id = rng.pick(earlier);
  s.timeout_ms = rng.chance(0.5) ? 0 : rng.between(1, 10 * kHour);
  return s;
}

TEST_P(JobStoreConformance, PropertyEveryEnqueuedSpecRoundTripsThroughGet) {
  const uint64_t seed = property_seed();
  SCOPED_TRACE(seed_note(seed));
  Random rng(seed);
  std::vector<JobId> created;
  std::map<JobId, int> children;
  for (int i = 0; i < 2 * kCases && !HasFailure(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const JobSpec s = random_spec(rng, i, created);
    const int64_t now = kT0 + rng.between(0, 10 * kDay);
    EnqueueResult r = store().enqueue(s, now);
    ASSERT_TRUE(r.created);
    const Job j = get_job(r.id);
    EXPECT_EQ(j.kind, s.kind);
    EXPECT_EQ(j.payload, s.payload);
    EXPECT_EQ(j.concurrency_key, s.concurrency_key);
    EXPECT_EQ(j.dedupe_key, s.dedupe_key);
    EXPECT_EQ(j.priority, s.priority);
    EXPECT_EQ(j.max_attempts, s.max_attempts);
    EXPECT_EQ(j.run_after_ms, s.run_after_ms);
    EXPECT_EQ(j.parent_id, s.parent_id);
    EXPECT_EQ(j.timeout_ms, s.timeout_ms);
    EXPECT_EQ(j.status, JobStatus::kQueued);
    EXPECT_EQ(j.attempts, 0);
    EXPECT_EQ(j.created_ms, now);
    EXPECT_EQ(j.updated_ms, now);
    created.push_back(r.id);
    if (s.parent_id) ++children[*s.parent_id];
  }
  for (const auto& [parent, n] : children) {
    EXPECT_EQ(get_job(parent).pending_children, n) << "parent " << parent;
  }
}

// --- A random workload with a model of the expected statuses --------------------------------

// Drives one kind's jobs through random transitions and keeps the status each should have.
class Workload {
 public:
  Workload(JobStoreConformance& test, Random& rng, std::string kind, int64_t start_ms)
      : test_(test), rng_(rng), kind_(std::move(kind)), now_(start_ms) {}

  void run(int jobs) {
    for (int i = 0; i < jobs; ++i) {
      now_ += rng_.between(0, 1000);  // equal creation times happen too
      JobSpec s = JobStoreConformance::spec(kind_, "inst-" + std::to_string(rng_.between(1, 3)));
      s.max_attempts = 1000;  // a retryable failure always requeues
      JobId id = test_.add(s, now_);
      model_[id] = JobStatus::kQueued;
      order_.push_back(id);
      const int steps = static_cast<int>(rng_.between(0, 3));
      for (int k = 0; k < steps; ++k) step();
    }
  }

  const std::vector<JobId>& created() const { return order_; }
  std::set<JobId> expected(JobStatus status) const {
    std::set<JobId> out;
    for (const auto& [id, st] : model_) {
      if (st == status) out.insert(id);
    }
    return out;
  }

 private:
  JobStore& store() { return test_.store(); }

  void step() {
    ++now_;
    switch (rng_.between(0, 6)) {
      case 0:
        claim();
        break;
      case 1:
        with_running([&](JobId id, const std::string& token) { complete(id, token); });
        break;
      case 2:
        with_running([&](JobId id, const std::string& token) { fail(id, token, false); });
        break;
      case 3:
        with_running([&](JobId id, const std::string& token) { fail(id, token, true); });
        break;
      case 4:
        with_running([&](JobId id, const std::string& token) {
          store().defer(id, token, now_, "throttled", now_);
          back_to_queue(id);
        });
        break;
      case 5:
        with_running([&](JobId id, const std::string& token) {
          store().release(id, token, now_);
          back_to_queue(id);
        });
        break;
      default:
        cancel();
        break;
    }
  }

  void complete(JobId id, const std::string& token) {
    store().complete(id, token, "{}", now_);
    model_[id] = JobStatus::kSucceeded;
  }

  void fail(JobId id, const std::string& token, bool fatal) {
    Failure f;
    f.error = fatal ? "fatal" : "retryable";
    f.fatal = fatal;
    const JobStatus st = store().fail(id, token, f, now_);
    if (!fatal) {
      EXPECT_EQ(st, back_to_queue(id)) << id;
      return;
    }
    // Dead, or cancelled when a cancel was requested: which one is pinned by the example test
    // AFatalFailureOfACancelRequestedJobStillKillsIt, not by this property.
    if (cancel_requested_.count(id) && st == JobStatus::kCancelled) {
      model_[id] = st;
      return;
    }
    EXPECT_EQ(st, JobStatus::kDead) << id;
    model_[id] = JobStatus::kDead;
  }

  void claim() {
    ClaimRequest request{
        "prop-worker", static_cast<size_t>(rng_.between(1, 3)), now_, kDay, {kind_}};
    for (const Claimed& c : store().claim(request)) {
      EXPECT_EQ(model_[c.job.id], JobStatus::kQueued) << "claimed job " << c.job.id;
      model_[c.job.id] = JobStatus::kRunning;
      tokens_[c.job.id] = c.lease_token;
    }
  }

  void cancel() {
    const JobId id = rng_.pick(order_);
    const CancelOutcome outcome = store().cancel(id, now_);
    switch (model_[id]) {
      case JobStatus::kQueued:
        EXPECT_EQ(outcome, CancelOutcome::kCancelled) << id;
        model_[id] = JobStatus::kCancelled;
        return;
      case JobStatus::kRunning:
        EXPECT_EQ(outcome, CancelOutcome::kRequested) << id;
        cancel_requested_.insert(id);
        return;
      default:
        EXPECT_EQ(outcome, CancelOutcome::kAlreadyFinished) << id;
        return;
    }
  }

  template <typename F>
  void with_running(F apply) {
    if (tokens_.empty()) return;
    auto it = tokens_.begin();
    std::advance(it, rng_.between(0, static_cast<int64_t>(tokens_.size()) - 1));
    const JobId id = it->first;
    const std::string token = it->second;
    tokens_.erase(it);
    apply(id, token);
  }

  // Retry, defer and release requeue, unless a cancel was requested (the cancellation rule).
  JobStatus back_to_queue(JobId id) {
    JobStatus st = cancel_requested_.count(id) ? JobStatus::kCancelled : JobStatus::kQueued;
    model_[id] = st;
    return st;
  }

  JobStoreConformance& test_;
  Random& rng_;
  std::string kind_;
  int64_t now_;
  std::map<JobId, JobStatus> model_;
  std::vector<JobId> order_;
  std::map<JobId, std::string> tokens_;
  std::set<JobId> cancel_requested_;
};

// --- Property 2: listing is newest first -----------------------------------------------------

TEST_P(JobStoreConformance, PropertyListingIsNewestFirstWhateverHappenedToTheJobs) {
  const uint64_t seed = property_seed();
  SCOPED_TRACE(seed_note(seed));
  Random rng(seed);
  for (int i = 0; i < kCases && !HasFailure(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    Workload workload(*this, rng, "list.case" + std::to_string(i), kT0 + i * kDay);
    workload.run(static_cast<int>(rng.between(1, 15)));

    JobQuery query;
    query.kind = "list.case" + std::to_string(i);
    query.limit = static_cast<size_t>(rng.between(1, 8));
    const std::vector<Job> listed = list_all(query);
    std::vector<JobId> expected = workload.created();
    std::sort(expected.rbegin(), expected.rend());
    EXPECT_EQ(ids(listed), expected) << "page size " << query.limit;
    for (size_t k = 1; k < listed.size(); ++k) {
      EXPECT_GE(listed[k - 1].created_ms, listed[k].created_ms) << "position " << k;
    }
  }
}

// --- Property 3: the status filter returns exactly the jobs in that status --------------------

TEST_P(JobStoreConformance, PropertyStatusFilterReturnsExactlyTheJobsInThatStatus) {
  const uint64_t seed = property_seed();
  SCOPED_TRACE(seed_note(seed));
  Random rng(seed);
  const std::vector<JobStatus> statuses = {JobStatus::kQueued,  JobStatus::kRunning,
                                           JobStatus::kWaiting, JobStatus::kSucceeded,
                                           JobStatus::kDead,    JobStatus::kCancelled};
  for (int i = 0; i < kCases && !HasFailure(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const std::string kind = "status.case" + std::to_string(i);
    Workload workload(*this, rng, kind, kT0 + i * kDay);
    workload.run(static_cast<int>(rng.between(1, 12)));
    for (JobStatus status : statuses) {
      JobQuery query;
      query.kind = kind;
      query.status = status;
      query.limit = static_cast<size_t>(rng.between(1, 8));
      std::set<JobId> got;
      for (const Job& j : list_all(query)) {
        EXPECT_EQ(j.status, status) << describe(j);
        got.insert(j.id);
      }
      EXPECT_EQ(got, workload.expected(status)) << "status " << to_string(status);
    }
  }
}

}  // namespace
}  // namespace backhaul::jobs::testing
