// The sandbox's account of a run: what the gateway received against what a complete backfill of
// the data set must deliver, how many provider requests were made, and which faults fired.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace backhaul::sandbox {

struct DeliveryCounts {
  int64_t received = 0;    // accepted webhook posts, duplicates included
  int64_t unique = 0;      // distinct delivery ids
  int64_t duplicates = 0;  // received - unique
  int64_t expected = 0;    // delivery ids the data set implies
  int64_t missing = 0;     // expected ids never received
  int64_t unexpected = 0;  // distinct ids received that the data set does not imply
  // distinct expected ids received under the other provider's path, or with a connectionId that
  // is not their installation's
  int64_t misdirected = 0;
};

struct Report {
  std::optional<std::string> installation;  // set when the report is restricted to one
  DeliveryCounts gateway;
  std::map<std::string, DeliveryCounts> gateway_by_provider;  // "github", "vercel"
  std::map<std::string, std::map<std::string, int64_t>> event_types_by_provider;
  int64_t invalid_webhooks = 0;                      // posts answered 400
  std::vector<std::string> unexpected_sample;        // the first unexpected ids, for debugging
  std::vector<std::string> misdirected_sample;       // the first misdirected ids
  std::map<std::string, int64_t> provider_requests;  // "github", "vercel"
  int64_t unauthorized_requests = 0;
  // installation id -> provider -> requests made with that installation's tokens
  std::map<std::string, std::map<std::string, int64_t>> provider_requests_by_installation;
  // "provider_5xx", "burst_429", "token_expired", "rate_limited", "gateway_5xx", "gateway_429",
  // "resource"
  std::map<std::string, int64_t> faults_injected;

  // True when every expected delivery arrived, each as its installation's own, and nothing else
  // did.
  bool complete() const {
    return gateway.missing == 0 && gateway.unexpected == 0 && gateway.misdirected == 0;
  }
  // complete(), and no delivery arrived twice: what a run without faults must achieve, where
  // nothing is sent again (delivery is at least once only where an answer was lost).
  bool exactly_once() const { return complete() && gateway.duplicates == 0; }
};

// The wire format of GET /_sandbox/report (see docs/sandbox.md).
nlohmann::json to_json(const Report& report);

}  // namespace backhaul::sandbox
