#include "github_client.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backhaul/http_date.hpp"
#include "backhaul/json_depth.hpp"

#include "iso8601.h"

namespace backhaul::github {
namespace {

using nlohmann::json;

constexpr int64_t kDefaultRateLimitWaitMs = 60'000;  // GitHub: "wait at least one minute"
constexpr int64_t kResetMarginMs = 1'000;            // the reset second itself may still be limited
constexpr size_t kMaxMessageChars = 300;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<int64_t> to_int64(std::optional<std::string_view> text) {
  if (!text) return std::nullopt;
  const std::string_view s = trim(*text);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

constexpr int64_t kMaxSeconds = 1'000'000'000'000;  // ~ year 33658 as an epoch time

// Milliseconds of a header holding whole seconds (a delay or an epoch time), or nullopt when it
// is absent, not a number, negative, or too large to be meant (which also rules out overflow).
std::optional<int64_t> seconds_header_ms(const sdk::HttpResponse& response, std::string_view name) {
  const std::optional<int64_t> seconds = to_int64(response.header(name));
  if (!seconds || *seconds < 0 || *seconds > kMaxSeconds) return std::nullopt;
  return *seconds * 1000;
}

// The wait a retry-after value asks for, at GitHub's time `github_now_ms`: whole seconds, a
// fraction of them rounded up (not RFC 9110's form, but read, not refused), or an HTTP-date.
// nullopt when it names no wait (blank, 0, a date already past) or cannot be read; the response
// is a rate limit all the same, and the caller waits its default. Not 0: that is "unknown" to
// the host (status.h), which then retries every second.
std::optional<int64_t> retry_after_wait_ms(std::string_view value, int64_t github_now_ms) {
  value = trim(value);
  if (const std::optional<int64_t> until_ms = sdk::parse_imf_fixdate(value)) {
    if (*until_ms > github_now_ms) return *until_ms - github_now_ms;
    return std::nullopt;
  }
  int64_t seconds = 0;
  size_t i = 0;
  for (; i < value.size() && value[i] >= '0' && value[i] <= '9'; ++i) {
    seconds = seconds * 10 + (value[i] - '0');
    if (seconds > kMaxSeconds) return std::nullopt;
  }
  if (i == 0) return std::nullopt;
  if (i < value.size() && value[i] == '.') {
    const size_t fraction = ++i;
    bool nonzero = false;
    for (; i < value.size() && value[i] >= '0' && value[i] <= '9'; ++i) nonzero |= value[i] != '0';
    if (i == fraction) return std::nullopt;
    if (nonzero) ++seconds;
  }
  if (i != value.size() || seconds == 0 || seconds > kMaxSeconds) return std::nullopt;
  return seconds * 1000;
}

bool contains_icase(std::string_view haystack, std::string_view needle) {
  const auto it = std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(),
                              [](char a, char b) {
                                return std::tolower(static_cast<unsigned char>(a)) ==
                                       std::tolower(static_cast<unsigned char>(b));
                              });
  return it != haystack.end();
}

// A string member of an object, or "" (json::value() would throw on a non-string member).
std::string string_field(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The errors[] of a 422 body, e.g. "Label.color invalid, Issue.title missing_field"; "" if none.
std::string validation_errors(const json& doc) {
  const auto errors = doc.find("errors");
  if (errors == doc.end() || !errors->is_array()) return {};
  std::string details;
  for (const json& e : *errors) {
    if (!e.is_object()) continue;
    if (!details.empty()) details += ", ";
    details += string_field(e, "resource");
    if (const std::string field = string_field(e, "field"); !field.empty()) {
      details += '.';
      details += field;
    }
    if (const std::string code = string_field(e, "code"); !code.empty()) {
      details += ' ';
      details += code;
    }
    if (details.size() > kMaxMessageChars) break;
  }
  return details;
}

// "github: HTTP 404 for GET https://...: Not Found"
std::string describe(int status, std::string_view request, std::string_view message) {
  std::string text = "github: HTTP " + std::to_string(status) + " for " + std::string(request);
  if (!message.empty()) {
    text += ": ";
    text += message;
  }
  return text;
}

// GitHub's wordings of a limit: "API rate limit exceeded for ...", "You have exceeded a secondary
// rate limit", and the older "You have triggered an abuse detection mechanism".
bool names_a_rate_limit(std::string_view message) {
  return contains_icase(message, "rate limit") || contains_icase(message, "secondary rate") ||
         contains_icase(message, "abuse detection");
}

// GitHub's time when it answered: the response's Date (an IMF-fixdate), or `now_ms` (the host's)
// when it has none that can be read, or one more than a day from the host's (a broken proxy's
// year 9999 would put every reset in the past): a skew is minutes, not days.
int64_t github_clock_ms(const sdk::HttpResponse& response, int64_t now_ms) {
  constexpr int64_t kMaxSkewMs = 24LL * 3600 * 1000;
  const std::optional<std::string_view> date = response.header("date");
  const std::optional<int64_t> date_ms = date ? sdk::parse_imf_fixdate(trim(*date)) : std::nullopt;
  if (!date_ms || *date_ms > now_ms + kMaxSkewMs || *date_ms < now_ms - kMaxSkewMs) return now_ms;
  return *date_ms;
}

// Primary, secondary and 429 limits (GitHub docs "Exceeding the rate limit"): wait as long as
// retry-after says, or until an exhausted primary window resets; when both are given, the longer,
// since a secondary limit may outlast the primary window and retrying early under it is what
// GitHub warns can get an integration banned. Else a minute. nullopt: a 403 that is not a rate
// limit (a permission error). Any retry-after makes a limit, even a blank one (octokit: "The
// Retry-After header can sometimes be blank"): a limit read as a permission error fails the unit
// for good, one read the other way costs a minute.
std::optional<int64_t> rate_limit_wait_ms(const sdk::HttpResponse& response,
                                          std::string_view message, int64_t now_ms) {
  // x-ratelimit-reset and an HTTP-date retry-after are GitHub's clock: measured against the
  // response's Date, not a host clock that may be off by minutes (one ahead saw the reset as past
  // and retried a minute early, over and over). Without a readable Date, the host's.
  const int64_t github_now_ms = github_clock_ms(response, now_ms);

  const std::optional<std::string_view> remaining = response.header("x-ratelimit-remaining");
  const bool exhausted = remaining && trim(*remaining) == "0";
  const std::optional<std::string_view> retry_after = response.header("retry-after");
  std::optional<int64_t> wait_ms =
      retry_after ? retry_after_wait_ms(*retry_after, github_now_ms) : std::nullopt;
  if (exhausted) {
    if (const auto reset_ms = seconds_header_ms(response, "x-ratelimit-reset")) {
      wait_ms = std::max(wait_ms.value_or(0),
                         std::max<int64_t>(0, *reset_ms - github_now_ms) + kResetMarginMs);
    }
  }
  if (wait_ms) return wait_ms;
  if (retry_after || exhausted || names_a_rate_limit(message) || response.status() == 429) {
    return kDefaultRateLimitWaitMs;
  }
  return std::nullopt;
}

// 403 "Resource not accessible by integration": x-accepted-github-permissions says what the token
// lacks (";" separates alternatives).
std::string permission_message(const sdk::HttpResponse& response, std::string message) {
  if (const auto needed = response.header("x-accepted-github-permissions")) {
    message += message.empty() ? "" : " ";
    message += "(required permissions: " + std::string(trim(*needed)) + ")";
  }
  return message;
}

}  // namespace

sdk::HttpResponse GithubClient::send(const std::string& url, std::string_view token) const {
  sdk::HttpRequest request;
  request.method = "GET";
  request.url = url;
  request.timeout_ms = config_.timeout_ms;
  request.headers = {
      {"Accept", "application/vnd.github+json"},
      {"Authorization", "Bearer " + std::string(token)},
      {"X-GitHub-Api-Version", "2022-11-28"},
      {"User-Agent", config_.user_agent},
  };
  try {
    return sdk::Host::http(request);
  } catch (const sdk::HostError& e) {
    throw sdk::Error(e.status(), "github: GET " + url + " failed: " + e.what());
  }
}

sdk::HttpResponse GithubClient::get(const std::string& url, std::string_view token,
                                    std::initializer_list<int> also) const {
  sdk::HttpResponse response = send(url, token);
  const int status = response.status();
  if ((status >= 200 && status < 300) || std::find(also.begin(), also.end(), status) != also.end())
    return response;
  throw error_for_response(response, "GET " + url, sdk::Host::now_ms(), token);
}

std::optional<sdk::RateLimit> rate_limit_of(const sdk::HttpResponse& response, int64_t now_ms) {
  const auto remaining = to_int64(response.header("x-ratelimit-remaining"));
  const auto limit = to_int64(response.header("x-ratelimit-limit"));
  const auto reset_ms = seconds_header_ms(response, "x-ratelimit-reset");
  if (!remaining || !limit || !reset_ms) return std::nullopt;
  // The reset on the host's clock, which the host compares it with: as far after `now_ms` as it
  // is after the response's Date. A host clock ahead of GitHub's saw a reset as past, and went on
  // past the rate-limit floor (E2) into the limit.
  const int64_t github_now_ms = github_clock_ms(response, now_ms);
  return sdk::RateLimit{*remaining, *limit, *reset_ms - github_now_ms + now_ms};
}

sdk::Error error_for_response(const sdk::HttpResponse& response, std::string_view request,
                              int64_t now_ms, std::string_view token) {
  const int status = response.status();
  // The token out of the body before its message is cut to length: one echoed across the cut
  // would leave its first part in, which no later redaction of the whole token finds.
  std::string message = github_message(sdk::redact_secret(std::string(response.body()), token));

  if (status == 401) {
    return sdk::Error(BACKHAUL_AUTH_EXPIRED, describe(status, request, message));
  }
  if (status == 403 || status == 429) {
    if (const auto wait_ms = rate_limit_wait_ms(response, message, now_ms)) {
      return sdk::Error(BACKHAUL_RATE_LIMITED,
                        describe(status, request, message) + " (rate limited, retry in " +
                            std::to_string(*wait_ms) + " ms)",
                        *wait_ms);
    }
    return sdk::Error(BACKHAUL_FATAL,
                      describe(status, request, permission_message(response, std::move(message))));
  }
  // 408 Request Timeout and 425 Too Early (RFC 8470) ask for the same request again, later.
  if (status == 408 || status == 425) {
    return sdk::Error(BACKHAUL_RETRYABLE, describe(status, request, message));
  }
  if (status >= 400 && status < 500) {
    return sdk::Error(BACKHAUL_FATAL, describe(status, request, message));
  }
  if (status >= 300 && status < 400) {
    // The host follows redirects; one still here means the host's redirect limit was hit.
    return sdk::Error(BACKHAUL_RETRYABLE,
                      describe(status, request, "redirect not followed by the host"));
  }
  return sdk::Error(BACKHAUL_RETRYABLE, describe(status, request, message));
}

std::string github_message(std::string_view body) {
  if (sdk::json_depth(body) > sdk::kMaxJsonDepth) return {};
  const json doc = json::parse(body.data(), body.data() + body.size(), nullptr,
                               /*allow_exceptions=*/false);
  if (!doc.is_object()) return {};
  const auto it = doc.find("message");
  if (it == doc.end() || !it->is_string()) return {};
  std::string message = it->get<std::string>();
  for (char& c : message) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  if (message.size() > kMaxMessageChars) {
    message.resize(kMaxMessageChars);
    message += "...";
  }

  // 422 "Validation Failed" says what failed only in errors[].
  if (const std::string details = validation_errors(doc); !details.empty()) {
    message += " (" + details + ")";
  }
  return message;
}

}  // namespace backhaul::github
