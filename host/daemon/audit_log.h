// The audit log of the admin API (SPEC F3): one JSON line per mutation, appended and flushed
// before the response is sent. Never holds a token or a request body.
#pragma once

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>

namespace backhaul::daemon {

struct AuditEntry {
  int64_t time_ms = 0;
  std::string operation_id;
  std::string method;
  std::string path;
  int status = 0;
  std::string summary;  // "retried dead letter 12", "UNAUTHORIZED", ...
};

class AuditLog {
 public:
  // Opens (creates) `path` for appending, creating its directory. Throws ConfigError when it
  // cannot. [main-thread]
  explicit AuditLog(const std::filesystem::path& path);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Appends one line {"time","operationId","method","path","status","summary"}. Throws
  // std::system_error when the line cannot be written (a full disk). [thread-safe]
  void append(const AuditEntry& entry);

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  std::mutex mutex_;
  int fd_ = -1;  // O_APPEND | O_CLOEXEC: not inherited by a process a plugin starts
};

}  // namespace backhaul::daemon
