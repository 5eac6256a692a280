// The backfill pipeline end to end in one process: the real connector plugins (dlopen), a real
// SQLite store, the scheduler, and the sandbox's fake GitHub, Vercel and gateway over loopback
// HTTP. Time is a FakeClock shared by the sandbox (rate-limit windows), the plugins and the queue,
// so waits for rate limits, throttles and retries are crossed by moving the clock, never by
// sleeping. Seed 000's integration tests 1-6 are here, plus resume, rate limit, throttle and E1's
// edges.
#include "core/pipeline/pipeline.h"

#include <atomic>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/clock.h"
#include "core/gateway/gateway_client.h"
#include "core/http/poco_transport.h"
#include "core/jobs/job_store.h"
#include "core/jobs/scheduler.h"
#include "core/plugins/isolation.h"
#include "core/plugins/plugin_loader.h"
#include "host/sandbox/sandbox.h"
#include "tests/core/jobs/forwarding_store.h"

namespace backhaul::pipeline {
namespace {

namespace fs = std::filesystem;
using jobs::JobStatus;
using json = nlohmann::json;
using ::testing::HasSubstr;

constexpr int64_t kStart = 1'767'225'600'000;  // 2026-01-01T00:00:00Z

// The plugins' HTTP service: real HTTP, with a hook that may answer a request instead (a fault
// on the Nth request, a 404 for one repository) or watch it (cancel mid-run).
class HookTransport final : public http::Transport {
 public:
  using Hook = std::function<std::optional<http::Response>(const http::Request&, size_t n)>;

  http::Response perform(const http::Request& request) override {
    Hook hook;
    size_t n = 0;
    {
      std::lock_guard lock(mutex_);
      n = ++count_;
      urls_.push_back(request.url);
      hook = hook_;
    }
    if (hook) {
      if (std::optional<http::Response> answer = hook(request, n)) return *answer;
    }
    return inner_.perform(request);
  }
  void reset(Hook hook = nullptr) {
    std::lock_guard lock(mutex_);
    hook_ = std::move(hook);
    count_ = 0;
    urls_.clear();
  }
  std::vector<std::string> urls() const {
    std::lock_guard lock(mutex_);
    return urls_;
  }

 private:
  http::PocoTransport inner_;
  mutable std::mutex mutex_;
  Hook hook_;
  size_t count_ = 0;
  std::vector<std::string> urls_;
};

http::Response status_response(int status, std::string body) {
  http::Response r;
  r.status = status;
  r.headers.emplace_back("content-type", "application/json");
  r.body = std::move(body);
  return r;
}

// A provider's 429 asking to wait `retry_after` seconds.
http::Response rate_limited(const std::string& retry_after,
                            std::string body = R"({"message":"slow down"})") {
  http::Response r = status_response(429, std::move(body));
  r.headers.emplace_back("retry-after", retry_after);
  return r;
}

// A circuit record opened at `opened_ms` by 3 failures, whose probe may go from `retry_at_ms`.
jobs::CircuitRecord open_circuit(int64_t opened_ms, int64_t retry_at_ms) {
  jobs::CircuitRecord open;
  open.state = "open";
  open.failures = 3;
  open.opened_ms = opened_ms;
  open.retry_at_ms = retry_at_ms;
  open.updated_ms = opened_ms;
  return open;
}

// A sandbox data set: `repos` GitHub repositories and `projects` Vercel projects per installation,
// `items` items per entity type per resource.
sandbox::SandboxOptions data(int repos, int projects, int64_t items, int installations = 1) {
  sandbox::SandboxOptions o;
  o.installations = installations;
  o.repos = repos;
  o.projects = projects;
  o.items = items;
  return o;
}

// Plugins are loaded once per process, bound to these services.
FakeClock& test_clock() {
  static FakeClock clock(kStart);
  return clock;
}
HookTransport& plugin_transport() {
  static HookTransport transport;
  return transport;
}
plugins::PluginRegistry& registry() {
  static plugins::PluginRegistry* r = [] {
    auto* reg =
        new plugins::PluginRegistry(plugins::HostServices{plugin_transport(), test_clock()});
    for (const char* path : {BACKHAUL_GITHUB_PLUGIN, BACKHAUL_VERCEL_PLUGIN}) {
      if (auto problem = reg->load_file(path))
        throw std::runtime_error("cannot load " + problem->path.string() + ": " + problem->reason);
    }
    return reg;
  }();
  return *r;
}

class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test_clock().set_ms(kStart);
    plugin_transport().reset();
    db_ = fs::temp_directory_path() /
          ("backhaul-pipeline-" + std::to_string(::getpid()) + "-" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".db");
    fs::remove(db_);
    store_ = jobs::open_sqlite_store(db_.string());
  }
  void TearDown() override {
    scheduler_.reset();
    pipeline_.reset();
    store_.reset();
    real_store_.reset();
    if (sandbox_) sandbox_->stop();
    plugin_transport().reset();
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(db_.string() + suffix);
  }

  // Test defaults: in-place retries of transient errors without real waiting.
  static PipelineOptions fast() {
    PipelineOptions o;
    o.transient_retry_ms = 0;
    return o;
  }

  void start(sandbox::SandboxOptions o = {}, PipelineOptions options = fast()) {
    o.now_ms = [] { return test_clock().now_ms(); };
    sandbox_ = std::make_unique<sandbox::Sandbox>(o);
    sandbox_->start();
    gateway_ = std::make_unique<gateway::GatewayClient>(
        gateway_transport_, sandbox_->base_url() + "/gateway", std::nullopt, test_clock());
    for (const char* id : {"github", "vercel"}) {
      json config = {{"base_url", sandbox_->base_url() + "/" + id}};
      connectors_.emplace(id, registry().find(id)->create(config.dump()));
    }
    pipeline_ = std::make_unique<Pipeline>(
        *store_, test_clock(), *gateway_,
        [this](const std::string& provider) -> const plugins::Connector* {
          auto it = connectors_.find(provider);
          return it == connectors_.end() ? nullptr : &it->second;
        },
        options);
    pipeline_->apply_caps();
    jobs::SchedulerOptions so;
    so.owner = "pipeline-test";
    so.unit_random = [] { return 0.5; };  // jitter factor 1.0
    scheduler_ = std::make_unique<jobs::Scheduler>(*store_, test_clock(), so);
    pipeline_->register_handlers(*scheduler_);
  }

  // Runs jobs one at a time until nothing is left to run. When only jobs due later remain, moves
  // the clock to the earliest of them. Returns the number of jobs run.
  int drive(int max_steps = 5000) {
    int ran = 0;
    for (int step = 0; step < max_steps; ++step) {
      if (scheduler_->run_once(1) == 1) {
        ++ran;
        continue;
      }
      jobs::JobQuery q;
      q.status = JobStatus::kQueued;
      q.limit = 1000;
      std::optional<int64_t> next;
      for (const jobs::Job& j : store_->list(q).jobs)
        next = std::min(next.value_or(j.run_after_ms), j.run_after_ms);
      if (!next || *next <= test_clock().now_ms()) return ran;
      test_clock().set_ms(*next);
    }
    ADD_FAILURE() << "drive(): still running after " << max_steps << " steps";
    return ran;
  }

  RunStart start_run(const std::string& connection, const std::string& provider,
                     std::vector<std::string> types = {}) {
    RunRequest r;
    r.installation_id = connection;
    r.provider = provider;
    r.depth_days = 30;
    r.entity_types = std::move(types);
    return pipeline_->start_run(r);
  }

  json run_result(jobs::JobId run) {
    std::optional<jobs::Job> job = store_->get(run);
    if (!job || !job->result) return json();
    return json::parse(*job->result);
  }

  std::vector<jobs::Job> units_of(jobs::JobId run) {
    jobs::JobQuery q;
    q.parent_id = run;
    q.limit = 500;
    return store_->list(q).jobs;
  }

  int64_t requests_to(std::string_view needle) {
    int64_t n = 0;
    for (const std::string& url : plugin_transport().urls())
      if (url.find(needle) != std::string::npos) ++n;
    return n;
  }

  jobs::Job unit_linking(std::function<std::string(const std::string&)> next_url);

  static plugins::IsolationOptions isolation() {
    plugins::IsolationOptions o;
    o.worker_path = BACKHAUL_PLUGIN_WORKER;
    o.max_workers = 2;
    o.log_level = "warn";
    return o;
  }

  // A run of gh-inst-1 (one repository) whose "github" connector is the fake test plugin with
  // `config`, in worker processes; the provider circuit opens after 3 failures.
  RunStart run_with_the_fake_plugin_isolated_as_github(const std::string& config) {
    static const plugins::Plugin fake =
        plugins::load_plugin(BACKHAUL_FAKE_PLUGIN, {plugin_transport(), test_clock()});
    PipelineOptions options = fast();
    options.provider_circuit = {3, 60'000};
    start(data(1, 0, 10), options);
    connectors_.erase("github");
    connectors_.emplace("github", fake.create_isolated(config, isolation()));
    return start_run("gh-inst-1", "github");
  }

  // A run of gh-inst-1 (`repositories` of them) whose "github" connector is the fake test plugin
  // with `config`, in process; the gateway hands out `token` when one is given.
  RunStart run_with_the_fake_plugin_as_github(const std::string& config, int repositories = 1,
                                              std::optional<std::string> token = std::nullopt) {
    static const plugins::Plugin fake =
        plugins::load_plugin(BACKHAUL_FAKE_PLUGIN, {plugin_transport(), test_clock()});
    start(data(repositories, 0, 10));
    connectors_.erase("github");
    connectors_.emplace("github", fake.create(config));
    if (token) {
      gateway_transport_.reset(
          [token = *token](const http::Request& request, size_t) -> std::optional<http::Response> {
            if (request.url.find("/token") == std::string::npos) return std::nullopt;
            return status_response(
                200, json{{"accessToken", token}, {"expiresAt", "2099-01-01T00:00:00Z"}}.dump());
          });
    }
    return start_run("gh-inst-1", "github");
  }

  // With `options`, both circuits opening after 3 failures for 60 s: a run of gh-inst-1's `types`
  // (150 items each, one repository) that has fanned out.
  // A scheduler of `workers` threads of its own (not started) running the pipeline's jobs.
  std::unique_ptr<jobs::Scheduler> threaded_scheduler(const std::string& owner, int workers) {
    jobs::SchedulerOptions so;
    so.owner = owner;
    so.workers = workers;
    so.idle_poll_ms = 5;
    auto scheduler = std::make_unique<jobs::Scheduler>(*store_, test_clock(), so);
    pipeline_->register_handlers(*scheduler);
    return scheduler;
  }

  RunStart fanned_out(std::vector<std::string> types = {"issue"},
                      PipelineOptions options = fast()) {
    options.provider_circuit = {3, 60'000};
    options.gateway_circuit = {3, 60'000};
    start(data(1, 0, 150), options);
    RunStart run = start_run("gh-inst-1", "github", std::move(types));
    EXPECT_EQ(scheduler_->run_once(1), 1u);  // fan-out
    return run;
  }

  // `name`'s circuit opened a period (60 s) ago and its probe is due; the clock moves past this
  // host's cached view of it. Returns the time the probe became due.
  int64_t probe_due(const std::string& name, int64_t period_ms = 60'000) {
    test_clock().set_ms(test_clock().now_ms() + 5'000);
    const int64_t now = test_clock().now_ms();
    store_->update_circuit(
        name, [&](const jobs::CircuitRecord&) { return open_circuit(now - period_ms, now); });
    return now;
  }
  // The provider answers the first fetch 502 (retried in place), and meanwhile the gateway's
  // circuit opened a period ago: its probe is due, and this host's view of it is stale.
  void open_the_gateway_circuit_at_the_first_fetch() {
    const int64_t now = test_clock().now_ms();
    plugin_transport().reset([this, now](const http::Request&,
                                         size_t n) -> std::optional<http::Response> {
      if (n != 1) return std::nullopt;
      store_->update_circuit(
          "gateway", [&](const jobs::CircuitRecord&) { return open_circuit(now - 60'000, now); });
      test_clock().set_ms(now + 5'000);
      return status_response(502, "{}");
    });
  }
  jobs::CircuitRecord circuit(const std::string& name) {
    return store_->update_circuit(name, [](const jobs::CircuitRecord& r) { return r; });
  }

  fs::path db_;
  std::unique_ptr<jobs::JobStore> store_;
  std::unique_ptr<jobs::JobStore> real_store_;  // under store_, when a test wraps it
  std::unique_ptr<sandbox::Sandbox> sandbox_;
  HookTransport gateway_transport_;  // the gateway's HTTP, with a hook like the plugins'
  std::unique_ptr<gateway::GatewayClient> gateway_;
  std::map<std::string, plugins::Connector> connectors_;
  std::unique_ptr<Pipeline> pipeline_;
  std::unique_ptr<jobs::Scheduler> scheduler_;
};

// Seed 000 tests 1 and 3: 3 repositories x 3 entity types = 9 units, every event delivered once,
// the run's totals the real sum of its units.
TEST_F(PipelineTest, GithubRunFansOutNineUnitsAndDeliversEveryEventOnce) {
  start(data(3, 1, 250));
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_TRUE(run.created);
  drive();

  std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 9u);
  std::set<std::pair<std::string, std::string>> seen;
  for (const jobs::Job& u : units) {
    EXPECT_EQ(u.status, JobStatus::kSucceeded) << u.payload;
    EXPECT_EQ(u.kind, kEntityKind);
    EXPECT_EQ(u.concurrency_key, "gh-inst-1");
    json p = json::parse(u.payload);
    seen.insert({p["resource"]["id"].get<std::string>(), p["entityType"].get<std::string>()});
    EXPECT_EQ(u.payload.find("token"), std::string::npos) << "no token in a payload";
  }
  EXPECT_EQ(seen.size(), 9u) << "every (resource, entity type) pair once";

  sandbox::Report report = sandbox_->report("inst-1");
  const sandbox::DeliveryCounts& gh = report.gateway_by_provider["github"];
  EXPECT_GT(gh.expected, 0);
  EXPECT_EQ(gh.missing, 0);
  EXPECT_EQ(gh.unexpected, 0);
  EXPECT_EQ(gh.duplicates, 0);

  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true);
  EXPECT_EQ(result["workUnits"], 9);
  EXPECT_EQ(result["completed"], 9);
  EXPECT_EQ(result["failed"], 0);
  EXPECT_EQ(result["eventsDispatched"].get<int64_t>(), gh.unique);
  int64_t sum = 0;
  for (const json& r : result["results"]) sum += r["eventsDispatched"].get<int64_t>();
  EXPECT_EQ(sum, gh.unique);

  std::optional<RunView> view = pipeline_->get_run(run.run_id);
  ASSERT_TRUE(view);
  EXPECT_EQ(view->status, "succeeded");
  EXPECT_EQ(view->units_total, 9);
  EXPECT_EQ(view->units_done, 9);
  EXPECT_EQ(view->units_failed, 0);
  EXPECT_EQ(view->events_dispatched, gh.unique);
  ASSERT_EQ(view->units.size(), 9u);
  for (size_t i = 1; i < view->units.size(); ++i) {  // in the order they were enqueued
    EXPECT_LT(view->units[i - 1].job_id, view->units[i].job_id) << "unit " << i;
  }
  EXPECT_GT(pipeline_->metrics().pages, 0);
}

// SPEC B4: the GitHub connector in worker processes (their own HTTP to the sandbox) delivers
// every event once, as it does in this process.
TEST_F(PipelineTest, AGithubRunWithTheConnectorInWorkerProcessesDeliversEveryEventOnce) {
  start(data(2, 0, 120));
  json config = {{"base_url", sandbox_->base_url() + "/github"}};
  connectors_.erase("github");
  connectors_.emplace("github",
                      registry().find("github")->create_isolated(config.dump(), isolation()));
  RunStart run = start_run("gh-inst-1", "github");
  drive();

  const sandbox::DeliveryCounts gh = sandbox_->report("inst-1").gateway_by_provider["github"];
  EXPECT_GT(gh.expected, 0);
  EXPECT_EQ(gh.missing, 0);
  EXPECT_EQ(gh.unexpected, 0);
  EXPECT_EQ(gh.duplicates, 0);
  std::optional<RunView> view = pipeline_->get_run(run.run_id);
  ASSERT_TRUE(view);
  EXPECT_EQ(view->status, "succeeded");
  EXPECT_EQ(view->units_done, 6);
  EXPECT_EQ(view->events_dispatched, gh.unique);
}

// SPEC B4: a plugin that aborts in fetch_page ends its worker, not this process. Each crash is an
// attempt of the unit; when they run out the unit is a dead letter that says how the worker died.
TEST_F(PipelineTest, APluginThatCrashesInAWorkerCostsAttemptsAndEndsInADeadLetter) {
  const RunStart run = run_with_the_fake_plugin_isolated_as_github(R"({"crash_on_page": 1})");
  drive();

  std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].status, JobStatus::kDead);
  EXPECT_GT(units[0].max_attempts, 1);
  EXPECT_EQ(units[0].attempts, units[0].max_attempts) << "every crash was an attempt";
  ASSERT_TRUE(units[0].last_error);
  EXPECT_THAT(*units[0].last_error, HasSubstr("ended during fetch_page: it was killed by SIGABRT"));
  const jobs::DeadLetterPage letters = store_->list_dead_letters({});
  ASSERT_EQ(letters.items.size(), 1u);
  EXPECT_EQ(letters.items[0].job_id, units[0].id);
  EXPECT_EQ(pipeline_->get_run(run.run_id)->status, "failed");
  // A crash is the plugin's, not the provider's: no retry in place, no failure on its circuit
  // (which, open, would defer every installation's units).
  EXPECT_EQ(pipeline_->metrics().transient_retries, 0);
  EXPECT_EQ(pipeline_->metrics().plugin_calls, units[0].max_attempts);
  EXPECT_EQ(circuit("provider:fake").failures, 0);
  EXPECT_EQ(circuit("provider:fake").state, "closed");
}

// The same for the run's scope check: each crash is an attempt of the run, which ends dead with
// how the worker died, and the provider's circuit has seen no failure.
TEST_F(PipelineTest, APluginThatCrashesInItsScopeCheckCostsTheRunsAttempts) {
  const RunStart run = run_with_the_fake_plugin_isolated_as_github(R"({"scopes": "abort"})");
  drive();

  const std::optional<jobs::Job> job = store_->get(run.run_id);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->status, JobStatus::kDead);
  EXPECT_GT(job->max_attempts, 1);
  EXPECT_EQ(job->attempts, job->max_attempts);
  ASSERT_TRUE(job->last_error);
  EXPECT_THAT(*job->last_error,
              HasSubstr("ended during validate_scopes: it was killed by SIGABRT"));
  EXPECT_TRUE(units_of(run.run_id).empty());
  EXPECT_EQ(circuit("provider:github").failures, 0);
  EXPECT_EQ(circuit("provider:github").state, "closed");
}

// D4: a run's scope check that the provider rate-limits is a wait (a run-after from its
// Retry-After), not an attempt, as a page's rate limit is: more of them in a row than the run has
// attempts do not make it a dead letter.
TEST_F(PipelineTest, ARateLimitedScopeCheckWaitsWithoutCostingTheRunAnAttempt) {
  start(data(1, 0, 50));
  const RunStart run = start_run("gh-inst-1", "github", {"issue"});
  const int limited = fast().run_max_attempts + 1;  // one more than its attempts
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (static_cast<int>(n) > limited) return std::nullopt;  // the first requests: scope checks
    return rate_limited("30");
  });
  for (int i = 0; i < limited; ++i) {
    const int64_t now = test_clock().now_ms();
    ASSERT_EQ(scheduler_->run_once(1), 1u);
    const std::optional<jobs::Job> job = store_->get(run.run_id);
    ASSERT_TRUE(job);
    EXPECT_EQ(job->status, JobStatus::kQueued) << i;
    EXPECT_EQ(job->attempts, 0) << i << ": " << job->last_error.value_or("-");
    EXPECT_EQ(job->run_after_ms, now + 30'000) << i;
    test_clock().set_ms(job->run_after_ms);
  }
  EXPECT_EQ(pipeline_->metrics().rate_limit_waits, limited);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true) << run_result(run.run_id).dump();
  EXPECT_EQ(store_->get(run.run_id)->status, JobStatus::kSucceeded);
}

// A rate limit whose wait the plugin could not tell (a 429 with "retry-after: 0" and no reset:
// vercel passed it on as 0, which status.h calls unknown; it now waits its own default minute)
// waits a minute. It waited a second: a retry a second,
// without end, into a limit still in force, none of them an attempt.
TEST_F(PipelineTest, ARateLimitOfUnknownLengthWaitsAMinute) {
  start(data(0, 1, 20));
  const RunStart run = start_run("vc-inst-1", "vercel");
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n != 1) return std::nullopt;  // the run's scope check
    return rate_limited("0", R"({"error":{"code":"rate_limited"}})");
  });
  const int64_t now = test_clock().now_ms();
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  const std::optional<jobs::Job> job = store_->get(run.run_id);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->status, JobStatus::kQueued) << job->last_error.value_or("-");
  EXPECT_EQ(job->attempts, 0);
  EXPECT_EQ(job->run_after_ms, now + 60'000);
  EXPECT_EQ(pipeline_->metrics().rate_limit_waits, 1);
  test_clock().set_ms(job->run_after_ms);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true) << run_result(run.run_id).dump();
}

// A run whose units would not fit its checkpoint (the store holds 16 MiB of text: some 150 000
// units) is refused at its fan-out, before any unit is enqueued, naming the count. It failed at its
// wait instead, after the units were enqueued: each retry adopted them and failed again, and they
// ran on under a dead run. Here the limit is 256 KiB, and the run 3 000 units of about 110 bytes.
TEST_F(PipelineTest, ARunTooLargeToTrackIsRefusedBeforeItsUnitsAreEnqueued) {
  PipelineOptions options = fast();
  options.run_checkpoint_bytes = 256 << 10;
  start(data(1'000, 0, 0), options);
  const RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  const jobs::Job job = *store_->get(run.run_id);
  EXPECT_EQ(job.status, JobStatus::kDead);
  EXPECT_NE(job.last_error.value_or("").find(
                "the run would have 3000 units (1000 resources x 3 entity types), more than "
                "one run can track"),
            std::string::npos)
      << job.last_error.value_or("-");
  EXPECT_TRUE(units_of(run.run_id).empty()) << "units were enqueued";
}

// Seed 000 test 2: Vercel, one project, one entity type: one unit.
TEST_F(PipelineTest, VercelRunWithOneProjectIsOneUnit) {
  start(data(0, 1, 120));
  RunStart run = start_run("vc-inst-1", "vercel");
  drive();
  std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(json::parse(units[0].payload)["entityType"], "deployment");
  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true);
  EXPECT_EQ(result["workUnits"], 1);
  sandbox::Report report = sandbox_->report("inst-1");
  EXPECT_EQ(report.gateway_by_provider["vercel"].missing, 0);
  EXPECT_EQ(result["eventsDispatched"].get<int64_t>(), report.gateway_by_provider["vercel"].unique);
  EXPECT_EQ(report.gateway_by_provider["vercel"].unique, 120);
}

// Seed 000 test 4: cancel mid-run. The running unit stops at its next page boundary, queued units
// are cancelled at once, and nothing more is fetched.
// A run requested while the installation's active run is being cancelled (its fan-out under
// way) is refused with the reason: returned as the active run, it would end cancelled and run
// nothing of the request. Once the old run has stopped, the request starts a new one.
TEST_F(PipelineTest, ARunRequestedWhileTheActiveRunIsBeingCancelledIsRefusedWithTheReason) {
  start(data(1, 0, 50));
  RunStart run = start_run("gh-inst-1", "github", {"issue"});
  std::string refusal;
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n == 1) {  // the run's scope check
      EXPECT_EQ(pipeline_->cancel_run(run.run_id), jobs::CancelOutcome::kRequested);
      try {
        RunStart again = start_run("gh-inst-1", "github", {"issue"});
        ADD_FAILURE() << "returned run " << again.run_id << " (created " << again.created << ")";
      } catch (const jobs::InvalidTransition& e) {
        refusal = e.what();
      }
    }
    return std::nullopt;
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  EXPECT_EQ(refusal, "run " + std::to_string(run.run_id) +
                         " of gh-inst-1 is being cancelled: request a new run once it has stopped");
  EXPECT_EQ(store_->get(run.run_id)->status, JobStatus::kCancelled);
  const RunStart next = start_run("gh-inst-1", "github", {"issue"});
  EXPECT_TRUE(next.created);
  EXPECT_NE(next.run_id, run.run_id);
}

TEST_F(PipelineTest, CancellingARunStopsTheRunningUnitAtThePageBoundaryAndTheRest) {
  start(data(2, 1, 500));
  RunStart run = start_run("gh-inst-1", "github", {"issue", "release"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the orchestrator fans out 4 units
  ASSERT_EQ(units_of(run.run_id).size(), 4u);

  // During the first unit's second page, an operator cancels the run.
  std::atomic<bool> cancelled{false};
  size_t cancel_at = 0;
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n == 2 && !cancelled.exchange(true)) {
      cancel_at = n;
      EXPECT_TRUE(pipeline_->cancel_run(run.run_id).has_value());
    }
    return std::nullopt;
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  EXPECT_TRUE(cancelled.load());
  EXPECT_EQ(plugin_transport().urls().size(), cancel_at) << "no page after the boundary";
  EXPECT_EQ(drive(), 0) << "nothing is left to run";

  std::optional<RunView> view = pipeline_->get_run(run.run_id);
  ASSERT_TRUE(view);
  EXPECT_EQ(view->status, "cancelled");
  for (const jobs::Job& u : units_of(run.run_id)) EXPECT_EQ(u.status, JobStatus::kCancelled);
  EXPECT_EQ(view->units_done, 4);
  // The cancelled unit kept the pages it had delivered.
  EXPECT_EQ(view->pages, 2);
  EXPECT_EQ(view->events_dispatched, sandbox_->report("inst-1").gateway.unique);
}

// Seed 000 test 5: a unit that fails (here every request for one repository answers 404, which
// GitHub's connector reports as FATAL) is reported in the run's aggregate; the others complete.
// The payload is embedded verbatim in the webhook envelope, so one that is not exactly one JSON
// value (truncated, or closing the envelope to add fields of its own) is refused before it is
// sent, naming the delivery, and not retried.
TEST_F(PipelineTest, AnEventPayloadThatIsNotJsonNeverReachesTheGateway) {
  start();
  for (const char* payload : {R"({"action":"opened")", R"(1,"deliveryId":"forged")",
                              "{\"title\":\"\x01\"}", R"({"a":1} {"b":2})"}) {
    gateway::Delivery d{"gh-inst-1", "org-1", "github:test-delivery", "issues", payload};
    try {
      gateway_->dispatch("github", d);
      ADD_FAILURE() << "dispatched: " << payload;
    } catch (const gateway::GatewayError& e) {
      EXPECT_FALSE(e.retryable()) << payload;
      EXPECT_THAT(e.what(), HasSubstr("github:test-delivery")) << payload;
      EXPECT_THAT(e.what(), HasSubstr("not valid JSON")) << payload;
    }
  }
  EXPECT_EQ(sandbox_->report().gateway.received, 0) << "nothing was sent";
  gateway::Delivery ok{"gh-inst-1", "org-1", "github:test-delivery", "issues",
                       R"({"action":"opened","issue":{"id":1}})"};
  EXPECT_EQ(gateway_->dispatch("github", ok), gateway::DispatchResult::kAccepted);
  EXPECT_EQ(sandbox_->report().gateway.received, 1);

  // In a batch (pipelined on one connection), the bad payload is refused alone.
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back("github:batch-" + std::to_string(i));
  std::vector<gateway::Delivery> batch;
  for (int i = 0; i < 5; ++i) {
    batch.push_back({"gh-inst-1", "org-1", ids[static_cast<size_t>(i)], "issues",
                     i == 2 ? std::string_view(R"({"a":)") : std::string_view(R"({"a":1})")});
  }
  batch.push_back(batch[0]);  // a repeat: the gateway answers "duplicate"
  const std::vector<gateway::GatewayClient::Outcome> outcomes =
      gateway_->dispatch_batch("github", batch);
  ASSERT_EQ(outcomes.size(), 6u);
  for (size_t i : {0u, 1u, 3u, 4u}) {
    EXPECT_EQ(outcomes[i].result, gateway::DispatchResult::kAccepted) << i;
  }
  ASSERT_TRUE(outcomes[2].error);
  EXPECT_FALSE(outcomes[2].error->retryable());
  EXPECT_THAT(outcomes[2].error->what(), HasSubstr("github:batch-2"));
  EXPECT_EQ(outcomes[5].result, gateway::DispatchResult::kDuplicate);
  EXPECT_EQ(sandbox_->report().gateway.received, 1 + 5) << "every post but the bad one";
}

TEST_F(PipelineTest, AFailingUnitIsReportedInTheAggregateAndTheOthersComplete) {
  start(data(3, 1, 150));
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  json first = json::parse(units_of(run.run_id).back().payload);
  // Its lists, asked for by the repository's number (first pages) or name.
  const std::string by_name = "/repos/" + first["resource"]["name"].get<std::string>() + "/";
  const std::string by_id = "/repositories/" + first["resource"]["id"].get<std::string>() + "/";
  plugin_transport().reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find(by_name) == std::string::npos && r.url.find(by_id) == std::string::npos)
      return std::nullopt;
    return status_response(404, R"({"message":"Not Found"})");
  });
  drive();

  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], false);
  EXPECT_EQ(result["workUnits"], 9);
  EXPECT_EQ(result["failed"], 3) << result.dump(2);
  EXPECT_EQ(result["completed"], 6);
  for (const json& r : result["results"]) {
    bool is_broken = r["resourceName"] == first["resource"]["name"];
    EXPECT_EQ(r["success"], !is_broken) << r.dump();
    if (is_broken) {
      EXPECT_EQ(r["status"], "dead");
      EXPECT_THAT(r["error"].get<std::string>(), HasSubstr("404"));
    }
  }
  EXPECT_EQ(pipeline_->get_run(run.run_id)->status, "failed");
  jobs::DeadLetterPage letters = store_->list_dead_letters({});
  EXPECT_EQ(letters.items.size(), 3u);
  // FATAL: one attempt each, no retries burnt.
  for (const jobs::Job& u : units_of(run.run_id))
    if (u.status == JobStatus::kDead) {
      EXPECT_EQ(u.attempts, 1);
    }

  // The fault is removed; the dead letters are replayed (`backhaul dlq retry --all`): the units
  // run again and the run's view becomes a success with the full counts.
  plugin_transport().reset();
  EXPECT_EQ(store_->retry_dead_letters({}, 10, test_clock().now_ms()), 3);
  EXPECT_EQ(pipeline_->get_run(run.run_id)->status, "running") << "replaying";
  ASSERT_EQ(pipeline_->list_runs({}).runs.size(), 1u);
  EXPECT_EQ(pipeline_->list_runs({}).runs[0].status, "running") << "the list agrees";
  drive();
  std::optional<RunView> replayed = pipeline_->get_run(run.run_id);
  EXPECT_EQ(replayed->status, "succeeded");
  EXPECT_EQ(replayed->units_failed, 0);
  RunQuery succeeded;
  succeeded.status = "succeeded";
  ASSERT_EQ(pipeline_->list_runs(succeeded).runs.size(), 1u) << "listed under its live status";
  EXPECT_EQ(pipeline_->list_runs(succeeded).runs[0].events_dispatched, replayed->events_dispatched);
  const sandbox::DeliveryCounts gh = sandbox_->report("inst-1").gateway_by_provider["github"];
  EXPECT_EQ(gh.missing, 0);
  EXPECT_EQ(replayed->events_dispatched, gh.unique);
  for (const jobs::DeadLetter& l : store_->list_dead_letters({}).items)
    EXPECT_EQ(l.status, jobs::DeadLetterStatus::kResolved);
}

// Seed 000 test 6: the token expires mid-pagination (the sandbox answers 401 once a token has
// served 4 requests); the worker refreshes it once and fetches the same page again.
TEST_F(PipelineTest, AnExpiredTokenIsRefreshedAndThePageFetchedAgain) {
  sandbox::SandboxOptions o = data(1, 0, 900);
  o.faults.token_ttl_requests = 4;
  start(o);
  RunStart run = start_run("gh-inst-1", "github");
  drive();
  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true) << result.dump(2);
  EXPECT_GT(pipeline_->metrics().token_refreshes, 0);
  for (const jobs::Job& u : units_of(run.run_id)) EXPECT_EQ(u.attempts, 1) << "no failed attempt";
  sandbox::Report report = sandbox_->report("inst-1");
  EXPECT_GT(report.faults_injected["token_expired"], 0);
  EXPECT_EQ(report.gateway.missing, 0);
  EXPECT_EQ(report.gateway.unexpected, 0);
}

// D11: a unit failing at page 41 of 50 resumes there on its retry, not at page 1.
TEST_F(PipelineTest, AUnitFailingAtPage41Of50ResumesFromItsCheckpoint) {
  PipelineOptions options = fast();
  options.transient_retries = 0;  // the 500 fails the attempt at once
  start(data(0, 1, 5000), options);
  std::string failed_url;
  std::atomic<int> lists{0};
  plugin_transport().reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find("/v6/deployments") == std::string::npos || ++lists != 41) return std::nullopt;
    failed_url = r.url;
    return status_response(500, R"({"error":{"code":"internal_server_error"}})");
  });
  RunStart run = start_run("vc-inst-1", "vercel");
  drive();

  json result = run_result(run.run_id);
  EXPECT_EQ(result["eventsDispatched"], 5000);
  const int64_t pages = result["pages"].get<int64_t>();
  EXPECT_GE(pages, 50);
  std::vector<std::string> requests;
  for (const std::string& url : plugin_transport().urls())
    if (url.find("/v6/deployments") != std::string::npos) requests.push_back(url);
  ASSERT_EQ(static_cast<int64_t>(requests.size()), pages + 1)
      << "every page once, plus the failure";
  EXPECT_EQ(requests[41], failed_url) << "the retry asks for page 41 again";
  EXPECT_EQ(std::count(requests.begin(), requests.end(), requests[0]), 1) << "no restart at page 1";
  jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.status, JobStatus::kSucceeded);
  EXPECT_EQ(unit.attempts, 1) << "the retry made progress: attempts count from it again";
  std::vector<jobs::Attempt> history = store_->attempts(unit.id);
  ASSERT_EQ(history.size(), 2u);
  EXPECT_EQ(history[0].outcome, "failed");
  EXPECT_THAT(history[0].error.value_or(""), HasSubstr("500"));
  EXPECT_EQ(sandbox_->report("inst-1").gateway.duplicates, 0);
}

// E2: when fewer than 10% of the provider's requests are left, the unit sleeps until the reset as
// a run-after (no 429 ever provoked, no attempt counted) and then carries on.
TEST_F(PipelineTest, ALowRateLimitDefersTheUnitUntilTheResetWithoutAnAttempt) {
  sandbox::SandboxOptions o = data(1, 0, 1000);
  o.faults.rate_limit = 20;
  o.faults.rate_window_s = 600;
  start(o);
  RunStart run = start_run("gh-inst-1", "github");
  drive();
  json result = run_result(run.run_id);
  ASSERT_EQ(result["success"], true) << result.dump(2);
  EXPECT_GE(result["rateLimitWaits"].get<int>(), 1);
  jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.attempts, 1);
  sandbox::Report report = sandbox_->report("inst-1");
  EXPECT_EQ(report.faults_injected["rate_limited"], 0) << "never ran into the limit";
  EXPECT_EQ(report.gateway.missing, 0);
  EXPECT_GE(test_clock().now_ms(), kStart + 600'000) << "waited for a reset";
}

// A page the provider answers RATE_LIMITED (a 429 with Retry-After) is a wait of the unit, counted
// in its result's rateLimitWaits and the run's, as a wait for a low limit's reset is.
TEST_F(PipelineTest, ARateLimitedPageIsCountedInTheUnitsRateLimitWaits) {
  RunStart run = fanned_out();
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n != 1) return std::nullopt;  // the unit's first page
    return rate_limited("5");
  });
  drive();
  const json result = run_result(run.run_id);
  ASSERT_EQ(result["success"], true) << result.dump();
  EXPECT_EQ(result["rateLimitWaits"], 1) << result.dump();
  const jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.attempts, 1) << "the wait was no attempt";
  EXPECT_EQ(json::parse(unit.result.value_or("{}"))["rateLimitWaits"], 1)
      << unit.result.value_or("-");
  EXPECT_EQ(pipeline_->metrics().rate_limit_waits, 1);
}

// A drain with no grace asks a unit to stop while its first page is under way (the provider's
// answer waits for it); then the page is answered. Found by review: the checkpoint before a
// rate limit's deferral threw, draining, and the unit was released with run-after now, where the
// next start (or another host) would claim it at once and meet the limit again; and a page that
// failed transiently was tried again in place, after the drain had asked the unit to stop.
class PipelineDrainTest : public PipelineTest {
 protected:
  const int64_t now_ = kStart;  // the clock stands still

  // Drains while the unit's first page waits, answered by `answer` (the sandbox's page passed in).
  // Returns the unit as the drain left it; `requests` counts the provider requests it made.
  jobs::Job drain_while_the_first_page_is_under_way(
      const std::function<http::Response(http::Response)>& answer) {
    RunStart run = fanned_out();
    std::unique_ptr<jobs::Scheduler> scheduler = threaded_scheduler("draining", 1);
    jobs::Scheduler& threaded = *scheduler;
    std::promise<void> fetching;
    std::atomic<bool> asked_to_stop{false};
    http::PocoTransport direct;
    plugin_transport().reset(
        [&](const http::Request& r, size_t n) -> std::optional<http::Response> {
          requests = static_cast<int>(n);
          if (n != 1) return std::nullopt;  // the unit's first page
          fetching.set_value();
          for (int i = 0; i < 1000 && !threaded.asking_handlers_to_stop(); ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          asked_to_stop = threaded.asking_handlers_to_stop();
          return answer(direct.perform(r));
        });
    EXPECT_EQ(test_clock().now_ms(), now_);
    threaded.start();
    EXPECT_EQ(fetching.get_future().wait_for(std::chrono::seconds(10)), std::future_status::ready);
    threaded.hurry();  // no grace: the unit is asked to stop while its page is under way
    threaded.drain(std::chrono::milliseconds(0));
    EXPECT_TRUE(asked_to_stop) << "the page was answered before the drain asked the unit to stop";
    return units_of(run.run_id).at(0);
  }

  // The unit went back to wait for the rate limit (ten minutes), counted in its checkpoint.
  void expect_waiting_ten_minutes(const jobs::Job& unit) {
    EXPECT_EQ(unit.status, JobStatus::kQueued);
    EXPECT_EQ(unit.attempts, 0) << "a wait, not an attempt";
    EXPECT_EQ(unit.run_after_ms, now_ + 600'000) << "the unit goes back with its wait";
    const json checkpoint = json::parse(unit.checkpoint.value_or("{}"));
    EXPECT_EQ(checkpoint.value("rateLimitWaits", 0), 1) << checkpoint.dump();
  }

  std::atomic<int> requests{0};
};

TEST_F(PipelineDrainTest, ADrainKeepsTheRetryAfterOfA429) {
  const jobs::Job unit =
      drain_while_the_first_page_is_under_way([](http::Response) { return rate_limited("600"); });
  expect_waiting_ten_minutes(unit);
}

TEST_F(PipelineDrainTest, ADrainKeepsTheWaitForALowLimitsReset) {
  const jobs::Job unit = drain_while_the_first_page_is_under_way([&](http::Response page) {
    std::erase_if(page.headers, [](const auto& h) { return h.first.starts_with("x-ratelimit"); });
    page.headers.emplace_back("x-ratelimit-limit", "5000");
    page.headers.emplace_back("x-ratelimit-remaining", "0");
    page.headers.emplace_back("x-ratelimit-reset", std::to_string(now_ / 1000 + 600));
    return page;
  });
  expect_waiting_ten_minutes(unit);
  const json checkpoint = json::parse(unit.checkpoint.value_or("{}"));
  EXPECT_TRUE(checkpoint.value("cursor", json()).is_string()) << "the page it fetched is saved";
}

TEST_F(PipelineDrainTest, ADrainStopsAUnitFromTryingAFailedPageAgain) {
  const jobs::Job unit = drain_while_the_first_page_is_under_way(
      [](http::Response) { return status_response(502, R"({"message":"Bad Gateway"})"); });
  EXPECT_EQ(requests, 1) << "the page was tried again after the drain asked the unit to stop";
  EXPECT_EQ(unit.status, JobStatus::kQueued);
  EXPECT_EQ(unit.attempts, 0) << "released by the drain, without an attempt";
  EXPECT_EQ(unit.run_after_ms, now_);
}

// A drain with no grace stops a page whose deliveries are being retried in place: the gateway
// answers each delivery's first POST 503 with Retry-After 1. Found by review: each retry's wait was
// one real sleep that nothing could cut short, so the drain waited for every delivery of the page
// to be retried, one second after another (21 s), and then checkpointed the page.
TEST_F(PipelineDrainTest, ADrainStopsThePagesDeliveriesWaitingToBeRetried) {
  RunStart run = fanned_out();
  std::mutex mutex;
  std::set<std::string> seen;  // the deliveries' bodies
  int posts = 0;
  std::promise<void> first_post;
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.method != "POST") return std::nullopt;
    std::lock_guard lock(mutex);
    if (++posts == 1) first_post.set_value();
    if (!seen.insert(r.body.value_or("")).second) return std::nullopt;  // its retry: taken
    http::Response busy = status_response(503, "{}");
    busy.headers.emplace_back("retry-after", "1");
    return busy;
  });
  std::unique_ptr<jobs::Scheduler> scheduler = threaded_scheduler("draining", 1);
  scheduler->start();
  ASSERT_EQ(first_post.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  scheduler->hurry();
  scheduler->drain(std::chrono::milliseconds(0));
  const jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.status, JobStatus::kQueued);
  EXPECT_EQ(unit.attempts, 0) << "released by the drain, without an attempt: "
                              << unit.last_error.value_or("-");
  const json checkpoint = json::parse(unit.checkpoint.value_or("{}"));
  EXPECT_EQ(checkpoint.value("pages", 0), 0) << "the page was not done: " << checkpoint.dump();
  std::lock_guard lock(mutex);
  EXPECT_LE(posts - static_cast<int>(seen.size()), PipelineOptions{}.dispatch_concurrency)
      << "deliveries retried after the drain asked the unit to stop, of " << seen.size();
}

// A page's rawCount as the plugin gives it, held between the page's events and a billion (review:
// a third-party plugin's UINT64_MAX made eventsProduced -1, and large ones overflowed the sums).
TEST(ProducedByPage, IsTheRawCountHeldBetweenTheEventsAndABillion) {
  EXPECT_EQ(produced_by_page(101, 100), 101);
  EXPECT_EQ(produced_by_page(0, 0), 0);
  EXPECT_EQ(produced_by_page(3, 5), 5) << "fewer than the page's events";
  EXPECT_EQ(produced_by_page(UINT64_MAX, 5), 1'000'000'000);
  EXPECT_EQ(produced_by_page(uint64_t{1} << 63, 0), 1'000'000'000);
}

// The wait before a retry in place: the backoff, or the answer's Retry-After (up to 2 s) when
// longer, never more than 30 s (transient_retry_ms may be 60 s, and 2^9 of it was 8.5 hours).
TEST(InPlaceWaitTest, IsTheBackoffOrTheRetryAfterUpToItsCaps) {
  PipelineOptions o;
  o.transient_retry_ms = 100;
  EXPECT_EQ(in_place_wait_ms(o, 0, 0), 100);
  EXPECT_EQ(in_place_wait_ms(o, 2, 0), 400);
  EXPECT_EQ(in_place_wait_ms(o, 0, 300), 300) << "a fetch's Retry-After was not passed";
  EXPECT_EQ(in_place_wait_ms(o, 0, 5'000), 2'000);
  o.transient_retry_ms = 60'000;
  EXPECT_EQ(in_place_wait_ms(o, 9, 0), kMaxInPlaceWaitMs);
  EXPECT_EQ(in_place_wait_ms(o, 62, 0), kMaxInPlaceWaitMs);
  o.transient_retry_ms = 0;
  EXPECT_EQ(in_place_wait_ms(o, 5, 0), 0);
}

// The checkpoint that counts a rate limit's wait fails once (a lock wait timeout): the unit still
// waits the provider's Retry-After, without an attempt. Found by review: the failure became a
// failed attempt retried in 2 s, into the limit again, and on a unit's last attempt a dead letter
// made of a rate limit (D4).
class FailsTheCheckpointOfAWait : public jobs::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  jobs::HeartbeatResult heartbeat(jobs::JobId id, const std::string& token, int64_t now_ms,
                                  int64_t lease_ms, const std::optional<std::string>& checkpoint,
                                  bool progress) override {
    if (checkpoint && !progress && !failed_.exchange(true))
      throw StorageError("lock wait timeout exceeded (test)", false, /*lock_conflict=*/true);
    return ForwardingStore::heartbeat(id, token, now_ms, lease_ms, checkpoint, progress);
  }

 private:
  std::atomic<bool> failed_{false};
};

TEST_F(PipelineTest, ARateLimitsWaitStandsThoughItsCheckpointFailed) {
  real_store_ = std::move(store_);
  store_ = std::make_unique<FailsTheCheckpointOfAWait>(*real_store_);
  RunStart run = fanned_out();
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n != 1) return std::nullopt;  // the unit's first page
    return rate_limited("600");
  });
  const int64_t now = test_clock().now_ms();
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  const jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.status, JobStatus::kQueued);
  EXPECT_EQ(unit.attempts, 0) << "a wait, not an attempt: " << unit.last_error.value_or("-");
  EXPECT_EQ(unit.run_after_ms, now + 600'000);
  test_clock().set_ms(unit.run_after_ms);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true) << run_result(run.run_id).dump();
}

// A rate-limit reset further away than a day (a bad header) is waited for a day, not for ever.
TEST_F(PipelineTest, ALowRateLimitWhoseResetIsFarAwayWaitsADay) {
  RunStart run = fanned_out();
  http::PocoTransport direct;
  plugin_transport().reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    http::Response answer = direct.perform(r);  // the sandbox's page, with another limit
    std::erase_if(answer.headers, [](const auto& h) { return h.first.starts_with("x-ratelimit"); });
    answer.headers.emplace_back("x-ratelimit-limit", "5000");
    answer.headers.emplace_back("x-ratelimit-remaining", "0");
    answer.headers.emplace_back("x-ratelimit-reset", "99999999999");  // the year 5138
    return answer;
  });
  const int64_t now = test_clock().now_ms();
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the unit's first page
  const jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.status, JobStatus::kQueued);
  EXPECT_EQ(unit.attempts, 0);
  EXPECT_EQ(unit.run_after_ms, now + 24LL * 3600 * 1000);
  EXPECT_EQ(pipeline_->metrics().rate_limit_waits, 1);
}

// D8: the throttle (tokens per installation per hour) spaces requests; a throttled unit waits
// with a run-after and its attempt does not count.
TEST_F(PipelineTest, TheThrottleSpacesProviderRequestsPerInstallation) {
  PipelineOptions options = fast();
  options.throttle_per_hour = 3600;  // one request per second
  options.throttle_burst = 5;
  start(data(0, 1, 2000), options);
  std::vector<int64_t> at;  // when each provider request went out (host clock)
  plugin_transport().reset([&](const http::Request&, size_t) -> std::optional<http::Response> {
    at.push_back(test_clock().now_ms());
    return std::nullopt;
  });
  RunStart run = start_run("vc-inst-1", "vercel");
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  // The bucket's promise: in any window of W seconds, at most burst + W requests.
  for (size_t i = 0; i < at.size(); ++i) {
    for (int64_t window_s : {1, 5, 10}) {
      int64_t n = std::count_if(at.begin() + static_cast<std::ptrdiff_t>(i), at.end(),
                                [&](int64_t t) { return t < at[i] + window_s * 1000; });
      EXPECT_LE(n, 5 + window_s) << "window of " << window_s << " s from request " << i;
    }
  }
  const int64_t pages = run_result(run.run_id)["pages"].get<int64_t>();
  EXPECT_EQ(requests_to("/v6/deployments"), pages);
  // Every provider request took a token: the pages and the run's scope check.
  const auto requests = static_cast<int64_t>(at.size());
  EXPECT_EQ(requests, pages + 1);
  // A burst of 5, then one per second.
  EXPECT_GE(test_clock().now_ms() - kStart, (requests - 5) * 1000);
  EXPECT_GT(pipeline_->metrics().throttle_waits, 0);
  EXPECT_EQ(units_of(run.run_id).at(0).attempts, 1);
}

// E4: a provider that keeps failing opens its circuit; units then wait (a run-after, no attempt
// burnt) until the half-open probe, which succeeds once the provider is back.
TEST_F(PipelineTest, AnOpenProviderCircuitDefersUnitsInsteadOfBurningTheirAttempts) {
  PipelineOptions options = fast();
  options.transient_retries = 0;
  options.provider_circuit = {3, 60'000};
  start(data(2, 0, 300), options);
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // fan-out: 6 units
  sandbox::Faults failing;
  failing.fail_rate = 1.0;
  sandbox_->set_faults(failing);
  for (int i = 0; i < 12 && pipeline_->metrics().circuit_deferrals == 0; ++i)
    scheduler_->run_once(1);
  ASSERT_GT(pipeline_->metrics().circuit_deferrals, 0) << "the circuit opened";
  jobs::CircuitRecord circuit =
      store_->update_circuit("provider:github", [](auto& r) { return r; });
  EXPECT_EQ(circuit.state, "open");
  int failed_attempts = 0;
  for (const jobs::Job& u : units_of(run.run_id)) {
    EXPECT_NE(u.status, JobStatus::kDead);
    for (const jobs::Attempt& a : store_->attempts(u.id)) failed_attempts += a.outcome == "failed";
  }
  EXPECT_EQ(failed_attempts, 3) << "only the failures that opened the circuit counted";

  sandbox::Faults healthy;
  sandbox_->set_faults(healthy);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  EXPECT_EQ(store_->update_circuit("provider:github", [](auto& r) { return r; }).state, "closed");
  EXPECT_EQ(sandbox_->report("inst-1").gateway_by_provider["github"].missing, 0);
}

// Review (E4, D4): a page that always fails opens the provider's circuit with its failures, and
// each later try of it is a half-open probe that fails again, so the circuit is open again when
// the page would be retried in place. That hold-back deferred the unit, which costs no attempt,
// and the next claim tried the page afresh: the unit was deferred and probed for ever (until the
// run's unit timeout, 4 h) instead of dying after its attempts with the provider's error.
TEST_F(PipelineTest, APageThatAlwaysFailsDiesAfterItsAttemptsThoughItsFailuresOpenTheCircuit) {
  const RunStart run = fanned_out({"issue"});  // circuits: 3 failures, open 60 s
  sandbox::Faults failing;
  failing.resource_faults = {{"org-1/repo-1", "issues", 0, 0, 500}};  // every request
  sandbox_->set_faults(failing);
  drive();
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].status, JobStatus::kDead);
  EXPECT_EQ(units[0].attempts, units[0].max_attempts);
  ASSERT_TRUE(units[0].last_error.has_value());
  EXPECT_NE(units[0].last_error->find("RETRYABLE"), std::string::npos) << *units[0].last_error;
  EXPECT_NE(units[0].last_error->find("500"), std::string::npos) << *units[0].last_error;
  const json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], false) << result.dump(2);
  EXPECT_EQ(result["failed"], 1);
}

// A list too heavy for GitHub to answer 100 or 50 a page in time (a 502 each time) is walked 25 a
// page: the page's retries in place ask for 50, then 25, every item is delivered and the unit
// succeeds on its first attempt. Before, every attempt met the 502 and the unit died.
TEST_F(PipelineTest, AListTooHeavyForFullPagesIsWalkedInSmallerOnes) {
  const RunStart run = fanned_out({"pull_request", "issue", "release"});
  sandbox::Faults heavy;
  heavy.resource_faults = {{"org-1/repo-1", "pulls", 0, 0, 502, /*per_page_over=*/25}};
  sandbox_->set_faults(heavy);
  drive();
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 3u);
  for (const jobs::Job& unit : units) {
    EXPECT_EQ(unit.status, JobStatus::kSucceeded) << unit.payload;
    EXPECT_EQ(unit.attempts, 1) << unit.payload;
  }
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  const sandbox::Report report = sandbox_->report("inst-1");
  EXPECT_TRUE(report.complete()) << sandbox::to_json(report).dump(2);
  EXPECT_GT(report.faults_injected.at("resource"), 0);
}

// A provider or gateway answering a transient error and a rate limit in turn never let a unit
// die: the 429 deferred it (no attempt), and the next claim tried the page afresh, until the run's
// unit timeout (4 h). `drive_until_the_unit_dies` runs the run's one unit and checks it died after
// its attempts, and the run failed; returns the unit.
class PipelineAlternatingTest : public PipelineTest {
 protected:
  jobs::Job drive_until_the_unit_dies(const RunStart& run) {
    drive();
    const std::vector<jobs::Job> units = units_of(run.run_id);
    EXPECT_EQ(units.size(), 1u);
    if (units.empty()) return {};
    EXPECT_EQ(units[0].status, JobStatus::kDead);
    EXPECT_EQ(units[0].attempts, units[0].max_attempts);
    EXPECT_EQ(run_result(run.run_id)["success"], false);
    return units[0];
  }

  // The provider answers `failures_per_429` 502s, then a 429, and again.
  void alternate_the_provider(int failures_per_429) {
    plugin_transport().reset(
        [this, failures_per_429](const http::Request& r, size_t) -> std::optional<http::Response> {
          if (r.url.find("/issues") == std::string::npos) return std::nullopt;
          if (++tries_ % (failures_per_429 + 1) != 0)
            return status_response(502, R"({"message":"x"})");
          return rate_limited("1");
        });
  }

  std::atomic<int> tries_{0};
};

// The 429 after a 502 retried in place deferred the attempt.
TEST_F(PipelineAlternatingTest, AProvidersFailureThenRateLimitEndsTheUnitAfterItsAttempts) {
  const RunStart run = fanned_out({"issue"});
  alternate_the_provider(1);
  const jobs::Job unit = drive_until_the_unit_dies(run);
  ASSERT_TRUE(unit.last_error.has_value());
  EXPECT_NE(unit.last_error->find("after a failed try of this page"), std::string::npos)
      << *unit.last_error;
}

// Three 502s failed an attempt, and the 429 at the start of the next was checkpointed as
// progress, forgetting every failed attempt before it. It is a wait still, and counted.
TEST_F(PipelineAlternatingTest, AProvidersRateLimitAfterFailedAttemptsForgetsNone) {
  const RunStart run = fanned_out({"issue"});
  alternate_the_provider(3);
  const jobs::Job unit = drive_until_the_unit_dies(run);
  int deferred = 0;
  for (const jobs::Attempt& a : store_->attempts(unit.id)) {
    deferred += a.outcome == "deferred" &&
                a.error.value_or("").find("rate limited by the provider") != std::string::npos;
  }
  EXPECT_GT(deferred, 0);
  ASSERT_TRUE(unit.checkpoint.has_value());
  EXPECT_EQ(json::parse(*unit.checkpoint)["rateLimitWaits"], deferred) << *unit.checkpoint;
}

// A token the provider refuses, whose refresh the gateway answers 429: the refresh deferred the
// unit, and the next claim got a token, was refused, and so on.
TEST_F(PipelineAlternatingTest, ARefreshTheGatewayAnswers429EndsTheUnitAfterItsAttempts) {
  const RunStart run = fanned_out({"issue"});
  plugin_transport().reset([](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find("/issues") == std::string::npos) return std::nullopt;
    return status_response(401, R"({"message":"Bad credentials"})");
  });
  std::atomic<int> tokens{0};
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (!r.url.ends_with("/token") || tokens++ % 2 == 0) return std::nullopt;
    return status_response(429, "{}");
  });
  const jobs::Job unit = drive_until_the_unit_dies(run);
  ASSERT_TRUE(unit.last_error.has_value());
  EXPECT_NE(unit.last_error->find("the token could not be refreshed"), std::string::npos)
      << *unit.last_error;
}

// A delivery answered 500 is retried in place, and the retry's 429 deferred the unit.
TEST_F(PipelineAlternatingTest, AGatewaysFailureThenRateLimitEndsTheUnitAfterItsAttempts) {
  PipelineOptions options = fast();
  options.dispatch_concurrency = 1;  // one pipelined slice: the answers alternate in order
  const RunStart run = fanned_out({"issue"}, options);
  bool last_was_500 = false;
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find("/webhooks/") == std::string::npos) return std::nullopt;
    last_was_500 = !last_was_500;
    if (last_was_500) return status_response(500, R"({"error":"oops"})");
    http::Response busy = status_response(429, R"({"error":"slow down"})");
    busy.headers.emplace_back("retry-after", "1");
    return busy;
  });
  const jobs::Job unit = drive_until_the_unit_dies(run);
  ASSERT_TRUE(unit.last_error.has_value());
  EXPECT_NE(unit.last_error->find("after a transient failure of this page"), std::string::npos)
      << *unit.last_error;
}

// The same with a token that the provider always refuses while the installation's throttle is
// spent: each claim refreshed the token, was throttled before it could try the new one, and
// started over on the next claim with a fresh refresh, never failing.
TEST_F(PipelineTest, ATokenAlwaysRefusedDiesAfterItsAttemptsUnderAThrottle) {
  PipelineOptions options = fast();
  options.throttle_per_hour = 3600;  // one request per second
  options.throttle_burst = 1;
  const RunStart run = fanned_out({"issue"}, options);
  sandbox::Faults refusing;
  refusing.resource_faults = {{"org-1/repo-1", "issues", 0, 0, 401}};
  sandbox_->set_faults(refusing);
  drive();
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].status, JobStatus::kDead);
  ASSERT_TRUE(units[0].last_error.has_value());
  EXPECT_NE(units[0].last_error->find("AUTH_EXPIRED"), std::string::npos) << *units[0].last_error;
  EXPECT_LE(pipeline_->metrics().token_refreshes, units[0].max_attempts)
      << "one refresh per attempt at most";
}

// Review (E4): the run's scope check is a provider request like a unit's page: while the
// provider's circuit is open it waits (a run-after, no attempt burnt) instead of calling the
// failing provider and spending the run's attempts.
TEST_F(PipelineTest, AnOpenProviderCircuitDefersTheRunsScopeCheckToo) {
  PipelineOptions options = fast();
  options.transient_retries = 0;
  options.provider_circuit = {3, 60'000};
  start(data(2, 0, 300), options);
  const int64_t now = test_clock().now_ms();
  store_->update_circuit("provider:github", [&](const jobs::CircuitRecord&) {
    return open_circuit(now, now + 60'000);
  });
  sandbox::Faults failing;
  failing.fail_rate = 1.0;
  sandbox_->set_faults(failing);
  RunStart run = start_run("gh-inst-1", "github");
  scheduler_->run_once(1);
  const jobs::Job job = *store_->get(run.run_id);
  int failed = 0;
  for (const jobs::Attempt& a : store_->attempts(run.run_id)) failed += a.outcome != "deferred";
  EXPECT_EQ(failed, 0) << "attempts other than deferrals while the circuit is open; last error: "
                       << job.last_error.value_or("-");
  EXPECT_EQ(job.status, JobStatus::kQueued);
  EXPECT_GE(job.run_after_ms, now + 60'000) << "it waits for the half-open probe";
}

// E4: a page request that began before the provider's circuit opened and comes back, successful,
// once another worker's half-open probe has begun is not the probe: the circuit stays half-open
// (the probe decides), and this unit waits for it like the others instead of fetching on.
TEST_F(PipelineTest, APageThatBeganBeforeTheProbeDoesNotCloseAHalfOpenCircuit) {
  PipelineOptions options = fast();
  options.provider_circuit = {3, 60'000};
  start(data(1, 0, 300), options);
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // fan-out
  // Two failures so far (a success then has something to clear, and is recorded); the clock
  // moves past the host's cached view so the unit reads this record.
  store_->update_circuit("provider:github", [](const jobs::CircuitRecord&) {
    jobs::CircuitRecord r;
    r.failures = 2;
    r.updated_ms = kStart;
    return r;
  });
  test_clock().set_ms(kStart + 5'000);
  const int64_t began = test_clock().now_ms();
  jobs::CircuitRecord probing;
  probing.state = "half_open";
  probing.failures = 3;
  probing.opened_ms = began + 1;
  probing.updated_ms = began + 60'001;  // the probe's start
  probing.retry_at_ms = began + 120'001;
  // While the unit's first page is in flight, the circuit opens and its probe begins elsewhere.
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n == 1) {
      store_->update_circuit("provider:github",
                             [&](const jobs::CircuitRecord&) { return probing; });
      test_clock().set_ms(began + 60'500);
    }
    return std::nullopt;
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  const jobs::CircuitRecord after =
      store_->update_circuit("provider:github", [](auto& r) { return r; });
  EXPECT_EQ(after.state, "half_open") << "the late page closed the circuit";
  EXPECT_EQ(after.updated_ms, probing.updated_ms);
  EXPECT_EQ(after.retry_at_ms, probing.retry_at_ms);
  EXPECT_EQ(plugin_transport().urls().size(), 1u) << "one page, then the unit waits for the probe";
  int deferred = 0;
  for (const jobs::Job& u : units_of(run.run_id))
    deferred += u.status == JobStatus::kQueued && u.run_after_ms == began + 60'500 + 6'000;
  EXPECT_EQ(deferred, 1) << "the unit that fetched waits, and looks again in a tenth of the period";

  // The probe reports back and closes the circuit: at its next look the unit goes on, long
  // before the next probe would have been due. Before, it waited until then (began + 120001).
  store_->update_circuit("provider:github", [&](const jobs::CircuitRecord& r) {
    return jobs::record_event(r, jobs::CircuitEvent::kSuccess, options.provider_circuit,
                              probing.updated_ms, began + 61'000);
  });
  plugin_transport().reset();
  test_clock().set_ms(began + 66'500);
  while (scheduler_->run_once(1) == 1) {
  }
  for (const jobs::Job& u : units_of(run.run_id)) {
    EXPECT_EQ(u.status, JobStatus::kSucceeded) << "run_after " << u.run_after_ms;
  }
}

// E4: when the gateway's circuit is due for its half-open probe and the first call to go is a
// run's fan-out (a connection lookup and a token, no dispatch), that call is the probe and
// reports back: its success closes the circuit, and the units go at once instead of waiting for
// the next probe a whole open period later.
TEST_F(PipelineTest, AHalfOpenGatewayProbeThatIsATokenLookupClosesTheCircuit) {
  PipelineOptions options = fast();
  options.gateway_circuit = {3, 60'000};
  start(data(1, 0, 300), options);
  const int64_t now = test_clock().now_ms();
  store_->update_circuit(
      "gateway", [&](const jobs::CircuitRecord&) { return open_circuit(now - 60'000, now); });
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the fan-out: lookup, probe, token, scope check
  EXPECT_EQ(store_->get(run.run_id)->status, JobStatus::kWaiting)
      << store_->get(run.run_id)->last_error.value_or("-");
  const jobs::CircuitRecord after = store_->update_circuit("gateway", [](auto& r) { return r; });
  EXPECT_EQ(after.state, "closed") << "the probe never reported back";
  EXPECT_EQ(after.failures, 0);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "units waited for another probe";
}

// E4: the same when the probe is a page fetched after an error retried in place (the unit has its
// token already): the page it fetched goes to the gateway and reports back. Before, the check
// before dispatching found the circuit half-open -- its own probe under way -- and deferred it,
// and every later probe deferred itself the same way.
TEST_F(PipelineTest, AGatewayProbeBegunBetweenPagesDispatchesItsPage) {
  PipelineOptions options = fast();
  options.gateway_circuit = {3, 60'000};
  start(data(1, 0, 150), options);
  RunStart run = start_run("gh-inst-1", "github", {"issue"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // fan-out
  // The unit's first page fails (retried in place); meanwhile the gateway's circuit opened, its
  // probe is due, and this host's view of it is stale.
  open_the_gateway_circuit_at_the_first_fetch();
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  const jobs::CircuitRecord after = store_->update_circuit("gateway", [](auto& r) { return r; });
  EXPECT_EQ(after.state, "closed");
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "the probe deferred itself";
  const std::optional<RunView> view = pipeline_->get_run(run.run_id, false);
  ASSERT_TRUE(view.has_value());
  EXPECT_GT(view->events_dispatched, 0);
  EXPECT_EQ(view->events_dispatched, 150);
  EXPECT_EQ(view->events_produced, 180) << "the issues list's 150 issues and 30 pull requests";
  EXPECT_EQ(view->events_dispatched, sandbox_->report("inst-1").gateway.unique);
}

// E4: a provider's half-open probe answered with a 429 reports back: the provider answered (it
// is up; it limits our rate, which the unit waits for). Before, the probe never reported: the
// circuit stayed half-open for a whole period, and the unit, back after the 429's second, found
// its own probe under way and deferred itself until the period ended.
TEST_F(PipelineTest, AProviderProbeAnsweredWithA429ReportsTheProviderUp) {
  RunStart run = fanned_out();
  probe_due("provider:github");
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n != 1) return std::nullopt;
    return rate_limited("1");
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the probe's page: 429, the unit waits a second
  EXPECT_EQ(circuit("provider:github").state, "closed") << "the probe never reported back";
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "the unit waited for its own probe";
  EXPECT_EQ(pipeline_->metrics().rate_limit_waits, 1);
}

// E4: the same for a probe answered with a 401: the provider answered (our token expired), the
// unit refreshes it and fetches the page again at once. Before, it found its own probe under way
// and deferred itself for the whole period.
TEST_F(PipelineTest, AProviderProbeAnsweredWithA401RefreshesTheTokenAndFetchesAgain) {
  RunStart run = fanned_out();
  probe_due("provider:github");
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n != 1) return std::nullopt;
    return status_response(401, R"({"message":"Bad credentials"})");
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  EXPECT_EQ(pipeline_->metrics().token_refreshes, 1);
  EXPECT_EQ(circuit("provider:github").state, "closed");
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "the unit waited for its own probe";
  EXPECT_EQ(units_of(run.run_id).at(0).status, JobStatus::kSucceeded);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
}

// E4: a page that began the gateway's probe but failed at the provider (retried in place) sent
// nothing to the gateway: its probe is given back, and the page fetched again is the probe.
// Before, the retry found the gateway half-open -- its own probe, which never reported -- and
// deferred the unit for the whole period.
TEST_F(PipelineTest, AGatewayProbeWhosePageIsRetriedInPlaceDoesNotWaitForItself) {
  RunStart run = fanned_out();
  // The first page fails; meanwhile the gateway's probe falls due. The page fetched again (the
  // probe) fails too, and the third try goes.
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n == 1) probe_due("gateway");
    if (n <= 2) return status_response(502, "{}");
    return std::nullopt;
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  EXPECT_EQ(circuit("gateway").state, "closed");
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "the unit waited for its own probe";
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  EXPECT_EQ(run_result(run.run_id)["eventsDispatched"].get<int64_t>(),
            sandbox_->report("inst-1").gateway.unique);
}

// E4: a page that began the gateway's probe and has no events sends nothing to the gateway: the
// probe is given back, and the next unit's gateway call is the probe. Before, the circuit stayed
// half-open for the whole period, and the next unit waited for a report that never came.
TEST_F(PipelineTest, AGatewayProbeWhosePageIsEmptyIsGivenBack) {
  RunStart run = fanned_out({"issue", "release"});  // 2 units
  // The first unit's first page fails and the gateway's probe falls due; fetched again, the page
  // is empty and the last.
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n == 1) {
      probe_due("gateway");
      return status_response(502, "{}");
    }
    if (n == 2) return status_response(200, "[]");
    return std::nullopt;
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  const jobs::CircuitRecord after = circuit("gateway");
  EXPECT_EQ(after.state, "open") << "the probe that sent nothing was not given back";
  EXPECT_TRUE(jobs::decide(after, test_clock().now_ms()).allowed);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  EXPECT_EQ(circuit("gateway").state, "closed");
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "a unit waited for a probe that was over";
}

// E4: a page whose provider probe began while the gateway's circuit is open (not yet due) waits
// for the gateway, and gives its provider probe back: when it comes back it probes both at once.
// Before, the provider's circuit stayed half-open for its whole period, and the unit, back when
// the gateway's probe fell due, deferred itself again until then.
TEST_F(PipelineTest, AProviderProbeDeferredByTheOpenGatewayIsGivenBack) {
  RunStart run = fanned_out();
  const int64_t due = probe_due("provider:github");
  store_->update_circuit("gateway", [&](const jobs::CircuitRecord&) {
    return open_circuit(due - 30'000, due + 30'000);
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // deferred by the gateway
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 1);
  EXPECT_EQ(circuit("provider:github").state, "open") << "the provider's probe was kept";
  EXPECT_EQ(units_of(run.run_id).at(0).run_after_ms, due + 30'000);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 1) << "the unit waited for its own probe";
  EXPECT_EQ(circuit("provider:github").state, "closed");
  EXPECT_EQ(circuit("gateway").state, "closed");
  EXPECT_LT(units_of(run.run_id).at(0).finished_ms, due + 60'000);
}

// E4: a page that began the provider's probe and then found the installation's throttle empty
// waits for a token, and gives its probe back: the page that goes with the token is the probe.
// Before, the circuit stayed half-open for the whole period, and the unit, back with its token a
// second later, deferred itself until the period ended.
TEST_F(PipelineTest, AProviderProbeDeferredByTheThrottleIsGivenBack) {
  PipelineOptions options = fast();
  options.throttle_per_hour = 3600;  // one request per second
  options.throttle_burst = 5;
  RunStart run = fanned_out({"issue"}, options);
  const int64_t due = probe_due("provider:github");
  // The installation's bucket is empty: the page that begins the probe is throttled.
  ASSERT_EQ(store_->take_tokens("throttle:gh-inst-1", 5, 5, 3600, due), 0);
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  EXPECT_EQ(pipeline_->metrics().throttle_waits, 1);
  EXPECT_EQ(circuit("provider:github").state, "open") << "the probe was kept";
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "the unit waited for its own probe";
  EXPECT_EQ(circuit("provider:github").state, "closed");
}

// A token found inside the mark that replaces it ("[REDACTED]") was searched for again from the
// start of that mark, replaced inside it, and so on for ever: the worker hung in plugin_said().
TEST_F(PipelineTest, ATokenFoundInsideTheRedactionMarkIsReplacedOnce) {
  const RunStart run =
      run_with_the_fake_plugin_as_github(R"({"fail": "echo_token"})", 1, std::string("REDACTED"));
  drive();
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_FALSE(units.empty());
  for (const jobs::Job& unit : units) {
    EXPECT_EQ(unit.status, JobStatus::kDead);
    EXPECT_NE(unit.last_error.value_or("").find("the provider refused token [REDACTED] for good"),
              std::string::npos)
        << unit.last_error.value_or("(none)");
  }
}

// The run's result holds a line per unit, with the unit's error cut to 1000 bytes: its job keeps
// the error whole (a plugin's message is cut at 1024 bytes by the SDK; other errors are kept up to
// 65 000). Lines are bounded in all, so that no run's result is more than a store keeps.
TEST_F(PipelineTest, TheRunsResultCutsEachUnitsErrorItsJobKeepsItWhole) {
  const RunStart run = run_with_the_fake_plugin_as_github(R"({"fail": "long_message"})", 2);
  drive();
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_FALSE(units.empty());
  for (const jobs::Job& unit : units) {
    EXPECT_EQ(unit.status, JobStatus::kDead);
    EXPECT_GT(unit.last_error.value_or("").size(), 1000u);
  }
  const json result = run_result(run.run_id);
  ASSERT_EQ(result["results"].size(), units.size()) << result.dump().substr(0, 500);
  EXPECT_FALSE(result.contains("resultsOmitted"));
  for (const json& line : result["results"]) {
    const std::string error = line["error"];
    EXPECT_EQ(error.size(), 1000u + std::string(" [truncated]").size()) << error;
    EXPECT_EQ(error.rfind("FATAL: upstream said: xxx", 0), 0u) << error.substr(0, 100);
    EXPECT_EQ(error.substr(1000), " [truncated]");
  }
}

// Past PipelineOptions::result_lines_bytes, units are counted, not listed: the run succeeds, and
// reads as the run of all its units.
TEST_F(PipelineTest, UnitsPastTheResultsBoundAreCountedNotListed) {
  PipelineOptions options = fast();
  options.result_lines_bytes = 600;  // two or three lines of about 200 bytes
  start(data(6, 0, 10), options);
  const RunStart run = start_run("gh-inst-1", "github", {"issue"});
  drive();
  const json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true);
  EXPECT_EQ(result["workUnits"], 6);
  EXPECT_EQ(result["completed"], 6);
  ASSERT_TRUE(result.contains("resultsOmitted")) << result.dump();
  EXPECT_GT(result["results"].size(), 0u);
  EXPECT_EQ(result["results"].size() + result["resultsOmitted"].get<size_t>(), 6u);
  EXPECT_LE(result["results"].dump().size(), 600u + 2);
  // Listed from its stored result alone (get_run counts its children too).
  const RunPage listed = pipeline_->list_runs({});
  ASSERT_EQ(listed.runs.size(), 1u);
  EXPECT_EQ(listed.runs[0].units_total, 6);
}

// E2: the token is never stored in the queue. A plugin that echoes it in an error (the bundled
// ones scrub it; a third party's may not) had it stored as the job's last error, its attempt's
// and its dead letter's, and shown by /v1/jobs; a token of no known shape escaped redact() too.
TEST_F(PipelineTest, ATokenAPluginEchoesInAnErrorIsNeverStored) {
  const std::string token = "plain0secret0of0no0known0shape";
  const RunStart run = run_with_the_fake_plugin_as_github(R"({"fail": "echo_token"})", 1, token);
  drive();
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_FALSE(units.empty());
  for (const jobs::Job& unit : units) {
    EXPECT_EQ(unit.status, JobStatus::kDead);
    ASSERT_TRUE(unit.last_error.has_value());
    EXPECT_NE(unit.last_error->find("the provider refused token [REDACTED] for good"),
              std::string::npos)
        << *unit.last_error;
    for (const jobs::Attempt& a : store_->attempts(unit.id)) {
      EXPECT_EQ(a.error.value_or("").find(token), std::string::npos) << *a.error;
    }
  }
  jobs::DeadLetterQuery q;
  for (const jobs::DeadLetter& letter : store_->list_dead_letters(q).items) {
    EXPECT_EQ(letter.error.find(token), std::string::npos) << letter.error;
  }
  EXPECT_EQ(run_result(run.run_id).dump().find(token), std::string::npos);
}

// E4: a run's scope check that is the provider's probe and fails for good (the token cannot read
// the repository) gives the probe back: another installation's run probes at once. Before, the
// circuit stayed half-open for the whole period and that run waited for it.
TEST_F(PipelineTest, AScopeCheckProbeThatFailsFatallyIsGivenBack) {
  PipelineOptions options = fast();
  options.provider_circuit = {3, 60'000};
  start(data(1, 0, 150, 2), options);
  probe_due("provider:github");
  RunStart first = start_run("gh-inst-1", "github", {"issue"});
  RunStart second = start_run("gh-inst-2", "github", {"issue"});
  plugin_transport().reset([&](const http::Request&, size_t n) -> std::optional<http::Response> {
    if (n != 1) return std::nullopt;
    return status_response(404, R"({"message":"Not Found"})");
  });
  drive();
  const std::optional<jobs::Job> failed = store_->get(first.run_id);
  EXPECT_EQ(failed->status, JobStatus::kDead) << failed->last_error.value_or("-");
  EXPECT_EQ(run_result(second.run_id)["success"], true);
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "a run waited for a probe that was over";
  EXPECT_EQ(circuit("provider:github").state, "closed");
}

// E4: a gateway probe answered with a 4xx (here the token lookup: our request was wrong) reports
// the gateway up. Before, the unit failed for good and the circuit stayed half-open for the whole
// period, every other unit waiting for it.
TEST_F(PipelineTest, AGatewayProbeAnsweredWithA4xxReportsTheGatewayUp) {
  RunStart run = fanned_out({"issue", "release"});  // 2 units
  probe_due("gateway");
  std::atomic<int> tokens{0};
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.ends_with("/token") && tokens++ == 0) return status_response(400, "{}");
    return std::nullopt;
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the first unit: its token lookup is the probe
  EXPECT_EQ(circuit("gateway").state, "closed") << "the gateway's answer was not reported";
  drive();
  std::vector<jobs::Job> units = units_of(run.run_id);
  EXPECT_EQ(std::count_if(units.begin(), units.end(),
                          [](const jobs::Job& u) { return u.status == JobStatus::kDead; }),
            1);
  EXPECT_EQ(circuit("gateway").state, "closed");
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "a unit waited for a probe that was over";
}

// E4: a page whose provider probe began but whose token lookup failed at the gateway never went
// to the provider: the probe is given back, and the retry probes. Before, the circuit stayed
// half-open for the whole period.
TEST_F(PipelineTest, AProviderProbeWhoseTokenLookupFailsIsGivenBack) {
  PipelineOptions options = fast();
  options.transient_retries = 0;  // the lookup's one failure fails the attempt
  RunStart run = fanned_out({"issue"}, options);
  probe_due("provider:github");
  std::atomic<int> tokens{0};
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    // The lookup's first try and its in-place retries.
    if (r.url.ends_with("/token") && tokens++ == 0) return status_response(503, "{}");
    return std::nullopt;
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the token lookup fails: the attempt fails
  EXPECT_EQ(circuit("provider:github").state, "open") << "the probe was kept";
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  EXPECT_EQ(pipeline_->metrics().circuit_deferrals, 0) << "the unit waited for its own probe";
  EXPECT_EQ(circuit("provider:github").state, "closed");
}

// Review: a gateway 503 with Retry-After says when to come back. Deliveries were retried in place
// 100-200 ms apart and the attempt retried after the usual backoff (seconds), so a gateway deploy
// answering "503, Retry-After: 120" used up a unit's attempts in seconds. The retry now waits as
// asked, and a delivery is not retried in place against it.
TEST_F(PipelineTest, AGateway503WithRetryAfterIsWaitedOutNotRetriedAtOnce) {
  RunStart run = fanned_out();
  std::atomic<int> refusals{0};
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find("/webhooks/") == std::string::npos || refusals > 0) return std::nullopt;
    ++refusals;
    http::Response busy = status_response(503, R"({"error":"deploying"})");
    busy.headers.emplace_back("retry-after", "120");
    return busy;
  });
  const int64_t now = test_clock().now_ms();
  const int64_t in_place = pipeline_->metrics().transient_retries;
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the first page: one delivery refused
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].status, JobStatus::kQueued);
  EXPECT_EQ(units[0].attempts, 1);
  EXPECT_GE(units[0].run_after_ms, now + 120'000) << "retried before the gateway asked";
  EXPECT_EQ(pipeline_->metrics().transient_retries, in_place) << "retried in place";
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
}

// Review: a gateway 401 is the gateway refusing this host's API key, which every call of every job
// meets until an operator puts the key right. It was FATAL: each unit that met it went to the dead
// letters, a whole backfill with them. It now counts against the gateway's circuit, which holds
// the units back until the key works again; then the run goes on and succeeds. The gateway's
// failed probes cost no attempt: the first unit, the probe each time, died of them.
TEST_F(PipelineTest, AGatewayThatRefusesTheApiKeyHoldsTheUnitsBackUntilTheKeyWorks) {
  PipelineOptions options = fast();
  options.gateway_circuit = {3, 60'000};
  start(data(10, 0, 20), options);
  const RunStart run = start_run("gh-inst-1", "github", {"issue"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the fan-out, with the key still good
  const int64_t fixed_at = test_clock().now_ms() + 20 * 60'000;  // the key is put right then
  gateway_transport_.reset([&](const http::Request&, size_t) -> std::optional<http::Response> {
    if (test_clock().now_ms() >= fixed_at) return std::nullopt;
    return status_response(401, R"({"error":{"code":"unauthorized"}})");
  });
  drive();
  EXPECT_GE(test_clock().now_ms(), fixed_at);
  EXPECT_EQ(run_result(run.run_id)["success"], true)
      << run_result(run.run_id).dump().substr(0, 600);
  EXPECT_TRUE(store_->list_dead_letters({}).items.empty());
  int failed = 0;
  bool named = false;
  for (const jobs::Job& unit : units_of(run.run_id)) {
    for (const jobs::Attempt& a : store_->attempts(unit.id)) {
      failed += a.outcome == "failed";
      named =
          named || a.error.value_or("").find("refused this host's API key") != std::string::npos;
    }
  }
  EXPECT_TRUE(named) << "no attempt says why";
  EXPECT_EQ(failed, 0) << "the one that opened the circuit (a refused key opens it at once) and "
                          "its probes (1, 2, 4, 8 minutes on) cost none";
  EXPECT_EQ(circuit("gateway").state, "closed");
}

// A refused key opens the gateway's circuit at once: a run alone, whose connection lookup is its
// first call, waits for the key, where with the default circuit (5 failures) and its 4 attempts
// it died before the circuit opened. A delivery that the gateway
// answers 500 while others of its page went through is that delivery's: its probe costs an
// attempt, so such a unit still ends.
TEST_F(PipelineTest, ARunAloneWaitsForARefusedKeyWithTheDefaultCircuit) {
  start(data(1, 0, 20), fast());  // the default circuits: 5 failures, 30 s
  const int64_t fixed_at = test_clock().now_ms() + 30 * 60'000;
  gateway_transport_.reset([&](const http::Request&, size_t) -> std::optional<http::Response> {
    if (test_clock().now_ms() >= fixed_at) return std::nullopt;
    return status_response(401, R"({"error":{"code":"unauthorized"}})");
  });
  const RunStart run = start_run("gh-inst-1", "github", {"issue"});
  drive();
  EXPECT_GE(test_clock().now_ms(), fixed_at);
  EXPECT_EQ(run_result(run.run_id)["success"], true)
      << store_->get(run.run_id)->last_error.value_or("-");
  int failed = 0;
  for (const jobs::Attempt& a : store_->attempts(run.run_id)) failed += a.outcome == "failed";
  EXPECT_EQ(failed, 0) << "the lookup that opened the circuit and the probes cost none";
}

// Review: a job alone met a gateway outage with the default circuit (5 failures) and its 4
// attempts, each one failure on the circuit: a run's connection lookup died within its backoffs
// (seconds) of a gateway restart, long before its failures could open the circuit that would hold
// it back. Every failed try now counts, the in-place retries too, and the failures that open the
// circuit cost no attempt: the run waits for the gateway and succeeds once it is back.
TEST_F(PipelineTest, ARunAloneOutlastsAGatewayOutageWithTheDefaultCircuit) {
  start(data(1, 0, 20), fast());  // the default circuits: 5 failures, 30 s
  const int64_t back_at = test_clock().now_ms() + 10 * 60'000;
  std::atomic<int> refused{0};
  gateway_transport_.reset([&](const http::Request&, size_t) -> std::optional<http::Response> {
    if (test_clock().now_ms() >= back_at) return std::nullopt;
    ++refused;
    return status_response(503, R"({"error":"deploying"})");
  });
  const RunStart run = start_run("gh-inst-1", "github", {"issue"});
  drive();
  EXPECT_GE(test_clock().now_ms(), back_at);
  EXPECT_EQ(run_result(run.run_id)["success"], true)
      << store_->get(run.run_id)->last_error.value_or("-");
  EXPECT_TRUE(store_->list_dead_letters({}).items.empty());
  int failed = 0;
  for (const jobs::Attempt& a : store_->attempts(run.run_id)) failed += a.outcome == "failed";
  EXPECT_EQ(failed, 1) << "the first attempt's 3 tries; the second's opened the circuit";
  // Two attempts of 3 tries, then the probes (30 s on, then 60, 120, 240 s), of 3 tries each.
  EXPECT_LE(refused.load(), 6 + 4 * 3) << "the outage was not held back by the circuit";
  EXPECT_EQ(circuit("gateway").state, "closed");
}

// The same for a unit alone (the gateway unreachable after the fan-out: its token lookups, then
// its deliveries): it waits for the gateway rather than dying, and every event arrives once the
// gateway is back.
TEST_F(PipelineTest, AUnitAloneOutlastsAGatewayOutage) {
  start(data(1, 0, 20), fast());
  const RunStart run = start_run("gh-inst-1", "github", {"issue"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the fan-out, the gateway up
  const int64_t back_at = test_clock().now_ms() + 10 * 60'000;
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (test_clock().now_ms() >= back_at) return std::nullopt;
    throw http::TransportError("Connection refused: " + r.url);
  });
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true)
      << run_result(run.run_id).dump().substr(0, 600);
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 1u);
  int failed = 0;
  for (const jobs::Attempt& a : store_->attempts(units[0].id)) failed += a.outcome == "failed";
  EXPECT_EQ(failed, 1) << "the first attempt's 3 tries; the second's opened the circuit";
  EXPECT_EQ(run_result(run.run_id)["eventsDispatched"], 20);
  EXPECT_EQ(sandbox_->report("inst-1").gateway_by_provider["github"].unique, 20);
}

// Review: every failed try of a delivery counted on the circuit, and the failures that opened it
// cost no attempt: with a threshold within one delivery's tries (3 here, as in these tests), a
// page whose one delivery the gateway always refuses (503) opened the circuit at each attempt,
// never died, and shut the gateway for every job every 60 s. The attempt's token lookup went
// through first: a page's failed dispatch is one failure of an answering gateway, and costs the
// attempt.
TEST_F(PipelineTest, ADeliveryTheGatewayAlwaysRefusesStillEndsItsUnit) {
  PipelineOptions options = fast();
  options.gateway_circuit = {3, 60'000};
  start(data(1, 0, 1), options);  // one issue: a page of one event
  const RunStart run = start_run("gh-inst-1", "github", {"issue"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // fan-out
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find("/webhooks/") == std::string::npos) return std::nullopt;
    return status_response(503, R"({"error":"upstream timed out"})");
  });
  drive();
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(units[0].status, JobStatus::kDead);
  int failed = 0;
  for (const jobs::Attempt& a : store_->attempts(units[0].id)) failed += a.outcome == "failed";
  EXPECT_EQ(failed, PipelineOptions{}.entity_max_attempts);
  EXPECT_EQ(run_result(run.run_id)["success"], false);
  EXPECT_NE(circuit("gateway").state, "open") << "one failure an attempt, a token between";
}

// The other side of the free probe: a delivery the gateway answers 503 while the rest of its page
// goes through is that delivery's own failure, not the gateway's outage. When that page was the
// gateway's probe, its job spends the attempt (a delivery refused for ever then ends its unit)
// rather than waiting for the next probe for free.
TEST_F(PipelineTest, AProbeWhosePageMostlyWentThroughCostsItsAttempt) {
  PipelineOptions options = fast();
  options.gateway_circuit = {3, 60'000};
  start(data(1, 0, 150), options);
  const RunStart run = start_run("gh-inst-1", "github", {"issue"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // fan-out
  // The unit's first page fails (retried in place); meanwhile the gateway's circuit opened and its
  // probe fell due: the page's dispatch is the probe.
  open_the_gateway_circuit_at_the_first_fetch();
  std::mutex mutex;
  std::string poisoned;  // the first delivery id sent
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find("/webhooks/") == std::string::npos || !r.body) return std::nullopt;
    const std::string id = json::parse(*r.body)["deliveryId"];
    std::lock_guard lock(mutex);
    if (poisoned.empty()) poisoned = id;
    if (id != poisoned) return std::nullopt;
    return status_response(503, R"({"error":"unavailable"})");
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  const std::vector<jobs::Job> units = units_of(run.run_id);
  ASSERT_EQ(units.size(), 1u);
  EXPECT_EQ(circuit("gateway").state, "open") << "the probe did not fail";
  const std::vector<jobs::Attempt> attempts = store_->attempts(units[0].id);
  ASSERT_FALSE(attempts.empty());
  EXPECT_EQ(attempts.back().outcome, "failed") << attempts.back().error.value_or("-");
  EXPECT_NE(attempts.back().error.value_or("").find("503"), std::string::npos);
}

// E4: while the gateway's circuit is open, the run's connection lookup (a gateway call) waits for
// the probe like a page's dispatch does, and once it is due, the lookup is the probe. Before, the
// lookup went to the gateway known to be down: each failure burnt one of the run's attempts (it
// died within its backoffs, long before the probe) and reopened the circuit from then, pushing
// every unit's probe further away.
TEST_F(PipelineTest, AnOpenGatewayCircuitDefersTheRunsConnectionLookup) {
  PipelineOptions options = fast();
  options.gateway_circuit = {3, 60'000};
  start(data(1, 0, 150), options);
  const int64_t opened = test_clock().now_ms();
  store_->update_circuit(
      "gateway", [&](const jobs::CircuitRecord&) { return open_circuit(opened, opened + 60'000); });
  // The gateway is down until the probe falls due.
  gateway_transport_.reset([&](const http::Request&, size_t) -> std::optional<http::Response> {
    if (test_clock().now_ms() < opened + 60'000) return status_response(503, "{}");
    return std::nullopt;
  });
  test_clock().set_ms(opened + 10'000);
  RunStart run = start_run("gh-inst-1", "github", {"issue"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  EXPECT_EQ(circuit("gateway").retry_at_ms, opened + 60'000) << "the probe was pushed away";
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true)
      << store_->get(run.run_id)->last_error.value_or("-");
  int failed = 0;
  for (const jobs::Attempt& a : store_->attempts(run.run_id)) failed += a.outcome == "failed";
  EXPECT_EQ(failed, 0) << "the run burnt attempts on a gateway whose circuit was open";
  EXPECT_EQ(circuit("gateway").state, "closed");
}

// RFC 9110 Retry-After: delay-seconds or an HTTP date, as a wait from now.
TEST(GatewayRetryAfter, IsSecondsOrAnHttpDate) {
  const int64_t now = 784'111'777'000 - 30'000;  // 30 s before Sun, 06 Nov 1994 08:49:37 GMT
  EXPECT_EQ(gateway::retry_after_ms("120", now), 120'000);
  EXPECT_EQ(gateway::retry_after_ms(" 7 ", now), 7'000);
  EXPECT_EQ(gateway::retry_after_ms("0", now), 0);
  EXPECT_EQ(gateway::retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now), 30'000);
  EXPECT_EQ(gateway::retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now + 60'000), 0)
      << "a date in the past: no wait";
  EXPECT_EQ(gateway::retry_after_ms("99999999999999999999999", now), 24LL * 3600 * 1000)
      << "capped at a day, not overflowed";
  EXPECT_EQ(gateway::retry_after_ms("31536000", now), 24LL * 3600 * 1000) << "a year: a day";
  EXPECT_EQ(gateway::retry_after_ms("Fri, 01 Jan 2100 00:00:00 GMT", now), 24LL * 3600 * 1000)
      << "a date a century away: a day";
  for (const char* bad : {"", "soon", "-5", "1.5", "12s"})
    EXPECT_EQ(gateway::retry_after_ms(bad, now), 0) << bad;
}

// The gateway answering 429 asks us to slow down: the unit waits as long as its Retry-After says,
// and that is no attempt and no failure on the gateway's circuit (the gateway is up, and
// answering). Before, each 429 was retried in place, then failed the attempt and counted on the
// circuit, so a gateway shedding load for a while opened its circuit and sent units to the dead
// letters.
TEST_F(PipelineTest, AGateway429DefersTheUnitAsItsRetryAfterSaysWithoutAnAttempt) {
  RunStart run = fanned_out();
  const int64_t busy_until = test_clock().now_ms() + 120'000;
  std::atomic<int> refused{0};
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find("/webhooks/") == std::string::npos || test_clock().now_ms() >= busy_until)
      return std::nullopt;
    ++refused;
    http::Response busy = status_response(429, R"({"error":"slow down"})");
    busy.headers.emplace_back("retry-after", "120");
    return busy;
  });
  const int64_t asked = test_clock().now_ms();
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the unit: its first page meets the 429s
  const jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.status, JobStatus::kQueued);
  EXPECT_EQ(unit.run_after_ms, asked + 120'000) << "the wait the gateway asked for";
  EXPECT_EQ(unit.attempts, 0) << "a wait is no attempt";
  EXPECT_GT(refused.load(), 0);
  const PipelineMetrics m = pipeline_->metrics();
  EXPECT_EQ(m.gateway_rate_limit_waits, 1);
  EXPECT_EQ(m.transient_retries, 0) << "a 429 is not retried in place";
  EXPECT_EQ(circuit("gateway").state, "closed");
  EXPECT_EQ(circuit("gateway").failures, 0) << "a gateway that answers is up";

  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
  for (const jobs::Attempt& a : store_->attempts(units_of(run.run_id).at(0).id))
    EXPECT_NE(a.outcome, "failed") << a.error.value_or("-");
  const sandbox::DeliveryCounts gh = sandbox_->report("inst-1").gateway_by_provider["github"];
  EXPECT_EQ(gh.unique, 150) << "every issue, once";
  EXPECT_EQ(gh.unexpected, 0);
}

// The same for the unit's token lookup, and without a Retry-After: the wait is a second.
TEST_F(PipelineTest, AGateway429OnTheTokenLookupDefersTheUnitByASecond) {
  RunStart run = fanned_out();
  std::atomic<int> tokens{0};
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.ends_with("/token") && tokens++ == 0) return status_response(429, "{}");
    return std::nullopt;
  });
  const int64_t asked = test_clock().now_ms();
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  const jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.status, JobStatus::kQueued);
  EXPECT_EQ(unit.run_after_ms, asked + 1000);
  EXPECT_EQ(unit.attempts, 0);
  EXPECT_EQ(pipeline_->metrics().gateway_rate_limit_waits, 1);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
}

// The gateway's connection of gh-inst-1 (as the sandbox serves it), with `resources`.
std::optional<http::Response> connection_with(const http::Request& r, const json& resources) {
  if (!r.url.ends_with("/connections/gh-inst-1")) return std::nullopt;
  return status_response(200, json{{"id", "gh-inst-1"},
                                   {"installationId", "inst-1"},
                                   {"provider", "github"},
                                   {"orgId", "org-1"},
                                   {"status", "active"},
                                   {"resources", resources}}
                                  .dump());
}

// The gateway listing a resource twice makes one unit of it (review: two units of one dedupe key,
// the second the first's job again, and the run counted that job's pages and events twice).
TEST_F(PipelineTest, AResourceTheGatewayListsTwiceIsOneUnit) {
  start(data(1, 0, 150));
  const json repo = {{"providerResourceId", "100001"}, {"resourceName", "org-1/repo-1"}};
  gateway_transport_.reset([&](const http::Request& r, size_t) {
    return connection_with(r, json::array({repo, repo}));
  });
  RunStart run = start_run("gh-inst-1", "github", {"issue"});
  drive();
  const json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true) << result.dump(2);
  EXPECT_EQ(result["workUnits"], 1) << result.dump(2);
  EXPECT_EQ(result["eventsDispatched"], 150) << result.dump(2);
  EXPECT_EQ(units_of(run.run_id).size(), 1u);
}

// The run's own lookups likewise: a fan-out the gateway answers 429 without a Retry-After waits
// 1 s, then doubling, with no attempt, and stays "queued" meanwhile. Before (found by review), it
// waited a second each time, so every waiting run asked the shedding gateway again every second.
TEST_F(PipelineTest, AFanOutTheGatewayKeepsAnswering429IsWaitedForLongerEachTime) {
  start(data(1, 0, 150));
  // The connection's lookup answers 429 twice; then, the lookup going through, the token's does
  // (for the scope check): the count goes on (a restart at the lookup had the token's 429s wait
  // a second each again, found by review).
  std::atomic<int> busy{0};
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    const bool lookup = r.url.ends_with("/connections/gh-inst-1");
    const bool token = r.url.ends_with("/connections/gh-inst-1/token");
    if ((lookup && busy < 2) || (token && busy >= 2 && busy < 4)) {
      ++busy;
      return status_response(429, R"({"error":"slow down"})");
    }
    return std::nullopt;
  });
  RunStart run = start_run("gh-inst-1", "github", {"issue"});
  int n = 0;
  for (const int64_t wait : {1'000, 2'000, 4'000, 8'000}) {
    const int64_t asked = test_clock().now_ms();
    ASSERT_EQ(scheduler_->run_once(1), 1u);
    const std::optional<jobs::Job> job = store_->get(run.run_id);
    ASSERT_TRUE(job);
    EXPECT_EQ(job->status, JobStatus::kQueued);
    EXPECT_EQ(job->run_after_ms, asked + wait);
    EXPECT_EQ(json::parse(job->checkpoint.value_or("{}")), (json{{"gatewayBusy", ++n}}));
    EXPECT_EQ(job->attempts, 0) << "a wait is no attempt";
    EXPECT_EQ(pipeline_->get_run(run.run_id)->status, "queued");
    test_clock().advance_ms(wait);
  }
  EXPECT_EQ(pipeline_->metrics().gateway_rate_limit_waits, 4);
  EXPECT_EQ(busy, 4);
  drive();
  const json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true) << result.dump(2);
  EXPECT_EQ(result["eventsDispatched"], 150) << result.dump(2);
}

// Resources the gateway lists that name none (not an object, no id, an empty one) are left out
// and named in the run's result, which fails for them; the others are backfilled all the same.
// Before, a non-object was skipped unsaid and an empty id became a unit that could only fail (and
// the scope check, which takes the first resource, could use it).
TEST_F(PipelineTest, ResourcesThatNameNoResourceAreReportedAndTheOthersBackfilled) {
  start(data(1, 0, 150));
  const json repo = {{"providerResourceId", "100001"}, {"resourceName", "org-1/repo-1"}};
  gateway_transport_.reset([&](const http::Request& r, size_t) {
    return connection_with(r, json::array({json{{"providerResourceId", ""}}, 42, repo}));
  });
  RunStart run = start_run("gh-inst-1", "github", {"issue"});
  drive();
  const json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], false) << result.dump(2);
  EXPECT_EQ(result["workUnits"], 1) << result.dump(2);
  EXPECT_EQ(result["completed"], 1) << result.dump(2);
  EXPECT_EQ(result["failed"], 0) << result.dump(2);
  EXPECT_EQ(result["eventsDispatched"], 150) << result.dump(2);
  EXPECT_EQ(
      result["unusableResources"],
      json::array(
          {R"(resources[0]: providerResourceId is not a non-empty string (got {"providerResourceId":""}))",
           "resources[1]: not an object (got 42)"}))
      << result.dump(2);
  EXPECT_EQ(pipeline_->get_run(run.run_id)->status, "failed");
  EXPECT_EQ(sandbox_->report("inst-1").gateway_by_provider["github"].unique, 150);
}

// A gateway that keeps answering 429 without a Retry-After is waited for longer each time: 1 s,
// then doubling, until a page goes through, after which the count starts again. Before (found by
// review), the unit came back every second for as long as the gateway shed load, and each time
// fetched its page from the provider again.
TEST_F(PipelineTest, AGatewayThatKeepsAnswering429WithoutARetryAfterIsWaitedForLongerEachTime) {
  RunStart run = fanned_out();
  std::atomic<bool> busy{true};
  std::atomic<int> passes{0};  // webhook POSTs let through while busy
  gateway_transport_.reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find("/webhooks/") == std::string::npos || !busy) return std::nullopt;
    if (passes.fetch_sub(1) > 0) return std::nullopt;
    return status_response(429, R"({"error":"slow down"})");
  });
  for (const int64_t wait : {1'000, 2'000, 4'000, 8'000, 16'000}) {
    const int64_t asked = test_clock().now_ms();
    ASSERT_EQ(scheduler_->run_once(1), 1u);
    const jobs::Job unit = units_of(run.run_id).at(0);
    EXPECT_EQ(unit.status, JobStatus::kQueued);
    EXPECT_EQ(unit.run_after_ms, asked + wait);
    EXPECT_EQ(unit.attempts, 0) << "a wait is no attempt";
    test_clock().advance_ms(wait);
  }
  EXPECT_EQ(pipeline_->metrics().gateway_rate_limit_waits, 5);

  // The first page (100 issues) goes through; the second meets a 429 again: a second's wait.
  passes = 100;
  const int64_t asked = test_clock().now_ms();
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  const jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.run_after_ms, asked + 1'000) << "the count starts again after a page";
  const json checkpoint = json::parse(unit.checkpoint.value_or("{}"));
  EXPECT_EQ(checkpoint.value("pages", 0), 1) << checkpoint.dump();
  EXPECT_EQ(checkpoint.value("gatewayBusy", 0), 1) << checkpoint.dump();

  busy = false;
  drive();
  const json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true);
  const sandbox::DeliveryCounts gh = sandbox_->report("inst-1").gateway_by_provider["github"];
  EXPECT_EQ(gh.unique, 150) << "every issue, once";
  EXPECT_EQ(gh.unexpected, 0);
  for (const jobs::Attempt& a : store_->attempts(units_of(run.run_id).at(0).id))
    EXPECT_NE(a.outcome, "failed") << a.error.value_or("-");
  const json unit_result = json::parse(units_of(run.run_id).at(0).result.value_or("{}"));
  EXPECT_FALSE(unit_result.contains("gatewayBusy")) << unit_result.dump();
}

// D8: a throttled unit waits at most a minute before it asks the bucket again. Deferred until
// its next token, a throttle so slow that the token was hours (or, past the clock's range, for
// ever) away parked the unit that long, and raising the throttle (PUT /v1/rate-limits) did not
// release it: found by a review, with a run stuck "running" after the throttle was fixed.
TEST_F(PipelineTest, AThrottledUnitAsksAgainWithinAMinuteSoARaisedThrottleReleasesIt) {
  PipelineOptions options = fast();
  options.throttle_per_hour = 1e-13;  // beyond the clock's range: once "never"
  options.throttle_burst = 1;
  start(data(1, 0, 150), options);
  RunStart run = start_run("gh-inst-1", "github", {"issue"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // fan-out: its scope check takes the only token
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the unit: throttled
  const int64_t deferred_at = test_clock().now_ms();
  jobs::Job unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.status, JobStatus::kQueued);
  EXPECT_EQ(unit.run_after_ms, deferred_at + 60'000);
  EXPECT_EQ(scheduler_->run_once(1), 0u) << "the throttled unit was claimed again at once";
  // A minute on, it asks again, finds no token, and waits another minute; no attempt is spent.
  test_clock().advance_ms(60'000);
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  unit = units_of(run.run_id).at(0);
  EXPECT_EQ(unit.run_after_ms, deferred_at + 120'000);
  EXPECT_EQ(unit.attempts, 0);
  EXPECT_EQ(pipeline_->metrics().throttle_waits, 2);

  // The operator raises the throttle: the unit goes on at its next ask, and the run succeeds.
  pipeline_->update_rate_limits([](RateLimitSettings& s) {
    s.throttle_per_hour = 1e9;
    s.throttle_burst = 1e9;
  });
  test_clock().advance_ms(60'000);
  drive();
  EXPECT_EQ(run_result(run.run_id)["success"], true);
}

// PUT /v1/rate-limits takes the throttle the configuration takes: at least 1 token an hour (it
// took any positive rate, 5e-324 among them).
TEST_F(PipelineTest, ARateLimitsUpdateRefusesAThrottleBelowOneAnHour) {
  start(data(1, 0, 10), fast());
  const RateLimitSettings before = pipeline_->rate_limits();
  for (const double rate : {0.999, 5e-324, 0.0, -1.0}) {
    try {
      pipeline_->update_rate_limits([rate](RateLimitSettings& s) { s.throttle_per_hour = rate; });
      ADD_FAILURE() << rate << " was taken";
    } catch (const InvalidRequest& e) {
      EXPECT_STREQ(e.what(), "throttlePerHour: must be >= 1");
    }
  }
  EXPECT_EQ(pipeline_->rate_limits().throttle_per_hour, before.throttle_per_hour);
  EXPECT_EQ(pipeline_->update_rate_limits([](RateLimitSettings& s) { s.throttle_per_hour = 1; })
                .throttle_per_hour,
            1);
}

// Faults from seed 000's plan: provider 5xx 10%, gateway 5xx 10%, 429 bursts. The run completes
// with exact counts: every expected delivery once after dedupe, nothing unexpected.
TEST_F(PipelineTest, UnderProviderAndGatewayFaultsTheRunCompletesWithExactCounts) {
  sandbox::SandboxOptions o = data(3, 0, 400);
  o.faults.fail_rate = 0.1;
  o.faults.gateway_fail_rate = 0.1;
  o.faults.burst_429_every = 7;
  o.faults.burst_len = 2;
  o.faults.retry_after_s = 3;
  // Each delivery is tried up to 5 times in place, so that one failing for good (10^-5) -- and a
  // unit dying after 4 such attempts -- does not happen by chance: with the default 2 retries a
  // unit died in about one run in a few dozen, and the run failed.
  PipelineOptions options = fast();
  options.transient_retries = 4;
  start(o, options);
  RunStart run = start_run("gh-inst-1", "github");
  drive();
  json result = run_result(run.run_id);
  ASSERT_EQ(result["success"], true) << result.dump(2);
  sandbox::Report report = sandbox_->report("inst-1");
  EXPECT_GT(report.faults_injected["provider_5xx"], 0);
  EXPECT_GT(report.faults_injected["gateway_5xx"], 0);
  EXPECT_GT(report.faults_injected["burst_429"], 0);
  const sandbox::DeliveryCounts& gh = report.gateway_by_provider["github"];
  EXPECT_EQ(gh.missing, 0);
  EXPECT_EQ(gh.unexpected, 0);
  EXPECT_EQ(result["eventsDispatched"].get<int64_t>(), gh.unique)
      << "a page fetched again after a failed attempt is not counted twice";
  const PipelineMetrics m = pipeline_->metrics();
  EXPECT_GT(m.transient_retries, 0);
  // Every call is a page or a failure the sandbox injected (a 5xx, a 429), or the page an attempt
  // that failed (a delivery refused 5 times running, rare) had fetched, fetched again by its retry.
  int64_t failed_attempts = 0;
  for (const jobs::Job& u : units_of(run.run_id)) {
    for (const jobs::Attempt& a : store_->attempts(u.id)) failed_attempts += a.outcome == "failed";
  }
  EXPECT_GE(m.plugin_calls, m.pages);
  EXPECT_LE(m.plugin_calls, m.pages + report.faults_injected["provider_5xx"] +
                                report.faults_injected["burst_429"] + failed_attempts);
}

// A gateway that sheds load in busy periods (every 500th webhook POST starts 2 s of 429s): each
// unit that meets one waits its Retry-After and sends the page again. The run completes with exact
// counts, and no attempt of any job failed.
TEST_F(PipelineTest, UnderGatewayBusyPeriodsTheRunCompletesWithoutAFailedAttempt) {
  sandbox::SandboxOptions o = data(3, 0, 400);
  o.faults.gateway_busy_every = 500;
  o.faults.gateway_busy_ms = 2000;
  start(o);
  RunStart run = start_run("gh-inst-1", "github");
  drive();
  json result = run_result(run.run_id);
  ASSERT_EQ(result["success"], true) << result.dump(2);
  sandbox::Report report = sandbox_->report("inst-1");
  EXPECT_GT(report.faults_injected["gateway_429"], 0);
  const sandbox::DeliveryCounts& gh = report.gateway_by_provider["github"];
  EXPECT_EQ(gh.missing, 0);
  EXPECT_EQ(gh.unexpected, 0);
  EXPECT_EQ(result["eventsDispatched"].get<int64_t>(), gh.unique);
  const PipelineMetrics m = pipeline_->metrics();
  EXPECT_GT(m.gateway_rate_limit_waits, 0);
  EXPECT_EQ(m.transient_retries, 0) << "a 429 is waited out, not retried in place";
  EXPECT_LE(m.plugin_calls, m.pages + m.gateway_rate_limit_waits)
      << "a page is fetched again only after a wait";
  for (const jobs::Job& unit : units_of(run.run_id)) {
    for (const jobs::Attempt& a : store_->attempts(unit.id))
      EXPECT_NE(a.outcome, "failed") << unit.id << ": " << a.error.value_or("-");
  }
  EXPECT_EQ(circuit("gateway").failures, 0);
}

// A run that fans out again (it crashed after enqueuing, or its checkpoint was reset) adopts the
// units it already has instead of enqueuing them twice.
TEST_F(PipelineTest, ARunThatFansOutAgainAdoptsItsExistingUnits) {
  start(data(2, 0, 120));
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  ASSERT_EQ(units_of(run.run_id).size(), 6u);
  store_->set_checkpoint(run.run_id, std::nullopt, test_clock().now_ms());
  drive();
  EXPECT_EQ(units_of(run.run_id).size(), 6u) << "no unit enqueued twice";
  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true) << result.dump(2);
  EXPECT_EQ(result["workUnits"], 6);
  EXPECT_EQ(result["eventsDispatched"].get<int64_t>(),
            sandbox_->report("inst-1").gateway_by_provider["github"].unique);
}

// Review (E3): a run whose attempt ended after it enqueued its units but before it recorded its
// wait (a crash) fanned out again: it looked the connection up and checked the scopes again, and
// computed a new `since`. A check that now failed for good (here the repository answers 404)
// killed the run while its units ran on: "failed" before they were done, its installation free
// for a second run. It now waits for the units it has, in their window, asking nobody again.
TEST_F(PipelineTest, ARunThatFansOutAgainWaitsForItsUnitsWithoutCheckingAgain) {
  start(data(2, 0, 120));
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  ASSERT_EQ(units_of(run.run_id).size(), 6u);
  const int64_t since = json::parse(units_of(run.run_id)[0].payload)["since"].get<int64_t>();
  store_->set_checkpoint(run.run_id, std::nullopt, test_clock().now_ms());
  test_clock().set_ms(test_clock().now_ms() + 3'600'000);
  sandbox::Faults gone;
  gone.resource_faults = {{"org-1/repo-1", "repository", 0, 0, 404}};
  sandbox_->set_faults(gone);
  plugin_transport().reset();
  drive();
  const std::optional<jobs::Job> job = store_->get(run.run_id);
  ASSERT_EQ(job->status, JobStatus::kSucceeded) << job->last_error.value_or("");
  const json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true) << result.dump(2);
  EXPECT_EQ(result["workUnits"], 6);
  EXPECT_EQ(result["since"], since) << "the units' window, not a new one";
  EXPECT_EQ(result["eventsDispatched"].get<int64_t>(),
            sandbox_->report("inst-1").gateway_by_provider["github"].unique);
  for (const std::string& url : plugin_transport().urls()) {
    EXPECT_EQ(url.find("/repos/org-1/repo-1?"), std::string::npos) << "a scope check: " << url;
    EXPECT_FALSE(url.ends_with("/repos/org-1/repo-1")) << "a scope check: " << url;
  }
}

// Fan-in (D12): the run waits for its units up to the unit timeout. Past it, a unit still running
// and one that never started (held queued by the installation's cap) are stopped and reported
// "timed_out", each saying which it was; the run's result sums what did complete.
// A run of three units at its unit timeout: another host ran one to its end (7 events) and holds
// the next (its lease outlasts the timeout); the installation's cap of 1 kept the third queued.
// The run has just woken at the deadline, stopped the two, and waits for the held one to stop.
struct PastTheTimeout {
  RunStart run;
  jobs::Claimed done;
  jobs::Claimed held;
};

class UnitTimeoutTest : public PipelineTest {
 protected:
  PastTheTimeout past_the_unit_timeout() {
    PipelineOptions options = fast();
    options.entity_caps = {1, 30};
    start(data(1, 0, 120), options);
    PastTheTimeout s;
    s.run = start_run("gh-inst-1", "github");
    EXPECT_EQ(scheduler_->run_once(1), 1u);  // fans out three units and waits for them
    EXPECT_EQ(units_of(s.run.run_id).size(), 3u);
    const int64_t t0 = test_clock().now_ms();
    const int64_t long_lease = options.unit_timeout_ms * 2;
    jobs::ClaimRequest claim{"another-host", 10, t0, long_lease, {kEntityKind}};
    std::vector<jobs::Claimed> done = store_->claim(claim);
    EXPECT_EQ(done.size(), 1u);
    store_->complete(done.at(0).job.id, done.at(0).lease_token,
                     R"({"pages":2,"eventsProduced":7,"eventsDispatched":7})", t0);
    std::vector<jobs::Claimed> held = store_->claim(claim);
    EXPECT_EQ(held.size(), 1u);
    s.done = done.at(0);
    s.held = held.at(0);

    test_clock().advance_ms(options.unit_timeout_ms + 1);
    EXPECT_EQ(store_->sweep(test_clock().now_ms()).parents_woken, 1);
    EXPECT_EQ(scheduler_->run_once(1), 1u);  // the run: the queued unit is still capped
    EXPECT_FALSE(run_result(s.run.run_id).is_object()) << "done while a unit still runs";
    EXPECT_EQ(store_->get(s.run.run_id)->status, JobStatus::kWaiting);
    EXPECT_TRUE(store_->get(s.held.job.id)->cancel_requested);
    return s;
  }
};

// E3: a run is never done before its units. Past the unit timeout, a unit still running is asked
// to stop and the run waits for it; one that ends its last page meanwhile is reported as what it
// is, succeeded, so the run's result and its view agree. Before, the run completed at once,
// reporting it timed out, and the view then counted it succeeded.
TEST_F(UnitTimeoutTest, ARunWaitsForTheUnitsItStopsAndReportsHowTheyEnded) {
  const PastTheTimeout s = past_the_unit_timeout();
  store_->complete(s.held.job.id, s.held.lease_token,
                   R"({"pages":3,"eventsProduced":5,"eventsDispatched":5})", test_clock().now_ms());
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // woken by its last unit's end
  const json result = run_result(s.run.run_id);
  ASSERT_TRUE(result.is_object()) << "the run did not finish";
  EXPECT_EQ(result["completed"], 2) << result.dump(2);
  EXPECT_EQ(result["failed"], 1) << result.dump(2);
  EXPECT_EQ(result["eventsDispatched"], 12) << result.dump(2);
  for (const json& r : result["results"]) {
    EXPECT_EQ(r["status"], r["jobId"] == s.held.job.id || r["jobId"] == s.done.job.id ? "succeeded"
                                                                                      : "timed_out")
        << result.dump(2);
  }
  const std::optional<RunView> view = pipeline_->get_run(s.run.run_id, false);
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(view->status, "failed");
  EXPECT_EQ(view->units_done, 3);
  EXPECT_EQ(view->units_failed, 1);
  EXPECT_EQ(view->events_dispatched, 12);
}

// A unit that does not stop (its host stuck in a plugin call, or gone with a long lease) holds
// the run for the stop wait (10 min) at most: then the run reports it timed out all the same.
TEST_F(UnitTimeoutTest, UnitsNotDoneByTheUnitTimeoutAreStoppedAndReportedTimedOut) {
  const PastTheTimeout s = past_the_unit_timeout();
  const RunStart& run = s.run;
  const std::vector<jobs::Claimed> done = {s.done};
  const std::vector<jobs::Claimed> held = {s.held};
  test_clock().advance_ms(10 * 60 * 1000 + 1);
  ASSERT_EQ(store_->sweep(test_clock().now_ms()).parents_woken, 1);
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  const json result = run_result(run.run_id);
  ASSERT_TRUE(result.is_object()) << "the run did not finish";
  EXPECT_EQ(result["success"], false) << result.dump(2);
  EXPECT_EQ(result["completed"], 1) << result.dump(2);
  EXPECT_EQ(result["failed"], 2) << result.dump(2);
  EXPECT_EQ(result["eventsDispatched"], 7) << result.dump(2);
  std::map<jobs::JobId, json> by_unit;
  for (const json& r : result["results"]) by_unit[r["jobId"].get<jobs::JobId>()] = r;
  ASSERT_EQ(by_unit.size(), 3u) << result.dump(2);
  EXPECT_EQ(by_unit[done[0].job.id]["status"], "succeeded");
  EXPECT_EQ(by_unit[held[0].job.id]["status"], "timed_out");
  EXPECT_EQ(by_unit[held[0].job.id]["error"], "timeout: the unit did not complete within 14400 s");
  for (const jobs::Job& unit : units_of(run.run_id)) {
    if (unit.id == done[0].job.id || unit.id == held[0].job.id) continue;
    EXPECT_EQ(by_unit[unit.id]["status"], "timed_out");
    EXPECT_EQ(by_unit[unit.id]["error"],
              "timeout: the unit did not start within 14400 s (it was still queued: caps, "
              "throttling or busy workers held it)");
  }
  // Both are stopped: the held one at its next heartbeat, the queued one at once.
  for (const jobs::Job& unit : units_of(run.run_id)) {
    if (unit.id == done[0].job.id) continue;
    EXPECT_TRUE(unit.status == JobStatus::kCancelled || unit.cancel_requested)
        << unit.id << " " << jobs::to_string(unit.status);
  }
}

// A run that died and that an operator retried resumed with the unit deadline it died with, long
// past, and stopped its units as "timed out" at once, those still active then. Each retry of
// its dead letter now gives its units a new unit timeout.
TEST_F(PipelineTest, ARetriedDeadRunGivesItsUnitsANewTimeout) {
  start(data(1, 0, 120));
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // fans out and waits for its units
  ASSERT_EQ(units_of(run.run_id).size(), 3u);
  // Past the unit timeout, no unit has run. The sweep wakes the run, which dies before it gathers
  // (its host crashing for good, say; FATAL here for brevity).
  test_clock().advance_ms(fast().unit_timeout_ms + 1);
  const int64_t now = test_clock().now_ms();
  ASSERT_EQ(store_->sweep(now).parents_woken, 1);
  jobs::ClaimRequest claim{"another-host", 1, now, 30'000, {kRunKind}};
  std::vector<jobs::Claimed> claimed = store_->claim(claim);
  ASSERT_EQ(claimed.size(), 1u);
  ASSERT_EQ(claimed[0].job.id, run.run_id);
  jobs::Failure crash;
  crash.error = "the host crashed";
  crash.fatal = true;
  ASSERT_EQ(store_->fail(run.run_id, claimed[0].lease_token, crash, now), JobStatus::kDead);

  // The operator retries the run while another host's workers hold its units (started, not
  // done), and the run gathers first; then that host hands the units back (a drain).
  ASSERT_EQ(store_->retry_dead_letters({}, 10, now), 1);
  jobs::ClaimRequest units{"another-host", 10, now, 30'000, {kEntityKind}};
  std::vector<jobs::Claimed> held = store_->claim(units);
  ASSERT_EQ(held.size(), 3u);
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the run, the only job left to claim
  for (const jobs::Claimed& unit : held) store_->release(unit.job.id, unit.lease_token, now);
  drive();
  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true) << result.dump(2);
  EXPECT_EQ(result["completed"], 3) << result.dump(2);
}

// Bad input, found by review 2: a run checkpoint that has "units" but not an array of unit
// objects with a jobId (a bad repair written to the store directly, a bug, an older build) is as
// corrupt as one without "units": the run rebuilds the list from its children. It took the
// garbage for the list instead: {"units": 5} read as one unit of job 0 ("missing"), the run
// finished at once as failed and left its six units running with no run waiting for them.
TEST_F(PipelineTest, ARunWhoseCheckpointUnitsAreCorruptRebuildsThemFromItsChildren) {
  start(data(2, 0, 120));
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  ASSERT_EQ(units_of(run.run_id).size(), 6u);
  store_->set_checkpoint(run.run_id, std::string(R"({"units":5})"), test_clock().now_ms());
  drive();
  EXPECT_EQ(units_of(run.run_id).size(), 6u) << "no unit enqueued twice";
  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true) << result.dump(2);
  EXPECT_EQ(result["workUnits"], 6);
}

TEST_F(PipelineTest, ARunWhoseCheckpointUnitsLackJobIdsRebuildsThemFromItsChildren) {
  start(data(2, 0, 120));
  RunStart run = start_run("gh-inst-1", "github");
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  ASSERT_EQ(units_of(run.run_id).size(), 6u);
  store_->set_checkpoint(run.run_id, std::string(R"({"units":[{"jobId":"x"}]})"),
                         test_clock().now_ms());
  drive();
  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true) << result.dump(2);
  EXPECT_EQ(result["workUnits"], 6);
}

// Tenancy (D7): a huge installation and a small one started together, on a threaded scheduler.
// Per-installation caps keep the huge one to 5 workers, so the small one finishes while the huge
// one is still going.
TEST_F(PipelineTest, ASmallInstallationFinishesWithoutWaitingForAHugeOne) {
  sandbox::SandboxOptions o = data(2, 0, 300, 2);
  o.first_installation_repos = 20;  // gh-inst-1: 60 units; gh-inst-2: 6 units
  PipelineOptions options = fast();
  options.throttle_per_hour = 1e9;  // the fake clock stands still: no throttle waits here
  options.throttle_burst = 1e9;
  start(o, options);
  std::unique_ptr<jobs::Scheduler> scheduler = threaded_scheduler("tenancy", 8);
  jobs::Scheduler& threaded = *scheduler;
  RunStart huge = start_run("gh-inst-1", "github");
  RunStart small = start_run("gh-inst-2", "github");
  threaded.start();

  auto finished = [&](jobs::JobId run) {
    std::string status = pipeline_->get_run(run, false)->status;
    return status == "succeeded" || status == "failed";
  };
  auto wait_until = [&](const std::function<bool()>& done) {
    for (int i = 0; i < 6000 && !done(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return done();
  };
  ASSERT_TRUE(wait_until([&] { return finished(small.run_id); }));
  RunView huge_then = *pipeline_->get_run(huge.run_id, false);
  EXPECT_LT(huge_then.units_done, 60) << "the small run did not wait for the huge one";
  ASSERT_TRUE(wait_until([&] { return finished(huge.run_id); }));
  threaded.drain(std::chrono::milliseconds(5000));

  EXPECT_EQ(pipeline_->get_run(small.run_id)->status, "succeeded");
  EXPECT_EQ(pipeline_->get_run(huge.run_id)->status, "succeeded");
  EXPECT_EQ(pipeline_->get_run(huge.run_id)->units_total, 60);
  EXPECT_LE(store_->max_running_seen(kEntityKind, "gh-inst-1"), 5);
  EXPECT_LE(store_->max_running_seen(kEntityKind, "gh-inst-2"), 5);
  EXPECT_LE(store_->max_running_seen(kEntityKind, ""), 30);
  EXPECT_GE(store_->max_running_seen(kEntityKind, "gh-inst-2"), 1);
  sandbox::Report report = sandbox_->report();
  EXPECT_EQ(report.gateway.missing, 0);
  EXPECT_EQ(report.gateway.unexpected, 0);
}

// Bad input: a unit whose checkpoint is not JSON (an operator's bad repair) starts over from its
// first page with an error in the log; the gateway dedupes what it had already received.
TEST_F(PipelineTest, AUnitWithACorruptCheckpointStartsOverAndCompletes) {
  PipelineOptions options = fast();
  options.transient_retries = 0;
  start(data(1, 0, 300), options);
  RunStart run = start_run("gh-inst-1", "github", {"release"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  jobs::JobId unit = units_of(run.run_id).at(0).id;
  int lists = 0;
  plugin_transport().reset([&](const http::Request& r, size_t) -> std::optional<http::Response> {
    if (r.url.find("/releases") == std::string::npos || ++lists != 2) return std::nullopt;
    return status_response(500, R"({"message":"Server Error"})");
  });
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // page 1 delivered and checkpointed, page 2 failed
  ASSERT_EQ(store_->get(unit)->status, JobStatus::kQueued);
  ASSERT_THAT(store_->get(unit)->checkpoint.value_or(""), HasSubstr("cursor"));
  store_->set_checkpoint(unit, std::string("{not json"), test_clock().now_ms());
  drive();
  EXPECT_EQ(store_->get(unit)->status, JobStatus::kSucceeded);
  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true);
  EXPECT_EQ(result["eventsDispatched"], 300) << "counted from the new start";
  sandbox::Report report = sandbox_->report("inst-1");
  EXPECT_EQ(report.gateway.duplicates, 100) << "page 1 was sent again";
  EXPECT_EQ(report.gateway_by_provider["github"].unique, 300);
}

// Bad input: a checkpoint whose cursor is not a string (an operator's `{"cursor": 5}`) is as
// corrupt as one that is not JSON: the unit starts over with its counts from zero, instead of
// starting over silently while keeping the counts of the pages it sends again.
TEST_F(PipelineTest, AUnitWhoseCheckpointCursorIsNotAStringStartsOverWithCountsFromZero) {
  start(data(1, 0, 300));
  RunStart run = start_run("gh-inst-1", "github", {"release"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  jobs::JobId unit = units_of(run.run_id).at(0).id;
  store_->set_checkpoint(
      unit, std::string(R"({"cursor":5,"pages":1,"eventsProduced":100,"eventsDispatched":100})"),
      test_clock().now_ms());
  drive();
  EXPECT_EQ(store_->get(unit)->status, JobStatus::kSucceeded);
  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true);
  EXPECT_EQ(result["pages"], 3) << "every page was fetched again";
  EXPECT_EQ(result["eventsDispatched"], 300) << "counted from the new start";
  EXPECT_EQ(sandbox_->report("inst-1").gateway_by_provider["github"].unique, 300);
}

// Runs one GitHub issue unit whose pages are empty and link to `next_url(url)`; returns the unit
// after 20 scheduler steps.
jobs::Job PipelineTest::unit_linking(std::function<std::string(const std::string&)> next_url) {
  start(data(1, 0, 10));
  RunStart run = start_run("gh-inst-1", "github", {"issue"});
  EXPECT_EQ(scheduler_->run_once(1), 1u);  // the run fans out
  jobs::JobId unit = units_of(run.run_id).at(0).id;
  plugin_transport().reset(
      [next_url](const http::Request& r, size_t) -> std::optional<http::Response> {
        if (r.url.find("/issues") == std::string::npos) return std::nullopt;
        http::Response page = status_response(200, "[]");
        page.headers.emplace_back("link", "<" + next_url(r.url) + ">; rel=\"next\"");
        return page;
      });
  drive(20);
  return store_->get(unit).value();
}

// Bad input from a plugin: a page whose next cursor is the very cursor it was fetched with would
// be fetched again forever (each pass checkpointing, never ending). The unit fails at once
// (FATAL) with an error naming the problem.
TEST_F(PipelineTest, ACursorThatDoesNotAdvanceFailsTheUnitInsteadOfLoopingForever) {
  jobs::Job job = unit_linking([](const std::string& url) { return url; });
  EXPECT_EQ(job.status, JobStatus::kDead);
  EXPECT_THAT(job.last_error.value_or(""), HasSubstr("already fetched"));
  EXPECT_EQ(requests_to("/issues"), 2) << "the repeated cursor was not followed again";
}

// A cursor holding the unit's access token (a provider putting it in its next-page links) was
// stored in the checkpoint, which the admin API shows. The unit fails (FATAL) instead, naming
// why, and the token is nowhere in the job.
TEST_F(PipelineTest, ACursorHoldingTheAccessTokenFailsTheUnitAndIsNeverStored) {
  start(data(1, 0, 10));
  RunStart run = start_run("gh-inst-1", "github", {"issue"});
  ASSERT_EQ(scheduler_->run_once(1), 1u);  // the run fans out
  const jobs::JobId unit = units_of(run.run_id).at(0).id;
  std::string token;
  plugin_transport().reset(
      [&token](const http::Request& r, size_t) -> std::optional<http::Response> {
        if (r.url.find("/issues") == std::string::npos) return std::nullopt;
        for (const auto& [name, value] : r.headers) {  // "Bearer <token>" or "token <token>"
          if (http::to_lower(name) == "authorization") token = value.substr(value.find(' ') + 1);
        }
        http::Response page = status_response(200, "[]");
        page.headers.emplace_back(
            "link", "<" + r.url + "&page=2&access_token=" + token + ">; rel=\"next\"");
        return page;
      });
  drive(20);
  const jobs::Job job = store_->get(unit).value();
  ASSERT_GE(token.size(), 6u) << "the provider saw the unit's token";
  EXPECT_EQ(job.status, JobStatus::kDead);
  EXPECT_THAT(job.last_error.value_or(""), HasSubstr("holds the unit's access token"));
  EXPECT_EQ(requests_to("/issues"), 1) << "the cursor was not followed";
  for (const std::optional<std::string>& text : {job.checkpoint, job.last_error, job.result}) {
    EXPECT_EQ(text.value_or("").find(token), std::string::npos) << *text;
  }
  for (const jobs::Attempt& a : store_->attempts(unit)) {
    EXPECT_EQ(a.error.value_or("").find(token), std::string::npos) << *a.error;
  }
}

// The same for a cycle: pages A -> B -> A. Only a cursor that comes back is refused; every page
// before it was fetched once.
TEST_F(PipelineTest, ACursorCycleFailsTheUnitInsteadOfLoopingForever) {
  // The first page links to "&cycle=1", which links to "&cycle=2", which links back to 1.
  jobs::Job job = unit_linking([](const std::string& url) {
    const size_t at = url.find("&cycle=");
    const bool one = at != std::string::npos && url.substr(at) == "&cycle=1";
    return url.substr(0, at) + (one ? "&cycle=2" : "&cycle=1");
  });
  EXPECT_EQ(job.status, JobStatus::kDead);
  EXPECT_THAT(job.last_error.value_or(""), HasSubstr("already fetched"));
  EXPECT_EQ(requests_to("/issues"), 3) << "first page, cycle=1, cycle=2; cycle=1 not again";
}

// Bad input: a unit whose payload is not JSON fails at once (FATAL), named in the error.
TEST_F(PipelineTest, AUnitWhosePayloadIsNotJsonFailsFatallyWithAClearError) {
  start(data(1, 0, 10));
  jobs::JobSpec spec;
  spec.kind = kEntityKind;
  spec.payload = "not json";
  jobs::JobId id = store_->enqueue(spec, test_clock().now_ms()).id;
  drive();
  std::optional<jobs::Job> job = store_->get(id);
  EXPECT_EQ(job->status, JobStatus::kDead);
  EXPECT_EQ(job->attempts, 1);
  EXPECT_THAT(job->last_error.value_or(""), HasSubstr("entity payload is not a JSON object"));
}

// D10 and request validation: errors name the field; a second run for an installation gets the
// active one.
TEST_F(PipelineTest, RunRequestsAreValidatedAndAtMostOneRunIsActivePerInstallation) {
  start();
  auto field_of = [&](RunRequest r) {
    try {
      pipeline_->start_run(r);
    } catch (const InvalidRequest& e) {
      return e.field();
    }
    return std::string("(accepted)");
  };
  RunRequest ok{"gh-inst-1", "github", std::nullopt, 30, {}};
  EXPECT_EQ(field_of({"", "github", std::nullopt, 30, {}}), "installationId");
  EXPECT_EQ(field_of({"gh-inst-1", "gitlab", std::nullopt, 30, {}}), "provider");
  EXPECT_EQ(field_of({"gh-inst-1", "github", std::nullopt, 14, {}}), "depth");
  EXPECT_EQ(field_of({"gh-inst-1", "github", std::nullopt, 30, {"commit"}}), "entityTypes");
  EXPECT_EQ(field_of({"gh-inst-1", "github", std::nullopt, 30, {"issue", "issue"}}), "entityTypes");
  RunStart a = pipeline_->start_run(ok);
  RunStart b = pipeline_->start_run(ok);
  EXPECT_TRUE(a.created);
  EXPECT_FALSE(b.created);
  EXPECT_EQ(a.run_id, b.run_id);
  EXPECT_TRUE(pipeline_->start_run({"vc-inst-1", "vercel", std::nullopt, 7, {}}).created);
}

// E1: an unknown connection ends the run at once (FATAL, one attempt, a dead letter).
TEST_F(PipelineTest, AnUnknownConnectionFailsTheRunWithoutRetries) {
  start();
  RunStart run = start_run("gh-inst-9", "github");
  drive();
  std::optional<jobs::Job> job = store_->get(run.run_id);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->status, JobStatus::kDead);
  EXPECT_EQ(job->attempts, 1);
  EXPECT_THAT(job->last_error.value_or(""), HasSubstr("connection not found: gh-inst-9"));
  EXPECT_EQ(pipeline_->get_run(run.run_id)->status, "failed");
}

// E1: a connection without resources is a success with zero counts.
TEST_F(PipelineTest, ZeroWorkUnitsIsASuccessWithZeroCounts) {
  start(data(0, 1, 250));
  RunStart run = start_run("gh-inst-1", "github");
  drive();
  json result = run_result(run.run_id);
  EXPECT_EQ(result["success"], true);
  EXPECT_EQ(result["workUnits"], 0);
  EXPECT_EQ(result["eventsDispatched"], 0);
  EXPECT_TRUE(units_of(run.run_id).empty());
  EXPECT_EQ(pipeline_->get_run(run.run_id)->status, "succeeded");
}

// Seed 004's dry run: the units and an estimate, nothing enqueued.
TEST_F(PipelineTest, PreviewListsTheUnitsWithoutEnqueuing) {
  start(data(2, 1, 250));
  Preview p = pipeline_->preview({"gh-inst-1", "github", std::nullopt, 7, {"issue", "release"}});
  EXPECT_EQ(p.units.size(), 4u);
  EXPECT_EQ(p.since_ms, kStart - 7 * 24 * 3600 * 1000LL);
  EXPECT_GE(p.estimated_requests, 4);
  EXPECT_TRUE(store_->list({}).jobs.empty());
}

// Listing: newest first, filtered by status, paged.
TEST_F(PipelineTest, RunsAreListedNewestFirstWithAStatusFilter) {
  start(data(1, 1, 10, 3));
  std::vector<jobs::JobId> ids;
  for (const char* c : {"gh-inst-1", "gh-inst-2", "gh-inst-3"})
    ids.push_back(start_run(c, "github", {"release"}).run_id);
  ASSERT_EQ(scheduler_->run_once(1), 1u);
  drive();
  RunPage all = pipeline_->list_runs({});
  ASSERT_EQ(all.runs.size(), 3u);
  EXPECT_EQ(all.runs[0].id, ids[2]);
  EXPECT_EQ(all.runs[2].id, ids[0]);
  RunPage page = pipeline_->list_runs({std::nullopt, std::nullopt, std::nullopt, 2});
  ASSERT_EQ(page.runs.size(), 2u);
  ASSERT_TRUE(page.next_before);
  RunPage rest = pipeline_->list_runs({std::nullopt, std::nullopt, page.next_before, 2});
  ASSERT_EQ(rest.runs.size(), 1u);
  EXPECT_EQ(rest.runs[0].id, ids[0]);
  EXPECT_FALSE(rest.next_before);
  // A page that the last runs fill exactly is the last page too (review: it pointed at an empty
  // one, and `backhaul run list` printed "more: --before N" with nothing more).
  RunPage exact = pipeline_->list_runs({std::nullopt, std::nullopt, std::nullopt, 3});
  EXPECT_EQ(exact.runs.size(), 3u);
  EXPECT_FALSE(exact.next_before) << *exact.next_before;
  RunPage last_two = pipeline_->list_runs({std::nullopt, std::nullopt, page.runs[0].id, 2});
  EXPECT_EQ(last_two.runs.size(), 2u);
  EXPECT_FALSE(last_two.next_before) << *last_two.next_before;
  EXPECT_EQ(pipeline_->list_runs({"succeeded", std::nullopt, std::nullopt, 50}).runs.size(), 3u);
  EXPECT_TRUE(pipeline_->list_runs({"running", std::nullopt, std::nullopt, 50}).runs.empty());
  EXPECT_THROW(pipeline_->list_runs({"done", std::nullopt, std::nullopt, 50}), InvalidRequest);
}

}  // namespace
}  // namespace backhaul::pipeline
