// Three worker processes share one SQLite store and 10 000 jobs; one is killed with SIGKILL
// mid-run. Every job must end succeeded exactly once, no cap may ever be exceeded, and only the
// jobs the killed process held may have needed a second attempt.
#include <chrono>
#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "core/common/clock.h"
#include "core/jobs/job_store.h"
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace backhaul::jobs {
namespace {

namespace fs = std::filesystem;

pid_t spawn_worker(const std::string& db, const std::string& kind, const std::string& owner) {
  std::vector<std::string> args = {QUEUE_WORKER_PATH, db, kind, owner};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, QUEUE_WORKER_PATH, nullptr, nullptr, argv.data(), environ);
  if (rc != 0) throw std::runtime_error("posix_spawn failed: " + std::to_string(rc));
  return pid;
}

// Waits for `pid` to exit, at most `timeout`; returns its wait status, or -1 on timeout (the
// process is then killed, by its PID, so the test never leaves it behind).
int wait_for(pid_t pid, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

TEST(MultiProcessQueueTest, ThreeProcessesOneKilledEveryJobSucceedsOnceAndCapsHold) {
  const fs::path db =
      fs::temp_directory_path() / ("backhaul-multiprocess-" + std::to_string(::getpid()) + ".db");
  for (const char* s : {"", "-wal", "-shm"}) fs::remove(db.string() + s);
  const std::string kind = "mp";
  const int n = 10'000;
  {
    auto store = open_sqlite_store(db.string());
    store->set_caps(kind, {3, 8});
    std::vector<JobSpec> specs;
    for (int i = 0; i < n; ++i) {
      specs.push_back(
          {kind, "{}", "tenant-" + std::to_string(i % 10), std::nullopt, 0, 5, 0, {}, 0});
    }
    store->enqueue_batch(specs, SystemClock().now_ms());
  }

  std::vector<pid_t> pids;
  for (int i = 0; i < 3; ++i)
    pids.push_back(spawn_worker(db.string(), kind, "w" + std::to_string(i)));

  auto store = open_sqlite_store(db.string());
  // Kill the first worker once about a third of the jobs are done.
  for (int i = 0; i < 3000; ++i) {
    if (store->counts()[{kind, JobStatus::kSucceeded}] >= n / 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(kill(pids[0], SIGKILL), 0);
  int killed_status = wait_for(pids[0], std::chrono::seconds(10));
  ASSERT_TRUE(WIFSIGNALED(killed_status));
  for (size_t i = 1; i < pids.size(); ++i) {
    int status = wait_for(pids[i], std::chrono::seconds(240));
    ASSERT_NE(status, -1) << "worker " << i << " did not finish";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker " << i;
  }

  auto counts = store->counts();
  EXPECT_EQ((counts[{kind, JobStatus::kSucceeded}]), n);
  EXPECT_EQ((counts[{kind, JobStatus::kQueued}]), 0);
  EXPECT_EQ((counts[{kind, JobStatus::kRunning}]), 0);
  EXPECT_EQ((counts[{kind, JobStatus::kDead}]), 0);

  // Caps, as recorded by the store at every claim, across all three processes.
  EXPECT_LE(store->max_running_seen(kind, ""), 8);
  for (int t = 0; t < 10; ++t) {
    EXPECT_LE(store->max_running_seen(kind, "tenant-" + std::to_string(t)), 3) << "tenant " << t;
  }

  // Only what the killed process held (at most its 4 workers) ran a second time.
  int64_t attempts = 0;
  JobQuery query;
  query.kind = kind;
  query.limit = 1000;
  for (;;) {
    JobPage page = store->list(query);
    for (const Job& job : page.jobs) attempts += job.attempts;
    if (!page.next_before) break;
    query.before_id = page.next_before;
  }
  EXPECT_GE(attempts, n);
  EXPECT_LE(attempts, n + 4);

  store.reset();
  for (const char* s : {"", "-wal", "-shm"}) fs::remove(db.string() + s);
}

}  // namespace
}  // namespace backhaul::jobs
