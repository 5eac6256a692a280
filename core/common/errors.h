// Exception types used inside the host. They never cross the plugin ABI.
#pragma once

#include <stdexcept>
#include <string>

namespace backhaul {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConfigError : public Error {
 public:
  using Error::Error;
};

class PluginLoadError : public Error {
 public:
  using Error::Error;
};

class StorageError : public Error {
 public:
  explicit StorageError(const std::string& message, bool transient = false)
      : Error(message), transient_(transient) {}
  // The store failed for a reason of its own that may pass (its server unreachable, the
  // connection lost, lock conflicts that outlasted their retries), not because of the request:
  // the same call made again later may succeed.
  bool transient() const noexcept { return transient_; }

 private:
  bool transient_;
};

}  // namespace backhaul
