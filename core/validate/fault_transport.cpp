#include "core/validate/fault_transport.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace backhaul::validate {
namespace {

constexpr const char* kJson = "application/json; charset=utf-8";

// Error bodies carry both envelopes: GitHub's {"message": ...} and Vercel's
// {"error": {"code", "message"}}; a connector reads the one it knows.
http::Response json_response(int status, std::string body) {
  http::Response r;
  r.status = status;
  r.headers = {{"content-type", kJson}};
  r.body = std::move(body);
  return r;
}

http::Response text_response(int status, const char* content_type, std::string body) {
  http::Response r;
  r.status = status;
  r.headers = {{"content-type", content_type}};
  r.body = std::move(body);
  return r;
}

http::Response status_response(Fault fault) {
  switch (fault) {
    case Fault::kHttp401:
      return json_response(
          401, R"({"message":"Bad credentials","documentation_url":"https://docs.github.com/rest",)"
               R"("status":"401","error":{"code":"unauthorized","message":"Not authorized"}})");
    case Fault::kRateLimit429: {
      http::Response r = json_response(
          429, R"({"message":"You have exceeded a secondary rate limit. Please wait a few )"
               R"(minutes before you try again.","error":{"code":"too_many_requests",)"
               R"("message":"Rate limit exceeded"}})");
      r.headers.emplace_back("retry-after", std::to_string(FaultTransport::kRetryAfterS));
      return r;
    }
    case Fault::kHttp500:
      return json_response(500,
                           R"({"message":"Server Error","error":{"code":)"
                           R"("internal_server_error","message":"An unexpected error occurred"}})");
    case Fault::kHttp502:
      return text_response(502, "text/html",
                           "<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 "
                           "Bad Gateway</h1></center></body></html>\n");
    case Fault::kHttp404:
      return json_response(404, R"({"message":"Not Found","documentation_url":)"
                                R"("https://docs.github.com/rest","status":"404",)"
                                R"("error":{"code":"not_found","message":"Not Found"}})");
    case Fault::kHttp422:
      return json_response(
          422, R"({"message":"Validation Failed","errors":[{"resource":"Search","field":"q",)"
               R"("code":"invalid"}],"status":"422","error":{"code":"bad_request",)"
               R"("message":"Invalid request"}})");
    case Fault::kTruncatedBody:
      return json_response(200,
                           R"([{"id":1296269,"number":1347,"uid":"dpl_2qK8VbN4xZ","title":"Fou)");
    case Fault::kNonJsonBody:
      return text_response(200, "text/html; charset=utf-8",
                           "<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body><form "
                           "action=\"/login\">Please sign in to continue</form></body></html>\n");
    case Fault::kEmptyBody:
      return json_response(200, "");
    default:
      break;
  }
  return json_response(500, "{}");
}

}  // namespace

std::string_view fault_name(Fault fault) {
  switch (fault) {
    case Fault::kHttp401:
      return "http_401";
    case Fault::kRateLimit403:
      return "rate_limit_403";
    case Fault::kRateLimit429:
      return "rate_limit_429";
    case Fault::kHttp500:
      return "http_500";
    case Fault::kHttp502:
      return "http_502";
    case Fault::kHttp404:
      return "http_404";
    case Fault::kHttp422:
      return "http_422";
    case Fault::kTruncatedBody:
      return "truncated_body";
    case Fault::kNonJsonBody:
      return "non_json_body";
    case Fault::kEmptyBody:
      return "empty_body";
    case Fault::kHugeBody:
      return "huge_body";
    case Fault::kSlowResponse:
      return "slow_response";
    case Fault::kConnectionError:
      return "connection_error";
  }
  return "unknown";
}

std::optional<int64_t> FaultTransport::last_reset_s() const {
  std::lock_guard lock(mutex_);
  return last_reset_s_;
}

http::Response FaultTransport::rate_limited_403(const http::Request&) {
  const int64_t reset_s = clock_.now_ms() / 1000 + kResetAfterS;
  {
    std::lock_guard lock(mutex_);
    last_reset_s_ = reset_s;
  }
  http::Response r = json_response(
      403, R"({"message":"API rate limit exceeded for installation ID 1.","documentation_url":)"
           R"("https://docs.github.com/rest/overview/rate-limits-for-the-rest-api","status":"403",)"
           R"("error":{"code":"rate_limited","message":"Rate limit exceeded"}})");
  r.headers.emplace_back("x-ratelimit-limit", "5000");
  r.headers.emplace_back("x-ratelimit-remaining", "0");
  r.headers.emplace_back("x-ratelimit-reset", std::to_string(reset_s));
  r.headers.emplace_back("x-ratelimit-used", "5000");
  r.headers.emplace_back("x-ratelimit-resource", "core");
  return r;
}

// A valid JSON document of one object whose string member fills 50 MB: parsers must handle it
// (or refuse it) without crashing; a connector may fail on its shape, with a message.
const std::string& FaultTransport::huge_body() {
  std::lock_guard lock(mutex_);
  if (huge_body_.empty()) {
    const std::string head = R"([{"id":1,"number":1,"uid":"dpl_huge","padding":")";
    const std::string tail = R"("}])";
    huge_body_.reserve(kHugeBodyBytes);
    huge_body_ = head;
    huge_body_.append(kHugeBodyBytes - head.size() - tail.size(), 'x');
    huge_body_ += tail;
  }
  return huge_body_;
}

http::Response FaultTransport::perform(const http::Request& request) {
  requests_.fetch_add(1);
  last_request_ms_.store(clock_.now_ms());
  const Fault fault = fault_.load();
  switch (fault) {
    case Fault::kRateLimit403:
      return rate_limited_403(request);
    case Fault::kHugeBody: {
      http::Response r = json_response(200, {});
      r.body = huge_body();
      r.url = request.url;
      return r;
    }
    case Fault::kSlowResponse: {
      const int64_t timeout_ms = request.timeout.count();
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms, 0, kSlowResponseMaxMs)));
      // The host's deadline passed: the plugin's clock agrees that the whole timeout went by.
      clock_.advance_ms(timeout_ms);
      throw http::TransportError(request.method + " " + request.url + ": no response within " +
                                 std::to_string(timeout_ms) + " ms (timed out)");
    }
    case Fault::kConnectionError:
      throw http::TransportError(request.method + " " + request.url +
                                 ": connection refused (injected)");
    default: {
      http::Response r = status_response(fault);
      r.url = request.url;
      return r;
    }
  }
}

}  // namespace backhaul::validate
