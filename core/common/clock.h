// Time source. Everything that waits, expires or backs off reads time through a Clock so tests can
// move time without sleeping.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace backhaul {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch. [thread-safe]
  virtual int64_t now_ms() const = 0;
};

class SystemClock final : public Clock {
 public:
  int64_t now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  static const SystemClock& instance() {
    static const SystemClock clock;
    return clock;
  }
};

// A clock that only moves when told to. [thread-safe]
class FakeClock final : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'700'000'000'000) : now_(start_ms) {}
  int64_t now_ms() const override { return now_.load(); }
  void set_ms(int64_t ms) { now_.store(ms); }
  void advance_ms(int64_t ms) { now_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_;
};

}  // namespace backhaul
