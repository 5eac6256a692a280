// Exception types used inside the host. They never cross the plugin ABI.
#pragma once

#include <stdexcept>
#include <string>

namespace backhaul {

namespace detail {
// `text` with each NUL byte written as the six characters \u0000.
inline std::string visible_nul(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\0') {
      out += "\\u0000";
    } else {
      out += c;
    }
  }
  return out;
}
}  // namespace detail

class Error : public std::runtime_error {
 public:
  // what() is a C string, which would end at a NUL of input quoted in the message ("no plugin
  // 'git\0hub'" told of 'git'): a NUL is kept as the text \u0000.
  explicit Error(const std::string& message)
      : std::runtime_error(message.find('\0') == std::string::npos ? message
                                                                   : detail::visible_nul(message)) {
  }
  explicit Error(const char* message) : std::runtime_error(message) {}
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
                        bool lock_conflict = false, bool interrupted = false)
      : Error(message),
        transient_(transient || lock_conflict || interrupted),
        lock_conflict_(lock_conflict),
        interrupted_(interrupted) {}
  // The store failed for a reason of its own that may pass (its server unreachable, the
  // connection lost, lock conflicts that outlasted their retries), not because of the request:
  // the same call made again later may succeed.
  bool transient() const noexcept { return transient_; }
  // Transient because rows the call needed were locked by other transactions (a lock wait
  // timeout, a deadlock): the store itself works, and calls on other rows may succeed now.
  bool lock_conflict() const noexcept { return lock_conflict_; }
  // Transient because someone stopped the call's statement (on MySQL, KILL QUERY by an operator or
  // a tool such as pt-kill): the store itself works, and other calls may succeed now.
  bool interrupted() const noexcept { return interrupted_; }
  // The store itself failing, as far as one call can tell (its server unreachable, the connection
  // lost, the disk full): transient, and not because of this call's rows or statement.
  bool outage() const noexcept { return transient_ && !lock_conflict_ && !interrupted_; }

 private:
  bool transient_;
  bool lock_conflict_;
  bool interrupted_;
};

}  // namespace backhaul
