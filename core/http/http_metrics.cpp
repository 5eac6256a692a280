#include "core/http/http_metrics.h"

#include <algorithm>
#include <utility>

namespace backhaul::http {

namespace {

using std::chrono::microseconds;

microseconds since(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration_cast<microseconds>(std::chrono::steady_clock::now() - started);
}

}  // namespace

void HttpTally::add(int status, microseconds took) {
  const bool answered = status >= 100 && status <= 599;
  ++requests[answered ? static_cast<size_t>(status / 100 - 1) : kOutcomes - 1];
  micros += static_cast<uint64_t>(std::max<int64_t>(took.count(), 0));
}

void HttpTally::merge(const HttpTally& other) {
  for (size_t i = 0; i < kOutcomes; ++i) requests[i] += other.requests[i];
  micros += other.micros;
}

uint64_t HttpTally::total() const {
  uint64_t sum = 0;
  for (uint64_t n : requests) sum += n;
  return sum;
}

void HttpMetrics::record(const std::string& client, int status, microseconds took) {
  std::lock_guard lock(mutex_);
  by_client_[client].add(status, took);
}

void HttpMetrics::merge(const std::string& client, const HttpTally& tally) {
  if (tally.total() == 0) return;
  std::lock_guard lock(mutex_);
  by_client_[client].merge(tally);
}

HttpTally HttpMetrics::take_all() {
  std::map<std::string, HttpTally> taken;
  {
    std::lock_guard lock(mutex_);
    taken.swap(by_client_);
  }
  HttpTally all;
  for (const auto& [client, tally] : taken) all.merge(tally);
  return all;
}

std::map<std::string, HttpTally> HttpMetrics::snapshot() const {
  std::lock_guard lock(mutex_);
  return by_client_;
}

Response MeteredTransport::perform(const Request& request) {
  const auto started = std::chrono::steady_clock::now();
  try {
    Response response = inner_.perform(request);
    metrics_.record(client_, response.status, since(started));
    return response;
  } catch (const TransportError&) {
    metrics_.record(client_, 0, since(started));
    throw;
  }
}

std::vector<BatchResult> MeteredTransport::perform_batch(const std::vector<Request>& requests) {
  const auto started = std::chrono::steady_clock::now();
  std::vector<BatchResult> results = inner_.perform_batch(requests);
  if (results.empty()) return results;
  const microseconds each = since(started) / static_cast<int64_t>(results.size());
  HttpTally tally;
  for (const BatchResult& result : results) {
    tally.add(result.response ? result.response->status : 0, each);
  }
  metrics_.merge(client_, tally);
  return results;
}

}  // namespace backhaul::http
