#include "host/daemon/audit_log.h"

#include <cerrno>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/common/errors.h"
#include "core/gateway/gateway_client.h"
#include <fcntl.h>
#include <unistd.h>

namespace backhaul::daemon {

AuditLog::AuditLog(const std::filesystem::path& path) : path_(path) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  do {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) throw ConfigError("config: admin.audit_log: cannot open " + path.string());
}

AuditLog::~AuditLog() { ::close(fd_); }

void AuditLog::append(const AuditEntry& entry) {
  nlohmann::json line = {{"time", gateway::iso8601_ms(entry.time_ms)},
                         {"operationId", entry.operation_id},
                         {"method", entry.method},
                         {"path", entry.path},
                         {"status", entry.status},
                         {"summary", entry.summary}};
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  const std::string record = text + '\n';
  std::lock_guard lock(mutex_);
  // One write, appended whole (O_APPEND); the rest after a short write or an interruption.
  for (size_t done = 0; done < record.size();) {
    const ssize_t wrote = ::write(fd_, record.data() + done, record.size() - done);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      // The caller logs it: a mutation must not go unaudited in silence (a full disk, say).
      throw std::system_error(errno, std::generic_category(),
                              "cannot write the audit line of operation " + entry.operation_id +
                                  " (" + std::to_string(done) + " of " +
                                  std::to_string(record.size()) + " bytes written)");
    }
    done += static_cast<size_t>(wrote);
  }
}

}  // namespace backhaul::daemon
