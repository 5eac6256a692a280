// Fresh, empty job-store databases for the conformance suite: a temp file for SQLite, a new
// database on the `mariadb` CTest fixture's server for MySQL. Each test gets its own and drops it
// afterwards; open() may be called several times to get several store instances ("hosts") on the
// same data.
#pragma once

#include <memory>
#include <string>

#include "core/jobs/job_store.h"

namespace backhaul::jobs::testing {

enum class Backend { kSqlite = 1, kMysql };

std::string backend_name(Backend backend);  // "sqlite" | "mysql"

class TestDatabase {
 public:
  virtual ~TestDatabase() = default;
  // A new store instance on this database (migrated). [thread-safe]
  virtual std::unique_ptr<JobStore> open() = 0;
  // Where the data lives (path or database name), for failure messages.
  virtual std::string location() const = 0;

  // Throws std::runtime_error with the reason when the database cannot be created; for MySQL
  // that includes a missing connection file (the `mariadb` fixture did not run). Never skips.
  static std::unique_ptr<TestDatabase> create(Backend backend);
};

}  // namespace backhaul::jobs::testing
