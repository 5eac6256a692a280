// Fresh, empty job-store databases for the store tests (the conformance suite, the multi-process
// test): a temp file for SQLite, a new database on the `mariadb` CTest fixture's server for MySQL.
// Each test gets its own and drops it afterwards; open() may be called several times to get
// several store instances ("hosts") on the same data, and store_spec() lets another process open
// it too.
#pragma once

#include <memory>
#include <ostream>
#include <string>

#include "core/jobs/job_store.h"

namespace backhaul::jobs::testing {

enum class Backend { kSqlite = 1, kMysql };

std::string backend_name(Backend backend);  // "sqlite" | "mysql"
inline void PrintTo(Backend backend, std::ostream* os) { *os << backend_name(backend); }

class TestDatabase {
 public:
  virtual ~TestDatabase() = default;
  // A new store instance on this database (migrated). [thread-safe]
  virtual std::unique_ptr<JobStore> open() = 0;
  // Where the data lives (path or database name), for failure messages.
  virtual std::string location() const = 0;
  // How another process opens this database: "sqlite:PATH" or "mysql:CONNECTION" (a Poco
  // connection string), the STORE argument of queue_worker.
  virtual std::string store_spec() const = 0;

  // Throws std::runtime_error with the reason when the database cannot be created; for MySQL
  // that includes a missing connection file (the `mariadb` fixture did not run). Never skips.
  // `purpose` goes into the temp directory's or database's name ("backhaul_<purpose>_...").
  static std::unique_ptr<TestDatabase> create(Backend backend,
                                              const std::string& purpose = "conformance");
};

}  // namespace backhaul::jobs::testing
