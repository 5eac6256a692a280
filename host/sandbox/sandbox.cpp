#include "host/sandbox/sandbox.h"

#include <atomic>
#include <chrono>
#include <mutex>
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
#include <Poco/Timestamp.h>

#include "host/sandbox/apis.h"

namespace backhaul::sandbox {
namespace {

// Bodies above this are refused (GitHub does not deliver webhooks above 25 MB either).
constexpr size_t kMaxBodyBytes = 25 * 1024 * 1024;
constexpr int64_t kHourMs = 3'600'000;

int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

SandboxOptions with_defaults(SandboxOptions options) {
  validate(options);
  if (!options.now_ms) options.now_ms = system_now_ms;
  if (!options.anchor_ms) options.anchor_ms = options.now_ms() / kHourMs * kHourMs;
  return options;
}

DataConfig data_config(const SandboxOptions& options) {
  return {options.seed,
          options.installations,
          options.repos,
          options.projects,
          options.items,
          *options.anchor_ms,
          options.first_installation_repos};
}

std::optional<int> installation_number(const DataModel& data,
                                       const std::optional<std::string>& id) {
  if (!id) return std::nullopt;
  auto number = data.parse_installation_id(*id);
  if (!number) throw std::invalid_argument("unknown installation " + *id);
  return number;
}

}  // namespace

struct Sandbox::Impl {
  explicit Impl(SandboxOptions raw)
      : options(with_defaults(std::move(raw))),
        data(data_config(options)),
        state(data, options.now_ms, options.faults, options.token_lifetime_s),
        deliveries(data),
        context{options, data, state, deliveries, ""} {}

  Response dispatch(const Request& request) const;
  void serve(Poco::Net::HTTPServerRequest& in, Poco::Net::HTTPServerResponse& out) const;

  const SandboxOptions options;
  const DataModel data;
  ProviderState state;
  DeliveryStore deliveries;
  Context context;  // base_url is written by start() before the server accepts anything

  std::atomic<uint16_t> port{0};
  std::unique_ptr<Poco::ThreadPool> pool;
  std::unique_ptr<Poco::Net::HTTPServer> server;
};

namespace {

class Handler final : public Poco::Net::HTTPRequestHandler {
 public:
  explicit Handler(const Sandbox::Impl& impl) : impl_(impl) {}
  void handleRequest(Poco::Net::HTTPServerRequest& request,
                     Poco::Net::HTTPServerResponse& response) override {
    impl_.serve(request, response);
  }

 private:
  const Sandbox::Impl& impl_;
};

class HandlerFactory final : public Poco::Net::HTTPRequestHandlerFactory {
 public:
  explicit HandlerFactory(const Sandbox::Impl& impl) : impl_(impl) {}
  Poco::Net::HTTPRequestHandler* createRequestHandler(
      const Poco::Net::HTTPServerRequest&) override {
    return new Handler(impl_);
  }

 private:
  const Sandbox::Impl& impl_;
};

Response internal_error(const std::string& message) {
  return json_response(500, {{"error", {{"code", "internal"}, {"message", message}}}});
}

}  // namespace

Response Sandbox::Impl::dispatch(const Request& request) const {
  if (request.body_too_large) {
    return json_response(
        413, {{"error", {{"code", "payload_too_large"}, {"message", "body over 25 MB"}}}});
  }
  const std::vector<std::string_view> segments = split_path(request.path);
  if (segments.empty()) return json_response(404, {{"message", "Not Found"}});
  const Route rest = Route(segments).subspan(1);
  if (segments[0] == "github") return handle_github(context, request, rest);
  if (segments[0] == "vercel") return handle_vercel(context, request, rest);
  if (segments[0] == "gateway") return handle_gateway(context, request, rest);
  if (segments[0] == "_sandbox") return handle_control(context, request, rest);
  return json_response(404, {{"message", "Not Found"}});
}

void Sandbox::Impl::serve(Poco::Net::HTTPServerRequest& in,
                          Poco::Net::HTTPServerResponse& out) const {
  // Date by the sandbox's clock, the one its rate-limit resets and retry-afters are counted on (as
  // GitHub's are on its own): a client measures a reset against the Date (the GitHub connector
  // does), and Poco's Date, the wall clock, is far from an injected now_ms.
  out.setDate(Poco::Timestamp(static_cast<Poco::Timestamp::TimeVal>(options.now_ms()) * 1000));
  host::Request request;
  try {
    request = host::read_request(in, kMaxBodyBytes);
  } catch (const std::exception& error) {
    // Where a request that cannot be read ends on the connection is unknown: what follows it is
    // no request of its own (it was answered as one, on a connection kept alive).
    out.setKeepAlive(false);
    host::write_response(
        json_response(400,
                      {{"message", std::string("request could not be read: ") + error.what()}}),
        out);
    return;
  }
  Response response;
  try {
    response = dispatch(request);
  } catch (const std::exception& error) {
    response = internal_error(error.what());
  }
  host::write_response(response, out);
}

Sandbox::Sandbox(SandboxOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Sandbox::~Sandbox() { stop(); }

void Sandbox::start() {
  if (impl_->server) throw std::logic_error("sandbox already started");
  Poco::Net::ServerSocket socket;
  // Poco's bind(address, true) sets SO_REUSEPORT too: a second sandbox on the port would share it.
  socket.bind(Poco::Net::SocketAddress("127.0.0.1", impl_->options.port), /*reuseAddress=*/true,
              /*reusePort=*/false);
  socket.listen(256);
  impl_->port = socket.address().port();
  impl_->context.base_url = "http://127.0.0.1:" + std::to_string(impl_->port.load());

  const int threads = impl_->options.threads;
  auto* params = new Poco::Net::HTTPServerParams;  // owned by the server (reference counted)
  params->setMaxThreads(threads);
  params->setMaxQueued(1024);
  params->setKeepAlive(true);
  params->setMaxKeepAliveRequests(0);  // unlimited
  // Longer than the idle timeout of common clients (Poco's HTTPClientSession: 8 s), so a client
  // never reuses a connection the server has just closed.
  params->setKeepAliveTimeout(Poco::Timespan(10, 0));
  params->setTimeout(Poco::Timespan(30, 0));
  impl_->pool = std::make_unique<Poco::ThreadPool>(2, threads);
  impl_->server = std::make_unique<Poco::Net::HTTPServer>(new HandlerFactory(*impl_), *impl_->pool,
                                                          socket, params);
  impl_->server->start();
}

void Sandbox::stop() {
  if (!impl_->server) return;
  // Aborting current connections also wakes threads idling in keep-alive reads.
  impl_->server->stopAll(/*abortCurrent=*/true);
  impl_->pool->joinAll();
  impl_->server.reset();
  impl_->pool.reset();
}

uint16_t Sandbox::port() const { return impl_->port.load(); }

std::string Sandbox::base_url() const {
  const uint16_t port = impl_->port.load();
  return port == 0 ? std::string() : "http://127.0.0.1:" + std::to_string(port);
}

Report Sandbox::report(const std::optional<std::string>& installation) const {
  return build_report(impl_->context, installation_number(impl_->data, installation));
}

std::vector<std::string> Sandbox::expected_delivery_ids(
    const std::optional<std::string>& installation) const {
  const auto only = installation_number(impl_->data, installation);
  std::vector<std::string> ids;
  for (int i = 1; i <= impl_->data.installations(); ++i) {
    if (only && *only != i) continue;
    impl_->data.for_each_expected(i, [&](const std::string& id, Provider) { ids.push_back(id); });
  }
  return ids;
}

void Sandbox::set_faults(const Faults& faults) { impl_->state.set_faults(faults); }

Faults Sandbox::faults() const { return impl_->state.faults(); }

void Sandbox::reset() {
  impl_->deliveries.reset();
  impl_->state.reset();
}

}  // namespace backhaul::sandbox
