// The host services a plugin sees (HTTP through the host's transport, clock), exercised through
// the real ABI by the fake connector.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/http/replay_transport.h"
#include "core/plugins/plugin_loader.h"

namespace backhaul::plugins {
namespace {

std::filesystem::path fake_plugin() { return std::filesystem::path(TEST_PLUGIN_DIR) / "fake.so"; }

FetchParams first_page() {
  FetchParams p;
  p.unit = {"inst-1", "r1", std::nullopt, "tok-123"};
  p.entity_type = "item";
  return p;
}

http::Exchange exchange(std::string url, int status, http::Headers headers = {},
                        std::string body = {}) {
  http::Exchange e;
  e.method = "GET";
  e.url = std::move(url);
  e.response.status = status;
  e.response.headers = std::move(headers);
  e.response.body = std::move(body);
  return e;
}

// /old answers 301 to /new?x=1, which answers 200.
void record_a_redirect(http::ReplayTransport& transport) {
  transport.add(exchange("https://api.example.test/old", 301,
                         {{"location", "https://api.example.test/new?x=1"}}));
  transport.add(exchange("https://api.example.test/new?x=1", 200, {}, "{}"));
}

TEST(HostServicesTest, PluginHttpGoesThroughTheHostTransportAndFollowsRedirects) {
  http::ReplayTransport transport;
  record_a_redirect(transport);
  FakeClock clock;
  Connector connector = load_plugin(fake_plugin(), {transport, clock})
                            .create(R"({"http_url": "https://api.example.test/old"})");
  Page page = connector.fetch_page(first_page());
  auto payload = nlohmann::json::parse(page.event(0).payload_json);
  EXPECT_EQ(payload["http"]["status"], 200);
  EXPECT_EQ(payload["http"]["final_url"], "https://api.example.test/new?x=1");

  auto requests = transport.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].url, "https://api.example.test/old");
  EXPECT_EQ(requests[1].url, "https://api.example.test/new?x=1");
  // Same host: the credential is kept across the redirect.
  for (const auto& r : requests) {
    bool has_auth = false;
    for (const auto& [name, value] : r.headers) {
      if (name == "Authorization") has_auth = value == "Bearer tok-123";
    }
    EXPECT_TRUE(has_auth) << r.url;
  }
}

// SPEC A3: the host keeps the metrics of its HTTP service. Each exchange of the plugin counts, as
// "plugin:<id>", by its answer's status class (a redirect and its target are two), or as an
// error when no answer came.
TEST(HostServicesTest, EachExchangeOfThePluginIsCountedByOutcome) {
  http::ReplayTransport transport;
  record_a_redirect(transport);
  FakeClock clock;
  http::HttpMetrics metrics;
  Plugin plugin = load_plugin(fake_plugin(), {transport, clock, std::chrono::seconds(5), &metrics});
  Connector connector = plugin.create(R"({"http_url": "https://api.example.test/old"})");
  connector.fetch_page(first_page());
  Connector failing = plugin.create(R"({"http_url": "https://api.example.test/unrecorded"})");
  EXPECT_THROW(failing.fetch_page(first_page()), ConnectorFailure);

  const std::map<std::string, http::HttpTally> tallies = metrics.snapshot();
  ASSERT_EQ(tallies.size(), 1u);
  const http::HttpTally& fake = tallies.at("plugin:" + plugin.info().id);
  EXPECT_EQ(fake.requests[1], 1u) << "2xx";
  EXPECT_EQ(fake.requests[2], 1u) << "3xx";
  EXPECT_EQ(fake.requests[5], 1u) << "error: no answer";
  EXPECT_EQ(fake.total(), 3u);
}

TEST(HostServicesTest, NetworkErrorReachesThePluginAsRetryable) {
  http::ReplayTransport transport;  // nothing recorded: every request fails like a network error
  FakeClock clock;
  Connector connector = load_plugin(fake_plugin(), {transport, clock})
                            .create(R"({"http_url": "http://127.0.0.1:9/unreachable"})");
  try {
    connector.fetch_page(first_page());
    FAIL() << "expected a failure";
  } catch (const ConnectorFailure& e) {
    EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
    EXPECT_NE(std::string(e.what()).find("no recorded exchange"), std::string::npos) << e.what();
  }
}

TEST(HostServicesTest, RecordedNetworkFailureIsRetryable) {
  http::ReplayTransport transport;
  http::Exchange reset;
  reset.method = "GET";
  reset.url = "http://api.example.test/reset";
  reset.error = "connection reset by peer";
  transport.add(reset);
  FakeClock clock;
  Connector connector = load_plugin(fake_plugin(), {transport, clock})
                            .create(R"({"http_url": "http://api.example.test/reset"})");
  try {
    connector.fetch_page(first_page());
    FAIL() << "expected a failure";
  } catch (const ConnectorFailure& e) {
    EXPECT_EQ(e.status(), BACKHAUL_RETRYABLE);
    EXPECT_NE(std::string(e.what()).find("connection reset by peer"), std::string::npos);
  }
}

TEST(HostServicesTest, ClockIsTheInjectedOne) {
  http::ReplayTransport transport;
  FakeClock clock(42'000);
  Connector connector = load_plugin(fake_plugin(), {transport, clock}).create("{}");
  EXPECT_EQ(
      nlohmann::json::parse(connector.fetch_page(first_page()).event(0).payload_json)["now_ms"],
      42'000);
  clock.advance_ms(1'000);
  EXPECT_EQ(
      nlohmann::json::parse(connector.fetch_page(first_page()).event(0).payload_json)["now_ms"],
      43'000);
}

// --- a plugin that calls the host services wrongly (test_plugins/misbehaving.cpp) --------------

std::filesystem::path misbehaving_plugin() {
  return std::filesystem::path(TEST_PLUGIN_DIR) / "misbehaving.so";
}

// The payload of the one event the misbehaving plugin returns in `mode`: what the host told it.
nlohmann::json host_answer(http::Transport& transport, const std::string& mode) {
  FakeClock clock(42'000);
  Connector connector =
      load_plugin(misbehaving_plugin(), {transport, clock}).create(R"({"mode": ")" + mode + "\"}");
  Page page = connector.fetch_page(first_page());
  return nlohmann::json::parse(page.event(0).payload_json);
}

TEST(HostServicesTest, LogWithANullHostIsIgnored) {
  http::ReplayTransport transport;
  EXPECT_EQ(host_answer(transport, "log_null_host")["logged"], true);
}

TEST(HostServicesTest, NowWithANullHostDoesNotCrash) {
  http::ReplayTransport transport;
  EXPECT_TRUE(host_answer(transport, "now_null_host")["now_ms"].is_number_integer());
}

TEST(HostServicesTest, HttpWithANullHostIsAnInvalidArgument) {
  http::ReplayTransport transport;
  nlohmann::json answer = host_answer(transport, "http_null_host");
  EXPECT_EQ(answer["status"], BACKHAUL_INVALID_ARGUMENT) << answer;
  EXPECT_NE(answer["message"].get<std::string>().find("host"), std::string::npos) << answer;
  EXPECT_TRUE(transport.requests().empty());
}

TEST(HostServicesTest, HttpWithNullHeadersAndAHeaderCountIsAnInvalidArgument) {
  http::ReplayTransport transport;
  transport.add(exchange("https://api.example.test/misbehaving", 200, {}, "{}"));
  nlohmann::json answer = host_answer(transport, "http_null_headers");
  EXPECT_EQ(answer["status"], BACKHAUL_INVALID_ARGUMENT) << answer;
  EXPECT_NE(answer["message"].get<std::string>().find("headers"), std::string::npos) << answer;
  EXPECT_TRUE(transport.requests().empty());
}

TEST(HostServicesTest, ReleasingAnHttpResponseTwiceIsIgnoredNotADoubleFree) {
  http::ReplayTransport transport;
  transport.add(exchange("https://api.example.test/misbehaving", 200, {}, "{}"));
  nlohmann::json answer = host_answer(transport, "http_double_release");
  EXPECT_EQ(answer["status"], BACKHAUL_OK) << answer;
}

}  // namespace
}  // namespace backhaul::plugins
