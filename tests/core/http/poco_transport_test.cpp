// PocoTransport against real servers on 127.0.0.1 (port 0): a Poco HTTPServer for ordinary
// exchanges, a bare TCP server for connection-level misbehaviour, and a Poco HTTPS server with a
// CA and certificate generated at test time by the openssl CLI.
#include "core/http/poco_transport.h"

#include <atomic>
#include <chrono>
#include <cstdlib>  // std::system, mkdtemp (POSIX)
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <Poco/Exception.h>
#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/NetSSL.h>
#include <Poco/Net/SecureServerSocket.h>
#include <Poco/Net/SecureStreamSocket.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/Socket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/StreamCopier.h>
#include <Poco/ThreadPool.h>
#include <Poco/URI.h>
#include <gtest/gtest.h>

#include "core/http/http.h"
#include "tests/support/open_sockets.h"
#include "tests/support/tcp_server.h"
#include "tests/support/test_proxy.h"

namespace backhaul::http {
namespace {

using namespace std::chrono_literals;
using Poco::Net::HTTPResponse;
using Poco::Net::HTTPServerRequest;
using Poco::Net::HTTPServerResponse;

bool contains(std::string_view haystack, std::string_view needle) {
  return to_lower(haystack).find(to_lower(needle)) != std::string::npos;
}

// The TransportError message of `request`, or "" with a test failure when it succeeds.
std::string transport_error(PocoTransport& transport, const Request& request) {
  try {
    const Response r = transport.perform(request);
    ADD_FAILURE() << "expected a TransportError, got status " << r.status;
  } catch (const TransportError& e) {
    return e.what();
  }
  return {};
}

// The TransportError message of `request`, and how long it took to come.
std::pair<std::string, std::chrono::steady_clock::duration> timed_error(PocoTransport& transport,
                                                                        const Request& request) {
  const auto started = std::chrono::steady_clock::now();
  std::string error = transport_error(transport, request);
  return {std::move(error), std::chrono::steady_clock::now() - started};
}

// ---------------------------------------------------------------------------------------------
// A Poco HTTPServer calling a function for each request.

using Handler = std::function<void(HTTPServerRequest&, HTTPServerResponse&)>;

class FunctionHandler final : public Poco::Net::HTTPRequestHandler {
 public:
  explicit FunctionHandler(const Handler& handler) : handler_(handler) {}
  void handleRequest(HTTPServerRequest& request, HTTPServerResponse& response) override {
    handler_(request, response);
  }

 private:
  const Handler& handler_;
};

class FunctionHandlerFactory final : public Poco::Net::HTTPRequestHandlerFactory {
 public:
  explicit FunctionHandlerFactory(Handler handler) : handler_(std::move(handler)) {}
  Poco::Net::HTTPRequestHandler* createRequestHandler(const HTTPServerRequest&) override {
    return new FunctionHandler(handler_);
  }

 private:
  Handler handler_;
};

class TestServer {
 public:
  explicit TestServer(Handler handler)
      : TestServer(std::move(handler),
                   Poco::Net::ServerSocket(Poco::Net::SocketAddress("127.0.0.1", 0))) {}

  TestServer(Handler handler, const Poco::Net::ServerSocket& socket)
      : pool_(2, 32),
        port_(socket.address().port()),
        server_(new FunctionHandlerFactory(std::move(handler)), pool_, socket, params()) {
    server_.start();
  }

  ~TestServer() {
    server_.stopAll(true);
    pool_.joinAll();
  }

  uint16_t port() const { return port_; }
  std::string url(std::string_view path, std::string_view host = "127.0.0.1",
                  std::string_view scheme = "http") const {
    return std::string(scheme) + "://" + std::string(host) + ":" + std::to_string(port_) +
           std::string(path);
  }
  int total_connections() const { return server_.totalConnections(); }

 private:
  static Poco::Net::HTTPServerParams::Ptr params() {
    Poco::Net::HTTPServerParams::Ptr p = new Poco::Net::HTTPServerParams;
    p->setMaxThreads(32);
    p->setKeepAliveTimeout(Poco::Timespan(60, 0));
    return p;
  }

  Poco::ThreadPool pool_;
  uint16_t port_;
  Poco::Net::HTTPServer server_;
};

void reply(HTTPServerResponse& response, const std::string& body) {
  response.setContentLength64(static_cast<Poco::Int64>(body.size()));
  response.send() << body;
}

// Echoes the request: the body as the body, the rest in X-Echo-* headers.
void echo(HTTPServerRequest& request, HTTPServerResponse& response) {
  std::string body;
  Poco::StreamCopier::copyToString(request.stream(), body);
  response.set("X-Echo-Method", request.getMethod());
  response.set("X-Echo-Uri", request.getURI());
  response.set("X-Echo-Host", request.get("Host", "<none>"));
  response.set("X-Echo-User-Agent", request.get("User-Agent", "<none>"));
  response.set("X-Echo-Test", request.get("X-Test", "<none>"));
  response.set("X-Echo-Authorization", request.get("Authorization", "<none>"));
  response.set("X-Echo-Proxy-Authorization", request.get("Proxy-Authorization", "<none>"));
  response.set("X-Echo-Content-Length", request.get("Content-Length", "<none>"));
  reply(response, body);
}

// The routes most tests share.
class RoutingServer {
 public:
  RoutingServer() : server_([this](auto& request, auto& response) { route(request, response); }) {}

  std::string url(std::string_view path, std::string_view host = "127.0.0.1") const {
    return server_.url(path, host);
  }
  uint16_t port() const { return server_.port(); }
  int total_connections() const { return server_.total_connections(); }
  int loop_hits() const { return loop_hits_.load(); }

 private:
  void route(HTTPServerRequest& request, HTTPServerResponse& response) {
    const std::string path = Poco::URI(request.getURI()).getPath();
    const std::string self = "http://" + request.get("Host");
    if (path == "/echo") {
      echo(request, response);
      return;
    }
    // Poco's server leaves an unread request body on a kept-alive connection, where it would be
    // taken for the next request.
    std::string unread;
    Poco::StreamCopier::copyToString(request.stream(), unread);
    if (path == "/repeat") {
      response.add("Set-Cookie", "a=1");
      response.add("Set-Cookie", "b=2");
      response.set("X-Mixed-Case", "v");
      reply(response, "r");
    } else if (path == "/close") {
      response.setKeepAlive(false);
      reply(response, "bye");
    } else if (path == "/bytes") {
      const size_t n = std::stoul(Poco::URI(request.getURI()).getQuery());
      reply(response, std::string(n, 'b'));
    } else if (path == "/chunked") {
      const size_t n = std::stoul(Poco::URI(request.getURI()).getQuery());
      response.setChunkedTransferEncoding(true);
      std::ostream& out = response.send();
      for (size_t i = 0; i < n; i += 100) out << std::string(std::min<size_t>(100, n - i), 'c');
    } else if (path == "/nocontent") {
      response.setStatus(HTTPResponse::HTTP_NO_CONTENT);
      response.send();
    } else if (path == "/r301") {
      response.redirect(self + "/echo", HTTPResponse::HTTP_MOVED_PERMANENTLY);
    } else if (path == "/dir/rel") {
      response.redirect("target", HTTPResponse::HTTP_FOUND);
    } else if (path == "/dir/target") {
      reply(response, "dir-target");
    } else if (path == "/r307") {
      response.redirect("/echo", HTTPResponse::HTTP_TEMPORARY_REDIRECT);
    } else if (path == "/r303") {
      response.redirect("/echo", HTTPResponse::HTTP_SEE_OTHER);
    } else if (path.rfind("/loop/", 0) == 0) {
      ++loop_hits_;
      const int n = std::stoi(path.substr(6));
      response.redirect("/loop/" + std::to_string(n + 1), HTTPResponse::HTTP_FOUND);
    } else if (path == "/cross") {
      const std::string port = std::to_string(request.serverAddress().port());
      response.redirect("http://localhost:" + port + "/echo", HTTPResponse::HTTP_FOUND);
    } else if (path == "/same") {
      response.redirect("/echo", HTTPResponse::HTTP_FOUND);
    } else {
      response.setStatus(HTTPResponse::HTTP_NOT_FOUND);
      reply(response, "no route " + path);
    }
  }

  std::atomic<int> loop_hits_{0};
  TestServer server_;  // last: stops before the members its handler uses
};

// ---------------------------------------------------------------------------------------------
// A bare TCP server: reads requests, answers each with a canned response, and misbehaves with the
// connection as told.

// How a slow server sends: the response's bytes from `from` on go `step` at a time, `gap` apart
// (too slow to finish within any deadline, yet sending something now and then).
struct Trickle {
  size_t from = std::string::npos;
  size_t step = 1;
  std::chrono::milliseconds gap{0};
};

class RawServer {
 public:
  enum class Then {
    kKeepOpen = 1,
    kClose,               // close right after the response: an idle connection the server dropped
    kCloseOnNextRequest,  // read the next request, then close without an answer: the race where
                          // the server drops an idle connection just as the client reuses it
  };

  RawServer(std::string response, Then then, Trickle trickle = {})
      : response_(std::move(response)),
        then_(then),
        trickle_(trickle),
        server_([this](Poco::Net::StreamSocket& socket) { serve(socket); }) {}

  std::string url(std::string_view path) const {
    return "http://127.0.0.1:" + std::to_string(server_.port()) + std::string(path);
  }
  uint16_t port() const { return server_.port(); }
  int requests() const { return requests_.load(); }

 private:
  void serve(Poco::Net::StreamSocket& socket) {
    std::string buffer;
    int answered = 0;
    try {
      while (read_request(socket, buffer)) {
        ++requests_;
        if (then_ == Then::kCloseOnNextRequest && answered == 1) break;
        const size_t from = std::min(trickle_.from, response_.size());
        socket.sendBytes(response_.data(), static_cast<int>(from));
        for (size_t at = from; at < response_.size() && !server_.stopping(); at += trickle_.step) {
          std::this_thread::sleep_for(trickle_.gap);
          const size_t n = std::min(trickle_.step, response_.size() - at);
          socket.sendBytes(response_.data() + at, static_cast<int>(n));
        }
        ++answered;
        if (then_ == Then::kClose) break;
      }
      socket.shutdown();
    } catch (const Poco::Exception&) {
      // The client went away: nothing to do.
    }
    socket.close();
  }

  // Reads one request (header and Content-Length body) into nothing; false at EOF or on stop.
  bool read_request(Poco::Net::StreamSocket& socket, std::string& buffer) {
    for (;;) {
      const size_t header_end = buffer.find("\r\n\r\n");
      if (header_end != std::string::npos) {
        size_t body_length = 0;
        const std::string header = to_lower(buffer.substr(0, header_end));
        if (const size_t at = header.find("\ncontent-length:"); at != std::string::npos) {
          body_length = std::stoul(header.substr(at + 16));
        }
        if (buffer.size() >= header_end + 4 + body_length) {
          buffer.erase(0, header_end + 4 + body_length);
          return true;
        }
      }
      if (server_.stopping()) return false;
      if (!socket.poll(testing::TcpServer::poll_interval(), Poco::Net::Socket::SELECT_READ)) {
        continue;
      }
      char chunk[4096];
      const int n = socket.receiveBytes(chunk, sizeof chunk);
      if (n <= 0) return false;
      buffer.append(chunk, static_cast<size_t>(n));
    }
  }

  const std::string response_;
  const Then then_;
  const Trickle trickle_;
  std::atomic<int> requests_{0};
  testing::TcpServer server_;  // last: stops before the members its connections use
};

const std::string kOkResponse = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

Request get(std::string url) {
  Request r;
  r.url = std::move(url);
  r.timeout = 10s;
  return r;
}

// ---------------------------------------------------------------------------------------------
// Exchanges

TEST(PocoTransportTest, GetRoundTripsHeadersAndReportsLowerCaseNames) {
  RoutingServer server;
  PocoTransport transport;
  Request request = get(server.url("/echo?x=1&y=%2F"));
  request.headers = {{"X-Test", "hello"}};
  const Response response = transport.perform(request);

  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.url, request.url);
  EXPECT_EQ(response.header("x-echo-method"), "GET");
  EXPECT_EQ(response.header("x-echo-uri"), "/echo?x=1&y=%2F");
  EXPECT_EQ(response.header("x-echo-test"), "hello");
  EXPECT_EQ(response.header("x-echo-user-agent"), "backhaul");
  EXPECT_EQ(response.header("x-echo-host"), request.url.substr(7, request.url.find('/', 7) - 7));
  EXPECT_EQ(response.header("x-echo-content-length"), "<none>");
  EXPECT_EQ(response.body, "");
  for (const auto& [name, value] : response.headers) EXPECT_EQ(name, to_lower(name));
}

TEST(PocoTransportTest, PostSendsBodyWithContentLengthAndKeepsCustomUserAgent) {
  RoutingServer server;
  PocoTransport transport;
  Request request = get(server.url("/echo"));
  request.method = "POST";
  request.headers = {{"Content-Type", "application/json"}, {"user-agent", "mine/1"}};
  request.body = R"({"hello":"world"})";
  const Response response = transport.perform(request);

  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, R"({"hello":"world"})");
  EXPECT_EQ(response.header("x-echo-method"), "POST");
  EXPECT_EQ(response.header("x-echo-content-length"), "17");
  EXPECT_EQ(response.header("x-echo-user-agent"), "mine/1");
}

TEST(PocoTransportTest, PostWithoutBodySendsContentLengthZero) {
  RoutingServer server;
  PocoTransport transport;
  Request request = get(server.url("/echo"));
  request.method = "POST";
  const Response response = transport.perform(request);
  EXPECT_EQ(response.header("x-echo-content-length"), "0");
  EXPECT_EQ(response.body, "");
}

TEST(PocoTransportTest, KeepsRepeatedHeaders) {
  RoutingServer server;
  PocoTransport transport;
  const Response response = transport.perform(get(server.url("/repeat")));
  std::vector<std::string> cookies;
  for (const auto& [name, value] : response.headers) {
    if (name == "set-cookie") cookies.push_back(value);
  }
  EXPECT_EQ(cookies, (std::vector<std::string>{"a=1", "b=2"}));
  EXPECT_EQ(response.header("X-MIXED-CASE"), "v");
}

TEST(PocoTransportTest, KeepsHeadersInArrivalOrder) {
  RawServer server(
      "HTTP/1.1 200 OK\r\nX-A: 1\r\nX-B:  2 \r\nLink: <a>\r\nX-A: 3\r\n  folded\r\n"
      "Content-Length: 0\r\n\r\n",
      RawServer::Then::kKeepOpen);
  PocoTransport transport;
  const Response response = transport.perform(get(server.url("/")));
  const Headers expected = {
      {"x-a", "1"}, {"x-b", "2"}, {"link", "<a>"}, {"x-a", "3 folded"}, {"content-length", "0"}};
  EXPECT_EQ(response.headers, expected);
}

TEST(PocoTransportTest, SkipsInterimResponses) {
  RawServer server(
      "HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n"
      "HTTP/1.1 200 OK\r\nX-Final: 1\r\nContent-Length: 2\r\n\r\nok",
      RawServer::Then::kKeepOpen);
  PocoTransport transport;
  const Response response = transport.perform(get(server.url("/")));
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "ok");
  const Headers expected = {{"x-final", "1"}, {"content-length", "2"}};
  EXPECT_EQ(response.headers, expected);
}

// A header over 1 MiB fails the request, counting the interim responses before it: each of 1100
// 103 Early Hints of 1 KiB was under the limit, and an endless run of them was read to the
// deadline.
TEST(PocoTransportTest, RefusesAResponseHeaderOver1MiBInterimResponsesIncluded) {
  std::string lines;
  for (int i = 0; i < 2048; ++i) lines += "X-Pad: " + std::string(1015, 'p') + "\r\n";
  std::string interim;
  for (int i = 0; i < 1100; ++i) {
    interim += "HTTP/1.1 103 Early Hints\r\nLink: <" + std::string(990, 'l') + ">\r\n\r\n";
  }
  const std::string ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  const std::vector<std::pair<const char*, std::string>> cases = {
      {"2 MiB of fields", "HTTP/1.1 200 OK\r\n" + lines + "Content-Length: 2\r\n\r\nok"},
      {"1.1 MiB of interim responses", interim + ok},
  };
  for (const auto& [what, answer] : cases) {
    SCOPED_TRACE(what);
    RawServer server(answer, RawServer::Then::kClose);
    PocoTransport transport;
    try {
      transport.perform(get(server.url("/x")));
      ADD_FAILURE() << "the response was taken";
    } catch (const std::exception& e) {
      EXPECT_TRUE(contains(e.what(), "response header larger than 1 MiB")) << e.what();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Connection reuse

TEST(PocoTransportTest, ReusesOneConnectionForSequentialRequests) {
  RoutingServer server;
  PocoTransport transport;
  for (int i = 0; i < 10; ++i) {
    Request request = get(server.url("/echo"));
    request.method = i % 2 ? "POST" : "GET";
    request.body = std::to_string(i);
    const Response response = transport.perform(request);
    ASSERT_EQ(response.status, 200);
    ASSERT_EQ(response.body, std::to_string(i));
  }
  EXPECT_EQ(transport.connections_opened(), 1u);
  EXPECT_EQ(server.total_connections(), 1);
}

// A process a plugin starts must not inherit the transport's connections: holding one, it would
// keep it open after the transport closed it.
TEST(PocoTransportTest, ItsConnectionsAreClosedOnExec) {
  RoutingServer server;
  PocoTransport transport;
  ASSERT_EQ(transport.perform(get(server.url("/echo"))).status, 200);
  const testing::Connections kept = testing::connections_to(server.port());
  EXPECT_EQ(kept.open, 1) << "the kept-alive connection";
  EXPECT_EQ(kept.inheritable, 0);
}

TEST(PocoTransportTest, ReusesConnectionsAfterNoContentAndHead) {
  RoutingServer server;
  PocoTransport transport;
  EXPECT_EQ(transport.perform(get(server.url("/nocontent"))).status, 204);
  Request head = get(server.url("/echo"));
  head.method = "HEAD";
  const Response head_response = transport.perform(head);
  EXPECT_EQ(head_response.status, 200);
  EXPECT_EQ(head_response.body, "");
  EXPECT_EQ(transport.perform(get(server.url("/echo"))).status, 200);
  EXPECT_EQ(transport.connections_opened(), 1u);
}

TEST(PocoTransportTest, OpensANewConnectionWhenTheServerSaysClose) {
  RoutingServer server;
  PocoTransport transport;
  for (int i = 0; i < 4; ++i) {
    const Response response = transport.perform(get(server.url("/close")));
    ASSERT_EQ(response.body, "bye");
    EXPECT_TRUE(contains(response.header("connection").value_or(""), "close"));
  }
  EXPECT_EQ(transport.connections_opened(), 4u);
}

TEST(PocoTransportTest, KeepsNoIdleConnectionsWhenPoolingIsOff) {
  RoutingServer server;
  PocoTransportOptions options;
  options.max_idle_per_origin = 0;
  PocoTransport transport(options);
  for (int i = 0; i < 3; ++i) transport.perform(get(server.url("/echo")));
  EXPECT_EQ(transport.connections_opened(), 3u);
}

TEST(PocoTransportTest, ReconnectsTransparentlyWhenTheServerClosedAnIdleConnection) {
  RawServer server(kOkResponse, RawServer::Then::kClose);
  PocoTransport transport;
  for (int i = 0; i < 3; ++i) {
    const Response response = transport.perform(get(server.url("/")));
    EXPECT_EQ(response.body, "ok");
  }
  EXPECT_EQ(transport.connections_opened(), 3u);
}

TEST(PocoTransportTest, RetriesAnIdempotentRequestOnceWhenAReusedConnectionDies) {
  RawServer server(kOkResponse, RawServer::Then::kCloseOnNextRequest);
  PocoTransport transport;
  EXPECT_EQ(transport.perform(get(server.url("/first"))).body, "ok");
  EXPECT_EQ(transport.perform(get(server.url("/second"))).body, "ok");
  EXPECT_EQ(transport.connections_opened(), 2u);
  EXPECT_EQ(server.requests(), 3);  // /first, /second swallowed, /second again
}

TEST(PocoTransportTest, DoesNotRetryAPostTheServerMayHaveReceived) {
  RawServer server(kOkResponse, RawServer::Then::kCloseOnNextRequest);
  PocoTransport transport;
  EXPECT_EQ(transport.perform(get(server.url("/first"))).body, "ok");
  Request post = get(server.url("/create"));
  post.method = "POST";
  post.body = "x";
  const std::string error = transport_error(transport, post);
  EXPECT_TRUE(contains(error, "POST " + server.url("/create") + ": ")) << error;
  EXPECT_EQ(server.requests(), 2);
}

TEST(PocoTransportTest, ServesConcurrentRequests) {
  RoutingServer server;
  PocoTransport transport;
  constexpr int kThreads = 8;
  constexpr int kRequestsPerThread = 25;
  std::atomic<int> succeeded{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRequestsPerThread; ++i) {
        Request request = get(server.url("/echo"));
        request.method = "POST";
        request.body = std::to_string(t) + ":" + std::to_string(i);
        try {
          const Response response = transport.perform(request);
          if (response.status == 200 && response.body == request.body) ++succeeded;
        } catch (const std::exception&) {
          // counted as a failure below
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(succeeded.load(), kThreads * kRequestsPerThread);
  EXPECT_GE(transport.connections_opened(), 1u);
  EXPECT_LE(transport.connections_opened(), static_cast<size_t>(kThreads));
}

// ---------------------------------------------------------------------------------------------
// Failures

TEST(PocoTransportTest, TimesOutWhenTheServerDoesNotAnswer) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  TestServer server([released](HTTPServerRequest&, HTTPServerResponse& response) {
    released.wait();
    reply(response, "late");
  });
  // Releases the handler on every path out of the test, before the server stops.
  const std::unique_ptr<std::promise<void>, void (*)(std::promise<void>*)> releaser(
      &release, [](std::promise<void>* p) { p->set_value(); });

  PocoTransport transport;
  Request request = get(server.url("/slow"));
  request.timeout = 200ms;
  const auto start = std::chrono::steady_clock::now();
  const std::string error = transport_error(transport, request);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(contains(error, "timeout")) << error;
  EXPECT_TRUE(contains(error, "GET " + request.url + ": ")) << error;
  EXPECT_GE(elapsed, 150ms);
  EXPECT_LT(elapsed, 5s);
}

// The timeout covers the whole exchange: a server that sends a little now and then, each time
// within the socket's timeout, still ends at the request's deadline. Before, a body read of 16 KiB
// gave each of its receives the whole timeout (40 bytes 50 ms apart took 2 s and came back as a
// 200), and the header's receives all had the timeout set before it (ten header lines 100 ms
// apart took 1 s). Poco reads a header line, and a chunk's size line with its extensions, in loops
// of its own, each receive given the time left when it was set: one such line trickling in a byte
// at a time went on for as long as the server sent (a chunk extension's bytes are also dropped
// unread, so no size limit ended it), and a chunked body cut there read as complete. Past the
// deadline the socket is now shut down under Poco.
TEST(PocoTransportTest, AResponseTricklingInEndsAtTheRequestsDeadline) {
  const std::string status = "HTTP/1.1 200 OK\r\n";
  const std::string head = status + "Content-Length: 40\r\n\r\n";
  std::string lines;
  for (int i = 0; i < 10; ++i) lines += "X-Pad: " + std::to_string(i) + "\r\n";  // 10 bytes each
  const std::string body(40, 'x');
  const std::string chunked = status + "Transfer-Encoding: chunked\r\n\r\n";
  const std::vector<std::tuple<const char*, std::string, Trickle>> cases = {
      {"the body trickles", head + body, {head.size(), 1, 50ms}},
      {"the header trickles",
       status + lines + "Content-Length: 40\r\n\r\n" + body,
       {status.size(), 10, 100ms}},
      {"one header line trickles",
       status + "X-Long: " + std::string(40, 'a') + "\r\nContent-Length: 2\r\n\r\nok",
       {status.size(), 1, 50ms}},
      {"a chunk's extension trickles",
       chunked + "2;" + std::string(40, 'e') + "\r\nok\r\n0\r\n\r\n",
       {chunked.size() + 2, 1, 50ms}},
  };
  for (const auto& [what, response, trickle] : cases) {
    SCOPED_TRACE(what);
    RawServer server(response, RawServer::Then::kClose, trickle);
    PocoTransport transport;
    Request request = get(server.url("/x"));
    request.timeout = 300ms;
    const auto start = std::chrono::steady_clock::now();
    const std::string error = transport_error(transport, request);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_TRUE(contains(error, "timeout")) << error;
    EXPECT_LT(elapsed, 900ms);
  }
}

// ---------------------------------------------------------------------------------------------
// Pipelined batches

// A port nothing listens on (it was free a moment ago).
uint16_t closed_port() {
  Poco::Net::ServerSocket socket(Poco::Net::SocketAddress("127.0.0.1", 0));
  return socket.address().port();
}

Request post(std::string url, std::string body) {
  Request r = get(std::move(url));
  r.method = "POST";
  r.body = std::move(body);
  r.headers.emplace_back("Content-Type", "application/json");
  return r;
}

TEST(PocoTransportBatchTest, PipelinesABatchOnOneConnectionAndAnswersInOrder) {
  RoutingServer server;
  PocoTransport transport;
  std::vector<Request> batch;
  for (int i = 0; i < 50; ++i)
    batch.push_back(post(server.url("/echo"), "body-" + std::to_string(i)));
  batch.push_back(get(server.url("/chunked?250")));
  batch.push_back(get(server.url("/nocontent")));
  Request head = get(server.url("/bytes?7"));
  head.method = "HEAD";
  batch.push_back(head);
  batch.push_back(get(server.url("/bytes?3")));
  const std::vector<BatchResult> results = transport.perform_batch(batch);
  ASSERT_EQ(results.size(), batch.size());
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(results[i].response) << i << ": " << results[i].error;
    EXPECT_EQ(results[i].response->status, 200);
    EXPECT_EQ(results[i].response->body, "body-" + std::to_string(i));
    EXPECT_EQ(results[i].response->header("x-echo-method"), "POST");
    EXPECT_EQ(results[i].response->header("x-echo-content-length"),
              std::to_string(5 + std::to_string(i).size()));
    EXPECT_EQ(results[i].response->header("x-echo-user-agent"), "backhaul");
  }
  EXPECT_EQ(results[50].response->body, std::string(250, 'c')) << "chunked";
  EXPECT_EQ(results[51].response->status, 204);
  EXPECT_EQ(results[52].response->body, "") << "HEAD has no body";
  EXPECT_EQ(results[53].response->body, "bbb");
  EXPECT_EQ(transport.connections_opened(), 1u);
  EXPECT_EQ(server.total_connections(), 1);
  // The connection is kept for the next batch.
  EXPECT_EQ(transport.perform_batch({get(server.url("/bytes?2"))})[0].response->body, "bb");
  EXPECT_EQ(transport.connections_opened(), 1u);
}

// A server that answers one request per connection and closes: the unanswered rest goes out
// again on new connections until every request has its answer.
TEST(PocoTransportBatchTest, SendsTheUnansweredRestAgainOnANewConnection) {
  RawServer server(kOkResponse, RawServer::Then::kClose);
  PocoTransport transport;
  std::vector<Request> batch(5, get(server.url("/x")));
  const std::vector<BatchResult> results = transport.perform_batch(batch);
  for (const BatchResult& r : results) {
    ASSERT_TRUE(r.response) << r.error;
    EXPECT_EQ(r.response->body, "ok");
  }
  EXPECT_EQ(transport.connections_opened(), 5u);
}

TEST(PocoTransportBatchTest, ReportsAnErrorPerRequestWhenNothingAnswers) {
  const uint16_t port = closed_port();
  PocoTransport transport;
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/x";
  const std::vector<BatchResult> results = transport.perform_batch({get(url), post(url, "{}")});
  ASSERT_EQ(results.size(), 2u);
  EXPECT_FALSE(results[0].response);
  EXPECT_EQ(results[0].error, "GET " + url + ": connection refused");
  EXPECT_EQ(results[1].error, "POST " + url + ": connection refused");
}

// A length or chunk size that does not parse, or that does not fit, fails its own request, as
// any malformed response does. std::stoull's exceptions escaped perform_batch before, failing
// the gateway's whole page; a chunk size near 2^64 wrapped the body-size check around.
TEST(PocoTransportBatchTest, AMalformedLengthOrChunkSizeFailsItsRequest) {
  const std::string chunked = "HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"HTTP/1.1 202 Accepted\r\nContent-Length: x\r\n\r\n", "malformed Content-Length"},
      {"HTTP/1.1 202 Accepted\r\nContent-Length: -1\r\n\r\n", "malformed Content-Length"},
      {"HTTP/1.1 202 Accepted\r\nContent-Length: 99999999999999999999999\r\n\r\n",
       "malformed Content-Length"},
      {chunked + "zz\r\n", "malformed chunk size"},
      {chunked + "\r\n", "malformed chunk size"},
      {chunked + "3\r\nabcXY0\r\n\r\n", "malformed chunk: no CRLF after its data"},
      {chunked + "1\r\na\r\nffffffffffffffff\r\nb\r\n0\r\n\r\n", "larger than max_response_bytes"},
  };
  for (const auto& [answer, error] : cases) {
    SCOPED_TRACE(answer);
    RawServer server(answer, RawServer::Then::kClose);
    PocoTransport transport;
    std::vector<BatchResult> results;
    ASSERT_NO_THROW(results = transport.perform_batch({post(server.url("/x"), "{}")}));
    ASSERT_EQ(results.size(), 1u);
    EXPECT_FALSE(results[0].response);
    EXPECT_NE(results[0].error.find(error), std::string::npos) << results[0].error;
  }
  // Chunk extensions and padding still parse.
  RawServer server(chunked + "3;name=value \r\nabc\r\n0\r\n\r\n", RawServer::Then::kClose);
  PocoTransport transport;
  const std::vector<BatchResult> results = transport.perform_batch({get(server.url("/x"))});
  ASSERT_TRUE(results[0].response) << results[0].error;
  EXPECT_EQ(results[0].response->body, "abc");
}

// A response header over 1 MiB (its status line and fields with those of any interim responses
// before it), or trailers over 1 MiB, fail their request as perform() fails such a header. The
// pipelined reader had no limit: a server sending header lines without end grew the process by
// gigabytes.
TEST(PocoTransportBatchTest, AHeaderOrTrailersOver1MiBFailItsRequest) {
  std::string lines;
  for (int i = 0; i < 2048; ++i) lines += "X-Pad: " + std::string(1015, 'p') + "\r\n";  // 1 KiB
  std::string interim;
  for (int i = 0; i < 1100; ++i) {
    interim += "HTTP/1.1 103 Early Hints\r\nLink: <" + std::string(990, 'l') + ">\r\n\r\n";
  }
  const std::vector<std::tuple<const char*, std::string, std::string>> cases = {
      {"2 MiB of fields", "HTTP/1.1 200 OK\r\n" + lines + "Content-Length: 2\r\n\r\nok",
       "response header larger than 1 MiB"},
      {"1.1 MiB of interim responses", interim + kOkResponse, "response header larger than 1 MiB"},
      {"2 MiB of trailers",
       "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n" + lines + "\r\n",
       "response trailers larger than 1 MiB"},
  };
  for (const auto& [what, answer, error] : cases) {
    SCOPED_TRACE(what);
    RawServer server(answer, RawServer::Then::kClose);
    PocoTransport transport;
    const std::vector<BatchResult> results = transport.perform_batch({get(server.url("/x"))});
    ASSERT_EQ(results.size(), 1u);
    EXPECT_FALSE(results[0].response);
    EXPECT_TRUE(contains(results[0].error, "GET " + server.url("/x") + ": ")) << results[0].error;
    EXPECT_TRUE(contains(results[0].error, error)) << results[0].error;
  }
}

// A request whose answer arrived but was refused (too large, malformed) fails with that answer's
// error, named once; the rest of the batch goes on a new connection. Before, the refused request
// was sent again with the rest, and its error named the request twice.
TEST(PocoTransportBatchTest, ARequestWithARefusedAnswerIsNotSentAgain) {
  std::atomic<int> big_requests{0};
  TestServer server([&big_requests](HTTPServerRequest& request, HTTPServerResponse& response) {
    std::string unread;
    Poco::StreamCopier::copyToString(request.stream(), unread);
    if (request.getURI() == "/big") {
      ++big_requests;
      reply(response, std::string(200, 'b'));
    } else {
      reply(response, "ok");
    }
  });
  PocoTransportOptions options;
  options.max_response_bytes = 100;
  PocoTransport transport(options);
  const std::string big = server.url("/big");
  const std::vector<BatchResult> results =
      transport.perform_batch({get(server.url("/small")), get(big), get(server.url("/small"))});
  ASSERT_EQ(results.size(), 3u);
  ASSERT_TRUE(results[0].response) << results[0].error;
  EXPECT_EQ(results[0].response->body, "ok");
  EXPECT_FALSE(results[1].response);
  EXPECT_EQ(results[1].error,
            "GET " + big + ": response body larger than max_response_bytes (100 bytes)");
  ASSERT_TRUE(results[2].response) << results[2].error;
  EXPECT_EQ(results[2].response->body, "ok");
  EXPECT_EQ(big_requests.load(), 1);
}

// A request that cannot be sent (a bad URL, a header value with a line break) fails alone, as the
// one-by-one default fails it; the rest of the batch still goes, pipelined. Its RequestError left
// perform_batch before, failing the whole batch.
TEST(PocoTransportBatchTest, ARequestThatCannotBeSentFailsAlone) {
  RoutingServer server;
  PocoTransport transport;
  Request bad_header = post(server.url("/echo"), "bad");
  bad_header.headers.emplace_back("X-Evil", "a\r\nHost: other");
  const std::vector<Request> batch = {get("http://127.0.0.1:1/a b"),
                                      post(server.url("/echo"), "first"), bad_header,
                                      post(server.url("/echo"), "second")};
  std::vector<BatchResult> results;
  ASSERT_NO_THROW(results = transport.perform_batch(batch));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_FALSE(results[0].response);
  EXPECT_TRUE(contains(results[0].error, "invalid url")) << results[0].error;
  ASSERT_TRUE(results[1].response) << results[1].error;
  EXPECT_EQ(results[1].response->body, "first");
  EXPECT_FALSE(results[2].response);
  EXPECT_TRUE(contains(results[2].error, "invalid value for header X-Evil")) << results[2].error;
  ASSERT_TRUE(results[3].response) << results[3].error;
  EXPECT_EQ(results[3].response->body, "second");
  EXPECT_EQ(transport.connections_opened(), 1u);
}

// The pipelined connections are not passed on to a process a plugin starts either.
TEST(PocoTransportBatchTest, ItsConnectionsAreClosedOnExec) {
  RoutingServer server;
  PocoTransport transport;
  const std::vector<BatchResult> results = transport.perform_batch({get(server.url("/echo"))});
  ASSERT_TRUE(results[0].response) << results[0].error;
  const testing::Connections kept = testing::connections_to(server.port());
  EXPECT_EQ(kept.open, 1) << "the kept-alive connection";
  EXPECT_EQ(kept.inheritable, 0);
}

TEST(PocoTransportBatchTest, RequestsToSeveralOriginsGoOneByOne) {
  RoutingServer a;
  RoutingServer b;
  PocoTransport transport;
  const std::vector<BatchResult> results =
      transport.perform_batch({get(a.url("/bytes?1")), get(b.url("/bytes?2"))});
  EXPECT_EQ(results[0].response->body, "b");
  EXPECT_EQ(results[1].response->body, "bb");
}

TEST(PocoTransportTest, ReportsConnectionRefused) {
  const uint16_t port = closed_port();
  PocoTransport transport;
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/x";
  const std::string error = transport_error(transport, get(url));
  EXPECT_EQ(error, "GET " + url + ": connection refused");
  EXPECT_EQ(transport.connections_opened(), 0u);
}

TEST(PocoTransportTest, KeepsQuerySecretsOutOfErrorMessages) {
  uint16_t port = 0;
  {
    Poco::Net::ServerSocket socket(Poco::Net::SocketAddress("127.0.0.1", 0));
    port = socket.address().port();
  }
  PocoTransport transport;
  const std::string url =
      "http://127.0.0.1:" + std::to_string(port) + "/x?page=2&access_token=s3cr3t";
  const std::string error = transport_error(transport, get(url));
  EXPECT_EQ(error.find("s3cr3t"), std::string::npos) << error;
  EXPECT_TRUE(contains(error, "/x?page=2&access_token=[REDACTED]")) << error;
}

TEST(PocoTransportTest, RejectsBodiesLargerThanMaxResponseBytes) {
  RoutingServer server;
  PocoTransportOptions options;
  options.max_response_bytes = 100;
  PocoTransport transport(options);

  EXPECT_EQ(transport.perform(get(server.url("/bytes?100"))).body.size(), 100u);
  EXPECT_EQ(transport.perform(get(server.url("/chunked?100"))).body.size(), 100u);
  for (const char* path : {"/bytes?101", "/chunked?1000"}) {
    const std::string error = transport_error(transport, get(server.url(path)));
    EXPECT_TRUE(contains(error, "max_response_bytes (100 bytes)")) << error;
  }
  // The transport still works afterwards.
  EXPECT_EQ(transport.perform(get(server.url("/echo"))).status, 200);
}

TEST(PocoTransportTest, ReportsABodyCutShort) {
  RawServer server("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", RawServer::Then::kClose);
  PocoTransport transport;
  const std::string error = transport_error(transport, get(server.url("/")));
  EXPECT_TRUE(contains(error, "3 of 10 body bytes")) << error;
}

// A chunked body that the end of the connection cuts short, inside a chunk or before the last
// (empty) chunk, fails as a fixed-length one does. It came back as a complete 200.
TEST(PocoTransportTest, ReportsAChunkedBodyCutShort) {
  const std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (const std::string& answer :
       {head + "a\r\nabc", head + "3\r\nabc\r\n", head + "3\r\nabc\r\n1"}) {
    SCOPED_TRACE(answer);
    RawServer server(answer, RawServer::Then::kClose);
    PocoTransport transport;
    const std::string error = transport_error(transport, get(server.url("/")));
    EXPECT_TRUE(contains(error, "GET " + server.url("/") + ": connection closed in a chunk"))
        << error;
  }
  // A whole one, trailers and all, leaves the connection to the next request.
  RawServer server(head + "3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n", RawServer::Then::kKeepOpen);
  PocoTransport transport;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(transport.perform(get(server.url("/"))).body, "abc");
  EXPECT_EQ(transport.connections_opened(), 1u);
}

// The CRLF after a chunk's data is checked: "3\r\nabcXY0\r\n\r\n" came back as a complete 200
// with the body "abc", the two bytes in the CRLF's place skipped unread.
TEST(PocoTransportTest, AChunkWithoutItsCrlfIsMalformed) {
  RawServer server("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n",
                   RawServer::Then::kClose);
  PocoTransport transport;
  const std::string error = transport_error(transport, get(server.url("/")));
  EXPECT_TRUE(
      contains(error, "GET " + server.url("/") + ": malformed chunk: no CRLF after its data"))
      << error;
}

// A chunk larger than one receive is read whole, across many, and the connection is left at the
// next response.
TEST(PocoTransportTest, ReadsAChunkLargerThanOneReceive) {
  const std::string data(1024 * 1024 + 3, 'd');
  std::stringstream size;
  size << std::hex << data.size();
  RawServer server("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size.str() + "\r\n" +
                       data + "\r\n1\r\n!\r\n0\r\n\r\n",
                   RawServer::Then::kKeepOpen);
  PocoTransport transport;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(transport.perform(get(server.url("/"))).body, data + "!");
  EXPECT_EQ(transport.connections_opened(), 1u);
}

// A negative Content-Length is a malformed response, not a body too large.
TEST(PocoTransportTest, ANegativeContentLengthIsAMalformedResponse) {
  for (const char* length : {"-1", "-5"}) {
    SCOPED_TRACE(length);
    RawServer server("HTTP/1.1 200 OK\r\nContent-Length: " + std::string(length) + "\r\n\r\nabc",
                     RawServer::Then::kClose);
    PocoTransport transport;
    const std::string error = transport_error(transport, get(server.url("/")));
    EXPECT_TRUE(contains(error, "malformed response")) << error;
    EXPECT_FALSE(contains(error, "max_response_bytes")) << error;
  }
}

// With both Transfer-Encoding: chunked and a Content-Length, the chunks frame the body (RFC 9112
// 6.3): the length is not held against it ("connection closed after 2 of 100 body bytes").
TEST(PocoTransportTest, AChunkedBodyWithAContentLengthToo) {
  RawServer server(
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 100\r\n\r\n"
      "2\r\nok\r\n0\r\n\r\n",
      RawServer::Then::kKeepOpen);
  PocoTransport transport;
  const Response response = transport.perform(get(server.url("/")));
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "ok");
}

// A connection that switched protocols (101) is never put back for another request.
TEST(PocoTransportTest, AConnectionThatSwitchedProtocolsIsNotReused) {
  RawServer server("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n",
                   RawServer::Then::kKeepOpen);
  PocoTransport transport;
  for (int i = 0; i < 2; ++i) EXPECT_EQ(transport.perform(get(server.url("/"))).status, 101);
  EXPECT_EQ(transport.connections_opened(), 2u);
}

// A header value longer than Poco's 8 KiB per field is kept, not a malformed response.
TEST(PocoTransportTest, KeepsAHeaderValueLongerThan8KiB) {
  const std::string policy(9000, 'p');
  RawServer server(
      "HTTP/1.1 200 OK\r\nContent-Security-Policy: " + policy + "\r\nContent-Length: 2\r\n\r\nok",
      RawServer::Then::kKeepOpen);
  PocoTransport transport;
  const Response response = transport.perform(get(server.url("/")));
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "ok");
  EXPECT_EQ(response.header("content-security-policy"), policy);
}

TEST(PocoTransportTest, ReportsAMalformedResponse) {
  RawServer server("SPDY/9 nonsense\r\n\r\n", RawServer::Then::kClose);
  PocoTransport transport;
  const std::string error = transport_error(transport, get(server.url("/")));
  EXPECT_TRUE(contains(error, "malformed response")) << error;
}

TEST(PocoTransportTest, RejectsMalformedRequestsBeforeAnyIo) {
  PocoTransport transport;
  for (const char* url :
       {"", "not a url", "api.github.com/x", "ftp://h/x", "http://", "http:///x", "http://h:0/",
        "http://h:65536/", "http://h:8x/", "http://h/a b", "http://[::1/"}) {
    EXPECT_THROW(transport.perform(get(url)), RequestError) << url;
  }
  Request injected = get("http://127.0.0.1:1/");
  injected.headers = {{"X-Evil", "a\r\nHost: other"}};
  EXPECT_THROW(transport.perform(injected), RequestError);
  Request bad_name = get("http://127.0.0.1:1/");
  bad_name.headers = {{"Bad Name", "v"}};
  EXPECT_THROW(transport.perform(bad_name), RequestError);
  Request bad_method = get("http://127.0.0.1:1/");
  bad_method.method = "GET /evil";
  EXPECT_THROW(transport.perform(bad_method), RequestError);
  EXPECT_EQ(transport.connections_opened(), 0u);
}

TEST(PocoTransportTest, UnsupportedSchemeMessageNamesTheScheme) {
  PocoTransport transport;
  try {
    transport.perform(get("ftp://h/x?token=abc"));
    FAIL() << "expected RequestError";
  } catch (const RequestError& e) {
    EXPECT_TRUE(contains(e.what(), "ftp")) << e.what();
    EXPECT_FALSE(contains(e.what(), "abc")) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------
// Redirects through send()

TEST(PocoTransportRedirectTest, Follows301ToA200) {
  RoutingServer server;
  PocoTransport transport;
  const Response response = send(transport, get(server.url("/r301")));
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.url, server.url("/echo"));
}

TEST(PocoTransportRedirectTest, FollowsRelativeLocation) {
  RoutingServer server;
  PocoTransport transport;
  const Response response = send(transport, get(server.url("/dir/rel")));
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "dir-target");
  EXPECT_EQ(response.url, server.url("/dir/target"));
}

TEST(PocoTransportRedirectTest, Redirect307KeepsMethodAndBody) {
  RoutingServer server;
  PocoTransport transport;
  Request request = get(server.url("/r307"));
  request.method = "POST";
  request.body = "payload";
  const Response response = send(transport, request);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.header("x-echo-method"), "POST");
  EXPECT_EQ(response.body, "payload");
}

TEST(PocoTransportRedirectTest, Redirect303ContinuesAsGet) {
  RoutingServer server;
  PocoTransport transport;
  Request request = get(server.url("/r303"));
  request.method = "POST";
  request.body = "payload";
  const Response response = send(transport, request);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.header("x-echo-method"), "GET");
  EXPECT_EQ(response.header("x-echo-content-length"), "<none>");
  EXPECT_EQ(response.body, "");
}

TEST(PocoTransportRedirectTest, ReturnsTheRedirectAfterTooManyHops) {
  RoutingServer server;
  PocoTransport transport;
  const Response response = send(transport, get(server.url("/loop/0")), 5);
  EXPECT_EQ(response.status, 302);
  EXPECT_EQ(response.header("location"), "/loop/6");
  EXPECT_EQ(server.loop_hits(), 6);
}

TEST(PocoTransportRedirectTest, DropsAuthorizationForAnotherHost) {
  RoutingServer server;
  PocoTransport transport;
  Request request = get(server.url("/cross"));
  request.headers = {{"Authorization", "Bearer s3cr3t"}};
  const Response response = send(transport, request);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.url, server.url("/echo", "localhost"));
  EXPECT_EQ(response.header("x-echo-authorization"), "<none>");
}

TEST(PocoTransportRedirectTest, KeepsAuthorizationOnTheSameHost) {
  RoutingServer server;
  PocoTransport transport;
  Request request = get(server.url("/same"));
  request.headers = {{"Authorization", "Bearer s3cr3t"}};
  const Response response = send(transport, request);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.header("x-echo-authorization"), "Bearer s3cr3t");
}

// ---------------------------------------------------------------------------------------------
// Proxy

// The text of the std::invalid_argument that `parse` throws, or "" with a test failure.
std::string refusal(const std::function<void()>& parse) {
  try {
    parse();
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return {};
}

TEST(ProxyUrlTest, ParsesHostPortAndDecodedCredentials) {
  ProxyOptions p = parse_proxy_url("http://proxy.corp:3128");
  EXPECT_EQ(p.host, "proxy.corp");
  EXPECT_EQ(p.port, 3128);
  EXPECT_EQ(p.username, "");
  p = parse_proxy_url("HTTP://me%40corp:p%3Ass@[::1]:8080/");
  EXPECT_EQ(p.host, "::1");
  EXPECT_EQ(p.port, 8080);
  EXPECT_EQ(p.username, "me@corp");
  EXPECT_EQ(p.password, "p:ss");
}

TEST(ProxyUrlTest, RefusesWhatItCannotUseNamingWhyButNotThePassword) {
  const std::pair<const char*, const char*> cases[] = {
      {"https://proxy:3128", "a proxy reached over TLS is not supported"},
      {"socks5://proxy:1080", "must be http://"},
      {"proxy:3128", "not an http:// url"},
      {"http://u:secret@proxy", "has no port"},
      {"http://[::1]", "has no port"},
      {"http://proxy:3128/path", "has a path"},
      {"http://proxy:99999", "invalid port"},
      {"http://:secret@proxy:3128", "without a user name"},
      {"http://proxy:", "has no port"},
      {"http://proxy:3128/?x=@evil:80", "has a path"},
      {"http://u:secret%zz@proxy:3128", "the credentials are not valid percent-encoding"},
  };
  for (const auto& [url, why] : cases) {
    const std::string error = refusal([url = url] { parse_proxy_url(url); });
    EXPECT_TRUE(contains(error, why)) << url << ": " << error;
    EXPECT_FALSE(contains(error, "secret")) << url << ": " << error;
  }
}

TEST(ProxyUrlTest, NoProxyNamesAHostItsSubdomainsOrAnAddress) {
  ProxyOptions p;
  EXPECT_FALSE(goes_through_proxy(p, "api.github.com")) << "no proxy configured";
  p.host = "proxy";
  p.port = 3128;
  p.no_proxy = {"Example.COM", ".internal", "10.0.0.1", "[::1]", "2.3"};
  EXPECT_TRUE(goes_through_proxy(p, "api.github.com"));
  EXPECT_FALSE(goes_through_proxy(p, "example.com"));
  EXPECT_FALSE(goes_through_proxy(p, "api.example.com"));
  EXPECT_TRUE(goes_through_proxy(p, "notexample.com"));
  EXPECT_FALSE(goes_through_proxy(p, "internal"));
  EXPECT_FALSE(goes_through_proxy(p, "db.internal"));
  EXPECT_FALSE(goes_through_proxy(p, "10.0.0.1"));
  EXPECT_TRUE(goes_through_proxy(p, "10.0.0.10"));
  EXPECT_TRUE(goes_through_proxy(p, "10.1.2.3")) << "an address is matched whole";
  EXPECT_FALSE(goes_through_proxy(p, "::1"));
  p.no_proxy = {"*"};
  EXPECT_FALSE(goes_through_proxy(p, "api.github.com"));
}

TEST(ProxyUrlTest, NoProxyEntriesAreNormalizedOrRefusedNamingTheEntry) {
  EXPECT_EQ(parse_no_proxy({" Example.COM ", "*.corp", "[::1]", "*", "10.0.0.1", "::1"}),
            (std::vector<std::string>{"example.com", ".corp", "::1", "*", "10.0.0.1", "::1"}));
  const std::pair<const char*, const char*> cases[] = {
      {"a.com,b.com", "no_proxy entry \"a.com,b.com\": one host per entry"},
      {"host:8080", "no_proxy entry \"host:8080\": give the host without a port"},
      {"a*.b", "only a leading \"*.\" or \"*\" alone is understood"},
      {"  ", "an empty no_proxy entry"},
  };
  for (const auto& [entry, why] : cases) {
    const std::string error = refusal([entry = entry] { parse_no_proxy({entry}); });
    EXPECT_TRUE(contains(error, why)) << entry << ": " << error;
  }
}

TEST(PocoTransportProxyTest, PlainHttpGoesToTheProxyInAbsoluteForm) {
  RoutingServer origin;
  testing::TestProxy proxy;
  PocoTransportOptions options;
  options.proxy = proxy.options();
  PocoTransport transport(options);
  Request request = get(origin.url("/echo?q=1"));
  request.method = "POST";
  request.body = "through the proxy";
  request.headers = {{"X-Test", "kept"}};
  const Response response = transport.perform(request);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(response.body, "through the proxy");
  EXPECT_EQ(response.header("x-echo-uri"), "/echo?q=1");
  EXPECT_EQ(response.header("x-echo-test"), "kept");
  const std::vector<testing::TestProxy::Seen> seen = proxy.seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].request_line, "POST " + origin.url("/echo?q=1") + " HTTP/1.1");
  EXPECT_EQ(seen[0].authorization, "<none>");
}

TEST(PocoTransportProxyTest, HostsInNoProxyAreReachedDirectly) {
  RoutingServer origin;
  testing::TestProxy proxy;
  PocoTransportOptions options;
  options.proxy = proxy.options();
  options.proxy.no_proxy = {"localhost"};
  PocoTransport transport(options);
  EXPECT_EQ(transport.perform(get(origin.url("/echo", "localhost"))).status, 200);
  EXPECT_EQ(proxy.seen().size(), 0u);
  EXPECT_EQ(transport.perform(get(origin.url("/echo", "127.0.0.1"))).status, 200);
  EXPECT_EQ(proxy.seen().size(), 1u);
}

// A batch for a proxied origin is not pipelined on a raw connection of its own to the origin:
// each request goes through the proxy.
TEST(PocoTransportProxyTest, ABatchGoesThroughTheProxyToo) {
  RoutingServer origin;
  testing::TestProxy proxy;
  PocoTransportOptions options;
  options.proxy = proxy.options();
  PocoTransport transport(options);
  std::vector<Request> batch;
  for (int i = 0; i < 3; ++i) {
    Request request = get(origin.url("/echo"));
    request.method = "POST";
    request.body = "event " + std::to_string(i);
    batch.push_back(request);
  }
  const std::vector<BatchResult> results = transport.perform_batch(batch);
  ASSERT_EQ(results.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].response) << results[i].error;
    EXPECT_EQ(results[i].response->body, "event " + std::to_string(i));
  }
  EXPECT_EQ(proxy.seen().size(), 3u);
}

TEST(PocoTransportProxyTest, SendsTheProxyCredentialsAndReportsAnUnreachableProxy) {
  RoutingServer origin;
  // "user:pa ss" in Basic
  testing::TestProxy proxy("Basic dXNlcjpwYSBzcw==");
  PocoTransportOptions options;
  options.proxy = proxy.options();
  {
    // The proxy's 407 is not the origin's answer.
    PocoTransport without(options);
    const std::string error = transport_error(without, get(origin.url("/echo")));
    EXPECT_TRUE(contains(error, "the proxy refused the request (407")) << error;
    EXPECT_TRUE(contains(error, "through the proxy 127.0.0.1:")) << error;
  }
  options.proxy.username = "user";
  options.proxy.password = "pa ss";
  PocoTransport transport(options);
  EXPECT_EQ(transport.perform(get(origin.url("/echo"))).status, 200);
  ASSERT_EQ(proxy.seen().size(), 2u);
  EXPECT_EQ(proxy.seen()[1].authorization, "Basic dXNlcjpwYSBzcw==");

  // Nothing listens where the proxy is said to be: the error names it.
  Poco::Net::ServerSocket closed(Poco::Net::SocketAddress("127.0.0.1", 0));
  options.proxy.port = closed.address().port();
  closed.close();
  PocoTransport unreachable(options);
  const std::string error = transport_error(unreachable, get(origin.url("/echo")));
  EXPECT_TRUE(contains(error, "connection refused")) << error;
  EXPECT_TRUE(contains(error, "through the proxy 127.0.0.1:" + std::to_string(options.proxy.port)))
      << error;
}

// ---------------------------------------------------------------------------------------------
// TLS

// A CA and a server certificate for 127.0.0.1 (SAN IP:127.0.0.1), made with the openssl CLI.
struct TestPki {
  std::filesystem::path dir;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string other_cert_file, other_key_file;  // the same CA's, for other.example only
  std::string second_ca_file;                   // a CA that signed none of these
  std::string error;                            // why the PKI could not be made; empty on success
};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TestPki make_pki() {
  TestPki pki;
  if (std::system("openssl version >/dev/null 2>&1") != 0) {
    pki.error =
        "the openssl CLI is not on PATH; the TLS tests need it to generate their certificates "
        "(install the openssl package)";
    return pki;
  }
  std::string templ = (std::filesystem::temp_directory_path() / "backhaul_tls_XXXXXX").string();
  if (mkdtemp(templ.data()) == nullptr) {
    pki.error = "mkdtemp failed for " + templ;
    return pki;
  }
  pki.dir = templ;
  const auto path = [&](const char* name) { return (pki.dir / name).string(); };
  std::ofstream(path("ca.cnf")) << "[req]\n"
                                   "distinguished_name = dn\n"
                                   "prompt = no\n"
                                   "x509_extensions = v3_ca\n"
                                   "[dn]\n"
                                   "CN = backhaul test CA\n"
                                   "[v3_ca]\n"
                                   "basicConstraints = critical,CA:TRUE\n"
                                   "keyUsage = critical,keyCertSign,cRLSign\n"
                                   "subjectKeyIdentifier = hash\n";
  std::ofstream(path("server.ext")) << "basicConstraints = CA:FALSE\n"
                                       "keyUsage = critical,digitalSignature,keyEncipherment\n"
                                       "extendedKeyUsage = serverAuth\n"
                                       "subjectAltName = IP:127.0.0.1,DNS:localhost\n";
  const std::string key_options = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  // A certificate the same CA signed for another name, and a second CA.
  std::ofstream(path("other.ext")) << "basicConstraints = CA:FALSE\n"
                                      "keyUsage = critical,digitalSignature,keyEncipherment\n"
                                      "extendedKeyUsage = serverAuth\n"
                                      "subjectAltName = DNS:other.example\n";
  const std::string commands[] = {
      "openssl req -x509 -new" + key_options + " -days 2 -config '" + path("ca.cnf") +
          "' -keyout '" + path("ca.key") + "' -out '" + path("ca.pem") + "'",
      "openssl req -new" + key_options + " -subj /CN=127.0.0.1 -config '" + path("ca.cnf") +
          "' -keyout '" + path("server.key") + "' -out '" + path("server.csr") + "'",
      "openssl x509 -req -days 2 -in '" + path("server.csr") + "' -CA '" + path("ca.pem") +
          "' -CAkey '" + path("ca.key") + "' -CAcreateserial -extfile '" + path("server.ext") +
          "' -out '" + path("server.pem") + "'",
      "openssl req -new" + key_options + " -subj /CN=other.example -config '" + path("ca.cnf") +
          "' -keyout '" + path("other.key") + "' -out '" + path("other.csr") + "'",
      "openssl x509 -req -days 2 -in '" + path("other.csr") + "' -CA '" + path("ca.pem") +
          "' -CAkey '" + path("ca.key") + "' -CAcreateserial -extfile '" + path("other.ext") +
          "' -out '" + path("other.pem") + "'",
      "openssl req -x509 -new" + key_options + " -days 2 -config '" + path("ca.cnf") +
          "' -keyout '" + path("ca2.key") + "' -out '" + path("ca2.pem") + "'",
  };
  for (const std::string& command : commands) {
    if (std::system((command + " >'" + path("openssl.log") + "' 2>&1").c_str()) != 0) {
      pki.error = "'" + command + "' failed:\n" + read_file(path("openssl.log"));
      return pki;
    }
  }
  pki.ca_file = path("ca.pem");
  pki.cert_file = path("server.pem");
  pki.key_file = path("server.key");
  pki.other_cert_file = path("other.pem");
  pki.other_key_file = path("other.key");
  pki.second_ca_file = path("ca2.pem");
  return pki;
}

class PocoTransportTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Poco::Net::initializeSSL();
    pki_ = new TestPki(make_pki());
  }

  static void TearDownTestSuite() {
    if (!pki_->dir.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(pki_->dir, ignored);
    }
    delete pki_;
    pki_ = nullptr;
    Poco::Net::uninitializeSSL();
  }

  void SetUp() override {
    // Never skipped: without openssl the TLS path would go untested unnoticed.
    ASSERT_TRUE(pki_->error.empty()) << pki_->error;
    Poco::Net::Context::Ptr context =
        new Poco::Net::Context(Poco::Net::Context::TLS_SERVER_USE, pki_->key_file, pki_->cert_file,
                               "", Poco::Net::Context::VERIFY_NONE);
    server_ = std::make_unique<TestServer>(
        [](HTTPServerRequest& request, HTTPServerResponse& response) { echo(request, response); },
        Poco::Net::SecureServerSocket(Poco::Net::SocketAddress("127.0.0.1", 0), 64, context));
  }

  void TearDown() override { server_.reset(); }

  std::string url() const { return server_->url("/echo", "127.0.0.1", "https"); }

  // POSTs "<prefix> 0", "<prefix> 1", … (`n` of them), each answered 200 with its own body.
  void expect_echoed(PocoTransport& transport, const std::string& prefix, int n) const {
    for (int i = 0; i < n; ++i) {
      Request request = get(url());
      request.method = "POST";
      request.body = prefix + " " + std::to_string(i);
      const Response response = transport.perform(request);
      EXPECT_EQ(response.status, 200);
      EXPECT_EQ(response.body, request.body);
    }
  }

  static TestPki* pki_;
  std::unique_ptr<TestServer> server_;
};

TestPki* PocoTransportTlsTest::pki_ = nullptr;

TEST_F(PocoTransportTlsTest, TrustsAServerSignedByTheConfiguredCa) {
  PocoTransportOptions options;
  options.ca_file = pki_->ca_file;
  PocoTransport transport(options);
  expect_echoed(transport, "over tls", 3);
  EXPECT_EQ(transport.connections_opened(), 1u);
}

TEST_F(PocoTransportTlsTest, RejectsAnUntrustedCertificateWithTheDefaultStore) {
  PocoTransport transport;  // verify_peer, system CAs
  const std::string error = transport_error(transport, get(url()));
  EXPECT_TRUE(contains(error, "certificate")) << error;
  EXPECT_TRUE(contains(error, "GET " + url() + ": ")) << error;
}

TEST_F(PocoTransportTlsTest, AcceptsAnyCertificateWhenVerificationIsOff) {
  PocoTransportOptions options;
  options.verify_peer = false;
  PocoTransport transport(options);
  EXPECT_EQ(transport.perform(get(url())).status, 200);
}

// HTTPS through a proxy: a CONNECT tunnel with the proxy's credentials, TLS inside it to the
// origin, whose certificate is the one verified.
TEST_F(PocoTransportTlsTest, TunnelsThroughAProxyWithConnect) {
  testing::TestProxy proxy("Basic dXNlcjpwYXNz");  // user:pass
  PocoTransportOptions options;
  options.ca_file = pki_->ca_file;
  options.proxy = proxy.options();
  {
    PocoTransport refused(options);
    const std::string error = transport_error(refused, get(url()));
    EXPECT_TRUE(contains(error, "the proxy did not open a tunnel")) << error;
    EXPECT_TRUE(contains(error, "Proxy Authentication Required")) << error;
    EXPECT_TRUE(contains(error, "through the proxy 127.0.0.1:")) << error;
  }
  options.proxy.username = "user";
  options.proxy.password = "pass";
  PocoTransport transport(options);
  expect_echoed(transport, "tunnelled", 2);
  EXPECT_EQ(transport.perform(get(url())).header("x-echo-proxy-authorization"), "<none>")
      << "the proxy's credentials are not sent inside the tunnel";
  EXPECT_EQ(transport.connections_opened(), 1u) << "the tunnel is kept alive";
  const std::vector<testing::TestProxy::Seen> seen = proxy.seen();
  ASSERT_EQ(seen.size(), 2u) << "one tunnel, kept alive";
  const std::string authority = "127.0.0.1:" + std::to_string(server_->port());
  EXPECT_EQ(seen[1].request_line, "CONNECT " + authority + " HTTP/1.1");
  EXPECT_EQ(seen[1].authorization, "Basic dXNlcjpwYXNz");

  // The tunnel does not stand in for verification: an untrusted origin is still refused.
  options.ca_file.clear();
  PocoTransport untrusted(options);
  EXPECT_TRUE(contains(transport_error(untrusted, get(url())), "certificate"));
}

// Opening the tunnel is connecting: a proxy that accepts the connection but never answers the
// CONNECT is given the connect timeout, not the request's (Poco gives its session to the proxy
// the receive timeout for everything).
TEST_F(PocoTransportTlsTest, AProxyThatDoesNotAnswerTheConnectTimesOutAsAConnect) {
  std::atomic<bool> done{false};
  testing::TcpServer mute([&done](Poco::Net::StreamSocket&) {  // accepts, never answers
    while (!done) std::this_thread::sleep_for(20ms);
  });
  PocoTransportOptions options;
  options.ca_file = pki_->ca_file;
  options.proxy.host = "127.0.0.1";
  options.proxy.port = mute.port();
  options.connect_timeout = 200ms;
  PocoTransport transport(options);
  Request request = get(url());
  request.timeout = 20s;
  const auto [error, took] = timed_error(transport, request);
  done = true;
  EXPECT_TRUE(contains(error, "connect timeout after 200 ms")) << error;
  EXPECT_TRUE(contains(error, "through the proxy 127.0.0.1:")) << error;
  EXPECT_LT(took, 10s) << "the request's 20 s, not the connect timeout";
}

// Relays each connection to 127.0.0.1:`port`: what the client sends goes on at once, what the
// server answers comes back a byte every `gap` (a server that answers, too slowly to finish).
class DripRelay {
 public:
  DripRelay(uint16_t port, std::chrono::milliseconds gap)
      : port_(port), gap_(gap), server_([this](Poco::Net::StreamSocket& c) { relay(c); }) {}

  uint16_t port() const { return server_.port(); }

 private:
  void relay(Poco::Net::StreamSocket& client) {
    try {
      Poco::Net::StreamSocket upstream(Poco::Net::SocketAddress("127.0.0.1", port_));
      std::string pending;
      char chunk[4096];
      while (!server_.stopping()) {
        if (client.poll(Poco::Timespan(0), Poco::Net::Socket::SELECT_READ)) {
          const int n = client.receiveBytes(chunk, sizeof chunk);
          if (n <= 0) break;
          upstream.sendBytes(chunk, n);
        }
        if (upstream.poll(Poco::Timespan(0), Poco::Net::Socket::SELECT_READ)) {
          const int n = upstream.receiveBytes(chunk, sizeof chunk);
          if (n <= 0) break;
          pending.append(chunk, static_cast<size_t>(n));
        }
        if (!pending.empty()) {
          client.sendBytes(pending.data(), 1);
          pending.erase(0, 1);
        }
        std::this_thread::sleep_for(gap_);
      }
    } catch (const Poco::Exception&) {
      // Either side went away: nothing to do.
    }
  }

  const uint16_t port_;
  const std::chrono::milliseconds gap_;
  testing::TcpServer server_;  // last: stops before the members its connections use
};

// The request's deadline covers connecting: a TLS handshake, or a proxy's answer to CONNECT, that
// arrives a byte at a time ends with it, as a connect timeout. Each read had a connect timeout of
// its own before: a 2 s request whose server hello dripped in took 28 s, and was reported as a
// timeout while sending the request.
TEST_F(PocoTransportTlsTest, ASlowHandshakeOrTunnelEndsAtTheRequestsDeadline) {
  PocoTransportOptions options;
  options.ca_file = pki_->ca_file;
  {
    SCOPED_TRACE("the server's handshake drips");
    DripRelay relay(server_->port(), 20ms);
    PocoTransport transport(options);
    Request request = get("https://127.0.0.1:" + std::to_string(relay.port()) + "/echo");
    request.timeout = 500ms;
    const auto [error, took] = timed_error(transport, request);
    EXPECT_TRUE(contains(error, "connect timeout after 500 ms")) << error;
    EXPECT_LT(took, 3s);
  }
  {
    SCOPED_TRACE("the proxy's answer to CONNECT drips");
    const std::string answer =
        "HTTP/1.1 200 Connection established\r\nX-Pad: " + std::string(1000, 'p') + "\r\n\r\n";
    RawServer proxy(answer, RawServer::Then::kKeepOpen, {0, 1, 20ms});
    options.proxy.host = "127.0.0.1";
    options.proxy.port = proxy.port();
    PocoTransport transport(options);
    Request request = get(url());
    request.timeout = 500ms;
    const auto [error, took] = timed_error(transport, request);
    EXPECT_TRUE(contains(error, "connect timeout after 500 ms")) << error;
    EXPECT_TRUE(contains(error, "through the proxy 127.0.0.1:")) << error;
    EXPECT_LT(took, 3s);
  }
}

// A pooled connection that the server closed while it was idle, direct or through a tunnel, is
// dropped at checkout (or, closed just before its use, found dead by the request, which goes
// again), and a new one is opened by the transport, as Poco no longer reconnects by itself.
TEST_F(PocoTransportTlsTest, ReconnectsWhenTheServerClosedAnIdleConnection) {
  Poco::Net::Context::Ptr context =
      new Poco::Net::Context(Poco::Net::Context::TLS_SERVER_USE, pki_->key_file, pki_->cert_file,
                             "", Poco::Net::Context::VERIFY_NONE);
  // Answers one request on each connection, then closes it.
  testing::TcpServer server([&context](Poco::Net::StreamSocket& socket) {
    try {
      socket.setReceiveTimeout(Poco::Timespan(10, 0));  // a client that sends nothing
      Poco::Net::SecureStreamSocket tls = Poco::Net::SecureStreamSocket::attach(socket, context);
      std::string request;
      char chunk[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const int n = tls.receiveBytes(chunk, sizeof chunk);
        if (n <= 0) return;
        request.append(chunk, static_cast<size_t>(n));
      }
      tls.sendBytes(kOkResponse.data(), static_cast<int>(kOkResponse.size()));
      tls.close();
    } catch (const Poco::Exception&) {
      // The client went away: nothing to do.
    }
  });
  testing::TestProxy proxy;
  for (const bool tunnelled : {false, true}) {
    SCOPED_TRACE(tunnelled ? "through a tunnel" : "direct");
    PocoTransportOptions options;
    options.ca_file = pki_->ca_file;
    if (tunnelled) options.proxy = proxy.options();
    PocoTransport transport(options);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(
          transport.perform(get("https://127.0.0.1:" + std::to_string(server.port()) + "/")).body,
          "ok");
    }
    EXPECT_EQ(transport.connections_opened(), 3u);
  }
  EXPECT_EQ(proxy.seen_containing("CONNECT "), 3u);
}

// The name is checked for a loopback address too: a certificate the trusted CA signed for
// other.example does not pass for 127.0.0.1 (Poco's VERIFY_RELAXED skipped the check there).
TEST_F(PocoTransportTlsTest, RefusesACertificateForAnotherNameOnALoopbackAddress) {
  Poco::Net::Context::Ptr context =
      new Poco::Net::Context(Poco::Net::Context::TLS_SERVER_USE, pki_->other_key_file,
                             pki_->other_cert_file, "", Poco::Net::Context::VERIFY_NONE);
  TestServer other(
      [](HTTPServerRequest& request, HTTPServerResponse& response) { echo(request, response); },
      Poco::Net::SecureServerSocket(Poco::Net::SocketAddress("127.0.0.1", 0), 64, context));
  PocoTransportOptions options;
  options.ca_file = pki_->ca_file;
  PocoTransport transport(options);
  for (const char* host : {"127.0.0.1", "localhost"}) {
    try {
      transport.perform(get(other.url("/echo", host, "https")));
      ADD_FAILURE() << host << ": a certificate for other.example was accepted";
    } catch (const TransportError& e) {
      EXPECT_NE(std::string(e.what()).find("certificate"), std::string::npos)
          << host << ": " << e.what();
    }
  }
  expect_echoed(transport, "the right name", 1);  // the server for 127.0.0.1 still passes
}

// A CA file adds to the system's CAs rather than replacing them: a gateway's private CA must
// leave the providers trusted. The system's store is the test CA here (SSL_CERT_FILE, which
// OpenSSL's default store reads); the CA file is another CA.
TEST_F(PocoTransportTlsTest, ACaFileAddsToTheSystemsCas) {
  struct SystemStore {
    explicit SystemStore(const std::string& file) { ::setenv("SSL_CERT_FILE", file.c_str(), 1); }
    ~SystemStore() { ::unsetenv("SSL_CERT_FILE"); }
  } system_store(pki_->ca_file);
  PocoTransportOptions options;
  options.ca_file = pki_->second_ca_file;
  PocoTransport transport(options);
  expect_echoed(transport, "trusted by the system's store", 1);
}

TEST_F(PocoTransportTlsTest, ReportsAMissingCaFile) {
  PocoTransportOptions options;
  options.ca_file = (pki_->dir / "missing.pem").string();
  PocoTransport transport(options);
  EXPECT_THROW(transport.perform(get(url())), TransportError);
}

}  // namespace
}  // namespace backhaul::http
