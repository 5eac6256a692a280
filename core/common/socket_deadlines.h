// SocketDeadlines: a whole-exchange deadline for sockets whose reads are bounded one receive at a
// time. Used by the HTTP client (a response's deadline) and the admin server (a request's).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

#include <sys/socket.h>

namespace backhaul {

// Shuts a socket down once its deadline has passed: the bound on reads made in loops (Poco reads a
// header line, a chunk's size line and its extensions, a byte at a time, each receive given its
// own timeout), so a peer sending a byte now and then cannot hold a call or a server thread
// without end. One thread per owner, started with its first watch. [thread-safe]
class SocketDeadlines {
 public:
  // Watches `fd` from construction to destruction; the socket is not closed meanwhile.
  class Watch {
   public:
    Watch(SocketDeadlines& owner, int fd, std::chrono::steady_clock::time_point deadline)
        : owner_(owner), id_(owner.add(fd, deadline)) {}
    ~Watch() { owner_.remove(id_); }
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // Whether the socket was shut down: what was read from it since may be cut short.
    bool expired() const { return owner_.expired(id_); }
    // Ends the watch, and tells whether the socket was shut down first: one step under the lock,
    // where expired() and then the end of the watch would leave a moment for it to be shut down
    // unnoticed.
    bool release() { return owner_.release(id_); }

   private:
    SocketDeadlines& owner_;
    const uint64_t id_;
  };

  SocketDeadlines() = default;
  SocketDeadlines(const SocketDeadlines&) = delete;
  SocketDeadlines& operator=(const SocketDeadlines&) = delete;
  ~SocketDeadlines() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Entry {
    int fd;
    std::chrono::steady_clock::time_point deadline;
    bool expired = false;
  };

  uint64_t add(int fd, std::chrono::steady_clock::time_point deadline) {
    bool sooner = false;
    uint64_t id = 0;
    {
      std::lock_guard lock(mutex_);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      id = next_id_++;
      entries_.emplace(id, Entry{fd, deadline});
      sooner = deadline < waiting_until_;
    }
    if (sooner) changed_.notify_one();
    return id;
  }
  void remove(uint64_t id) {
    std::lock_guard lock(mutex_);
    entries_.erase(id);
  }
  bool expired(uint64_t id) {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(id);
    return it != entries_.end() && it->second.expired;
  }
  bool release(uint64_t id) {
    std::lock_guard lock(mutex_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    const bool expired = it->second.expired;
    entries_.erase(it);
    return expired;
  }

  void run() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      const std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
      waiting_until_ = std::chrono::steady_clock::time_point::max();
      for (auto& [id, entry] : entries_) {
        if (entry.expired) continue;
        if (entry.deadline <= now) {
          ::shutdown(entry.fd, SHUT_RDWR);  // the read in progress ends; no more can start
          entry.expired = true;
        } else {
          waiting_until_ = std::min(waiting_until_, entry.deadline);
        }
      }
      if (waiting_until_ == std::chrono::steady_clock::time_point::max()) {
        changed_.wait(lock);
      } else {
        changed_.wait_until(lock, waiting_until_);
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, Entry> entries_;
  uint64_t next_id_ = 0;
  std::chrono::steady_clock::time_point waiting_until_ =
      std::chrono::steady_clock::time_point::max();
  bool stopping_ = false;
  std::thread thread_;  // last: it uses the members above
};

}  // namespace backhaul
