// /health/live, /health/ready and /metrics (SPEC F4). No auth: they carry no tenant data.
#include <algorithm>
#include <set>
#include <sstream>

#include "core/http/http_metrics.h"
#include "host/daemon/api_support.h"

namespace backhaul::daemon {
namespace {

using host::Response;
using nlohmann::json;

constexpr jobs::JobStatus kAllStatuses[] = {jobs::JobStatus::kQueued,  jobs::JobStatus::kRunning,
                                            jobs::JobStatus::kWaiting, jobs::JobStatus::kSucceeded,
                                            jobs::JobStatus::kDead,    jobs::JobStatus::kCancelled};
constexpr jobs::DeadLetterStatus kAllLetterStatuses[] = {
    jobs::DeadLetterStatus::kPending, jobs::DeadLetterStatus::kRetrying,
    jobs::DeadLetterStatus::kResolved, jobs::DeadLetterStatus::kIgnored};

// A Prometheus label value: backslash, quote and newline escaped.
std::string label(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// `value` in seconds, exactly ("61.5", "1234567.891", "0"): streamed as a double, a sum of job
// times past a million seconds printed as 1.23457e+06, a counter moving in 10 s steps.
// `per_second`: 1000 for milliseconds, 1000000 for microseconds.
std::string seconds(int64_t value, uint64_t per_second = 1000) {
  const uint64_t magnitude =
      value < 0 ? 0 - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  std::string text = (value < 0 ? "-" : "") + std::to_string(magnitude / per_second);
  if (const uint64_t fraction = magnitude % per_second; fraction != 0) {
    std::string digits = std::to_string(per_second + fraction).substr(1);  // "005", "500"
    digits.erase(digits.find_last_not_of('0') + 1);
    text += '.' + digits;
  }
  return text;
}

void family(std::ostringstream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

Response ready(Call& call) {
  json components = json::object();
  std::vector<std::string> failing;
  int64_t queued = 0;
  // Queued jobs of kinds no handler here runs: nothing will ever claim them on this host (a typo,
  // a tool writing the store, a newer version's kind). Reported, not failing readiness: hosts
  // running other kinds may share the store.
  json unhandled = json::object();
  std::set<std::string> handled;
  if (call.deps.handled_kinds) {
    for (std::string& kind : call.deps.handled_kinds()) handled.insert(std::move(kind));
  }
  bool readable = true;
  try {
    for (const auto& [kind, count] : call.deps.store.queued_by_kind()) {
      queued += count;
      if (call.deps.handled_kinds && count > 0 && !handled.count(kind)) unhandled[kind] = count;
    }
    components["store"] = {{"status", "healthy"}, {"backend", call.deps.store.backend()}};
  } catch (const std::exception& e) {
    readable = false;
    components["store"] = {{"status", "unhealthy"}, {"error", e.what()}};
    failing.push_back("store");
  }
  // A store that answers reads may still refuse the scheduler's writes (a MySQL server turned
  // read-only, a full disk). Its failing operations are listed: "degraded" at first, failing
  // readiness once an operation's calls have kept failing, with no success between, over the
  // grace (a failure at least that long after the first: one failure then a long wait for the
  // next try, a sweep's say, is no evidence of an outage).
  if (readable && call.deps.scheduler_stats) {
    const jobs::SchedulerStats stats = call.deps.scheduler_stats();
    json operations = json::object();
    std::string error;
    for (const auto& [operation, f] : stats.store_failures) {
      const int64_t for_ms = f.last_ms - f.since_ms;
      operations[operation] = {{"failing_for_ms", for_ms},
                               {"failures", f.failures},
                               {"last_failure_ms_ago", call.now_ms() - f.last_ms},
                               {"error", f.error}};
      if (error.empty() && for_ms >= std::max(call.options.store_failure_grace_ms, f.evidence_ms)) {
        error = operation + " failing for " + std::to_string(for_ms / 1000) + " s: " + f.error;
      }
    }
    if (!operations.empty()) {
      components["store"]["status"] = error.empty() ? "degraded" : "unhealthy";
      if (!error.empty()) {
        components["store"]["error"] = error;
        failing.push_back("store");
      }
      components["store"]["failing_operations"] = std::move(operations);
    }
    // Every heartbeat lane held by a beat that waits (on MySQL, rows other transactions hold) and
    // beats queued for one: the jobs behind them lose their leases unless a lane comes free. Not
    // a reason to restart; "degraded", naming the job whose beat has waited longest.
    const jobs::HeartbeatLanes& beats = stats.heartbeats;
    if (beats.lanes > 0 && beats.busy == beats.lanes && beats.queued > 0 &&
        beats.oldest_ms >= call.options.store_failure_grace_ms) {
      if (components["store"]["status"] == "healthy") components["store"]["status"] = "degraded";
      components["store"]["heartbeat_lanes"] = {{"busy", beats.busy},
                                                {"queued", beats.queued},
                                                {"oldest_ms", beats.oldest_ms},
                                                {"oldest_job", beats.oldest_job}};
    }
  }
  const size_t loaded = call.deps.plugins.plugins().size();
  components["plugins"] = {{"status", loaded > 0 ? "healthy" : "unhealthy"}, {"loaded", loaded}};
  if (loaded == 0) failing.push_back("plugins");
  if (!readable) {
    components["backlog"] = {{"status", "unknown"}};
  } else {
    const bool over = queued > call.options.backlog_threshold;
    components["backlog"] = {{"status", over ? "unhealthy" : "healthy"},
                             {"queued", queued},
                             {"threshold", call.options.backlog_threshold}};
    if (over) failing.push_back("backlog");
  }
  if (call.deps.handled_kinds && !readable) {
    components["kinds"] = {{"status", "unknown"}};
  } else if (call.deps.handled_kinds) {
    components["kinds"] = {{"status", unhandled.empty() ? "healthy" : "degraded"},
                           {"unhandled", std::move(unhandled)}};
  }
  json body = {{"status", failing.empty() ? "healthy" : "unhealthy"},
               {"components", std::move(components)}};
  if (!failing.empty()) body["failing"] = failing;
  return call.ok(failing.empty() ? 200 : 503, std::move(body));
}

std::string_view circuit_value(const std::string& state) {
  if (state == "open") return "2";
  if (state == "half_open") return "1";
  return "0";
}

}  // namespace

Response handle_health(Call& call, Route rest) {
  allow_only(call, {"GET"});
  if (rest.size() == 1 && rest[0] == "live") return call.ok(200, {{"status", "alive"}});
  if (rest.size() == 1 && rest[0] == "ready") return ready(call);
  throw not_found("NOT_FOUND", "no route for " + call.request.path);
}

Response handle_metrics(Call& call) {
  std::ostringstream out;
  jobs::JobStore& store = call.deps.store;

  family(out, "backhaul_jobs", "gauge", "Jobs in the store by kind and status (queue depth).");
  std::map<std::string, std::map<std::string_view, int64_t>> jobs_by_kind;
  for (const auto& [key, count] : store.counts()) {
    jobs_by_kind[key.first][jobs::to_string(key.second)] = count;
  }
  for (auto& [kind, by_status] : jobs_by_kind) {
    for (jobs::JobStatus status : kAllStatuses) {
      out << "backhaul_jobs{kind=\"" << label(kind) << "\",status=\"" << jobs::to_string(status)
          << "\"} " << by_status[jobs::to_string(status)] << '\n';
    }
  }

  family(out, "backhaul_dead_letters", "gauge", "Dead letters by kind and status.");
  std::map<std::string, std::map<std::string_view, int64_t>> letters_by_kind;
  for (const auto& [key, count] : store.dead_letter_stats()) {
    letters_by_kind[key.first][jobs::to_string(key.second)] = count;
  }
  for (auto& [kind, by_status] : letters_by_kind) {
    for (jobs::DeadLetterStatus status : kAllLetterStatuses) {
      out << "backhaul_dead_letters{kind=\"" << label(kind) << "\",status=\""
          << jobs::to_string(status) << "\"} " << by_status[jobs::to_string(status)] << '\n';
    }
  }

  if (call.deps.scheduler_stats) {
    const jobs::SchedulerStats stats = call.deps.scheduler_stats();
    family(out, "backhaul_scheduler_jobs_total", "counter",
           "Job executions by this process by outcome since start.");
    const std::pair<const char*, int64_t> events[] = {
        {"claimed", stats.claimed},        {"succeeded", stats.succeeded},
        {"failed", stats.failed},          {"deferred", stats.deferred},
        {"waiting", stats.waiting},        {"released", stats.released},
        {"interrupted", stats.interrupted}};
    for (const auto& [event, value] : events) {
      out << "backhaul_scheduler_jobs_total{event=\"" << event << "\"} " << value << '\n';
    }
    family(out, "backhaul_scheduler_in_flight", "gauge", "Jobs claimed and not yet finished.");
    out << "backhaul_scheduler_in_flight " << stats.in_flight << '\n';
    constexpr const char* kOperations[] = {"claim", "heartbeat", "finish", "sweep"};
    family(out, "backhaul_scheduler_store_failing", "gauge",
           "1 while the calls of a store operation of the scheduler are failing.");
    for (const char* operation : kOperations) {
      out << "backhaul_scheduler_store_failing{operation=\"" << operation << "\"} "
          << stats.store_failures.count(operation) << '\n';
    }
    family(out, "backhaul_scheduler_store_failing_seconds", "gauge",
           "From the first to the last of the failed calls of each store operation of the "
           "scheduler since its last success.");
    for (const char* operation : kOperations) {
      auto it = stats.store_failures.find(operation);
      const int64_t for_ms =
          it == stats.store_failures.end() ? 0 : it->second.last_ms - it->second.since_ms;
      out << "backhaul_scheduler_store_failing_seconds{operation=\"" << operation << "\"} "
          << seconds(for_ms) << '\n';
    }
    const jobs::HeartbeatLanes& beats = stats.heartbeats;
    family(out, "backhaul_scheduler_heartbeat_lanes", "gauge",
           "The scheduler's heartbeat lanes: busy making a beat, or idle.");
    out << "backhaul_scheduler_heartbeat_lanes{state=\"busy\"} " << beats.busy << '\n'
        << "backhaul_scheduler_heartbeat_lanes{state=\"idle\"} " << beats.lanes - beats.busy
        << '\n';
    family(out, "backhaul_scheduler_heartbeats_queued", "gauge",
           "Heartbeats due and waiting for a free lane.");
    out << "backhaul_scheduler_heartbeats_queued " << beats.queued << '\n';
    family(out, "backhaul_scheduler_heartbeat_oldest_seconds", "gauge",
           "How long the heartbeat under way longest has been waiting for the store; 0 if none.");
    out << "backhaul_scheduler_heartbeat_oldest_seconds " << seconds(beats.oldest_ms) << '\n';
    family(out, "backhaul_job_wait_seconds", "summary",
           "Time from due (created or run-after) to the start of a handler run, by kind.");
    for (const auto& [kind, l] : stats.latency) {
      out << "backhaul_job_wait_seconds_sum{kind=\"" << label(kind) << "\"} "
          << seconds(l.wait_ms_sum) << '\n'
          << "backhaul_job_wait_seconds_count{kind=\"" << label(kind) << "\"} " << l.runs << '\n';
    }
    family(out, "backhaul_job_run_seconds", "summary", "Time in the handler per run, by kind.");
    for (const auto& [kind, l] : stats.latency) {
      out << "backhaul_job_run_seconds_sum{kind=\"" << label(kind) << "\"} "
          << seconds(l.run_ms_sum) << '\n'
          << "backhaul_job_run_seconds_count{kind=\"" << label(kind) << "\"} " << l.runs << '\n';
    }
  }

  const std::vector<plugins::Plugin> loaded = call.deps.plugins.plugins();
  family(out, "backhaul_plugins_loaded", "gauge", "Connector plugins loaded.");
  out << "backhaul_plugins_loaded " << loaded.size() << '\n';
  if (call.deps.plugin_workers) {
    const std::map<std::string, plugins::WorkerStats> workers = call.deps.plugin_workers();
    family(out, "backhaul_plugin_workers", "gauge",
           "Worker processes of a connector in isolation mode, busy with a call or idle.");
    for (const auto& [id, w] : workers) {
      out << "backhaul_plugin_workers{plugin=\"" << label(id) << "\",state=\"busy\"} " << w.busy
          << '\n'
          << "backhaul_plugin_workers{plugin=\"" << label(id) << "\",state=\"idle\"} " << w.idle
          << '\n';
    }
    family(out, "backhaul_plugin_workers_lost_total", "counter",
           "Worker processes lost, by reason: crashed, timed_out, memory, stopped, malformed, "
           "died_idle.");
    for (const auto& [id, w] : workers) {
      for (size_t r = 0; r < plugins::kWorkerLossCount; ++r) {
        out << "backhaul_plugin_workers_lost_total{plugin=\"" << label(id) << "\",reason=\""
            << plugins::loss_name(static_cast<plugins::WorkerLoss>(r)) << "\"} " << w.lost[r]
            << '\n';
      }
    }
  }

  if (call.deps.http_metrics) {
    const std::map<std::string, http::HttpTally> tallies = call.deps.http_metrics->snapshot();
    family(out, "backhaul_http_requests_total", "counter",
           "HTTP exchanges the host sent, by client (plugin:<id>, in worker processes too, or "
           "gateway) and outcome (the answer's status class, or error: no answer).");
    for (const auto& [client, tally] : tallies) {
      for (size_t i = 0; i < http::HttpTally::kOutcomes; ++i) {
        out << "backhaul_http_requests_total{client=\"" << label(client) << "\",outcome=\""
            << http::HttpTally::kOutcomeNames[i] << "\"} " << tally.requests[i] << '\n';
      }
    }
    family(out, "backhaul_http_request_seconds", "summary",
           "Wall time of the HTTP exchanges the host sent, by client.");
    for (const auto& [client, tally] : tallies) {
      out << "backhaul_http_request_seconds_sum{client=\"" << label(client) << "\"} "
          << seconds(static_cast<int64_t>(tally.micros), 1'000'000) << '\n'
          << "backhaul_http_request_seconds_count{client=\"" << label(client) << "\"} "
          << tally.total() << '\n';
    }
  }

  // Circuit records are shared by every host.
  family(out, "backhaul_circuit_state", "gauge",
         "Circuit breaker state: 0 closed, 1 half-open, 2 open.");
  std::vector<std::string> circuits = {"gateway"};
  for (const plugins::Plugin& plugin : loaded) circuits.push_back("provider:" + plugin.info().id);
  for (const std::string& name : circuits) {
    const jobs::CircuitRecord record = store.circuit(name);
    out << "backhaul_circuit_state{circuit=\"" << label(name) << "\"} "
        << circuit_value(record.state) << '\n';
  }

  std::string pipeline_text;
  append_pipeline_metrics(call, &pipeline_text);
  out << pipeline_text;

  Response response;
  response.content_type = "text/plain; version=0.0.4; charset=utf-8";
  response.body = out.str();
  return response;
}

}  // namespace backhaul::daemon
