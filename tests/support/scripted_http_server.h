// An HTTP/1.1 stand-in on 127.0.0.1 for tests that need a peer to fail on cue (a daemon going
// down, a gateway answering 503): each request is answered by the function the test gives, one
// request per connection. An answer of status 0 closes the connection without a word.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/tcp_server.h"

namespace backhaul::testing {

class ScriptedHttpServer {
 public:
  struct Answer {
    int status = 200;
    std::string body;
  };
  // Called with the request line ("GET /v1/runs/7 HTTP/1.1"), under a lock: one call at a time.
  using Answerer = std::function<Answer(const std::string& request_line)>;

  explicit ScriptedHttpServer(Answerer answer)
      : answer_(std::move(answer)), server_([this](Poco::Net::StreamSocket& s) { serve(s); }) {}

  uint16_t port() const { return server_.port(); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port()); }
  // The request lines seen, in order.
  std::vector<std::string> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  void serve(Poco::Net::StreamSocket& socket) {
    std::string request;
    char chunk[4096];
    size_t end = std::string::npos;
    while ((end = request.find("\r\n\r\n")) == std::string::npos) {
      const int n = socket.receiveBytes(chunk, sizeof chunk);
      if (n <= 0) return;
      request.append(chunk, static_cast<size_t>(n));
    }
    const size_t length_at = request.find("Content-Length: ");
    const size_t length = length_at < end ? std::stoul(request.substr(length_at + 16)) : 0;
    while (request.size() < end + 4 + length) {
      const int n = socket.receiveBytes(chunk, sizeof chunk);
      if (n <= 0) return;
      request.append(chunk, static_cast<size_t>(n));
    }
    Answer answer;
    {
      std::lock_guard lock(mutex_);
      requests_.push_back(request.substr(0, request.find("\r\n")));
      answer = answer_(requests_.back());
    }
    if (answer.status != 0) {
      const std::string text = "HTTP/1.1 " + std::to_string(answer.status) +
                               " Scripted\r\nContent-Type: application/json\r\nContent-Length: " +
                               std::to_string(answer.body.size()) +
                               "\r\nConnection: close\r\n\r\n" + answer.body;
      socket.sendBytes(text.data(), static_cast<int>(text.size()));
    }
    socket.shutdown();
  }

  const Answerer answer_;
  mutable std::mutex mutex_;
  std::vector<std::string> requests_;  // guarded by mutex_
  TcpServer server_;                   // last: serves once the rest exists
};

}  // namespace backhaul::testing
