// This process's open TCP sockets, for tests of what a process it starts would inherit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>

namespace backhaul::testing {

struct OpenSocket {
  int fd = -1;
  uint16_t local_port = 0;
  uint16_t peer_port = 0;  // 0 when not connected
  bool close_on_exec = false;
};

inline uint16_t port_of(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  }
  return 0;
}

// Read from /proc/self/fd; a descriptor closed meanwhile is left out.
inline std::vector<OpenSocket> open_tcp_sockets() {
  std::vector<OpenSocket> sockets;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec || target.rfind("socket:", 0) != 0) continue;
    OpenSocket s;
    s.fd = std::stoi(entry.path().filename().string());
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    if (::getsockname(s.fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) continue;
    if (address.ss_family != AF_INET && address.ss_family != AF_INET6) continue;
    s.local_port = port_of(address);
    length = sizeof address;
    if (::getpeername(s.fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      s.peer_port = port_of(address);
    }
    const int flags = ::fcntl(s.fd, F_GETFD);
    if (flags < 0) continue;
    s.close_on_exec = (flags & FD_CLOEXEC) != 0;
    sockets.push_back(s);
  }
  return sockets;
}

// This process's connections to `peer_port`, and how many of them a process it starts would
// inherit (no FD_CLOEXEC).
struct Connections {
  int open = 0;
  int inheritable = 0;
};
inline Connections connections_to(uint16_t peer_port) {
  Connections c;
  for (const OpenSocket& s : open_tcp_sockets()) {
    if (s.peer_port != peer_port) continue;
    ++c.open;
    if (!s.close_on_exec) ++c.inheritable;
  }
  return c;
}

}  // namespace backhaul::testing
