// A TCP server on 127.0.0.1 (port 0) for tests that need the connection level: it serves each
// connection on a thread of its own with the function it is given, until it is destroyed.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <Poco/Exception.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/Socket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/Timespan.h>

namespace backhaul::testing {

class TcpServer {
 public:
  using Serve = std::function<void(Poco::Net::StreamSocket&)>;

  // `serve` runs once per connection; it should return soon after stopping() turns true.
  explicit TcpServer(Serve serve)
      : serve_(std::move(serve)),
        listener_(Poco::Net::SocketAddress("127.0.0.1", 0)),
        acceptor_([this] { accept_loop(); }) {}

  // Stops accepting, then waits for every connection's thread.
  ~TcpServer() {
    stop_ = true;
    acceptor_.join();
    std::lock_guard lock(mutex_);
    for (std::thread& t : connections_) t.join();
  }

  TcpServer(const TcpServer&) = delete;
  TcpServer& operator=(const TcpServer&) = delete;

  uint16_t port() const { return listener_.address().port(); }
  bool stopping() const { return stop_; }

  // Stop checks are the only reason for poll timeouts; no test logic waits on them.
  static Poco::Timespan poll_interval() { return Poco::Timespan(0, 20'000); }

 private:
  void accept_loop() {
    while (!stop_) {
      if (!listener_.poll(poll_interval(), Poco::Net::Socket::SELECT_READ)) continue;
      Poco::Net::StreamSocket socket;
      try {
        socket = listener_.acceptConnection();
      } catch (const Poco::Exception&) {
        continue;  // out of descriptors, say: the client sees its connection fail
      }
      std::lock_guard lock(mutex_);
      connections_.emplace_back([this, socket]() mutable { serve_(socket); });
    }
  }

  const Serve serve_;
  Poco::Net::ServerSocket listener_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<std::thread> connections_;  // guarded by mutex_
  std::thread acceptor_;                  // last: starts once everything else exists
};

}  // namespace backhaul::testing
