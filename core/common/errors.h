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
  explicit StorageError(const std::string& message, bool transient = false,
                        bool lock_conflict = false)
      : Error(message), transient_(transient || lock_conflict), lock_conflict_(lock_conflict) {}
  // The store failed for a reason of its own that may pass (its server unreachable, the
  // connection lost, lock conflicts that outlasted their retries), not because of the request:
  // the same call made again later may succeed.
  bool transient() const noexcept { return transient_; }
  // Transient because rows the call needed were locked by other transactions (a lock wait
  // timeout, a deadlock): the store itself works, and calls on other rows may succeed now.
  bool lock_conflict() const noexcept { return lock_conflict_; }

 private:
  bool transient_;
  bool lock_conflict_;
};

}  // namespace backhaul
