// http.h without sockets: header lookup, resolve_url and the redirect rules of send() against a
// scripted transport. PocoTransport is covered in poco_transport_test.cpp.
#include "core/http/http.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/scripted_transport.h"

namespace backhaul::http {
namespace {

using testing::header_of;
using testing::ScriptedTransport;

TEST(ResponseTest, HeaderLookupIsCaseInsensitiveAndReturnsTheFirst) {
  Response r;
  r.headers = {{"content-type", "text/plain"}, {"link", "<a>"}, {"link", "<b>"}};
  EXPECT_EQ(r.header("Content-Type"), "text/plain");
  EXPECT_EQ(r.header("LINK"), "<a>");
  EXPECT_FALSE(r.header("etag").has_value());
}

TEST(ToLowerTest, LowerCasesAsciiOnly) {
  EXPECT_EQ(to_lower("X-GitHub-Request-Id"), "x-github-request-id");
  EXPECT_EQ(to_lower("\xc3\x89T\xc3\xa9"), "\xc3\x89t\xc3\xa9");
  EXPECT_EQ(to_lower(""), "");
}

TEST(ResolveUrlTest, KeepsAbsoluteLocations) {
  EXPECT_EQ(resolve_url("https://a.example/x/y", "http://b.example/z?q=1"),
            "http://b.example/z?q=1");
}

TEST(ResolveUrlTest, ResolvesSchemeRelativeLocations) {
  EXPECT_EQ(resolve_url("https://a.example/x/y", "//b.example:8443/p"), "https://b.example:8443/p");
}

TEST(ResolveUrlTest, ResolvesAbsolutePathLocations) {
  EXPECT_EQ(resolve_url("https://a.example:8080/x/y?q=1", "/repositories/42?page=2"),
            "https://a.example:8080/repositories/42?page=2");
}

TEST(ResolveUrlTest, ResolvesRelativeLocationsAgainstTheBaseDirectory) {
  EXPECT_EQ(resolve_url("http://h/a/b/c?x=1", "d"), "http://h/a/b/d");
  EXPECT_EQ(resolve_url("http://h/a/b/", "d/e?f=g"), "http://h/a/b/d/e?f=g");
  EXPECT_EQ(resolve_url("http://h", "d"), "http://h/d");
  EXPECT_EQ(resolve_url("http://h/a/b/c", "../d"), "http://h/a/d");
  EXPECT_EQ(resolve_url("http://h/a/b/c", "./d/./e/../f"), "http://h/a/b/d/f");
}

TEST(ResolveUrlTest, FollowsRfc3986Examples) {
  const std::string base = "http://a/b/c/d;p?q";
  EXPECT_EQ(resolve_url(base, "g"), "http://a/b/c/g");
  EXPECT_EQ(resolve_url(base, "./g"), "http://a/b/c/g");
  EXPECT_EQ(resolve_url(base, "g/"), "http://a/b/c/g/");
  EXPECT_EQ(resolve_url(base, "/g"), "http://a/g");
  EXPECT_EQ(resolve_url(base, "//g"), "http://g");
  EXPECT_EQ(resolve_url(base, "?y"), "http://a/b/c/d;p?y");
  EXPECT_EQ(resolve_url(base, "g?y"), "http://a/b/c/g?y");
  EXPECT_EQ(resolve_url(base, "#s"), "http://a/b/c/d;p?q#s");
  EXPECT_EQ(resolve_url(base, ""), "http://a/b/c/d;p?q");
  EXPECT_EQ(resolve_url(base, "."), "http://a/b/c/");
  EXPECT_EQ(resolve_url(base, ".."), "http://a/b/");
  EXPECT_EQ(resolve_url(base, "../g"), "http://a/b/g");
  EXPECT_EQ(resolve_url(base, "../.."), "http://a/");
  EXPECT_EQ(resolve_url(base, "../../../g"), "http://a/g");
  EXPECT_EQ(resolve_url(base, "/./g"), "http://a/g");
  EXPECT_EQ(resolve_url(base, "g;x=1/../y"), "http://a/b/c/y");
}

TEST(SendTest, ReturnsNonRedirectResponsesAsIs) {
  ScriptedTransport t;
  t.then(404, {{"x", "1"}}, "missing");
  Request r;
  r.url = "https://api.example/x";
  const Response resp = send(t, r);
  EXPECT_EQ(resp.status, 404);
  EXPECT_EQ(resp.body, "missing");
  EXPECT_EQ(t.requests.size(), 1u);
}

TEST(SendTest, Follows301ToTheFinalResponse) {
  ScriptedTransport t;
  t.then_redirect(301, "https://api.example/repositories/42");
  t.then(200, {}, "ok");
  Request r;
  r.url = "https://api.example/repos/o/r";
  const Response resp = send(t, r);
  EXPECT_EQ(resp.status, 200);
  EXPECT_EQ(resp.url, "https://api.example/repositories/42");
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.requests[1].method, "GET");
}

TEST(SendTest, ResolvesRelativeLocations) {
  ScriptedTransport t;
  t.then_redirect(302, "next?page=2");
  t.then_redirect(302, "/root");
  t.then(200);
  Request r;
  r.url = "https://api.example/list/first";
  EXPECT_EQ(send(t, r).status, 200);
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(t.requests[1].url, "https://api.example/list/next?page=2");
  EXPECT_EQ(t.requests[2].url, "https://api.example/root");
}

TEST(SendTest, Redirect307And308KeepMethodBodyAndHeaders) {
  for (int status : {307, 308}) {
    ScriptedTransport t;
    t.then_redirect(status, "/moved");
    t.then(201);
    Request r;
    r.method = "POST";
    r.url = "https://api.example/items";
    r.headers = {{"Content-Type", "application/json"}};
    r.body = R"({"a":1})";
    EXPECT_EQ(send(t, r).status, 201);
    ASSERT_EQ(t.requests.size(), 2u);
    EXPECT_EQ(t.requests[1].method, "POST");
    EXPECT_EQ(t.requests[1].body, R"({"a":1})");
    EXPECT_EQ(header_of(t.requests[1], "content-type"), "application/json");
  }
}

TEST(SendTest, Redirect303BecomesGetWithoutBody) {
  ScriptedTransport t;
  t.then_redirect(303, "/result");
  t.then(200);
  Request r;
  r.method = "POST";
  r.url = "https://api.example/jobs";
  r.headers = {{"Content-Type", "application/json"}, {"Accept", "application/json"}};
  r.body = "{}";
  send(t, r);
  ASSERT_EQ(t.requests.size(), 2u);
  EXPECT_EQ(t.requests[1].method, "GET");
  EXPECT_FALSE(t.requests[1].body.has_value());
  EXPECT_FALSE(header_of(t.requests[1], "content-type").has_value());
  EXPECT_EQ(header_of(t.requests[1], "accept"), "application/json");
}

TEST(SendTest, Redirect301And302BecomeGetForNonGet) {
  for (int status : {301, 302}) {
    ScriptedTransport t;
    t.then_redirect(status, "/elsewhere");
    t.then(200);
    Request r;
    r.method = "PUT";
    r.url = "https://api.example/x";
    r.body = "data";
    send(t, r);
    ASSERT_EQ(t.requests.size(), 2u);
    EXPECT_EQ(t.requests[1].method, "GET");
    EXPECT_FALSE(t.requests[1].body.has_value());
  }
}

TEST(SendTest, HeadStaysHead) {
  ScriptedTransport t;
  t.then_redirect(303, "/other");
  t.then(200);
  Request r;
  r.method = "HEAD";
  r.url = "https://api.example/x";
  send(t, r);
  EXPECT_EQ(t.requests.at(1).method, "HEAD");
}

TEST(SendTest, RedirectWithoutLocationIsReturned) {
  ScriptedTransport t;
  t.then(302, {}, "no location");
  Request r;
  r.url = "https://api.example/x";
  const Response resp = send(t, r);
  EXPECT_EQ(resp.status, 302);
  EXPECT_EQ(resp.body, "no location");
  EXPECT_EQ(t.requests.size(), 1u);
}

TEST(SendTest, ReturnsTheLastRedirectAfterMaxRedirects) {
  ScriptedTransport t;
  for (int i = 1; i <= 6; ++i) t.then_redirect(302, "/hop/" + std::to_string(i));
  Request r;
  r.url = "https://api.example/hop/0";
  const Response resp = send(t, r, 5);
  EXPECT_EQ(resp.status, 302);
  EXPECT_EQ(resp.header("location"), "/hop/6");
  EXPECT_EQ(t.requests.size(), 6u);  // the original and 5 redirects
}

// The request's timeout is the whole call's: each redirect gets what is left of it, and a chain
// of slow redirects ends in a timeout once it is used up. Each hop had the whole timeout before,
// so a call could last (max_redirects + 1) times it.
TEST(SendTest, RedirectsShareTheRequestsTimeout) {
  struct SlowRedirects : Transport {
    Response perform(const Request& request) override {
      timeouts.push_back(request.timeout);
      std::this_thread::sleep_for(std::chrono::milliseconds(40));
      Response r;
      r.status = 302;
      r.headers = {{"location", "/hop/" + std::to_string(timeouts.size())}};
      return r;
    }
    std::vector<std::chrono::milliseconds> timeouts;
  } t;
  Request r;
  r.url = "https://api.example/hop/0?token=secret";
  r.timeout = std::chrono::milliseconds(100);
  try {
    send(t, r, 10);
    ADD_FAILURE() << "no timeout after " << t.timeouts.size() << " hops";
  } catch (const TransportError& e) {
    const std::string expected =
        ": timeout: " + std::to_string(t.timeouts.size()) + " redirects took the whole 100 ms";
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << e.what();
  }
  // Each hop takes at least 40 ms: the k-th has at most 100 - 40k ms, and a fourth none.
  ASSERT_LE(t.timeouts.size(), 3u);
  for (size_t k = 0; k < t.timeouts.size(); ++k) {
    EXPECT_LE(t.timeouts[k].count(), 100 - 40 * static_cast<int64_t>(k)) << k;
  }
}

TEST(SendTest, ZeroMaxRedirectsFollowsNothing) {
  ScriptedTransport t;
  t.then_redirect(301, "/x");
  Request r;
  r.url = "https://api.example/";
  EXPECT_EQ(send(t, r, 0).status, 301);
  EXPECT_EQ(t.requests.size(), 1u);
}

TEST(SendTest, KeepsAuthorizationOnTheSameOrigin) {
  ScriptedTransport t;
  t.then_redirect(301, "https://API.example:443/two");
  t.then_redirect(302, "/three");
  t.then(200);
  Request r;
  r.url = "https://api.example/one";
  r.headers = {{"Authorization", "Bearer secret"}, {"X-Api-Key", "key"}};
  send(t, r);
  ASSERT_EQ(t.requests.size(), 3u);
  EXPECT_EQ(header_of(t.requests[1], "authorization"), "Bearer secret");
  EXPECT_EQ(header_of(t.requests[2], "authorization"), "Bearer secret");
  EXPECT_EQ(header_of(t.requests[2], "x-api-key"), "key");
}

// A plugin's own credential header (GitLab's PRIVATE-TOKEN, say) followed a redirect to any
// origin: only Authorization, Cookie, Proxy-Authorization and X-Api-Key were dropped.
TEST(SendTest, DropsAuthorizationWhenLeavingTheOriginalOrigin) {
  for (const char* elsewhere :
       {"https://evil.example/x", "https://api.example:8443/x", "http://api.example/x"}) {
    ScriptedTransport t;
    t.then_redirect(302, elsewhere);
    t.then_redirect(302, "https://api.example/back");
    t.then(200);
    Request r;
    r.url = "https://api.example/one";
    r.headers = {
        {"authorization", "token secret"}, {"Cookie", "s=1"},
        {"X-Api-Key", "gateway-key"},      {"PRIVATE-TOKEN", "a plugin's own credential header"},
        {"X-Auth-Token", "another"},       {"Accept", "*/*"},
        {"User-Agent", "backhaul"},        {"If-None-Match", "\"etag\""}};
    send(t, r);
    ASSERT_EQ(t.requests.size(), 3u) << elsewhere;
    // Only the headers known to carry no credential go on: a plugin names its own.
    const Headers plain = {
        {"Accept", "*/*"}, {"User-Agent", "backhaul"}, {"If-None-Match", "\"etag\""}};
    EXPECT_EQ(t.requests[1].headers, plain) << elsewhere;
    // Once dropped, it stays dropped.
    EXPECT_FALSE(header_of(t.requests[2], "authorization").has_value()) << elsewhere;
  }
}

TEST(SendTest, PropagatesTransportErrors) {
  ScriptedTransport t;  // no script: perform() throws
  Request r;
  r.url = "https://api.example/";
  EXPECT_THROW(send(t, r), std::logic_error);
}

}  // namespace
}  // namespace backhaul::http
