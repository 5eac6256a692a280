// Test helpers: a keep-alive HTTP client for a started Sandbox, a fake clock, and shortcuts for
// fetching tokens and parsing GitHub link headers.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <Poco/Net/HTTPClientSession.h>
#include <nlohmann/json.hpp>

namespace backhaul::sandbox::testing {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpResult {
  int status = 0;
  std::multimap<std::string, std::string> headers;  // names in lower case
  std::string body;

  // The first value of header `lower_case_name`, or "" when absent.
  std::string header(const std::string& lower_case_name) const;
  bool has_header(const std::string& lower_case_name) const;
  nlohmann::json json() const { return nlohmann::json::parse(body); }
};

class TestClient {
 public:
  explicit TestClient(uint16_t port);

  HttpResult request(const std::string& method, const std::string& target,
                     const Headers& headers = {}, const std::string& body = "");
  HttpResult get(const std::string& target, const Headers& headers = {}) {
    return request("GET", target, headers);
  }
  HttpResult post(const std::string& target, const std::string& body, const Headers& headers = {}) {
    return request("POST", target, headers, body);
  }
  // GETs an absolute URL (a link header target); it must point at this client's server.
  HttpResult get_url(const std::string& url, const Headers& headers = {});

  // A fresh token from GET /gateway/connections/{connection_id}/token.
  std::string token(const std::string& connection_id);

 private:
  uint16_t port_;
  Poco::Net::HTTPClientSession session_;
};

// GitHub request headers: Bearer token and a User-Agent.
Headers github_headers(const std::string& token);
// Vercel request headers: Bearer token.
Headers vercel_headers(const std::string& token);

// rel -> URL, and the rels in header order.
struct Link {
  std::map<std::string, std::string> urls;
  std::vector<std::string> rels;
};
Link parse_link(const std::string& header);

// A clock for SandboxOptions::now_ms that only moves when told to. [thread-safe]
class FakeClock {
 public:
  explicit FakeClock(int64_t start_ms = 1'800'000'000'000) : now_(start_ms) {}
  std::function<int64_t()> function() {
    return [this] { return now_.load(); };
  }
  int64_t now_ms() const { return now_.load(); }
  void advance_ms(int64_t ms) { now_.fetch_add(ms); }

 private:
  std::atomic<int64_t> now_;
};

// A webhook body as a backfill worker posts it.
nlohmann::json webhook_body(const std::string& connection_id, const std::string& delivery_id,
                            const std::string& event_type = "pull_request");

}  // namespace backhaul::sandbox::testing
