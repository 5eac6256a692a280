#include "host/daemon/admin_server.h"

#include <atomic>
#include <stdexcept>

#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/ThreadPool.h>

#include "core/common/logging.h"
#include "core/common/unique_fd.h"

namespace backhaul::daemon {
namespace {

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
    const host::Response answer = api_.handle(in);
    // Where an unreadable request ends on the connection is unknown: whatever follows it is no
    // request of its own.
    if (in.unreadable) response.setKeepAlive(false);
    host::write_response(answer, response);
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

 private:
  AdminApi& api_;
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
  std::unique_ptr<Poco::ThreadPool> pool;
  std::unique_ptr<Poco::Net::HTTPServer> server;
};

AdminServer::AdminServer(AdminApi& api, AdminServerOptions options)
    : impl_(new Impl{api, std::move(options), {}, nullptr, nullptr}) {}

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
  auto* params = new Poco::Net::HTTPServerParams;  // owned by the server (reference counted)
  params->setMaxThreads(threads);
  params->setMaxQueued(threads);  // beyond threads + queue, connections are refused
  params->setKeepAlive(true);
  params->setMaxKeepAliveRequests(100);
  params->setKeepAliveTimeout(Poco::Timespan(10, 0));
  params->setTimeout(timeout);
  params->setServerName("backhauld");
  impl_->pool = std::make_unique<Poco::ThreadPool>(1, threads);
  impl_->server = std::make_unique<Poco::Net::HTTPServer>(new HandlerFactory(impl_->api),
                                                          *impl_->pool, socket, params);
  impl_->server->setConnectionFilter(new CloseOnExec);
  impl_->server->start();
}

void AdminServer::stop() {
  if (!impl_->server) return;
  impl_->server->stopAll(/*abortCurrent=*/true);
  impl_->pool->joinAll();
  impl_->server.reset();
  impl_->pool.reset();
}

uint16_t AdminServer::port() const { return impl_->port.load(); }

}  // namespace backhaul::daemon
