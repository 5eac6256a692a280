#include "host/daemon/admin_server.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include <Poco/Exception.h>
#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/HTTPServerConnection.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/TCPServer.h>
#include <Poco/Net/TCPServerConnectionFactory.h>
#include <Poco/ThreadPool.h>

#include "core/common/logging.h"
#include "core/common/socket_deadlines.h"
#include "core/common/unique_fd.h"
#include "core/common/utf8.h"
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

namespace backhaul::daemon {
namespace {

// Text from a request, for a log line: control characters escaped, at most 200 bytes.
std::string loggable(std::string_view text) {
  constexpr size_t kMaxBytes = 200;
  return text.size() > kMaxBytes ? escape_controls(cut_utf8(text, kMaxBytes)) + "..."
                                 : escape_controls(text);
}

// The connections being served, so that a stop answers the requests under way: a connection
// waiting for a request is shut for reading (its wait meets the end of the stream), and one
// handling a request answers it, then is shut for reading and ends. Aborting them all (Poco's
// stopAll(true)) cut requests off while they committed: a run was started, and its client saw the
// connection reset. [thread-safe]
class Connections {
 public:
  Connections() = default;
  Connections(const Connections&) = delete;
  Connections& operator=(const Connections&) = delete;
  ~Connections() {
    {
      std::lock_guard lock(mutex_);
      closing_ = true;
    }
    due_changed_.notify_one();
    if (shedder_.joinable()) shedder_.join();
  }

  // A connection served on `fd` (open until remove()); shut for reading at once after a stop.
  // Should it still be silent when its grace ends, with a connection waiting for a thread, it is
  // shed then (shed_when_due): no later connection need arrive to make room.
  void add(int fd) {
    const auto now = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mutex_);
      handling_[fd] = false;
      silent_[fd] = now;
      if (stopping_) ::shutdown(fd, SHUT_RD);
      due_.push_back(now + kSilentGrace);
      if (!shedder_.joinable()) shedder_ = std::thread([this] { shed_when_due(); });
    }
    due_changed_.notify_one();
  }
  // The connections served now: one server thread each.
  size_t served() const {
    std::lock_guard lock(mutex_);
    return handling_.size();
  }
  // Every server thread is taken and a connection waits for one: connections between requests
  // (their last one read whole: answered, or being answered) are shut for reading, which ends
  // their keep-alive wait and frees their threads. A client may close such a connection, and a
  // server too (RFC 9112 9.3); its next request goes on a new one. Before, a few polling clients
  // (`run status --wait`) held every thread in their 10 s keep-alive waits, and /health/live went
  // unanswered for 30 s.
  // So are connections that have sent no request within kSilentGrace of their start: a client
  // sends its request as soon as it connects, and before, a few that connected and sent nothing
  // held the threads until admin.timeout_ms ended them.
  void shed_idle() {
    std::lock_guard lock(mutex_);
    shed_idle_locked();
  }
  // The request on `fd` was read whole: from here until its next request arrives, shedding the
  // connection cuts nothing short (its answer still goes out; the reading side is what is shut).
  // Marked before the answer is written, so that a client that has it finds the mark made.
  void sheddable(int fd) {
    std::lock_guard lock(mutex_);
    if (handling_.count(fd)) keep_alive_.insert(fd);
  }
  // Whether an accepted connection waits for a server thread: an answer then closes its own
  // connection rather than keep it (and its thread) for the client's next request.
  bool others_waiting() const {
    std::lock_guard lock(server_mutex_);
    return server_ != nullptr && server_->queuedConnections() > 0;
  }
  // The server whose queue others_waiting() reads, and its threads; nullptr before it goes (once
  // this returns, no thread reads the old one).
  void serving_for(const Poco::Net::TCPServer* server, size_t threads = 0) {
    {
      std::lock_guard lock(mutex_);
      threads_ = threads;
    }
    std::lock_guard lock(server_mutex_);
    server_ = server;
  }
  void remove(int fd) {
    std::lock_guard lock(mutex_);
    handling_.erase(fd);
    keep_alive_.erase(fd);
    silent_.erase(fd);
    changed_.notify_all();
  }
  // The connection on `fd` began (true) or ended (false) handling a request: from its headers to
  // its answer on the socket. One that ends after the stop is shut for reading then.
  void handling(int fd, bool yes) {
    std::lock_guard lock(mutex_);
    if (auto it = handling_.find(fd); it != handling_.end()) {
      it->second = yes;
      if (yes) {
        keep_alive_.erase(fd);  // marked sheddable again once its request is read
        silent_.erase(fd);
      }
    }
    if (!yes && stopping_) ::shutdown(fd, SHUT_RD);
    if (!yes) changed_.notify_all();
  }
  // No new request from here on: a connection waiting for one is shut for reading (the wait meets
  // the end of the stream). One handling a request (its body perhaps still arriving) reads it
  // whole, and its answer closes the connection.
  void stop_reading() {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    for (const auto& [fd, busy] : handling_) {
      if (!busy) ::shutdown(fd, SHUT_RD);
    }
  }
  // Waits until no connection is handling a request, `until` passes or hurry() is called; returns
  // how many still are.
  size_t wait_for_requests(std::chrono::steady_clock::time_point until) {
    std::unique_lock lock(mutex_);
    changed_.wait_until(lock, until, [this] { return hurried_ || under_way_locked() == 0; });
    return under_way_locked();
  }
  void hurry() {
    std::lock_guard lock(mutex_);
    hurried_ = true;
    changed_.notify_all();
  }
  bool stopping() const {
    std::lock_guard lock(mutex_);
    return stopping_;
  }
  size_t under_way() const {
    std::lock_guard lock(mutex_);
    return under_way_locked();
  }

 private:
  static constexpr std::chrono::seconds kSilentGrace{1};

  void shed_idle_locked() {
    for (int fd : keep_alive_) shed_unless_arriving(fd);
    const auto started_before = std::chrono::steady_clock::now() - kSilentGrace;
    for (const auto& [fd, since] : silent_) {
      if (since <= started_before) shed_unless_arriving(fd);
    }
  }

  // The shedder thread: as each connection's grace ends, sheds the idle connections if one waits
  // for a thread. (Shedding only as a connection arrives left one that came within the grace of
  // silent ones waiting until admin.timeout_ms.)
  void shed_when_due() {
    std::unique_lock lock(mutex_);
    while (!closing_) {
      if (due_.empty()) {
        due_changed_.wait(lock);
        continue;
      }
      const auto at = due_.front();
      if (std::chrono::steady_clock::now() < at) {
        due_changed_.wait_until(lock, at);
        continue;
      }
      while (!due_.empty() && due_.front() <= at) due_.pop_front();
      lock.unlock();  // Poco's lock is not taken under ours
      const bool waiting = others_waiting();
      lock.lock();
      // Only with every thread taken: a connection is queued for a moment too as it is handed to
      // a free thread, and shedding then cut keep-alive clients off between their requests.
      if (waiting && threads_ > 0 && handling_.size() >= threads_) shed_idle_locked();
    }
  }

  // Shuts `fd` for reading, unless its next request has begun to arrive: shut, the rest of its
  // headers would not be read. (Bytes Poco has already taken from the socket are not seen here: a
  // request whose first part it read, and whose rest is late, may still be cut.)
  static void shed_unless_arriving(int fd) {
    int unread = 0;
    if (::ioctl(fd, FIONREAD, &unread) == 0 && unread > 0) return;
    ::shutdown(fd, SHUT_RD);
  }

  size_t under_way_locked() const {
    return static_cast<size_t>(
        std::count_if(handling_.begin(), handling_.end(), [](const auto& c) { return c.second; }));
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<int, bool> handling_;  // by descriptor: whether it is handling a request
  std::set<int> keep_alive_;      // those whose last request was read whole (sheddable)
  std::map<int, std::chrono::steady_clock::time_point> silent_;  // no request begun yet: since
  std::deque<std::chrono::steady_clock::time_point> due_;        // graces to end, in order
  std::condition_variable due_changed_;
  std::thread shedder_;
  bool closing_ = false;
  size_t threads_ = 0;               // the server's threads (0: not serving)
  mutable std::mutex server_mutex_;  // taken alone, never with mutex_
  const Poco::Net::TCPServer* server_ = nullptr;
  bool stopping_ = false;
  bool hurried_ = false;
};

// The connection a thread serves, registered in Connections while it lasts, and the bound of its
// requests. The whole-request bound: Poco bounds each receive (admin.timeout_ms) but not a
// request: a client sending a header byte now and then held a server thread as long as it liked,
// and admin.max_connections of them shut everyone out, /health/live included. Each request must
// be read within `read` of its connection's start, or of the previous answer plus the keep-alive
// wait; at that deadline the socket is shut down and the connection ends. `read` is the receive
// timeout twice (once plus a second at least), so that a client that stops sending is answered
// (400, its body cut short) when its receive times out, before the deadline takes the connection. A
// request being handled has no deadline (a plugin's validate-config may take its time).
class ServedConnection {
 public:
  // `own_fd`: `fd` is a duplicate of the connection's, open as long as this lives. Only such a
  // connection is registered in `connections`: Poco's own descriptor is closed before this ends,
  // and its number may be another socket's by then.
  ServedConnection(SocketDeadlines& deadlines, Connections& connections, int fd, bool own_fd,
                   std::chrono::milliseconds read, std::chrono::milliseconds keep_alive)
      : deadlines_(deadlines),
        connections_(connections),
        fd_(fd),
        registered_(own_fd),
        read_(read),
        keep_alive_(keep_alive) {
    if (registered_) connections_.add(fd_);
    arm(read_);
    current_ = this;
  }
  ~ServedConnection() {
    current_ = nullptr;
    if (registered_) connections_.remove(fd_);
  }
  ServedConnection(const ServedConnection&) = delete;
  ServedConnection& operator=(const ServedConnection&) = delete;

  // Of the connection this thread serves (the handler runs on the connection's thread).
  static void request_begun() {
    if (current_ && current_->registered_) current_->connections_.handling(current_->fd_, true);
  }
  static void request_read() {
    if (!current_) return;
    current_->watch_.reset();
    if (current_->registered_) current_->connections_.sheddable(current_->fd_);
  }
  // Whether the server stopped taking requests, or another connection waits for this one's
  // thread: the answer closes the connection.
  static bool last_answer() {
    return current_ &&
           (current_->connections_.stopping() || current_->connections_.others_waiting());
  }
  static void answered() {
    if (!current_) return;
    if (current_->registered_) current_->connections_.handling(current_->fd_, false);
    current_->arm(current_->keep_alive_ + current_->read_);
  }

 private:
  void arm(std::chrono::milliseconds budget) {
    watch_.reset();
    watch_.emplace(deadlines_, fd_, std::chrono::steady_clock::now() + budget);
  }

  static thread_local ServedConnection* current_;
  SocketDeadlines& deadlines_;
  Connections& connections_;
  const int fd_;
  const bool registered_;
  const std::chrono::milliseconds read_;
  const std::chrono::milliseconds keep_alive_;
  std::optional<SocketDeadlines::Watch> watch_;
};

thread_local ServedConnection* ServedConnection::current_ = nullptr;

class Handler final : public Poco::Net::HTTPRequestHandler {
 public:
  explicit Handler(AdminApi& api) : api_(api) {}
  void handleRequest(Poco::Net::HTTPServerRequest& request,
                     Poco::Net::HTTPServerResponse& response) override {
    ServedConnection::request_begun();
    host::Request in;
    try {
      in = host::read_request(request, api_.options().max_body_bytes);
    } catch (const std::exception& e) {
      // Reading the request failed (client went away, malformed chunking): the API refuses it,
      // with an operation id, and audits it as it does every refused mutation.
      // At debug level, escaped and cut: anyone reaching the port can send these, as fast as
      // they like, with any bytes (the client gets a 400 naming the problem; /metrics counts it).
      logging::get("admin_api")
          ->debug("reading request {} failed: {}", loggable(request.getURI()), loggable(e.what()));
      in = host::Request{};
      in.method = request.getMethod();
      in.path = request.getURI().substr(0, request.getURI().find('?'));
      in.raw_path = in.path;
      in.unreadable = e.what();
    }
    ServedConnection::request_read();
    const host::Response answer = api_.handle(in);
    // Where an unreadable request ends on the connection is unknown: whatever follows it is no
    // request of its own.
    if (in.unreadable || ServedConnection::last_answer()) response.setKeepAlive(false);
    host::write_response(answer, response);
    ServedConnection::answered();
  }

 private:
  AdminApi& api_;
};

class HandlerFactory final : public Poco::Net::HTTPRequestHandlerFactory {
 public:
  explicit HandlerFactory(AdminApi& api) : api_(api) {}
  Poco::Net::HTTPRequestHandler* createRequestHandler(
      const Poco::Net::HTTPServerRequest&) override {
    return new Handler(api_);
  }
  // Closes the connections being served, as Poco's HTTPServer::stopAll(true) does.
  void abort_connections() { serverStopped(this, true); }

 private:
  AdminApi& api_;
};

// Poco's connection, except that a request whose headers it cannot take is answered. Poco builds
// the request before any handler runs, and a Content-Length that is no number it can read ("abc",
// past int64, "5, 5") throws out of its loop: the connection closed with no answer, nothing
// logged. Here it is refused as every unreadable request is (400, the API's envelope), and the
// connection closed. Its method and target are not known, so it is not audited.
class Connection final : public Poco::Net::HTTPServerConnection {
 public:
  Connection(const Poco::Net::StreamSocket& socket, Poco::Net::HTTPServerParams::Ptr params,
             Poco::Net::HTTPRequestHandlerFactory::Ptr handlers, AdminApi& api,
             SocketDeadlines& deadlines, Connections& connections)
      : HTTPServerConnection(socket, params, handlers),
        api_(api),
        deadlines_(deadlines),
        connections_(connections),
        read_(params->getTimeout().totalMilliseconds() +
              std::max<int64_t>(params->getTimeout().totalMilliseconds(), 1000)),
        keep_alive_(params->getKeepAliveTimeout().totalMilliseconds()) {}

  void run() override {
    // Poco's session closes the socket as it ends, by an exception too: a duplicate to answer on.
    // The deadline watches it too, as it stays open until the watch ends: Poco's own number may
    // be another connection's by then.
    const UniqueFd spare(::fcntl(socket().impl()->sockfd(), F_DUPFD_CLOEXEC, 0));
    const ServedConnection served(deadlines_, connections_,
                                  spare ? spare.get() : socket().impl()->sockfd(),
                                  static_cast<bool>(spare), read_, keep_alive_);
    try {
      HTTPServerConnection::run();
    } catch (const Poco::SyntaxException& e) {
      if (spare)
        refuse(spare.get(),
               "headers: " + e.displayText() + " (Content-Length must be one decimal number)");
    }
  }

 private:
  void refuse(int fd, const std::string& why) {
    logging::get("admin_api")->debug("a request could not be read: {}", loggable(why));
    host::Request request;
    request.unreadable = why;
    const host::Response answer = api_.handle(request);
    std::string bytes = "HTTP/1.1 " + std::to_string(answer.status) + " " +
                        Poco::Net::HTTPResponse::getReasonForStatus(
                            static_cast<Poco::Net::HTTPResponse::HTTPStatus>(answer.status)) +
                        "\r\nContent-Type: " + answer.content_type +
                        "\r\nContent-Length: " + std::to_string(answer.body.size()) +
                        "\r\nConnection: close\r\n";
    for (const auto& [name, value] : answer.headers) bytes += name + ": " + value + "\r\n";
    bytes += "\r\n" + answer.body;
    // A few hundred bytes: the socket's send buffer takes them whether or not the client reads.
    for (size_t sent = 0; sent < bytes.size();) {
      const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the client went away: nothing more to do
      sent += static_cast<size_t>(n);
    }
  }

  AdminApi& api_;
  SocketDeadlines& deadlines_;
  Connections& connections_;
  const std::chrono::milliseconds read_;
  const std::chrono::milliseconds keep_alive_;
};

class ConnectionFactory final : public Poco::Net::TCPServerConnectionFactory {
 public:
  ConnectionFactory(Poco::Net::HTTPServerParams::Ptr params,
                    Poco::Net::HTTPRequestHandlerFactory::Ptr handlers, AdminApi& api,
                    SocketDeadlines& deadlines, Connections& connections)
      : params_(std::move(params)),
        handlers_(std::move(handlers)),
        api_(api),
        deadlines_(deadlines),
        connections_(connections) {}
  Poco::Net::TCPServerConnection* createConnection(const Poco::Net::StreamSocket& socket) override {
    return new Connection(socket, params_, handlers_, api_, deadlines_, connections_);
  }

 private:
  Poco::Net::HTTPServerParams::Ptr params_;
  Poco::Net::HTTPRequestHandlerFactory::Ptr handlers_;
  AdminApi& api_;
  SocketDeadlines& deadlines_;
  Connections& connections_;
};

// Runs on the accepting thread, as soon as a connection is accepted: neither is a connection
// passed on to a process a plugin starts (a helper holding it would keep the client from seeing
// the connection close).
// It also makes room for the connection: with every server thread taken, the connections idle
// between requests are shed (Connections::shed_idle), and it is served as their threads free up.
class CloseOnExec final : public Poco::Net::TCPServerConnectionFilter {
 public:
  CloseOnExec(Connections& connections, size_t threads)
      : connections_(connections), threads_(threads) {}
  bool accept(const Poco::Net::StreamSocket& socket) override {
    set_close_on_exec(socket.impl()->sockfd());
    if (connections_.served() >= threads_) connections_.shed_idle();
    return true;
  }

 private:
  Connections& connections_;
  const size_t threads_;
};

}  // namespace

struct AdminServer::Impl {
  AdminApi& api;
  AdminServerOptions options;
  std::atomic<uint16_t> port{0};
  SocketDeadlines deadlines;         // of the connections' requests; outlives them
  Connections connections;           // outlives them too
  Poco::Net::ServerSocket listener;  // the server's, shared: closed as soon as it stops accepting
  std::unique_ptr<Poco::ThreadPool> pool;
  Poco::Net::HTTPRequestHandlerFactory::Ptr handlers;  // a HandlerFactory
  HandlerFactory* handler_factory = nullptr;           // handlers, for abort_connections()
  std::unique_ptr<Poco::Net::TCPServer> server;
};

AdminServer::AdminServer(AdminApi& api, AdminServerOptions options)
    : impl_(new Impl{api, std::move(options), {}, {}, {}, {}, nullptr, nullptr, nullptr, nullptr}) {
}

AdminServer::~AdminServer() { stop(); }

Poco::Net::ServerSocket AdminServer::listen(const std::string& address, uint16_t port) {
  Poco::Net::ServerSocket socket;
  // Not SO_REUSEPORT, which Poco's bind(address, true) sets too: a second daemon on the port would
  // start, and the kernel would share the requests between the two.
  socket.bind(Poco::Net::SocketAddress(address, port), /*reuseAddress=*/true, /*reusePort=*/false);
  socket.listen(64);
  // Not into a process a plugin starts: one outliving backhauld would hold the admin port.
  set_close_on_exec(socket.impl()->sockfd());
  return socket;
}

void AdminServer::start() { start(listen(impl_->options.listen, impl_->options.port)); }

void AdminServer::start(Poco::Net::ServerSocket socket) {
  if (impl_->server) throw std::logic_error("admin server already started");
  impl_->port = socket.address().port();
  impl_->listener = socket;

  const int threads = impl_->options.max_connections;
  const Poco::Timespan timeout(impl_->options.timeout_ms * 1000);
  Poco::Net::HTTPServerParams::Ptr params = new Poco::Net::HTTPServerParams;
  params->setMaxThreads(threads);
  params->setMaxQueued(threads);  // beyond threads + queue, connections are refused
  params->setKeepAlive(true);
  params->setMaxKeepAliveRequests(100);
  params->setKeepAliveTimeout(Poco::Timespan(10, 0));
  params->setTimeout(timeout);
  params->setServerName("backhauld");
  impl_->pool = std::make_unique<Poco::ThreadPool>(1, threads);
  impl_->handler_factory = new HandlerFactory(impl_->api);
  impl_->handlers = impl_->handler_factory;  // owns it
  impl_->server = std::make_unique<Poco::Net::TCPServer>(
      new ConnectionFactory(params, impl_->handlers, impl_->api, impl_->deadlines,
                            impl_->connections),
      *impl_->pool, socket, Poco::Net::TCPServerParams::Ptr(params.get(), /*shared=*/true));
  impl_->server->setConnectionFilter(
      new CloseOnExec(impl_->connections, static_cast<size_t>(threads)));
  impl_->connections.serving_for(impl_->server.get(), static_cast<size_t>(threads));
  impl_->server->start();
}

void AdminServer::stop_taking_requests() {
  if (!impl_->server) return;
  impl_->server->stop();  // accepts no more; those accepted and not yet served are closed
  // The accepting thread is joined: the port is closed now, and a new connection is refused at
  // once (a listening socket would let the kernel take connections nobody reads).
  impl_->listener.close();
  impl_->connections.stop_reading();
}

size_t AdminServer::requests_under_way() const { return impl_->connections.under_way(); }

void AdminServer::hurry() { impl_->connections.hurry(); }

void AdminServer::stop(std::chrono::steady_clock::time_point answer_until) {
  if (!impl_->server) return;
  stop_taking_requests();
  if (const size_t left = impl_->connections.wait_for_requests(answer_until); left > 0) {
    logging::get("admin_api")
        ->warn("stop: {} admin requests still under way; closing their connections", left);
  }
  impl_->handler_factory->abort_connections();
  impl_->pool->joinAll();  // a handler still in a call into a plugin: the stop's watchdog
  impl_->connections.serving_for(nullptr);
  impl_->server.reset();
  impl_->handlers = nullptr;
  impl_->handler_factory = nullptr;
  impl_->pool.reset();
}

uint16_t AdminServer::port() const { return impl_->port.load(); }

}  // namespace backhaul::daemon
