#include "vercel_connector.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backhaul/connector.hpp"
#include "backhaul/host.hpp"
#include "backhaul/http_date.hpp"
#include "backhaul/json_depth.hpp"

namespace backhaul::vercel {
namespace {

using nlohmann::json;
// Response bodies are read (and re-emitted as "raw") in the order Vercel sent their keys.
using ordered_json = nlohmann::ordered_json;
using sdk::Error;

constexpr std::string_view kEntityType = "deployment";
constexpr std::string_view kUserAgent = "backhaul-vercel/1.0";
constexpr int64_t kDefaultRetryAfterMs = 60'000;    // Vercel's rate-limit buckets are one minute
constexpr int64_t kResetMarginMs = 1'000;           // the reset second itself may still be limited
constexpr int64_t kMaxSkewMs = 24LL * 3600 * 1000;  // a clock further off than this is broken
constexpr int64_t kMaxEpochSeconds = 1'000'000'000'000;  // ~ year 33658
constexpr size_t kMaxQuotedLength = 200;                 // of provider text quoted in messages
constexpr size_t kMaxUidLength = 128;

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

[[noreturn]] void invalid_argument(const std::string& message) {
  throw Error(BACKHAUL_INVALID_ARGUMENT, message);
}

// A malformed 2xx answer: most likely a truncated or proxied response, so worth another attempt.
[[noreturn]] void malformed_response(const std::string& detail) {
  throw Error(BACKHAUL_RETRYABLE, "vercel: list deployments: malformed response: " + detail);
}

// `text` cut to a length fit for an error message.
std::string clip(std::string_view text) {
  if (text.size() <= kMaxQuotedLength) return std::string(text);
  return std::string(text.substr(0, kMaxQuotedLength)) + "...";
}

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ascii_alnum(char c) {
  return is_ascii_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

// A non-negative decimal integer made of digits only (no sign, no spaces), or nullopt.
std::optional<int64_t> parse_decimal(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (!is_ascii_digit(c)) return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(value);
}

int64_t seconds_to_ms(int64_t seconds) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max() / 1000;
  return seconds > kMax ? std::numeric_limits<int64_t>::max() : seconds * 1000;
}

// A JSON number with an integral value that fits int64_t, or nullopt.
std::optional<int64_t> json_int(const ordered_json& value) {
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double d = value.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18)
      return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

// object[key] when it is a string, else JSON null.
ordered_json string_or_null(const ordered_json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? *it : ordered_json(nullptr);
}

std::string string_or_empty(const json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Percent-encodes everything but RFC 3986 unreserved characters.
std::string url_encode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (is_ascii_alnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += c;
    } else {
      const auto byte = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 0x0F];
    }
  }
  return out;
}

void append_param(std::string& url, std::string_view name, std::string_view value) {
  url += url.find('?') == std::string::npos ? '?' : '&';
  url += name;
  url += '=';
  url += url_encode(value);
}

// Runs `fn`, rethrowing any sdk::Error with the token scrubbed from its message.
template <class Fn>
auto with_token_redacted(std::string_view token, Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    throw Error(e.status(), sdk::redact_secret(e.what(), token), e.retry_after_ms());
  }
}

// ---------------------------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------------------------

json parse_config_document(std::string_view text) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) return json::object();
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) invalid_argument("vercel config: not valid JSON");
  if (!doc.is_object()) invalid_argument("vercel config: must be a JSON object");
  return doc;
}

// Accepts an absolute http(s) URL without query or fragment; drops trailing slashes.
std::string parse_base_url(const json& value) {
  if (!value.is_string()) invalid_argument("vercel config: base_url must be a string");
  std::string url = value.get<std::string>();
  while (!url.empty() && url.back() == '/') url.pop_back();
  size_t scheme_length = 0;
  if (url.rfind("https://", 0) == 0) scheme_length = 8;
  if (url.rfind("http://", 0) == 0) scheme_length = 7;
  const bool has_host = scheme_length != 0 && url.size() > scheme_length;
  if (!has_host || url.find_first_of("?# \t\r\n") != std::string::npos) {
    invalid_argument(
        "vercel config: base_url must be an absolute http:// or https:// URL "
        "without query or fragment");
  }
  return url;
}

std::string parse_team_id(const json& value) {
  if (!value.is_string()) invalid_argument("vercel config: team_id must be a string");
  std::string team_id = value.get<std::string>();
  if (team_id.empty()) invalid_argument("vercel config: team_id must not be empty");
  return team_id;
}

int64_t parse_integer(const std::string& key, const json& value, int64_t min, int64_t max) {
  if (!value.is_number_integer()) invalid_argument("vercel config: " + key + " must be an integer");
  // An unsigned value may be beyond int64_t; compare it as unsigned first.
  const bool fits = !value.is_number_unsigned() || value.get<uint64_t>() <= uint64_t(max);
  if (!fits || value.get<int64_t>() < min || value.get<int64_t>() > max) {
    invalid_argument("vercel config: " + key + " must be between " + std::to_string(min) + " and " +
                     std::to_string(max));
  }
  return value.get<int64_t>();
}

// ---------------------------------------------------------------------------------------------
// Cursor
//
// Vercel pages by a millisecond timestamp: pagination.next is the `created` of the last
// deployment on the page, and the next request repeats the first with until=<next>, "created
// before". Deployments created in the same millisecond can straddle a page edge: if `until` is
// strictly "before", those that did not fit on the page are skipped; if it is inclusive, those
// that did fit come back again (API-FACTS B3).
//
// Rationale: the cursor carries, besides the timestamp, the uids already read at that boundary
// millisecond: "1780410058066" or "1780410058066:dpl_a,dpl_b". When uids are carried, the next
// request asks for until=<ts + 1>, so under the documented "created before" every deployment of
// the boundary millisecond is fetched again, and the carried uids are skipped. Nothing is lost,
// nothing is emitted twice (uids repeated within one page are dropped too), and the cursor alone
// (the host's checkpoint) resumes the walk in a fresh instance. The uids are sorted, so one
// position always has one cursor. As pagination.next is the last deployment's `created`, uids are
// carried on nearly every page: the price is one deployment fetched twice per page. The bare form
// remains for a `next` that matches no deployment on the page.
//
// Should more deployments share one millisecond than one page holds, re-fetching cannot reach
// past them; the cursor then falls back to until=<ts> (with a warning), which may skip some of
// them but always terminates.
// ---------------------------------------------------------------------------------------------

// Vercel's uids are "dpl_" + base62. Anything else cannot safely go into a cursor or delivery id.
bool is_valid_uid(std::string_view uid) {
  if (uid.empty() || uid.size() > kMaxUidLength) return false;
  for (char c : uid) {
    if (!is_ascii_alnum(c) && c != '_' && c != '-') return false;
  }
  return true;
}

[[noreturn]] void invalid_cursor(std::string_view text) {
  invalid_argument("vercel: invalid cursor \"" + clip(text) +
                   "\" (expected a decimal millisecond timestamp, optionally followed by \":\" "
                   "and comma-separated deployment uids)");
}

struct Cursor {
  int64_t timestamp_ms = 0;
  std::vector<std::string> boundary_uids;  // sorted, unique; already read at timestamp_ms

  // The `until` query value that continues from here.
  int64_t until() const { return boundary_uids.empty() ? timestamp_ms : timestamp_ms + 1; }

  // True when continuing from this cursor gets further than continuing from `previous`: an
  // earlier `until`, or the same `until` with more boundary deployments already read.
  bool advances_from(const Cursor& previous) const {
    if (until() != previous.until()) return until() < previous.until();
    return boundary_uids.size() > previous.boundary_uids.size();
  }

  std::string to_string() const {
    std::string text = std::to_string(timestamp_ms);
    for (size_t i = 0; i < boundary_uids.size(); ++i) {
      text += i == 0 ? ':' : ',';
      text += boundary_uids[i];
    }
    return text;
  }

  // Throws INVALID_ARGUMENT for anything that to_string() cannot have produced.
  static Cursor parse(std::string_view text) {
    const size_t colon = text.find(':');
    const std::optional<int64_t> timestamp = parse_decimal(text.substr(0, colon));
    if (!timestamp) invalid_cursor(text);
    Cursor cursor{*timestamp, {}};
    if (colon == std::string_view::npos) return cursor;
    if (*timestamp == std::numeric_limits<int64_t>::max()) invalid_cursor(text);
    std::set<std::string> uids;
    std::string_view rest = text.substr(colon + 1);
    while (true) {
      const size_t comma = rest.find(',');
      const std::string_view uid = rest.substr(0, comma);
      if (!is_valid_uid(uid)) invalid_cursor(text);
      uids.emplace(uid);
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    cursor.boundary_uids.assign(uids.begin(), uids.end());
    return cursor;
  }
};

// ---------------------------------------------------------------------------------------------
// HTTP and status mapping
// ---------------------------------------------------------------------------------------------

// Performs a GET through the host. A HostError (no response at all) keeps the host's status,
// which is RETRYABLE for connection errors and timeouts.
sdk::HttpResponse http_get(const VercelConfig& config, std::string url, std::string_view token,
                           std::string_view what) {
  sdk::HttpRequest request;
  request.method = "GET";
  request.url = std::move(url);
  request.headers = {{"Authorization", "Bearer " + std::string(token)},
                     {"Accept", "application/json"},
                     {"User-Agent", std::string(kUserAgent)}};
  request.timeout_ms = config.timeout_ms;
  try {
    return sdk::Host::http(request);
  } catch (const sdk::HostError& e) {
    throw Error(e.status(), "vercel: " + std::string(what) + ": request failed: " + e.what());
  }
}

bool is_success(int status) { return status >= 200 && status < 300; }

std::optional<int64_t> header_int(const sdk::HttpResponse& response, std::string_view name) {
  std::optional<std::string_view> value = response.header(name);
  if (!value) return std::nullopt;
  const size_t first = value->find_first_not_of(" \t");
  if (first == std::string_view::npos) return std::nullopt;
  const size_t last = value->find_last_not_of(" \t");
  return parse_decimal(value->substr(first, last - first + 1));
}

// Vercel's time when it answered: the response's Date, or `now_ms` (the host's) when it has none
// that can be read, or one more than a day from the host's (a broken proxy's year 9999 would put
// every reset in the past): a skew is minutes, not days.
int64_t vercel_clock_ms(const sdk::HttpResponse& response, int64_t now_ms) {
  const std::optional<std::string_view> date = response.header("date");
  const std::optional<int64_t> date_ms = date ? sdk::parse_imf_fixdate(*date) : std::nullopt;
  if (!date_ms || *date_ms > now_ms + kMaxSkewMs || *date_ms < now_ms - kMaxSkewMs) return now_ms;
  return *date_ms;
}

// x-ratelimit-reset in milliseconds on Vercel's clock, or nullopt when absent or not a number. One
// beyond any clock (milliseconds sent as seconds, say) is held to ~ year 33658, so that moving it
// by the skew cannot overflow, and it is still waited for as long as the host waits at most.
std::optional<int64_t> reset_header_ms(const sdk::HttpResponse& response) {
  const std::optional<int64_t> seconds = header_int(response, "x-ratelimit-reset");
  if (!seconds) return std::nullopt;
  return std::min(*seconds, kMaxEpochSeconds) * 1000;
}

// x-ratelimit-* as Vercel sends them on every response. The reset, epoch seconds by Vercel's
// clock, is put on the host's (`now_ms`), which the host compares it with: as far after `now_ms`
// as it is after the response's Date. Read as it was, a host clock ahead of Vercel's saw a reset
// as past, and went on past the rate-limit floor (E2) into the limit.
std::optional<sdk::RateLimit> read_rate_limit(const sdk::HttpResponse& response, int64_t now_ms) {
  const std::optional<int64_t> remaining = header_int(response, "x-ratelimit-remaining");
  const std::optional<int64_t> limit = header_int(response, "x-ratelimit-limit");
  if (!remaining || !limit) return std::nullopt;
  const std::optional<int64_t> reset_ms = reset_header_ms(response);
  const int64_t host_reset_ms =
      reset_ms ? *reset_ms - vercel_clock_ms(response, now_ms) + now_ms : 0;
  return sdk::RateLimit{*remaining, *limit, host_reset_ms};
}

// The wait the retry-after header asks for, at Vercel's time `vercel_now_ms`: whole seconds, a
// fraction of them rounded up (not RFC 9110's form, but read, not refused), or an HTTP-date.
// nullopt when there is none, or it names no wait (blank, 0, a date already past) or cannot be
// read: the caller then waits as if it were absent. Not 0, which is "unknown" to the host.
std::optional<int64_t> retry_after_header_ms(const sdk::HttpResponse& response,
                                             int64_t vercel_now_ms) {
  std::optional<std::string_view> header = response.header("retry-after");
  if (!header) return std::nullopt;
  std::string_view value = *header;
  const size_t first = value.find_first_not_of(" \t");
  if (first == std::string_view::npos) return std::nullopt;
  value = value.substr(first, value.find_last_not_of(" \t") - first + 1);
  if (const std::optional<int64_t> until_ms = sdk::parse_imf_fixdate(value)) {
    if (*until_ms > vercel_now_ms) return *until_ms - vercel_now_ms;
    return std::nullopt;
  }
  const size_t point = value.find('.');
  std::optional<int64_t> seconds = parse_decimal(value.substr(0, point));
  if (!seconds) return std::nullopt;
  if (point != std::string_view::npos) {
    const std::string_view fraction = value.substr(point + 1);
    if (fraction.empty() || fraction.find_first_not_of("0123456789") != std::string_view::npos)
      return std::nullopt;
    // Rounded up, but not past the largest number of seconds (an overflow there is undefined).
    const bool whole = fraction.find_first_not_of('0') == std::string_view::npos;
    if (!whole && *seconds < std::numeric_limits<int64_t>::max()) ++*seconds;
  }
  if (*seconds == 0) return std::nullopt;
  return seconds_to_ms(*seconds);
}

// How long to wait after a rate-limited answer: what retry-after asks for, else until
// x-ratelimit-reset and a second more (the reset is a whole second, which may still be limited),
// else one minute. A reset and an HTTP-date are Vercel's clock: measured against the response's
// Date, as a host clock minutes ahead saw them as past and retried every second into the limit.
int64_t retry_after_ms(const sdk::HttpResponse& response) {
  const int64_t vercel_now_ms = vercel_clock_ms(response, sdk::Host::now_ms());
  if (const std::optional<int64_t> wait_ms = retry_after_header_ms(response, vercel_now_ms))
    return *wait_ms;
  if (const std::optional<int64_t> reset_ms = reset_header_ms(response))
    return std::max<int64_t>(0, *reset_ms - vercel_now_ms) + kResetMarginMs;
  return kDefaultRetryAfterMs;
}

// The parts of Vercel's error envelope we read: {"error":{"code","message","invalidToken"}}.
// "Some APIs wrongly return `err` instead of `error`", so both are accepted.
struct ProviderError {
  std::string code;
  std::string message;
  bool invalid_token = false;
};

// The error in `body`, with `token` taken out before anything of it is read and cut to length:
// a token echoed across the cut would leave its first part in, which no later redaction of the
// whole token finds.
ProviderError read_provider_error(std::string_view body, std::string_view token) {
  ProviderError error;
  if (sdk::json_depth(body) > sdk::kMaxJsonDepth) return error;
  const json doc = json::parse(sdk::redact_secret(std::string(body), token), nullptr,
                               /*allow_exceptions=*/false);
  if (!doc.is_object()) return error;
  for (const char* key : {"error", "err"}) {
    const auto it = doc.find(key);
    if (it == doc.end()) continue;
    if (it->is_string()) error.message = it->get<std::string>();
    if (!it->is_object()) break;
    error.code = string_or_empty(*it, "code");
    error.message = string_or_empty(*it, "message");
    const auto invalid_token = it->find("invalidToken");
    error.invalid_token = invalid_token != it->end() && *invalid_token == true;
    break;
  }
  return error;
}

// "HTTP 404 not_found: Not Found"
std::string http_detail(int status, const ProviderError& error) {
  std::string detail = "HTTP " + std::to_string(status);
  if (!error.code.empty()) detail += " " + clip(error.code);
  if (!error.message.empty()) detail += ": " + clip(error.message);
  return detail;
}

// "vercel: list deployments returned HTTP 404 not_found: Not Found"
std::string describe_failure(std::string_view what, int status, const ProviderError& error) {
  return "vercel: " + std::string(what) + " returned " + http_detail(status, error);
}

// Vercel reports a bad token as 403 with invalidToken (not 401). A 403 that carries an exhausted
// rate limit or a retry-after is treated as a rate limit, like every other connector (SPEC C1/C2).
[[noreturn]] void throw_for_403(const sdk::HttpResponse& response, const ProviderError& provider,
                                const std::string& message) {
  if (provider.invalid_token) throw Error(BACKHAUL_AUTH_EXPIRED, message);
  const bool exhausted = header_int(response, "x-ratelimit-remaining") == int64_t{0};
  if (exhausted || response.header("retry-after"))
    throw Error(BACKHAUL_RATE_LIMITED, message, retry_after_ms(response));
  throw Error(BACKHAUL_FATAL,
              message + " (the token is valid but lacks access to this project or team)");
}

// Maps a non-2xx answer to the status the host acts on.
[[noreturn]] void throw_for_status(const sdk::HttpResponse& response, std::string_view what,
                                   std::string_view token) {
  const int status = response.status();
  const ProviderError provider = read_provider_error(response.body(), token);
  const std::string message = describe_failure(what, status, provider);
  if (status == 401) throw Error(BACKHAUL_AUTH_EXPIRED, message);
  if (status == 403) throw_for_403(response, provider, message);
  if (status == 429) throw Error(BACKHAUL_RATE_LIMITED, message, retry_after_ms(response));
  // 408 Request Timeout and 425 Too Early ask for the request again (RFC 9110 15.5.9, RFC 8470),
  // as a 5xx does; read as "the request is wrong", they failed the unit for good.
  if (status >= 500 || status == 408 || status == 425) {
    const int64_t vercel_now_ms = vercel_clock_ms(response, sdk::Host::now_ms());
    throw Error(BACKHAUL_RETRYABLE, message,
                retry_after_header_ms(response, vercel_now_ms).value_or(0));
  }
  // 404, 410, 422 and every other 4xx: the request itself is wrong; retrying cannot help.
  if (status >= 400) throw Error(BACKHAUL_FATAL, message);
  // The host follows up to 5 redirects; a redirect that reaches us is a loop.
  if (status >= 300) throw Error(BACKHAUL_FATAL, message + " (too many redirects)");
  throw Error(BACKHAUL_RETRYABLE, message);
}

// ---------------------------------------------------------------------------------------------
// The deployment list
// ---------------------------------------------------------------------------------------------

struct Deployment {
  std::string uid;
  int64_t created = 0;                 // ms since the epoch
  const ordered_json* item = nullptr;  // the list item, inside DeploymentList::doc
};

// A GET /v6/deployments answer. Not copyable: `deployments` point into `doc`.
struct DeploymentList {
  ordered_json doc;
  std::vector<Deployment> deployments;  // in page order (newest first)
  std::optional<int64_t> next;          // pagination.next; nullopt: this is the last page

  DeploymentList() = default;
  DeploymentList(const DeploymentList&) = delete;
  DeploymentList& operator=(const DeploymentList&) = delete;
};

// A deployment of a well-formed page that cannot be read: Vercel would send it again as it is, so
// retrying cannot help (RETRYABLE burnt every attempt of the unit). `where` names it by its place
// in the page.
[[noreturn]] void bad_deployment(const std::string& where, const std::string& problem) {
  throw Error(BACKHAUL_FATAL, "vercel: list deployments: " + where + " " + problem);
}

Deployment read_deployment(const ordered_json& item, size_t index) {
  const std::string where = "deployment #" + std::to_string(index) + " of the page";
  if (!item.is_object())
    bad_deployment(where, "is a " + std::string(item.type_name()) + ", not an object");
  const auto uid = item.find("uid");
  if (uid == item.end() || !uid->is_string() || !is_valid_uid(uid->get<std::string>())) {
    const std::string found =
        uid == item.end() ? "none"
                          : clip(uid->dump(-1, ' ', false, ordered_json::error_handler_t::replace));
    bad_deployment(where, "has no valid uid (found: " + found + ")");
  }
  // `created` is the documented sort key; `createdAt` is the same instant in newer responses.
  std::optional<int64_t> created;
  for (const char* key : {"created", "createdAt"}) {
    const auto it = item.find(key);
    if (!created && it != item.end()) created = json_int(*it);
  }
  if (!created) bad_deployment(where, "(" + uid->get<std::string>() + ") has no created time");
  // The cursor continues from created + 1 (Cursor::until), which must be a number too.
  if (*created == std::numeric_limits<int64_t>::max())
    bad_deployment(where, "(" + uid->get<std::string>() + ") has no created time it could have");
  return {uid->get<std::string>(), *created, &item};
}

// pagination.next, or nullopt when pagination or next is missing, null or 0 (the last page; the
// Vercel CLI pages `while (next)`).
std::optional<int64_t> read_next(const ordered_json& doc) {
  const auto pagination = doc.find("pagination");
  if (pagination == doc.end() || pagination->is_null()) return std::nullopt;
  if (!pagination->is_object()) malformed_response("pagination is not an object");
  const auto next = pagination->find("next");
  if (next == pagination->end() || next->is_null()) return std::nullopt;
  const std::optional<int64_t> value = json_int(*next);
  if (!value || *value < 0 || *value == std::numeric_limits<int64_t>::max())
    malformed_response("pagination.next is not a timestamp");
  if (*value == 0) return std::nullopt;
  return value;
}

// Which element of the top-level "deployments" array the parser was in when `body` stopped
// parsing: the last one begun if it is an object or array not yet closed, else the next one.
// nullopt when it stopped outside that array.
std::optional<size_t> failing_deployment_index(std::string_view body) {
  size_t begun = 0;
  bool open = false;
  bool in_deployments = false;
  // Depth 0: the body's object; 1: its keys and values; 2: the elements of those values.
  const ordered_json::parser_callback_t count = [&](int depth, ordered_json::parse_event_t event,
                                                    ordered_json& parsed) {
    if (depth == 1 && event == ordered_json::parse_event_t::key) {
      in_deployments = parsed == "deployments";
    } else if (depth == 1 && event != ordered_json::parse_event_t::object_start &&
               event != ordered_json::parse_event_t::array_start) {
      in_deployments = false;  // the list is over: what fails after it is elsewhere in the page
    } else if (depth == 2 && in_deployments) {
      switch (event) {
        case ordered_json::parse_event_t::object_start:
        case ordered_json::parse_event_t::array_start:
          ++begun;
          open = true;
          break;
        case ordered_json::parse_event_t::object_end:
        case ordered_json::parse_event_t::array_end:
          open = false;
          break;
        case ordered_json::parse_event_t::value:  // a string, number, ... element, once read
          ++begun;
          break;
        case ordered_json::parse_event_t::key:
          break;
      }
    }
    return true;
  };
  const ordered_json discarded = ordered_json::parse(body, count, /*allow_exceptions=*/false);
  if (!in_deployments) return std::nullopt;
  return open ? begun - 1 : begun;
}

// The body parsed. What another attempt may mend is RETRYABLE: a body cut short (the parser ran
// out of input: the transfer's fault) or garbled. A lone surrogate escape ("\ud83d", a text cut
// inside an emoji) in a body that is all there is Vercel's text, sent again as it is: FATAL,
// naming the deployment it is in. Retrying it burnt every attempt of the unit.
ordered_json parse_body(std::string_view body) {
  try {
    return ordered_json::parse(body);
  } catch (const ordered_json::parse_error& e) {
    // e.byte is past the end of the body when the parser ran out of input, wherever the cut.
    const bool cut_short = e.byte > body.size();
    if (!cut_short && std::string_view(e.what()).find("surrogate") != std::string_view::npos) {
      const std::optional<size_t> index = failing_deployment_index(body);
      bad_deployment(index ? "deployment #" + std::to_string(*index) + " of the page" : "the page",
                     std::string("has a lone surrogate escape in a string: ") + e.what());
    }
  }
  malformed_response("body is not JSON (" + std::to_string(body.size()) + " bytes)");
}

void parse_deployment_list(std::string_view body, DeploymentList& list) {
  if (sdk::json_depth(body) > sdk::kMaxJsonDepth)
    malformed_response("nested more than " + std::to_string(sdk::kMaxJsonDepth) + " levels deep");
  list.doc = parse_body(body);
  if (!list.doc.is_object()) malformed_response("body is not a JSON object");
  const auto items = list.doc.find("deployments");
  if (items == list.doc.end() || !items->is_array()) malformed_response("no deployments array");
  const ordered_json& array = *items;
  list.deployments.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i)
    list.deployments.push_back(read_deployment(array[i], i));
  list.next = read_next(list.doc);
}

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

// readyState (or the older `state`) as a Vercel webhook event type. States that are not final yet
// (BUILDING, QUEUED, INITIALIZING), unknown ones and a missing state read as "created".
std::string event_type_for(const ordered_json& item) {
  std::string state;
  for (const char* key : {"readyState", "state"}) {
    const auto it = item.find(key);
    if (it != item.end() && it->is_string()) {
      state = it->get<std::string>();
      break;
    }
  }
  if (state == "READY") return "deployment.succeeded";
  if (state == "ERROR") return "deployment.error";
  if (state == "CANCELED") return "deployment.canceled";
  return "deployment.created";
}

// payload.links as Vercel webhooks carry them. The inspector URL is the deployment's page,
// https://vercel.com/{team}/{project}/{id}; the project's page is that without the last segment
// (inference from recorded inspectorUrl values).
std::optional<ordered_json> links_of(const ordered_json& item) {
  const auto inspector = item.find("inspectorUrl");
  if (inspector == item.end() || !inspector->is_string()) return std::nullopt;
  const std::string url = inspector->get<std::string>();
  ordered_json links = {{"deployment", url}};
  const size_t scheme_end = url.find("://");
  const size_t last_slash = url.rfind('/');
  if (scheme_end != std::string::npos && last_slash > scheme_end + 3)
    links["project"] = url.substr(0, last_slash);
  return links;
}

ordered_json deployment_payload(const sdk::Unit& unit, const VercelConfig& config,
                                const Deployment& deployment) {
  const ordered_json& item = *deployment.item;
  const auto meta = item.find("meta");
  ordered_json payload;
  payload["deployment"] = {
      {"id", deployment.uid},
      {"name", string_or_null(item, "name")},
      {"url", string_or_null(item, "url")},
      {"meta", meta != item.end() && meta->is_object() ? *meta : ordered_json::object()},
      {"inspectorUrl", string_or_null(item, "inspectorUrl")}};
  const ordered_json project_id = string_or_null(item, "projectId");
  payload["project"] = {
      {"id", project_id.is_string() ? project_id : ordered_json(std::string(unit.resource_id))}};
  payload["team"] = {
      {"id", config.team_id ? ordered_json(*config.team_id) : ordered_json(nullptr)}};
  const auto creator = item.find("creator");
  if (creator != item.end() && creator->is_object()) {
    const ordered_json user_id = string_or_null(*creator, "uid");
    if (user_id.is_string()) payload["user"] = {{"id", user_id}};
  }
  payload["target"] = string_or_null(item, "target");
  if (std::optional<ordered_json> links = links_of(item)) payload["links"] = std::move(*links);
  return payload;
}

// One webhook-shaped event: {type, id, createdAt, payload, raw}.
sdk::Event make_event(const sdk::Unit& unit, const VercelConfig& config,
                      const Deployment& deployment) {
  std::string type = event_type_for(*deployment.item);
  std::string delivery_id = "backfill-" + std::string(unit.installation_id) + "-" +
                            std::string(unit.resource_id) + "-deploy-" + deployment.uid;
  const ordered_json event = {{"type", type},
                              {"id", delivery_id},
                              {"createdAt", deployment.created},
                              {"payload", deployment_payload(unit, config, deployment)},
                              {"raw", *deployment.item}};
  // The parser already rejected invalid UTF-8; `replace` only guarantees dump() cannot throw.
  std::string payload_json = event.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  return {std::move(delivery_id), std::move(type), std::move(payload_json)};
}

// ---------------------------------------------------------------------------------------------
// Pagination
// ---------------------------------------------------------------------------------------------

// The cursor after a page whose pagination.next is `next_ms`: the uids of the page's deployments
// created at `next_ms`, plus those the previous cursor carried for the same millisecond.
Cursor boundary_cursor(int64_t next_ms, const std::vector<Deployment>& page,
                       const std::optional<Cursor>& previous) {
  std::set<std::string> uids;
  for (const Deployment& deployment : page) {
    if (deployment.created == next_ms) uids.insert(deployment.uid);
  }
  if (previous && previous->timestamp_ms == next_ms)
    uids.insert(previous->boundary_uids.begin(), previous->boundary_uids.end());
  return Cursor{next_ms, std::vector<std::string>(uids.begin(), uids.end())};
}

// Called when `cursor` does not get past `previous`. That happens when a whole page is made of
// deployments of one millisecond: move on before that millisecond. Anything else is the API not
// advancing, which a retry cannot fix: fail rather than loop.
Cursor unstick(const Cursor& cursor, const Cursor& previous) {
  const Cursor before{cursor.timestamp_ms, {}};
  if (!cursor.boundary_uids.empty() && before.advances_from(previous)) {
    sdk::Host::log(BACKHAUL_LOG_WARN, "vercel: a whole page of deployments shares millisecond " +
                                          std::to_string(cursor.timestamp_ms) +
                                          "; continuing before it (any more deployments of that "
                                          "millisecond cannot be reached through until)");
    return before;
  }
  throw Error(BACKHAUL_FATAL, "vercel: list deployments: pagination.next " +
                                  std::to_string(cursor.timestamp_ms) +
                                  " does not move past until=" + std::to_string(previous.until()));
}

// The cursor of the page after this one, or nullopt when this page was the last.
std::optional<std::string> next_cursor(const DeploymentList& list,
                                       const std::optional<Cursor>& previous, int64_t since_ms) {
  if (!list.next) return std::nullopt;
  Cursor cursor = boundary_cursor(*list.next, list.deployments, previous);
  if (previous && !cursor.advances_from(*previous)) cursor = unstick(cursor, *previous);
  // Newest first: once `until` is at or before `since`, every deployment left is too old.
  if (since_ms > 0 && cursor.until() <= since_ms) return std::nullopt;
  return cursor.to_string();
}

std::string deployments_url(const VercelConfig& config, const sdk::FetchRequest& request,
                            const std::optional<Cursor>& cursor) {
  std::string url = config.base_url + "/v6/deployments";
  append_param(url, "projectId", request.unit.resource_id);
  append_param(url, "limit", std::to_string(config.limit));
  // Vercel's `since` keeps deployments created strictly after it, the SDK's `since` those at or
  // after it: ask from one millisecond earlier.
  if (request.since_unix_ms > 0) {
    append_param(url, "since", std::to_string(request.since_unix_ms - 1));
  }
  if (config.team_id) append_param(url, "teamId", *config.team_id);
  if (cursor) append_param(url, "until", std::to_string(cursor->until()));
  return url;
}

void check_unit(const sdk::Unit& unit) {
  if (unit.resource_id.empty())
    invalid_argument("vercel: the unit has no resource id (expected a Vercel project id)");
}

// GET /v9/projects/{idOrName} takes a project's name too. A unit that names its project so would
// build its delivery ids from the name, and a rename would deliver every deployment again under
// new ids: it is refused, naming the id to give. An answer without an id says nothing of it.
void check_project_id(const sdk::Unit& unit, std::string_view body) {
  if (sdk::json_depth(body) > sdk::kMaxJsonDepth) return;
  const json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return;
  const auto id = doc.find("id");
  if (id == doc.end() || !id->is_string() || *id == unit.resource_id) return;
  throw Error(BACKHAUL_FATAL, "vercel: resource \"" + clip(unit.resource_id) +
                                  "\" is the name of project " + clip(id->get<std::string>()) +
                                  ": give the project's id (delivery ids are built from it, and a "
                                  "project's name can change)");
}

void check_entity_type(std::string_view entity_type) {
  if (entity_type != kEntityType) {
    invalid_argument("vercel: unknown entity type \"" + clip(entity_type) +
                     "\" (supported: deployment)");
  }
}

sdk::Page fetch_deployments(const VercelConfig& config, const sdk::FetchRequest& request) {
  check_entity_type(request.entity_type);
  check_unit(request.unit);
  std::optional<Cursor> cursor;
  if (request.cursor) cursor = Cursor::parse(*request.cursor);

  const sdk::HttpResponse response = http_get(config, deployments_url(config, request, cursor),
                                              request.unit.access_token, "list deployments");
  if (!is_success(response.status()))
    throw_for_status(response, "list deployments", request.unit.access_token);
  DeploymentList list;
  parse_deployment_list(response.body(), list);

  sdk::Page page;
  page.raw_count = list.deployments.size();
  page.rate_limit = read_rate_limit(response, sdk::Host::now_ms());
  // Skips the boundary deployments the cursor says were read already, and repeats within a page.
  std::set<std::string_view> seen;
  if (cursor) seen.insert(cursor->boundary_uids.begin(), cursor->boundary_uids.end());
  for (const Deployment& deployment : list.deployments) {
    if (!seen.insert(deployment.uid).second) continue;
    if (request.since_unix_ms > 0 && deployment.created < request.since_unix_ms) continue;
    page.events.push_back(make_event(request.unit, config, deployment));
  }
  page.next_cursor = next_cursor(list, cursor, request.since_unix_ms);
  return page;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// VercelConfig and VercelConnector
// ---------------------------------------------------------------------------------------------

VercelConfig VercelConfig::parse(std::string_view config_json) {
  const json doc = parse_config_document(config_json);
  VercelConfig config;
  for (const auto& [key, value] : doc.items()) {
    if (key == "base_url") {
      config.base_url = parse_base_url(value);
    } else if (key == "team_id") {
      config.team_id = parse_team_id(value);
    } else if (key == "limit") {
      config.limit = static_cast<int>(parse_integer(key, value, 1, 100));
    } else if (key == "timeout_ms") {
      config.timeout_ms = static_cast<uint32_t>(parse_integer(key, value, 1, 600'000));
    } else {
      invalid_argument("vercel config: unknown key \"" + clip(key) +
                       "\" (known: base_url, team_id, limit, timeout_ms)");
    }
  }
  return config;
}

void VercelConnector::validate_config(std::string_view config_json) {
  (void)VercelConfig::parse(config_json);
}

VercelConnector::VercelConnector(std::string_view config_json)
    : config_(VercelConfig::parse(config_json)) {}

void VercelConnector::validate_scopes(const sdk::Unit& unit) {
  with_token_redacted(unit.access_token, [&] {
    check_unit(unit);
    std::string url = config_.base_url + "/v9/projects/" + url_encode(unit.resource_id);
    if (config_.team_id) append_param(url, "teamId", *config_.team_id);
    const sdk::HttpResponse response =
        http_get(config_, std::move(url), unit.access_token, "get project");
    if (is_success(response.status())) return check_project_id(unit, response.body());
    if (response.status() == 404) {
      const ProviderError provider = read_provider_error(response.body(), unit.access_token);
      throw Error(BACKHAUL_FATAL, "vercel: project not found: " + clip(unit.resource_id) + " (" +
                                      http_detail(404, provider) + ")");
    }
    throw_for_status(response, "get project", unit.access_token);
  });
}

sdk::Page VercelConnector::fetch_page(const sdk::FetchRequest& request) {
  return with_token_redacted(request.unit.access_token,
                             [&] { return fetch_deployments(config_, request); });
}

}  // namespace backhaul::vercel
