#include "host/daemon/admin_server.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <optional>
#include <stdexcept>

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
#include <fcntl.h>
#include <sys/socket.h>

namespace backhaul::daemon {
namespace {

// The whole-request bound of a connection. Poco bounds each receive (admin.timeout_ms) but not a
// request: a client sending a header byte now and then held a server thread as long as it liked,
// and admin.max_connections of them shut everyone out, /health/live included. Each request must
// be read within `read` of its connection's start, or of the previous answer plus the keep-alive
// wait; at that deadline the socket is shut down and the connection ends. `read` is the receive
// timeout twice (once plus a second at least), so that a client that stops sending is answered
// (400, its body cut short) when its receive times out, before the deadline takes the connection. A
// request being handled has no deadline (a plugin's validate-config may take its time).
class RequestDeadline {
 public:
  RequestDeadline(SocketDeadlines& deadlines, int fd, std::chrono::milliseconds read,
                  std::chrono::milliseconds keep_alive)
      : deadlines_(deadlines), fd_(fd), read_(read), keep_alive_(keep_alive) {
    arm(read_);
    current_ = this;
  }
  ~RequestDeadline() { current_ = nullptr; }
  RequestDeadline(const RequestDeadline&) = delete;
  RequestDeadline& operator=(const RequestDeadline&) = delete;

  // Of the connection this thread serves (the handler runs on the connection's thread).
  static void request_read() {
    if (current_) current_->watch_.reset();
  }
  static void answered() {
    if (current_) current_->arm(current_->keep_alive_ + current_->read_);
  }

 private:
  void arm(std::chrono::milliseconds budget) {
    watch_.reset();
    watch_.emplace(deadlines_, fd_, std::chrono::steady_clock::now() + budget);
  }

  static thread_local RequestDeadline* current_;
  SocketDeadlines& deadlines_;
  const int fd_;
  const std::chrono::milliseconds read_;
  const std::chrono::milliseconds keep_alive_;
  std::optional<SocketDeadlines::Watch> watch_;
};

thread_local RequestDeadline* RequestDeadline::current_ = nullptr;

class Handler final : public Poco::Net::HTTPRequestHandler {
 public:
  explicit Handler(AdminApi& api) : api_(api) {}
  void handleRequest(Poco::Net::HTTPServerRequest& request,
                     Poco::Net::HTTPServerResponse& response) override {
    host::Request in;
    try {
      in = host::read_request(request, api_.options().max_body_bytes);
    } catch (const std::exception& e) {
      // Reading the request failed (client went away, malformed chunking): the API refuses it,
      // with an operation id, and audits it as it does every refused mutation.
      logging::get("admin_api")->warn("reading request {} failed: {}", request.getURI(), e.what());
      in = host::Request{};
      in.method = request.getMethod();
      in.path = request.getURI().substr(0, request.getURI().find('?'));
      in.unreadable = e.what();
    }
    RequestDeadline::request_read();
    const host::Response answer = api_.handle(in);
    // Where an unreadable request ends on the connection is unknown: whatever follows it is no
    // request of its own.
    if (in.unreadable) response.setKeepAlive(false);
    host::write_response(answer, response);
    RequestDeadline::answered();
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
             SocketDeadlines& deadlines)
      : HTTPServerConnection(socket, params, handlers),
        api_(api),
        deadlines_(deadlines),
        read_(params->getTimeout().totalMilliseconds() +
              std::max<int64_t>(params->getTimeout().totalMilliseconds(), 1000)),
        keep_alive_(params->getKeepAliveTimeout().totalMilliseconds()) {}

  void run() override {
    // Poco's session closes the socket as it ends, by an exception too: a duplicate to answer on.
    // The deadline watches it too, as it stays open until the watch ends: Poco's own number may
    // be another connection's by then.
    const UniqueFd spare(::fcntl(socket().impl()->sockfd(), F_DUPFD_CLOEXEC, 0));
    const RequestDeadline deadline(deadlines_, spare ? spare.get() : socket().impl()->sockfd(),
                                   read_, keep_alive_);
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
    logging::get("admin_api")->warn("a request could not be read: {}", why);
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
  const std::chrono::milliseconds read_;
  const std::chrono::milliseconds keep_alive_;
};

class ConnectionFactory final : public Poco::Net::TCPServerConnectionFactory {
 public:
  ConnectionFactory(Poco::Net::HTTPServerParams::Ptr params,
                    Poco::Net::HTTPRequestHandlerFactory::Ptr handlers, AdminApi& api,
                    SocketDeadlines& deadlines)
      : params_(std::move(params)),
        handlers_(std::move(handlers)),
        api_(api),
        deadlines_(deadlines) {}
  Poco::Net::TCPServerConnection* createConnection(const Poco::Net::StreamSocket& socket) override {
    return new Connection(socket, params_, handlers_, api_, deadlines_);
  }

 private:
  Poco::Net::HTTPServerParams::Ptr params_;
  Poco::Net::HTTPRequestHandlerFactory::Ptr handlers_;
  AdminApi& api_;
  SocketDeadlines& deadlines_;
};

// Runs on the accepting thread, as soon as a connection is accepted: neither is a connection
// passed on to a process a plugin starts (a helper holding it would keep the client from seeing
// the connection close).
class CloseOnExec final : public Poco::Net::TCPServerConnectionFilter {
 public:
  bool accept(const Poco::Net::StreamSocket& socket) override {
    set_close_on_exec(socket.impl()->sockfd());
    return true;
  }
};

}  // namespace

struct AdminServer::Impl {
  AdminApi& api;
  AdminServerOptions options;
  std::atomic<uint16_t> port{0};
  SocketDeadlines deadlines;  // of the connections' requests; outlives them
  std::unique_ptr<Poco::ThreadPool> pool;
  Poco::Net::HTTPRequestHandlerFactory::Ptr handlers;  // a HandlerFactory
  HandlerFactory* handler_factory = nullptr;           // handlers, for abort_connections()
  std::unique_ptr<Poco::Net::TCPServer> server;
};

AdminServer::AdminServer(AdminApi& api, AdminServerOptions options)
    : impl_(new Impl{api, std::move(options), {}, {}, nullptr, nullptr, nullptr, nullptr}) {}

AdminServer::~AdminServer() { stop(); }

void AdminServer::start() {
  if (impl_->server) throw std::logic_error("admin server already started");
  Poco::Net::ServerSocket socket;
  // Not SO_REUSEPORT, which Poco's bind(address, true) sets too: a second daemon on the port would
  // start, and the kernel would share the requests between the two.
  socket.bind(Poco::Net::SocketAddress(impl_->options.listen, impl_->options.port),
              /*reuseAddress=*/true, /*reusePort=*/false);
  socket.listen(64);
  // Not into a process a plugin starts: one outliving backhauld would hold the admin port.
  set_close_on_exec(socket.impl()->sockfd());
  impl_->port = socket.address().port();

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
      new ConnectionFactory(params, impl_->handlers, impl_->api, impl_->deadlines), *impl_->pool,
      socket, Poco::Net::TCPServerParams::Ptr(params.get(), /*shared=*/true));
  impl_->server->setConnectionFilter(new CloseOnExec);
  impl_->server->start();
}

void AdminServer::stop() {
  if (!impl_->server) return;
  impl_->server->stop();
  impl_->handler_factory->abort_connections();
  impl_->pool->joinAll();
  impl_->server.reset();
  impl_->handlers = nullptr;
  impl_->handler_factory = nullptr;
  impl_->pool.reset();
}

uint16_t AdminServer::port() const { return impl_->port.load(); }

}  // namespace backhaul::daemon
