// A deadline on a scope, for code that calls what may never return.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace backhaul {

// Calls `on_expiry` on a thread of its own unless destroyed within `limit`: a bound on a call
// that may never return (a plugin's init() or deinit()). `on_expiry` typically ends the process.
class Watchdog {
 public:
  Watchdog(std::chrono::milliseconds limit, std::function<void()> on_expiry)
      : thread_([this, limit, on_expiry = std::move(on_expiry)] {
          std::unique_lock lock(mutex_);
          if (!disarmed_cv_.wait_for(lock, limit, [&] { return disarmed_; })) on_expiry();
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      disarmed_ = true;
    }
    disarmed_cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable disarmed_cv_;
  bool disarmed_ = false;
  std::thread thread_;  // last: it uses the members above
};

}  // namespace backhaul
