// `backhaul-bench queue`: the peer workloads of shared/bench/README.md §3 on Backhaul's own queue,
// printing one JSON line per run with the peers' result fields, so the figures sit beside
// pg-boss, graphile-worker, BullMQ and beanstalkd measured in the same sitting.
//
//   W1 lifecycle: N jobs (default 20000) enqueued in batches of 1000, then processed by a
//                 scheduler with C workers (default 8); every handler succeeds.
//   W2 retries:   N = 5000, max attempts 3, immediate retry; job i fails always when
//                 i % 100 == 1 (50 dead), and on its first attempt when i % 5 == 0 (1000 retried):
//                 4950 succeeded + 50 dead, 6100 handler calls.
//   latency:      enqueue -> start on an idle queue: N jobs (default 2000) enqueued one at a time,
//                 each after the previous one finished and the claim loop went idle (the
//                 scheduler's default 200 ms poll: only the in-process wakeup makes it fast);
//                 prints p50/p99/max of (handler start - enqueue call).
// --processes P (W1): after the enqueue, P worker processes (this program with --worker-of) share
// the processing on one store, as P daemons on one MySQL server would; the figures cover them
// all (handler calls, CPU and peak RSS summed, first claim = the earliest of theirs). The workers
// count their handler calls in one shared counter (a memfd they inherit), so that the run ends as
// a single process's does: the store is polled only once every handler has returned. A worker
// is stopped by SIGTERM, which it gets blocked from the fork on and takes with sigwait(), so one
// sent before it is ready waits for it instead of killing it.
// --keys K spreads W1's jobs over K concurrency keys; --per-key-cap/--global-cap set exact caps
// on the bench kind (to measure what caps cost).
// --server-pid PID (MySQL on this machine): server_cpu_s is that process's user+system CPU over the
// run, setup included (the run's database and migrations), as the peers' lines count theirs, and
// server_rss_kb its VmRSS at the end of the run (the server is not fresh, so its VmHWM is not the
// run's peak, as a fresh peer server's is; that is kept in server_mem.root_hwm_kb).
// A run's own store (a temp SQLite file, a MySQL database) is removed however the run ends.
// Every acknowledgement is durable (SQLite synchronous=FULL, InnoDB flush_log_at_trx_commit=1).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/jobs/mysql_db.h"
#include "core/jobs/scheduler.h"
#include "host/bench/bench.h"
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace backhaul::bench {
namespace {

using Steady = std::chrono::steady_clock;
using jobs::JobStatus;

struct QueueOptions {
  std::string store = "sqlite";
  std::string workload = "lifecycle";
  std::string sqlite_path;
  std::string mysql;
  int jobs = 0;  // 0 = the workload's N (--jobs itself must be positive)
  int concurrency = 8;
  int claim_batch = 0;  // 0 = concurrency (--claim-batch itself must be positive)
  int prefetch = 0;
  int claimers = 1;
  int rep = 1;
  int keys = 1;
  int per_key_cap = 0;
  int global_cap = 0;
  int processes = 1;
  int server_pid = 0;     // the store server's process (MySQL on this machine), for server_cpu_s
  std::string worker_of;  // internal: run as one of --processes' workers for this kind
  int calls_fd = -1;      // internal: the workers' shared handler-call counter
  // The options given on the command line, to refuse those that the chosen run cannot use.
  std::set<std::string> given;
};

// A handler-call counter shared by the parent and its worker processes: one lock-free atomic in
// a memfd, which the workers inherit across exec and map again.
static_assert(std::atomic<int64_t>::is_always_lock_free);
class SharedCounter {
 public:
  static SharedCounter create() {
    int fd = ::memfd_create("backhaul-bench-calls", 0);  // no CLOEXEC: the workers inherit it
    if (fd < 0 || ::ftruncate(fd, sizeof(std::atomic<int64_t>)) != 0) {
      throw std::runtime_error("memfd for the workers' call counter failed");
    }
    SharedCounter c(fd);
    new (c.value_) std::atomic<int64_t>(0);
    return c;
  }
  explicit SharedCounter(int fd) : fd_(fd) {
    void* p =
        ::mmap(nullptr, sizeof(std::atomic<int64_t>), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of the workers' call counter failed");
    value_ = static_cast<std::atomic<int64_t>*>(p);
  }
  SharedCounter(SharedCounter&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), value_(std::exchange(other.value_, nullptr)) {}
  SharedCounter(const SharedCounter&) = delete;
  SharedCounter& operator=(const SharedCounter&) = delete;
  ~SharedCounter() {
    if (value_) ::munmap(value_, sizeof(std::atomic<int64_t>));
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }
  std::atomic<int64_t>& value() { return *value_; }

 private:
  int fd_ = -1;
  std::atomic<int64_t>* value_ = nullptr;
};

// The peers' payload: compact JSON of exactly 200 bytes.
std::string payload(int i) {
  std::string head = "{\"i\":" + std::to_string(i) + ",\"kind\":\"bench\",\"user\":\"user-" +
                     std::to_string(i % 1000) +
                     "\",\"created\":\"2024-01-01T00:00:00.000Z\",\"pad\":\"";
  std::string tail = "\"}";
  return head + std::string(200 - head.size() - tail.size(), 'x') + tail;
}

int payload_index(const std::string& p) { return std::stoi(p.substr(5)); }

double seconds(Steady::time_point a, Steady::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double cpu_seconds(const rusage& r) {
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

// The store of one run. What the run made for itself (a temp SQLite file, a MySQL database) goes
// when the holder does, however the run ends (a thrown error included), so that no run leaves one
// behind; close() does it on the way out of a run that succeeded, where a failure is an error.
// Not movable: open_store() fills one in place, so that the database is marked for dropping as
// soon as it exists.
struct OpenStore {
  OpenStore() = default;
  OpenStore(const OpenStore&) = delete;
  OpenStore& operator=(const OpenStore&) = delete;
  ~OpenStore() {
    try {
      close();
    } catch (const std::exception& e) {
      std::cerr << "warning: the run's store was not removed: " << e.what() << "\n";
    }
  }
  void close() {
    store.reset();
    if (!mysql_drop.empty()) {
      const std::string db = std::exchange(mysql_drop, "");
      jobs::mysql::Connection(jobs::mysql::parse_config(mysql_admin))
          .one("DROP DATABASE IF EXISTS `" + db + "`");
    }
    if (!path.empty()) {
      const std::string file = std::exchange(path, "");
      for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(file + suffix);
    }
  }

  std::unique_ptr<jobs::JobStore> store;
  std::string path;         // a temp SQLite file to remove afterwards, or empty
  std::string sqlite_path;  // SQLite: the file, given or temp (for the workers)
  std::string mysql;        // MySQL: the run's own database (connection string), for workers
  std::string mysql_admin;  // MySQL: the given connection string, to drop that database with
  std::string mysql_drop;   // MySQL: that database, to drop afterwards
  std::string server_version = "sqlite (embedded)";
};

void open_store(const QueueOptions& o, OpenStore& out) {
  if (o.store == "sqlite") {
    std::string path = o.sqlite_path;
    if (path.empty()) {
      path = (std::filesystem::temp_directory_path() /
              ("backhaul-bench-" + std::to_string(::getpid()) + ".db"))
                 .string();
      out.path = path;
    }
    out.sqlite_path = path;
    for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(path + s);
    out.store = jobs::open_sqlite_store(path);
  } else if (o.store == "mysql") {
    if (o.mysql.empty()) throw std::runtime_error("--mysql CONNECTION is required for mysql");
    // A database of its own per run, dropped afterwards, as each peer measurement starts from an
    // empty server: earlier runs' jobs would slow this one (counts() reads every job, for one).
    // Named after the given database, so that a grant on "<db>_%" covers it.
    jobs::mysql::Config server = jobs::mysql::parse_config(o.mysql);
    const std::string db = server.db + "_bench_" + std::to_string(::getpid());
    jobs::mysql::Connection admin(server);
    const jobs::mysql::Result version = admin.one("SELECT VERSION()");
    if (!version.rows.empty() && version.rows[0][0]) out.server_version = *version.rows[0][0];
    try {
      admin.one("CREATE DATABASE `" + db + "` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci");
    } catch (const std::exception& e) {
      throw std::runtime_error("cannot create the run's database " + db +
                               " (the user needs "
                               "CREATE and DROP on it): " +
                               e.what());
    }
    out.mysql_admin = o.mysql;
    out.mysql_drop = db;
    out.mysql = jobs::mysql::with_database(o.mysql, db);
    out.store = jobs::open_mysql_store(out.mysql, static_cast<size_t>(o.concurrency) + 4);
  } else {
    throw std::runtime_error("--store sqlite|mysql");
  }
}

// A worker process opens the store the parent filled (and never removes it).
void open_store_existing(const QueueOptions& o, OpenStore& out) {
  if (o.store == "sqlite") {
    out.store = jobs::open_sqlite_store(o.sqlite_path);
  } else {
    out.store = jobs::open_mysql_store(o.mysql, static_cast<size_t>(o.concurrency) + 4);
  }
}

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  size_t index = static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

// Enqueue -> handler start on an idle queue, one job at a time.
void run_latency(const QueueOptions& o) {
  const int n = o.jobs > 0 ? o.jobs : 2000;
  OpenStore opened;
  open_store(o, opened);
  jobs::JobStore& store = *opened.store;
  SystemClock clock;
  const std::string kind =
      "bench-latency-" + std::to_string(o.rep) + "-" + std::to_string(clock.now_ms());
  std::mutex mutex;
  std::condition_variable started_cv;
  Steady::time_point started;
  int runs = 0;
  jobs::SchedulerOptions so;  // default idle poll (200 ms) and claim batch
  so.owner = "bench-" + std::to_string(::getpid());
  so.workers = o.concurrency;
  jobs::Scheduler scheduler(store, clock, so);
  scheduler.register_handler(kind, [&](jobs::JobContext&) {
    {
      std::lock_guard lock(mutex);
      started = Steady::now();
      ++runs;
    }
    started_cv.notify_all();
    return jobs::Outcome::complete();
  });
  scheduler.start();
  std::vector<double> ms;
  ms.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    // Let the previous job's ending commit and the claim loop find the queue empty and sleep.
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    const Steady::time_point before = Steady::now();
    store.enqueue({kind, payload(i), "bench", std::nullopt, 0, 1, 0, {}, 0}, clock.now_ms());
    std::unique_lock lock(mutex);
    if (!started_cv.wait_for(lock, std::chrono::seconds(10), [&] { return runs == i + 1; })) {
      throw std::runtime_error("job " + std::to_string(i) + " did not start within 10 s");
    }
    ms.push_back(std::chrono::duration<double, std::milli>(started - before).count());
  }
  scheduler.drain(std::chrono::milliseconds(1000));
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  nlohmann::json line = {{"peer", "backhaul"},
                         {"workload", "latency"},
                         {"n", n},
                         {"p50_ms", percentile(ms, 0.50)},
                         {"p99_ms", percentile(ms, 0.99)},
                         {"max_ms", percentile(ms, 1.0)},
                         {"client_rss_kb", self.ru_maxrss},
                         {"idle_poll_ms", so.idle_poll_ms},
                         {"rep", o.rep},
                         {"config", o.store}};
  std::cout << line.dump() << std::endl;
  opened.close();
}

jobs::SchedulerOptions throughput_options(const QueueOptions& o) {
  jobs::SchedulerOptions so;
  so.owner = "bench-" + std::to_string(::getpid());
  so.workers = o.concurrency;
  so.claim_batch = static_cast<size_t>(o.claim_batch > 0 ? o.claim_batch : o.concurrency);
  so.prefetch = o.prefetch;
  so.claimers = o.claimers;
  // The claim loop sleeps this long after a claim that found nothing when no in-process wakeup
  // came (a job's end, a retry or an enqueue through this store object wakes it; a cap freed by
  // an ending's commit, or rows another worker process holds, do not). The daemon's 200 ms would
  // make such gaps, not the queue,
  // the figure of a 20 000-job run. Recorded in the line's settings (docs/benchmarks.md).
  so.idle_poll_ms = 5;
  so.retry = {0, 2.0, 0};  // immediate retry, like the peers' smallest backoff
  return so;
}

// SIGTERM, the parent's "stop" to its worker processes.
sigset_t sigterm_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  return set;
}

// One of --processes' workers: runs the kind's W1 handler until SIGTERM, then prints its handler
// calls, the steady-clock time of its first call (CLOCK_MONOTONIC, the same in every process)
// and its CPU seconds and peak RSS.
void run_worker(const QueueOptions& o) {
  // SIGTERM arrives blocked (the parent blocks it before the fork; exec keeps the mask), so one
  // sent before this worker waits for it stays pending rather than killing it. Blocked here too,
  // before any thread starts (threads inherit the mask), for a worker started some other way.
  const sigset_t term = sigterm_set();
  ::pthread_sigmask(SIG_BLOCK, &term, nullptr);
  OpenStore opened;
  open_store_existing(o, opened);
  SystemClock clock;
  std::optional<SharedCounter> shared;
  if (o.calls_fd >= 0) shared.emplace(o.calls_fd);
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> first_ns{0};
  jobs::Scheduler scheduler(*opened.store, clock, throughput_options(o));
  scheduler.register_handler(o.worker_of, [&](jobs::JobContext&) {
    int64_t zero = 0;
    if (calls++ == 0) {
      first_ns.compare_exchange_strong(zero, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                 Steady::now().time_since_epoch())
                                                 .count());
    }
    if (shared) shared->value().fetch_add(1, std::memory_order_relaxed);
    return jobs::Outcome::complete();
  });
  scheduler.start();
  int received = 0;
  ::sigwait(&term, &received);
  scheduler.drain(std::chrono::milliseconds(1000));
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  std::cout << nlohmann::json{{"calls", calls.load()},
                              {"first_ns", first_ns.load()},
                              {"cpu_s", cpu_seconds(self)},
                              {"rss_kb", self.ru_maxrss}}
                   .dump()
            << std::endl;
}

// The worker processes of a --processes run. However the run ends (a thrown error included), every
// worker is stopped and reaped when the set goes, before the store does: none is left claiming
// from it, and none outlives the run.
class Workers {
 public:
  Workers() = default;
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() {
    for (Worker& w : workers_) {
      if (w.out >= 0) ::close(w.out);
      if (w.reaped) continue;
      ::kill(w.pid, SIGTERM);
      // SIGTERM drains the worker (up to a second); one that will not end is killed.
      for (int i = 0; i < 500 && !w.reaped; ++i) {
        w.reaped = ::waitpid(w.pid, &w.status, WNOHANG) == w.pid;
        if (!w.reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!w.reaped) {
        ::kill(w.pid, SIGKILL);
        ::waitpid(w.pid, &w.status, 0);
      }
    }
  }

  bool empty() const { return workers_.empty(); }

  void spawn(const QueueOptions& o, const OpenStore& opened, const std::string& kind,
             const SharedCounter& calls) {
    std::vector<std::string> args = {"backhaul-bench", "queue",
                                     "--worker-of",    kind,
                                     "--calls-fd",     std::to_string(calls.fd()),
                                     "--store",        o.store,
                                     "--concurrency",  std::to_string(o.concurrency),
                                     "--prefetch",     std::to_string(o.prefetch),
                                     "--claimers",     std::to_string(o.claimers)};
    if (o.claim_batch > 0) {
      args.insert(args.end(), {"--claim-batch", std::to_string(o.claim_batch)});
    }
    if (o.store == "mysql") args.insert(args.end(), {"--mysql", opened.mysql});
    if (o.store == "sqlite") args.insert(args.end(), {"--sqlite-path", opened.sqlite_path});
    // Built before the fork: the child of a threaded process may only make async-signal-safe calls.
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int fds[2];
    // CLOEXEC: later workers do not inherit this one's pipe (dup2 clears it on the child's stdout).
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    const sigset_t term = sigterm_set();
    sigset_t before;
    ::pthread_sigmask(SIG_BLOCK, &term, &before);  // the child starts with SIGTERM blocked
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Should this program be killed (no destructor of its runs), its workers get SIGTERM and
      // end, rather than claim from the run's store for ever. (Checked once set: a parent that
      // died before it has no one left to tell.)
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) std::_Exit(127);
      ::dup2(fds[1], STDOUT_FILENO);
      ::execv("/proc/self/exe", argv.data());
      std::_Exit(127);
    }
    ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
    ::close(fds[1]);
    if (pid < 0) {
      ::close(fds[0]);
      throw std::runtime_error("fork failed");
    }
    workers_.push_back({pid, fds[0]});
  }

  // Throws when a worker has ended before it was told to: the run would otherwise wait for handler
  // calls that will never come.
  void check_running() {
    for (Worker& w : workers_) {
      if (!w.reaped && ::waitpid(w.pid, &w.status, WNOHANG) == w.pid) {
        w.reaped = true;
        throw std::runtime_error("worker process " + std::to_string(w.pid) + " ended early (" +
                                 describe(w.status) + ")");
      }
    }
  }

  // Stops every worker and returns their reports. Every worker is told to stop before any is
  // waited for, so they drain at once; the first failure throws (the destructor reaps the rest).
  std::vector<nlohmann::json> finish() {
    for (Worker& w : workers_) ::kill(w.pid, SIGTERM);
    std::vector<nlohmann::json> reports;
    for (Worker& w : workers_) {
      std::string text;
      char buffer[4096];
      ssize_t n;
      while ((n = ::read(w.out, buffer, sizeof buffer)) > 0) {
        text.append(buffer, static_cast<size_t>(n));
      }
      ::close(w.out);
      w.out = -1;
      ::waitpid(w.pid, &w.status, 0);
      w.reaped = true;
      if (!WIFEXITED(w.status) || WEXITSTATUS(w.status) != 0 || text.empty()) {
        throw std::runtime_error("worker process " + std::to_string(w.pid) + " failed (" +
                                 describe(w.status) + ")");
      }
      reports.push_back(nlohmann::json::parse(text));
    }
    return reports;
  }

 private:
  struct Worker {
    pid_t pid = -1;
    int out = -1;  // read end of its stdout
    bool reaped = false;
    int status = 0;
  };

  static std::string describe(int status) {
    if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
    return "status " + std::to_string(status);
  }

  std::vector<Worker> workers_;
};

// The final state and handler calls of `n` jobs, counted as the peers' w2Expected()
// (shared/bench/peers/common/payload.mjs) counts them, so that any n (not only multiples of 100)
// is checked exactly.
struct Expected {
  int64_t completed = 0;
  int64_t dead = 0;
  int64_t handler_calls = 0;
};

Expected expected_outcome(bool w2, int n) {
  if (!w2) return {n, 0, n};
  int64_t dead = 0, retried = 0;
  for (int i = 0; i < n; ++i) {
    if (i % 100 == 1) {
      ++dead;
    } else if (i % 5 == 0) {
      ++retried;
    }
  }
  return {n - dead, dead, n + retried + dead * 2};
}

// Options the chosen run cannot use are refused, naming them: a line must not record settings the
// run never had.
void refuse_inapplicable(const QueueOptions& o) {
  auto refuse = [&o](std::initializer_list<const char*> flags, const std::string& why) {
    for (const char* flag : flags) {
      if (o.given.count(flag) > 0) throw std::runtime_error(std::string(flag) + " " + why);
    }
  };
  if (o.workload == "latency") {
    refuse({"--processes", "--keys", "--per-key-cap", "--global-cap", "--claim-batch", "--prefetch",
            "--claimers"},
           "does not apply to --workload latency (one job at a time, default claim settings, "
           "one process)");
  }
  if (o.claimers > o.concurrency + o.prefetch) {
    throw std::runtime_error("--claimers " + std::to_string(o.claimers) +
                             " is more than --concurrency + --prefetch (" +
                             std::to_string(o.concurrency + o.prefetch) +
                             "): a claim loop with no place to fill would never claim");
  }
  if (o.store == "sqlite") refuse({"--mysql"}, "is for --store mysql");
  if (o.store == "mysql") refuse({"--sqlite-path"}, "is for --store sqlite");
}

void run(const QueueOptions& o) {
  if (!o.worker_of.empty()) return run_worker(o);
  if (o.server_pid > 0 && (o.store != "mysql" || o.workload == "latency")) {
    throw std::runtime_error("--server-pid is for --store mysql, workloads lifecycle and retries");
  }
  refuse_inapplicable(o);
  if (o.workload == "latency") return run_latency(o);
  if (o.given.count("--processes") > 0 && o.workload != "lifecycle") {
    throw std::runtime_error("--processes is for the lifecycle workload");
  }
  const bool w2 = o.workload == "retries";
  if (!w2 && o.workload != "lifecycle") {
    throw std::runtime_error("--workload lifecycle|retries|latency");
  }
  const int n = o.jobs > 0 ? o.jobs : (w2 ? 5000 : 20000);
  const Expected want = expected_outcome(w2, n);

  const double server_cpu_start = o.server_pid > 0 ? proc_cpu_s(o.server_pid) : 0.0;
  OpenStore opened;
  open_store(o, opened);
  std::unique_ptr<jobs::JobStore>& store = opened.store;
  SystemClock clock;
  const std::string kind =
      "bench-" + o.workload + "-" + std::to_string(o.rep) + "-" + std::to_string(clock.now_ms());
  if (o.per_key_cap > 0 || o.global_cap > 0) store->set_caps(kind, {o.per_key_cap, o.global_cap});
  std::vector<std::atomic<int>> attempts(static_cast<size_t>(n));
  std::atomic<int64_t> handler_calls{0};
  std::atomic<bool> first_seen{false};
  Steady::time_point t_first;
  std::mutex first_mutex;

  const jobs::SchedulerOptions so = throughput_options(o);
  jobs::Scheduler scheduler(*store, clock, so);
  scheduler.register_handler(kind, [&](jobs::JobContext& c) {
    if (!first_seen.exchange(true)) {
      std::lock_guard lock(first_mutex);
      t_first = Steady::now();
    }
    ++handler_calls;
    int i = payload_index(c.job().payload);
    int attempt = ++attempts[static_cast<size_t>(i)];
    if (w2 && (i % 100 == 1 || (i % 5 == 0 && attempt == 1))) {
      throw jobs::JobFailure("bench failure of job " + std::to_string(i));
    }
    return jobs::Outcome::complete();
  });

  // Enqueue in batches of 1000, each awaited before the next.
  auto t0 = Steady::now();
  for (int start = 0; start < n; start += 1000) {
    std::vector<jobs::JobSpec> batch;
    for (int i = start; i < std::min(n, start + 1000); ++i) {
      const std::string key = o.keys > 1 ? "bench-" + std::to_string(i % o.keys) : "bench";
      batch.push_back({kind, payload(i), key, std::nullopt, 0, w2 ? 3 : 1, 0, {}, 0});
    }
    store->enqueue_batch(batch, clock.now_ms());
  }
  auto t_enq = Steady::now();

  // Declared after the store and the scheduler, so destroyed before them: on any error the
  // workers are stopped and reaped before the store goes.
  Workers workers;
  std::optional<SharedCounter> worker_calls;
  // Before the worker starts, as the peers take tWorkerStart before they create theirs: the
  // start-up is part of worker_start_to_first_claim_s, which is then never negative.
  const auto t_start = Steady::now();
  if (o.processes > 1) {
    worker_calls.emplace(SharedCounter::create());
    for (int p = 0; p < o.processes; ++p) workers.spawn(o, opened, kind, *worker_calls);
  } else {
    scheduler.start();
  }
  int64_t done = 0, dead = 0;
  // As the peers' harness does: once the handler has returned for every job, poll the store's
  // own state every 20 ms; tEnd is the first poll that shows the final state (the check too).
  // Waiting for the handlers is a counter in memory (shared with the worker processes, if any),
  // so it costs the store nothing.
  auto calls_so_far = [&] {
    return worker_calls ? worker_calls->value().load(std::memory_order_relaxed)
                        : handler_calls.load();
  };
  for (int64_t spins = 0; calls_so_far() < want.handler_calls && seconds(t0, Steady::now()) < 600;
       ++spins) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (spins % 100 == 0) workers.check_running();  // a worker that died would never count
  }
  for (;;) {
    auto counts = store->counts();
    done = counts[{kind, JobStatus::kSucceeded}];
    dead = counts[{kind, JobStatus::kDead}];
    if (done + dead >= n) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (seconds(t0, Steady::now()) > 600) break;
  }
  auto t_end = Steady::now();
  nlohmann::json server_cpu_s = nullptr;
  nlohmann::json server_rss_kb = nullptr;
  nlohmann::json server_mem = nullptr;
  if (o.server_pid > 0) {
    server_cpu_s = proc_cpu_s(o.server_pid) - server_cpu_start;
    // The server outlives the run, so its VmHWM is the peak since it started (earlier runs
    // included), not this run's as a fresh peer server's is: the run's figure is its resident
    // size now, at the end of the run; VmHWM is kept beside it.
    server_rss_kb = proc_status_kb(o.server_pid, "VmRSS");
    server_mem = {{"rss_at_end_kb", server_rss_kb},
                  {"root_hwm_kb", proc_status_kb(o.server_pid, "VmHWM")}};
  }
  scheduler.drain(std::chrono::milliseconds(1000));

  double workers_cpu_s = 0;
  int64_t workers_rss_kb = 0, worker_max_rss_kb = 0;
  for (const nlohmann::json& report : workers.finish()) {
    handler_calls += report["calls"].get<int64_t>();
    workers_cpu_s += report["cpu_s"].get<double>();
    workers_rss_kb += report["rss_kb"].get<int64_t>();
    worker_max_rss_kb = std::max(worker_max_rss_kb, report["rss_kb"].get<int64_t>());
    const Steady::time_point first{std::chrono::nanoseconds(report["first_ns"].get<int64_t>())};
    if (report["calls"].get<int64_t>() > 0 && (!first_seen || first < t_first)) {
      t_first = first;
      first_seen = true;
    }
  }
  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  const bool ok =
      done == want.completed && dead == want.dead && handler_calls == want.handler_calls;
  double process_s = seconds(t_first, t_end);
  double e2e = seconds(t0, t_end);
  nlohmann::json line = {
      {"peer", "backhaul"},
      {"workload", w2 ? "W2" : "W1"},
      {"n", n},
      {"seconds", e2e},
      {"jobs_per_s", n / e2e},
      {"enqueue_s", seconds(t0, t_enq)},
      {"enqueue_jobs_per_s", n / seconds(t0, t_enq)},
      {"process_s", process_s},
      {"process_jobs_per_s", n / process_s},
      {"worker_start_to_first_claim_s", seconds(t_start, t_first)},
      // None for SQLite: it runs in this process.
      {"server_rss_kb", server_rss_kb},
      {"server_mem", server_mem},
      // The peers' client is one process, producer and worker together: with --processes, the
      // producer's peak plus each worker's (an upper bound of their peak together).
      {"client_rss_kb", self.ru_maxrss + workers_rss_kb},
      {"server_cpu_s", server_cpu_s},
      {"client_cpu_s", cpu_seconds(self) + workers_cpu_s},
      {"processes", o.processes},
      {"worker_rss_kb",
       workers.empty() ? nlohmann::json(nullptr) : nlohmann::json(worker_max_rss_kb)},
      {"ok", ok},
      {"completed", done},
      {"dead", dead},
      {"handler_calls", handler_calls.load()},
      {"expected_handler_calls", want.handler_calls},
      {"batch_enqueue", true},
      {"enqueue_api", "JobStore::enqueue_batch"},
      {"settings",
       {{"workers", o.concurrency},
        {"claim_batch", so.claim_batch},
        {"prefetch", so.prefetch},
        {"claimers", so.claimers},
        {"max_in_flight", o.concurrency + so.prefetch},
        {"idle_poll_ms", so.idle_poll_ms},
        {"keys", o.keys},
        {"per_key_cap", o.per_key_cap},
        {"global_cap", o.global_cap}}},
      {"version", {{"backhaul", BACKHAUL_VERSION}}},
      {"rep", o.rep},
      {"config", o.store},
      {"server_version", opened.server_version},
      {"durability", o.store == "sqlite" ? "synchronous=FULL" : "flush_log_at_trx_commit=1"}};
  std::cout << line.dump() << std::endl;
  opened.close();
  if (!ok) throw std::runtime_error("final state is wrong (see the JSON line)");
}

}  // namespace

void add_queue_bench(CLI::App& app) {
  auto o = std::make_shared<QueueOptions>();
  const auto positive = CLI::Range(1, std::numeric_limits<int>::max());
  const auto non_negative = CLI::Range(0, std::numeric_limits<int>::max());
  CLI::App* cmd = app.add_subcommand(
      "queue", "peer workloads W1 (lifecycle) and W2 (retries) of shared/bench on the job queue");
  cmd->add_option("--store", o->store, "sqlite | mysql")
      ->capture_default_str()
      ->check(CLI::IsMember({"sqlite", "mysql"}));
  cmd->add_option("--workload", o->workload, "lifecycle (W1) | retries (W2) | latency")
      ->capture_default_str()
      ->check(CLI::IsMember({"lifecycle", "retries", "latency"}));
  cmd->add_option("--jobs", o->jobs, "N (default: 20000 for W1, 5000 for W2, 2000 for latency)")
      ->check(positive);
  cmd->add_option("--concurrency", o->concurrency, "workers")
      ->capture_default_str()
      ->check(positive);
  cmd->add_option("--claim-batch", o->claim_batch, "jobs per claim (default: concurrency)")
      ->check(positive);
  cmd->add_option("--prefetch", o->prefetch, "jobs claimed ahead of free workers")
      ->capture_default_str()
      ->check(non_negative);
  cmd->add_option("--claimers", o->claimers,
                  "claim loops, each with one claim under way (at most concurrency + prefetch)")
      ->capture_default_str()
      ->check(positive);
  cmd->add_option("--sqlite-path", o->sqlite_path, "SQLite file (default: a temp file)");
  cmd->add_option("--mysql", o->mysql, "Poco-style MySQL connection string");
  cmd->add_option("--rep", o->rep, "repetition number recorded in the line")->check(positive);
  cmd->add_option("--keys", o->keys, "concurrency keys the jobs are spread over")
      ->capture_default_str()
      ->check(positive);
  cmd->add_option("--per-key-cap", o->per_key_cap, "exact cap per key (0 = none)")
      ->check(non_negative);
  cmd->add_option("--global-cap", o->global_cap, "exact cap for the kind (0 = none)")
      ->check(non_negative);
  cmd->add_option("--processes", o->processes, "worker processes sharing the store (W1)")
      ->capture_default_str()
      ->check(positive);
  cmd->add_option("--server-pid", o->server_pid,
                  "MySQL server's PID on this machine: its CPU over the run -> server_cpu_s, its "
                  "VmRSS at the end -> server_rss_kb")
      ->check(positive);
  cmd->add_option("--worker-of", o->worker_of, "internal: worker process for this job kind")
      ->group("");
  cmd->add_option("--calls-fd", o->calls_fd, "internal: the workers' shared call counter")
      ->group("");
  cmd->callback([o, cmd] {
    for (const CLI::Option* option : cmd->get_options()) {
      if (option->count() > 0) o->given.insert(option->get_name());
    }
    run(*o);
  });
}

}  // namespace backhaul::bench
