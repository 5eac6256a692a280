// A worker process for the multi-process queue test: runs a Scheduler on a shared job store until
// no job of its kind is queued or running, then exits 0 (1 when the store cannot be opened or
// fails, 2 on bad arguments).
//   queue_worker STORE KIND OWNER
// STORE names the backend and where its data is:
//   sqlite:PATH                 an SQLite file (open_sqlite_store)
//   mysql:CONNECTION            a MySQL/MariaDB database, CONNECTION being a Poco connection
//                               string such as host=127.0.0.1;port=3306;db=backhaul_x;user=u;
//                               password=p (open_mysql_store)
#include <chrono>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "core/jobs/scheduler.h"

namespace {

std::unique_ptr<backhaul::jobs::JobStore> open_store(std::string_view spec) {
  constexpr std::string_view kSqlite = "sqlite:";
  constexpr std::string_view kMysql = "mysql:";
  if (spec.substr(0, kSqlite.size()) == kSqlite) {
    return backhaul::jobs::open_sqlite_store(std::string(spec.substr(kSqlite.size())));
  }
  if (spec.substr(0, kMysql.size()) == kMysql) {
    return backhaul::jobs::open_mysql_store(std::string(spec.substr(kMysql.size())));
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace backhaul::jobs;
  if (argc != 4) {
    std::fprintf(stderr, "usage: queue_worker sqlite:PATH|mysql:CONNECTION KIND OWNER\n");
    return 2;
  }
  const std::string kind = argv[2];
  try {
    auto store = open_store(argv[1]);
    if (store == nullptr) {
      std::fprintf(stderr, "queue_worker: STORE must start with sqlite: or mysql:\n");
      return 2;
    }
    backhaul::SystemClock clock;
    SchedulerOptions options;
    options.owner = argv[3];
    options.workers = 4;
    options.claim_batch = 4;
    // Short enough that a killed process's jobs come back within seconds, long enough that a live
    // but slow (sanitized, loaded) process keeps its leases through heartbeats.
    options.lease_ms = 5'000;
    options.heartbeat_interval_ms = 500;
    options.sweep_interval_ms = 200;
    options.idle_poll_ms = 20;
    Scheduler scheduler(*store, clock, options);
    scheduler.register_handler(kind, [](JobContext&) {
      // A little work per job, so that a SIGKILL lands while jobs are in flight.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      return Outcome::complete();
    });
    scheduler.start();
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      auto counts = store->counts();
      if (counts[{kind, JobStatus::kQueued}] == 0 && counts[{kind, JobStatus::kRunning}] == 0) {
        break;
      }
    }
    scheduler.drain(std::chrono::milliseconds(2'000));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "queue_worker %s: %s\n", argv[3], e.what());
    return 1;
  }
}
