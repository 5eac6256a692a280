// The host's HTTP metrics (SPEC A3): tallies by client and outcome, and MeteredTransport, which
// counts what another transport does.
#include "core/http/http_metrics.h"

#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/http/replay_transport.h"

namespace backhaul::http {
namespace {

using std::chrono::microseconds;

Exchange answered(const std::string& url, int status) {
  Exchange e;
  e.method = "GET";
  e.url = url;
  e.response.status = status;
  return e;
}

Request get(const std::string& url) {
  Request r;
  r.url = url;
  return r;
}

TEST(HttpTallyTest, CountsByStatusClassAndAnythingElseAsAnError) {
  HttpTally t;
  for (int status : {100, 200, 299, 302, 404, 503, 599, 0, 600, 42}) t.add(status, microseconds(5));
  EXPECT_EQ(t.requests, (std::array<uint64_t, 6>{1, 2, 1, 1, 2, 3}));
  EXPECT_EQ(t.total(), 10u);
  EXPECT_EQ(t.micros, 50u);
  HttpTally u;
  u.add(201, microseconds(7));
  u.merge(t);
  EXPECT_EQ(u.requests[1], 3u);
  EXPECT_EQ(u.micros, 57u);
}

TEST(HttpMetricsTest, KeepsEachClientApartAndTakeAllForgetsWhatItTook) {
  HttpMetrics metrics;
  metrics.record("github", 200, microseconds(10));
  metrics.record("github", 0, microseconds(20));
  metrics.record("gateway", 202, microseconds(30));
  HttpTally empty;
  metrics.merge("vercel", empty);
  std::map<std::string, HttpTally> seen = metrics.snapshot();
  ASSERT_EQ(seen.size(), 2u) << "an empty tally adds no client";
  EXPECT_EQ(seen["github"].requests[1], 1u);
  EXPECT_EQ(seen["github"].requests[5], 1u);
  EXPECT_EQ(seen["gateway"].micros, 30u);

  const HttpTally all = metrics.take_all();
  EXPECT_EQ(all.total(), 3u);
  EXPECT_EQ(all.micros, 60u);
  EXPECT_TRUE(metrics.snapshot().empty());
  EXPECT_EQ(metrics.take_all().total(), 0u);
}

TEST(MeteredTransportTest, CountsEachExchangeAndEachBatchResultAsItsClient) {
  ReplayTransport inner;
  inner.add(answered("http://gw.test/a", 202));
  inner.add(answered("http://gw.test/b", 503));
  HttpMetrics metrics;
  MeteredTransport metered(inner, metrics, "gateway");
  EXPECT_EQ(metered.perform(get("http://gw.test/a")).status, 202);
  EXPECT_THROW(metered.perform(get("http://gw.test/unrecorded")), TransportError);
  const std::vector<BatchResult> batch = metered.perform_batch(
      {get("http://gw.test/a"), get("http://gw.test/b"), get("http://gw.test/unrecorded")});
  ASSERT_EQ(batch.size(), 3u);

  const HttpTally gateway = metrics.snapshot().at("gateway");
  EXPECT_EQ(gateway.requests[1], 2u) << "2xx";
  EXPECT_EQ(gateway.requests[4], 1u) << "5xx";
  EXPECT_EQ(gateway.requests[5], 2u) << "error";
  EXPECT_EQ(gateway.total(), 5u);
}

// A request refused before it is sent (a malformed url) is no exchange.
TEST(MeteredTransportTest, DoesNotCountARequestRefusedBeforeItWasSent) {
  struct Refusing final : Transport {
    Response perform(const Request& request) override {
      throw RequestError("invalid url " + request.url);
    }
  } refusing;
  HttpMetrics metrics;
  MeteredTransport metered(refusing, metrics, "gateway");
  EXPECT_THROW(metered.perform(get("ftp://gw.test/")), RequestError);
  EXPECT_TRUE(metrics.snapshot().empty());
}

}  // namespace
}  // namespace backhaul::http
