// The audit log of the admin API (SPEC F3): one JSON line per mutation, appended and flushed
// before the response is sent. Never holds a token or a request body.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
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

  // Appends one line {"time","operationId","method","path","status","summary"}. [thread-safe]
  void append(const AuditEntry& entry);

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  std::filesystem::path path_;
  std::mutex mutex_;
  std::ofstream out_;
};

}  // namespace backhaul::daemon
