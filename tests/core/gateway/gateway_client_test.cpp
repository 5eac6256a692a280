// The gateway client against a scripted transport: the timeout and credentials of what it sends,
// and what it makes of answers of every shape.
#include "core/gateway/gateway_client.h"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/common/clock.h"
#include "core/common/utf8.h"
#include "core/http/poco_transport.h"
#include "tests/support/scripted_transport.h"

namespace backhaul::gateway {
namespace {

using testing::header_of;
using testing::ScriptedTransport;

constexpr std::chrono::milliseconds kTimeout{120'000};

Delivery delivery(const char* id) { return {"conn-1", "org-1", id, "push", R"({"n":1})"}; }

// Each exchange carries the client's timeout (gateway.timeout_ms), not the transport's default.
TEST(GatewayClientTest, EachExchangeCarriesTheClientsTimeout) {
  ScriptedTransport t;
  t.then(200, {},
         R"({"id":"c","installationId":"i","provider":"github","orgId":"o",)"
         R"("status":"active","resources":[]})");
  t.then(200, {}, R"({"accessToken":"tok"})");
  t.then(202, {}, R"({"status":"accepted"})");
  t.then(202, {}, R"({"status":"accepted"})");
  t.then(202, {}, R"({"status":"accepted"})");
  const GatewayClient client(t, "http://127.0.0.1:1/gateway", std::string("key"),
                             SystemClock::instance(), kTimeout);
  client.connection("c");
  EXPECT_EQ(client.access_token("c"), "tok");
  EXPECT_EQ(client.dispatch("github", delivery("d-1")), DispatchResult::kAccepted);
  const std::vector<GatewayClient::Outcome> outcomes =
      client.dispatch_batch("github", {delivery("d-2"), delivery("d-3")});
  ASSERT_EQ(outcomes.size(), 2u);
  ASSERT_EQ(t.requests.size(), 5u);
  for (const http::Request& r : t.requests) {
    EXPECT_EQ(r.timeout, kTimeout) << r.method << " " << r.url;
    EXPECT_EQ(header_of(r, "x-api-key"), "key") << r.url;
  }
}

// An item of a connection's `resources` that names no resource is left out and said why, and the
// others are listed: before, a non-object was skipped unsaid, an object without
// providerResourceId failed the whole lookup, and an empty id became a unit that could only fail.
TEST(GatewayClientTest, ResourcesThatNameNoResourceAreLeftOutSayingWhy) {
  ScriptedTransport t;
  t.then(200, {},
         R"({"id":"c","installationId":"i","provider":"github","orgId":"o","status":"active",)"
         R"("resources":[42,{"resourceName":"no-id"},{"providerResourceId":""},)"
         R"({"providerResourceId":7},{"providerResourceId":"100001","resourceName":"o/r"}]})");
  t.then(
      200, {},
      R"({"id":"c","installationId":"i","provider":"github","orgId":"o","status":"active",)"
      R"("resources":[{"providerResourceId":"","resourceName":")" +
          [] {
            std::string name;  // 2-byte characters from byte 41 of the item on: across byte 100
            for (int i = 0; i < 80; ++i) name += "\u00e9";
            return name;
          }() +
          R"("}]})");
  t.then(200, {},
         R"({"id":"c","installationId":"i","provider":"github","orgId":"o","status":"active",)"
         R"("resources":{"providerResourceId":"100001"}})");
  const GatewayClient client(t, "http://127.0.0.1:1/gateway", std::string("key"),
                             SystemClock::instance(), kTimeout);
  Connection c = client.connection("c");
  ASSERT_EQ(c.resources.size(), 1u);
  EXPECT_EQ(c.resources[0].id, "100001");
  EXPECT_EQ(c.resources[0].name, "o/r");
  ASSERT_EQ(c.unusable_resources.size(), 4u);
  EXPECT_EQ(c.unusable_resources[0], "resources[0]: not an object (got 42)");
  EXPECT_EQ(
      c.unusable_resources[1],
      R"(resources[1]: providerResourceId is not a non-empty string (got {"resourceName":"no-id"}))");
  EXPECT_EQ(
      c.unusable_resources[2],
      R"(resources[2]: providerResourceId is not a non-empty string (got {"providerResourceId":""}))");
  EXPECT_EQ(
      c.unusable_resources[3],
      R"(resources[3]: providerResourceId is not a non-empty string (got {"providerResourceId":7}))");

  // A long item is cut on a character boundary: the reason goes into JSON (the run's result).
  ASSERT_EQ(c.unusable_resources.size(), 4u);
  c = client.connection("c");
  ASSERT_EQ(c.unusable_resources.size(), 1u);
  const std::string& cut = c.unusable_resources[0];
  EXPECT_EQ(valid_utf8(cut), cut);
  EXPECT_NE(cut.find("...)"), std::string::npos) << cut;

  c = client.connection("c");
  EXPECT_TRUE(c.resources.empty());
  ASSERT_EQ(c.unusable_resources.size(), 1u);
  EXPECT_EQ(c.unusable_resources[0],
            R"(resources: not an array (got {"providerResourceId":"100001"}))");
}

// The envelope of seed 000: its six fields, the payload verbatim, and receivedAt in epoch
// milliseconds (Date.now()), where it was an ISO 8601 string a gateway built to the seed refuses.
TEST(GatewayClientTest, ADeliveryIsTheSeedsEnvelopeWithReceivedAtInEpochMilliseconds) {
  ScriptedTransport t;
  t.then(202, {}, R"({"status":"accepted"})");
  FakeClock clock(1'700'000'000'123);
  const GatewayClient client(t, "http://127.0.0.1:1/gateway", std::string("key"), clock, kTimeout);
  client.dispatch("github", {"conn-1", "org-1", "d-1", "push", R"({"n": [1, 2]})"});
  ASSERT_EQ(t.requests.size(), 1u);
  EXPECT_EQ(t.requests[0].url, "http://127.0.0.1:1/gateway/webhooks/github");
  EXPECT_EQ(t.requests[0].body.value_or(""),
            R"({"connectionId":"conn-1","orgId":"org-1","deliveryId":"d-1","eventType":"push",)"
            R"("payload":{"n": [1, 2]},"receivedAt":1700000000123})");
}

// Any 2xx answers a connection or token request (a 201 with the token failed as "gateway answered
// 201: {\"accessToken\": ...}", a message that became a dead letter with the token in it). A
// refusal's body, shown for its reason, is redacted.
TEST(GatewayClientTest, AnyTwoHundredAnswersATokenRequestAndARefusalsBodyIsRedacted) {
  ScriptedTransport t;
  t.then(201, {}, R"({"accessToken":"ghs_opaqueInstallationToken123"})");
  t.then(203, {},
         R"({"id":"c","installationId":"i","provider":"github","orgId":"o",)"
         R"("status":"active","resources":[]})");
  t.then(403, {}, R"({"error":"revoked","accessToken":"ghs_opaqueInstallationToken123"})");
  const GatewayClient client(t, "http://127.0.0.1:1/gateway", std::nullopt, SystemClock::instance(),
                             kTimeout);
  EXPECT_EQ(client.access_token("c"), "ghs_opaqueInstallationToken123");
  EXPECT_EQ(client.connection("c").org_id, "o");
  try {
    client.access_token("c");
    ADD_FAILURE() << "a 403 gave a token";
  } catch (const GatewayError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("get token for connection c: gateway answered 403: "), std::string::npos)
        << what;
    EXPECT_NE(what.find("revoked"), std::string::npos) << what;
    EXPECT_EQ(what.find("opaqueInstallationToken"), std::string::npos) << what;
  }
}

// A 2xx is a delivery accepted unless its body's status is the string "duplicate"; a body of
// another shape (a status that is a number or a bool, no object at all) is no error.
TEST(GatewayClientTest, ADeliveryIsAcceptedWhateverTheShapeOfTheAnswer) {
  const std::vector<std::pair<std::string, DispatchResult>> answers = {
      {R"({"status":"duplicate"})", DispatchResult::kDuplicate},
      {R"({"status":"accepted"})", DispatchResult::kAccepted},
      {R"({"status":202})", DispatchResult::kAccepted},
      {R"({"status":true})", DispatchResult::kAccepted},
      {R"({"status":null})", DispatchResult::kAccepted},
      {R"(["duplicate"])", DispatchResult::kAccepted},
      {"", DispatchResult::kAccepted},
      {"not json", DispatchResult::kAccepted},
  };
  for (const auto& [body, expected] : answers) {
    ScriptedTransport t;
    t.then(202, {}, body);
    t.then(202, {}, body);
    const GatewayClient client(t, "http://127.0.0.1:1/gateway");
    EXPECT_EQ(client.dispatch("github", delivery("d-1")), expected) << body;
    const std::vector<GatewayClient::Outcome> batch =
        client.dispatch_batch("github", {delivery("d-2")});
    ASSERT_EQ(batch.size(), 1u);
    EXPECT_FALSE(batch[0].error) << body << ": " << batch[0].error->what();
    EXPECT_EQ(batch[0].result, expected) << body;
  }
}

// A delivery is a POST: a redirect would turn it into a GET that delivers nothing, so it is not
// followed, by dispatch() as by dispatch_batch(). It fails, naming the status.
TEST(GatewayClientTest, ADeliveryAnsweredWithARedirectFailsAndIsNotFollowed) {
  for (int status : {301, 302, 303, 307}) {
    ScriptedTransport t;
    t.then_redirect(status, "http://127.0.0.1:2/elsewhere");
    t.then(200, {}, R"({"status":"accepted"})");
    const GatewayClient client(t, "http://127.0.0.1:1/gateway");
    try {
      client.dispatch("github", delivery("d-1"));
      ADD_FAILURE() << status << ": a redirected delivery counted as delivered";
    } catch (const GatewayError& e) {
      EXPECT_EQ(e.status(), status);
      EXPECT_NE(std::string(e.what()).find("gateway answered " + std::to_string(status)),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(t.requests.size(), 1u) << status;
  }
}

// The token goes into every provider request's Authorization header. One the gateway keeps with a
// line break (a vault's trailing newline), or an empty one, failed each job at its first provider
// request with "invalid value for header Authorization", naming neither the gateway nor the token.
// It is refused where it comes in, for good: asking again gets the same token.
TEST(GatewayClientTest, AnUnusableTokenIsRefusedNamingTheGateway) {
  // As the gateway's JSON spells them.
  for (const std::string token : {R"(ghs_abc\n)", "", "ghs abc", R"(ghs_\u0001abc)"}) {
    ScriptedTransport t;
    t.then(200, {}, R"({"accessToken":")" + token + "\"}");
    const GatewayClient client(t, "http://127.0.0.1:1/gateway");
    try {
      const std::string got = client.access_token("c");
      ADD_FAILURE() << "token " << token << " was taken as " << got;
    } catch (const GatewayError& e) {
      EXPECT_FALSE(e.retryable()) << token;
      const std::string what = e.what();
      EXPECT_NE(
          what.find("get token for connection c: the gateway's token is unusable: it is " +
                    std::string(token.empty() ? "empty" : "not one word of printable characters")),
          std::string::npos)
          << what;
    }
  }
}

// A request that cannot be made (here a URL of a scheme the transport has not) is no outage of the
// gateway: it fails for good, saying so. Before, it was "gateway unreachable", retryable, and
// counted against the gateway's circuit, holding every job back.
TEST(GatewayClientTest, ARequestThatCannotBeMadeIsNoOutage) {
  http::PocoTransport transport;
  const GatewayClient client(transport, "ftp://127.0.0.1:1/gateway");
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { client.connection("c"); }, [&] { client.access_token("c"); },
           [&] { client.dispatch("github", delivery("d-1")); }}) {
    try {
      call();
      ADD_FAILURE() << "an ftp gateway answered";
    } catch (const GatewayError& e) {
      EXPECT_FALSE(e.retryable());
      EXPECT_EQ(e.status(), 0);
      EXPECT_NE(std::string(e.what()).find("a gateway request could not be made: unsupported url "
                                           "scheme \"ftp\""),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace backhaul::gateway
