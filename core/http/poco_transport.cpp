#include "core/http/poco_transport.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <istream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <Poco/Exception.h>
#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPMessage.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/HTTPSClientSession.h>
#include <Poco/Net/NetException.h>
#include <Poco/Net/NetSSL.h>
#include <Poco/Net/SSLException.h>
#include <Poco/Net/SecureStreamSocket.h>
#include <Poco/Net/Socket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Timespan.h>
#include <Poco/URI.h>

#include "core/common/redact.h"
#include "core/common/socket_deadlines.h"
#include "core/common/unique_fd.h"
#include <sys/socket.h>

// How an exchange runs:
//   1. The URL and headers are checked before any I/O (RequestError).
//   2. An idle keep-alive session for the origin is taken from the pool, or a new one is opened.
//      An idle session whose socket turned readable (the server closed it, or sent stray bytes) is
//      discarded at checkout.
//   3. Connect (explicitly, so that connect failures are reported as such), send the request,
//      read the header and the whole body, each step bounded by what is left of the request's
//      timeout (applied as the socket send/receive timeout before each step).
//   4. The session goes back to the pool only if the body was read to its end, the response was
//      length-delimited (Content-Length or chunked) and the server did not say Connection: close.
// A reused connection can still turn out dead when the request is sent (the server closed it a
// moment before): such a failure is retried once on a fresh connection, but only when no byte of
// a response arrived and either the request is idempotent or the failure happened while sending.
// Every Poco exception leaves perform() as a TransportError.

namespace backhaul::http {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMaxHeaderBytes = 1 << 20;
constexpr int kMaxHeaderFields = 1000;  // Poco's default limit is 100
constexpr std::streamsize kReadChunk = 16 * 1024;

// Where an exchange failed: for the error text and the retry decision.
enum class Phase { kConnecting = 1, kSending, kWaiting, kReading };

struct Progress {
  Phase phase = Phase::kConnecting;
  bool response_bytes = false;  // a byte of the response arrived
};

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return lower(x) == lower(y); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// RFC 9110 token (method, header name).
bool is_token(std::string_view s) {
  static constexpr std::string_view kSymbols = "!#$%&'*+-.^_`|~";
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           kSymbols.find(c) != std::string_view::npos;
  });
}

bool is_idempotent(std::string_view method) {
  for (std::string_view m : {"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE"}) {
    if (iequals(method, m)) return true;
  }
  return false;
}

Poco::Timespan to_timespan(milliseconds ms) {
  return Poco::Timespan(static_cast<Poco::Timespan::TimeDiff>(ms.count()) * 1000);
}

// Time left until `deadline`; a Poco timeout once it has passed, so that it is reported as one.
milliseconds remaining(SteadyClock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - SteadyClock::now());
  if (left <= milliseconds(0)) throw Poco::TimeoutException("request deadline passed");
  return left;
}

std::string describe(const Request& request, std::string_view reason) {
  std::string message = request.method;
  message.append(" ").append(redact(request.url)).append(": ").append(reason);
  return message;
}

// The parts of an absolute http(s) URL the transport needs.
struct Target {
  bool tls = false;
  std::string host;  // lower case; an IPv6 address without brackets
  uint16_t port = 0;
  std::string request_target;  // path and query as given ("/" when empty); no fragment
  std::string host_header;     // host[:port], the port only when not the scheme's default
  std::string pool_key;        // scheme://host:port
  bool proxied = false;        // reached through the proxy (Impl::target)
};

[[noreturn]] void invalid_url(std::string_view url, std::string_view why) {
  throw RequestError("invalid url " + redact(url) + ": " + std::string(why));
}

Target parse_target(std::string_view url) {
  // Also keeps CR/LF out of the request line.
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      invalid_url(url, "whitespace or control character");
    }
  }
  const size_t separator = url.find("://");
  if (separator == std::string_view::npos) invalid_url(url, "not an absolute http(s) url");
  const std::string scheme = to_lower(url.substr(0, separator));
  Target target;
  if (scheme == "https") {
    target.tls = true;
  } else if (scheme != "http") {
    throw RequestError("unsupported url scheme \"" + redact(scheme) + "\" in " + redact(url));
  }
  const uint16_t default_port = target.tls ? 443 : 80;

  std::string_view rest = url.substr(separator + 3);
  const size_t authority_end = std::min(rest.find_first_of("/?#"), rest.size());
  std::string_view authority = rest.substr(0, authority_end);
  rest.remove_prefix(authority_end);
  // Userinfo is not turned into credentials: requests carry their own Authorization header.
  if (const size_t at = authority.rfind('@'); at != std::string_view::npos) {
    authority.remove_prefix(at + 1);
  }

  std::string_view host;
  std::string_view port_text;
  bool ipv6 = false;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) invalid_url(url, "unterminated ipv6 address");
    host = authority.substr(1, close - 1);
    ipv6 = true;
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') invalid_url(url, "invalid authority");
      port_text = after.substr(1);
    }
  } else {
    const size_t colon = authority.find(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (host.empty()) invalid_url(url, "no host");
  target.host = to_lower(host);
  target.port = default_port;
  if (!port_text.empty()) {
    unsigned value = 0;
    for (char c : port_text) {
      if (c < '0' || c > '9' || value > 65535) invalid_url(url, "invalid port");
      value = value * 10 + static_cast<unsigned>(c - '0');
    }
    if (value == 0 || value > 65535) invalid_url(url, "invalid port");
    target.port = static_cast<uint16_t>(value);
  }

  rest = rest.substr(0, std::min(rest.find('#'), rest.size()));
  if (rest.empty() || rest.front() == '?') target.request_target = "/";
  target.request_target.append(rest);

  const std::string bracketed = ipv6 ? "[" + target.host + "]" : target.host;
  const std::string port_suffix = ":" + std::to_string(target.port);
  target.host_header = target.port == default_port ? bracketed : bracketed + port_suffix;
  target.pool_key = scheme + "://" + bracketed + port_suffix;
  return target;
}

void validate(const Request& request) {
  if (!is_token(request.method)) {
    throw RequestError("invalid http method for " + redact(request.url));
  }
  for (const auto& [name, value] : request.headers) {
    if (!is_token(name)) {
      throw RequestError("invalid header name in request to " + redact(request.url));
    }
    // Header values are not echoed: they may be credentials.
    if (value.find_first_of(std::string_view("\r\n\0", 3)) != std::string::npos) {
      throw RequestError("invalid value for header " + name + " in request to " +
                         redact(request.url));
    }
  }
  if (request.timeout <= milliseconds(0)) {
    throw RequestError("non-positive timeout for " + redact(request.url));
  }
}

// Header fields of a raw response header (status line first), in arrival order, names in lower
// case. Obsolete line folding is joined with a space.
Headers parse_fields(std::string_view raw) {
  Headers fields;
  bool status_line = true;
  while (!raw.empty()) {
    const size_t eol = raw.find('\n');
    std::string_view line = raw.substr(0, eol);
    raw.remove_prefix(eol == std::string_view::npos ? raw.size() : eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (status_line) {
      status_line = false;
      continue;
    }
    if (line.empty()) break;
    if (line.front() == ' ' || line.front() == '\t') {
      const std::string_view more = trim(line);
      if (!fields.empty() && !more.empty()) fields.back().second.append(" ").append(more);
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = trim(line.substr(0, colon));
    if (name.empty()) continue;
    fields.emplace_back(to_lower(name), std::string(trim(line.substr(colon + 1))));
  }
  return fields;
}

// Up to `size` bytes from `in` with at most one receive from the socket: one byte, then what the
// stream has buffered already. istream::read(size) would go on receiving until it has them all,
// each receive allowed the socket's whole timeout: a response trickling in a byte at a time then
// outlasts the request's deadline many times over. 0 at the end of the stream.
size_t read_some(std::istream& in, char* buffer, size_t size) {
  in.read(buffer, 1);
  if (in.gcount() == 0) return 0;
  return 1 + static_cast<size_t>(in.readsome(buffer + 1, static_cast<std::streamsize>(size - 1)));
}

// Poco::Net::HTTPResponse that also keeps the header fields as they arrived: Poco's own collection
// groups repeated names together, and Response::headers is in arrival order. It also records
// whether any byte of the response arrived, for the retry decision.
class RecordingResponse final : public Poco::Net::HTTPResponse {
 public:
  // `before_receive` runs before each receive: it sets the time left, or throws once it is up.
  RecordingResponse(Progress& progress, std::function<void()> before_receive)
      : progress_(progress), before_receive_(std::move(before_receive)) {
    setFieldLimit(kMaxHeaderFields);
  }

  // Called by HTTPClientSession::receiveResponse() with a stream that ends after the blank line
  // closing the header; called again after each interim response. The 1 MiB limit is on them all
  // together, as the pipelined reader counts: interim responses without end are refused too.
  void read(std::istream& in) override {
    in.exceptions(std::ios::badbit);  // socket errors leave as the original Poco exception
    std::string raw;
    char buffer[4096];
    for (;;) {
      before_receive_();
      const size_t n = read_some(in, buffer, sizeof buffer);
      if (n == 0) break;
      progress_.response_bytes = true;
      raw.append(buffer, n);
      header_bytes_ += n;
      if (header_bytes_ > kMaxHeaderBytes) {
        throw Poco::Net::MessageException("response header larger than 1 MiB");
      }
    }
    if (raw.empty()) throw Poco::Net::NoMessageException();
    const std::string_view view(raw);
    if (!view.ends_with("\n\n") && !view.ends_with("\n\r\n")) {
      throw Poco::Net::MessageException("incomplete response header");
    }
    fields_ = parse_fields(raw);
    // Poco reads the status and the fields that frame the message; the rest are in fields_ only,
    // out of reach of its limits (8 KiB a value: a long Content-Security-Policy would fail the
    // response as malformed).
    std::string framing(std::string_view(raw).substr(0, raw.find('\n') + 1));
    for (const auto& [name, value] : fields_) {
      if (name == "content-length" || name == "transfer-encoding" || name == "connection") {
        framing.append(name).append(": ").append(value).append("\r\n");
      }
    }
    framing.append("\r\n");
    std::istringstream copy(framing);
    Poco::Net::HTTPResponse::read(copy);
  }

  Headers take_fields() { return std::move(fields_); }

 private:
  Progress& progress_;
  std::function<void()> before_receive_;
  Headers fields_;
  size_t header_bytes_ = 0;  // of this response and of the interim ones before it
};

// An idle plain-TCP connection is open and quiet: one non-blocking peek (Poco's poll() costs four
// system calls). 0 = EOF, > 0 = stray bytes, EAGAIN = open and nothing to read.
bool open_and_quiet(const Poco::Net::StreamSocket& socket) {
  char byte;
  const ssize_t n = ::recv(socket.impl()->sockfd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// A keep-alive connection to one origin, HTTP or HTTPS.
class PooledSession {
 public:
  virtual ~PooledSession() = default;
  virtual Poco::Net::HTTPClientSession& http() = 0;
  // Connects unless connected.
  virtual void connect_now() = 0;
  // True when the idle connection is open and the server has sent nothing since the last
  // response: a readable idle socket means EOF, a reset or stray bytes, all of them unusable.
  virtual bool usable_when_idle() = 0;
  // Up to `size` bytes of the connection past the response header (what the session buffered
  // first), at most one receive; 0 at EOF. For a body read without Poco's stream.
  virtual int receive_raw(char* out, size_t size) = 0;

  // Called with the socket once its TCP connection is open, before a proxy's CONNECT or a TLS
  // handshake: each of their reads is given a timeout of its own, so the caller's deadline is
  // put on the socket here.
  std::function<void(int fd)> on_tcp_connected;

  // The socket's send and receive timeouts as last set (0 = never): each change is a system
  // call, so a kept-alive connection keeps them while they stay within a tenth of what the
  // current request has left (a deadline is overrun by at most that).
  void set_receive_timeout(milliseconds left) {
    if (close_enough(receive_timeout_, left)) return;
    http().socket().setReceiveTimeout(to_timespan(left));
    receive_timeout_ = left;
  }
  void set_send_timeout(milliseconds left) {
    if (close_enough(send_timeout_, left)) return;
    http().socket().setSendTimeout(to_timespan(left));
    send_timeout_ = left;
  }
  // A new socket starts without our timeouts.
  void forget_timeouts() { receive_timeout_ = send_timeout_ = milliseconds(0); }

 private:
  static bool close_enough(milliseconds set, milliseconds left) {
    return set.count() > 0 && set >= left && set - left <= left / 10;
  }
  milliseconds receive_timeout_{0};
  milliseconds send_timeout_{0};
};

// Counts every TCP connection the Poco session opens. Each is opened by connect_now(), in the
// transport's connect block, where the socket is watched and given the connect timeout: Poco does
// not reconnect by itself here.
template <class PocoSession>
class CountingSession final : public PocoSession, public PooledSession {
 public:
  template <class... Args>
  explicit CountingSession(std::atomic<size_t>& opened, Args&&... args)
      : PocoSession(std::forward<Args>(args)...), opened_(opened) {
    this->setKeepAlive(true);
  }

  Poco::Net::HTTPClientSession& http() override { return *this; }

  void connect_now() override {
    if (!this->connected()) this->reconnect();
  }

  int receive_raw(char* out, size_t size) override {
    return this->read(out, static_cast<std::streamsize>(size));
  }

  bool usable_when_idle() override {
    // Poco's own rule first (idle for its keep-alive timeout, or told "Connection: close"): a
    // connection idle that long may be dropped silently on the way (a NAT, a firewall), or closed
    // by the server as the request goes out. It is opened again, as before, but by the transport.
    if (PocoSession::mustReconnect()) return false;
    if (!this->connected() || this->buffered() != 0) return false;
    if constexpr (std::is_same_v<PocoSession, Poco::Net::HTTPClientSession>) {
      return open_and_quiet(this->socket());
    } else {
      return !this->socket().poll(Poco::Timespan(0),
                                  Poco::Net::Socket::SELECT_READ | Poco::Net::Socket::SELECT_ERROR);
    }
  }

 protected:
  // Poco would reopen, inside sendRequest(), a connection idle for its keep-alive timeout (8 s),
  // unwatched and, through a proxy, without any timeout: the pool drops such a connection at
  // checkout instead (usable_when_idle()), and the transport opens a new one.
  bool mustReconnect() const override { return false; }

  // Poco would also reopen a connection whose first write fails (the server closed it a moment
  // before): the failure is reported instead, and perform() sends the request again on a new
  // connection.
  int write(const char* buffer, std::streamsize length) override {
    return Poco::Net::HTTPSession::write(buffer, length);
  }

  void connect(const Poco::Net::SocketAddress& address) override {
    if constexpr (std::is_same_v<PocoSession, Poco::Net::HTTPClientSession>) {
      PocoSession::connect(address);
      tcp_connected(this->socket().impl()->sockfd());
    } else if (this->getProxyHost().empty() || this->bypassProxy()) {
      // Poco's own connect, with the handshake left until the TCP connection is open.
      Poco::Net::SecureStreamSocket secure(this->socket());
      secure.setLazyHandshake(true);
      PocoSession::connect(address);
      tcp_connected(secure.impl()->sockfd());
      if (secure.completeHandshake() != 1) {
        throw Poco::Net::SSLConnectionUnexpectedlyClosedException();
      }
      secure.verifyPeerCertificate();  // the host name: done by Poco only for an eager handshake
    } else {
      open_tunnel();
    }
    this->forget_timeouts();
    opened_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  void tcp_connected(int fd) {
    // Not passed on to a process a plugin starts, which would keep the connection open.
    set_close_on_exec(fd);
    if (this->on_tcp_connected) this->on_tcp_connected(fd);
  }

  // The CONNECT tunnel that Poco's proxyConnect() opens, opened here so that the socket is seen
  // from its TCP connection on; then TLS to the origin inside it.
  void open_tunnel() {
    Poco::Net::StreamSocket tcp;
    tcp.connect(Poco::Net::SocketAddress(this->getProxyHost(), this->getProxyPort()),
                this->getTimeout());
    // The session below only stores timeouts for a socket it is given: they are set here, for
    // the CONNECT exchange and the handshake after it.
    tcp.setSendTimeout(this->getTimeout());
    tcp.setReceiveTimeout(this->getTimeout());
    tcp_connected(tcp.impl()->sockfd());
    Poco::Net::HTTPClientSession proxy(tcp);
    proxy.setTimeout(this->getTimeout());
    proxy.setKeepAlive(true);
    const bool ipv6 = this->getHost().find(':') != std::string::npos;
    const std::string authority = (ipv6 ? "[" + this->getHost() + "]" : this->getHost()) + ":" +
                                  std::to_string(this->getPort());
    Poco::Net::HTTPRequest request(Poco::Net::HTTPRequest::HTTP_CONNECT, authority,
                                   Poco::Net::HTTPMessage::HTTP_1_1);
    request.set("Host", authority);
    request.set("Proxy-Connection", "keep-alive");
    this->proxyAuthenticateImpl(request, this->getProxyConfig());
    proxy.sendRequest(request);
    Poco::Net::HTTPResponse answer;
    proxy.receiveResponse(answer);
    if (answer.getStatus() != Poco::Net::HTTPResponse::HTTP_OK) {
      throw Poco::Net::HTTPException("Cannot establish proxy connection", answer.getReason());
    }
    this->attachSocket(Poco::Net::SecureStreamSocket::attach(
        proxy.detachSocket(), this->getHost(),
        Poco::Net::SecureStreamSocket(this->socket()).context()));
  }

  std::atomic<size_t>& opened_;
};

// A failed stream operation: the socket error Poco stored, or a generic one.
void check(const std::ios& stream, const Poco::Net::HTTPClientSession& session) {
  if (!stream.bad()) return;
  if (const Poco::Exception* e = session.networkException()) e->rethrow();
  throw Poco::Net::NetException("i/o error");
}

// The text of a Poco exception without its class description when it has a message of its own
// ("error:0A000086:SSL routines::certificate verify failed", not "SSL Exception: error:…").
std::string detail(const Poco::Exception& e) {
  return e.message().empty() ? e.displayText() : e.message();
}

std::string failure_reason(const Poco::Exception& e, Phase phase) {
  if (dynamic_cast<const Poco::Net::ConnectionRefusedException*>(&e)) return "connection refused";
  if (dynamic_cast<const Poco::Net::DNSException*>(&e)) {
    return "cannot resolve host: " + detail(e);
  }
  if (dynamic_cast<const Poco::Net::SSLException*>(&e)) return "tls: " + detail(e);
  // Only a proxy's CONNECT answer raises it while connecting.
  if (dynamic_cast<const Poco::Net::HTTPException*>(&e) && phase == Phase::kConnecting) {
    return "the proxy did not open a tunnel (" + detail(e) + ")";
  }
  if (dynamic_cast<const Poco::Net::NoMessageException*>(&e)) {
    return "connection closed before a response arrived";
  }
  if (dynamic_cast<const Poco::Net::MessageException*>(&e)) {
    return "malformed response: " + detail(e);
  }
  switch (phase) {
    case Phase::kConnecting:
      return "connect failed: " + e.displayText();
    case Phase::kSending:
      return "sending the request failed: " + e.displayText();
    case Phase::kWaiting:
      return "receiving the response failed: " + e.displayText();
    case Phase::kReading:
      return "reading the response body failed: " + e.displayText();
  }
  return e.displayText();
}

std::string timeout_reason(Phase phase, milliseconds request_timeout,
                           milliseconds connect_timeout) {
  switch (phase) {
    case Phase::kConnecting:
      return "connect timeout after " +
             std::to_string(std::min(request_timeout, connect_timeout).count()) + " ms";
    case Phase::kSending:
      return "timeout after " + std::to_string(request_timeout.count()) +
             " ms while sending the request";
    case Phase::kWaiting:
      return "timeout after " + std::to_string(request_timeout.count()) +
             " ms waiting for the response";
    case Phase::kReading:
      return "timeout after " + std::to_string(request_timeout.count()) +
             " ms reading the response body";
  }
  return "timeout";
}

// Balances Poco::Net::initializeSSL(), which is reference-counted.
struct SslLibrary {
  SslLibrary() { Poco::Net::initializeSSL(); }
  ~SslLibrary() { Poco::Net::uninitializeSSL(); }
  SslLibrary(const SslLibrary&) = delete;
  SslLibrary& operator=(const SslLibrary&) = delete;
};

// --- the transport's own response reader ------------------------------------------------------
// Pipelined batches read their responses with it, and perform() a chunked body (Poco's chunked
// stream ends quietly when the connection closes inside one).

// A response refused by the reader (malformed, too large, cut short by the end of the connection):
// the reason, without the request, which describe() adds once where the error is reported.
class BadResponse final : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

BadResponse body_too_large(size_t max_body) {
  return BadResponse("response body larger than max_response_bytes (" + std::to_string(max_body) +
                     " bytes)");
}

// Bytes from a connection, buffered, with what was read past the current response kept for the
// next one.
class ByteReader {
 public:
  virtual ~ByteReader() = default;

  std::string buffer;
  size_t parsed = 0;  // bytes of `buffer` consumed

  // Reads more bytes; false at EOF. Throws Poco::TimeoutException past the deadline.
  bool fill(SteadyClock::time_point deadline) {
    // The consumed prefix goes once it is all of the buffer or large: while a response streams in
    // there is nearly always a partial line or chunk left over, and the buffer would otherwise
    // keep every byte the connection ever carried.
    constexpr size_t kDropConsumedAt = 64 * 1024;
    if (parsed > 0 && (parsed == buffer.size() || parsed >= kDropConsumedAt)) {
      buffer.erase(0, parsed);
      parsed = 0;
    }
    char chunk[16 * 1024];
    const int n = receive(chunk, sizeof chunk, deadline);
    if (n <= 0) return false;
    buffer.append(chunk, static_cast<size_t>(n));
    return true;
  }

  // The next `n` unparsed bytes, reading as needed; nullopt at EOF first. Valid until the next
  // read.
  std::optional<std::string_view> take(size_t n, SteadyClock::time_point deadline) {
    while (buffer.size() - parsed < n) {
      if (!fill(deadline)) return std::nullopt;
    }
    std::string_view out(buffer.data() + parsed, n);
    parsed += n;
    return out;
  }

  // Appends the next `n` unparsed bytes to `out` as they arrive, without gathering them in the
  // buffer first; false at EOF first.
  bool append_to(std::string& out, size_t n, SteadyClock::time_point deadline) {
    while (n > 0) {
      if (parsed == buffer.size() && !fill(deadline)) return false;
      const size_t part = std::min(n, buffer.size() - parsed);
      out.append(buffer, parsed, part);
      parsed += part;
      n -= part;
    }
    return true;
  }

  // The next line without its CRLF; nullopt at EOF first.
  std::optional<std::string> line(SteadyClock::time_point deadline, size_t max_bytes) {
    for (;;) {
      const size_t end = buffer.find("\r\n", parsed);
      if (end != std::string::npos) {
        std::string out = buffer.substr(parsed, end - parsed);
        parsed = end + 2;
        return out;
      }
      if (buffer.size() - parsed > max_bytes)
        throw BadResponse("malformed response: line too long");
      if (!fill(deadline)) return std::nullopt;
    }
  }

 private:
  // Up to `size` bytes, at most one receive; 0 at EOF.
  virtual int receive(char* out, size_t size, SteadyClock::time_point deadline) = 0;
};

// A kept-alive TCP connection used for pipelined batches.
class RawConnection final : public ByteReader {
 public:
  Poco::Net::StreamSocket socket;

  // Open, and nothing arrived since the last response.
  bool usable_when_idle() { return parsed == buffer.size() && open_and_quiet(socket); }

 private:
  int receive(char* out, size_t size, SteadyClock::time_point deadline) override {
    socket.setReceiveTimeout(to_timespan(remaining(deadline)));
    return socket.receiveBytes(out, static_cast<int>(size));
  }
};

// The bytes of a Poco session past the response header, each receive given the time left.
class SessionReader final : public ByteReader {
 public:
  explicit SessionReader(PooledSession& session) : session_(session) {}

 private:
  int receive(char* out, size_t size, SteadyClock::time_point deadline) override {
    session_.set_receive_timeout(remaining(deadline));
    return session_.receive_raw(out, size);
  }

  PooledSession& session_;
};

constexpr size_t kMaxLine = 64 * 1024;

// A Content-Length value or a chunk size (`base` 16; any ";extension" dropped): digits only, and
// no more than fits; anything else is a malformed response.
size_t parse_size(std::string_view text, int base, const char* what) {
  if (base == 16) text = text.substr(0, text.find(';'));
  text = trim(text);
  size_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    throw BadResponse(std::string("malformed ") + what);
  }
  return value;
}

// Reads a chunked body, from its first chunk's size line to the empty line after the trailers,
// appending it to `body`. Throws BadResponse when it is malformed, larger than `max_body`, has
// trailers over 1 MiB, or the connection ends before its last chunk.
void read_chunked(ByteReader& in, SteadyClock::time_point deadline, size_t max_body,
                  std::string& body) {
  for (;;) {
    std::optional<std::string> size_line = in.line(deadline, kMaxLine);
    if (!size_line) throw BadResponse("connection closed in a chunked body");
    const size_t size = parse_size(*size_line, 16, "chunk size");
    if (size == 0) break;
    if (size > max_body - body.size()) throw body_too_large(max_body);  // body <= max_body
    // A large chunk goes to the body as it arrives, not through the reader's buffer whole.
    if (!in.append_to(body, size, deadline)) throw BadResponse("connection closed in a chunk");
    const std::optional<std::string_view> end = in.take(2, deadline);
    if (!end) throw BadResponse("connection closed in a chunk");
    if (*end != "\r\n") throw BadResponse("malformed chunk: no CRLF after its data");
  }
  size_t trailer_bytes = 0;  // under the header's limit
  for (;;) {                 // trailers up to the empty line
    std::optional<std::string> trailer = in.line(deadline, kMaxLine);
    if (!trailer) throw BadResponse("connection closed in the trailers");
    if (trailer->empty()) return;
    trailer_bytes += trailer->size() + 2;
    if (trailer_bytes > kMaxHeaderBytes) throw BadResponse("response trailers larger than 1 MiB");
  }
}

// The request as HTTP/1.1 bytes, framed by Content-Length.
void serialize(const Request& request, const Target& target, const std::string& user_agent,
               std::string& out) {
  out += request.method;
  out += ' ';
  out += target.request_target;
  out += " HTTP/1.1\r\n";
  bool has_host = false;
  bool has_user_agent = false;
  for (const auto& [name, value] : request.headers) {
    if (iequals(name, "content-length") || iequals(name, "transfer-encoding") ||
        iequals(name, "connection")) {
      continue;
    }
    has_host = has_host || iequals(name, "host");
    has_user_agent = has_user_agent || iequals(name, "user-agent");
    out.append(name).append(": ").append(value).append("\r\n");
  }
  if (!has_host) out.append("Host: ").append(target.host_header).append("\r\n");
  if (!has_user_agent && !user_agent.empty()) {
    out.append("User-Agent: ").append(user_agent).append("\r\n");
  }
  const size_t length = request.body ? request.body->size() : 0;
  if (request.body || iequals(request.method, "POST") || iequals(request.method, "PUT") ||
      iequals(request.method, "PATCH")) {
    out.append("Content-Length: ").append(std::to_string(length)).append("\r\n");
  }
  out += "\r\n";
  if (request.body) out += *request.body;
}

// Reads one response; nullopt when the connection ended before its first byte. `answered` is set
// once its status line arrived: from then on a failure is this request's own (the server took
// it), not the connection's. `close` is set when the connection cannot carry another exchange
// after it. Throws BadResponse for a response it refuses.
std::optional<Response> read_response(RawConnection& c, const Request& request,
                                      SteadyClock::time_point deadline, size_t max_body,
                                      bool& answered, bool& close) {
  // The status lines and fields of the response and of every interim response before it, as
  // perform() counts them: a server sending header lines without end is refused at the limit.
  size_t header_bytes = 0;
  const auto count_header_line = [&](const std::string& line) {
    header_bytes += line.size() + 2;
    if (header_bytes > kMaxHeaderBytes) throw BadResponse("response header larger than 1 MiB");
  };
  for (;;) {
    std::optional<std::string> status_line = c.line(deadline, kMaxLine);
    if (!status_line) {
      if (!answered) return std::nullopt;
      throw BadResponse("connection closed after an interim response");
    }
    answered = true;
    count_header_line(*status_line);
    // "HTTP/1.1 200 OK"
    if (status_line->size() < 12 || status_line->compare(0, 5, "HTTP/") != 0 ||
        (*status_line)[8] != ' ') {
      throw BadResponse("malformed status line");
    }
    Response response;
    response.url = request.url;
    response.status = std::atoi(status_line->c_str() + 9);
    if (response.status < 100 || response.status > 999) {
      throw BadResponse("malformed status line");
    }
    std::optional<size_t> length;
    bool chunked = false;
    close = status_line->compare(0, 8, "HTTP/1.0") == 0;
    for (;;) {
      std::optional<std::string> header = c.line(deadline, kMaxLine);
      if (!header) throw BadResponse("connection closed in the response header");
      count_header_line(*header);
      if (header->empty()) break;
      const size_t colon = header->find(':');
      if (colon == std::string::npos) throw BadResponse("malformed header");
      std::string name = to_lower(std::string_view(*header).substr(0, colon));
      std::string value(trim(std::string_view(*header).substr(colon + 1)));
      if (name == "content-length") {
        length = parse_size(value, 10, "Content-Length");
      } else if (name == "transfer-encoding") {
        chunked = to_lower(value).find("chunked") != std::string::npos;
      } else if (name == "connection") {
        const std::string v = to_lower(value);
        if (v.find("close") != std::string::npos) close = true;
        if (v.find("keep-alive") != std::string::npos) close = false;
      }
      response.headers.emplace_back(std::move(name), std::move(value));
    }
    if (response.status < 200 && response.status != 101) continue;  // interim: the next one
    const bool no_body = iequals(request.method, "HEAD") || response.status == 204 ||
                         response.status == 304 || response.status < 200;
    if (no_body) return response;
    if (chunked) {
      read_chunked(c, deadline, max_body, response.body);
      return response;
    }
    if (length) {
      if (*length > max_body) throw body_too_large(max_body);
      response.body.reserve(*length);
      if (!c.append_to(response.body, *length, deadline)) {
        throw BadResponse("connection closed before the " + std::to_string(*length) +
                          "-byte body ended");
      }
      return response;
    }
    // Delimited by the end of the connection.
    close = true;
    for (;;) {
      response.body.append(c.buffer, c.parsed, std::string::npos);
      c.parsed = c.buffer.size();
      if (response.body.size() > max_body) throw body_too_large(max_body);
      if (!c.fill(deadline)) return response;
    }
  }
}

}  // namespace

ProxyOptions parse_proxy_url(std::string_view url) {
  const auto invalid = [](const std::string& why) {
    return std::invalid_argument("invalid proxy url: " + why);
  };
  constexpr std::string_view kScheme = "http://";
  if (to_lower(url.substr(0, kScheme.size())) != kScheme) {
    const size_t separator = url.find("://");
    throw invalid(separator == std::string_view::npos
                      ? "not an http:// url"
                      : "the scheme must be http:// (a proxy reached over TLS is not supported), "
                        "not " +
                            redact(url.substr(0, separator + 3)));
  }
  std::string_view rest = url.substr(kScheme.size());
  ProxyOptions proxy;
  // Credentials end at the authority's last '@' (a password may hold one unencoded).
  const std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
  if (const size_t at = authority.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    const size_t colon = userinfo.find(':');
    try {
      Poco::URI::decode(std::string(userinfo.substr(0, colon)), proxy.username);
      if (colon != std::string_view::npos) {
        Poco::URI::decode(std::string(userinfo.substr(colon + 1)), proxy.password);
      }
    } catch (const Poco::Exception&) {  // its text holds the credentials
      throw invalid("the credentials are not valid percent-encoding");
    }
    if (proxy.username.empty()) throw invalid("credentials without a user name");
    rest.remove_prefix(at + 1);  // no credentials in any message below
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#") != std::string_view::npos) {
    throw invalid("http://" + redact(rest) + " has a path; give only http://host:port");
  }
  const size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == rest.size() ||
      rest.find(']', colon) != std::string_view::npos) {
    throw invalid("http://" + redact(rest) + " has no port");
  }
  try {
    const Target target = parse_target("http://" + std::string(rest) + "/");
    proxy.host = target.host;
    proxy.port = target.port;
  } catch (const RequestError& e) {
    throw invalid(e.what());
  }
  return proxy;
}

std::vector<std::string> parse_no_proxy(const std::vector<std::string>& entries) {
  std::vector<std::string> hosts;
  for (const std::string& entry : entries) {
    std::string host = to_lower(trim(entry));
    const std::string quoted = "no_proxy entry \"" + redact(entry) + "\"";
    if (host.empty()) throw std::invalid_argument("an empty no_proxy entry");
    if (host.find_first_of(", \t") != std::string::npos) {
      throw std::invalid_argument(quoted + ": one host per entry");
    }
    if (host.rfind("*.", 0) == 0) host.erase(0, 1);  // "*.corp" as ".corp"
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    } else if (std::count(host.begin(), host.end(), ':') == 1) {
      throw std::invalid_argument(quoted + ": give the host without a port");
    }
    if (host != "*" && host.find('*') != std::string::npos) {
      throw std::invalid_argument(quoted + ": only a leading \"*.\" or \"*\" alone is understood");
    }
    hosts.push_back(std::move(host));
  }
  return hosts;
}

void set_proxy_credentials(ProxyOptions& proxy, std::string_view user_colon_password) {
  const size_t colon = user_colon_password.find(':');
  if (colon == 0 || colon == std::string_view::npos) {
    throw std::invalid_argument("proxy credentials must be user:password");
  }
  proxy.username = user_colon_password.substr(0, colon);
  proxy.password = user_colon_password.substr(colon + 1);
}

bool goes_through_proxy(const ProxyOptions& proxy, std::string_view host) {
  if (proxy.host.empty()) return false;
  // An IP address is matched whole: "2.3" names no part of 10.1.2.3.
  const bool address = host.find(':') != std::string_view::npos ||
                       host.find_first_not_of("0123456789.") == std::string_view::npos;
  for (const std::string& entry : proxy.no_proxy) {
    std::string_view name = entry;
    if (name == "*") return false;
    if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
      name = name.substr(1, name.size() - 2);
    }
    if (!name.empty() && name.front() == '.') name.remove_prefix(1);
    if (name.empty() || name.size() > host.size()) continue;
    // The host itself, or one of its subdomains (the match starts after a dot).
    const std::string_view tail = host.substr(host.size() - name.size());
    if (iequals(tail, name) &&
        (host.size() == name.size() || (!address && host[host.size() - name.size() - 1] == '.'))) {
      return false;
    }
  }
  return true;
}

struct PocoTransport::Impl {
  explicit Impl(PocoTransportOptions o) : options(std::move(o)) {}

  SslLibrary ssl;  // first member: outlives every TLS object below
  const PocoTransportOptions options;
  std::atomic<size_t> opened{0};
  SocketDeadlines deadlines;

  std::mutex mutex;
  Poco::Net::Context::Ptr tls_context;  // guarded by mutex; made on the first https request
  // Idle sessions per pool key, most recently used last. Guarded by mutex.
  std::map<std::string, std::vector<std::unique_ptr<PooledSession>>> idle;
  // Idle connections of pipelined batches, per pool key. Guarded by mutex.
  std::map<std::string, std::vector<std::unique_ptr<RawConnection>>> raw_idle;

  Poco::Net::Context::Ptr context();
  std::unique_ptr<PooledSession> take_idle(const std::string& key);
  std::unique_ptr<PooledSession> open(const Target& target);
  void give_back(const std::string& key, std::unique_ptr<PooledSession> session);
  // The parts of `url`, and whether the proxy serves it: decided once per request.
  Target target(std::string_view url) const {
    Target t = parse_target(url);
    t.proxied = goes_through_proxy(options.proxy, t.host);
    return t;
  }
  // " (through the proxy host:port)" for a target the proxy serves, else "": for error messages.
  std::string through_proxy(const Target& target) const {
    if (!target.proxied) return {};
    const bool ipv6 = options.proxy.host.find(':') != std::string::npos;
    return " (through the proxy " + (ipv6 ? "[" + options.proxy.host + "]" : options.proxy.host) +
           ":" + std::to_string(options.proxy.port) + ")";
  }
  // The response to a request exchange() sent: its header and body.
  Response receive(PooledSession& pooled, const Request& request, SteadyClock::time_point deadline,
                   Progress& progress, bool& reusable);
  Response exchange(PooledSession& pooled, const Target& target, const Request& request,
                    SteadyClock::time_point deadline, Progress& progress, bool& reusable);

  std::unique_ptr<RawConnection> take_raw(const Target& target, SteadyClock::time_point deadline,
                                          bool& reused);
  // Sends the requests order[first..] name pipelined on `c` and reads their answers into
  // `results` until one is missing; returns how many are done (answered, or failed by a refused
  // answer, which ends the connection's use). `c` stays usable when all were answered.
  size_t pipeline(RawConnection& c, const std::vector<Request>& requests,
                  const std::vector<size_t>& order, size_t first, SteadyClock::time_point deadline,
                  std::vector<BatchResult>& results, bool& reusable, Phase& phase);
};

Poco::Net::Context::Ptr PocoTransport::Impl::context() {
  std::lock_guard lock(mutex);
  if (!tls_context) {
    Poco::Net::Context::Params params;
    // A CA file adds to the system's CAs: the gateway's private CA must not make every provider
    // (api.github.com, ...) untrusted, as one transport serves both.
    params.caLocation = options.ca_file;
    params.loadDefaultCAs = true;
    // STRICT, not RELAXED: Poco's RELAXED skips the name check for a loopback host name, so any
    // certificate a trusted CA signed would pass for 127.0.0.1 (for a client the two modes differ
    // in nothing else).
    params.verificationMode =
        options.verify_peer ? Poco::Net::Context::VERIFY_STRICT : Poco::Net::Context::VERIFY_NONE;
    params.cipherList = "DEFAULT";  // OpenSSL's vetted list rather than Poco's "ALL:…"
    Poco::Net::Context::Ptr created =
        new Poco::Net::Context(Poco::Net::Context::TLS_CLIENT_USE, params);
    created->requireMinimumProtocol(Poco::Net::Context::PROTO_TLSV1_2);
    tls_context = created;
  }
  return tls_context;
}

std::unique_ptr<PooledSession> PocoTransport::Impl::take_idle(const std::string& key) {
  for (;;) {
    std::unique_ptr<PooledSession> session;
    {
      std::lock_guard lock(mutex);
      const auto it = idle.find(key);
      if (it == idle.end() || it->second.empty()) return nullptr;
      session = std::move(it->second.back());
      it->second.pop_back();
    }
    if (session->usable_when_idle()) return session;
    // A dead one is closed here, outside the lock.
  }
}

std::unique_ptr<PooledSession> PocoTransport::Impl::open(const Target& target) {
  std::unique_ptr<PooledSession> session;
  if (!target.tls) {
    session = std::make_unique<CountingSession<Poco::Net::HTTPClientSession>>(opened, target.host,
                                                                              target.port);
  } else {
    session = std::make_unique<CountingSession<Poco::Net::HTTPSClientSession>>(
        opened, target.host, target.port, context());
  }
  // Plain HTTP: Poco sends the request line in absolute form and Proxy-Authorization. HTTPS: its
  // connect() opens a CONNECT tunnel (with Proxy-Authorization) and starts TLS inside it.
  if (target.proxied) {
    Poco::Net::HTTPClientSession::ProxyConfig proxy;
    proxy.host = options.proxy.host;
    proxy.port = options.proxy.port;
    proxy.username = options.proxy.username;
    proxy.password = options.proxy.password;
    // Poco would send "Basic Og==" (an empty user and password) otherwise.
    if (proxy.username.empty()) proxy.authMethod = Poco::Net::HTTPClientSession::PROXY_AUTH_NONE;
    session->http().setProxyConfig(proxy);
  }
  return session;
}

void PocoTransport::Impl::give_back(const std::string& key,
                                    std::unique_ptr<PooledSession> session) {
  {
    std::lock_guard lock(mutex);
    auto& sessions = idle[key];
    if (sessions.size() < options.max_idle_per_origin) {
      sessions.push_back(std::move(session));
      return;
    }
  }
  // The pool is full: the session is closed here, outside the lock.
}

Response PocoTransport::Impl::exchange(PooledSession& pooled, const Target& target,
                                       const Request& request, SteadyClock::time_point deadline,
                                       Progress& progress, bool& reusable) {
  Poco::Net::HTTPClientSession& session = pooled.http();

  progress.phase = Phase::kConnecting;
  {
    // All of connecting (TCP, a proxy's CONNECT, the TLS handshake) ends with the connect timeout,
    // counted from here: a server or proxy answering a byte now and then, each read within its
    // own timeout, would otherwise hold the request past its deadline. Past it the socket is shut
    // down.
    const SteadyClock::time_point connect_deadline =
        std::min(SteadyClock::now() + options.connect_timeout, deadline);
    const milliseconds left = remaining(deadline);
    const Poco::Timespan connect = to_timespan(remaining(connect_deadline));
    // The watch has a descriptor of its own for the socket: a failed connect can close the
    // session's before the watch ends, and its number be taken by another thread's file.
    UniqueFd watched;
    std::optional<SocketDeadlines::Watch> watch;
    pooled.on_tcp_connected = [&](int fd) {
      watch.reset();
      watched.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
      if (watched) watch.emplace(deadlines, watched.get(), connect_deadline);
    };
    // Whether the watch shut the socket down; it ends the watch.
    const auto watch_expired = [&] {
      pooled.on_tcp_connected = nullptr;
      return watch && watch->release();
    };
    try {
      // A tunnel through the proxy is opened with the receive timeout for everything: the
      // CONNECT answer, the handshake. It gets the connect timeout.
      if (target.tls && !session.connected() && target.proxied) {
        session.setTimeout(connect, connect, connect);
        pooled.connect_now();
      }
      session.setTimeout(connect, to_timespan(left), to_timespan(left));
      pooled.connect_now();
    } catch (...) {
      if (watch_expired()) throw Poco::TimeoutException("connect deadline passed");
      throw;
    }
    if (watch_expired()) throw Poco::TimeoutException("connect deadline passed");
  }

  progress.phase = Phase::kSending;
  pooled.set_send_timeout(remaining(deadline));
  pooled.set_receive_timeout(remaining(deadline));
  Poco::Net::HTTPRequest poco_request(request.method, target.request_target,
                                      Poco::Net::HTTPMessage::HTTP_1_1);
  bool has_user_agent = false;
  for (const auto& [name, value] : request.headers) {
    // Message framing is the transport's business.
    if (iequals(name, "content-length") || iequals(name, "transfer-encoding")) continue;
    if (iequals(name, "user-agent")) has_user_agent = true;
    poco_request.add(name, value);
  }
  if (!poco_request.has("Host")) poco_request.setHost(target.host_header);
  if (!has_user_agent && !options.user_agent.empty()) {
    poco_request.set("User-Agent", options.user_agent);
  }
  if (request.body) {
    poco_request.setContentLength64(static_cast<Poco::Int64>(request.body->size()));
  } else if (iequals(request.method, "POST") || iequals(request.method, "PUT") ||
             iequals(request.method, "PATCH")) {
    poco_request.setContentLength64(0);  // or the server would wait for a body
  }
  std::ostream& out = session.sendRequest(poco_request);
  if (request.body) {
    // In slices, each given the time left: a server reading slowly cannot hold the call past its
    // deadline (each of the stream's sends would have the whole timeout otherwise).
    constexpr size_t kSendSlice = 16 * 1024;
    for (size_t at = 0; at < request.body->size() && out; at += kSendSlice) {
      pooled.set_send_timeout(remaining(deadline));
      const size_t n = std::min(kSendSlice, request.body->size() - at);
      out.write(request.body->data() + at, static_cast<std::streamsize>(n));
    }
  }
  pooled.set_send_timeout(remaining(deadline));
  out.flush();
  check(out, session);

  progress.phase = Phase::kWaiting;
  // From here the socket is Poco's to read, in loops that this code does not see into: past the
  // deadline it is shut down, and what it ended is a timeout.
  SocketDeadlines::Watch watch(deadlines, session.socket().impl()->sockfd(), deadline);
  Response result;
  try {
    result = receive(pooled, request, deadline, progress, reusable);
  } catch (const Poco::TimeoutException&) {
    throw;
  } catch (...) {
    if (watch.release()) throw Poco::TimeoutException("request deadline passed");
    throw;
  }
  // A body cut by the shutdown may read as complete (a chunked one, say). Once released, the
  // socket is left alone: a connection going back to the pool is not shut down under it.
  if (watch.release()) throw Poco::TimeoutException("request deadline passed");
  return result;
}

Response PocoTransport::Impl::receive(PooledSession& pooled, const Request& request,
                                      SteadyClock::time_point deadline, Progress& progress,
                                      bool& reusable) {
  Poco::Net::HTTPClientSession& session = pooled.http();
  pooled.set_receive_timeout(remaining(deadline));
  RecordingResponse response(progress, [&] { pooled.set_receive_timeout(remaining(deadline)); });
  std::istream* body_stream = &session.receiveResponse(response);
  // Poco skips 100 Continue itself; other interim responses (103 Early Hints) are skipped here.
  while (response.getStatus() >= 100 && response.getStatus() < 200 &&
         response.getStatus() != Poco::Net::HTTPResponse::HTTP_SWITCHING_PROTOCOLS) {
    body_stream = &session.receiveResponse(response);
  }
  std::istream& in = *body_stream;

  progress.phase = Phase::kReading;
  Response result;
  result.status = static_cast<int>(response.getStatus());
  result.headers = response.take_fields();
  result.url = request.url;

  const size_t limit = options.max_response_bytes;
  const bool has_body = !iequals(request.method, "HEAD") && result.status >= 200 &&
                        result.status != 204 && result.status != 304;
  bool read_past_body = false;
  if (has_body && response.getChunkedTransferEncoding()) {
    // With a Content-Length too, the chunks frame the body and the length means nothing (RFC 9112
    // 6.3). Read here rather than through Poco's chunked stream, which ends quietly where the
    // connection does: a body cut inside a chunk, or before the last one, passed for complete.
    SessionReader reader(pooled);
    read_chunked(reader, deadline, limit, result.body);
    read_past_body = reader.parsed < reader.buffer.size();
  } else if (has_body) {
    const bool has_length = response.hasContentLength();
    const Poco::Int64 length = has_length ? response.getContentLength64() : 0;
    if (length < 0) throw BadResponse("malformed response: negative Content-Length");
    if (static_cast<Poco::UInt64>(length) > limit) throw body_too_large(limit);
    if (has_length) result.body.reserve(static_cast<size_t>(length));
    in.exceptions(std::ios::badbit);  // socket errors leave as Poco exceptions
    char buffer[kReadChunk];
    for (;;) {
      pooled.set_receive_timeout(remaining(deadline));
      const size_t n = read_some(in, buffer, static_cast<size_t>(kReadChunk));
      if (n == 0) break;
      if (result.body.size() + n > limit) throw body_too_large(limit);
      result.body.append(buffer, n);
    }
    // Poco ends a fixed-length body quietly when the connection closes early.
    if (has_length && result.body.size() < static_cast<size_t>(length)) {
      throw TransportError(describe(request, "connection closed after " +
                                                 std::to_string(result.body.size()) + " of " +
                                                 std::to_string(length) + " body bytes"));
    }
  }
  // A body delimited by the end of the connection leaves nothing to reuse.
  const bool delimited =
      !has_body || response.getChunkedTransferEncoding() || response.hasContentLength();
  // After 101 Switching Protocols the connection speaks another protocol: never reused.
  // Bytes past the body are no answer to anything sent: the connection is out of step.
  reusable = delimited && !read_past_body && response.getKeepAlive() && session.connected() &&
             result.status != Poco::Net::HTTPResponse::HTTP_SWITCHING_PROTOCOLS;
  return result;
}

PocoTransport::PocoTransport(PocoTransportOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

PocoTransport::~PocoTransport() = default;

Response PocoTransport::perform(const Request& request) {
  const Target target = impl_->target(request.url);
  validate(request);
  const SteadyClock::time_point deadline = SteadyClock::now() + request.timeout;

  bool retried = false;
  for (;;) {
    std::unique_ptr<PooledSession> session = retried ? nullptr : impl_->take_idle(target.pool_key);
    const bool reused = session != nullptr;
    Progress progress;
    try {
      if (!session) session = impl_->open(target);
      bool reusable = false;
      Response response = impl_->exchange(*session, target, request, deadline, progress, reusable);
      if (reusable) impl_->give_back(target.pool_key, std::move(session));
      // Through the proxy, plain HTTP's 407 is the proxy's answer, not the origin's: a transport
      // failure, as the tunnel's refusal is for HTTPS.
      if (response.status == 407 && !target.tls && target.proxied) {
        throw TransportError(describe(request,
                                      "the proxy refused the request (407: its credentials are "
                                      "missing or wrong)" +
                                          impl_->through_proxy(target)));
      }
      return response;
    } catch (const BadResponse& e) {
      throw TransportError(describe(request, e.what() + impl_->through_proxy(target)));
    } catch (const Poco::TimeoutException&) {
      // Never retried: the server is slow, not gone, and the deadline covers the whole call.
      throw TransportError(describe(
          request, timeout_reason(progress.phase, request.timeout, impl_->options.connect_timeout) +
                       impl_->through_proxy(target)));
    } catch (const Poco::Exception& e) {
      // A kept-alive connection the server had already closed. Retrying is safe when the server
      // cannot have acted on the request: it answered nothing, and the request is idempotent or
      // was not completely sent.
      const bool stale = reused && !progress.response_bytes &&
                         (is_idempotent(request.method) || progress.phase == Phase::kSending);
      if (stale && !retried) {
        retried = true;
        continue;
      }
      throw TransportError(
          describe(request, failure_reason(e, progress.phase) + impl_->through_proxy(target)));
    }
  }
}

std::unique_ptr<RawConnection> PocoTransport::Impl::take_raw(const Target& target,
                                                             SteadyClock::time_point deadline,
                                                             bool& reused) {
  for (;;) {
    std::unique_ptr<RawConnection> c;
    {
      std::lock_guard lock(mutex);
      auto it = raw_idle.find(target.pool_key);
      if (it == raw_idle.end() || it->second.empty()) break;
      c = std::move(it->second.back());
      it->second.pop_back();
    }
    if (c->usable_when_idle()) {
      reused = true;
      return c;
    }
  }
  reused = false;
  auto c = std::make_unique<RawConnection>();
  const milliseconds connect = std::min(options.connect_timeout, remaining(deadline));
  c->socket.connect(Poco::Net::SocketAddress(target.host, target.port), to_timespan(connect));
  // Not passed on to a process a plugin starts, which would keep the connection open.
  set_close_on_exec(c->socket.impl()->sockfd());
  c->socket.setNoDelay(true);
  opened.fetch_add(1, std::memory_order_relaxed);
  return c;
}

size_t PocoTransport::Impl::pipeline(RawConnection& c, const std::vector<Request>& requests,
                                     const std::vector<size_t>& order, size_t first,
                                     SteadyClock::time_point deadline,
                                     std::vector<BatchResult>& results, bool& reusable,
                                     Phase& phase) {
  phase = Phase::kSending;
  std::string bytes;
  for (size_t k = first; k < order.size(); ++k) {
    const Request& request = requests[order[k]];
    serialize(request, parse_target(request.url), options.user_agent, bytes);
  }
  c.socket.setSendTimeout(to_timespan(remaining(deadline)));
  for (size_t sent = 0; sent < bytes.size();) {
    const int n = c.socket.sendBytes(
        bytes.data() + sent, static_cast<int>(std::min<size_t>(bytes.size() - sent, 1 << 30)));
    if (n <= 0) throw Poco::Net::ConnectionResetException("send failed");
    sent += static_cast<size_t>(n);
  }
  phase = Phase::kWaiting;
  size_t finished = 0;
  reusable = false;
  for (size_t k = first; k < order.size(); ++k) {
    const size_t i = order[k];
    bool answered = false;
    bool close = false;
    try {
      std::optional<Response> response =
          read_response(c, requests[i], deadline, options.max_response_bytes, answered, close);
      if (!response) return finished;  // the server closed the connection
      results[i].response = std::move(response);
    } catch (const BadResponse& e) {
      // The server took the request and answered it, unacceptably: it fails with that answer's
      // error and is not sent again. Where the next answer starts is lost: the rest go on a new
      // connection.
      results[i].error = describe(requests[i], e.what());
      return finished + 1;
    } catch (const Poco::TimeoutException&) {
      throw;
    } catch (const Poco::Exception& e) {
      if (!answered) throw;  // the connection's failure: the rest go again on a new one
      results[i].error = describe(requests[i], failure_reason(e, Phase::kReading));
      return finished + 1;
    }
    ++finished;
    if (close) return finished;
  }
  reusable = true;
  return finished;
}

std::vector<BatchResult> PocoTransport::perform_batch(const std::vector<Request>& requests) {
  std::vector<BatchResult> results(requests.size());
  // A request that cannot be sent (a bad URL, method or header) fails alone, with what perform()
  // would have thrown, as in the one-by-one default; the rest go.
  std::vector<size_t> order;  // the requests that can be sent
  std::optional<Target> target;
  bool pipelined = true;
  milliseconds timeout{0};
  for (size_t i = 0; i < requests.size(); ++i) {
    try {
      const Target t = impl_->target(requests[i].url);
      validate(requests[i]);
      if (!target) target = t;
      pipelined = pipelined && !t.tls && !t.proxied && t.pool_key == target->pool_key;
      timeout = std::max(timeout, requests[i].timeout);
      order.push_back(i);
    } catch (const RequestError& e) {
      results[i].error = e.what();
    }
  }
  if (!pipelined) return Transport::perform_batch(requests);

  // One deadline for the batch: the longest request timeout. Each connection answers what it
  // can; the rest goes out again on a new one, until a fresh connection answers nothing. A
  // request is done once it has its response, or an error of its own.
  const SteadyClock::time_point deadline = SteadyClock::now() + timeout;
  const auto done = [&](size_t k) {
    return results[order[k]].response || !results[order[k]].error.empty();
  };
  size_t next = 0;
  std::string failure;
  while (next < order.size()) {
    bool reused = false;
    const size_t before = next;
    Phase phase = Phase::kConnecting;
    try {
      std::unique_ptr<RawConnection> c = impl_->take_raw(*target, deadline, reused);
      bool reusable = false;
      const size_t finished =
          impl_->pipeline(*c, requests, order, next, deadline, results, reusable, phase);
      if (reusable) {
        std::lock_guard lock(impl_->mutex);
        auto& pool = impl_->raw_idle[target->pool_key];
        if (pool.size() < impl_->options.max_idle_per_origin) pool.push_back(std::move(c));
      }
      if (finished == 0) failure = "the connection closed before any response";
    } catch (const Poco::TimeoutException&) {
      failure = timeout_reason(phase, timeout, impl_->options.connect_timeout);
      // Whatever was answered before the timeout stands; the rest has timed out.
      while (next < order.size() && done(next)) ++next;
      break;
    } catch (const Poco::Exception& e) {
      failure = failure_reason(e, phase);
    }
    while (next < order.size() && done(next)) ++next;
    if (next == before && !reused) break;  // a fresh connection answered nothing: give up
  }
  for (size_t k = next; k < order.size(); ++k) {
    if (!done(k)) results[order[k]].error = describe(requests[order[k]], failure);
  }
  return results;
}

size_t PocoTransport::connections_opened() const {
  return impl_->opened.load(std::memory_order_relaxed);
}

}  // namespace backhaul::http
