#include "core/pipeline/pipeline.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "core/common/logging.h"
#include "core/common/redact.h"
#include "core/common/utf8.h"

namespace backhaul::pipeline {
namespace {

using jobs::JobContext;
using jobs::JobFailure;
using jobs::JobId;
using jobs::JobStatus;
using jobs::Outcome;
using json = nlohmann::json;

constexpr int64_t kDayMs = 24LL * 3600 * 1000;
constexpr int64_t kCircuitRefreshMs = 1000;     // how stale this host's view of a circuit may be
constexpr int64_t kThrottleRecheckMs = 60'000;  // the longest a throttled unit waits unasked
// The longest Retry-After of a gateway 5xx that a delivery is retried in place after (the worker
// waits it out); one asking for more fails the attempt, whose retry waits at least that long.
constexpr int64_t kInPlaceRetryAfterMs = 2'000;
// How long a run past its unit timeout waits for the units it stopped to stop (each at its next
// page boundary) before it reports them timed out all the same.
constexpr int64_t kStopWaitMs = 10 * 60 * 1000;
constexpr const char* kGatewayCircuit = "gateway";

// How long a unit waits out a provider's rate limit: what the plugin said, at least a second; a
// minute when it could not say (status.h: 0 is unknown), as GitHub asks of a limit without
// retry-after. A second there was a retry a second, without end, into a limit still in force.
int64_t provider_rate_limit_wait_ms(int64_t retry_after_ms) {
  constexpr int64_t kUnknownWaitMs = 60'000;
  return retry_after_ms > 0 ? std::max<int64_t>(retry_after_ms, 1000) : kUnknownWaitMs;
}

// The gateway answered a call with 429 (gateway_failed): the job waits `retry_after_ms` (handle).
// Not a std::exception, so that no handler's catch of errors takes it for a failure.
struct GatewayBusy {
  std::string message;
  int64_t retry_after_ms = 0;
};

// A gateway lookup failed because the gateway is down, and its failures opened the gateway's
// circuit (they tripped it, or the lookup was its half-open probe): the job waits for the next
// probe (`until_ms`) without spending an attempt (handle). The gateway is one service whose outage
// every job meets alike: were these attempts spent, a job alone (a run's lookup, one unit) would
// die of an outage before its failures opened the circuit, and the first unit in the queue, the
// probe each time, of one the circuit holds every other unit back from. (A provider's failures,
// and a page's failed dispatch, do cost attempts: a page that always fails must die.)
struct GatewayDown {
  std::string message;
  int64_t until_ms = 0;
};

// A plugin's message as the queue (last error, attempt history, dead letter) and the logs keep
// it: without the unit's token, which a third-party plugin may echo (the bundled ones scrub it
// themselves, and redact() knows only tokens of known shapes), and redacted (E2: the token is
// never stored in the queue nor logged). A token this short is no secret worth garbling for.
std::string plugin_said(std::string_view message, const std::string& token) {
  static constexpr std::string_view kMark = "[REDACTED]";
  std::string text(message);
  if (token.size() >= 6) {
    // On from past the mark: a token found in it ("DACTED") would be replaced for ever.
    for (size_t at = text.find(token); at != std::string::npos;
         at = text.find(token, at + kMark.size())) {
      text.replace(at, token.size(), kMark);
    }
  }
  return redact(text);
}

std::string provider_circuit(const std::string& provider) { return "provider:" + provider; }
std::string throttle_key(const std::string& installation) { return "throttle:" + installation; }

// A stored JSON document that must be an object; anything else is a fatal error naming `what`.
json parse_object(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw JobFailure(what + " is not a JSON object", true);
  return j;
}

std::string string_or(const json& j, const char* key, std::string fallback = {}) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}
int64_t int_or(const json& j, const char* key, int64_t fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

json request_json(const RunRequest& r) {
  json j = {{"installationId", r.installation_id},
            {"provider", r.provider},
            {"depth", r.depth_days},
            {"entityTypes", r.entity_types}};
  if (r.org_id) j["orgId"] = *r.org_id;
  return j;
}

RunRequest request_from(const json& j) {
  RunRequest r;
  r.installation_id = string_or(j, "installationId");
  r.provider = string_or(j, "provider");
  if (auto it = j.find("orgId"); it != j.end() && it->is_string())
    r.org_id = it->get<std::string>();
  r.depth_days = static_cast<int>(int_or(j, "depth", 0));
  if (auto it = j.find("entityTypes"); it != j.end() && it->is_array()) {
    for (const json& t : *it)
      if (t.is_string()) r.entity_types.push_back(t.get<std::string>());
  }
  return r;
}

// One work unit as the run's checkpoint and the entity job's payload describe it.
struct UnitRef {
  JobId job_id = 0;
  std::string resource_id;
  std::optional<std::string> resource_name;
  std::string entity_type;
};

json unit_json(const UnitRef& u) {
  json j = {{"jobId", u.job_id}, {"resourceId", u.resource_id}, {"entityType", u.entity_type}};
  j["resourceName"] = u.resource_name ? json(*u.resource_name) : json(nullptr);
  return j;
}

std::string dedupe_for(JobId run_id, const std::string& resource, const std::string& entity) {
  return std::to_string(run_id) + "/" + resource + "/" + entity;
}

// Progress an entity job has saved: its checkpoint while it runs, its result once it succeeded.
struct UnitCounts {
  std::optional<std::string> cursor;
  int64_t pages = 0;
  int64_t produced = 0;
  int64_t dispatched = 0;
  int64_t rate_limit_waits = 0;
  // The gateway's 429s in a row since the unit's last page went through: what its backoff
  // doubles with (written only while there are some).
  int64_t gateway_busy = 0;
};

json counts_json(const UnitCounts& c) {
  json j = {{"cursor", c.cursor ? json(*c.cursor) : json(nullptr)},
            {"pages", c.pages},
            {"eventsProduced", c.produced},
            {"eventsDispatched", c.dispatched},
            {"rateLimitWaits", c.rate_limit_waits}};
  if (c.gateway_busy > 0) j["gatewayBusy"] = c.gateway_busy;
  return j;
}

// The connection's resources that name none, for the run's checkpoint and result: the first
// kUnusableShown reasons, and a line counting the rest, so that no gateway answer makes them long.
constexpr size_t kUnusableShown = 10;
json unusable_report(const std::vector<std::string>& reasons) {
  json out = json::array();
  for (size_t i = 0; i < reasons.size() && i < kUnusableShown; ++i) out.push_back(reasons[i]);
  if (reasons.size() > kUnusableShown)
    out.push_back("and " + std::to_string(reasons.size() - kUnusableShown) + " more");
  return out;
}

// The 429s a run's fan-out has met, when its checkpoint is only their count (see fan_out).
std::optional<int64_t> fan_out_busy(const json& cp) {
  if (!cp.is_object() || cp.size() != 1) return std::nullopt;
  auto it = cp.find("gatewayBusy");
  if (it == cp.end() || !it->is_number_unsigned()) return std::nullopt;
  return static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), 1'000));
}

// A job's wait after the gateway's 429 without a Retry-After, the `n`th in a row: 1 s, doubling,
// at most 5 minutes.
int64_t gateway_busy_wait_ms(int64_t n) {
  constexpr int64_t kMaxMs = 5 * 60'000;
  return n >= 10 ? kMaxMs : std::min<int64_t>(int64_t{1000} << std::max<int64_t>(n - 1, 0), kMaxMs);
}

// Reads counts from a checkpoint or result; a document that is not an object (corrupt) reads
// as "nothing yet" and `ok` is false.
UnitCounts counts_from(const std::optional<std::string>& text, bool* ok = nullptr) {
  UnitCounts c;
  if (ok) *ok = true;
  if (!text) return c;
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    if (ok) *ok = false;
    return c;
  }
  if (auto it = j.find("cursor"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) {
      // A cursor of another type (an operator's {"cursor": 5}) cannot be resumed from: starting
      // at the first page while keeping the counts would count the pages sent again twice.
      if (ok) *ok = false;
      return c;
    }
    c.cursor = it->get<std::string>();
  }
  c.pages = int_or(j, "pages");
  c.produced = int_or(j, "eventsProduced");
  c.dispatched = int_or(j, "eventsDispatched");
  c.rate_limit_waits = int_or(j, "rateLimitWaits");
  c.gateway_busy = std::clamp<int64_t>(int_or(j, "gatewayBusy"), 0, 1'000'000);
  return c;
}

void validate_request(const RunRequest& r, const plugins::Connector* connector) {
  if (r.installation_id.empty())
    throw InvalidRequest("installationId", "installationId: must be a non-empty string");
  // It keys the run's jobs (concurrency and dedupe keys), which a store holds up to 1 KiB of.
  if (r.installation_id.size() > kMaxInstallationIdBytes)
    throw InvalidRequest("installationId", "installationId: must be at most " +
                                               std::to_string(kMaxInstallationIdBytes) +
                                               " bytes (got " +
                                               std::to_string(r.installation_id.size()) + ")");
  if (r.org_id && r.org_id->size() > kMaxOrgIdBytes)
    throw InvalidRequest("orgId", "orgId: must be at most " + std::to_string(kMaxOrgIdBytes) +
                                      " bytes (got " + std::to_string(r.org_id->size()) + ")");
  if (r.provider.empty()) throw InvalidRequest("provider", "provider: must be a non-empty string");
  if (!connector)
    throw InvalidRequest("provider",
                         "provider: no connector plugin is loaded for '" + r.provider + "'");
  if (r.depth_days != 7 && r.depth_days != 30 && r.depth_days != 90)
    throw InvalidRequest("depth",
                         "depth: must be 7, 30 or 90 (got " + std::to_string(r.depth_days) + ")");
  const auto& supported = connector->info().entity_types;
  std::set<std::string> seen;
  for (const std::string& t : r.entity_types) {
    if (std::find(supported.begin(), supported.end(), t) == supported.end())
      throw InvalidRequest("entityTypes", "entityTypes: '" + t + "' is not supported by " +
                                              r.provider +
                                              " (supported: " + json(supported).dump() + ")");
    if (!seen.insert(t).second)
      throw InvalidRequest("entityTypes", "entityTypes: '" + t + "' is listed twice");
  }
}

std::vector<std::string> entity_types_for(const RunRequest& r, const plugins::Connector& c) {
  return r.entity_types.empty() ? c.info().default_entity_types : r.entity_types;
}

// The run's status as the API shows it.
std::string run_status(const jobs::Job& job) {
  switch (job.status) {
    case JobStatus::kQueued: {  // a checkpoint: it began, unless it only counts the gateway's 429s
      if (!job.checkpoint) return "queued";
      json cp = json::parse(*job.checkpoint, nullptr, false);
      return fan_out_busy(cp) ? "queued" : "running";
    }
    case JobStatus::kRunning:
    case JobStatus::kWaiting:
      return "running";
    case JobStatus::kSucceeded: {
      json r = json::parse(job.result.value_or("{}"), nullptr, false);
      return r.is_object() && r.value("success", false) ? "succeeded" : "failed";
    }
    case JobStatus::kDead:
      return "failed";
    case JobStatus::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

// Throws InvalidRequest naming the first field of a checkpoint the entity worker (`entity`) or the
// orchestrator cannot resume from.
void check_checkpoint_json(const json& cp, bool entity) {
  // Counts are added to (a page, its events) and summed over a run's units: a trillion leaves
  // room for both, where INT64_MAX overflowed at the next page.
  constexpr int64_t kMaxCount = 1'000'000'000'000;
  auto integer = [&](const char* key, int64_t min, int64_t max = INT64_MAX) {
    auto it = cp.find(key);
    if (it == cp.end()) return;
    if (!it->is_number_integer() ||
        (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(max)) ||
        it->get<int64_t>() < min || it->get<int64_t>() > max) {
      throw InvalidRequest(std::string("checkpoint.") + key,
                           std::string("checkpoint.") + key +
                               ": must be an integer >= " + std::to_string(min) +
                               (max == INT64_MAX ? "" : " and <= " + std::to_string(max)) +
                               " (got " + it->dump() + ")");
    }
  };
  if (entity) {
    if (auto it = cp.find("cursor"); it != cp.end() && !it->is_null() && !it->is_string()) {
      throw InvalidRequest("checkpoint.cursor",
                           "checkpoint.cursor: must be a string (the connector's cursor) or null "
                           "(the first page) (got " +
                               it->dump() + ")");
    }
    for (const char* key :
         {"pages", "eventsProduced", "eventsDispatched", "rateLimitWaits", "gatewayBusy"})
      integer(key, 0, kMaxCount);
    return;
  }
  integer("gatewayBusy", 0, kMaxCount);
  integer("since", INT64_MIN);
  if (auto unusable = cp.find("unusableResources"); unusable != cp.end()) {
    const bool texts =
        unusable->is_array() && std::all_of(unusable->begin(), unusable->end(),
                                            [](const json& t) { return t.is_string(); });
    if (!texts) {
      throw InvalidRequest("checkpoint.unusableResources",
                           "checkpoint.unusableResources: must be an array of strings (got " +
                               unusable->dump() + ")");
    }
  }
  integer("deadline", INT64_MIN);
  integer("retries", 0, kMaxCount);
  integer("stopBy", INT64_MIN);
  if (auto stopped = cp.find("timedOut"); stopped != cp.end()) {
    const bool ids =
        stopped->is_array() && std::all_of(stopped->begin(), stopped->end(), [](const json& id) {
          return id.is_number_integer() && id.get<int64_t>() > 0;
        });
    if (!ids) {
      throw InvalidRequest("checkpoint.timedOut",
                           "checkpoint.timedOut: must be an array of positive job ids (got " +
                               stopped->dump() + ")");
    }
  }
  auto units = cp.find("units");
  if (units == cp.end()) return;  // no units: the run fans out again, adopting its units
  const std::string what =
      "checkpoint.units: must be an array of objects with a positive integer jobId (got ";
  if (!units->is_array()) throw InvalidRequest("checkpoint.units", what + units->dump() + ")");
  for (const json& u : *units) {
    auto id = u.is_object() ? u.find("jobId") : u.end();
    if (!u.is_object() || id == u.end() || !id->is_number_integer() || id->get<int64_t>() <= 0)
      throw InvalidRequest("checkpoint.units", what + u.dump() + ")");
  }
}

}  // namespace

void check_checkpoint(const std::string& kind, const std::string& checkpoint_json) {
  if (kind != kEntityKind && kind != kRunKind) return;
  json cp = json::parse(checkpoint_json, nullptr, false);
  if (cp.is_discarded() || !cp.is_object())
    throw InvalidRequest("checkpoint", "checkpoint: must be a JSON object");
  check_checkpoint_json(cp, kind == kEntityKind);
}

struct Pipeline::Impl {
  Impl(jobs::JobStore& s, const Clock& c, const gateway::GatewayClient& g, ConnectorLookup l,
       PipelineOptions o)
      : store(s), clock(c), gateway(g), connectors(std::move(l)), options(std::move(o)) {}

  jobs::JobStore& store;
  const Clock& clock;
  const gateway::GatewayClient& gateway;
  ConnectorLookup connectors;
  std::shared_ptr<spdlog::logger> log = logging::get("pipeline");

  mutable std::mutex mutex;   // options, circuits
  std::mutex settings_mutex;  // update_rate_limits(): one read-change-write at a time
  PipelineOptions options;
  struct CachedCircuit {
    jobs::CircuitRecord record;
    int64_t read_ms = -1;
  };
  std::map<std::string, CachedCircuit> circuits;

  std::atomic<int64_t> pages{0}, dispatched{0}, duplicates{0}, rate_limit_waits{0},
      gateway_rate_limit_waits{0}, throttle_waits{0}, circuit_deferrals{0}, token_refreshes{0},
      retries_in_place{0}, plugin_calls{0}, plugin_call_us{0};

  PipelineOptions snapshot() const {
    std::lock_guard lock(mutex);
    return options;
  }

  // --- circuit breakers (E4) -------------------------------------------------------------------

  // The half-open probes one call began (circuit_closed_until), given back when the guard ends,
  // at whichever exit: a probe whose call reported back (closed or reopened its circuit) stands;
  // one whose call ended without an answer that speaks of the service -- deferred before it went
  // (the other circuit, the throttle), a page with nothing to dispatch, a page retried in place
  // or rate limited before its dispatch, a token lookup that failed before the page -- would
  // otherwise hold its circuit half-open for a whole open period, every other call waiting for a
  // report that never comes (and this unit too, finding its own probe under way).
  class Probes {
   public:
    explicit Probes(Impl& impl) : impl_(impl) {}
    Probes(const Probes&) = delete;
    Probes& operator=(const Probes&) = delete;
    ~Probes() {
      for (const Begun& b : begun_) impl_.give_back(b.name, b.before, b.begun);
    }
    void add(const std::string& name, const jobs::CircuitRecord& before,
             const jobs::CircuitRecord& begun) {
      begun_.push_back({name, before, begun});
    }
    bool began(const std::string& name) const {
      return std::any_of(begun_.begin(), begun_.end(),
                         [&](const Begun& b) { return b.name == name; });
    }

   private:
    struct Begun {
      std::string name;
      jobs::CircuitRecord before, begun;
    };
    Impl& impl_;
    std::vector<Begun> begun_;
  };

  // nullopt when a call may go; else when to try again. Reads the shared record at most once per
  // kCircuitRefreshMs; an open circuit whose time has come is turned half-open (this call is the
  // probe, and is added to `probes`, to be given back unless it reports).
  std::optional<int64_t> circuit_closed_until(const std::string& name, int64_t now,
                                              Probes& probes) {
    {
      std::lock_guard lock(mutex);
      auto it = circuits.find(name);
      if (it != circuits.end() && now - it->second.read_ms < kCircuitRefreshMs) {
        jobs::CircuitDecision d = jobs::decide(it->second.record, now);
        if (!d.allowed) return d.retry_at_ms;
        if (it->second.record.state == "closed") return std::nullopt;
      }
    }
    jobs::CircuitDecision decision;
    bool probing = false;
    jobs::CircuitRecord before;
    jobs::CircuitRecord stored = store.update_circuit(name, [&](const jobs::CircuitRecord& r) {
      decision = jobs::decide(r, now);
      // An open circuit's first probe, or the next one after a probe that never reported back.
      probing = decision.allowed && r.state != "closed";
      before = r;
      return probing ? jobs::begin_probe(r, now) : r;
    });
    {
      std::lock_guard lock(mutex);
      circuits[name] = {stored, now};
    }
    if (probing) probes.add(name, before, stored);
    if (!decision.allowed) return decision.retry_at_ms;
    return std::nullopt;
  }

  // A deferral until `name`'s circuit lets a call go; none when it may go now
  // (circuit_closed_until: the probe this call may begin goes into `probes`).
  std::optional<Outcome> wait_for_circuit(const std::string& name, int64_t now, Probes& probes) {
    std::optional<int64_t> until = circuit_closed_until(name, now, probes);
    if (!until) return std::nullopt;
    ++circuit_deferrals;
    return Outcome::defer(*until, "circuit open: " + name);
  }

  // Before a provider request (a page, a run's scope check): a deferral while the provider's
  // circuit (`provider_breaker`) or the gateway's is open, or while the installation's throttle
  // has no token for it; none when it may go (its token taken). The half-open probes it begins
  // are added to `probes`, which gives them back if the request defers or ends without reporting.
  std::optional<Outcome> hold_back(const std::string& provider_breaker,
                                   const std::string& installation, const PipelineOptions& o,
                                   int64_t now, Probes& probes) {
    for (const std::string& breaker : {provider_breaker, std::string(kGatewayCircuit)}) {
      if (auto wait = wait_for_circuit(breaker, now, probes)) return wait;
    }
    if (int64_t wait = store.take_tokens(throttle_key(installation), 1, o.throttle_burst,
                                         o.throttle_per_hour, now);
        wait > 0) {
      ++throttle_waits;
      // At most kThrottleRecheckMs: the unit then asks the bucket again, so a throttle raised
      // (PUT /v1/rate-limits) applies to units already waiting within that time, and a slow
      // refill never parks a unit for hours on the rate of the moment it was deferred.
      return Outcome::defer(jobs::later_by(now, std::min(wait, kThrottleRecheckMs)),
                            "throttled: " + installation);
    }
    return std::nullopt;
  }

  // Puts `name`'s record back as it was before this host began a probe (`before`), unless the
  // probe reported back or anything else was recorded since (give_back_probe). Never throws: a
  // store that fails here leaves the probe to run out its period, as one whose host crashed.
  void give_back(const std::string& name, const jobs::CircuitRecord& before,
                 const jobs::CircuitRecord& begun) noexcept {
    try {
      jobs::CircuitRecord stored = store.update_circuit(name, [&](const jobs::CircuitRecord& r) {
        return jobs::give_back_probe(r, before, begun);
      });
      std::lock_guard lock(mutex);
      circuits[name] = {stored, clock.now_ms()};
    } catch (const std::exception& e) {
      log->warn("circuit {}: the probe that did not report back was not given back: {}", name,
                e.what());
    }
  }

  // Records the result of a call to `name`'s service that began at `started` (host clock), `count`
  // times for a failure of that many tries: one begun before the circuit opened or before its
  // half-open probe began does not count (record_event). Returns when the next probe is due when
  // these failures opened the circuit -- tripped it, or were its half-open probe's -- else nullopt.
  std::optional<int64_t> circuit_event(const std::string& name, jobs::CircuitEvent event,
                                       const jobs::CircuitPolicy& policy, int64_t started,
                                       int64_t now, int count = 1) {
    if (event == jobs::CircuitEvent::kSuccess) {
      std::lock_guard lock(mutex);
      auto it = circuits.find(name);
      if (it != circuits.end() && it->second.record.state == "closed" &&
          it->second.record.failures == 0)
        return std::nullopt;  // nothing to record
    }
    bool opened = false;
    jobs::CircuitRecord stored = store.update_circuit(name, [&](const jobs::CircuitRecord& r) {
      jobs::CircuitRecord next = r;
      for (int i = 0; i < std::max(count, 1); ++i)
        next = jobs::record_event(next, event, policy, started, now);
      opened = next.state == "open" && (r.state != "open" || r.opened_ms != next.opened_ms);
      return next;
    });
    {
      std::lock_guard lock(mutex);
      circuits[name] = {stored, now};
    }
    if (!opened) return std::nullopt;
    return stored.retry_at_ms;
  }

  // Whether a failed gateway call counts against the gateway's circuit: it is retryable (no
  // answer, a 5xx) and no 429 (the gateway is up, asking us to slow down), or a 401 (this host's
  // API key refused, which every call of every job meets until it is put right).
  static bool gateway_failure(const gateway::GatewayError& e) {
    return (e.retryable() && !e.rate_limited()) || e.status() == 401;
  }

  // Whether a gateway call that failed with `e`, after `retries` retries, is tried again in place:
  // a failure of the gateway is, a few times; a 429 is not (the job waits as long as the gateway
  // asked), nor a 5xx whose Retry-After asks for more than kInPlaceRetryAfterMs (the attempt fails,
  // and its retry waits at least that long).
  static bool retry_in_place(const gateway::GatewayError& e, int retries,
                             const PipelineOptions& o) {
    return e.retryable() && !e.rate_limited() && retries < o.transient_retries &&
           e.retry_after_ms() <= kInPlaceRetryAfterMs;
  }

  // Gateway calls (begun at `started`, `failed_calls` of them failed): a 429 is the gateway asking
  // us to slow down, a wait and not an attempt (GatewayBusy); other retryable errors count against
  // the gateway circuit and retry the attempt; the rest (a 4xx: our request is wrong) are fatal.
  // Except a 401: the gateway refusing this host's API key, which every call of every job would
  // meet. It counts against the circuit as an outage does, and opens it at once, which then holds
  // every job back (probing, less and less often) until the key is put right.
  //
  // Failures that opened the circuit (tripped it, or were its half-open probe's) cost no attempt
  // (GatewayDown) when they say the gateway itself is down: no answer, 502/503/504, or 401. The
  // job waits for the probe as every other job does. Another 5xx, or a failure after the gateway
  // answered a call of the attempt (`gateway_up`: a page's dispatch, which follows the attempt's
  // token lookup, its first gateway call and so any probe), may be that delivery's own doing: the
  // job then spends an attempt as usual, so that a delivery the gateway always refuses ends.
  [[noreturn]] void gateway_failed(const gateway::GatewayError& e, const PipelineOptions& o,
                                   int64_t started, bool gateway_up = false, int failed_calls = 1) {
    if (e.rate_limited()) {
      gateway_answered(e, o, started);
      throw GatewayBusy{e.what(), e.retry_after_ms()};
    }
    if (gateway_failure(e)) {
      const bool key_refused = e.status() == 401;
      const std::string what =
          std::string(e.what()) +
          (key_refused ? " (the gateway refused this host's API key: see gateway.api_key_env)"
                       : "");
      jobs::CircuitPolicy policy = o.gateway_circuit;
      if (key_refused) policy.failure_threshold = 1;
      const int64_t now = clock.now_ms();
      const std::optional<int64_t> next_probe = circuit_event(
          kGatewayCircuit, jobs::CircuitEvent::kFailure, policy, started, now, failed_calls);
      const int s = e.status();
      const bool down = s == 0 || s == 401 || s == 502 || s == 503 || s == 504;
      if (next_probe && down && !gateway_up) {
        throw GatewayDown{what, std::max(*next_probe, jobs::later_by(now, e.retry_after_ms()))};
      }
      // A 503 with Retry-After says when to come back: the retry waits at least that long.
      throw JobFailure(what, false, e.retry_after_ms());
    }
    gateway_answered(e, o, started);
    throw JobFailure(e.what(), true);
  }

  // A gateway lookup (`call`: the connection, a token), retried in place as a delivery is; a
  // success reports to the gateway's circuit (the call may be its half-open probe), a failure goes
  // to gateway_failed with each failed try counted.
  template <class Call>
  auto gateway_lookup(JobContext& ctx, const PipelineOptions& o, Call&& call) {
    int failed_calls = 0;
    for (int retry = 0;; ++retry) {
      const int64_t started = clock.now_ms();
      try {
        auto result = call();
        circuit_event(kGatewayCircuit, jobs::CircuitEvent::kSuccess, o.gateway_circuit, started,
                      clock.now_ms());
        return result;
      } catch (const gateway::GatewayError& e) {
        failed_calls += gateway_failure(e) ? 1 : 0;
        if (!retry_in_place(e, retry, o)) gateway_failed(e, o, started, false, failed_calls);
        ++retries_in_place;
        if (!pause(ctx, o, retry, e.retry_after_ms())) stop_now(ctx, e.what());
      }
    }
  }

  // A gateway error that is an answer about our request (a 4xx) says the gateway is up: it counts
  // as a success, as the half-open probe it may be must report back (a failure would keep a
  // gateway that answers shut). One that is no answer (a payload refused before it was sent,
  // status 0) says nothing of the gateway.
  void gateway_answered(const gateway::GatewayError& e, const PipelineOptions& o, int64_t started) {
    if (e.status() >= 400 && e.status() < 500)
      circuit_event(kGatewayCircuit, jobs::CircuitEvent::kSuccess, o.gateway_circuit, started,
                    clock.now_ms());
  }

  // A job's handler: a gateway that asked us to slow down (GatewayBusy, from any gateway call of
  // the job) defers the job by the wait it asked for, at least a second. Like a provider's rate
  // limit, that is no attempt: a gateway shedding load costs time, never a dead letter. The pages
  // already checkpointed stay; the page under way is fetched and sent again (the gateway dedupes).
  template <class Handler>
  Outcome handle(JobContext& ctx, Handler&& handler) {
    try {
      return handler(ctx);
    } catch (const GatewayBusy& e) {
      ++gateway_rate_limit_waits;
      return Outcome::defer(ctx.now_ms() + std::max<int64_t>(e.retry_after_ms, 1000),
                            "rate limited by the gateway: " + e.message);
    } catch (const GatewayDown& e) {
      ++circuit_deferrals;
      return Outcome::defer(
          e.until_ms, "circuit open: gateway (opened by this job's failure: " + e.message + ")");
    }
  }

  // --- the orchestrator (E1, E3) ---------------------------------------------------------------

  Outcome run_job(JobContext& ctx) {
    const jobs::Job& job = ctx.job();
    json payload = parse_object(job.payload, "run payload");
    RunRequest request = request_from(payload);
    if (!job.checkpoint) return fan_out(ctx, request, 0);
    bool ok = true;
    json cp = json::parse(*job.checkpoint, nullptr, false);
    // A fan-out the gateway asked to slow down: the 429s it has met so far (see fan_out).
    if (const std::optional<int64_t> busy = fan_out_busy(cp)) return fan_out(ctx, request, *busy);
    if (cp.is_discarded() || !cp.is_object() || !cp.contains("units")) ok = false;
    if (ok) {
      // "units" that is not a list of units with job ids is no list to gather from.
      try {
        check_checkpoint_json(cp, false);
      } catch (const InvalidRequest&) {
        ok = false;
      }
    }
    if (!ok) {
      // The units exist (they are this job's children); rebuild the list from them.
      log->error("run {}: checkpoint is corrupt; rebuilding it from the run's units", job.id);
      return fan_out(ctx, request, 0);
    }
    return gather(ctx, request, cp);
  }

  // The fan-out, which the gateway may ask to slow down (a 429 on the connection's or a token's
  // lookup): the run waits as long as it says, or, without a Retry-After, 1 s doubling with each
  // 429 the fan-out has met (`gateway_busy` of them so far, kept in the run's checkpoint until the
  // fan-out's wait for its units replaces it), up to 5 minutes. At 1 s each (found by review), a
  // gateway shedding load had every waiting run ask it again every second. Not restarted by a
  // connection lookup that goes through: a gateway shedding load on its token endpoint alone
  // would then be asked twice a second again. Like a unit's, the wait is no attempt.
  Outcome fan_out(JobContext& ctx, const RunRequest& request, int64_t gateway_busy) {
    try {
      return fan_out_once(ctx, request);
    } catch (const GatewayBusy& e) {
      ++gateway_rate_limit_waits;
      const int64_t n = std::min<int64_t>(gateway_busy, 1'000) + 1;
      const int64_t wait = e.retry_after_ms > 0 ? std::max<int64_t>(e.retry_after_ms, 1000)
                                                : gateway_busy_wait_ms(n);
      const std::string saved = json{{"gatewayBusy", n}}.dump();
      return defer_after([&] { ctx.checkpoint_without_progress(saved); },
                         Outcome::defer(jobs::later_by(ctx.now_ms(), wait),
                                        "rate limited by the gateway: " + e.message));
    }
  }

  Outcome fan_out_once(JobContext& ctx, const RunRequest& request) {
    const jobs::Job& job = ctx.job();
    PipelineOptions o = snapshot();
    // A previous attempt enqueued the units (all of them: enqueue_batch is one transaction) and
    // ended before it recorded its wait (a crash, a lost lease), or the checkpoint is corrupt:
    // wait for those units, in the window they were given. Checking the connection and the scopes
    // again could fail the run for good (the connection since deactivated) while they run on,
    // and a dead run is "done" before its units (E3), its installation free for a second run.
    if (std::optional<Outcome> adopted = adopt_units(ctx, o)) return std::move(*adopted);
    const plugins::Connector* connector = connectors(request.provider);
    if (!connector) throw JobFailure("no connector plugin for provider: " + request.provider, true);

    gateway::Connection connection;
    {
      // The lookup is a gateway call: while the gateway's circuit is open the run waits for the
      // probe (a run-after, no attempt burnt), as a page's dispatch does, rather than failing its
      // attempts on a gateway known to be down and reopening the circuit with each failure, which
      // pushes every unit's probe further away. Once the probe is due, the lookup is the probe.
      Probes probes(*this);
      if (auto wait = wait_for_circuit(kGatewayCircuit, ctx.now_ms(), probes))
        return std::move(*wait);
      connection = gateway_lookup(ctx, o, [&] {
        const int64_t asked = clock.now_ms();
        try {
          return gateway.connection(request.installation_id);
        } catch (const gateway::GatewayError& e) {
          if (e.status() != 404) throw;
          gateway_answered(e, o, asked);
          throw JobFailure("connection not found: " + request.installation_id, true);
        }
      });
    }
    if (connection.status != "active")
      throw JobFailure("connection is not active: " + request.installation_id +
                           " (status: " + connection.status + ")",
                       true);
    if (connection.provider != request.provider)
      throw JobFailure("connection " + request.installation_id + " belongs to provider '" +
                           connection.provider + "', not '" + request.provider + "'",
                       true);
    const std::string org_id = request.org_id.value_or(connection.org_id);
    const json unusable = unusable_report(connection.unusable_resources);
    if (!unusable.empty()) {
      log->warn("run {}: the connection {} lists {} resources that name none, left out: {}", job.id,
                request.installation_id, connection.unusable_resources.size(), unusable.dump());
    }
    const std::vector<std::string> types = entity_types_for(request, *connector);
    for (const std::string& t : types) {
      const auto& supported = connector->info().entity_types;
      if (std::find(supported.begin(), supported.end(), t) == supported.end())
        throw JobFailure("entity type '" + t + "' is not supported by " + request.provider, true);
    }
    // `since` is computed once: every unit shares the window.
    const int64_t now = ctx.now_ms();
    const int64_t since = now - int64_t{request.depth_days} * kDayMs;

    if (!connection.resources.empty()) {
      // The scope check is a provider request like every page (and asks the gateway for the
      // token): it waits for the circuits and the throttle, rather than burning the run's
      // attempts.
      Probes probes(*this);
      if (auto wait = hold_back(provider_circuit(request.provider), request.installation_id, o, now,
                                probes)) {
        return std::move(*wait);
      }
      if (auto wait = validate_scopes(*connector, connection, request, o, ctx)) {
        return std::move(*wait);
      }
    }

    // A unit per resource and type, once: the gateway listing a resource twice (or a connector's
    // default types a type twice) made two units of one dedupe key, the second the first's job
    // again, and the run counted that job's work twice.
    std::vector<UnitRef> units;
    std::set<std::pair<std::string_view, std::string_view>> seen;
    for (const auto& resource : connection.resources) {
      for (const std::string& t : types) {
        if (seen.emplace(resource.id, t).second)
          units.push_back({0, resource.id, resource.name, t});
      }
    }
    if (units.empty())
      return Outcome::complete(aggregate(request, org_id, since, {}, {}, {}, unusable).dump());
    // The run waits with every unit in its checkpoint, which the store holds to kMaxTextBytes
    // (o.run_checkpoint_bytes). Past that (some 150 000 units) the wait failed after the units were
    // enqueued: each retry of the run adopted them and failed so again, and the units ran on under
    // a dead run. Refused here.
    // Counted at its widest: every job id of 19 digits, the wait's fields at their largest, and
    // every unit in `timedOut` too (gather() adds it when units time out).
    constexpr JobId kWidestId = std::numeric_limits<JobId>::max();
    const json widest_rest = {{"stage", "waiting"},
                              {"since", std::numeric_limits<int64_t>::min()},
                              {"orgId", org_id},
                              {"deadline", std::numeric_limits<int64_t>::min()},
                              {"stopBy", std::numeric_limits<int64_t>::min()},
                              {"retries", std::numeric_limits<int64_t>::min()},
                              {"units", json::array()},
                              {"timedOut", json::array()},
                              {"unusableResources", unusable}};
    size_t checkpoint_bytes = widest_rest.dump().size();
    for (const UnitRef& u : units) {
      UnitRef widest = u;
      widest.job_id = kWidestId;
      checkpoint_bytes += unit_json(widest).dump().size() + 1;   // in "units"
      checkpoint_bytes += std::to_string(kWidestId).size() + 1;  // in "timedOut"
    }
    if (checkpoint_bytes > std::min(o.run_checkpoint_bytes, jobs::kMaxTextBytes)) {
      throw JobFailure("the run would have " + std::to_string(units.size()) + " units (" +
                           std::to_string(connection.resources.size()) + " resources x " +
                           std::to_string(types.size()) +
                           " entity types), more than one run can track (its checkpoint would "
                           "take " +
                           std::to_string(checkpoint_bytes) + " bytes, over " +
                           std::to_string(std::min(o.run_checkpoint_bytes, jobs::kMaxTextBytes)) +
                           "): start runs of fewer entity types, or split "
                           "the connection's resources",
                       true);
    }

    std::vector<jobs::JobSpec> specs;
    for (const UnitRef& u : units) {
      json unit = {{"runId", job.id},
                   {"installationId", request.installation_id},
                   {"providerInstallationId", connection.installation_id},
                   {"provider", request.provider},
                   {"orgId", org_id},
                   {"entityType", u.entity_type},
                   {"resource", {{"id", u.resource_id}}},
                   {"since", since},
                   {"depth", request.depth_days}};
      unit["resource"]["name"] = u.resource_name ? json(*u.resource_name) : json(nullptr);
      jobs::JobSpec spec;
      spec.kind = kEntityKind;
      spec.payload = unit.dump();
      spec.concurrency_key = request.installation_id;
      spec.dedupe_key = dedupe_for(job.id, u.resource_id, u.entity_type);
      spec.max_attempts = o.entity_max_attempts;
      spec.parent_id = job.id;
      spec.timeout_ms = o.unit_timeout_ms;
      specs.push_back(std::move(spec));
    }
    const std::vector<jobs::EnqueueResult> ids = store.enqueue_batch(specs, now);
    for (size_t k = 0; k < ids.size(); ++k) units[k].job_id = ids[k].id;
    log->info("run {}: {} units for {} ({} resources x {} entity types)", job.id, units.size(),
              request.installation_id, connection.resources.size(), types.size());
    return wait_for(units, since, org_id, now, o, unusable);
  }

  static Outcome wait_for(const std::vector<UnitRef>& units, int64_t since,
                          const std::string& org_id, int64_t now, const PipelineOptions& o,
                          const json& unusable = json::array()) {
    json cp = {{"stage", "waiting"},
               {"since", since},
               {"orgId", org_id},
               {"deadline", now + o.unit_timeout_ms},
               {"units", json::array()}};
    if (!unusable.empty()) cp["unusableResources"] = unusable;
    for (const UnitRef& u : units) cp["units"].push_back(unit_json(u));
    return Outcome::wait_for_children(now + o.unit_timeout_ms, cp.dump());
  }

  // The wait for the units a previous attempt of the run enqueued, rebuilt from the units
  // themselves (oldest first, the order they were enqueued in); nullopt when there are none.
  std::optional<Outcome> adopt_units(JobContext& ctx, const PipelineOptions& o) {
    std::vector<jobs::Job> existing = children(ctx.job().id);
    if (existing.empty()) return std::nullopt;
    std::sort(existing.begin(), existing.end(),
              [](const jobs::Job& a, const jobs::Job& b) { return a.id < b.id; });
    std::vector<UnitRef> units;
    int64_t since = 0;
    std::string org_id;
    for (const jobs::Job& child : existing) {
      const json unit = json::parse(child.payload, nullptr, false);
      UnitRef ref;
      ref.job_id = child.id;
      if (unit.is_object()) {
        ref.entity_type = string_or(unit, "entityType");
        const json resource = unit.value("resource", json::object());
        if (resource.is_object()) {
          ref.resource_id = string_or(resource, "id");
          if (auto it = resource.find("name"); it != resource.end() && it->is_string())
            ref.resource_name = it->get<std::string>();
        }
        since = int_or(unit, "since", since);
        org_id = string_or(unit, "orgId", org_id);
      }
      units.push_back(std::move(ref));
    }
    log->warn("run {}: waiting for the {} units an earlier attempt enqueued", ctx.job().id,
              units.size());
    return wait_for(units, since, org_id, ctx.now_ms(), o);
  }

  // Throws JobFailure when the token cannot read the resources; returns the wait when the
  // provider rate-limits the check.
  std::optional<Outcome> validate_scopes(const plugins::Connector& connector,
                                         const gateway::Connection& connection,
                                         const RunRequest& request, const PipelineOptions& o,
                                         JobContext& ctx) {
    plugins::Unit unit;
    unit.installation_id = connection.installation_id;
    unit.resource_id = connection.resources.front().id;
    unit.resource_name = connection.resources.front().name;
    unit.access_token = token_for(ctx, request.installation_id, o);
    // The provider's answer counts on its circuit, as a page's does (this call may be the
    // half-open probe, which must report back).
    const std::string breaker = provider_circuit(request.provider);
    const int64_t started = clock.now_ms();
    try {
      connector.validate_scopes(unit);
    } catch (const plugins::ConnectorFailure& e) {
      const bool crashed = dynamic_cast<const plugins::PluginCrashed*>(&e) != nullptr;
      if (crashed) {
        // The plugin's own end in its worker process: nothing about the provider.
      } else if (e.status() == BACKHAUL_RETRYABLE) {
        circuit_event(breaker, jobs::CircuitEvent::kFailure, o.provider_circuit, started,
                      clock.now_ms());
      } else if (provider_answered(e.status())) {
        circuit_event(breaker, jobs::CircuitEvent::kSuccess, o.provider_circuit, started,
                      clock.now_ms());
      }
      std::string what = std::string("scope validation failed: ") +
                         std::string(plugins::status_name(e.status())) + ": " +
                         plugin_said(e.what(), unit.access_token);
      if (!crashed && e.status() == BACKHAUL_RATE_LIMITED) {  // a wait, not an attempt (D4)
        ++rate_limit_waits;
        const int64_t wait = provider_rate_limit_wait_ms(e.retry_after_ms());
        return Outcome::defer(ctx.now_ms() + wait, "rate limited by the provider: " + what);
      }
      throw JobFailure(what, !e.is_retryable(), e.retry_after_ms());
    }
    circuit_event(breaker, jobs::CircuitEvent::kSuccess, o.provider_circuit, started,
                  clock.now_ms());
    return std::nullopt;
  }

  // Calls `each` with the run's units, newest first, a page of them in memory at a time: a run
  // of 150 000 units is hundreds of MB of jobs (payloads, checkpoints, results) at once.
  template <class Each>
  void for_each_child(JobId run_id, Each&& each) {
    jobs::JobQuery q;
    q.parent_id = run_id;
    q.limit = 500;
    while (true) {
      jobs::JobPage page = store.list(q);
      for (jobs::Job& j : page.jobs) each(j);
      if (!page.next_before) break;
      q.before_id = page.next_before;
    }
  }

  std::vector<jobs::Job> children(JobId run_id) {
    std::vector<jobs::Job> all;
    for_each_child(run_id, [&](jobs::Job& j) { all.push_back(std::move(j)); });
    return all;
  }

  // How many times an operator retried `job` from its dead letter, while that retry is under way
  // (the letter is "retrying" until the job succeeds or dies again); 0 otherwise.
  int letter_retries(const jobs::Job& job) {
    jobs::DeadLetterQuery q;
    q.status = jobs::DeadLetterStatus::kRetrying;
    q.kind = job.kind;
    q.concurrency_key = job.concurrency_key;
    while (true) {
      jobs::DeadLetterPage page = store.list_dead_letters(q);
      for (const jobs::DeadLetter& letter : page.items) {
        if (letter.job_id == job.id) return letter.retries;
      }
      if (!page.next_before) return 0;
      q.before_id = page.next_before;
    }
  }

  Outcome gather(JobContext& ctx, const RunRequest& request, const json& cp) {
    const jobs::Job& job = ctx.job();
    const int64_t now = ctx.now_ms();
    const int64_t deadline = int_or(cp, "deadline", now);
    std::map<JobId, jobs::Job> by_id;
    for_each_child(job.id, [&](jobs::Job& child) {
      // Kept for aggregate() (and the stop below) only: a unit's payload, and the checkpoint or
      // result it does not read, would be held for every unit at once.
      child.payload.clear();
      (child.status == JobStatus::kSucceeded ? child.checkpoint : child.result).reset();
      by_id.emplace(child.id, std::move(child));
    });

    std::vector<UnitRef> units;
    for (const json& u : cp["units"]) {
      UnitRef ref;
      ref.job_id = int_or(u, "jobId");
      ref.resource_id = string_or(u, "resourceId");
      ref.entity_type = string_or(u, "entityType");
      if (auto it = u.find("resourceName"); it != u.end() && it->is_string())
        ref.resource_name = it->get<std::string>();
      units.push_back(std::move(ref));
    }
    std::vector<JobId> active;
    for (const UnitRef& u : units) {
      auto it = by_id.find(u.job_id);
      if (it != by_id.end() && !jobs::is_terminal(it->second.status)) active.push_back(u.job_id);
    }
    // The units this run stopped at its deadline, once it has: it waits until they have stopped
    // or the stop wait is over (a unit stuck in a plugin call is left to its lease; the run
    // reports it timed out all the same).
    std::set<JobId> timed_out;
    for (const json& id : cp.value("timedOut", json::array())) timed_out.insert(id.get<JobId>());
    if (!active.empty()) {
      const bool stopping = !timed_out.empty();
      const int64_t until = stopping ? int_or(cp, "stopBy", now) : deadline;
      if (now < until) return Outcome::wait_for_children(until, cp.dump());
      // A run that died and that an operator retried (its units with it, often) gets a new unit
      // timeout for each retry: the deadline it died with has nothing to do with the retried
      // units, which would otherwise be stopped as "timed out" the moment it resumes.
      if (const int retries = letter_retries(job); retries > int_or(cp, "retries", 0)) {
        const int64_t renewed_deadline = now + snapshot().unit_timeout_ms;
        json renewed = cp;
        renewed.erase("timedOut");
        renewed.erase("stopBy");
        renewed["retries"] = retries;
        renewed["deadline"] = renewed_deadline;
        log->info("run {}: retried by an operator ({} times): a new unit timeout for its {} units",
                  job.id, retries, active.size());
        return Outcome::wait_for_children(renewed_deadline, renewed.dump());
      }
      if (!stopping) {
        // Past the per-unit timeout: those units failed; stop them. A queued one is cancelled at
        // once, a running one stops at its next page boundary: the run waits for that (E3: it
        // is never done before its units), up to kStopWaitMs.
        bool still_running = false;
        for (JobId id : active) {
          store.cancel(id, now);
          timed_out.insert(id);
          if (std::optional<jobs::Job> unit = store.get(id)) {
            still_running = still_running || !jobs::is_terminal(unit->status);
            by_id[id] = std::move(*unit);
          }
        }
        log->warn("run {}: {} units did not finish before the unit timeout", job.id, active.size());
        if (still_running) {
          json next = cp;
          next["timedOut"] = json(timed_out);
          next["stopBy"] = now + kStopWaitMs;
          return Outcome::wait_for_children(now + kStopWaitMs, next.dump());
        }
      }
    }
    json result = aggregate(request, string_or(cp, "orgId"), int_or(cp, "since"), units, by_id,
                            timed_out, cp.value("unusableResources", json::array()));
    log->info("run {}: done, success={}, {} of {} units completed, {} events dispatched", job.id,
              result["success"].get<bool>(), result["completed"].get<int>(),
              result["workUnits"].get<int>(), result["eventsDispatched"].get<int64_t>());
    return Outcome::complete(result.dump());
  }

  // The run's result: totals, and a line per unit. Each unit's error is cut to kResultErrorBytes
  // (its job keeps it whole, and the API shows that), and the lines past result_lines_bytes are
  // left out and counted (resultsOmitted), so that no number of units makes a result larger than
  // a store keeps (jobs::kMaxTextBytes): the run would fail at its very end, all its units done.
  static constexpr size_t kResultErrorBytes = 1000;
  static constexpr size_t kMaxResultLinesBytes = jobs::kMaxTextBytes - (64u << 10);
  json aggregate(const RunRequest& request, const std::string& org_id, int64_t since,
                 const std::vector<UnitRef>& units, const std::map<JobId, jobs::Job>& by_id,
                 const std::set<JobId>& timed_out = {}, const json& unusable = json::array()) {
    int completed = 0, failed = 0;
    UnitCounts total;
    json results = json::array();
    const size_t lines_budget = std::min(snapshot().result_lines_bytes, kMaxResultLinesBytes);
    size_t lines_bytes = 0;
    int64_t omitted = 0;  // once one line is left out, so are all after it: results is a prefix
    for (const UnitRef& u : units) {
      json r = unit_json(u);
      auto it = by_id.find(u.job_id);
      bool success = false;
      UnitCounts c;
      std::optional<std::string> error;
      if (it == by_id.end()) {
        error = "unit job " + std::to_string(u.job_id) + " is missing";
        r["status"] = "missing";
      } else {
        const jobs::Job& child = it->second;
        r["status"] = std::string(jobs::to_string(child.status));
        success = child.status == JobStatus::kSucceeded;
        c = counts_from(success ? child.result : child.checkpoint);
        if (timed_out.count(child.id) && !success) {  // one that ended its last page succeeded
          // One unit timeout for all the run's units, from the fan-out (as the seed's waits):
          // a unit kept queued all along (caps, throttle, busy workers) is told apart.
          const std::string within = std::to_string(snapshot().unit_timeout_ms / 1000) + " s";
          error = child.started_ms == 0
                      ? "timeout: the unit did not start within " + within +
                            " (it was still queued: caps, throttling or busy workers held it)"
                      : "timeout: the unit did not complete within " + within;
          r["status"] = "timed_out";
        } else if (!success) {
          error = child.last_error.value_or(std::string(jobs::to_string(child.status)));
        }
      }
      success ? ++completed : ++failed;
      total.pages += c.pages;
      total.produced += c.produced;
      total.dispatched += c.dispatched;
      total.rate_limit_waits += c.rate_limit_waits;
      r["success"] = success;
      r["pages"] = c.pages;
      r["eventsProduced"] = c.produced;
      r["eventsDispatched"] = c.dispatched;
      r["rateLimitWaits"] = c.rate_limit_waits;
      if (error && error->size() > kResultErrorBytes) {
        error = cut_utf8(*error, kResultErrorBytes) + " [truncated]";
      }
      r["error"] = error ? json(*error) : json(nullptr);
      const size_t bytes = omitted > 0 ? 0 : r.dump().size() + 1;
      if (omitted > 0 || lines_bytes + bytes > lines_budget) {
        ++omitted;
        continue;
      }
      lines_bytes += bytes;
      results.push_back(std::move(r));
    }
    // Resources the gateway listed that name none (unusable_report): not backfilled, so the run
    // did not do all it was asked.
    json done = {{"success", failed == 0 && unusable.empty()},
                 {"installationId", request.installation_id},
                 {"provider", request.provider},
                 {"orgId", org_id},
                 {"since", since},
                 {"workUnits", static_cast<int>(units.size())},
                 {"completed", completed},
                 {"failed", failed},
                 {"pages", total.pages},
                 {"eventsProduced", total.produced},
                 {"eventsDispatched", total.dispatched},
                 {"rateLimitWaits", total.rate_limit_waits},
                 {"results", std::move(results)}};
    if (omitted > 0) done["resultsOmitted"] = omitted;
    if (!unusable.empty()) done["unusableResources"] = unusable;
    return done;
  }

  // --- the entity worker (E2) ------------------------------------------------------------------

  Outcome entity_job(JobContext& ctx) {
    const jobs::Job& job = ctx.job();
    json unit = parse_object(job.payload, "entity payload");
    const std::string installation = string_or(unit, "installationId");
    const std::string provider = string_or(unit, "provider");
    const std::string org_id = string_or(unit, "orgId");
    const std::string entity = string_or(unit, "entityType");
    const json resource = unit.value("resource", json::object());
    if (installation.empty() || provider.empty() || entity.empty() || !resource.is_object() ||
        string_or(resource, "id").empty())
      throw JobFailure("entity payload lacks installationId, provider, entityType or resource.id",
                       true);
    const plugins::Connector* connector = connectors(provider);
    if (!connector) throw JobFailure("no connector plugin for provider: " + provider, true);

    bool checkpoint_ok = true;
    UnitCounts counts = counts_from(job.checkpoint, &checkpoint_ok);
    if (!checkpoint_ok) {
      // Deliveries are idempotent (deterministic ids), so starting over loses nothing.
      log->error(
          "job {}: checkpoint is not a JSON object with a string cursor; starting the unit from "
          "its first page",
          job.id);
      counts = {};
    }

    plugins::FetchParams params;
    // Delivery ids name the provider's installation (the connection's), not the connection.
    params.unit.installation_id = string_or(unit, "providerInstallationId", installation);
    params.unit.resource_id = string_or(resource, "id");
    if (auto it = resource.find("name"); it != resource.end() && it->is_string())
      params.unit.resource_name = it->get<std::string>();
    params.entity_type = entity;
    params.since_unix_ms = int_or(unit, "since");
    params.cursor = counts.cursor;
    // Every cursor this attempt fetched: one coming back would repeat pages without end.
    std::unordered_set<std::string> fetched_cursors;
    if (params.cursor) fetched_cursors.insert(*params.cursor);
    // A unit that had a checkpoint but no cursor already finished its last page: it never stops
    // there (the last page completes the job), so a cursor-less checkpoint means "first page".

    const std::string provider_breaker = provider_circuit(provider);
    bool have_token = false;
    bool refreshed = false;
    int retried = 0;  // transient provider errors on the current page
    // The error of this attempt's last failed try of the current page (an AUTH_EXPIRED that was
    // refreshed, a RETRYABLE retried in place). A hold-back after it ends the attempt with that
    // error instead of deferring: a deferral costs no attempt and the next claim tries the page
    // afresh, so a page that always fails (its failures open the provider's circuit, or use up
    // the throttle) would be deferred and tried again for ever instead of dying.
    std::optional<std::string> page_error;
    // The gateway asked the unit to slow down (a 429, from its token lookup or a delivery): it
    // waits as long as the gateway said, or, without a Retry-After, a backoff that doubles with
    // each 429 in a row since its last page went through. At a second each (found by review), a
    // gateway shedding load for an hour had every unit fetch its page from the provider again,
    // and spend a throttle token, every second. Like a provider's rate limit, no attempt.
    auto gateway_busy = [&](const GatewayBusy& e) {
      counts.gateway_busy += 1;
      ++gateway_rate_limit_waits;
      const int64_t wait = e.retry_after_ms > 0 ? std::max<int64_t>(e.retry_after_ms, 1000)
                                                : gateway_busy_wait_ms(counts.gateway_busy);
      const std::string saved = counts_json(counts).dump();
      return defer_after([&] { ctx.checkpoint_without_progress(saved); },
                         Outcome::defer(jobs::later_by(ctx.now_ms(), wait),
                                        "rate limited by the gateway: " + e.message));
    };
    while (true) {
      PipelineOptions o = snapshot();
      int64_t now = ctx.now_ms();
      Probes probes(*this);  // given back at the end of this page unless they reported
      if (auto wait = hold_back(provider_breaker, installation, o, now, probes)) {
        if (page_error) {
          throw JobFailure(*page_error + " (not tried again: " + wait->reason + ")", false,
                           std::max<int64_t>(0, wait->until_ms - now));
        }
        return std::move(*wait);
      }
      if (!have_token) {
        try {
          params.unit.access_token = token_for(ctx, installation, o);
        } catch (const GatewayBusy& e) {
          return gateway_busy(e);
        }
        have_token = true;
      }
      Fetched fetched = fetch(*connector, params, installation, o, ctx, refreshed, retried);
      if (fetched.stop) {
        if (fetched.rate_limited) {  // counted in the unit's result, as a low limit's wait is
          counts.rate_limit_waits += 1;
          // No progress: the page is where it was, and the attempts before this one still count
          // (as progress, the failures of 502, 502, 429, 502, ... were forgotten at each 429).
          const std::string saved = counts_json(counts).dump();
          return defer_after([&] { ctx.checkpoint_without_progress(saved); },
                             std::move(*fetched.stop));
        }
        return *fetched.stop;
      }
      if (!fetched.page) {  // the token was refreshed, or a transient error: the same page again
        page_error = std::move(fetched.error);
        // Asked to stop (a drain past its grace, a cancel): not another try of the page. The
        // heartbeat throws JobInterrupted; the page's failure costs nothing when drained.
        if (ctx.stopping()) ctx.heartbeat();
        continue;
      }
      page_error.reset();
      const plugins::Page& p = *fetched.page;

      // The gateway may have failed while the page was fetched. Not when this page is its
      // half-open probe (begun by hold_back): the probe must go and report back, or the circuit
      // would wait for it until the next probe, and that one would wait the same way.
      if (p.size() > 0 && !probes.began(kGatewayCircuit)) {
        if (auto wait = wait_for_circuit(kGatewayCircuit, ctx.now_ms(), probes))
          return std::move(*wait);
      }
      const int64_t dispatching = ctx.now_ms();
      try {
        dispatch_page(ctx, p, provider, installation, org_id, o, dispatching);
      } catch (const GatewayBusy& e) {
        return gateway_busy(e);
      }
      counts.gateway_busy = 0;
      if (p.size() > 0)
        circuit_event(kGatewayCircuit, jobs::CircuitEvent::kSuccess, o.gateway_circuit, dispatching,
                      ctx.now_ms());
      ++pages;
      dispatched += static_cast<int64_t>(p.size());
      counts.pages += 1;
      counts.produced += produced_by_page(p.raw_count(), p.size());  // seed 000: its rawCount
      counts.dispatched += static_cast<int64_t>(p.size());

      std::optional<std::string_view> next = p.next_cursor();
      const std::string& token = params.unit.access_token;
      if (next && token.size() >= 6 && next->find(token) != std::string_view::npos) {
        // A cursor is stored in the checkpoint, which the admin API shows: never a token. (A
        // provider that puts the token in its next-page links, as Graph APIs do, needs a plugin
        // that takes it out.) The page itself was delivered.
        throw JobFailure("plugin '" + connector->info().id +
                             "' returned a next-page cursor that holds the unit's access token: "
                             "it would be stored in the checkpoint",
                         true);
      }
      if (next && !fetched_cursors.emplace(*next).second) {
        // Following it would fetch these pages again, forever (a cursor that does not advance,
        // or a cycle). The page itself was delivered.
        throw JobFailure("plugin '" + connector->info().id +
                             "' returned as the next page's a cursor this unit already fetched: "
                             "the unit would never end (cursor \"" +
                             plugin_said(next->substr(0, 200), token) + "\")",
                         true);
      }
      if (!next) {
        json result = counts_json(counts);
        result.erase("cursor");
        result["resourceId"] = params.unit.resource_id;
        result["entityType"] = entity;
        result["success"] = true;
        return Outcome::complete(result.dump());
      }
      counts.cursor = std::string(*next);
      params.cursor = counts.cursor;

      // Near the provider's limit: sleep until its reset, as a run-after (not a held worker).
      std::optional<backhaul_rate_limit_t> rl = p.rate_limit();
      now = ctx.now_ms();
      bool low = rl && rl->limit > 0 &&
                 static_cast<double>(rl->remaining) < o.rate_limit_floor * rl->limit &&
                 rl->reset_at_unix_ms > now;
      if (!low) {
        ctx.checkpoint(counts_json(counts).dump());  // throws JobInterrupted on cancel/drain
        continue;
      }
      counts.rate_limit_waits += 1;
      ++rate_limit_waits;
      // A reset further away than a day is a bad header (seconds read as milliseconds, say):
      // waited for a day, as a connector's retry-after is at most (plugin.cpp).
      const std::string saved = counts_json(counts).dump();
      return defer_after([&] { ctx.checkpoint(saved); },
                         Outcome::defer(std::min(rl->reset_at_unix_ms, now + kDayMs),
                                        "rate limit: " + std::to_string(rl->remaining) + " of " +
                                            std::to_string(rl->limit) + " requests left"));
    }
  }

  // Sends every event of the page to the gateway: dispatch_concurrency slices side by side, each
  // slice pipelined on one connection (delivery order is not the backfill's concern; a delivery
  // whose answer was lost goes out again, and the gateway dedupes by delivery id). A delivery
  // that failed transiently is retried on its own; one that fails for good fails the attempt
  // through gateway_failed(), and the page is not checkpointed, so the retry sends it again.
  void dispatch_page(JobContext& ctx, const plugins::Page& p, const std::string& provider,
                     const std::string& installation, const std::string& org_id,
                     const PipelineOptions& o, int64_t started) {
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::atomic<bool> failed_transiently{false};  // a delivery of this page was retried here
    std::atomic<bool> stopped{false};             // a retry's pause stopped: the job should stop
    std::mutex error_mutex;
    std::optional<gateway::GatewayError> error;
    auto give_up = [&](gateway::GatewayError e) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::move(e);
      failed = true;
    };
    // Retries `d` (its `retry`-th retry first, up to transient_retries), each after the usual
    // pause or the last answer's Retry-After (`asked_ms`), whichever is longer; false once it gave
    // up.
    auto retry_one = [&](const gateway::Delivery& d, int retry, int64_t asked_ms) {
      failed_transiently = true;
      for (;; ++retry) {
        ++retries_in_place;
        if (!pause(ctx, o, retry - 1, asked_ms)) {
          stopped = true;
          failed = true;  // the other slices send nothing more either
          return false;
        }
        try {
          if (gateway.dispatch(provider, d) == gateway::DispatchResult::kDuplicate) ++duplicates;
          return true;
        } catch (const gateway::GatewayError& err) {
          asked_ms = err.retry_after_ms();
          if (!retry_in_place(err, retry, o)) {
            give_up(err);
            return false;
          }
        } catch (const std::exception& err) {
          give_up(gateway::GatewayError(err.what(), 0, true));
          return false;
        }
      }
    };
    const size_t threads =
        std::min<size_t>(static_cast<size_t>(std::max(o.dispatch_concurrency, 1)), p.size());
    const size_t slice = threads == 0 ? 1 : (p.size() + threads - 1) / threads;
    auto send_slices = [&] {
      for (size_t begin = next.fetch_add(slice); begin < p.size() && !failed;
           begin = next.fetch_add(slice)) {
        std::vector<gateway::Delivery> batch;
        for (size_t i = begin; i < std::min(p.size(), begin + slice); ++i) {
          plugins::EventView e = p.event(i);
          batch.push_back({installation, org_id, e.delivery_id, e.event_type, e.payload_json});
        }
        std::vector<gateway::GatewayClient::Outcome> outcomes;
        try {
          outcomes = gateway.dispatch_batch(provider, batch);
        } catch (const std::exception& err) {
          return give_up(gateway::GatewayError(err.what(), 0, true));
        }
        for (size_t k = 0; k < outcomes.size() && !failed; ++k) {
          if (outcomes[k].result) {
            if (*outcomes[k].result == gateway::DispatchResult::kDuplicate) ++duplicates;
            continue;
          }
          const gateway::GatewayError& err = *outcomes[k].error;
          if (!retry_in_place(err, 0, o)) return give_up(err);
          if (!retry_one(batch[k], 1, err.retry_after_ms())) return;
        }
      }
    };
    // Nothing may leave a helper thread (std::terminate) or the caller before the helpers are
    // joined (a joinable std::thread destroyed: std::terminate too). A bad_alloc building a batch
    // fails the page as an error of the gateway's call would.
    auto work = [&] {
      try {
        send_slices();
      } catch (const std::exception& e) {
        give_up(gateway::GatewayError(std::string("sending the page: ") + e.what(), 0, true));
      }
    };
    std::vector<std::thread> helpers;
    for (size_t k = 1; k < threads; ++k) {
      try {
        helpers.emplace_back(work);
      } catch (const std::system_error&) {  // no thread to be had (a limit): the slices are
        break;                              // shared, so fewer threads still send them all
      }
    }
    work();
    for (std::thread& t : helpers) t.join();
    // Before any error: the page is not done, and the job stops as asked (no attempt spent).
    if (stopped) stop_now(ctx, "sending the page's events");
    if (!error) return;
    if (error->rate_limited() && failed_transiently) {
      // A wait would cost no attempt and the page would go again afresh: a gateway answering
      // 500, 429, 500, 429, ... would defer the unit for ever. The attempt fails instead, retried
      // no sooner than the gateway asked.
      gateway_answered(*error, o, started);
      throw JobFailure(std::string(error->what()) + " (after a transient failure of this page)",
                       false, std::max<int64_t>(error->retry_after_ms(), 1000));
    }
    // The attempt's token lookup, its first call of the gateway (any probe of it), went through:
    // the gateway is up, and a failure of the page is one failure of it, which costs the attempt
    // (a delivery it always refuses must end its unit).
    gateway_failed(*error, o, started, /*gateway_up=*/true);
  }

  // The installation's access token, from the gateway (a gateway_lookup).
  std::string token_for(JobContext& ctx, const std::string& installation,
                        const PipelineOptions& o) {
    return gateway_lookup(ctx, o, [&] { return gateway.access_token(installation); });
  }

  // One page, or why there is none: neither (the token was refreshed, or a transient error is
  // retried: fetch the same page again) or `stop` (wait until the provider's limit resets).
  // Refreshes at most once per page: a second AUTH_EXPIRED fails the attempt. A RETRYABLE error
  // is retried in place up to transient_retries times per page, then fails the attempt (the job's
  // retry resumes from the checkpoint). Other errors throw JobFailure.
  struct Fetched {
    std::optional<plugins::Page> page;
    std::optional<Outcome> stop;
    bool rate_limited = false;  // stop: the provider's RATE_LIMITED, a wait for the unit's counts
    std::optional<std::string> error = std::nullopt;  // neither: the error of the try to make again
  };
  Fetched fetch(const plugins::Connector& connector, plugins::FetchParams& params,
                const std::string& installation, const PipelineOptions& o, JobContext& ctx,
                bool& refreshed, int& retried) {
    const std::string breaker = provider_circuit(connector.info().id);
    auto started = std::chrono::steady_clock::now();
    const int64_t began = ctx.now_ms();  // host clock, for the circuit
    try {
      plugins::Page page = connector.fetch_page(params);
      note_call(started);
      refreshed = false;
      retried = 0;
      circuit_event(breaker, jobs::CircuitEvent::kSuccess, o.provider_circuit, began, ctx.now_ms());
      return {std::move(page), std::nullopt};
    } catch (const plugins::PluginCrashed& e) {
      // The plugin crashed, exited or hung in its worker process: an attempt of the job, and
      // nothing about the provider (no circuit event, no retry in place).
      note_call(started);
      throw JobFailure("RETRYABLE: " + plugin_said(e.what(), params.unit.access_token));
    } catch (const plugins::ConnectorFailure& e) {
      note_call(started);
      const std::string what = std::string(plugins::status_name(e.status())) + ": " +
                               plugin_said(e.what(), params.unit.access_token);
      // The provider answered, about our token or our rate: it is up (and this may be its
      // half-open probe, which must report back).
      if (provider_answered(e.status()))
        circuit_event(breaker, jobs::CircuitEvent::kSuccess, o.provider_circuit, began,
                      ctx.now_ms());
      switch (e.status()) {
        case BACKHAUL_AUTH_EXPIRED:
          if (refreshed) throw JobFailure("token refreshed but still rejected: " + what);
          ++token_refreshes;
          refreshed = true;
          try {
            params.unit.access_token = token_for(ctx, installation, o);
          } catch (const GatewayBusy& busy) {
            // Not a wait (no attempt): the next claim would meet the rejected token again, and a
            // provider rejecting it while the gateway sheds load would never end the job.
            throw JobFailure(what + " (the token could not be refreshed: " + busy.message + ")",
                             false, std::max<int64_t>(busy.retry_after_ms, 1000));
          } catch (const GatewayDown& down) {
            // Likewise: this refresh began no probe of its own (it skips the circuit's check).
            throw JobFailure(what + " (the token could not be refreshed: " + down.message + ")",
                             false, std::max<int64_t>(down.until_ms - ctx.now_ms(), 1000));
          }
          return {std::nullopt, std::nullopt, false, what};
        case BACKHAUL_RATE_LIMITED: {
          ++rate_limit_waits;
          const int64_t wait = provider_rate_limit_wait_ms(e.retry_after_ms());
          if (retried > 0 || refreshed) {
            // After a failed try of this page in this attempt: a wait would cost no attempt and
            // the next claim would try the page afresh, so a provider answering 502, 429, 502,
            // 429, ... would never end the job. The attempt fails, retried after the wait.
            throw JobFailure(what + " (after a failed try of this page)", false, wait);
          }
          return {std::nullopt,
                  Outcome::defer(ctx.now_ms() + wait, "rate limited by the provider: " + what),
                  true};
        }
        case BACKHAUL_RETRYABLE:
          circuit_event(breaker, jobs::CircuitEvent::kFailure, o.provider_circuit, began,
                        ctx.now_ms());
          if (retried >= o.transient_retries || e.retry_after_ms() > o.transient_retry_ms * 4)
            throw JobFailure(what, false, e.retry_after_ms());
          ++retries_in_place;
          if (!pause(ctx, o, retried++, e.retry_after_ms())) stop_now(ctx, what);
          return {std::nullopt, std::nullopt, false, what};
        default:
          throw JobFailure(what, true);
      }
    }
  }

  // Whether a connector error is the provider's own answer about us (an expired token, a rate
  // limit): the provider is up. A FATAL error may be the plugin's own (a malformed page) and says
  // nothing certain; a probe that ends with it is given back (Probes).
  static bool provider_answered(backhaul_status_t status) {
    return status == BACKHAUL_AUTH_EXPIRED || status == BACKHAUL_RATE_LIMITED;
  }

  // `deferral`, once `save` (a checkpoint) has run. Draining, the checkpoint throws after saving;
  // the deferral stands all the same: released without its run-after, the job would be claimed
  // at once (by this host's next start, or another host) and meet the same limit again. So it does
  // when the store failed to save (a lock wait timeout): a failed attempt instead was retried in
  // seconds, into the limit again, and on the last attempt made a dead letter of a wait. Only the
  // counts are lost, or the page's cursor (the page is fetched and sent again, under the same
  // delivery ids). A lost lease is a JobInterrupted, and ends the handler.
  template <typename Save>
  Outcome defer_after(Save save, Outcome deferral) {
    try {
      save();
    } catch (const jobs::JobInterrupted& e) {
      if (e.reason() != jobs::JobInterrupted::Reason::kDraining) throw;
    } catch (const StorageError& e) {
      log->warn("the checkpoint before a wait failed; waiting all the same: {}", e.what());
    }
    return deferral;
  }

  // Waits in_place_wait_ms() of real time before a retry in place. False when it stopped early
  // because the job should stop (ctx.stopping(): a drain past its grace, a cancel, a lost lease):
  // a worker sleeping the whole wait held up a hurried drain (21 s for one page of deliveries
  // answered 503 with Retry-After 1) and a cancel. [any-thread]: the page's slices call it too.
  static bool pause(const JobContext& ctx, const PipelineOptions& o, int retry,
                    int64_t asked_ms = 0) {
    constexpr auto kStep = std::chrono::milliseconds(20);
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(in_place_wait_ms(o, retry, asked_ms));
    for (auto now = std::chrono::steady_clock::now(); now < until;
         now = std::chrono::steady_clock::now()) {
      if (ctx.stopping()) return false;
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(until - now, kStep));
    }
    return !ctx.stopping();
  }

  // After a pause() that stopped early, on the handler's thread: the job's heartbeat throws
  // JobInterrupted, which ends the handler as the drain, cancel or lost lease asks. Should it not
  // (the stop was withdrawn), the try that was to be made fails the attempt instead.
  static void stop_now(JobContext& ctx, const std::string& what) {
    ctx.heartbeat();
    throw JobFailure(what + " (its retry in place was stopped)", false);
  }

  void note_call(std::chrono::steady_clock::time_point started) {
    ++plugin_calls;
    plugin_call_us += std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - started)
                          .count();
  }
};

int64_t produced_by_page(uint64_t raw_count, size_t events) {
  return static_cast<int64_t>(std::max<uint64_t>(std::min(raw_count, kMaxRawCount), events));
}

int64_t in_place_wait_ms(const PipelineOptions& o, int retry, int64_t asked_ms) {
  // transient_retry_ms * 2^retry without overflow: past kMaxInPlaceWaitMs it is capped anyway.
  int64_t backoff = std::max<int64_t>(o.transient_retry_ms, 0);
  for (int i = 0; i < retry && backoff < kMaxInPlaceWaitMs; ++i) backoff *= 2;
  return std::min(std::max(backoff, std::min(asked_ms, kInPlaceRetryAfterMs)), kMaxInPlaceWaitMs);
}

Pipeline::Pipeline(jobs::JobStore& store, const Clock& clock, const gateway::GatewayClient& gateway,
                   ConnectorLookup connectors, PipelineOptions options)
    : impl_(std::make_unique<Impl>(store, clock, gateway, std::move(connectors),
                                   std::move(options))) {}

Pipeline::~Pipeline() = default;

PipelineOptions Pipeline::options() const { return impl_->snapshot(); }

void Pipeline::apply_caps() {
  PipelineOptions o = impl_->snapshot();
  impl_->store.set_caps(kRunKind, o.run_caps);
  impl_->store.set_caps(kEntityKind, o.entity_caps);
}

void Pipeline::register_handlers(jobs::Scheduler& scheduler) {
  Impl* impl = impl_.get();
  scheduler.register_handler(kRunKind, [impl](JobContext& ctx) {
    return impl->handle(ctx, [impl](JobContext& c) { return impl->run_job(c); });
  });
  scheduler.register_handler(kEntityKind, [impl](JobContext& ctx) {
    return impl->handle(ctx, [impl](JobContext& c) { return impl->entity_job(c); });
  });
}

RunStart Pipeline::start_run(const RunRequest& request) {
  validate_request(request, impl_->connectors(request.provider));
  PipelineOptions o = impl_->snapshot();
  jobs::JobSpec spec;
  spec.kind = kRunKind;
  spec.payload = request_json(request).dump();
  spec.concurrency_key = request.installation_id;
  spec.dedupe_key = request.installation_id;  // one active run per installation (D10)
  spec.max_attempts = o.run_max_attempts;
  jobs::EnqueueResult r = impl_->store.enqueue(spec, impl_->clock.now_ms());
  if (r.created) {
    impl_->log->info("run {} requested for {} ({}, depth {} days)", r.id, request.installation_id,
                     request.provider, request.depth_days);
  } else if (std::optional<jobs::Job> active = impl_->store.get(r.id);
             active && active->cancel_requested && !jobs::is_terminal(active->status)) {
    // Returned as the active run, it would end cancelled and run nothing of this request.
    throw jobs::InvalidTransition("run " + std::to_string(r.id) + " of " + request.installation_id +
                                  " is being cancelled: request a new run once it has stopped");
  }
  return {r.id, r.created};
}

Preview Pipeline::preview(const RunRequest& request) {
  const plugins::Connector* connector = impl_->connectors(request.provider);
  validate_request(request, connector);
  gateway::Connection connection;
  try {
    connection = impl_->gateway.connection(request.installation_id);
  } catch (const gateway::GatewayError& e) {
    // The request's mistake, as for a run (which dies with "connection not found"), not a 502.
    if (e.status() == 404) {
      throw InvalidRequest("installationId", "installationId: the gateway has no connection " +
                                                 request.installation_id);
    }
    throw;
  }
  if (connection.status != "active")
    throw InvalidRequest("installationId", "installationId: connection " + request.installation_id +
                                               " is not active (status: " + connection.status +
                                               ")");
  if (connection.provider != request.provider)
    throw InvalidRequest("provider", "provider: connection " + request.installation_id +
                                         " belongs to '" + connection.provider + "'");
  Preview p;
  p.installation_id = request.installation_id;
  p.provider = request.provider;
  p.org_id = request.org_id.value_or(connection.org_id);
  p.since_ms = impl_->clock.now_ms() - int64_t{request.depth_days} * kDayMs;
  for (const auto& resource : connection.resources)
    for (const std::string& t : entity_types_for(request, *connector))
      p.units.push_back({resource.id, resource.name, t});
  // One page request per unit at least, plus the token and scope check.
  p.estimated_requests = static_cast<int64_t>(p.units.size()) + (p.units.empty() ? 0 : 1);
  return p;
}

namespace {

RunView view_of(const jobs::Job& job) {
  RunView v;
  v.id = job.id;
  json payload = json::parse(job.payload, nullptr, false);
  if (payload.is_object()) v.request = request_from(payload);
  v.status = run_status(job);
  v.created_ms = job.created_ms;
  v.started_ms = job.started_ms;
  v.finished_ms = job.finished_ms;
  if (job.status == JobStatus::kDead || job.status == JobStatus::kCancelled)
    v.error = job.last_error;
  const std::optional<std::string>& doc =
      job.status == JobStatus::kSucceeded ? job.result : job.checkpoint;
  json j = doc ? json::parse(*doc, nullptr, false) : json();
  if (j.is_object()) {
    v.since_ms = int_or(j, "since");
    if (auto it = j.find("units"); it != j.end() && it->is_array())
      v.units_total = static_cast<int>(it->size());
    if (auto it = j.find("results"); it != j.end() && it->is_array())
      v.units_total = static_cast<int>(it->size() + int_or(j, "resultsOmitted"));
    if (auto it = j.find("unusableResources"); it != j.end() && it->is_array())
      v.unusable_resources = static_cast<int>(it->size());
  }
  return v;
}

UnitProgress unit_of(const jobs::Job& child) {
  UnitProgress u;
  u.job_id = child.id;
  json payload = json::parse(child.payload, nullptr, false);
  if (payload.is_object()) {
    u.entity_type = string_or(payload, "entityType");
    json resource = payload.value("resource", json::object());
    if (resource.is_object()) {
      u.resource_id = string_or(resource, "id");
      if (auto it = resource.find("name"); it != resource.end() && it->is_string())
        u.resource_name = it->get<std::string>();
    }
  }
  u.status = std::string(jobs::to_string(child.status));
  u.attempts = child.attempts;
  UnitCounts c =
      counts_from(child.status == JobStatus::kSucceeded ? child.result : child.checkpoint);
  u.pages = c.pages;
  u.events_produced = c.produced;
  u.events_dispatched = c.dispatched;
  u.rate_limit_waits = c.rate_limit_waits;
  if (child.status != JobStatus::kSucceeded) u.error = child.last_error;
  return u;
}

}  // namespace

std::optional<RunView> Pipeline::get_run(JobId run_id, bool with_units) {
  std::optional<jobs::Job> job = impl_->store.get(run_id);
  if (!job || job->kind != kRunKind) return std::nullopt;
  return live_view(*job, with_units);
}

// The run's own record, with its units' live counts and status: a run whose failed units are
// replayed from the dead letters is running again, then succeeded.
RunView Pipeline::live_view(const jobs::Job& run, bool with_units) {
  RunView v = view_of(run);
  int kids = 0;
  const auto first_unit = static_cast<std::ptrdiff_t>(v.units.size());
  impl_->for_each_child(run.id, [&](const jobs::Job& child) {
    ++kids;
    UnitProgress u = unit_of(child);
    if (jobs::is_terminal(child.status)) ++v.units_done;
    if (jobs::is_terminal(child.status) && child.status != JobStatus::kSucceeded) ++v.units_failed;
    v.pages += u.pages;
    v.events_produced += u.events_produced;
    v.events_dispatched += u.events_dispatched;
    v.rate_limit_waits += u.rate_limit_waits;
    if (with_units) v.units.push_back(std::move(u));
  });
  std::reverse(v.units.begin() + first_unit, v.units.end());  // oldest (enqueue order) first
  if (kids > 0) v.units_total = std::max(v.units_total, kids);
  // A run that finished with failed units whose dead letters were retried since: while a replay
  // runs it is running again, and once every unit has succeeded it has succeeded.
  // Resources the gateway listed that named none (unusableResources) were never backfilled: no
  // replay of units makes such a run succeed.
  if (v.status == "failed" && run.status == JobStatus::kSucceeded && kids > 0) {
    const bool replaying = v.units_done < v.units_total;
    if (replaying) v.status = "running";
    if (!replaying && v.units_failed == 0 && v.unusable_resources == 0) v.status = "succeeded";
  }
  return v;
}

RunPage Pipeline::list_runs(const RunQuery& query) {
  static const std::set<std::string> kStatuses = {"queued", "running", "succeeded", "failed",
                                                  "cancelled"};
  if (query.status && !kStatuses.count(*query.status))
    throw InvalidRequest("status",
                         "status: must be one of queued, running, succeeded, failed, "
                         "cancelled (got '" +
                             *query.status + "')");
  const size_t limit = std::clamp<size_t>(query.limit, 1, 500);
  RunPage page;
  jobs::JobQuery q;
  q.kind = kRunKind;
  q.concurrency_key = query.installation_id;
  q.before_id = query.before_id;
  q.limit = limit;
  // The page's last run once the page is full: there is a next page only if one more matches.
  std::optional<JobId> last;
  while (true) {
    jobs::JobPage jobs_page = impl_->store.list(q);
    for (const jobs::Job& job : jobs_page.jobs) {
      RunView v = view_of(job);
      // Only a failed run can have been replayed since (its units read again, like get_run).
      if (v.status == "failed" && job.status == JobStatus::kSucceeded) v = live_view(job, false);
      if (query.status && v.status != *query.status) continue;
      if (last) {
        page.next_before = *last;
        return page;
      }
      page.runs.push_back(std::move(v));
      if (page.runs.size() == limit) last = job.id;
    }
    if (!jobs_page.next_before) return page;
    q.before_id = jobs_page.next_before;
  }
}

std::optional<jobs::CancelOutcome> Pipeline::cancel_run(JobId run_id) {
  std::optional<jobs::Job> job = impl_->store.get(run_id);
  if (!job || job->kind != kRunKind) return std::nullopt;
  const int64_t now = impl_->clock.now_ms();
  jobs::CancelOutcome outcome = impl_->store.cancel(run_id, now);
  // Units of a run that is still fanning out (running) are cancelled here; a waiting run's
  // units were cancelled with it.
  impl_->for_each_child(run_id, [&](const jobs::Job& child) {
    if (!jobs::is_terminal(child.status)) impl_->store.cancel(child.id, now);
  });
  impl_->log->info("run {}: cancel requested", run_id);
  return outcome;
}

int Pipeline::cancel_installation(const std::string& installation_id) {
  if (installation_id.empty())
    throw InvalidRequest("installationId", "installationId: must be a non-empty string");
  return impl_->store.cancel_key(installation_id, "", impl_->clock.now_ms());
}

RateLimitSettings Pipeline::rate_limits() const {
  PipelineOptions o = impl_->snapshot();
  RateLimitSettings s{o.throttle_per_hour, o.throttle_burst, o.rate_limit_floor, o.entity_caps,
                      o.run_caps};
  const std::map<std::string, jobs::Caps> in_store = impl_->store.caps();
  if (auto it = in_store.find(kEntityKind); it != in_store.end()) s.entity_caps = it->second;
  if (auto it = in_store.find(kRunKind); it != in_store.end()) s.run_caps = it->second;
  return s;
}

RateLimitSettings Pipeline::update_rate_limits(
    const std::function<void(RateLimitSettings&)>& edit) {
  std::lock_guard one_change_at_a_time(impl_->settings_mutex);
  const RateLimitSettings before = rate_limits();
  RateLimitSettings s = before;
  edit(s);
  // As the configuration's throttle_per_hour (schemas/config.schema.json).
  if (!(s.throttle_per_hour >= 1))
    throw InvalidRequest("throttlePerHour", "throttlePerHour: must be >= 1");
  if (!(s.throttle_burst >= 1))
    throw InvalidRequest("throttleBurst", "throttleBurst: must be >= 1");
  if (!(s.rate_limit_floor >= 0 && s.rate_limit_floor <= 1))
    throw InvalidRequest("rateLimitFloor", "rateLimitFloor: must be within [0, 1]");
  for (auto [name, caps] : {std::pair{"entityCaps", s.entity_caps}, {"runCaps", s.run_caps}}) {
    if (caps.per_key < 0 || caps.global < 0)
      throw InvalidRequest(name, std::string(name) + ": caps must be >= 0 (0 = unlimited)");
  }
  auto same = [](const jobs::Caps& a, const jobs::Caps& b) {
    return a.per_key == b.per_key && a.global == b.global;
  };
  if (!same(s.run_caps, before.run_caps)) impl_->store.set_caps(kRunKind, s.run_caps);
  if (!same(s.entity_caps, before.entity_caps)) impl_->store.set_caps(kEntityKind, s.entity_caps);
  {
    std::lock_guard lock(impl_->mutex);
    impl_->options.throttle_per_hour = s.throttle_per_hour;
    impl_->options.throttle_burst = s.throttle_burst;
    impl_->options.rate_limit_floor = s.rate_limit_floor;
    impl_->options.entity_caps = s.entity_caps;
    impl_->options.run_caps = s.run_caps;
  }
  return s;
}

PipelineMetrics Pipeline::metrics() const {
  const Impl& i = *impl_;
  // Designated, so that a counter added to PipelineMetrics cannot shift the others.
  return {.pages = i.pages.load(),
          .events_dispatched = i.dispatched.load(),
          .events_duplicate = i.duplicates.load(),
          .rate_limit_waits = i.rate_limit_waits.load(),
          .gateway_rate_limit_waits = i.gateway_rate_limit_waits.load(),
          .throttle_waits = i.throttle_waits.load(),
          .circuit_deferrals = i.circuit_deferrals.load(),
          .token_refreshes = i.token_refreshes.load(),
          .transient_retries = i.retries_in_place.load(),
          .plugin_calls = i.plugin_calls.load(),
          .plugin_call_us = i.plugin_call_us.load()};
}

}  // namespace backhaul::pipeline
