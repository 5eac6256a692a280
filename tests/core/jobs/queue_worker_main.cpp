// A worker process for the multi-process queue test: runs a Scheduler on a shared SQLite store
// until no job of its kind is queued or running, then exits 0.
//   queue_worker SQLITE_PATH KIND OWNER
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "core/jobs/scheduler.h"

int main(int argc, char** argv) {
  using namespace backhaul::jobs;
  if (argc != 4) {
    std::fprintf(stderr, "usage: queue_worker SQLITE_PATH KIND OWNER\n");
    return 2;
  }
  const std::string kind = argv[2];
  auto store = open_sqlite_store(argv[1]);
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
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto counts = store->counts();
    if (counts[{kind, JobStatus::kQueued}] == 0 && counts[{kind, JobStatus::kRunning}] == 0) break;
  }
  scheduler.drain(std::chrono::milliseconds(2'000));
  return 0;
}
