// Counts of the HTTP requests the host sends, by client (a plugin's id, or "gateway") and outcome,
// with their summed wall time: the host's HTTP metrics (SPEC A3), shown in /metrics.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/http/http.h"

namespace backhaul::http {

// One client's requests by outcome: the final response's status class, or "error" for a request
// that got no response (a transport error: refused, reset, timed out) or a status outside 100-599.
struct HttpTally {
  static constexpr size_t kOutcomes = 6;
  static constexpr std::array<const char*, kOutcomes> kOutcomeNames = {"1xx", "2xx", "3xx",
                                                                       "4xx", "5xx", "error"};
  std::array<uint64_t, kOutcomes> requests{};
  uint64_t micros = 0;  // summed wall time of the requests

  // `status` 0: no response.
  void add(int status, std::chrono::microseconds took);
  void merge(const HttpTally& other);
  uint64_t total() const;
};

// [thread-safe]
class HttpMetrics {
 public:
  void record(const std::string& client, int status, std::chrono::microseconds took);
  void merge(const std::string& client, const HttpTally& tally);
  // The tally of every client together, which is then forgotten: what a plugin worker sends back
  // with each answer, its requests since the last one.
  HttpTally take_all();
  std::map<std::string, HttpTally> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, HttpTally> by_client_;
};

// A Transport that records each exchange of `inner` in `metrics` as `client`. A pipelined batch's
// time is shared evenly among its requests.
class MeteredTransport final : public Transport {
 public:
  MeteredTransport(Transport& inner, HttpMetrics& metrics, std::string client)
      : inner_(inner), metrics_(metrics), client_(std::move(client)) {}
  Response perform(const Request& request) override;
  std::vector<BatchResult> perform_batch(const std::vector<Request>& requests) override;

 private:
  Transport& inner_;
  HttpMetrics& metrics_;
  const std::string client_;
};

}  // namespace backhaul::http
