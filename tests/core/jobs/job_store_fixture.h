// The fixture of the job-store conformance suite (SPEC D2): every TEST_P runs once per backend,
// each time on a fresh, empty database. Helpers keep the tests at the level of the contract.
// Times are injected: tests pass now_ms explicitly and never sleep.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/jobs/job.h"
#include "core/jobs/job_store.h"
#include "tests/core/jobs/test_databases.h"

namespace backhaul::jobs {

// Readable gtest output for the store's values.
inline void PrintTo(JobStatus status, std::ostream* os) { *os << to_string(status); }
inline void PrintTo(DeadLetterStatus status, std::ostream* os) { *os << to_string(status); }
inline void PrintTo(CancelOutcome outcome, std::ostream* os) {
  switch (outcome) {
    case CancelOutcome::kCancelled:
      *os << "kCancelled";
      return;
    case CancelOutcome::kRequested:
      *os << "kRequested";
      return;
    case CancelOutcome::kAlreadyFinished:
      *os << "kAlreadyFinished";
      return;
  }
  *os << "CancelOutcome(" << static_cast<int>(outcome) << ")";
}

namespace testing {

inline constexpr int64_t kSecond = 1'000;
inline constexpr int64_t kMinute = 60 * kSecond;
inline constexpr int64_t kHour = 60 * kMinute;
inline constexpr int64_t kDay = 24 * kHour;
inline constexpr int64_t kT0 = 1'700'000'000'000;  // an ordinary "now" (2023-11-14)
inline constexpr int64_t kLeaseMs = 30 * kSecond;
inline constexpr const char* kOwner = "host-a/worker-1";

// Every field of a job on one line, so that "nothing changed" is one comparison with a readable
// diff.
std::string describe(const Job& job);
std::string describe(const std::vector<Attempt>& attempts);
std::string describe(const DeadLetter& letter);

// A helper found something the test did not expect (reported as the test's failure).
class Unexpected : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Helpers are public so that tables of lambdas in tests can use them.
class JobStoreConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override;
  void TearDown() override;

 public:
  JobStore& store() { return *store_; }
  // Another store instance on the same database: a second host.
  std::unique_ptr<JobStore> open_another_host() { return db_->open(); }
  bool is_mysql() const { return GetParam() == Backend::kMysql; }

  // A plain spec: kind "entity", key "inst-1", a small JSON payload, five attempts.
  static JobSpec spec(std::string kind = "entity", std::string key = "inst-1");

  // Enqueues and returns the id; throws Unexpected when it was deduplicated.
  JobId add(const JobSpec& s, int64_t now_ms = kT0);
  JobId add_child(JobId parent, std::string kind = "entity", int64_t now_ms = kT0);
  std::vector<Claimed> claim(size_t limit, int64_t now_ms = kT0,
                             std::vector<std::string> kinds = {}, const std::string& owner = kOwner,
                             int64_t lease_ms = kLeaseMs);
  // Claims one job; throws Unexpected when none was claimable.
  Claimed claim_one(int64_t now_ms = kT0, const std::string& owner = kOwner,
                    int64_t lease_ms = kLeaseMs);
  // Claims one job of `id`'s kind and checks it is `id`.
  Claimed claim_job(JobId id, int64_t now_ms = kT0, const std::string& owner = kOwner,
                    int64_t lease_ms = kLeaseMs);
  Job get_job(JobId id);  // throws Unexpected when missing
  JobStatus status_of(JobId id) { return get_job(id).status; }

  // A job taken straight to dead by a FATAL failure: enqueue, claim, fail.
  JobId add_dead(const JobSpec& s, const std::string& error, int64_t now_ms = kT0);
  // The dead letter of a job; throws Unexpected when it has none or several.
  DeadLetter letter_of(JobId job_id);

  // Every page of a listing, following next_before (checks the cursor contract on the way).
  std::vector<Job> list_all(JobQuery query);
  std::vector<DeadLetter> letters_all(DeadLetterQuery query);
  static std::vector<JobId> ids(const std::vector<Job>& jobs);
  static std::vector<int64_t> ids(const std::vector<DeadLetter>& letters);
  static std::vector<JobId> ids(const std::vector<Claimed>& claimed);

  std::unique_ptr<TestDatabase> db_;
  std::unique_ptr<JobStore> store_;
};

// Names the instantiations "…/sqlite" and "…/mysql".
std::string backend_param_name(const ::testing::TestParamInfo<Backend>& info);

// The non-zero entries of a count map (a store may or may not report zero counts).
template <typename Map>
Map nonzero(const Map& counts) {
  Map out;
  for (const auto& [k, v] : counts) {
    if (v != 0) out.emplace(k, v);
  }
  return out;
}

}  // namespace testing
}  // namespace backhaul::jobs
