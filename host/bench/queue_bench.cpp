// `backhaul-bench queue`: the peer workloads of shared/bench/README.md §3 on Backhaul's own queue,
// printing one JSON line per run with the peers' result fields, so the figures sit beside
// pg-boss, graphile-worker, BullMQ and beanstalkd measured in the same sitting.
//
//   W1 lifecycle: N jobs (default 20000) enqueued in batches of 1000, then processed by a
//                 scheduler with C workers (default 8); every handler succeeds.
//   W2 retries:   N = 5000, max attempts 3, immediate retry; job i fails always when
//                 i % 100 == 1 (50 dead), and on its first attempt when i % 5 == 0 (1000 retried):
//                 4950 succeeded + 50 dead, 6100 handler calls.
// Every acknowledgement is durable (SQLite synchronous=FULL, InnoDB flush_log_at_trx_commit=1).
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/jobs/scheduler.h"
#include "host/bench/bench.h"
#include <sys/resource.h>

namespace backhaul::bench {
namespace {

using Steady = std::chrono::steady_clock;
using jobs::JobStatus;

struct QueueOptions {
  std::string store = "sqlite";
  std::string workload = "lifecycle";
  std::string sqlite_path;
  std::string mysql;
  int jobs = 0;  // 0 = the workload's N
  int concurrency = 8;
  int claim_batch = 0;  // 0 = concurrency
  int prefetch = 0;
  int rep = 1;
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

void run(const QueueOptions& o) {
  const bool w2 = o.workload == "retries";
  if (!w2 && o.workload != "lifecycle") throw std::runtime_error("--workload lifecycle|retries");
  const int n = o.jobs > 0 ? o.jobs : (w2 ? 5000 : 20000);

  std::unique_ptr<jobs::JobStore> store;
  std::string path = o.sqlite_path;
  if (o.store == "sqlite") {
    if (path.empty()) {
      path = (std::filesystem::temp_directory_path() /
              ("backhaul-bench-" + std::to_string(::getpid()) + ".db"))
                 .string();
    }
    for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(path + s);
    store = jobs::open_sqlite_store(path);
  } else if (o.store == "mysql") {
    if (o.mysql.empty()) throw std::runtime_error("--mysql CONNECTION is required for mysql");
    store = jobs::open_mysql_store(o.mysql, static_cast<size_t>(o.concurrency) + 4);
  } else {
    throw std::runtime_error("--store sqlite|mysql");
  }

  SystemClock clock;
  const std::string kind =
      "bench-" + o.workload + "-" + std::to_string(o.rep) + "-" + std::to_string(clock.now_ms());
  std::vector<std::atomic<int>> attempts(static_cast<size_t>(n));
  std::atomic<int64_t> handler_calls{0};
  std::atomic<bool> first_seen{false};
  Steady::time_point t_first;
  std::mutex first_mutex;

  jobs::SchedulerOptions so;
  so.owner = "bench-" + std::to_string(::getpid());
  so.workers = o.concurrency;
  so.claim_batch = static_cast<size_t>(o.claim_batch > 0 ? o.claim_batch : o.concurrency);
  so.prefetch = o.prefetch;
  so.idle_poll_ms = 5;
  so.retry = {0, 2.0, 0};  // immediate retry, like the peers' smallest backoff
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
      batch.push_back({kind, payload(i), "bench", std::nullopt, 0, w2 ? 3 : 1, 0, {}, 0});
    }
    store->enqueue_batch(batch, clock.now_ms());
  }
  auto t_enq = Steady::now();

  scheduler.start();
  auto t_start = Steady::now();
  const int64_t want_done = w2 ? n - n / 100 : n;
  const int64_t want_dead = w2 ? n / 100 : 0;
  int64_t done = 0, dead = 0;
  // As the peers' harness does: once the handler has returned for every job, poll the store's
  // own state every 20 ms; tEnd is the first poll that shows the final state (the check too).
  // Waiting for the handlers is an in-process counter, so it costs the workers nothing.
  const int64_t expected_calls = w2 ? n + n / 5 + 2 * (n / 100) : n;
  while (handler_calls.load() < expected_calls && seconds(t0, Steady::now()) < 600)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  for (;;) {
    auto counts = store->counts();
    done = counts[{kind, JobStatus::kSucceeded}];
    dead = counts[{kind, JobStatus::kDead}];
    if (done + dead >= n) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (seconds(t0, Steady::now()) > 600) break;
  }
  auto t_end = Steady::now();
  scheduler.drain(std::chrono::milliseconds(1000));

  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  const bool ok = done == want_done && dead == want_dead && handler_calls == expected_calls;
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
      {"server_rss_kb", nullptr},  // embedded (SQLite) or measured separately (MariaDB)
      {"client_rss_kb", self.ru_maxrss},
      {"server_cpu_s", nullptr},
      {"client_cpu_s", cpu_seconds(self)},
      {"ok", ok},
      {"completed", done},
      {"dead", dead},
      {"handler_calls", handler_calls.load()},
      {"expected_handler_calls", expected_calls},
      {"batch_enqueue", true},
      {"enqueue_api", "JobStore::enqueue_batch"},
      {"settings",
       {{"workers", o.concurrency}, {"claim_batch", so.claim_batch}, {"prefetch", so.prefetch}}},
      {"version", "backhaul"},
      {"rep", o.rep},
      {"config", o.store},
      {"server_version", o.store == "sqlite" ? "sqlite (embedded)" : "mariadb"},
      {"durability", o.store == "sqlite" ? "synchronous=FULL" : "flush_log_at_trx_commit=1"}};
  std::cout << line.dump() << std::endl;
  store.reset();
  if (o.store == "sqlite" && o.sqlite_path.empty()) {
    for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(path + s);
  }
  if (!ok) throw std::runtime_error("final state is wrong (see the JSON line)");
}

}  // namespace

void add_queue_bench(CLI::App& app) {
  auto o = std::make_shared<QueueOptions>();
  CLI::App* cmd = app.add_subcommand(
      "queue", "peer workloads W1 (lifecycle) and W2 (retries) of shared/bench on the job queue");
  cmd->add_option("--store", o->store, "sqlite | mysql")->capture_default_str();
  cmd->add_option("--workload", o->workload, "lifecycle (W1) | retries (W2)")
      ->capture_default_str();
  cmd->add_option("--jobs", o->jobs, "N (default: 20000 for W1, 5000 for W2)");
  cmd->add_option("--concurrency", o->concurrency, "workers")->capture_default_str();
  cmd->add_option("--claim-batch", o->claim_batch, "jobs per claim (default: concurrency)");
  cmd->add_option("--prefetch", o->prefetch, "jobs claimed ahead of free workers")
      ->capture_default_str();
  cmd->add_option("--sqlite-path", o->sqlite_path, "SQLite file (default: a temp file)");
  cmd->add_option("--mysql", o->mysql, "Poco-style MySQL connection string");
  cmd->add_option("--rep", o->rep, "repetition number recorded in the line");
  cmd->callback([o] { run(*o); });
}

}  // namespace backhaul::bench
