// A forward HTTP proxy on 127.0.0.1 for tests of the host's proxy support (SPEC A3): a request in
// absolute form goes on to its origin (one request per connection, "Connection: close"); CONNECT
// opens a tunnel. It records each request line with the Proxy-Authorization it carried, and
// answers 407 when that is not the one it requires.
#pragma once

#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <Poco/Exception.h>
#include <Poco/Net/NetException.h>
#include <Poco/Net/Socket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/Timespan.h>
#include <Poco/URI.h>

#include "core/http/http.h"
#include "core/http/poco_transport.h"
#include "tests/support/tcp_server.h"

namespace backhaul::testing {

class TestProxy {
 public:
  struct Seen {
    std::string request_line;
    std::string authorization;  // "<none>" when absent
  };

  explicit TestProxy(std::string required_authorization = "")
      : required_(std::move(required_authorization)),
        server_([this](Poco::Net::StreamSocket& client) { serve(client); }) {}

  http::ProxyOptions options() const {
    http::ProxyOptions proxy;
    proxy.host = "127.0.0.1";
    proxy.port = server_.port();
    return proxy;
  }
  std::vector<Seen> seen() const {
    std::lock_guard lock(mutex_);
    return seen_;
  }
  // How many request lines contained `text`.
  size_t seen_containing(const std::string& text) const {
    size_t n = 0;
    for (const Seen& seen : this->seen()) n += seen.request_line.find(text) != std::string::npos;
    return n;
  }

 private:
  void serve(Poco::Net::StreamSocket& client) {
    try {
      std::string buffer;
      size_t head_end = std::string::npos;
      while ((head_end = buffer.find("\r\n\r\n")) == std::string::npos) {
        if (!receive(client, buffer)) return;
      }
      std::istringstream head(buffer.substr(0, head_end + 2));
      std::string request_line, method, target, line;
      std::getline(head, request_line);
      request_line.pop_back();  // \r
      std::istringstream(request_line) >> method >> target;
      std::string authorization = "<none>", forwarded;
      while (std::getline(head, line) && line.size() > 1) {
        const std::string name = http::to_lower(line.substr(0, line.find(':')));
        if (name == "proxy-authorization") {
          authorization = line.substr(line.find(':') + 1);
          authorization.erase(0, authorization.find_first_not_of(' '));
          authorization.erase(authorization.find_last_not_of(" \r") + 1);
        } else if (name != "proxy-connection" && name != "connection") {
          forwarded += line + "\n";
        }
      }
      {
        std::lock_guard lock(mutex_);
        seen_.push_back({request_line, authorization});
      }
      if (!required_.empty() && authorization != required_) {
        const std::string refusal =
            "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic "
            "realm=\"test\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        send_all(client, refusal);
        return;
      }
      std::string authority = target;  // CONNECT's host:port
      std::string to_origin = buffer.substr(head_end + 4);
      if (method != "CONNECT") {
        const Poco::URI uri(target);
        authority = uri.getHost() + ":" + std::to_string(uri.getPort());
        to_origin = method + " " + uri.getPathEtc() + " HTTP/1.1\r\n" + forwarded +
                    "Connection: close\r\n\r\n" + to_origin;
      }
      Poco::Net::StreamSocket origin;
      origin.connect(Poco::Net::SocketAddress{authority}, kSendTimeout);
      // A peer that stops reading cannot hold the server's stop for ever.
      origin.setSendTimeout(kSendTimeout);
      client.setSendTimeout(kSendTimeout);
      if (method == "CONNECT") send_all(client, "HTTP/1.1 200 Connection established\r\n\r\n");
      send_all(origin, to_origin);
      relay(client, origin);
    } catch (const Poco::Exception&) {
      // Either side went away: the connection ends.
    }
  }

  static void send_all(Poco::Net::StreamSocket& socket, const std::string& bytes) {
    for (size_t sent = 0; sent < bytes.size();) {
      const int n = socket.sendBytes(bytes.data() + sent, static_cast<int>(bytes.size() - sent));
      if (n <= 0) throw Poco::Net::ConnectionResetException("send failed");
      sent += static_cast<size_t>(n);
    }
  }

  bool receive(Poco::Net::StreamSocket& socket, std::string& buffer) {
    while (!server_.stopping()) {
      if (!socket.poll(TcpServer::poll_interval(), Poco::Net::Socket::SELECT_READ)) continue;
      char chunk[16384];
      const int n = socket.receiveBytes(chunk, sizeof chunk);
      if (n <= 0) return false;
      buffer.append(chunk, static_cast<size_t>(n));
      return true;
    }
    return false;
  }

  // Copies bytes both ways until either side closes.
  void relay(Poco::Net::StreamSocket& a, Poco::Net::StreamSocket& b) {
    for (;;) {
      Poco::Net::Socket::SocketList readable{a, b}, writable, failed;
      if (Poco::Net::Socket::select(readable, writable, failed, TcpServer::poll_interval()) == 0) {
        if (server_.stopping()) return;
        continue;
      }
      for (Poco::Net::Socket& from : readable) {
        Poco::Net::StreamSocket& in = from == a ? a : b;
        Poco::Net::StreamSocket& out = from == a ? b : a;
        std::string bytes;
        if (!receive(in, bytes)) return;
        send_all(out, bytes);
      }
    }
  }

  static inline const Poco::Timespan kSendTimeout{10, 0};

  const std::string required_;
  mutable std::mutex mutex_;
  std::vector<Seen> seen_;  // guarded by mutex_
  TcpServer server_;        // last: stops before the members its connections use
};

}  // namespace backhaul::testing
