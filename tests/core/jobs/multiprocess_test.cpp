// Three worker processes (queue_worker) share one store and 10 000 jobs; one is killed with
// SIGKILL mid-run, after it has completed jobs and while it holds leases. Every job must end
// succeeded exactly once, no cap may ever be exceeded, and only the jobs the killed process held
// may have needed a second attempt, recovered by the sweeps of the surviving processes (this
// process never sweeps). One body, run on both backends: Sqlite/* on a temp file, Mysql/* on a
// fresh database on the `mariadb` CTest fixture's server (without it the test fails, never skips).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/common/clock.h"
#include "core/jobs/job_store.h"
#include "tests/core/jobs/test_databases.h"
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace backhaul::jobs::testing {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kJobs = 10'000;
constexpr int kProcesses = 3;
constexpr int kWorkersPerProcess = 4;  // queue_worker's Scheduler: workers = claim_batch = 4
constexpr int kTenants = 10;
constexpr Caps kCaps{3, 8};
const std::string kKind = "mp";
const std::string kKilled = "w0";  // the owner name of the process that is SIGKILLed

std::string owner_name(int i) { return "w" + std::to_string(i); }
std::string tenant_name(int i) { return "tenant-" + std::to_string(i); }

// The worker processes. Every one still running when this goes out of scope (a failed assertion
// returned early) is SIGKILLed by its PID and reaped, so the test never leaves one behind.
class Workers {
 public:
  Workers() = default;
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() {
    for (pid_t& pid : pids_) {
      if (pid <= 0) continue;
      ::kill(pid, SIGKILL);
      int status = 0;
      ::waitpid(pid, &status, 0);
      pid = 0;
    }
  }

  void spawn(const std::string& store_spec, const std::string& owner) {
    std::vector<std::string> args = {QUEUE_WORKER_PATH, store_spec, kKind, owner};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    int rc = posix_spawn(&pid, QUEUE_WORKER_PATH, nullptr, nullptr, argv.data(), environ);
    if (rc != 0) throw std::runtime_error("posix_spawn failed: " + std::to_string(rc));
    pids_.push_back(pid);
  }

  pid_t pid(size_t i) const { return pids_.at(i); }

  // The wait status of worker i if it has exited (it is then reaped), else nullopt.
  std::optional<int> exited(size_t i) {
    int status = 0;
    if (pids_.at(i) > 0 && ::waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
      pids_[i] = 0;
      return status;
    }
    return std::nullopt;
  }

  // Waits for worker i to exit, at most `timeout`; returns its wait status, or -1 on timeout
  // (it is then SIGKILLed by its PID and reaped).
  int wait(size_t i, SteadyClock::duration timeout) {
    const auto deadline = SteadyClock::now() + timeout;
    while (SteadyClock::now() < deadline) {
      if (auto status = exited(i)) return *status;
      std::this_thread::sleep_for(milliseconds(20));
    }
    kill_and_reap(i);
    return -1;
  }

  // SIGKILL by PID; returns the wait status.
  int kill_and_reap(size_t i) {
    int status = 0;
    ::kill(pids_.at(i), SIGKILL);
    ::waitpid(pids_[i], &status, 0);
    pids_[i] = 0;
    return status;
  }

  // Stops worker i (SIGSTOP) and returns once it is stopped.
  bool stop(size_t i) {
    if (::kill(pids_.at(i), SIGSTOP) != 0) return false;
    int status = 0;
    return ::waitpid(pids_[i], &status, WUNTRACED) == pids_[i] && WIFSTOPPED(status);
  }
  void resume(size_t i) { ::kill(pids_.at(i), SIGCONT); }

 private:
  std::vector<pid_t> pids_;
};

std::string describe_status(int status) {
  if (status == -1) return "timed out (killed)";
  if (WIFEXITED(status)) return "exited " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

// The ids of the running jobs whose lease `owner` holds (at most the global cap are running).
std::set<JobId> leases_of(JobStore& store, const std::string& owner) {
  JobQuery query;
  query.kind = kKind;
  query.status = JobStatus::kRunning;
  query.limit = 1000;
  std::set<JobId> ids;
  for (const Job& job : store.list(query).jobs) {
    if (job.lease_owner == owner) ids.insert(job.id);
  }
  return ids;
}

std::vector<Job> all_jobs(JobStore& store) {
  std::vector<Job> jobs;
  JobQuery query;
  query.kind = kKind;
  query.limit = 1000;
  for (;;) {
    JobPage page = store.list(query);
    jobs.insert(jobs.end(), page.jobs.begin(), page.jobs.end());
    if (!page.next_before) break;
    query.before_id = page.next_before;
  }
  return jobs;
}

std::string ids_text(const std::set<JobId>& ids) {
  std::ostringstream out;
  for (JobId id : ids) out << (out.tellp() > 0 ? " " : "") << id;
  return out.str();
}

std::string param_name(const ::testing::TestParamInfo<Backend>& param) {
  return backend_name(param.param);
}

class MultiProcessQueueTest : public ::testing::TestWithParam<Backend> {};

INSTANTIATE_TEST_SUITE_P(Sqlite, MultiProcessQueueTest, ::testing::Values(Backend::kSqlite),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Mysql, MultiProcessQueueTest, ::testing::Values(Backend::kMysql),
                         param_name);

TEST_P(MultiProcessQueueTest, ThreeProcessesOneKilledEveryJobSucceedsOnceAndCapsHold) {
  const auto started = SteadyClock::now();
  std::unique_ptr<TestDatabase> db;
  std::unique_ptr<JobStore> store;
  try {
    db = TestDatabase::create(GetParam(), "multiprocess");
    store = db->open();
  } catch (const std::exception& e) {
    FAIL() << "cannot open a fresh " << backend_name(GetParam()) << " job store: " << e.what();
  }
  ASSERT_NE(store, nullptr);
  SCOPED_TRACE(db->location());

  store->set_caps(kKind, kCaps);
  {
    std::vector<JobSpec> specs;
    for (int i = 0; i < kJobs; ++i) {
      specs.push_back({kKind, "{}", tenant_name(i % kTenants), std::nullopt, 0, 5, 0, {}, 0});
    }
    store->enqueue_batch(specs, SystemClock().now_ms());
  }

  Workers workers;
  for (int i = 0; i < kProcesses; ++i) workers.spawn(db->store_spec(), owner_name(i));

  // Fails the test when a worker has exited (none may before the kill).
  auto all_alive = [&]() -> ::testing::AssertionResult {
    for (int i = 0; i < kProcesses; ++i) {
      if (auto status = workers.exited(static_cast<size_t>(i))) {
        return ::testing::AssertionFailure()
               << "worker " << owner_name(i) << " " << describe_status(*status) << " early";
      }
    }
    return ::testing::AssertionSuccess();
  };

  // 1. Let about a third of the jobs finish. Sample the global running count on the way.
  int64_t succeeded = 0;
  int running_sampled = 0;
  for (const auto deadline = SteadyClock::now() + seconds(120);;) {
    ASSERT_TRUE(all_alive());
    succeeded = store->counts()[{kKind, JobStatus::kSucceeded}];
    running_sampled = std::max(running_sampled, store->running(kKind, ""));
    if (succeeded >= kJobs / 3) break;
    ASSERT_TRUE(SteadyClock::now() < deadline)
        << "only " << succeeded << " jobs succeeded in 120 s";
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_LE(running_sampled, kCaps.global);

  // 2. Kill worker 0 while it holds leases. It is stopped first (SIGSTOP) so that what it holds
  // cannot change while the store is read: two reads 50 ms apart (any commit it had already sent
  // lands in between) must agree and be non-empty; otherwise it runs on and we try again.
  std::set<JobId> held_at_kill;
  int stops = 0;
  for (const auto deadline = SteadyClock::now() + seconds(30);;) {
    ASSERT_TRUE(all_alive());
    ASSERT_TRUE(workers.stop(0)) << "cannot SIGSTOP worker " << kKilled;
    ++stops;
    std::set<JobId> held = leases_of(*store, kKilled);
    std::this_thread::sleep_for(milliseconds(50));
    if (!held.empty() && held == leases_of(*store, kKilled)) {
      held_at_kill = held;
      break;
    }
    workers.resume(0);
    ASSERT_TRUE(SteadyClock::now() < deadline)
        << "worker " << kKilled << " never seen holding a lease";
    std::this_thread::sleep_for(milliseconds(5));
  }
  const int killed_status = workers.kill_and_reap(0);
  ASSERT_TRUE(WIFSIGNALED(killed_status) && WTERMSIG(killed_status) == SIGKILL)
      << describe_status(killed_status);
  const auto killed_at = SteadyClock::now();
  // A commit the worker had sent before it stopped can still land on a loaded server (MariaDB
  // finishes a COMMIT it received from a client that is gone). Once two reads 200 ms apart agree,
  // well inside the 5 s lease, what it still holds is final: those jobs must run again.
  for (std::set<JobId> settled = held_at_kill;;) {
    std::this_thread::sleep_for(milliseconds(200));
    const std::set<JobId> now = leases_of(*store, kKilled);
    ASSERT_TRUE(std::includes(settled.begin(), settled.end(), now.begin(), now.end()))
        << "the killed worker holds a lease it did not hold when it was stopped";
    if (now == settled) {
      held_at_kill = now;
      break;
    }
    settled = now;
    ASSERT_LT(SteadyClock::now() - killed_at, seconds(2))
        << "the killed worker's leases kept changing";
  }

  // 3. The survivors finish everything, the killed worker's jobs included once their leases
  // expire and a survivor's sweep requeues them; each exits 0 when nothing is queued or running.
  for (int i = 1; i < kProcesses; ++i) {
    int status = workers.wait(static_cast<size_t>(i), seconds(240));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "worker " << owner_name(i) << " " << describe_status(status);
  }
  const auto finished_at = SteadyClock::now();

  auto counts = store->counts();
  EXPECT_EQ((counts[{kKind, JobStatus::kSucceeded}]), kJobs);
  EXPECT_EQ((counts[{kKind, JobStatus::kQueued}]), 0);
  EXPECT_EQ((counts[{kKind, JobStatus::kRunning}]), 0);
  EXPECT_EQ((counts[{kKind, JobStatus::kWaiting}]), 0);
  EXPECT_EQ((counts[{kKind, JobStatus::kDead}]), 0);
  EXPECT_EQ((counts[{kKind, JobStatus::kCancelled}]), 0);

  // 4. Caps, as recorded by the store at every claim, across all three processes.
  EXPECT_GE(store->max_running_seen(kKind, ""), 1);
  EXPECT_LE(store->max_running_seen(kKind, ""), kCaps.global);
  for (int t = 0; t < kTenants; ++t) {
    EXPECT_LE(store->max_running_seen(kKind, tenant_name(t)), kCaps.per_key) << tenant_name(t);
  }

  // 5. The attempt history of every job: exactly one success, as its last attempt; before it only
  // leases the killed worker lost (and a survivor's sweep expired). Exactly the jobs it held when
  // it was killed ran twice; it had completed others before.
  std::vector<Job> jobs = all_jobs(*store);
  ASSERT_EQ(jobs.size(), static_cast<size_t>(kJobs));
  std::vector<std::string> problems;
  std::set<JobId> retried;
  int64_t attempts_total = 0;
  int64_t succeeded_by_killed = 0;
  std::set<std::string> succeeded_by;
  for (const Job& job : jobs) {
    const std::vector<Attempt> history = store->attempts(job.id);
    attempts_total += static_cast<int64_t>(history.size());
    std::ostringstream what;
    if (job.status != JobStatus::kSucceeded) what << " status " << to_string(job.status) << ";";
    if (static_cast<size_t>(job.attempts) != history.size()) {
      what << " attempts " << job.attempts << " but " << history.size() << " attempt rows;";
    }
    if (history.empty() || history.back().outcome != "succeeded") {
      what << " last attempt not succeeded;";
    } else {
      succeeded_by.insert(history.back().owner);
      if (history.back().owner == kKilled) ++succeeded_by_killed;
    }
    for (size_t a = 0; a + 1 < history.size(); ++a) {
      if (history[a].outcome != "lease_expired" || history[a].owner != kKilled) {
        what << " attempt " << history[a].attempt << " by " << history[a].owner << " "
             << history[a].outcome << ";";
      }
    }
    if (history.size() > 1) {
      retried.insert(job.id);
      if (history.back().owner == kKilled) what << " retried by the killed worker;";
    }
    if (!what.str().empty() && problems.size() < 20) {
      problems.push_back("job " + std::to_string(job.id) + ":" + what.str());
    }
  }
  EXPECT_TRUE(problems.empty()) << ::testing::PrintToString(problems);
  EXPECT_EQ(attempts_total, kJobs + static_cast<int64_t>(held_at_kill.size()));
  EXPECT_EQ(ids_text(retried), ids_text(held_at_kill))
      << "the jobs that ran twice must be exactly those the killed worker held";
  // Its workers' jobs and the endings its finisher had not committed yet: all running, so the
  // global cap bounds them.
  EXPECT_LE(held_at_kill.size(), static_cast<size_t>(kCaps.global));
  EXPECT_GT(succeeded_by_killed, 0) << "the killed worker completed no job before it was killed";
  EXPECT_EQ(succeeded_by, (std::set<std::string>{"w0", "w1", "w2"}));

  const auto ms = [](auto d) { return std::chrono::duration_cast<milliseconds>(d).count(); };
  std::printf(
      "[ %s ] killed %s holding %zu leases after %lld jobs (stopped %d times); %lld ms to the "
      "kill, %lld ms "
      "from the kill to the survivors' exit, %lld ms in all\n",
      backend_name(GetParam()).c_str(), kKilled.c_str(), held_at_kill.size(),
      static_cast<long long>(succeeded), stops, static_cast<long long>(ms(killed_at - started)),
      static_cast<long long>(ms(finished_at - killed_at)),
      static_cast<long long>(ms(SteadyClock::now() - started)));

  store.reset();
  db.reset();  // removes the temp directory / drops the database
}

}  // namespace
}  // namespace backhaul::jobs::testing
