// The SQLite backend of the job queue (SPEC D2) beyond the JobStore contract: tuning options and
// diagnostics for tests and benchmarks. open_sqlite_store() (job_store.h) returns a
// SqliteJobStore; dynamic_cast to reach these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/jobs/job_store.h"

namespace backhaul::jobs {

struct SqliteStoreOptions {
  size_t max_batch = 512;        // operations merged into one transaction at most
  size_t readers = 4;            // reader connections (0 = reads go through the writer)
  int busy_timeout_ms = 10'000;  // how long to wait for another process's write lock
  // Page caches: the writer's holds the hot index pages of claims and endings; readers look up
  // a few rows or list pages. Together they bound most of the store's memory.
  int writer_cache_kib = 16 * 1024;
  int reader_cache_kib = 2 * 1024;
  bool migrate = true;  // apply pending migrations on open
};

struct SqliteStoreStats {
  int64_t transactions = 0;  // write transactions run by the group-commit writer
  int64_t operations = 0;    // write operations merged into them
  int64_t max_batch = 0;     // most operations in one transaction
  // The SQLite virtual machine steps of claims' reads of the claim indexes: about proportional to
  // the index entries they visit (a claim that its group-commit batch re-ran counts twice).
  int64_t claim_read_steps = 0;
};

class SqliteJobStore : public JobStore {
 public:
  // A PRAGMA as the writer connection sees it ("journal_mode", "synchronous", ...). [thread-safe]
  virtual std::string writer_pragma(const std::string& name) = 0;
  virtual SqliteStoreStats stats() const = 0;
};

std::unique_ptr<SqliteJobStore> open_sqlite_store(const std::string& path,
                                                  const SqliteStoreOptions& options);

namespace detail {
// The statements with which claims read the claim indexes, for tests of their plans: `at`,
// `first` and `from` (see sqlite_store.cpp) on jobs_claim_kind, then on jobs_claim_key.
std::vector<std::string> claim_read_statements();
}  // namespace detail

}  // namespace backhaul::jobs
