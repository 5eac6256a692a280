// The backfill pipeline (SPEC E1-E4): a run job (the orchestrator) that fans a run out into one
// entity job per (resource x entity type) work unit, waits for them, and sums their real counts;
// and the entity job (the worker) that pages one unit through its connector, dispatches every
// event to the gateway, and checkpoints after every page. Both are Scheduler handlers; this class
// also offers what the admin API needs (start, preview, read, list, cancel runs).
//
// Job model: kind "backfill.run" (payload = the RunRequest, concurrency key = installation id,
// dedupe key = installation id: at most one active run per installation, D10) and kind
// "backfill.entity" (payload = the unit, parent = the run, concurrency key = installation id).
// Tokens never enter a payload, a checkpoint, a result or a log line.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/common/clock.h"
#include "core/common/errors.h"
#include "core/gateway/gateway_client.h"
#include "core/jobs/circuit_breaker.h"
#include "core/jobs/job_store.h"
#include "core/jobs/scheduler.h"
#include "core/plugins/plugin.h"

namespace backhaul::pipeline {

inline constexpr const char* kRunKind = "backfill.run";
inline constexpr const char* kEntityKind = "backfill.entity";

struct PipelineOptions {
  int64_t unit_timeout_ms = 4LL * 3600 * 1000;  // a unit not done by then fails the run's wait
  int run_max_attempts = 4;                     // retries: 3 (seed 000)
  int entity_max_attempts = 4;
  double throttle_per_hour = 4000;  // provider requests per installation (D8)
  double throttle_burst = 100;      // bucket capacity
  double rate_limit_floor = 0.10;   // sleep until reset when remaining < floor * limit (E2)
  // A transient error (provider RETRYABLE, gateway 5xx/429/unreachable) is retried in place this
  // many times per page or delivery, after transient_retry_ms * 2^n of real waiting (at most
  // kMaxInPlaceWaitMs; a drain, a cancel or a lost lease ends it), before it fails the attempt
  // (whose retry resumes from the checkpoint with the job's backoff).
  int transient_retries = 2;
  int dispatch_concurrency = 4;  // slices of a page sent side by side, each pipelined
  int64_t transient_retry_ms = 100;
  jobs::Caps entity_caps{5, 30};  // per installation, global (D7)
  jobs::Caps run_caps{1, 10};
  jobs::CircuitPolicy provider_circuit;  // one breaker per provider API: "provider:<id>"
  jobs::CircuitPolicy gateway_circuit;   // "gateway"
  // A run's result lists its units in at most this many bytes; the lines past it are counted as
  // resultsOmitted. The default keeps a result under what a store keeps (jobs::kMaxTextBytes).
  size_t result_lines_bytes = (16u << 20) - (128u << 10);
  // The most bytes a run's checkpoint may take listing its units while it waits for them: what a
  // store keeps (jobs::kMaxTextBytes). A run with more units is refused at its fan-out.
  size_t run_checkpoint_bytes = (16u << 20) - 1;
};

// What POST /v1/runs takes. installation_id is the gateway connection id (the tenant), at most
// kMaxInstallationIdBytes long; org_id, stamped on every unit and event, at most kMaxOrgIdBytes.
inline constexpr size_t kMaxInstallationIdBytes = 255;
inline constexpr size_t kMaxOrgIdBytes = 255;
struct RunRequest {
  std::string installation_id;
  std::string provider;
  std::optional<std::string> org_id;      // default: the connection's
  int depth_days = 30;                    // 7, 30 or 90
  std::vector<std::string> entity_types;  // empty: the connector's defaults
};

// A request the API must refuse (400): the message names the field and the reason.
class InvalidRequest : public Error {
 public:
  InvalidRequest(std::string field, const std::string& message)
      : Error(message), field_(std::move(field)) {}
  const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

struct RunStart {
  jobs::JobId run_id = 0;
  bool created = false;  // false: an active run for this installation exists; run_id is it
};

struct PreviewUnit {
  std::string resource_id;
  std::optional<std::string> resource_name;
  std::string entity_type;
};
// The dry run (seed 004): what a run would do, without enqueuing anything.
struct Preview {
  std::string installation_id;
  std::string provider;
  std::string org_id;
  int64_t since_ms = 0;
  std::vector<PreviewUnit> units;
  int64_t estimated_requests = 0;  // at least one page request per unit
};

// Progress of one work unit, from its entity job and its checkpoint.
struct UnitProgress {
  jobs::JobId job_id = 0;
  std::string resource_id;
  std::optional<std::string> resource_name;
  std::string entity_type;
  std::string status;  // the job status: queued, running, succeeded, dead, cancelled, ...
  int attempts = 0;
  int64_t pages = 0;
  int64_t events_produced = 0;
  int64_t events_dispatched = 0;
  int64_t rate_limit_waits = 0;
  std::optional<std::string> error;
};

struct RunView {
  jobs::JobId id = 0;
  RunRequest request;
  // queued | running (includes waiting for units, and a finished run whose failed units are being
  // replayed from the dead letters) | succeeded (every unit succeeded, replays included) | failed
  // (finished; some unit failed, or the run died) | cancelled. Totals are live sums over units.
  std::string status;
  std::optional<std::string> error;
  int64_t since_ms = 0;  // once computed
  int64_t created_ms = 0;
  int64_t started_ms = 0;
  int64_t finished_ms = 0;
  int units_total = 0;
  int unusable_resources =
      0;               // reasons in the result's unusableResources (the run failed for them)
  int units_done = 0;  // terminal units
  int units_failed = 0;
  int64_t pages = 0;
  int64_t events_produced = 0;
  int64_t events_dispatched = 0;
  int64_t rate_limit_waits = 0;
  std::vector<UnitProgress> units;  // only when asked for
};

struct RunQuery {
  std::optional<std::string> status;  // a RunView status
  std::optional<std::string> installation_id;
  std::optional<jobs::JobId> before_id;
  size_t limit = 50;
};
struct RunPage {
  std::vector<RunView> runs;  // newest first, without units
  std::optional<jobs::JobId> next_before;
};

// The rate-limit settings of this daemon (GET/PUT /v1/rate-limits). Caps are written to the store,
// so they hold for every host; throttle and floor apply to this host's workers.
struct RateLimitSettings {
  double throttle_per_hour = 0;
  double throttle_burst = 0;
  double rate_limit_floor = 0;
  jobs::Caps entity_caps;
  jobs::Caps run_caps;
};

// Checks a checkpoint an operator wants to store for a job of `kind` (PUT
// /v1/jobs/{id}/checkpoint): one the run or entity handler could not resume from (a cursor that is
// not a string, counts that are not counts, units that are not a list of jobs) throws
// InvalidRequest naming the field ("checkpoint.cursor"). Other kinds are not checked.
void check_checkpoint(const std::string& kind, const std::string& checkpoint_json);

// The connectors the pipeline may use, by provider id ("github", "vercel"). Lookups are
// [thread-safe]; the connectors must outlive the Pipeline.
using ConnectorLookup = std::function<const plugins::Connector*(const std::string& provider)>;

// Counters for /metrics. [thread-safe]
struct PipelineMetrics {
  int64_t pages = 0;
  int64_t events_dispatched = 0;
  int64_t events_duplicate = 0;
  int64_t rate_limit_waits = 0;
  int64_t gateway_rate_limit_waits = 0;  // jobs deferred because the gateway answered 429
  int64_t throttle_waits = 0;
  int64_t circuit_deferrals = 0;
  int64_t token_refreshes = 0;
  int64_t transient_retries = 0;
  int64_t plugin_calls = 0;
  int64_t plugin_call_us = 0;  // sum of fetch_page wall time
};

// The real wait before the `retry`-th retry in place (from 0) of a transient error:
// transient_retry_ms * 2^retry, or what the error's answer asked for (`asked_ms`, its Retry-After,
// taken up to 2 s) when longer; at most kMaxInPlaceWaitMs, which holds a worker.
inline constexpr int64_t kMaxInPlaceWaitMs = 30'000;
int64_t in_place_wait_ms(const PipelineOptions& o, int retry, int64_t asked_ms);

// What a page adds to a unit's eventsProduced: the plugin's raw_count (items the provider
// returned, which the ABI says is at least the page's events), at least `events` and at most a
// billion, so that a third-party plugin's UINT64_MAX neither makes the count negative nor
// overflows the sums.
inline constexpr uint64_t kMaxRawCount = 1'000'000'000;
int64_t produced_by_page(uint64_t raw_count, size_t events);

class Pipeline {
 public:
  // Every reference must outlive the Pipeline.
  Pipeline(jobs::JobStore& store, const Clock& clock, const gateway::GatewayClient& gateway,
           ConnectorLookup connectors, PipelineOptions options = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // Writes the caps of both kinds to the store (shared by every host).
  void apply_caps();
  // Registers the run and entity handlers.
  void register_handlers(jobs::Scheduler& scheduler);

  // Validates (provider has a connector, depth in {7,30,90}, entity types supported, ids
  // non-empty) and enqueues, or returns the active run. Throws InvalidRequest; and
  // jobs::InvalidTransition when the active run is being cancelled (it would run nothing).
  RunStart start_run(const RunRequest& request);
  // Validates as start_run, then asks the gateway for the connection. Throws InvalidRequest,
  // gateway::GatewayError.
  Preview preview(const RunRequest& request);
  std::optional<RunView> get_run(jobs::JobId run_id, bool with_units = true);
  RunPage list_runs(const RunQuery& query);
  // The run and its units. nullopt when there is no such run.
  std::optional<jobs::CancelOutcome> cancel_run(jobs::JobId run_id);
  // Every active run and unit of an installation; returns how many jobs were cancelled.
  int cancel_installation(const std::string& installation_id);

  // The settings in force: this daemon's throttle and floor, and the caps in the store (shared by
  // every host on it, whoever set them last).
  RateLimitSettings rate_limits() const;
  // Changes what `edit` changes of the settings in force, one change at a time, and returns the
  // result. Caps are written to the store only for a kind whose caps `edit` changed: a change of
  // the throttle does not put back caps another host has set since. Throws InvalidRequest naming
  // the field (negative numbers, floor outside [0, 1]), and what `edit` throws, changing nothing.
  RateLimitSettings update_rate_limits(const std::function<void(RateLimitSettings&)>& edit);

  PipelineMetrics metrics() const;
  PipelineOptions options() const;

 private:
  RunView live_view(const jobs::Job& run, bool with_units);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace backhaul::pipeline
