// The admin API of backhauld (SPEC F2-F4) as a function of plain request values: routing,
// bearer-token auth on /v1, the one error envelope, the audit log of mutations, health and
// metrics. The Poco server (admin_server.h) only converts to and from these values.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "core/common/clock.h"
#include "core/jobs/job_store.h"
#include "core/jobs/scheduler.h"
#include "core/plugins/plugin_loader.h"
#include "host/common/http.h"
#include "host/daemon/audit_log.h"

namespace backhaul::pipeline {
class Pipeline;
}

namespace backhaul::daemon {

struct AdminApiOptions {
  std::string token;                   // the bearer token of /v1
  int64_t backlog_threshold = 10'000;  // /health/ready fails above this many queued jobs
  // /health/ready fails while a store operation of the scheduler's has failed for this long.
  int64_t store_failure_grace_ms = 10'000;
  size_t max_body_bytes = 1 << 20;
  size_t max_header_bytes = 16 * 1024;
  // Audit lines of mutations without a valid token (refused 401, or refused before the token is
  // looked at: 400, 404, 413, 431): this many in a row, then as many an hour, each path cut to 200
  // bytes. An outsider sending them would otherwise grow the audit log without end; the next line
  // written counts the ones left out.
  double unauthorized_audit_burst = 60;
  double unauthorized_audit_per_hour = 600;
};

// What the API reads and drives. Every reference must outlive the AdminApi.
struct AdminApiDeps {
  jobs::JobStore& store;
  const Clock& clock;
  const plugins::PluginRegistry& plugins;
  AuditLog& audit;
  std::function<jobs::SchedulerStats()> scheduler_stats;  // empty: no scheduler in this process
  pipeline::Pipeline* pipeline = nullptr;  // null: run and rate-limit routes answer 503
  // The job kinds this process runs (its scheduler's); empty: /health/ready does not report
  // queued jobs of other kinds.
  std::function<std::vector<std::string>()> handled_kinds;
  // Worker processes of the connectors in isolation mode, by plugin id; empty: none.
  std::function<std::map<std::string, plugins::WorkerStats>()> plugin_workers;
  const http::HttpMetrics* http_metrics = nullptr;  // null: no HTTP metrics in /metrics
};

class AdminApi {
 public:
  AdminApi(AdminApiDeps deps, AdminApiOptions options);
  ~AdminApi();
  AdminApi(const AdminApi&) = delete;
  AdminApi& operator=(const AdminApi&) = delete;

  // Answers one request; never throws. Mutations on /v1 are written to the audit log before it
  // returns. [thread-safe]
  host::Response handle(const host::Request& request);

  const AdminApiOptions& options() const noexcept { return options_; }

 private:
  struct RefusedAudit;
  // Whether the audit line of a 401 at `now_ms` is written; `summary` gains the count of those
  // left out since the last one written.
  bool audit_refused(int64_t now_ms, std::string& summary);

  AdminApiDeps deps_;
  AdminApiOptions options_;
  std::unique_ptr<RefusedAudit> refused_;
};

}  // namespace backhaul::daemon
