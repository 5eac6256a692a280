#include "host/daemon/audit_log.h"

#include <nlohmann/json.hpp>

#include "core/common/errors.h"
#include "core/gateway/gateway_client.h"

namespace backhaul::daemon {

AuditLog::AuditLog(const std::filesystem::path& path) : path_(path) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  out_.open(path, std::ios::app);
  if (!out_) throw ConfigError("config: admin.audit_log: cannot open " + path.string());
}

void AuditLog::append(const AuditEntry& entry) {
  nlohmann::json line = {{"time", gateway::iso8601_ms(entry.time_ms)},
                         {"operationId", entry.operation_id},
                         {"method", entry.method},
                         {"path", entry.path},
                         {"status", entry.status},
                         {"summary", entry.summary}};
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard lock(mutex_);
  out_ << text << '\n';
  out_.flush();
}

}  // namespace backhaul::daemon
