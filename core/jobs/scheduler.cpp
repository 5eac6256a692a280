#include "core/jobs/scheduler.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <stdexcept>
#include <thread>

#include "core/common/logging.h"

namespace backhaul::jobs {

// --- JobContext -----------------------------------------------------------------------------

bool JobContext::stopping() const noexcept {
  return stopping_.load() || cancelled_.load() || lease_lost_.load();
}

void JobContext::renew(int64_t now_ms, const std::optional<std::string>& checkpoint,
                       bool progress) {
  try {
    HeartbeatResult r = store_.heartbeat(job_.id, token_, now_ms, lease_ms_, checkpoint, progress);
    last_beat_ms_ = now_ms;
    note_beat(now_ms, nullptr);
    if (r.cancel_requested) cancelled_ = true;
  } catch (const LeaseLost&) {
    lease_lost_ = true;
    note_beat(now_ms, nullptr);  // the store answered
    throw;
  } catch (const StorageError& e) {  // not a checkpoint the store refuses as invalid
    note_beat(now_ms, e.what());
    throw;
  }
}

void JobContext::beat(const std::optional<std::string>& checkpoint, bool progress) {
  if (lease_lost_) throw JobInterrupted(JobInterrupted::Reason::kLeaseLost, "lease lost");
  try {
    renew(clock_.now_ms(), checkpoint, progress);
    // A checkpoint is progress: the store counts the running attempt as the first (SPEC D11), and
    // a failure from here on is retried after the first attempt's delay.
    if (checkpoint && progress) job_.attempts = 1;
  } catch (const LeaseLost& e) {
    throw JobInterrupted(JobInterrupted::Reason::kLeaseLost, e.what());
  } catch (const StorageError& e) {
    // A cancel an earlier beat learnt stands whether or not this one went through: the job ends
    // cancelled, not as a failed attempt (a dead letter on its last) because the store went away.
    if (cancelled_) {
      throw JobInterrupted(
          JobInterrupted::Reason::kCancelled,
          std::string("job was cancelled (the last heartbeat failed: ") + e.what() + ")");
    }
    // Draining, the job goes back without an attempt (SPEC F6) whether or not its last beat went
    // through: it resumes from the last checkpoint that did.
    if (stopping_ || (checkpoint && progress && draining_)) {
      throw JobInterrupted(
          JobInterrupted::Reason::kDraining,
          std::string("host is draining (the last heartbeat failed: ") + e.what() + ")");
    }
    throw;
  }
  if (cancelled_) throw JobInterrupted(JobInterrupted::Reason::kCancelled, "job was cancelled");
  // A drain stops a handler at its next checkpoint of progress (its page finished and saved), and
  // anywhere once its grace ran out.
  if (stopping_ || (checkpoint && progress && draining_))
    throw JobInterrupted(JobInterrupted::Reason::kDraining, "host is draining");
}

void JobContext::note_beat(int64_t now_ms, const char* error) {
  beat_failed_ms_ = error ? std::max<int64_t>(now_ms, 1) : 0;  // 0 means "did not fail"
  scheduler_.note_store("heartbeat", error);
}

void JobContext::checkpoint(const std::string& checkpoint_json) { beat(checkpoint_json); }
void JobContext::checkpoint_without_progress(const std::string& checkpoint_json) {
  beat(checkpoint_json, /*progress=*/false);
}
void JobContext::heartbeat() { beat(std::nullopt); }

// --- Scheduler ------------------------------------------------------------------------------

Scheduler::Scheduler(JobStore& store, const Clock& clock, SchedulerOptions options)
    : store_(store), clock_(clock), options_(std::move(options)), log_(logging::get("scheduler")) {
  check_lease_ms("scheduler", options_.lease_ms);
  if (options_.heartbeat_interval_ms <= 0) {
    throw std::invalid_argument("scheduler: heartbeat_interval_ms must be positive (got " +
                                std::to_string(options_.heartbeat_interval_ms) + ")");
  }
  // Fewer jobs in hand than workers would claim nothing once workers + prefetch <= 0: a queue that
  // never moves, with no error anywhere.
  if (options_.prefetch < 0) {
    throw std::invalid_argument("scheduler: prefetch must not be negative (got " +
                                std::to_string(options_.prefetch) + ")");
  }
  // A beat no sooner than the lease runs out lets every lease lapse: the sweep would hand running
  // jobs to a second worker. So does one just before it: a beat comes a little after its interval
  // (the loop's rounds, the store's write), and a lease 1000 ms beaten every 999 ms ran each job on
  // three workers at once. Half the lease leaves a beat's delay as long as the interval itself.
  // (The daemon's config refuses it too; this is for every other caller.)
  if (options_.heartbeat_interval_ms > options_.lease_ms / 2) {
    throw std::invalid_argument(
        "scheduler: heartbeat_interval_ms (" + std::to_string(options_.heartbeat_interval_ms) +
        ") must be at most half of lease_ms (" + std::to_string(options_.lease_ms) + ")");
  }
  // 0 would spin: a claim loop finding nothing (or a failing store) and a sweeper with no pause.
  for (const auto& [name, value] : {std::pair{"idle_poll_ms", options_.idle_poll_ms},
                                    {"sweep_interval_ms", options_.sweep_interval_ms},
                                    {"prune_per_sweep", options_.prune_per_sweep}}) {
    if (value <= 0) {
      throw std::invalid_argument(std::string("scheduler: ") + name + " must be positive (got " +
                                  std::to_string(value) + ")");
    }
  }
  options_.workers = std::max(options_.workers, 1);
  options_.claim_batch = std::max<size_t>(options_.claim_batch, 1);
  options_.claimers = std::clamp(options_.claimers, 1, options_.workers + options_.prefetch);
  options_.heartbeat_lanes = std::max(options_.heartbeat_lanes, 1);
}

Scheduler::~Scheduler() { drain(std::chrono::milliseconds(0)); }

void Scheduler::register_handler(const std::string& kind, Handler handler) {
  if (!handler) throw std::invalid_argument("no handler given for job kind '" + kind + "'");
  std::lock_guard lock(mutex_);
  handlers_[kind] = std::move(handler);
}

std::vector<std::string> Scheduler::kinds() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> out;
  for (const auto& [kind, handler] : handlers_) out.push_back(kind);
  return out;
}

void Scheduler::start() {
  {
    std::lock_guard lock(mutex_);
    // Running already: its own leases are live, not a crashed host's to recover.
    if (claiming_ || !threads_.empty()) return;
  }
  if (options_.recover_own_leases) {
    SweepResult own = store_.recover_owner(options_.owner, clock_.now_ms());
    if (own.requeued || own.dead) {
      log_->info("start-up recovery: {} jobs this host ({}) left running requeued, {} dead",
                 own.requeued, options_.owner, own.dead);
    }
  }
  SweepResult recovered = store_.sweep(clock_.now_ms());
  if (recovered.requeued || recovered.dead || recovered.parents_woken) {
    log_->info("start-up recovery: {} requeued, {} dead, {} parents woken", recovered.requeued,
               recovered.dead, recovered.parents_woken);
  }
  // Jobs enqueued through this store object wake the claim loop at once (in-process); the
  // listener runs on the enqueuing thread and only sets a flag. Not under mutex_, which the
  // listener takes.
  subscription_ = store_.subscribe([this] {
    {
      std::lock_guard lock(mutex_);
      poked_ = true;
      ++wakes_;
    }
    wake_.notify_all();
  });
  std::lock_guard lock(mutex_);
  claiming_ = true;
  stopped_ = false;
  stopping_ = false;  // a start after a drain past its grace runs handlers to their end again
  draining_ = false;
  hurried_ = false;
  finisher_running_ = true;
  for (int i = 0; i < options_.workers; ++i) threads_.emplace_back([this] { worker_loop(); });
  for (int i = 0; i < options_.claimers; ++i) threads_.emplace_back([this] { claim_loop(); });
  threads_.emplace_back([this] { finisher_loop(); });
  threads_.emplace_back([this] { heartbeat_loop(); });
  lane_beats_.assign(static_cast<size_t>(options_.heartbeat_lanes), LaneBeat{});
  for (size_t lane = 0; lane < lane_beats_.size(); ++lane) {
    threads_.emplace_back([this, lane] { heartbeat_lane(lane); });
  }
  threads_.emplace_back([this] { sweep_loop(); });
}

// Until `ms` have passed, a wakeup that makes a job runnable (wakes_: an enqueue, a requeue), a
// drain, or the moment an ending's commit drew (commit_wake_at_), whichever comes first.
void Scheduler::pause(std::unique_lock<std::mutex>& lock, int64_t ms) {
  using std::chrono::steady_clock;
  const uint64_t seen = wakes_;
  const steady_clock::time_point poll_end = steady_clock::now() + std::chrono::milliseconds(ms);
  while (wakes_ == seen && claiming_ && !stopped_) {
    const steady_clock::time_point until =
        commit_wake_at_ ? std::min(poll_end, *commit_wake_at_) : poll_end;
    if (steady_clock::now() >= until) break;
    wake_.wait_until(lock, until);
  }
}

// The heartbeat and sweep loops' timers. Not on wake_: it fires at every job's end, and a sweep
// per job end is a store transaction per job end.
void Scheduler::sleep_unless_stopped(std::unique_lock<std::mutex>& lock, int64_t ms) {
  stop_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopped_; });
}

void Scheduler::claim_loop() {
  const std::vector<std::string> claim_kinds = kinds();
  if (claim_kinds.empty()) {  // a claim of no kinds takes any: every job would die unhandled
    log_->warn("no job kind has a handler: claiming nothing");
    return;
  }
  int64_t backoff_ms = options_.idle_poll_ms;
  std::unique_lock lock(mutex_);
  while (claiming_ && !stopped_) {
    // Places neither held nor being claimed for by another claim loop.
    const int places = options_.workers + options_.prefetch;
    const int free = unrecorded_ > 2 * places ? 0 : places - busy_ - reserved_;
    if (free <= 0) {
      wake_.wait(lock);
      continue;
    }
    const size_t want = std::min<size_t>(static_cast<size_t>(free), options_.claim_batch);
    reserved_ += static_cast<int>(want);
    poked_ = false;  // a job made runnable from now on makes the claim below run again at once
    commit_wake_at_.reset();  // the claim sees the endings committed so far
    lock.unlock();
    std::vector<Claimed> claimed;
    bool store_failed = false;
    const int64_t claimed_at = clock_.now_ms();
    try {
      ClaimRequest request{options_.owner, want, claimed_at, options_.lease_ms, claim_kinds};
      claimed = store_.claim(request);
      backoff_ms = options_.idle_poll_ms;
      note_store("claim", nullptr);
    } catch (const std::exception& e) {
      store_failed = true;
      log_->error("claim failed, retrying in {} ms: {}", backoff_ms, e.what());
      note_store("claim", e.what());
    }
    const size_t n = claimed.size();
    std::vector<std::shared_ptr<JobContext>> leased = lease(std::move(claimed), claimed_at);
    claimed_ += static_cast<int64_t>(n);  // the ones handed back below too: they count released
    lock.lock();
    reserved_ -= static_cast<int>(want);
    if (!claiming_) {
      // Drain started while we were claiming: hand these back untouched.
      lock.unlock();
      release_unstarted(leased);
      lock.lock();
      break;
    }
    busy_ += static_cast<int>(n);
    for (auto& c : leased) ready_.push_back(std::move(c));
    if (n > 0) work_ready_.notify_all();
    if (store_failed) {
      // The store is not asked again before the backoff ends: jobs ending or made runnable
      // meanwhile (each fires wake_) do not cut it short; a drain or stop does.
      wake_.wait_for(lock, std::chrono::milliseconds(backoff_ms),
                     [this] { return !claiming_ || stopped_; });
      backoff_ms = std::min<int64_t>(backoff_ms * 2, 10'000);
    } else if (n == 0 && !poked_) {
      pause(lock, options_.idle_poll_ms);
    }
  }
}

void Scheduler::worker_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    work_ready_.wait(lock, [this] { return stopped_ || !ready_.empty(); });
    if (ready_.empty()) return;  // stopped
    std::shared_ptr<JobContext> context = std::move(ready_.front());
    ready_.pop_front();
    lock.unlock();
    execute(std::move(context));
    lock.lock();
    --busy_;
    // A place freed: a claim loop waiting for one goes on. An idle pause does not end (wakes_):
    // the claim before it found nothing to take, and a job's end changes that only once its
    // ending commits, which draws its own moment (apply()). Ended here, the claim could run just
    // after the commit and take back at once the cap place this host freed.
    wake_.notify_all();
  }
}

int64_t heartbeat_wait_ms(int64_t now_ms, std::optional<int64_t> next_due_ms, int64_t interval_ms) {
  const int64_t most = std::max<int64_t>(interval_ms / 2, 10);
  if (!next_due_ms) return most;
  return std::clamp<int64_t>(*next_due_ms - now_ms, 10, most);
}

// When the heartbeat loop next beats `c`: one interval after its last beat, or, once a beat failed
// when it was due (the loop's own, or a handler's), half an interval after that failure.
int64_t Scheduler::beat_due_ms(const JobContext& c, int64_t interval_ms) {
  const int64_t due = c.last_beat_ms_ + interval_ms;
  const int64_t failed_ms = c.beat_failed_ms_;
  return failed_ms >= due ? failed_ms + interval_ms / 2 : due;
}

void Scheduler::heartbeat_loop() {
  const int64_t interval = options_.heartbeat_interval_ms;
  int64_t wait_ms = heartbeat_wait_ms(0, std::nullopt, interval);
  std::unique_lock lock(mutex_);
  while (!stopped_) {
    sleep_unless_stopped(lock, wait_ms);
    if (stopped_) break;
    const int64_t now = clock_.now_ms();
    report_waiting_beats(now);  // before this round queues more
    // The round hands the due beats to the lanes and does not wait for them: a beat that waits for
    // a row another transaction holds (on MySQL up to the lock wait) holds up its lane
    // only. The jobs whose last beat failed (here or in their handler) go after the others, the
    // one that failed longest ago first, so neither one nor several failing rows keep the others,
    // or each other, from being renewed. Keys are read once: a handler may change its job's
    // meanwhile.
    // Jobs whose endings wait to be recorded go after those still running.
    std::vector<std::pair<int64_t, std::shared_ptr<JobContext>>> order;
    for (const auto& c : leased_) {
      const int64_t failed_ms = c->beat_failed_ms_;
      order.emplace_back(failed_ms ? failed_ms : std::numeric_limits<int64_t>::min(), c);
    }
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return std::pair(a.second->ended_, a.first) < std::pair(b.second->ended_, b.first);
    });
    bool failing = false;  // a job in hand whose last beat failed
    bool beating = false;  // a job in hand with a beat queued or under way
    std::optional<int64_t> next_due;
    for (auto& [failed_ms, context] : order) {
      if (context->lease_lost_ || context->finishing_) continue;  // nothing to renew, or not now
      failing = failing || failed_ms != std::numeric_limits<int64_t>::min();
      if (context->beat_queued_) {  // one beat at a time per job: the next round sees how it went
        beating = true;
        continue;
      }
      const int64_t due = beat_due_ms(*context, interval);
      if (now >= due) {
        context->beat_queued_ = true;
        beats_.push_back(std::move(context));
        beating = true;
        continue;
      }
      next_due = std::min(next_due.value_or(std::numeric_limits<int64_t>::max()), due);
    }
    if (!beats_.empty()) beats_ready_.notify_all();
    wait_ms = heartbeat_wait_ms(now, next_due, interval);
    hand_back_cancelled(lock);
    // No job whose last beat failed is in hand any more, and none is being beaten: heartbeats are
    // not failing, even if none was due this round.
    if (!failing && !beating) {
      lock.unlock();
      note_store("heartbeat", nullptr);
      lock.lock();
    }
  }
}

void Scheduler::heartbeat_lane(size_t lane) {
  std::unique_lock lock(mutex_);
  while (true) {
    beats_ready_.wait(lock, [this] { return stopped_ || !beats_.empty(); });
    if (stopped_) return;
    std::shared_ptr<JobContext> context = std::move(beats_.front());
    beats_.pop_front();
    // The lease runs from now, not from the round that queued the beat: lanes busy with beats
    // that wait may have held it up for longer than a lease.
    const int64_t now = clock_.now_ms();
    lane_beats_[lane] = {true, context->job_.id, now, false};
    lock.unlock();
    const bool store_down = beat(*context, now);
    lock.lock();
    if (lane_beats_[lane].reported) {
      log_->info("heartbeat of job {} ended after {} ms", context->job_.id, clock_.now_ms() - now);
    }
    lane_beats_[lane] = LaneBeat{};
    context->beat_queued_ = false;
    if (store_down) {
      // A call to a store that is down can take seconds (connect timeouts, its own retries): the
      // beats queued behind this one wait for the next round rather than hold up the lanes and a
      // stop. A round makes at most one call per lane to such a store, not one per job in hand.
      for (auto& queued : beats_) queued->beat_queued_ = false;
      beats_.clear();
    }
    if (context->cancelled_) hand_back_cancelled(lock);
  }
}

void Scheduler::report_waiting_beats(int64_t now_ms) {
  const int busy = static_cast<int>(std::count_if(lane_beats_.begin(), lane_beats_.end(),
                                                  [](const LaneBeat& b) { return b.busy; }));
  for (LaneBeat& b : lane_beats_) {
    if (!b.busy || b.reported || now_ms - b.since_ms < options_.heartbeat_interval_ms) continue;
    b.reported = true;
    log_->warn(
        "heartbeat of job {} has waited {} ms for the store (on MySQL, a row another transaction "
        "holds?); {} of {} heartbeat lanes busy, {} beats waiting for one",
        b.job, now_ms - b.since_ms, busy, lane_beats_.size(), beats_.size());
  }
}

bool Scheduler::beat(JobContext& context, int64_t now) {
  try {
    context.renew(now, std::nullopt);
  } catch (const LeaseLost&) {  // noted: the job is dropped from the rounds
  } catch (const StorageError& e) {
    log_->warn("heartbeat of job {} failed: {}", context.job_.id, e.what());
    // Locked rows (held by other transactions) or a statement someone stopped are no store
    // outage: the others go on.
    return e.outage();
  } catch (const std::exception& e) {  // not the store's answer: noted here, not by renew()
    log_->warn("heartbeat of job {} failed: {}", context.job_.id, e.what());
    context.note_beat(now, e.what());
  }
  return false;
}

void Scheduler::hand_back_cancelled(std::unique_lock<std::mutex>& lock) {
  std::vector<std::shared_ptr<JobContext>> cancelled;
  int lost = 0;
  for (auto it = ready_.begin(); it != ready_.end();) {
    if ((*it)->lease_lost_) {
      // Another's now (a heartbeat learnt it): nothing to hand back, and its place is free for a
      // job of ours rather than held until a worker would have dropped it.
      log_->warn("job {} lost its lease while it waited for a worker", (*it)->job_.id);
      unlease_locked(*it);
      it = ready_.erase(it);
      ++lost;
    } else if ((*it)->cancelled_) {
      cancelled.push_back(std::move(*it));
      it = ready_.erase(it);
    } else {
      ++it;
    }
  }
  if (cancelled.empty() && lost == 0) return;
  for (const auto& c : cancelled) c->ended_ = true;
  unrecorded_ += static_cast<int>(cancelled.size());
  lock.unlock();
  interrupted_ += lost;
  // Handed over before their places are given up (busy_), as a worker hands over its job's
  // ending: a drain that finds nothing in hand finds their endings with the finisher.
  for (const auto& c : cancelled) {
    ++interrupted_;
    Ending ending = released(*c);
    ending.context = c;
    end(std::move(ending));
  }
  lock.lock();
  busy_ -= static_cast<int>(cancelled.size()) + lost;
  wake_.notify_all();  // places freed (not an end of an idle pause: see worker_loop)
}

Scheduler::Ending Scheduler::released(const JobContext& c) const {
  Finish f;
  f.kind = Finish::Kind::kRelease;
  f.id = c.job_.id;
  f.token = c.token_;
  return {std::move(f), c.job_.kind, c.job_.attempts, c.job_.max_attempts,
          later_by(c.last_beat_ms_, options_.lease_ms)};
}

void Scheduler::sweep_loop() {
  std::unique_lock lock(mutex_);
  while (!stopped_) {
    sleep_unless_stopped(lock, options_.sweep_interval_ms);
    if (stopped_) break;
    lock.unlock();
    try {
      int64_t now = clock_.now_ms();
      SweepResult r = store_.sweep(now);
      if (r.requeued || r.dead || r.parents_woken) {
        log_->warn("sweep: {} expired leases requeued, {} dead, {} parents woken", r.requeued,
                   r.dead, r.parents_woken);
      }
      // A bounded pass: a backlog of millions (a lowered retention, a long downtime) is pruned
      // over many rounds, each after its sweep, rather than in one that holds the sweeps (expired
      // leases, overdue parents) and a drain (which joins this thread) back until it is done.
      if (options_.retention_ms > 0)
        store_.prune(now - options_.retention_ms, options_.prune_per_sweep);
      note_store("sweep", nullptr);
    } catch (const std::exception& e) {
      log_->error("sweep failed: {}", e.what());
      note_store("sweep", e.what());
    }
    lock.lock();
  }
}

std::vector<std::shared_ptr<JobContext>> Scheduler::lease(std::vector<Claimed> claimed,
                                                          int64_t now_ms) {
  std::vector<std::shared_ptr<JobContext>> contexts;
  if (claimed.empty()) return contexts;  // an idle claim loop takes no lock for nothing
  for (Claimed& c : claimed) {
    contexts.emplace_back(new JobContext(*this, store_, clock_, std::move(c), options_.lease_ms,
                                         stopping_, draining_));
    contexts.back()->last_beat_ms_ = now_ms;
  }
  std::lock_guard lock(mutex_);
  leased_.insert(leased_.end(), contexts.begin(), contexts.end());
  return contexts;
}

void Scheduler::unlease_locked(const std::shared_ptr<JobContext>& context) {
  // Order does not matter: the last one takes the place of the one that goes.
  if (auto it = std::find(leased_.begin(), leased_.end(), context); it != leased_.end()) {
    *it = std::move(leased_.back());
    leased_.pop_back();
  }
}

void Scheduler::execute(std::shared_ptr<JobContext> context) {
  Handler handler;
  {
    std::lock_guard lock(mutex_);
    auto it = handlers_.find(context->job_.kind);
    if (it != handlers_.end()) handler = it->second;
  }
  const int64_t started_ms = clock_.now_ms();
  std::optional<Ending> ending;
  bool ran_out = false;  // the lease, by the clock: its heartbeats failed while it waited
  bool started = false;  // its handler was called
  try {
    // What the heartbeats learnt while the job waited for a worker, or, when they failed (the
    // store unreachable), what the clock says: a lease not renewed in time may be another's now.
    if (context->lease_lost_) {
      throw JobInterrupted(JobInterrupted::Reason::kLeaseLost, "lease lost before the start");
    }
    if (started_ms >= later_by(context->last_beat_ms_, options_.lease_ms)) {
      context->lease_lost_ = true;  // no more heartbeats
      ran_out = true;
      throw JobInterrupted(JobInterrupted::Reason::kLeaseLost, "lease ran out before the start");
    }
    // Its beats held up while it waited (lanes waiting for rows other transactions hold), a job
    // may have little of its lease left: renewed first, or it could run out before the next beat
    // and another host's sweep run the job a second time. A renewal that fails (the store
    // unreachable) is noted, and the job starts on what is left, as its heartbeats go on trying.
    if (started_ms >= later_by(context->last_beat_ms_, options_.lease_ms / 2)) {
      try {
        context->renew(started_ms, std::nullopt);
      } catch (const LeaseLost&) {
        throw JobInterrupted(JobInterrupted::Reason::kLeaseLost, "lease lost before the start");
      } catch (const StorageError& e) {
        log_->warn("job {}: renewing its lease before the start failed: {}", context->job_.id,
                   e.what());
        // The failed call may have taken long (a lock wait, connect timeouts): its lease, by the
        // clock now, may have run out meanwhile. (Reviewer's finding.)
        if (clock_.now_ms() >= later_by(context->last_beat_ms_, options_.lease_ms)) {
          context->lease_lost_ = true;
          ran_out = true;
          throw JobInterrupted(JobInterrupted::Reason::kLeaseLost,
                               "lease ran out before the start");
        }
      }
    }
    if (context->cancelled_) throw JobInterrupted(JobInterrupted::Reason::kCancelled, "cancelled");
    if (!handler) throw JobFailure("no handler for job kind '" + context->job_.kind + "'", true);
    if (stopping_) throw JobInterrupted(JobInterrupted::Reason::kDraining, "host is draining");
    started = true;
    ending = finish(*context, handler(*context));
  } catch (const JobInterrupted& e) {
    ++interrupted_;
    if (e.reason() != JobInterrupted::Reason::kLeaseLost || ran_out) {
      // Cancelled jobs become cancelled in the store; drained ones go back to queued. One whose
      // lease ran out unrenewed goes back too, without an attempt, unless the store gave it to
      // another meanwhile (then the release finds the lease lost): left to the sweep, the
      // attempt that never started would count.
      ending = released(*context);
    } else {
      log_->warn("job {} lost its lease; another worker owns it now", context->job_.id);
    }
  } catch (const JobFailure& e) {
    ending = fail(*context, e.what(), e.fatal(), e.retry_after_ms());
  } catch (const LeaseLost& e) {
    log_->warn("job {} lost its lease: {}", context->job_.id, e.what());
  } catch (const std::exception& e) {
    ending = fail(*context, e.what(), false, 0);
  } catch (...) {  // a handler's own exception type: the attempt fails, the process goes on
    ending =
        fail(*context, "the handler threw an exception that is not a std::exception", false, 0);
  }
  {
    const Job& job = context->job_;
    std::lock_guard lock(mutex_);
    if (ending) {  // heartbeated until the ending is recorded
      context->ended_ = true;
      ++unrecorded_;
    } else {
      unlease_locked(context);
    }
    if (started) {  // a job not started (its lease lost, cancelled, draining) is no handler run
      KindLatency& l = latency_[job.kind];
      ++l.runs;
      l.wait_ms_sum +=
          std::max<int64_t>(0, started_ms - std::max(job.created_ms, job.run_after_ms));
      l.run_ms_sum += std::max<int64_t>(0, clock_.now_ms() - started_ms);
    }
  }
  if (ending) {
    ending->lease_until_ms = later_by(context->last_beat_ms_, options_.lease_ms);
    ending->context = std::move(context);
    end(std::move(*ending));
  }
}

Scheduler::Ending Scheduler::finish(JobContext& c, const Outcome& outcome) {
  Finish f;
  f.id = c.job_.id;
  f.token = c.token_;
  switch (outcome.kind) {
    case Outcome::Kind::kComplete:
      f.kind = Finish::Kind::kComplete;
      f.result_json = outcome.result_json;
      break;
    case Outcome::Kind::kDefer:
      f.kind = Finish::Kind::kDefer;
      f.until_ms = outcome.until_ms;
      f.reason = outcome.reason;
      break;
    case Outcome::Kind::kWaitForChildren:
      f.kind = Finish::Kind::kWaitForChildren;
      f.until_ms = outcome.until_ms;
      f.checkpoint = outcome.checkpoint;
      break;
  }
  return {std::move(f), c.job_.kind, c.job_.attempts, c.job_.max_attempts};
}

Scheduler::Ending Scheduler::fail(JobContext& c, const std::string& error, bool fatal,
                                  int64_t retry_after_ms) {
  const int64_t delay =
      std::max(retry_after_ms, options_.retry.delay_ms(c.job_.attempts, options_.unit_random));
  Finish f;
  f.kind = Finish::Kind::kFail;
  f.id = c.job_.id;
  f.token = c.token_;
  f.failure = {error, fatal, delay};
  return {std::move(f), c.job_.kind, c.job_.attempts, c.job_.max_attempts};
}

void Scheduler::end(Ending ending) {
  std::unique_lock lock(mutex_);
  if (finisher_running_) {
    endings_.push_back(std::move(ending));
    if (endings_.size() == 1) endings_ready_.notify_one();
    return;
  }
  lock.unlock();
  std::vector<Ending> one;
  one.push_back(std::move(ending));
  apply(one, false);
}

void Scheduler::finisher_loop() {
  std::vector<Ending> batch;
  std::unique_lock lock(mutex_);
  while (true) {
    endings_ready_.wait(lock, [this] { return !endings_.empty() || !finisher_running_; });
    if (endings_.empty()) return;  // stopped and flushed
    batch.swap(endings_);
    lock.unlock();
    apply(batch, true);
    batch.clear();
    lock.lock();
  }
}

std::vector<FinishResult> Scheduler::record(std::vector<Ending>& endings, bool until_leases_end) {
  std::vector<FinishResult> results(endings.size());
  std::vector<size_t> pending(endings.size());  // not yet applied for a reason that may pass
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  // Per ending: the tries left once its own lease no longer holds the retries up.
  std::vector<int> tries_left(endings.size(), 5);
  for (int attempt = 1;; ++attempt) {
    std::vector<Finish> items;
    for (size_t i : pending) items.push_back(endings[i].finish);
    std::string failure;
    mark_finishing(endings, pending, true);
    try {
      std::vector<FinishResult> got = store_.finish(items, clock_.now_ms());
      std::vector<size_t> again;
      for (size_t k = 0; k < pending.size() && k < got.size(); ++k) {
        if (got[k].retryable) {
          again.push_back(pending[k]);
          if (failure.empty()) failure = got[k].error;
        }
        results[pending[k]] = std::move(got[k]);
      }
      // The store records endings: one it keeps refusing (its row locked) is no outage.
      if (again.size() < pending.size()) note_store("finish", nullptr);
      mark_finishing(endings, pending, false);
      if (again.empty()) return results;
      pending = std::move(again);
    } catch (const std::exception& e) {
      mark_finishing(endings, pending, false);
      failure = e.what();
      for (size_t i : pending) results[i] = {std::nullopt, false, failure, true};
    }
    note_store("finish", failure.c_str());
    std::unique_lock lock(mutex_);
    const int64_t now = clock_.now_ms();
    std::vector<size_t> kept;
    size_t given_up = 0;
    bool held = false;  // a kept ending whose lease lasts: retried for as long as it does
    for (size_t i : pending) {
      const bool holds = until_leases_end && !stopped_ && now < endings[i].lease_until_ms;
      if (holds || --tries_left[i] > 0) {
        kept.push_back(i);
        held = held || holds;
      } else {
        ++given_up;  // its lease expires and the sweep takes the job back (the attempt counts)
      }
    }
    if (given_up > 0) {
      log_->error("recording {} job endings failed, giving up after 5 tries past their leases: {}",
                  given_up, failure);
    }
    pending = std::move(kept);
    if (pending.empty()) {
      lock.unlock();
      note_store("finish", nullptr);  // nothing left that fails: not a failing operation now
      return results;                 // the ones given up on are still retryable
    }
    log_->warn("recording {} job endings failed, retrying: {}", pending.size(), failure);
    const int64_t pause_ms = std::min<int64_t>(50LL << std::min(attempt, 5), 1'000);
    if (held) {
      sleep_unless_stopped(lock, pause_ms);  // a drain cuts it short
      // Endings handed over meanwhile go along with the retry: one that the store keeps refusing
      // must not hold back the others, whose leases would run out while they wait.
      for (Ending& e : endings_) {
        pending.push_back(endings.size());
        endings.push_back(std::move(e));
      }
      endings_.clear();
      results.resize(endings.size());
      tries_left.resize(endings.size(), 5);
    } else {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    }
  }
}

void Scheduler::mark_finishing(const std::vector<Ending>& endings, const std::vector<size_t>& which,
                               bool finishing) {
  std::lock_guard lock(mutex_);
  for (size_t i : which) {
    if (endings[i].context) endings[i].context->finishing_ = finishing;
  }
}

void Scheduler::apply(std::vector<Ending>& endings, bool until_leases_end) {
  std::vector<FinishResult> results = record(endings, until_leases_end);
  // An ending the store refused for a reason of its own making (not a lost lease, not a failing
  // store: a result or checkpoint it cannot hold) ends the attempt as a failure that names it, so
  // that the job is retried and dies, if it does, with that error; left as it was, the job would
  // stay running until its lease ran out and the sweep took it back.
  // Endings handed over while record() retries such failures go along with them, and the store
  // may refuse those too: they are looked at in turn, until none is left.
  for (size_t from = 0; from < endings.size();) {
    std::vector<size_t> refused;
    std::vector<Ending> failures;
    for (size_t i = from; i < endings.size() && i < results.size(); ++i) {
      const FinishResult& r = results[i];
      const Finish::Kind kind = endings[i].finish.kind;
      if (r.status || r.retryable || r.lease_lost || kind == Finish::Kind::kFail ||
          kind == Finish::Kind::kRelease) {
        continue;
      }
      const Ending& e = endings[i];
      Finish f;
      f.kind = Finish::Kind::kFail;
      f.id = e.finish.id;
      f.token = e.finish.token;
      f.failure = {"the store refused the attempt's outcome: " + r.error, false,
                   options_.retry.delay_ms(e.attempts, options_.unit_random)};
      refused.push_back(i);
      failures.push_back(
          {std::move(f), e.kind, e.attempts, e.max_attempts, e.lease_until_ms, e.context});
    }
    from = endings.size();
    if (failures.empty()) break;
    std::vector<FinishResult> failed = record(failures, until_leases_end);
    for (size_t k = 0; k < refused.size() && k < failed.size(); ++k) {
      log_->error("job {}: the store refused its ending: {}", endings[refused[k]].finish.id,
                  results[refused[k]].error);
      endings[refused[k]] = std::move(failures[k]);
      results[refused[k]] = std::move(failed[k]);
    }
    for (size_t k = refused.size(); k < failures.size() && k < failed.size(); ++k) {
      endings.push_back(std::move(failures[k]));  // handed over while record() retried
      results.push_back(std::move(failed[k]));
    }
  }
  // Recorded, or given up on (their leases then run out): no more heartbeats. A job failed or
  // released back to the queue may run again at once (a retry without backoff): claim now rather
  // than at the next idle poll; so may the claims held back while endings piled up.
  // A job that left `running` frees its place under its key's cap. An idle claim loop (a worker's
  // end does not end its pause: see worker_loop) claims again at a moment drawn within the idle
  // poll, not at once: woken by its own commits, a daemon took back every place it freed before
  // any other host polled, and the other hosts of a shared store starved (MultiDaemonTest: one of
  // two survivors ran no job). Drawn, the moment gives every host polling the store an equal
  // chance, and a host alone waits half a poll on average rather than a whole one.
  bool wake = false;
  bool freed = false;
  {
    std::lock_guard lock(mutex_);
    const bool held_back = unrecorded_ > 2 * (options_.workers + options_.prefetch);
    for (size_t i = 0; i < endings.size(); ++i) {
      if (endings[i].context) {
        unlease_locked(endings[i].context);
        --unrecorded_;
      }
      endings[i].context.reset();
      const bool recorded = i < results.size() && results[i].status.has_value();
      freed = freed || recorded;
      wake = wake || (recorded && results[i].status == JobStatus::kQueued &&
                      endings[i].finish.kind != Finish::Kind::kDefer);
    }
    wake = wake || held_back;
    if (wake) {
      poked_ = true;
      ++wakes_;
    } else if (freed) {
      const auto at = std::chrono::steady_clock::now() +
                      std::chrono::milliseconds(
                          static_cast<int64_t>(std::clamp(options_.unit_random(), 0.0, 1.0) *
                                               static_cast<double>(options_.idle_poll_ms)));
      if (!commit_wake_at_ || at < *commit_wake_at_) commit_wake_at_ = at;
    }
  }
  if (wake || freed) wake_.notify_all();
  for (size_t i = 0; i < endings.size() && i < results.size(); ++i) {
    const Ending& e = endings[i];
    const FinishResult& r = results[i];
    if (!r.status) {
      if (r.retryable) continue;  // given up: record() logged them once
      if (r.lease_lost) {
        log_->warn("job {}: ending not recorded, the lease was lost: {}", e.finish.id, r.error);
      } else {
        log_->error("job {}: recording its ending failed (the lease will expire): {}", e.finish.id,
                    r.error);
      }
      continue;
    }
    switch (e.finish.kind) {
      case Finish::Kind::kComplete:
        ++succeeded_;
        break;
      case Finish::Kind::kDefer:
        ++deferred_;
        break;
      case Finish::Kind::kWaitForChildren:
        ++waiting_;
        break;
      case Finish::Kind::kRelease:
        ++released_;
        break;
      case Finish::Kind::kFail:
        ++failed_;
        if (*r.status == JobStatus::kDead) {
          log_->error("job {} ({}) is dead after {} attempts: {}", e.finish.id, e.kind, e.attempts,
                      e.finish.failure.error);
        } else {
          log_->warn("job {} ({}) failed attempt {}/{}, retrying in {} ms: {}", e.finish.id, e.kind,
                     e.attempts, e.max_attempts, e.finish.failure.retry_delay_ms,
                     e.finish.failure.error);
        }
        break;
    }
  }
}

void Scheduler::release_unstarted(const std::vector<std::shared_ptr<JobContext>>& jobs) {
  if (jobs.empty()) return;
  std::vector<Ending> endings;
  {
    std::lock_guard lock(mutex_);
    for (const auto& c : jobs) unlease_locked(c);
  }
  for (const auto& c : jobs) endings.push_back(released(*c));
  // Tried like any ending (5 times over a failing store): a release that fails leaves the job to
  // its lease, and the sweep that takes it back counts an attempt that never started.
  std::vector<FinishResult> results = record(endings, false);
  for (size_t i = 0; i < endings.size() && i < results.size(); ++i) {
    if (results[i].status) {
      ++released_;
    } else {
      log_->warn("drain: release of job {} failed (its lease will expire): {}",
                 endings[i].finish.id, results[i].error);
    }
  }
}

size_t Scheduler::run_once(size_t limit) {
  const int64_t now = clock_.now_ms();
  std::vector<std::string> claim_kinds = kinds();
  if (claim_kinds.empty()) return 0;  // no handler: claim nothing (an empty list takes any kind)
  std::vector<Claimed> claimed =
      store_.claim({options_.owner, limit, now, options_.lease_ms, std::move(claim_kinds)});
  claimed_ += static_cast<int64_t>(claimed.size());
  std::vector<std::shared_ptr<JobContext>> leased = lease(std::move(claimed), now);
  for (auto& c : leased) execute(std::move(c));
  return leased.size();
}

void Scheduler::drain(std::chrono::milliseconds grace) {
  std::unique_lock lock(mutex_);
  if (threads_.empty()) return;
  lock.unlock();
  store_.unsubscribe(subscription_);  // not under mutex_: the listener takes it
  lock.lock();
  claiming_ = false;
  draining_ = true;
  // Claimed but not started: nothing was done, give them back at once.
  std::vector<std::shared_ptr<JobContext>> unstarted(std::make_move_iterator(ready_.begin()),
                                                     std::make_move_iterator(ready_.end()));
  ready_.clear();
  busy_ -= static_cast<int>(unstarted.size());
  lock.unlock();
  wake_.notify_all();
  release_unstarted(unstarted);
  lock.lock();
  wake_.wait_for(lock, grace, [this] { return busy_ == 0 || hurried_; });
  if (busy_ != 0) {
    if (hurried_) {
      log_->info("drain: hurried; asking the {} jobs still running to stop", busy_);
    } else {
      log_->info("drain: {} jobs still running after {} ms; asking them to stop", busy_,
                 grace.count());
    }
    stopping_ = true;
    wake_.wait(lock, [this] { return busy_ == 0; });
  }
  stopped_ = true;
  finisher_running_ = false;  // it writes what is handed over, then exits
  lock.unlock();
  wake_.notify_all();
  stop_.notify_all();
  beats_ready_.notify_all();
  work_ready_.notify_all();
  endings_ready_.notify_all();
  for (auto& t : threads_) t.join();
  lock.lock();
  threads_.clear();
  beats_.clear();  // their jobs went back
}

void Scheduler::hurry() {
  {
    std::lock_guard lock(mutex_);
    hurried_ = true;
  }
  wake_.notify_all();
}

// An operation is failing from a failed call until one succeeds, or until nothing is left to
// retry: claims and sweeps are always retried; heartbeats while a job whose beat failed is in
// hand (the heartbeat loop's or its handler's beats); endings until recorded or given up on.
void Scheduler::note_store(const char* operation, const char* error) {
  if (!error && failing_operations_.load(std::memory_order_relaxed) == 0) return;  // no lock
  const int64_t now = error ? clock_.now_ms() : 0;
  std::lock_guard lock(failures_mutex_);
  if (!error) {
    store_failures_.erase(operation);
  } else {
    // Two threads' notes (a handler's checkpoint, the heartbeat loop) may arrive out of order.
    auto [it, first] = store_failures_.try_emplace(operation);
    it->second.since_ms = first ? now : std::min(it->second.since_ms, now);
    it->second.last_ms = first ? now : std::max(it->second.last_ms, now);
    // Other jobs' beats, whose success clears it, come up to an interval apart: a shorter span
    // of failures proves nothing (one row refusing its beats while the others' go through).
    if (std::string_view(operation) == "heartbeat") {
      it->second.evidence_ms = options_.heartbeat_interval_ms;
    }
    ++it->second.failures;
    it->second.error = error;
  }
  failing_operations_ = store_failures_.size();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.claimed = claimed_;
  s.succeeded = succeeded_;
  s.failed = failed_;
  s.deferred = deferred_;
  s.waiting = waiting_;
  s.released = released_;
  s.interrupted = interrupted_;
  std::lock_guard lock(mutex_);
  s.in_flight = busy_;
  s.latency = latency_;
  s.heartbeats.lanes = static_cast<int>(lane_beats_.size());
  s.heartbeats.queued = static_cast<int64_t>(beats_.size());
  const LaneBeat* oldest = nullptr;
  for (const LaneBeat& b : lane_beats_) {
    if (!b.busy) continue;
    ++s.heartbeats.busy;
    if (!oldest || b.since_ms < oldest->since_ms) oldest = &b;
  }
  if (oldest) {
    s.heartbeats.oldest_ms = std::max<int64_t>(clock_.now_ms() - oldest->since_ms, 0);
    s.heartbeats.oldest_job = oldest->job;
  }
  std::lock_guard failures_lock(failures_mutex_);
  s.store_failures = store_failures_;
  return s;
}

}  // namespace backhaul::jobs
