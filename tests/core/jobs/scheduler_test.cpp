// The scheduler over a real SQLite store: handler outcomes become the right store transitions,
// failures use the retry policy, cancellation and draining stop handlers at page boundaries.
#include "core/jobs/scheduler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "tests/core/jobs/forwarding_store.h"
#include <unistd.h>

namespace backhaul::jobs {
namespace {

namespace fs = std::filesystem;

// Sets `flag` when the scope ends, however it ends: a handler held by a test is let go, so the
// scheduler can be joined even after a failed assertion.
struct SetOnExit {
  std::atomic<bool>& flag;
  ~SetOnExit() { flag = true; }
};

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = fs::temp_directory_path() /
            ("backhaul-scheduler-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".db");
    fs::remove(path_);
    store_ = open_sqlite_store(path_.string());
  }
  void TearDown() override {
    store_.reset();
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(path_.string() + suffix);
  }

  SchedulerOptions options() {
    SchedulerOptions o;
    o.owner = "test-host";
    o.workers = 4;
    o.retry = {1'000, 2.0, 60'000};
    o.unit_random = [] { return 0.5; };  // jitter exactly 1.0
    return o;
  }

  // For tests of heartbeats: beats every 200 ms of the fake clock (the loop's rounds at most
  // 100 ms apart in real time), no sweeps but the tests'.
  SchedulerOptions beating(int workers, int64_t lease_ms) {
    SchedulerOptions o = options();
    o.workers = workers;
    o.lease_ms = lease_ms;
    o.heartbeat_interval_ms = 200;
    o.sweep_interval_ms = 3'600'000;
    return o;
  }

  // What `scheduler` reports of its store operation `operation` failing, if it does.
  static std::optional<StoreFailure> store_failure(const Scheduler& scheduler,
                                                   const std::string& operation) {
    const SchedulerStats stats = scheduler.stats();
    auto it = stats.store_failures.find(operation);
    if (it == stats.store_failures.end()) return std::nullopt;
    return it->second;
  }

  JobId enqueue(const std::string& kind, int max_attempts = 3) {
    JobSpec spec;
    spec.kind = kind;
    spec.payload = "{}";
    spec.max_attempts = max_attempts;
    return store_->enqueue(spec, clock_.now_ms()).id;
  }

  fs::path path_;
  FakeClock clock_;
  std::unique_ptr<JobStore> store_;
};

TEST_F(SchedulerTest, CompletedHandlersSucceedTheirJobsWithTheResult) {
  Scheduler scheduler(*store_, clock_, options());
  scheduler.register_handler("work", [](JobContext& c) {
    return Outcome::complete("{\"id\":" + std::to_string(c.job().id) + "}");
  });
  JobId a = enqueue("work");
  JobId b = enqueue("work");
  enqueue("other");  // no handler: never claimed
  EXPECT_EQ(scheduler.run_once(10), 2u);
  EXPECT_EQ(store_->get(a)->status, JobStatus::kSucceeded);
  EXPECT_EQ(*store_->get(b)->result, "{\"id\":" + std::to_string(b) + "}");
  EXPECT_EQ(scheduler.stats().succeeded, 2);
}

// A lease so long that its end passes the int64 range (lease_ms INT64_MAX: "never expires") ends
// at INT64_MAX, as the store keeps it: the job runs, and is not taken for a lease already run out.
TEST_F(SchedulerTest, ALeaseLongerThanTheInt64RangeStillRunsItsJob) {
  clock_.set_ms(1'700'000'000'000);
  SchedulerOptions o = options();
  o.lease_ms = INT64_MAX;
  Scheduler scheduler(*store_, clock_, o);
  int calls = 0;
  scheduler.register_handler("work", [&](JobContext&) {
    ++calls;
    return Outcome::complete("{}");
  });
  const JobId id = enqueue("work");
  EXPECT_EQ(scheduler.run_once(1), 1u);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(store_->get(id)->status, JobStatus::kSucceeded);
  EXPECT_EQ(scheduler.stats().released, 0);
}

TEST_F(SchedulerTest, RetryableFailureIsRetriedAfterThePolicyDelay) {
  Scheduler scheduler(*store_, clock_, options());
  scheduler.register_handler(
      "work", [](JobContext&) -> Outcome { throw std::runtime_error("upstream 503"); });
  JobId id = enqueue("work");
  scheduler.run_once(1);
  Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kQueued);
  EXPECT_EQ(job.attempts, 1);
  EXPECT_EQ(job.run_after_ms, clock_.now_ms() + 2'000);  // 1000 * 2^1 * 1.0
  EXPECT_EQ(*job.last_error, "upstream 503");

  clock_.advance_ms(2'000);
  scheduler.run_once(1);
  EXPECT_EQ(store_->get(id)->run_after_ms, clock_.now_ms() + 4'000);  // 1000 * 2^2
  clock_.advance_ms(4'000);
  scheduler.run_once(1);
  EXPECT_EQ(store_->get(id)->status, JobStatus::kDead);
  EXPECT_EQ(scheduler.stats().failed, 3);
}

TEST_F(SchedulerTest, FatalFailureGoesStraightToTheDeadLetters) {
  Scheduler scheduler(*store_, clock_, options());
  scheduler.register_handler(
      "work", [](JobContext&) -> Outcome { throw JobFailure("repository is gone", true); });
  JobId id = enqueue("work", 5);
  scheduler.run_once(1);
  EXPECT_EQ(store_->get(id)->status, JobStatus::kDead);
  auto letters = store_->list_dead_letters({});
  ASSERT_EQ(letters.items.size(), 1u);
  EXPECT_EQ(letters.items[0].job_id, id);
  EXPECT_EQ(letters.items[0].error, "repository is gone");
}

// A handler's retry-after is the least its retry waits: longer than the backoff, it is kept;
// shorter (a 503's "Retry-After: 1"), the backoff's delay is, where it replaced it and retried
// sooner.
TEST_F(SchedulerTest, AnExplicitRetryAfterIsTheLeastTheRetryWaits) {
  Scheduler scheduler(*store_, clock_, options());
  int64_t asked = 42'000;
  scheduler.register_handler(
      "work", [&](JobContext&) -> Outcome { throw JobFailure("slow down", false, asked); });
  const JobId id = enqueue("work");
  scheduler.run_once(1);
  EXPECT_EQ(store_->get(id)->run_after_ms, clock_.now_ms() + 42'000);

  const int64_t backoff = options().retry.delay_ms(1, options().unit_random);
  ASSERT_GT(backoff, 500);
  asked = 500;
  const JobId other = enqueue("work");
  scheduler.run_once(1);
  EXPECT_EQ(store_->get(other)->run_after_ms, clock_.now_ms() + backoff);
}

TEST_F(SchedulerTest, DeferIsNotAnAttempt) {
  Scheduler scheduler(*store_, clock_, options());
  scheduler.register_handler(
      "work", [](JobContext& c) { return Outcome::defer(c.now_ms() + 60'000, "rate limited"); });
  JobId id = enqueue("work", 1);
  for (int i = 0; i < 3; ++i) {
    scheduler.run_once(1);
    clock_.advance_ms(60'000);
  }
  Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kQueued);
  EXPECT_EQ(job.attempts, 0);
  EXPECT_EQ(scheduler.stats().deferred, 3);
}

TEST_F(SchedulerTest, CheckpointsAreSavedAndACancelStopsTheHandlerAtThePageBoundary) {
  Scheduler scheduler(*store_, clock_, options());
  int pages = 0;
  scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
    for (;;) {
      ++pages;
      if (pages == 3) store_->cancel(c.job().id, c.now_ms());  // an operator cancels mid-run
      c.checkpoint("{\"page\":" + std::to_string(pages) + "}");
    }
  });
  JobId id = enqueue("work");
  scheduler.run_once(1);
  Job job = *store_->get(id);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(job.status, JobStatus::kCancelled);
  EXPECT_EQ(*job.checkpoint, "{\"page\":3}");
  EXPECT_EQ(scheduler.stats().interrupted, 1);
}

TEST_F(SchedulerTest, FanInParentResumesWhenItsChildrenFinish) {
  Scheduler scheduler(*store_, clock_, options());
  scheduler.register_handler("parent", [](JobContext& c) {
    if (c.job().checkpoint) return Outcome::complete("{\"resumed\":true}");
    for (int i = 0; i < 3; ++i) {
      JobSpec child;
      child.kind = "child";
      child.payload = "{}";
      child.parent_id = c.job().id;
      c.store().enqueue(child, c.now_ms());
    }
    return Outcome::wait_for_children(c.now_ms() + 3'600'000, "{\"fanned_out\":3}");
  });
  scheduler.register_handler("child", [](JobContext&) { return Outcome::complete(); });
  JobId parent = enqueue("parent");
  scheduler.run_once(1);
  EXPECT_EQ(store_->get(parent)->status, JobStatus::kWaiting);
  EXPECT_EQ(scheduler.run_once(10), 3u);  // the children
  EXPECT_EQ(store_->get(parent)->status, JobStatus::kQueued);
  scheduler.run_once(1);
  EXPECT_EQ(store_->get(parent)->status, JobStatus::kSucceeded);
  EXPECT_EQ(*store_->get(parent)->result, "{\"resumed\":true}");
}

TEST_F(SchedulerTest, WorkerPoolRunsEveryJobExactlyOnce) {
  SystemClock clock;  // the loops run in real time here; nothing below depends on timing
  Scheduler scheduler(*store_, clock, options());
  std::atomic<int> calls{0};
  scheduler.register_handler("work", [&](JobContext&) {
    ++calls;
    return Outcome::complete();
  });
  std::vector<JobSpec> specs(300, JobSpec{"work", "{}", "k", std::nullopt, 0, 3, 0, {}, 0});
  store_->enqueue_batch(specs, clock.now_ms());
  scheduler.start();
  for (int i = 0; i < 600 && store_->counts()[{"work", JobStatus::kSucceeded}] < 300; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  scheduler.drain(std::chrono::milliseconds(1'000));
  EXPECT_EQ((store_->counts()[{"work", JobStatus::kSucceeded}]), 300);
  EXPECT_EQ(calls.load(), 300);
  EXPECT_EQ(scheduler.stats().in_flight, 0);
}

// A store that cannot record endings for a while, like one whose server is unreachable: its
// first `failures` finish() calls throw a transient StorageError or, with `per_item`, return
// every item retryable.
class UnreachableForAWhile : public ForwardingStore {
 public:
  UnreachableForAWhile(JobStore& inner, int failures, bool per_item)
      : ForwardingStore(inner), failures_(failures), per_item_(per_item) {}
  std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms) override {
    if (failures_ > 0) {
      --failures_;
      ++failed_;
      if (per_item_) return {items.size(), FinishResult{std::nullopt, false, "unreachable", true}};
      throw StorageError("server unreachable", true);
    }
    return inner().finish(items, now_ms);
  }
  int failed() const { return failed_; }

 private:
  std::atomic<int> failures_;
  std::atomic<int> failed_{0};
  bool per_item_;
};

// A store that fails heartbeats once `refuse` is set (transient, as a server that went away).
class FailsBeats : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                            const std::optional<std::string>& checkpoint, bool progress) override {
    if (refuse) throw StorageError("server unreachable", true);
    return inner().heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
  }
  std::atomic<bool> refuse{false};
};

// Waits (real time, up to 20 s) until `done` holds.
template <class Done>
void wait_for(Done&& done) {
  for (int i = 0; i < 400 && !done(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

// A handler that waits on something else between its checkpoints (here it only polls stopping())
// learns of a cancel from the scheduler's own heartbeat of its job, before its next checkpoint.
// Before, stopping() told of a drain only, and such a handler ran on until its next checkpoint.
TEST_F(SchedulerTest, StoppingTellsARunningHandlerOfACancelTheHeartbeatLearnt) {
  const SchedulerOptions o = beating(1, 60'000);
  Scheduler scheduler(*store_, clock_, o);
  std::atomic<bool> started{false};
  scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
    started = true;
    for (int i = 0; i < 15'000 && !c.stopping(); ++i) {  // past wait_for's 20 s
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    c.heartbeat();  // throws JobInterrupted once cancelled
    return Outcome::complete();
  });
  const JobId id = enqueue("work");
  scheduler.start();
  wait_for([&] { return started.load(); });
  ASSERT_TRUE(started);
  ASSERT_EQ(store_->cancel(id, clock_.now_ms()), CancelOutcome::kRequested);
  clock_.advance_ms(o.heartbeat_interval_ms);  // its beat is due: the store tells of the cancel
  wait_for([&] { return store_->get(id)->status == JobStatus::kCancelled; });
  EXPECT_EQ(store_->get(id)->status, JobStatus::kCancelled) << "the handler ran on";
  scheduler.drain(std::chrono::milliseconds(1'000));
  EXPECT_EQ(scheduler.stats().interrupted, 1);
}

// Review: a cancel the scheduler's heartbeat already learnt is what the handler hears at its next
// beat even when that beat fails (the store went away meanwhile). Before, the beat's StorageError
// ended the job as a failed attempt: a dead letter, on its last attempt.
TEST_F(SchedulerTest, ACancelAlreadyLearntIsHeardAtABeatThatFails) {
  FailsBeats store(*store_);
  const SchedulerOptions o = beating(1, 60'000);
  Scheduler scheduler(store, clock_, o);
  std::atomic<bool> started{false};
  scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
    started = true;
    for (int i = 0; i < 15'000 && !c.stopping(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    store.refuse = true;
    c.heartbeat();  // fails; the cancel stands
    return Outcome::complete();
  });
  const JobId id = enqueue("work", 1);
  scheduler.start();
  wait_for([&] { return started.load(); });
  ASSERT_TRUE(started);
  ASSERT_EQ(store_->cancel(id, clock_.now_ms()), CancelOutcome::kRequested);
  clock_.advance_ms(o.heartbeat_interval_ms);  // its beat is due: the store tells of the cancel
  wait_for([&] { return store_->get(id)->status != JobStatus::kRunning; });
  EXPECT_EQ(store_->get(id)->status, JobStatus::kCancelled);
  EXPECT_FALSE(store_->get(id)->last_error.has_value()) << *store_->get(id)->last_error;
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// An ending the store cannot record is tried again for as long as the job's lease lasts (the
// clock stands still here), beyond the 5 tries of a stopping scheduler: an outage of the store
// shorter than the lease runs no job twice and counts no attempt for it.
TEST_F(SchedulerTest, AnEndingIsRecordedOnceTheStoreIsBackWhileItsLeaseLasts) {
  for (bool per_item : {false, true}) {
    SCOPED_TRACE(per_item ? "items come back retryable" : "finish() throws");
    UnreachableForAWhile store(*store_, 5, per_item);
    const JobId id = enqueue("work", 1);
    std::atomic<int> runs{0};
    Scheduler scheduler(store, clock_, options());
    scheduler.register_handler("work", [&](JobContext&) {
      ++runs;
      return Outcome::complete();
    });
    scheduler.start();
    wait_for([&] { return store_->get(id)->status == JobStatus::kSucceeded; });
    scheduler.drain(std::chrono::milliseconds(1'000));
    EXPECT_EQ(store_->get(id)->status, JobStatus::kSucceeded);
    EXPECT_EQ(store_->get(id)->attempts, 1);
    EXPECT_EQ(runs.load(), 1);
    EXPECT_EQ(store.failed(), 5);
    EXPECT_EQ(scheduler.stats().succeeded, 1);
  }
}

// Once the lease has run out, the sweep may have taken the job back already: the scheduler stops
// trying after 5 tries and leaves the job to it.
TEST_F(SchedulerTest, AnEndingIsGivenUpAfterFiveTriesOnceItsLeaseRanOut) {
  UnreachableForAWhile store(*store_, 1'000, false);
  const JobId id = enqueue("work", 3);
  SchedulerOptions o = options();
  o.lease_ms = 1'000;
  o.heartbeat_interval_ms = 200;
  Scheduler scheduler(store, clock_, o);
  scheduler.register_handler("work", [&](JobContext&) {
    clock_.advance_ms(2'000);  // the handler outlived its lease
    return Outcome::complete();
  });
  scheduler.start();
  wait_for([&] { return store.failed() >= 5; });
  std::this_thread::sleep_for(std::chrono::milliseconds(1'500));  // time for a 6th try
  scheduler.drain(std::chrono::milliseconds(1'000));
  EXPECT_EQ(store.failed(), 5);
  EXPECT_EQ(store_->get(id)->status, JobStatus::kRunning) << "left to the sweep";
  EXPECT_EQ(scheduler.stats().succeeded, 0);
}

// A store that refuses one job's ending (retryable, as a lock wait timeout on that one row would
// be) while it records every other job's. Found by a review: the finisher retried that one for as
// long as its lease lasted, and every ending handed over meanwhile waited behind it, even those
// the store would record, until their own leases ran out and the sweep took their jobs back (run
// twice). They now go along with the retry.
// A handler that counts its job in `running`, then holds it until `release` is set.
Handler held_until(const std::atomic<bool>& release, std::atomic<int>& running) {
  return [&release, &running](JobContext&) {
    ++running;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Outcome::complete();
  };
}

// A store whose finish() answers some items itself (`refuse` returns their result) and passes
// the others on to the real store.
class RefusesEndings : public ForwardingStore {
 public:
  explicit RefusesEndings(JobStore& inner) : ForwardingStore(inner) {}
  virtual std::optional<FinishResult> refuse(const Finish& item) = 0;
  std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms) override {
    std::vector<FinishResult> out(items.size());
    std::vector<Finish> pass;
    std::vector<size_t> where;
    for (size_t i = 0; i < items.size(); ++i) {
      if (std::optional<FinishResult> refused = refuse(items[i])) {
        out[i] = std::move(*refused);
      } else {
        pass.push_back(items[i]);
        where.push_back(i);
      }
    }
    if (!pass.empty()) {
      std::vector<FinishResult> got = inner().finish(pass, now_ms);
      for (size_t k = 0; k < got.size(); ++k) out[where[k]] = std::move(got[k]);
    }
    return out;
  }
};

class RefusesOneJob : public RefusesEndings {
 public:
  explicit RefusesOneJob(JobStore& inner) : RefusesEndings(inner) {}
  std::atomic<JobId> refused{-1};
  std::atomic<int> refusals{0};
  std::optional<FinishResult> refuse(const Finish& item) override {
    if (item.id != refused.load()) return std::nullopt;
    ++refusals;
    return FinishResult{std::nullopt, false, "lock wait timeout", true};
  }
};

TEST_F(SchedulerTest, OneEndingTheStoreKeepsRefusingHoldsBackNoOther) {
  RefusesOneJob store(*store_);
  const JobId slow = enqueue("slow", 3);
  std::atomic<bool> slow_started{false}, release_slow{false};
  std::atomic<int> slow_runs{0};
  Scheduler scheduler(store, clock_, options());  // lease 30 s, heartbeat every 10 s
  scheduler.register_handler("slow", [&](JobContext&) {
    ++slow_runs;
    slow_started = true;
    while (!release_slow) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return Outcome::complete();
  });
  scheduler.register_handler("poison", [&](JobContext&) { return Outcome::complete(); });
  scheduler.start();
  wait_for([&] { return slow_started.load(); });
  clock_.advance_ms(9'000);  // no heartbeat due yet: slow's lease ends at 30 s
  const JobId poison = enqueue("poison", 3);
  store.refused = poison;  // its lease ends at 39 s
  wait_for([&] { return store.refusals.load() >= 1; });
  release_slow = true;  // the store would record this one at once
  for (int i = 0; i < 60 && store_->get(slow)->status != JobStatus::kSucceeded; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(store_->get(slow)->status, JobStatus::kSucceeded)
      << "slow's ending, which the store accepts, waits behind the refused one";
  // What follows: slow's lease runs out while the finisher still retries poison (39 s), the sweep
  // takes slow back, and it runs a second time.
  clock_.advance_ms(22'000);  // 31 s
  store_->sweep(clock_.now_ms());
  wait_for(
      [&] { return slow_runs.load() >= 2 || store_->get(slow)->status == JobStatus::kSucceeded; });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(slow_runs.load(), 1) << "slow ran twice";
  EXPECT_EQ(store_->get(slow)->attempts, 1);
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// A store whose finish() blocks, while a batch holds job `blocked`, until `release` (as a MySQL
// COMMIT trip waits for a row another transaction holds, for up to its lock wait timeout, twice),
// and that notes the time of each job's last heartbeat.
class BlocksAFinish : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms) override {
    const bool holds = std::any_of(items.begin(), items.end(),
                                   [&](const Finish& f) { return f.id == blocked.load(); });
    if (holds) {
      waiting = true;
      for (int i = 0; i < 12000 && !release; ++i)  // at most a minute
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return inner().finish(items, now_ms);
  }
  HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                            const std::optional<std::string>& checkpoint, bool progress) override {
    HeartbeatResult r = inner().heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    std::lock_guard lock(mutex_);
    last_beat_[id] = now_ms;
    return r;
  }
  int64_t last_beat(JobId id) {
    std::lock_guard lock(mutex_);
    auto it = last_beat_.find(id);
    return it == last_beat_.end() ? -1 : it->second;
  }
  std::atomic<JobId> blocked{-1};
  std::atomic<bool> waiting{false}, release{false};

 private:
  std::mutex mutex_;
  std::map<JobId, int64_t> last_beat_;
};

// Review: a job whose handler had returned was dropped from the heartbeats at once, though its
// ending then waited for the finisher, which makes one store call at a time: behind a call that
// waits for a locked row (on MySQL up to 50 s, tried twice), the leases of the jobs that ended
// meanwhile ran out, another host's sweep took them back (counting an attempt), and they ran
// again. A job is heartbeated until its ending is recorded, except while that ending is in the
// finish call under way.
TEST_F(SchedulerTest, AJobIsHeartbeatedUntilItsEndingIsRecorded) {
  BlocksAFinish store(*store_);
  SetOnExit let_go{store.release};
  const JobId first = enqueue("work");
  store.blocked = first;
  std::atomic<int> runs{0};
  Scheduler scheduler(store, clock_, beating(2, 1'000));  // lease 1 s, a beat every 0.2 s
  scheduler.register_handler("work", [&](JobContext&) {
    ++runs;
    return Outcome::complete();
  });
  scheduler.start();
  wait_for([&] { return store.waiting.load(); });
  ASSERT_TRUE(store.waiting) << "the first job's ending never reached the store";
  const JobId second = enqueue("work");  // its ending waits behind the first's
  wait_for([&] { return runs.load() == 2; });
  ASSERT_EQ(runs.load(), 2);
  const int64_t first_beats = store.last_beat(first);
  for (int step = 0; step < 8; ++step) {  // 2.4 s: past its lease, unless renewed
    clock_.advance_ms(300);
    const int64_t now = clock_.now_ms();
    wait_for([&] { return store.last_beat(second) >= now; });
    ASSERT_GE(store.last_beat(second), now) << "the ended job's lease was not renewed";
  }
  EXPECT_GT(store_->get(second)->lease_expires_ms, clock_.now_ms());
  // The first's ending is in the finish call under way, which on MySQL holds its row: a beat
  // would wait for that call, holding up a lane, so none is made.
  EXPECT_EQ(store.last_beat(first), first_beats);
  store.release = true;
  wait_for([&] {
    return store_->get(first)->status == JobStatus::kSucceeded &&
           store_->get(second)->status == JobStatus::kSucceeded;
  });
  EXPECT_EQ(store_->get(first)->status, JobStatus::kSucceeded);
  EXPECT_EQ(store_->get(second)->status, JobStatus::kSucceeded);
  EXPECT_EQ(store_->get(second)->attempts, 1);
  EXPECT_EQ(runs.load(), 2) << "a job ran twice";
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// A store whose finish() waits (up to 5 s) until a claim has come after the handler's return:
// the claim a worker's end prompts then always runs before the ending commits, and finds the
// key's cap still taken.
class ClaimsBeforeTheEnding : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::vector<Claimed> claim(const ClaimRequest& request) override {
    std::vector<Claimed> got = inner().claim(request);
    ++claims;
    return got;
  }
  std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms) override {
    const int after = claims_at_return.load();
    for (int i = 0; i < 1000 && claims.load() <= after; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return inner().finish(items, now_ms);
  }
  std::atomic<int> claims{0}, claims_at_return{0};
};

// Review: the end of a job woke the claim loop before its ending committed, and the commit woke
// nothing (only a job back in the queue did): the next job of a key at its cap waited for the idle
// poll (200 ms by default; here an hour) after every job of that key. The commit now wakes the
// claim loop at a moment drawn within the idle poll: here the draw is 0, at once.
TEST_F(SchedulerTest, TheCommitOfAnEndingWakesTheClaimLoopForTheNextJobOfACappedKey) {
  ClaimsBeforeTheEnding store(*store_);
  store_->set_caps("work", {1, 0});
  SystemClock clock;
  SchedulerOptions o = options();
  o.idle_poll_ms = 3'600'000;
  o.unit_random = [] { return 0.0; };
  Scheduler scheduler(store, clock, o);
  std::atomic<int> runs{0};
  scheduler.register_handler("work", [&](JobContext&) {
    ++runs;
    store.claims_at_return = store.claims.load();
    return Outcome::complete();
  });
  std::vector<JobId> ids;
  for (int i = 0; i < 3; ++i) {
    JobSpec spec;
    spec.kind = "work";
    spec.payload = "{}";
    spec.concurrency_key = "tenant";
    ids.push_back(store_->enqueue(spec, clock.now_ms()).id);
  }
  scheduler.start();
  wait_for([&] { return runs.load() == 3; });
  EXPECT_EQ(runs.load(), 3) << "the next job of the capped key waited for the idle poll";
  scheduler.drain(std::chrono::milliseconds(1'000));
  for (JobId id : ids) EXPECT_EQ(store_->get(id)->status, JobStatus::kSucceeded);
}

// Two hosts share a store and a key capped at one running job. The host whose job ends claims the
// place it freed at a moment drawn within its idle poll, not at once, so the other host, polling,
// has an equal chance at it: each runs a fair part of the key's jobs. Woken at once by its own
// commits (the moment drawn as 0), one host took back the places it freed, and in 3 runs of 20
// the other ran 5 jobs of 60 or fewer. (On one store object in one process, the other host's
// claim often reaches SQLite's writer during the commit, ahead of the woken claim: across
// processes, the starvation was complete.)
TEST_F(SchedulerTest, HostsSharingAStoreShareTheCapPlacesThatEndingsFree) {
  store_->set_caps("work", {1, 0});
  SystemClock clock;
  constexpr int kJobs = 60;
  for (int i = 0; i < kJobs; ++i) {
    JobSpec spec;
    spec.kind = "work";
    spec.payload = "{}";
    spec.concurrency_key = "tenant";
    store_->enqueue(spec, clock.now_ms());
  }
  std::atomic<int> done{0};
  std::vector<std::unique_ptr<Scheduler>> hosts;
  std::vector<std::unique_ptr<std::atomic<int>>> runs;
  for (const char* owner : {"host-a", "host-b"}) {
    SchedulerOptions o = options();
    o.owner = owner;
    o.idle_poll_ms = 20;
    o.unit_random = default_unit_random;
    hosts.push_back(std::make_unique<Scheduler>(*store_, clock, o));
    runs.push_back(std::make_unique<std::atomic<int>>(0));
    std::atomic<int>& mine = *runs.back();
    hosts.back()->register_handler("work", [&](JobContext&) {
      ++mine;
      ++done;
      return Outcome::complete();
    });
  }
  for (auto& host : hosts) host->start();
  wait_for([&] { return done.load() == kJobs; });
  for (auto& host : hosts) host->drain(std::chrono::milliseconds(1'000));
  ASSERT_EQ(done.load(), kJobs);
  for (size_t i = 0; i < hosts.size(); ++i) {
    EXPECT_GE(runs[i]->load(), kJobs / 6)
        << "host " << i << " ran " << runs[i]->load() << " of " << kJobs;
  }
}

// A store whose claims take a while (so that several claim loops' calls overlap) and that counts
// the jobs handed out and not yet returned by their handlers.
class SlowClaims : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::vector<Claimed> claim(const ClaimRequest& request) override {
    ++calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::vector<Claimed> got = inner().claim(request);
    const int now_out = out += static_cast<int>(got.size());
    int seen = most_out.load();
    while (now_out > seen && !most_out.compare_exchange_weak(seen, now_out)) {
    }
    return got;
  }
  std::atomic<int> calls{0}, out{0}, most_out{0};
};

// Several claim loops (claimers) fill the workers' places together, one job per claim call each,
// and never claim more than the places free: their claims, under way at once, reserve the places
// they may fill. Every job runs once.
TEST_F(SchedulerTest, SeveralClaimLoopsNeverHoldMoreJobsThanThePlacesAndRunEachOnce) {
  SlowClaims store(*store_);
  SystemClock clock;
  SchedulerOptions o = options();
  o.workers = 4;
  o.prefetch = 2;
  o.claim_batch = 1;
  o.claimers = 6;
  Scheduler scheduler(store, clock, o);
  std::mutex mutex;
  std::map<JobId, int> runs;
  std::atomic<int> running{0}, most_running{0};
  scheduler.register_handler("work", [&](JobContext& c) {
    const int now_running = ++running;
    int seen = most_running.load();
    while (now_running > seen && !most_running.compare_exchange_weak(seen, now_running)) {
    }
    {
      std::lock_guard lock(mutex);
      ++runs[c.job().id];
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // places stay full: loops wait
    --running;
    --store.out;  // returned: its place may be claimed again
    return Outcome::complete();
  });
  std::vector<JobSpec> specs(120);
  for (JobSpec& spec : specs) {
    spec.kind = "work";
    spec.payload = "{}";
  }
  store_->enqueue_batch(specs, clock.now_ms());
  scheduler.start();
  wait_for([&] {
    std::lock_guard lock(mutex);
    return runs.size() == specs.size();
  });
  scheduler.drain(std::chrono::milliseconds(1'000));
  EXPECT_EQ(runs.size(), specs.size());
  for (const auto& [id, n] : runs) EXPECT_EQ(n, 1) << "job " << id;
  EXPECT_LE(most_running.load(), 4);
  EXPECT_LE(store.most_out.load(), 4 + 2) << "more jobs claimed than workers + prefetch";
  EXPECT_GE(store.calls.load(), 120) << "one job per claim call";
}

// An ending retried through an outage while its lease lasted still gets 5 tries once the
// scheduler stops (found by a review: it got one, since the tries before the stop were counted).
TEST_F(SchedulerTest, ADrainDuringAnOutageStillTriesTheEndingFiveTimes) {
  UnreachableForAWhile store(*store_, 7, false);
  const JobId id = enqueue("work", 3);
  Scheduler scheduler(store, clock_, options());  // lease 30 s, the clock stands still
  scheduler.register_handler("work", [&](JobContext&) { return Outcome::complete(); });
  scheduler.start();
  wait_for([&] { return store.failed() >= 6; });  // tried through the lease beyond 5 times
  scheduler.drain(std::chrono::milliseconds(1'000));
  EXPECT_EQ(store.failed(), 7);
  EXPECT_EQ(store_->get(id)->status, JobStatus::kSucceeded)
      << "given up on the first try after the stop; the store took the second";
}

// A store that refuses the writes of the operations switched on, as a MySQL server turned
// read-only refuses them (error 1290, transient).
class RefusesWrites : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::vector<Claimed> claim(const ClaimRequest& request) override {
    refuse_if(claims);
    return inner().claim(request);
  }
  HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                            const std::optional<std::string>& checkpoint, bool progress) override {
    refuse_if(beats);
    return inner().heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
  }
  std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms) override {
    refuse_if(endings);
    return inner().finish(items, now_ms);
  }
  SweepResult sweep(int64_t now_ms) override {
    refuse_if(sweeps);
    return inner().sweep(now_ms);
  }
  std::atomic<bool> claims{false}, beats{false}, endings{false}, sweeps{false};

 private:
  static void refuse_if(const std::atomic<bool>& refused) {
    if (refused) throw StorageError("mysql: error 1290: the server is running read-only", true);
  }
};

// A claim that failed waits out its backoff before the store is asked again: jobs made runnable
// meanwhile (each wakes the claim loop, as each job's end does) do not cut it short, so a store
// that is down is not hammered. A drain still ends the wait at once.
TEST_F(SchedulerTest, AFailedClaimWaitsOutItsBackoffThoughJobsBecomeRunnableMeanwhile) {
  struct Unreachable : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    std::vector<Claimed> claim(const ClaimRequest&) override {
      ++claims;
      throw StorageError("mysql: error 2013: Lost connection to server during query", true);
    }
    void job_made_runnable() { notify_runnable(); }
    std::atomic<int> claims{0};
  };
  Unreachable store(*store_);
  SchedulerOptions o = options();
  o.idle_poll_ms = 60'000;  // the first claim backoff
  Scheduler scheduler(store, clock_, o);
  scheduler.register_handler("work", [](JobContext&) { return Outcome::complete(); });
  scheduler.start();
  for (int i = 0; i < 5'000 && store.claims == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(store.claims.load(), 1);
  for (int i = 0; i < 20; ++i) {
    store.job_made_runnable();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(store.claims.load(), 1) << "the claim backoff was cut short by wakeups";

  const auto drain_started = std::chrono::steady_clock::now();
  scheduler.drain(std::chrono::milliseconds(1'000));
  EXPECT_LT(std::chrono::steady_clock::now() - drain_started, std::chrono::seconds(10));
  EXPECT_EQ(store.claims.load(), 1);
}

// stats().store_failures names each store operation whose calls keep failing, since its first
// failure (the clock moving on does not move it), until the operation is no longer failing: a
// claim or sweep that succeeds, an ending recorded, no job whose beat failed left in hand. This
// is what /health/ready reads to tell a store that answers reads but refuses writes.
TEST_F(SchedulerTest, StoreOperationsThatKeepFailingAreReportedUntilTheyAreNotFailingAnyMore) {
  RefusesWrites store(*store_);
  const JobId id = enqueue("work", 1);
  SchedulerOptions o = options();
  o.idle_poll_ms = 20;  // claim backoff starts here
  o.sweep_interval_ms = 20;
  o.heartbeat_interval_ms = 200;  // rounds every 100 ms (real time) at most
  Scheduler scheduler(store, clock_, o);
  std::atomic<bool> release{false};
  scheduler.register_handler("work", [&](JobContext&) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return Outcome::complete();
  });
  auto failure = [&](const char* operation) { return store_failure(scheduler, operation); };
  store.claims = true;
  scheduler.start();
  store.sweeps = true;  // after start(), whose recovery sweep must succeed
  const int64_t first_failure_ms = clock_.now_ms();

  wait_for([&] { return failure("claim") && failure("claim")->failures >= 2; });
  ASSERT_TRUE(failure("claim"));
  EXPECT_EQ(failure("claim")->since_ms, first_failure_ms);
  EXPECT_NE(failure("claim")->error.find("1290"), std::string::npos) << failure("claim")->error;
  EXPECT_EQ(failure("claim")->last_ms, first_failure_ms);
  clock_.advance_ms(1'000);
  const int64_t failures = failure("claim")->failures;
  wait_for([&] { return failure("claim")->failures > failures; });
  EXPECT_EQ(failure("claim")->since_ms, first_failure_ms) << "failing since the first failure";
  EXPECT_EQ(failure("claim")->last_ms, first_failure_ms + 1'000);
  wait_for([&] { return failure("sweep").has_value(); });
  EXPECT_TRUE(failure("sweep"));

  store.beats = true;
  store.endings = true;
  store.claims = false;
  store.sweeps = false;
  wait_for([&] { return !failure("claim") && !failure("sweep"); });
  EXPECT_FALSE(failure("claim")) << "a claim succeeded";
  EXPECT_FALSE(failure("sweep")) << "a sweep succeeded";
  wait_for([&] { return scheduler.stats().in_flight == 1 && store_->get(id)->attempts == 1; });
  clock_.advance_ms(o.heartbeat_interval_ms);  // the running job's beat is due
  wait_for([&] { return failure("heartbeat").has_value(); });
  ASSERT_TRUE(failure("heartbeat"));
  EXPECT_EQ(failure("heartbeat")->since_ms, clock_.now_ms());

  release = true;  // its ending cannot be recorded
  wait_for([&] { return failure("finish").has_value(); });
  ASSERT_TRUE(failure("finish"));
  EXPECT_NE(failure("finish")->error.find("read-only"), std::string::npos);
  store.endings = false;
  wait_for([&] { return store_->get(id)->status == JobStatus::kSucceeded; });
  EXPECT_EQ(store_->get(id)->status, JobStatus::kSucceeded);
  // The job whose beats failed is no longer in hand: heartbeats are not failing either, although
  // the store still refuses them.
  wait_for([&] { return scheduler.stats().store_failures.empty(); });
  EXPECT_TRUE(scheduler.stats().store_failures.empty());
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// A job whose heartbeat-loop beat failed once (a blip) and whose handler then checkpoints more
// often than the heartbeat interval is not beaten by the loop again (its checkpoints keep its
// lease fresh). Its checkpoints are heartbeats too: their success clears "heartbeat" (found by
// review: it stayed failing from the blip for as long as the job ran, hours for a backfill, and
// failed readiness on a healthy store).
TEST_F(SchedulerTest, AHeartbeatBlipIsClearedByTheCheckpointsThatFollow) {
  struct LoopBeatFailsOnce : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                              const std::optional<std::string>& checkpoint,
                              bool progress) override {
      if (!checkpoint && refuse_next_loop_beat.exchange(false)) {
        ++refused;
        throw StorageError("mysql: heartbeat: Lock wait timeout exceeded", true);
      }
      return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    }
    std::atomic<bool> refuse_next_loop_beat{false};
    std::atomic<int> refused{0};
  } store(*store_);
  const JobId id = enqueue("work", 1);
  const SchedulerOptions o = beating(1, 1'000);
  Scheduler scheduler(store, clock_, o);
  std::atomic<bool> release{false};
  std::atomic<int> asked{0}, done{0};  // checkpoints asked for and made by the handler
  std::atomic<bool> running{false};
  scheduler.register_handler("work", [&](JobContext& c) {
    running = true;
    while (!release) {
      if (done < asked) {
        c.checkpoint("{\"page\":" + std::to_string(done.load()) + "}");
        ++done;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return Outcome::complete();
  });
  SetOnExit release_on_exit{release};
  auto heartbeat_failing = [&] { return store_failure(scheduler, "heartbeat").has_value(); };
  scheduler.start();
  wait_for([&] { return running.load(); });
  ASSERT_TRUE(running.load());

  store.refuse_next_loop_beat = true;
  clock_.advance_ms(o.heartbeat_interval_ms);  // the loop's beat is due, and fails
  wait_for([&] { return store.refused.load() == 1 && heartbeat_failing(); });
  ASSERT_EQ(store.refused.load(), 1);
  ASSERT_TRUE(heartbeat_failing());

  for (int page = 0; page < 3; ++page) {  // a checkpoint every 150 ms
    clock_.advance_ms(150);
    const int before = done;
    ++asked;
    wait_for([&] { return done.load() > before; });
    ASSERT_GT(done.load(), before) << "page " << page;
  }
  EXPECT_EQ(store_->get(id)->lease_expires_ms, clock_.now_ms() + o.lease_ms);
  EXPECT_FALSE(heartbeat_failing()) << "cleared by the checkpoints that renewed the lease";
  release = true;
  wait_for([&] { return store_->get(id)->status == JobStatus::kSucceeded; });
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// A job whose own row refuses every beat (a lock wait timeout, as on a row another transaction
// holds) while B's beats all go through is no store outage. A's failures come at half-interval
// pace while B's successes, which clear "heartbeat", come once an interval: the span of failures
// reaches half an interval, so it is evidence of an outage only from one interval on
// (StoreFailure::evidence_ms, which readiness also requires). Found by review: with only
// store_failure_ms <= heartbeat_ms / 2 (valid settings), readiness failed on a healthy store.
// Clock steps of half an interval (100 ms).
TEST_F(SchedulerTest, OneRowRefusingItsBeatsWhileOthersGoThroughIsNoEvidenceOfAnOutage) {
  struct OneRowRefusesBeats : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                              const std::optional<std::string>& checkpoint,
                              bool progress) override {
      if (id == refused_id.load()) {
        refused_at = now_ms;
        ++refused;
        throw StorageError("mysql: heartbeat: Lock wait timeout exceeded", true);
      }
      ++passed;
      return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    }
    std::atomic<JobId> refused_id{0};
    std::atomic<int64_t> refused_at{0};
    std::atomic<int> refused{0}, passed{0};
  } store(*store_);
  const JobId a = enqueue("work", 1);
  const JobId b = enqueue("work", 1);
  store.refused_id = a;
  const SchedulerOptions o = beating(2, 60'000);
  Scheduler scheduler(store, clock_, o);
  std::atomic<bool> release{false};
  std::atomic<int> running{0};
  scheduler.register_handler("work", held_until(release, running));
  SetOnExit release_on_exit{release};
  scheduler.start();
  wait_for([&] { return running.load() == 2; });
  ASSERT_EQ(running.load(), 2);

  int64_t widest = 0;  // the widest first-to-last span of "heartbeat" seen
  int64_t evidence_ms = 0;
  for (int step = 0; step < 8; ++step) {
    clock_.advance_ms(step == 0 ? o.heartbeat_interval_ms : o.heartbeat_interval_ms / 2);
    const int64_t now = clock_.now_ms();
    // A goes last in its round; the clock moves on once the lanes have made all the round's beats
    // (each at the clock's time when made).
    wait_for([&] {
      const HeartbeatLanes lanes = scheduler.stats().heartbeats;
      return store.refused_at.load() == now && lanes.busy == 0 && lanes.queued == 0;
    });
    ASSERT_EQ(store.refused_at.load(), now) << "step " << step;
    if (const auto f = store_failure(scheduler, "heartbeat")) {
      widest = std::max(widest, f->last_ms - f->since_ms);
      evidence_ms = f->evidence_ms;
    }
  }
  EXPECT_GT(store.passed.load(), 2) << "B's beats went through";
  EXPECT_EQ(evidence_ms, o.heartbeat_interval_ms);
  EXPECT_LT(widest, evidence_ms) << "one row refusing its beats while B's go through is evidence "
                                    "of a store outage";
  release = true;
  wait_for([&] { return store_->get(b)->status == JobStatus::kSucceeded; });
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// A clock whose next reading on a thread that asked for it stalls (returning the time it read
// before stalling) until released: a thread preempted between reading the clock and taking a
// lock.
thread_local bool t_stall_next_clock_read = false;
class StallingClock final : public Clock {
 public:
  explicit StallingClock(int64_t start_ms) : now_(start_ms) {}
  int64_t now_ms() const override {
    const int64_t t = now_.load();
    if (t_stall_next_clock_read) {
      t_stall_next_clock_read = false;
      std::unique_lock lock(mutex_);
      stalled_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
    return t;
  }
  void advance_ms(int64_t ms) { now_.fetch_add(ms); }
  bool stalled() const {
    std::lock_guard lock(mutex_);
    return stalled_;
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::atomic<int64_t> now_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  mutable bool stalled_ = false;
  bool released_ = false;
};

// Two threads noting failures of one operation at about the same time (a handler's checkpoint
// and the heartbeat loop's beat) may note them out of order: since_ms stays the first failure
// and last_ms the last (found by review: since_ms came after last_ms, a negative failing_for_ms
// and an outage's start moved later). Here the handler's failed checkpoint reads the clock at t0
// and is held before it notes; the loop's beat fails at t0 + 200 and is noted first.
TEST_F(SchedulerTest, FailuresNotedOutOfOrderKeepTheFirstAndTheLast) {
  struct RefusesBeats : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId, const std::string&, int64_t, int64_t,
                              const std::optional<std::string>& checkpoint, bool) override {
      if (checkpoint) t_stall_next_clock_read = true;  // the note of this failure stalls
      ++calls;
      throw StorageError("mysql: error 1290: the server is running read-only", true);
    }
    std::atomic<int> calls{0};
  } store(*store_);
  StallingClock clock(clock_.now_ms());
  const JobId id = enqueue("work", 1);
  const SchedulerOptions o = beating(1, 60'000);
  Scheduler scheduler(store, clock, o);
  std::atomic<bool> ask{false}, asked_done{false}, release{false}, running{false};
  scheduler.register_handler("work", [&](JobContext& c) {
    running = true;
    while (!ask) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    try {
      c.checkpoint("{}");
    } catch (const StorageError&) {
    }
    asked_done = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Outcome::complete();
  });
  struct Release {
    StallingClock& clock;
    std::atomic<bool>& release;
    ~Release() {
      clock.release();
      release = true;
    }
  } release_on_exit{clock, release};
  scheduler.start();
  wait_for([&] { return running.load(); });
  ASSERT_TRUE(running.load());
  ask = true;
  wait_for([&] { return clock.stalled(); });  // its store call failed at t0; its note is held
  ASSERT_TRUE(clock.stalled());
  clock.advance_ms(o.heartbeat_interval_ms);  // the loop's beat is due, and fails
  auto heartbeat = [&] { return store_failure(scheduler, "heartbeat"); };
  wait_for([&] { return heartbeat().has_value(); });
  ASSERT_TRUE(heartbeat());
  clock.release();
  wait_for([&] { return asked_done.load(); });
  ASSERT_TRUE(asked_done.load());
  const StoreFailure f = *heartbeat();
  EXPECT_GE(f.failures, 2);  // the checkpoint's, and the loop's (one or more rounds of them)
  EXPECT_LE(f.since_ms, f.last_ms) << "failing_for_ms = " << f.last_ms - f.since_ms;
  EXPECT_EQ(f.last_ms - f.since_ms, o.heartbeat_interval_ms);
  release = true;
  wait_for([&] { return store_->get(id)->status != JobStatus::kRunning; });
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// Heartbeats are failing while a job whose last beat failed is in hand, whether the heartbeat
// loop's beat or its handler's (found by review: the loop's rounds cleared a handler's failed
// checkpoint, since they only knew the jobs whose loop beats had failed).
TEST_F(SchedulerTest, AHandlersFailedBeatStaysFailingWhileItsJobIsInHand) {
  struct RefusesCheckpoints : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                              const std::optional<std::string>& checkpoint,
                              bool progress) override {
      if (checkpoint) throw StorageError("sqlite: database is locked", true);
      return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    }
  } store(*store_);
  const JobId id = enqueue("work", 1);
  const SchedulerOptions o = beating(1, 60'000);
  Scheduler scheduler(store, clock_, o);
  std::atomic<bool> refused{false}, release{false};
  scheduler.register_handler("work", [&](JobContext& c) {
    try {
      c.checkpoint("{\"page\":1}");
    } catch (const StorageError&) {
      refused = true;  // a handler that carries on, its checkpoint to be retried later
    }
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Outcome::complete();
  });
  SetOnExit release_on_exit{release};
  auto heartbeat_failing = [&] { return store_failure(scheduler, "heartbeat").has_value(); };
  scheduler.start();
  wait_for([&] { return refused.load(); });
  ASSERT_TRUE(refused.load());
  bool cleared = false;
  for (int i = 0; i < 100 && !cleared; ++i) {  // 1 s: ten rounds of the loop or more
    cleared = !heartbeat_failing();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(cleared) << "cleared while the job whose checkpoint failed is still running and "
                           "no beat of it has succeeded";
  EXPECT_EQ(store_->get(id)->status, JobStatus::kRunning);
  release = true;
  wait_for([&] { return store_->get(id)->status == JobStatus::kSucceeded; });
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// The heartbeat loop wakes when the earliest beat is due: a heartbeat interval close to the lease
// (25 s of 30 s) is kept, where fixed half-interval naps could beat up to 37.5 s late.
TEST(HeartbeatWait, SleepsUntilTheEarliestBeatIsDueWithinBounds) {
  EXPECT_EQ(heartbeat_wait_ms(1'000, std::nullopt, 10'000), 5'000);  // nothing runs
  EXPECT_EQ(heartbeat_wait_ms(1'000, 3'000, 10'000), 2'000);
  EXPECT_EQ(heartbeat_wait_ms(1'000, 11'000, 10'000), 5'000);  // a job may start meanwhile
  EXPECT_EQ(heartbeat_wait_ms(1'000, 1'000, 10'000), 10);      // due now: the floor
  EXPECT_EQ(heartbeat_wait_ms(1'000, 900, 10'000), 10);        // overdue (a slow store)
  EXPECT_EQ(heartbeat_wait_ms(0, std::nullopt, 4), 10);        // a tiny interval
  // A job whose beat was at 0 with interval 25 000: a round at 12 500 sleeps until 25 000.
  EXPECT_EQ(heartbeat_wait_ms(12'500, 25'000, 25'000), 12'500);
  EXPECT_EQ(heartbeat_wait_ms(20'000, 25'000, 25'000), 5'000);
}

// The sweep runs every sweep_interval_ms (here an hour), not whenever a job ends. A lease that
// expired after the start-up sweep is still held while 200 jobs run; a sweep on any of their ends
// would have requeued it.
TEST_F(SchedulerTest, TheSweepKeepsItsIntervalWhileJobsEnd) {
  SchedulerOptions o = options();
  o.sweep_interval_ms = 3'600'000;
  Scheduler scheduler(*store_, clock_, o);
  std::atomic<int> calls{0};
  scheduler.register_handler("work", [&](JobContext&) {
    ++calls;
    return Outcome::complete();
  });
  const JobId orphan = enqueue("orphan");
  ClaimRequest r;
  r.owner = "crashed-host";
  r.limit = 1;
  r.lease_ms = 1'000;
  r.now_ms = clock_.now_ms();
  ASSERT_EQ(store_->claim(r).size(), 1u);
  scheduler.start();         // its start-up sweep finds the lease still valid
  clock_.advance_ms(5'000);  // now it has expired
  std::vector<JobSpec> specs(200, JobSpec{"work", "{}", "k", std::nullopt, 0, 3, 0, {}, 0});
  store_->enqueue_batch(specs, clock_.now_ms());
  for (int i = 0; i < 1000 && calls.load() < 200; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  scheduler.drain(std::chrono::milliseconds(1'000));
  ASSERT_EQ(calls.load(), 200);
  EXPECT_EQ(store_->get(orphan)->status, JobStatus::kRunning);
  EXPECT_EQ(store_->get(orphan)->lease_owner, "crashed-host");
  EXPECT_EQ(store_->sweep(clock_.now_ms()).requeued, 1);  // expired indeed: a sweep takes it
}

// An idle claim loop sleeps for idle_poll_ms (here an hour); a job enqueued through the same
// store object wakes it at once, and so does a dead letter retried through it.
TEST_F(SchedulerTest, AnEnqueueThroughTheSameStoreWakesAnIdleClaimLoop) {
  SystemClock clock;
  SchedulerOptions o = options();
  o.idle_poll_ms = 3'600'000;
  Scheduler scheduler(*store_, clock, o);
  std::atomic<int> calls{0};
  scheduler.register_handler("work", [&](JobContext& c) {
    // The second job fails fatally the first time it runs (calls 2), then succeeds.
    if (++calls == 2 && c.job().payload == "{\"fatal\":true}") {
      throw JobFailure("bad payload", true);
    }
    return Outcome::complete();
  });
  scheduler.start();
  auto wait_for_calls = [&](int n) {
    for (int i = 0; i < 1000 && calls.load() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return calls.load();
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the first claim found nothing
  enqueue("work");
  EXPECT_EQ(wait_for_calls(1), 1) << "the enqueue did not wake the idle claim loop";

  JobSpec fatal{"work", "{\"fatal\":true}", "k", std::nullopt, 0, 3, 0, {}, 0};
  const JobId id = store_->enqueue(fatal, clock.now_ms()).id;
  ASSERT_EQ(wait_for_calls(2), 2);
  for (int i = 0; i < 500 && store_->get(id)->status != JobStatus::kDead; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(store_->get(id)->status, JobStatus::kDead);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // idle again
  auto letters = store_->list_dead_letters({});
  ASSERT_EQ(letters.items.size(), 1u);
  store_->retry_dead_letter(letters.items[0].id, clock.now_ms());
  EXPECT_EQ(wait_for_calls(3), 3) << "the dead-letter retry did not wake the idle claim loop";
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// A failure retried without backoff is claimed again at once, not at the next idle poll (the
// finisher wakes the claim loop once the requeue is written; so does the freed worker slot).
TEST_F(SchedulerTest, AnImmediateRetryIsClaimedWithoutWaitingForThePoll) {
  SystemClock clock;
  SchedulerOptions o = options();
  o.idle_poll_ms = 3'600'000;
  o.retry = {0, 2.0, 0};  // no backoff
  Scheduler scheduler(*store_, clock, o);
  std::atomic<int> calls{0};
  scheduler.register_handler("work", [&](JobContext&) -> Outcome {
    if (++calls == 1) throw JobFailure("flaky");
    return Outcome::complete();
  });
  const JobId id =
      store_->enqueue({"work", "{}", "k", std::nullopt, 0, 3, 0, {}, 0}, clock.now_ms()).id;
  scheduler.start();
  for (int i = 0; i < 1000 && store_->get(id)->status != JobStatus::kSucceeded; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(store_->get(id)->status, JobStatus::kSucceeded) << "the retry waited for the poll";
  EXPECT_EQ(calls.load(), 2);
  scheduler.drain(std::chrono::milliseconds(1'000));
}

TEST_F(SchedulerTest, DrainReleasesRunningJobsWithoutCountingTheAttempt) {
  SystemClock clock;
  Scheduler scheduler(*store_, clock, options());
  std::atomic<bool> started{false};
  scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
    started = true;
    for (;;) {  // a long backfill: one page per loop, checkpointing after each
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      c.checkpoint("{}");
    }
  });
  JobId id = enqueue("work");
  scheduler.start();
  for (int i = 0; i < 400 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(started);
  scheduler.drain(std::chrono::milliseconds(20));
  Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kQueued);
  EXPECT_EQ(job.attempts, 0);
  EXPECT_FALSE(job.lease_token);
}

// Jobs claimed ahead (prefetch) that no handler started go back to the queue at drain, their
// attempt not counted; the one a handler had started is released by its handler's heartbeat.
// When their leases were taken meanwhile (here: recovered by their owner's restart elsewhere),
// the release is refused, logged and skipped: drain still ends, and the jobs stay as the
// recovery left them.
class DrainOfPrefetchedJobs : public SchedulerTest {
 protected:
  std::vector<JobId> start_with_three_prefetched(Scheduler& scheduler) {
    std::vector<JobId> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(enqueue("work"));
    scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
      started_ = true;
      // Holds its worker without touching the store until the drain (so that no slot frees up
      // and the claim loop takes nothing more, whatever happens to the leases meanwhile).
      while (!c.stopping()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      c.heartbeat();  // throws: the host drains, or the lease is gone
      return Outcome::complete();
    });
    scheduler.start();
    for (int i = 0; i < 1000 && !(started_ && scheduler.stats().in_flight == 4); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(started_);
    EXPECT_EQ(scheduler.stats().in_flight, 4) << "one running, three waiting for a worker";
    return ids;
  }
  SchedulerOptions one_worker_three_ahead() {
    SchedulerOptions o = options();
    o.workers = 1;
    o.prefetch = 3;
    o.claim_batch = 4;
    return o;
  }
  void expect_queued(const std::vector<JobId>& ids, int attempts) {
    for (JobId id : ids) {
      Job job = *store_->get(id);
      EXPECT_EQ(job.status, JobStatus::kQueued) << id;
      EXPECT_EQ(job.attempts, attempts) << id;
      EXPECT_FALSE(job.lease_token) << id;
    }
  }
  std::atomic<bool> started_{false};
};

// The same with a claim loop per place, each taking one job per claim: what they claimed goes
// back at the drain, and so do the claims under way when it began.
TEST_F(DrainOfPrefetchedJobs, ClaimedBySeveralLoopsAreReleasedWithoutAnAttempt) {
  SlowClaims store(*store_);
  SchedulerOptions o = one_worker_three_ahead();
  o.claim_batch = 1;
  o.claimers = 4;
  Scheduler scheduler(store, clock_, o);
  std::vector<JobId> ids = start_with_three_prefetched(scheduler);
  scheduler.drain(std::chrono::milliseconds(0));
  EXPECT_EQ(scheduler.stats().released, 4);
  EXPECT_EQ(scheduler.stats().in_flight, 0);
  EXPECT_LE(store.most_out.load(), 4);
  expect_queued(ids, 0);
}

TEST_F(DrainOfPrefetchedJobs, AreReleasedWithoutAnAttempt) {
  Scheduler scheduler(*store_, clock_, one_worker_three_ahead());
  std::vector<JobId> ids = start_with_three_prefetched(scheduler);
  scheduler.drain(std::chrono::milliseconds(0));
  EXPECT_EQ(scheduler.stats().released, 4);
  EXPECT_EQ(scheduler.stats().in_flight, 0);
  expect_queued(ids, 0);
}

TEST_F(DrainOfPrefetchedJobs, WhoseLeasesWereTakenAreLeftAsTheyAre) {
  Scheduler scheduler(*store_, clock_, one_worker_three_ahead());
  std::vector<JobId> ids = start_with_three_prefetched(scheduler);
  SweepResult taken = store_->recover_owner("test-host", clock_.now_ms());
  EXPECT_EQ(taken.requeued, 4);
  scheduler.drain(std::chrono::milliseconds(0));
  EXPECT_EQ(scheduler.stats().released, 0);
  EXPECT_EQ(scheduler.stats().in_flight, 0);
  expect_queued(ids, 1);  // the recovery counted the attempt, once
}

// Jobs claimed ahead of a free worker, while the only worker is held by a long job.
class PrefetchedJobs : public SchedulerTest {
 protected:
  SchedulerOptions one_worker_three_ahead() {
    SchedulerOptions o = options();
    o.workers = 1;
    o.prefetch = 3;
    o.claim_batch = 4;
    o.lease_ms = 1'000;
    o.heartbeat_interval_ms = 200;
    o.sweep_interval_ms = 3'600'000;  // the tests sweep
    return o;
  }
  // Enqueues four jobs and starts `scheduler`; its handler counts calls per job and holds the
  // first job's worker until release_. Returns once all four are in hand, the first in its
  // handler (before, a test could move the clock past the leases while the first still waited
  // for the worker, which then found its lease run out and did not start it), three waiting.
  std::vector<JobId> start_holding_the_first(Scheduler& scheduler) {
    for (int i = 0; i < 4; ++i) ids_.push_back(enqueue("work"));
    scheduler.register_handler("work", [this](JobContext& c) {
      {
        std::lock_guard lock(mutex_);
        ++calls_[c.job().id];
        lease_left_at_start_.try_emplace(
            c.job().id, store_->get(c.job().id)->lease_expires_ms - clock_.now_ms());
      }
      while (c.job().id == ids_[0] && !release_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      return Outcome::complete();
    });
    scheduler.start();
    EXPECT_TRUE(wait_for([&] { return scheduler.stats().in_flight == 4 && calls(ids_[0]) == 1; }));
    return ids_;
  }
  static bool wait_for(const std::function<bool()>& done) {
    for (int i = 0; i < 10'000 && !done(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return done();
  }
  // Lets the held job end and waits until every job succeeded.
  void finish_all(Scheduler& scheduler) {
    release_ = true;
    EXPECT_TRUE(wait_for([&] {
      for (JobId id : ids_) {
        if (store_->get(id)->status != JobStatus::kSucceeded) return false;
      }
      return true;
    }));
    scheduler.drain(std::chrono::milliseconds(1'000));
  }
  int calls(JobId id) {
    std::lock_guard lock(mutex_);
    return calls_[id];
  }

  // A store whose heartbeats of the `refuse`d jobs fail transiently while every other job's are
  // renewed: with `lock_conflicts`, as on rows another transaction holds (a lock wait timeout);
  // without, with an error that ends a heartbeat round (a store that is down, as far as the
  // heartbeat loop can tell), so that the order of the rounds is what keeps the others renewed.
  struct RefusesBeats : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                              const std::optional<std::string>& checkpoint,
                              bool progress) override {
      {
        std::lock_guard lock(mutex);
        if (refused.count(id)) {
          ++refusals;
          if (lock_conflicts) {
            throw StorageError("mysql: heartbeat: Lock wait timeout exceeded", true, true);
          }
          throw StorageError("mysql: heartbeat: Lost connection to server during query", true);
        }
        first_renewal_ms.try_emplace(id, now_ms);
      }
      return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    }
    void refuse(std::set<JobId> ids) {
      std::lock_guard lock(mutex);
      refused = std::move(ids);
    }
    std::optional<int64_t> first_renewal(JobId id) {
      std::lock_guard lock(mutex);
      auto it = first_renewal_ms.find(id);
      if (it == first_renewal_ms.end()) return std::nullopt;
      return it->second;
    }
    std::mutex mutex;
    std::set<JobId> refused;
    std::map<JobId, int64_t> first_renewal_ms;  // by the clock of the beat
    std::atomic<int> refusals{0};
    std::atomic<bool> lock_conflicts{false};
  };

  // Holds the store calls that pass() it until let_go(). A test lets it go in a LetGo's
  // destructor too, declared after the scheduler: its threads are joined, whatever failed.
  struct Gate {
    void pass(std::unique_lock<std::mutex>& lock) {
      opened.wait(lock, [&] { return !hold; });
    }
    void let_go() {
      {
        std::lock_guard lock(mutex);
        hold = false;
      }
      opened.notify_all();
    }
    std::mutex mutex;
    std::condition_variable opened;
    bool hold = true;  // [mutex]
  };
  struct LetGo {
    Gate& gate;
    ~LetGo() { gate.let_go(); }
  };

  // Holds every heartbeat of the job `waits_for` until its gate is let go; with `then_fail`, each
  // then fails as on a row another transaction held (a lock wait timeout).
  struct OneJobsBeatsWait : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                              const std::optional<std::string>& checkpoint,
                              bool progress) override {
      if (id == waits_for.load()) {
        std::unique_lock lock(gate.mutex);
        ++calls;
        gate.pass(lock);
        if (then_fail) {
          throw StorageError("mysql: heartbeat: Lock wait timeout exceeded", true, true);
        }
      }
      return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    }
    int entered() {  // beats of waits_for begun
      std::lock_guard lock(gate.mutex);
      return calls;
    }
    std::atomic<JobId> waits_for{0};
    std::atomic<bool> then_fail{false};
    Gate gate;
    int calls = 0;  // [gate.mutex]
  };

  // Holds the first heartbeat after arm() until its gate is let go; records the first beats of
  // the other jobs from then on.
  struct FirstBeatWaits : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                              const std::optional<std::string>& checkpoint,
                              bool progress) override {
      {
        std::unique_lock lock(gate.mutex);
        if (armed && held == 0) {
          held = id;
          gate.pass(lock);
        } else if (armed) {
          made_ms.try_emplace(id, now_ms);
        }
      }
      return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    }
    JobId held_job() {
      std::lock_guard lock(gate.mutex);
      return held;
    }
    std::map<JobId, int64_t> made() {
      std::lock_guard lock(gate.mutex);
      return made_ms;
    }
    void arm() {
      std::lock_guard lock(gate.mutex);
      armed = true;
    }
    Gate gate;
    bool armed = false;                // [gate.mutex]
    JobId held = 0;                    // the job whose beat waits [gate.mutex]
    std::map<JobId, int64_t> made_ms;  // the others' first beats since: the lease's start
  };

  std::vector<JobId> ids_;
  std::atomic<bool> release_{false};
  std::mutex mutex_;
  std::map<JobId, int> calls_;
  std::map<JobId, int64_t> lease_left_at_start_;  // by the store, at the first start [mutex_]
};

// The held job keeps the worker for three lease periods: the three waiting behind it are
// heartbeated like it, so no sweep takes them back (which would count an attempt and run them
// twice).
TEST_F(PrefetchedJobs, KeepTheirLeasesWhileTheyWaitForAWorker) {
  const SchedulerOptions o = one_worker_three_ahead();
  Scheduler scheduler(*store_, clock_, o);
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  for (int step = 0; step < 15; ++step) {  // 3 s: three leases
    clock_.advance_ms(o.heartbeat_interval_ms);
    // The running job's beat shows that the heartbeat loop has had its round at this time.
    ASSERT_TRUE(wait_for([&] {
      return store_->get(ids[0])->lease_expires_ms == clock_.now_ms() + o.lease_ms;
    })) << "step "
        << step;
  }
  for (size_t i = 1; i < ids.size(); ++i) {
    EXPECT_GT(store_->get(ids[i])->lease_expires_ms, clock_.now_ms()) << "job " << ids[i];
  }
  EXPECT_EQ(store_->sweep(clock_.now_ms()).requeued, 0);
  finish_all(scheduler);
  for (JobId id : ids) {
    EXPECT_EQ(store_->get(id)->attempts, 1) << id;
    EXPECT_EQ(calls(id), 1) << id;
  }
}

// A job whose lease was taken while it waited (here: recovered by its owner's restart elsewhere)
// is not started under the stale lease: its handler would run beside the one that now holds it.
// The heartbeat that finds the lease gone drops it; the job runs once, when claimed again.
TEST_F(PrefetchedJobs, ThoseWhoseLeasesWereTakenWhileWaitingAreNotStarted) {
  struct CountingBeats : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                              const std::optional<std::string>& checkpoint,
                              bool progress) override {
      // Counted once the store has answered (here: LeaseLost), not when asked: a beat still under
      // way when the test let the worker go could leave its job to be started under the stale
      // lease (about 1 run in 500 did).
      struct Count {
        std::atomic<int>& beats;
        ~Count() { ++beats; }
      } count{beats};
      return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    }
    std::atomic<int> beats{0};
  } store(*store_);
  const SchedulerOptions o = one_worker_three_ahead();
  Scheduler scheduler(store, clock_, o);
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  EXPECT_EQ(store_->recover_owner("test-host", clock_.now_ms()).requeued, 4);
  clock_.advance_ms(o.heartbeat_interval_ms);
  ASSERT_TRUE(wait_for([&] { return store.beats >= 4; })) << "every job in hand is heartbeated";
  finish_all(scheduler);
  EXPECT_EQ(calls(ids[0]), 2) << "the running one: before the recovery, and again after it";
  for (size_t i = 1; i < ids.size(); ++i) EXPECT_EQ(calls(ids[i]), 1) << "job " << ids[i];
  // The three dropped unstarted are no handler runs in the latency figures (before, they were).
  EXPECT_EQ(scheduler.stats().latency["work"].runs, 5);
}

// Jobs whose leases ran out while they waited, their heartbeats failing on a store that was down
// (so none of them saw LeaseLost), are not started either: by the scheduler's own clock the
// leases are over, and here the sweep took the jobs back and another host holds them (found by
// review).
TEST_F(PrefetchedJobs, ThoseWhoseLeasesRanOutWhileTheStoreWasDownAreNotStarted) {
  struct BeatsFailWhileDown : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                              const std::optional<std::string>& checkpoint,
                              bool progress) override {
      if (down) {
        ++failed_beats;
        throw StorageError("store unreachable", true);
      }
      return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    }
    std::atomic<bool> down{false};
    std::atomic<int> failed_beats{0};
  } store(*store_);
  const SchedulerOptions o = one_worker_three_ahead();
  Scheduler scheduler(store, clock_, o);
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  store.down = true;
  clock_.advance_ms(o.lease_ms + 500);
  ASSERT_TRUE(wait_for([&] { return store.failed_beats >= 4; }));
  EXPECT_EQ(store_->sweep(clock_.now_ms()).requeued, 4);
  ASSERT_EQ(store_->claim({"other-host", 10, clock_.now_ms(), 60'000, {"work"}}).size(), 4u);
  release_ = true;  // the worker is free: the waiting jobs are next
  ASSERT_TRUE(wait_for([&] { return scheduler.stats().in_flight == 0; }));
  scheduler.drain(std::chrono::milliseconds(1'000));
  for (size_t i = 1; i < ids.size(); ++i) {
    EXPECT_EQ(calls(ids[i]), 0) << "job " << ids[i] << " started while other-host holds it";
  }
}

// Jobs whose leases ran out while they waited, their heartbeats failing, and which no other host
// took meanwhile, go back to the queue without an attempt rather than staying running until the
// sweep takes them back and counts one (an attempt that never started could send a job on its
// last try to the dead letters).
TEST_F(PrefetchedJobs, ThoseWhoseLeasesRanOutAreHandedBackWithoutAnAttempt) {
  FailsBeats store(*store_);
  const SchedulerOptions o = one_worker_three_ahead();  // no sweep but the test's
  Scheduler scheduler(store, clock_, o);
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  store.refuse = true;
  clock_.advance_ms(o.lease_ms + 500);
  finish_all(scheduler);  // the three go back, are claimed again and run
  for (size_t i = 1; i < ids.size(); ++i) {
    EXPECT_EQ(calls(ids[i]), 1) << "job " << ids[i];
    EXPECT_EQ(store_->get(ids[i])->attempts, 1) << "job " << ids[i];
    EXPECT_EQ(store_->attempts(ids[i]).front().outcome, "released") << "job " << ids[i];
  }
  EXPECT_EQ(scheduler.stats().released, 3);
}

// A job cancelled while it waits for a worker is handed back (cancelled) once its heartbeat tells
// of the request, not when a worker is free: the worker may be held for hours by a long job, and
// the cancelled job would stay running in the store (its parent waiting for it) and hold its
// place in hand meanwhile (found by review).
TEST_F(PrefetchedJobs, ACancelledJobIsHandedBackWithoutWaitingForAWorker) {
  const SchedulerOptions o = one_worker_three_ahead();
  Scheduler scheduler(*store_, clock_, o);
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  SetOnExit release{release_};
  ASSERT_EQ(store_->cancel(ids[1], clock_.now_ms()), CancelOutcome::kRequested);
  clock_.advance_ms(o.heartbeat_interval_ms);  // its beat is due: the store tells of the request
  EXPECT_TRUE(wait_for([&] { return store_->get(ids[1])->status == JobStatus::kCancelled; }))
      << "job " << ids[1] << " is " << to_string(store_->get(ids[1])->status)
      << " while the worker is held";
  EXPECT_TRUE(wait_for([&] { return scheduler.stats().in_flight == 3; }))
      << "in flight: " << scheduler.stats().in_flight;
  // The finisher counts the release once the store has recorded it.
  EXPECT_TRUE(wait_for([&] { return scheduler.stats().released == 1; }))
      << "released: " << scheduler.stats().released;
  release_ = true;
  EXPECT_TRUE(wait_for([&] {
    for (JobId id : {ids[0], ids[2], ids[3]}) {
      if (store_->get(id)->status != JobStatus::kSucceeded) return false;
    }
    return true;
  }));
  scheduler.drain(std::chrono::milliseconds(1'000));
  EXPECT_EQ(calls(ids[1]), 0);
  EXPECT_EQ(store_->get(ids[1])->status, JobStatus::kCancelled);
  EXPECT_EQ(store_->get(ids[1])->attempts, 0);
}

// A heartbeat round on a store that is down makes one call per lane, not one per job in hand:
// each call to such a store can take seconds (connect timeouts and the store's own retries), and a
// round of them would hold up the next round and a stop. The others are tried again with the next.
// Here two lanes and four jobs in hand.
TEST_F(PrefetchedJobs, AHeartbeatRoundOnAStoreThatIsDownTriesItOncePerLane) {
  struct BeatsFailWhileDown : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    HeartbeatResult heartbeat(JobId id, const std::string& token, int64_t now_ms, int64_t lease_ms,
                              const std::optional<std::string>& checkpoint,
                              bool progress) override {
      if (down) {
        std::unique_lock lock(gate.mutex);
        ++failed_at[now_ms];
        gate.pass(lock);  // a slow call: time moves on meanwhile
        throw StorageError("store unreachable", true);
      }
      return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
    }
    int failed(int64_t at) {
      std::lock_guard lock(gate.mutex);
      return failed_at[at];
    }
    std::atomic<bool> down{false};
    Gate gate;
    std::map<int64_t, int> failed_at;  // calls by the time of their round [gate.mutex]
  } store(*store_);
  SchedulerOptions o = one_worker_three_ahead();
  o.heartbeat_lanes = 2;
  Scheduler scheduler(store, clock_, o);
  LetGo let_go{store.gate};
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  store.down = true;
  clock_.advance_ms(o.heartbeat_interval_ms);
  const int64_t first = clock_.now_ms();
  ASSERT_TRUE(wait_for([&] { return store.failed(first) >= 1; }));
  // The round's first call hangs while the clock moves on; the next round has a later time.
  clock_.advance_ms(o.heartbeat_interval_ms);
  store.gate.let_go();
  ASSERT_TRUE(wait_for([&] { return store.failed(clock_.now_ms()) >= 1; }));
  EXPECT_LE(store.failed(first), o.heartbeat_lanes)
      << "the round called the store that was down once per job";
  // Back up: every job in hand is renewed again.
  store.down = false;
  clock_.advance_ms(o.heartbeat_interval_ms);
  for (JobId id : ids) {
    EXPECT_TRUE(wait_for([&] {
      return store_->get(id)->lease_expires_ms == clock_.now_ms() + o.lease_ms;
    })) << "job "
        << id;
  }
  finish_all(scheduler);
  for (JobId id : ids) EXPECT_EQ(calls(id), 1) << "job " << id;
}

// One job whose heartbeat keeps failing transiently (its row held by another transaction: a
// lock wait timeout) while the store renews every other job: the others are still renewed, so
// their leases do not run out (the sweep would take them back, an attempt counted, and run them
// twice) (found by review).
TEST_F(PrefetchedJobs, OneJobWhoseHeartbeatKeepsFailingDoesNotStarveTheOthers) {
  RefusesBeats store(*store_);
  const SchedulerOptions o = one_worker_three_ahead();
  Scheduler scheduler(store, clock_, o);
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  store.refuse({ids[0]});                  // the first job in hand
  for (int step = 0; step < 10; ++step) {  // two leases
    clock_.advance_ms(o.heartbeat_interval_ms);
    // Every round renews the others before it tries the refused one again.
    for (size_t i = 1; i < ids.size(); ++i) {
      ASSERT_TRUE(wait_for([&] {
        return store_->get(ids[i])->lease_expires_ms == clock_.now_ms() + o.lease_ms;
      })) << "job "
          << ids[i] << " was not renewed at step " << step << " while job " << ids[0]
          << "'s beats failed";
    }
  }
  EXPECT_GT(store.refusals, 0);
  EXPECT_EQ(store_->sweep(clock_.now_ms()).requeued, 1) << "only the job whose beats failed";
  store.refuse({});
  finish_all(scheduler);
}

// Two jobs whose beats keep failing transiently (both rows held by other transactions): the
// failing jobs go after the others, the one tried longest ago first, so they take turns and the
// jobs behind them are still renewed (found by review: with only the last failing job moved
// last, the two took turns ending every round before the others).
TEST_F(PrefetchedJobs, TwoJobsWhoseHeartbeatsKeepFailingDoNotStarveTheOthers) {
  RefusesBeats store(*store_);
  const SchedulerOptions o = one_worker_three_ahead();
  Scheduler scheduler(store, clock_, o);
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  store.refuse({ids[0], ids[1]});
  SetOnExit release{release_};
  for (int step = 0; step < 10; ++step) {  // two leases
    clock_.advance_ms(o.heartbeat_interval_ms);
    const int before = store.refusals;
    ASSERT_TRUE(wait_for([&] { return store.refusals > before; })) << "step " << step;
  }
  for (size_t i = 2; i < ids.size(); ++i) {
    EXPECT_GT(store_->get(ids[i])->lease_expires_ms, clock_.now_ms())
        << "job " << ids[i] << "'s lease ran out while the store renewed it fine";
  }
  EXPECT_EQ(store_->sweep(clock_.now_ms()).requeued, 2) << "only the two jobs whose beats failed";
  store.refuse({});
  finish_all(scheduler);
}

// A beat that waits, here for as long as the test holds it (on MySQL: for a row another
// transaction holds, up to the lock wait, 50 s by default), holds up its lane only: the
// other jobs in hand are renewed on time meanwhile, so their leases do not run out (the sweep would
// take them back, count an attempt and run them twice), and the waiting job gets no second beat
// while its first is under way (found by review: beats went one after another).
TEST_F(PrefetchedJobs, ABeatThatWaitsHoldsUpNoOtherJobsBeats) {
  OneJobsBeatsWait store(*store_);
  const SchedulerOptions o = one_worker_three_ahead();  // lease 1 s, beats every 200 ms
  Scheduler scheduler(store, clock_, o);
  LetGo let_go{store.gate};
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  store.waits_for = ids[1];
  clock_.advance_ms(o.heartbeat_interval_ms);
  ASSERT_TRUE(wait_for([&] { return store.entered() == 1; }));
  for (int step = 0; step < 10; ++step) {  // two leases while the beat waits
    for (JobId id : {ids[0], ids[2], ids[3]}) {
      ASSERT_TRUE(wait_for([&] {
        return store_->get(id)->lease_expires_ms == clock_.now_ms() + o.lease_ms;
      })) << "job "
          << id << " was not renewed at step " << step << " while job " << ids[1]
          << "'s beat waited";
    }
    clock_.advance_ms(o.heartbeat_interval_ms);
  }
  EXPECT_EQ(store.entered(), 1) << "a second beat of job " << ids[1] << " while its first waited";
  EXPECT_EQ(store_->sweep(clock_.now_ms()).requeued, 1) << "only the job whose beat waited";
  store.gate.let_go();
  finish_all(scheduler);
  EXPECT_EQ(calls(ids[1]), 1) << "job " << ids[1] << ": once, after the sweep took it back";
  for (JobId id : {ids[0], ids[2], ids[3]}) {
    EXPECT_EQ(calls(id), 1) << "job " << id;
    EXPECT_EQ(store_->get(id)->attempts, 1) << "job " << id;
  }
}

// A beat queued behind one that waits (one lane here, held by the test; on MySQL, a row another
// transaction holds) is made later than the round that queued it, and renews the lease from when
// it is made. From the round's time, a beat held up longer than a lease (lanes waiting for rows:
// up to the lock wait each) would renew a lease that had already run out, for the sweep to
// take back (found by review). Meanwhile the stats show what an operator needs to see: the lane
// busy, with which job and since when, and the beats queued behind it; none of it once it is over.
TEST_F(PrefetchedJobs, ABeatHeldUpInItsQueueRenewsTheLeaseFromWhenItIsMadeAndStatsShowIt) {
  FirstBeatWaits store(*store_);
  SchedulerOptions o = one_worker_three_ahead();  // lease 1 s, beats every 200 ms
  o.heartbeat_lanes = 1;
  Scheduler scheduler(store, clock_, o);
  LetGo let_go{store.gate};
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  const HeartbeatLanes idle = scheduler.stats().heartbeats;
  EXPECT_EQ(idle.lanes, 1);
  EXPECT_EQ(idle.busy, 0);
  EXPECT_EQ(idle.queued, 0);
  EXPECT_EQ(idle.oldest_ms, 0);
  store.arm();
  clock_.advance_ms(o.heartbeat_interval_ms);  // a round queues the four beats; the first waits
  ASSERT_TRUE(wait_for([&] { return store.held_job() != 0; }));
  const JobId held = store.held_job();
  clock_.advance_ms(4 * o.heartbeat_interval_ms);  // held up for most of a lease
  const HeartbeatLanes waiting = scheduler.stats().heartbeats;
  EXPECT_EQ(waiting.busy, 1);
  EXPECT_EQ(waiting.queued, static_cast<int64_t>(ids.size()) - 1);
  EXPECT_EQ(waiting.oldest_job, held);
  EXPECT_EQ(waiting.oldest_ms, 4 * o.heartbeat_interval_ms);
  store.gate.let_go();
  ASSERT_TRUE(wait_for([&] { return store.made().size() == ids.size() - 1; }));
  for (const auto& [id, from_ms] : store.made()) {
    EXPECT_EQ(from_ms, clock_.now_ms())
        << "job " << id << ": its lease ran from " << from_ms << ", the time of the round that "
        << "queued its beat behind job " << held << "'s, not from " << clock_.now_ms();
  }
  EXPECT_TRUE(wait_for([&] {
    const HeartbeatLanes h = scheduler.stats().heartbeats;
    return h.busy == 0 && h.queued == 0 && h.oldest_ms == 0 && h.oldest_job == 0;
  }));
  finish_all(scheduler);
}

// A job whose beats were held up while it waited for a worker (one lane here, held by the test;
// on MySQL, lanes waiting for rows other transactions hold) has little of its lease left when a
// worker takes it. It is renewed before its handler starts: started as it was, the lease could run
// out before the next beat and another host's sweep take the job back and run it a second time
// (found by review).
TEST_F(PrefetchedJobs, AJobWhoseLeaseIsMostlyGoneIsRenewedBeforeItStarts) {
  FirstBeatWaits store(*store_);
  SchedulerOptions o = one_worker_three_ahead();  // lease 1 s, beats every 200 ms
  o.heartbeat_lanes = 1;
  Scheduler scheduler(store, clock_, o);
  LetGo let_go{store.gate};
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  store.arm();
  clock_.advance_ms(o.heartbeat_interval_ms);  // a round queues the four beats; the first waits
  ASSERT_TRUE(wait_for([&] { return store.held_job() != 0; }));
  clock_.advance_ms(3 * o.heartbeat_interval_ms);  // 800 ms since the claim: 200 ms left
  release_ = true;  // the worker takes the waiting jobs one by one; their beats still wait
  ASSERT_TRUE(wait_for([&] {
    std::lock_guard lock(mutex_);
    return lease_left_at_start_.size() == ids.size();
  }));
  {
    std::lock_guard lock(mutex_);
    for (size_t i = 1; i < ids.size(); ++i) {
      EXPECT_EQ(lease_left_at_start_[ids[i]], o.lease_ms)
          << "job " << ids[i] << " started with " << lease_left_at_start_[ids[i]]
          << " ms of its lease left";
    }
  }
  store.gate.let_go();
  finish_all(scheduler);
  for (JobId id : ids) EXPECT_EQ(calls(id), 1) << "job " << id;
}

// The renewal before the start may itself take long (on MySQL, up to a lock wait; a store cut off,
// its connect timeouts) and fail. If the lease ran out meanwhile, the job is not started but
// handed back without an attempt, as one whose lease ran out while it waited (review: it was
// started on a lease already over, which another host's sweep could hand to a second worker).
TEST_F(PrefetchedJobs, AJobWhoseLeaseRanOutDuringAFailedRenewalBeforeItsStartIsNotStarted) {
  OneJobsBeatsWait store(*store_);
  store.then_fail = true;
  const SchedulerOptions o = one_worker_three_ahead();  // lease 1 s, beats every 200 ms
  Scheduler scheduler(store, clock_, o);
  LetGo let_go{store.gate};
  const std::vector<JobId> ids = start_holding_the_first(scheduler);
  store.waits_for = ids[1];
  clock_.advance_ms(4 * o.heartbeat_interval_ms);  // 800 ms of the lease: its beat waits
  ASSERT_TRUE(wait_for([&] { return store.entered() == 1; })) << "a lane's beat of job " << ids[1];
  release_ = true;  // the worker takes job 2 and renews its lease first: that waits too
  ASSERT_TRUE(wait_for([&] { return store.entered() == 2; })) << "the renewal before the start";
  clock_.advance_ms(2 * o.heartbeat_interval_ms);  // the lease is over
  store.gate.let_go();                             // both calls fail
  ASSERT_TRUE(wait_for([&] { return !store_->attempts(ids[1]).empty(); }));
  store.waits_for = 0;
  finish_all(scheduler);
  EXPECT_EQ(store_->attempts(ids[1]).front().outcome, "released")
      << "job " << ids[1] << " was started on a lease that had run out";
  EXPECT_EQ(calls(ids[1]), 1) << "once, when claimed again";
  EXPECT_EQ(store_->get(ids[1])->attempts, 1) << "the release is no attempt";
}

// A host restarting under a stable owner name takes back at once what its previous process left
// running (the lease has 30 s to go), with the attempt counted; without the option it waits for
// the lease to expire.
TEST_F(SchedulerTest, RestartingUnderTheSameOwnerRecoversItsJobsAtOnce) {
  JobId id = enqueue("work");
  ASSERT_EQ(store_->claim({"test-host", 1, clock_.now_ms(), 30'000, {"work"}}).size(), 1u);
  {
    Scheduler without(*store_, clock_, options());
    without.register_handler("work", [](JobContext&) { return Outcome::complete(); });
    without.start();
    without.drain(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(store_->get(id)->status, JobStatus::kRunning) << "a live lease is left alone";

  SchedulerOptions o = options();
  o.recover_own_leases = true;
  Scheduler scheduler(*store_, clock_, o);
  std::atomic<int> calls{0};
  scheduler.register_handler("work", [&](JobContext&) {
    ++calls;
    return Outcome::complete();
  });
  scheduler.start();
  for (int i = 0; i < 400 && store_->get(id)->status != JobStatus::kSucceeded; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  scheduler.drain(std::chrono::milliseconds(1'000));
  Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kSucceeded);
  EXPECT_EQ(job.attempts, 2) << "the crashed attempt counted";
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(store_->attempts(id).front().outcome, "lease_expired");
}

// A claim that took jobs and left workers free is followed at once by another, not by an idle
// poll (found by review: a moved-from vector made every claim look empty). With claim_batch 1,
// four long jobs and a one-minute idle poll, the four start within seconds only if so.
TEST_F(SchedulerTest, AClaimThatLeavesWorkersFreeIsFollowedAtOnceByAnother) {
  SchedulerOptions o = options();
  o.workers = 4;
  o.claim_batch = 1;
  o.idle_poll_ms = 60'000;
  o.sweep_interval_ms = 3'600'000;
  for (int i = 0; i < 4; ++i) enqueue("work");
  std::atomic<int> started{0};
  std::atomic<bool> release{false};
  Scheduler scheduler(*store_, clock_, o);
  scheduler.register_handler("work", held_until(release, started));
  scheduler.start();
  for (int i = 0; i < 10'000 && started < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const int before_release = started;
  release = true;
  scheduler.drain(std::chrono::milliseconds(2'000));
  EXPECT_EQ(before_release, 4) << "4 free workers, 4 due jobs, and an idle poll in between";
}

// One job's ending that the store keeps refusing (retryable, as a lock wait timeout on that one
// row is) while the same finish() calls record every other ending is no store outage, just as one
// row refusing its beats while others go through is none: a call that recorded anything clears
// "finish" (found by review: it stayed failing from the first refusal across such calls, for as
// long as the lease, and /health/ready failed on a store that records endings fine).
TEST_F(SchedulerTest, OneEndingRefusedWhileOthersAreRecordedIsNoEvidenceOfAnOutage) {
  RefusesOneJob store(*store_);
  SchedulerOptions o = options();  // lease 30 s
  o.sweep_interval_ms = 3'600'000;
  Scheduler scheduler(store, clock_, o);
  scheduler.register_handler("poison", [&](JobContext&) { return Outcome::complete(); });
  scheduler.register_handler("work", [&](JobContext&) { return Outcome::complete(); });
  const JobId poison = enqueue("poison", 3);
  store.refused = poison;
  scheduler.start();
  wait_for([&] { return store.refusals.load() >= 1; });
  ASSERT_GE(store.refusals.load(), 1);
  const int64_t first_refusal_ms = clock_.now_ms();

  clock_.advance_ms(5'000);
  const int64_t recorded_ms = clock_.now_ms();
  const JobId other = enqueue("work", 3);
  wait_for([&] { return store_->get(other)->status == JobStatus::kSucceeded; });
  ASSERT_EQ(store_->get(other)->status, JobStatus::kSucceeded) << "recorded by a finish() call";

  clock_.advance_ms(6'000);  // 11 s after the first refusal; poison's lease lasts until 30 s
  const int refusals = store.refusals.load();
  wait_for([&] { return store.refusals.load() > refusals; });
  const std::optional<StoreFailure> f = store_failure(scheduler, "finish");
  EXPECT_TRUE(!f || f->since_ms >= recorded_ms)
      << "\"finish\" failing since " << f->since_ms - first_refusal_ms
      << " ms after the first refusal, for " << f->last_ms - f->since_ms
      << " ms (over the default health.store_failure_ms of 10 s: readiness fails), although a "
         "finish() call recorded job "
      << other << "'s ending " << recorded_ms - first_refusal_ms << " ms after it";
  store.refused = -1;
  wait_for([&] { return store_->get(poison)->status == JobStatus::kSucceeded; });
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// The finisher retries each ending for as long as its own lease lasts (found by review: it went by
// the earliest lease of all the endings it held, and once that one had run out, five more tries
// and it gave up on every ending with it, including one whose lease had 19 s to go). Here `old`
// (lease until 30 s: its last beat at 0, heartbeats every 25 s) and `fresh` (claimed at 20 s, lease
// until 50 s) end during an outage of finish(); at 31 s the finisher gives up on both, and when the
// store is back at 36 s, well within fresh's lease, fresh's ending is never written: its lease
// runs out, the sweep takes it back with the attempt counted, and it runs again. The outage was
// shorter than fresh's lease ("an outage shorter than the lease costs no attempt and runs no job
// twice").
TEST_F(SchedulerTest, AnEndingWhoseLeaseLastsIsNotGivenUpWithAnOlderOne) {
  struct FinishDown : ForwardingStore {
    using ForwardingStore::ForwardingStore;
    std::vector<FinishResult> finish(const std::vector<Finish>& items, int64_t now_ms) override {
      if (down) {
        ++failed;
        widest = std::max<int>(widest, static_cast<int>(items.size()));
        throw StorageError("server unreachable", true);
      }
      return ForwardingStore::finish(items, now_ms);
    }
    std::atomic<bool> down{false};
    std::atomic<int> failed{0}, widest{0};
  } store(*store_);
  SchedulerOptions o = options();
  o.workers = 2;
  o.lease_ms = 60'000;
  o.heartbeat_interval_ms = 30'000;  // none before fresh is claimed
  o.sweep_interval_ms = 3'600'000;
  Scheduler scheduler(store, clock_, o);
  std::atomic<bool> release{false};
  std::atomic<int> running{0};
  std::map<std::string, std::atomic<int>> runs;
  runs["old"];
  runs["fresh"];
  auto hold = [&](JobContext& c) {
    ++runs[c.job().kind];
    ++running;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Outcome::complete();
  };
  scheduler.register_handler("old", hold);
  scheduler.register_handler("fresh", hold);
  SetOnExit release_on_exit{release};
  const JobId old = enqueue("old", 3);
  scheduler.start();
  wait_for([&] { return running.load() == 1; });
  ASSERT_EQ(running.load(), 1);
  clock_.advance_ms(20'000);
  const JobId fresh = enqueue("fresh", 3);
  wait_for([&] { return running.load() == 2; });
  ASSERT_EQ(running.load(), 2);
  ASSERT_EQ(store_->get(fresh)->lease_expires_ms, clock_.now_ms() + o.lease_ms);

  store.down = true;
  release = true;
  wait_for([&] { return store.widest.load() == 2; });  // both endings in one retried call
  ASSERT_EQ(store.widest.load(), 2);
  clock_.advance_ms(41'000);  // 61 s: old's lease is over, fresh's lasts until 80 s
  const int before = store.failed.load();
  wait_for([&] { return store.failed.load() >= before + 5; });
  std::this_thread::sleep_for(std::chrono::milliseconds(1'500));  // time for a 6th try
  clock_.advance_ms(5'000);                                       // 66 s
  store.down = false;  // back, 14 s before fresh's lease ends
  wait_for([&] { return store_->get(fresh)->status == JobStatus::kSucceeded; });
  EXPECT_EQ(store_->get(fresh)->status, JobStatus::kSucceeded)
      << "fresh's ending was given up at 61 s with old's, although its lease lasted until 80 s; "
         "finish() calls during the outage: "
      << store.failed.load() << " (" << store.failed.load() - before << " after 61 s)";
  EXPECT_EQ(store_->get(old)->status, JobStatus::kRunning) << "old's is left to the sweep";
  scheduler.drain(std::chrono::milliseconds(1'000));
  EXPECT_EQ(runs["fresh"].load(), 1);
}

// Jobs whose rows start refusing beats together (lock wait timeouts on rows other transactions
// hold) do not end the heartbeat rounds: the jobs behind them are renewed on time (found by
// review: each of k such jobs ended one round, so the others were renewed k half-intervals late,
// and with the daemon's defaults, lease 3 intervals, four were enough for a job the store would
// renew fine to lose its lease to the sweep). Here six jobs in hand, the first five refused,
// lease 600 ms, beats every 200 ms; the clock moves half an interval per round, as rounds are
// paced in real time.
TEST_F(PrefetchedJobs, JobsWhoseHeartbeatsStartFailingTogetherDoNotStarveTheOthers) {
  RefusesBeats store(*store_);
  store.lock_conflicts = true;
  const SchedulerOptions o = beating(6, 600);
  for (int i = 0; i < 6; ++i) ids_.push_back(enqueue("work"));
  Scheduler scheduler(store, clock_, o);
  std::atomic<int> running{0};
  scheduler.register_handler("work", held_until(release_, running));
  SetOnExit release{release_};
  scheduler.start();
  ASSERT_TRUE(wait_for([&] { return running.load() == 6; }));
  const JobId healthy = ids_[5];
  const int64_t claimed_ms = clock_.now_ms();
  ASSERT_EQ(store_->get(healthy)->lease_expires_ms, claimed_ms + o.lease_ms);
  store.refuse({ids_[0], ids_[1], ids_[2], ids_[3], ids_[4]});
  for (int round = 0; round < 5; ++round) {
    const int refusals = store.refusals;
    clock_.advance_ms(round == 0 ? o.heartbeat_interval_ms : o.heartbeat_interval_ms / 2);
    // The round came, and the lanes made all its beats (each at the clock's time when made).
    ASSERT_TRUE(wait_for([&] {
      const HeartbeatLanes lanes = scheduler.stats().heartbeats;
      return store.refusals.load() > refusals && lanes.busy == 0 && lanes.queued == 0;
    })) << "round "
        << round;
  }
  // The healthy job was due at 200 ms: renewed in that round, with the five refusals.
  ASSERT_TRUE(wait_for([&] { return store.first_renewal(healthy).has_value(); }));
  EXPECT_EQ(*store.first_renewal(healthy), claimed_ms + o.heartbeat_interval_ms)
      << "job " << healthy << " renewed " << *store.first_renewal(healthy) - claimed_ms
      << " ms after its claim, not in the round where its beat was due; refusals: "
      << store.refusals.load();
  clock_.advance_ms(50);  // 650 ms: the refused jobs' leases have run out, not the healthy one's
  EXPECT_EQ(store_->sweep(clock_.now_ms()).requeued, 5) << "only the jobs whose beats failed";
  store.refuse({});
  release_ = true;
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// Review: an ending the store refuses for a reason of its own becomes a failed attempt. One that
// is handed over while the finisher retries such a failure (the store failing for a while) goes
// along with that retry, and the store refuses it too: it must be converted as well, not left
// running until its lease runs out.
class RefusesCompletions : public RefusesEndings {
 public:
  explicit RefusesCompletions(JobStore& inner) : RefusesEndings(inner) {}
  std::atomic<bool> failures_down{true};  // kFail items come back retryable while set
  std::atomic<int> fail_refusals{0};
  std::atomic<int> complete_refusals{0};
  std::optional<FinishResult> refuse(const Finish& item) override {
    if (item.kind == Finish::Kind::kComplete) {
      ++complete_refusals;
      return FinishResult{std::nullopt, false, "result cannot be held", false};
    }
    if (item.kind == Finish::Kind::kFail && failures_down) {
      ++fail_refusals;
      return FinishResult{std::nullopt, false, "server unreachable", true};
    }
    return std::nullopt;
  }
};

TEST_F(SchedulerTest, ARefusedEndingHandedOverWhileARefusalIsRecordedIsAlsoAFailedAttempt) {
  RefusesCompletions store(*store_);
  Scheduler scheduler(store, clock_, options());  // lease 30 s, the clock stands still
  scheduler.register_handler("work", [&](JobContext&) { return Outcome::complete(); });
  const JobId first = enqueue("work", 3);
  scheduler.start();
  // first's completion is refused; its failure is retried while the store is down.
  wait_for([&] { return store.fail_refusals.load() >= 1; });
  ASSERT_GE(store.fail_refusals.load(), 1);
  const JobId second = enqueue("work", 3);
  wait_for([&] { return store.complete_refusals.load() >= 2; });  // second's, in that retry
  ASSERT_GE(store.complete_refusals.load(), 2);
  store.failures_down = false;
  // The finisher counts a failure once the store has recorded it: wait for the count too.
  wait_for([&] {
    return store_->get(first)->status != JobStatus::kRunning &&
           store_->get(second)->status != JobStatus::kRunning && scheduler.stats().failed >= 2;
  });
  EXPECT_EQ(store_->get(first)->status, JobStatus::kQueued);
  EXPECT_EQ(store_->get(second)->status, JobStatus::kQueued)
      << "second's refused completion, handed over during the retry of first's failure, was "
         "never turned into a failed attempt: the job stays running until its lease runs out";
  EXPECT_EQ(scheduler.stats().failed, 2);
  scheduler.drain(std::chrono::milliseconds(1'000));
}

// A handler may throw what is not a std::exception (a library's own error type, an int): the
// attempt fails like any other, and the process goes on (before, it ended in std::terminate).
TEST_F(SchedulerTest, AHandlerThrowingANonStdExceptionFailsItsAttempt) {
  Scheduler scheduler(*store_, clock_, options());
  scheduler.register_handler("work", [](JobContext&) -> Outcome { throw 42; });
  const JobId id = enqueue("work");
  EXPECT_EQ(scheduler.run_once(1), 1u);
  Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kQueued);
  EXPECT_EQ(job.attempts, 1);
  EXPECT_EQ(job.run_after_ms, clock_.now_ms() + 2'000) << "the policy's delay";
  ASSERT_TRUE(job.last_error);
  EXPECT_NE(job.last_error->find("not a std::exception"), std::string::npos) << *job.last_error;
  EXPECT_EQ(scheduler.stats().failed, 1);
}

// A claim of no kinds takes any kind: a scheduler without handlers would claim every job and
// send each one to the dead letters as unhandled. It claims nothing.
TEST_F(SchedulerTest, ASchedulerWithoutHandlersClaimsNothing) {
  const JobId id = enqueue("work");
  {
    Scheduler scheduler(*store_, clock_, options());
    EXPECT_EQ(scheduler.run_once(10), 0u);
    scheduler.start();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // room for a claim, if any
    scheduler.drain(std::chrono::milliseconds(100));
    EXPECT_EQ(scheduler.stats().claimed, 0);
  }
  Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kQueued);
  EXPECT_EQ(job.attempts, 0);
  EXPECT_TRUE(store_->list_dead_letters({}).items.empty());
}

TEST_F(SchedulerTest, AnEmptyHandlerIsRefused) {
  Scheduler scheduler(*store_, clock_, options());
  EXPECT_THROW(scheduler.register_handler("work", Handler()), std::invalid_argument);
  EXPECT_TRUE(scheduler.kinds().empty());
}

TEST_F(SchedulerTest, ALeaseOrHeartbeatIntervalThatIsNotPositiveIsRefused) {
  SchedulerOptions no_lease = options();
  no_lease.lease_ms = 0;
  EXPECT_THROW(Scheduler(*store_, clock_, no_lease), std::invalid_argument);
  SchedulerOptions no_beat = options();
  no_beat.heartbeat_interval_ms = -1;
  EXPECT_THROW(Scheduler(*store_, clock_, no_beat), std::invalid_argument);
}

// A negative prefetch would leave fewer places than workers, none at all from -workers on: the
// claim loop would claim nothing and the queue would never move, with no error (the daemon's
// config refuses it; a library user is told too).
TEST_F(SchedulerTest, ANegativePrefetchIsRefused) {
  SchedulerOptions o = options();
  o.prefetch = -4;
  try {
    Scheduler scheduler(*store_, clock_, o);
    ADD_FAILURE() << "a prefetch of -4 was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "scheduler: prefetch must not be negative (got -4)");
  }
}

// Review: intervals the daemon's config refuses were taken from every other caller: a beat no
// sooner than the lease lapses (the sweep hands running jobs to a second worker), and a poll, sweep
// interval or prune bound of 0 (loops that spin).
TEST_F(SchedulerTest, IntervalsThatLetLeasesLapseOrLoopsSpinAreRefused) {
  const auto refused = [&](SchedulerOptions o) -> std::string {
    try {
      Scheduler scheduler(*store_, clock_, o);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "taken";
  };
  SchedulerOptions beat = options();
  beat.heartbeat_interval_ms = beat.lease_ms;
  EXPECT_EQ(refused(beat),
            "scheduler: heartbeat_interval_ms (30000) must be at most half of lease_ms (30000)");
  // A beat due just before the lease ends comes after it (the loop's rounds, the store's write):
  // a lease of 1000 ms beaten every 999 ms ran each job on three workers at once.
  beat.lease_ms = 1'000;
  beat.heartbeat_interval_ms = 999;
  EXPECT_EQ(refused(beat),
            "scheduler: heartbeat_interval_ms (999) must be at most half of lease_ms (1000)");
  beat.heartbeat_interval_ms = 500;
  EXPECT_EQ(refused(beat), "taken");
  SchedulerOptions poll = options();
  poll.idle_poll_ms = 0;
  EXPECT_EQ(refused(poll), "scheduler: idle_poll_ms must be positive (got 0)");
  SchedulerOptions sweep = options();
  sweep.sweep_interval_ms = -5;
  EXPECT_EQ(refused(sweep), "scheduler: sweep_interval_ms must be positive (got -5)");
  SchedulerOptions prune = options();
  prune.prune_per_sweep = 0;
  EXPECT_EQ(refused(prune), "scheduler: prune_per_sweep must be positive (got 0)");
}

// Review: the sweeper pruned a whole backlog in one round, holding its sweeps (expired leases,
// overdue parents) and a drain back until it was done. Each round prunes at most prune_per_sweep.
class CountsPrunes : public ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  using JobStore::prune;
  SweepResult sweep(int64_t now_ms) override {
    ++sweeps_;
    return ForwardingStore::sweep(now_ms);
  }
  int64_t prune(int64_t finished_before_ms, int64_t max_jobs) override {
    {
      std::lock_guard lock(mutex_);
      bounds_.push_back(max_jobs);
    }
    return ForwardingStore::prune(finished_before_ms, max_jobs);
  }
  std::vector<int64_t> prune_bounds() const {
    std::lock_guard lock(mutex_);
    return bounds_;
  }
  size_t sweeps() const { return sweeps_; }

 private:
  mutable std::mutex mutex_;
  std::vector<int64_t> bounds_;
  std::atomic<size_t> sweeps_{0};
};

TEST_F(SchedulerTest, TheSweeperPrunesABoundedPassEachRound) {
  {
    Scheduler done(*store_, clock_, options());
    done.register_handler("work", [](JobContext&) { return Outcome::complete("{}"); });
    for (int i = 0; i < 7; ++i) enqueue("work");
    EXPECT_EQ(done.run_once(10), 7u);
  }
  clock_.advance_ms(3'600'000);
  CountsPrunes counting(*store_);
  SchedulerOptions o = options();
  o.retention_ms = 1;
  o.prune_per_sweep = 3;
  o.sweep_interval_ms = 10;
  Scheduler scheduler(counting, clock_, o);
  scheduler.start();
  for (int i = 0; i < 500 && store_->list({}).jobs.size() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  scheduler.drain(std::chrono::milliseconds(0));
  EXPECT_EQ(store_->list({}).jobs.size(), 0u);
  const std::vector<int64_t> bounds = counting.prune_bounds();
  ASSERT_GE(bounds.size(), 3u) << "7 jobs, 3 a round";
  for (const int64_t bound : bounds) EXPECT_EQ(bound, 3);
  EXPECT_GE(counting.sweeps(), bounds.size()) << "each round sweeps before it prunes";
}

// start() on a running scheduler does nothing: with recover_own_leases, it used to expire the
// leases of the jobs its own workers were running, so that they ran twice.
TEST_F(SchedulerTest, ASecondStartDoesNotRecoverTheJobsItIsRunning) {
  SchedulerOptions o = options();
  o.recover_own_leases = true;
  Scheduler scheduler(*store_, clock_, o);
  std::atomic<int> calls{0};
  std::atomic<bool> release{false};
  SetOnExit let_go{release};
  scheduler.register_handler("work", [&](JobContext&) {
    ++calls;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return Outcome::complete();
  });
  const JobId id = enqueue("work");
  scheduler.start();
  wait_for([&] { return calls.load() == 1; });
  ASSERT_EQ(calls.load(), 1);
  scheduler.start();
  release = true;
  wait_for([&] { return store_->get(id)->status == JobStatus::kSucceeded; });
  scheduler.drain(std::chrono::milliseconds(1'000));
  Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kSucceeded);
  EXPECT_EQ(job.attempts, 1);
  EXPECT_EQ(calls.load(), 1);
  for (const Attempt& a : store_->attempts(id)) EXPECT_NE(a.outcome, "lease_expired");
}

// A drain past its grace asks handlers to stop; a start after it runs them to their end again
// (before, every job it claimed was released at once, over and over).
TEST_F(SchedulerTest, AStartAfterADrainPastItsGraceRunsJobsAgain) {
  SystemClock clock;
  Scheduler scheduler(*store_, clock, options());
  std::atomic<bool> started{false};
  std::atomic<bool> second_run{false};
  scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
    started = true;
    for (;;) {  // pages until interrupted, the first time
      c.checkpoint("{}");
      if (second_run) return Outcome::complete();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const JobId id = enqueue("work");
  scheduler.start();
  wait_for([&] { return started.load(); });
  ASSERT_TRUE(started);
  scheduler.drain(std::chrono::milliseconds(20));
  ASSERT_EQ(store_->get(id)->status, JobStatus::kQueued);
  second_run = true;
  scheduler.start();
  wait_for([&] { return store_->get(id)->status == JobStatus::kSucceeded; });
  scheduler.drain(std::chrono::milliseconds(1'000));
  EXPECT_EQ(store_->get(id)->status, JobStatus::kSucceeded);
  EXPECT_EQ(scheduler.stats().released, 1);
}

// Drains `scheduler` with an hour's grace on a thread of its own, calls `meanwhile` (hurry(),
// say), and says whether the drain returned within wait_for()'s patience. Then sets `give_up`,
// which ends a handler the drain did not stop, and joins the drain.
bool drains_before_its_hour(
    Scheduler& scheduler, std::atomic<bool>& give_up,
    const std::function<void()>& meanwhile = [] {}) {
  std::atomic<bool> drained{false};
  std::thread drainer([&] {
    scheduler.drain(std::chrono::hours(1));
    drained = true;
  });
  meanwhile();
  wait_for([&] { return drained.load(); });
  const bool in_time = drained;
  give_up = true;
  drainer.join();
  return in_time;
}

// hurry() (an operator's second SIGTERM) ends a drain's grace at once: a handler working for
// ever between checkpoints (heartbeats only) is asked to stop and its job released, although the
// grace is an hour. Without it the drain would not return for that hour.
TEST_F(SchedulerTest, HurryEndsTheGraceOfADrainUnderWay) {
  SystemClock clock;
  Scheduler scheduler(*store_, clock, options());
  std::atomic<bool> started{false};
  std::atomic<bool> give_up{false};  // when hurry() failed: ends the handler, not the test run
  scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
    started = true;
    while (!give_up) {  // works until asked to stop (heartbeat() throws then)
      c.heartbeat();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return Outcome::complete();
  });
  const JobId id = enqueue("work");
  scheduler.start();
  wait_for([&] { return started.load(); });
  ASSERT_TRUE(started);
  EXPECT_TRUE(drains_before_its_hour(scheduler, give_up, [&] { scheduler.hurry(); }))
      << "the drain still waits for its grace";
  EXPECT_EQ(store_->get(id)->status, JobStatus::kQueued);
  EXPECT_EQ(scheduler.stats().released, 1);
}

// Review: a drain let handlers go on paging for its whole grace (30 s by default): pages fetched
// after the SIGTERM, and the last one begun with no grace left. SPEC F6: the page in flight
// finishes; the handler is stopped at the checkpoint that saves it, its job released without an
// attempt, and the drain returns without waiting out its grace.
TEST_F(SchedulerTest, ADrainStopsAPagingHandlerAtTheCheckpointOfItsPageInFlight) {
  SystemClock clock;
  Scheduler scheduler(*store_, clock, options());
  std::atomic<bool> started{false};
  std::atomic<bool> draining{false};
  std::atomic<int> pages_begun_draining{0};
  std::atomic<int> last_page{0};     // the last page the handler began to save
  std::atomic<bool> give_up{false};  // when the drain waits: ends the handler, not the test run
  scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
    started = true;
    for (int page = 1; !give_up; ++page) {
      if (draining) ++pages_begun_draining;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the page
      last_page = page;
      c.checkpoint("{\"page\":" + std::to_string(page) + "}");
    }
    return Outcome::complete();
  });
  const JobId id = enqueue("work");
  scheduler.start();
  wait_for([&] { return started.load(); });
  ASSERT_TRUE(started);
  draining = true;
  EXPECT_TRUE(drains_before_its_hour(scheduler, give_up)) << "the drain waits out its grace";
  // The test's flag goes up just before drain() begins: a page may begin between the two.
  EXPECT_LE(pages_begun_draining.load(), 2) << "pages begun once the drain had begun";
  const Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kQueued);
  EXPECT_EQ(job.checkpoint, "{\"page\":" + std::to_string(last_page.load()) + "}")
      << "the page in flight was saved";
  for (const Attempt& a : store_->attempts(id)) EXPECT_NE(a.outcome, "failed");
  EXPECT_EQ(scheduler.stats().released, 1);
}

// A checkpoint counts the running attempt as the first (the store sets attempts to 1): a failure
// after it is retried after the first attempt's delay, not the delay of the attempts before.
TEST_F(SchedulerTest, AFailureAfterACheckpointIsRetriedWithTheFirstAttemptsDelay) {
  Scheduler scheduler(*store_, clock_, options());
  std::atomic<int> runs{0};
  scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
    if (++runs >= 3) c.checkpoint("{\"page\":2}");
    throw std::runtime_error("upstream 503");
  });
  const JobId id = enqueue("work", 5);
  scheduler.run_once(1);
  clock_.advance_ms(2'000);
  scheduler.run_once(1);
  EXPECT_EQ(store_->get(id)->run_after_ms, clock_.now_ms() + 4'000);  // 1000 * 2^2
  clock_.advance_ms(4'000);
  scheduler.run_once(1);  // checkpoints, then fails
  Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kQueued);
  EXPECT_EQ(job.attempts, 1);
  EXPECT_EQ(job.run_after_ms, clock_.now_ms() + 2'000) << "1000 * 2^1, as after a first attempt";
}

// Draining, a job goes back to the queue without an attempt (SPEC F6) even when the beat at its
// page boundary fails: before, the beat's error failed the attempt, which counted it.
TEST_F(SchedulerTest, ADrainReleasesAJobWhoseLastBeatFails) {
  FailsBeats store(*store_);
  Scheduler scheduler(store, clock_, options());  // the heartbeat loop's beats: 10 s apart
  std::atomic<bool> started{false};
  scheduler.register_handler("work", [&](JobContext& c) -> Outcome {
    started = true;
    while (!c.stopping()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    c.checkpoint("{\"page\":3}");  // the page boundary: its beat fails
    return Outcome::complete();
  });
  const JobId id = enqueue("work");
  scheduler.start();
  wait_for([&] { return started.load(); });
  ASSERT_TRUE(started);
  store.refuse = true;
  scheduler.drain(std::chrono::milliseconds(0));
  Job job = *store_->get(id);
  EXPECT_EQ(job.status, JobStatus::kQueued);
  EXPECT_EQ(job.attempts, 0);
  EXPECT_FALSE(job.last_error);
  EXPECT_EQ(scheduler.stats().released, 1);
  EXPECT_EQ(scheduler.stats().failed, 0);
}

// Prefetched jobs are released at drain like any ending, tried again over a store that fails
// (before, one failed call left them to their leases, and the sweep counted an attempt).
TEST_F(DrainOfPrefetchedJobs, AreReleasedWhenTheStoreFailsOnce) {
  UnreachableForAWhile store(*store_, 1, false);
  Scheduler scheduler(store, clock_, one_worker_three_ahead());
  std::vector<JobId> ids = start_with_three_prefetched(scheduler);
  scheduler.drain(std::chrono::milliseconds(0));
  EXPECT_EQ(store.failed(), 1);
  EXPECT_EQ(scheduler.stats().released, 4);
  expect_queued(ids, 0);
}

}  // namespace
}  // namespace backhaul::jobs
