// G3: every request the plugin makes is answered with one fault; the status it returns must be
// the one the ABI asks for, with a message. No fixtures needed: the FaultTransport answers any URL.
#include <algorithm>
#include <cstdint>
#include <set>
#include <thread>

#include "core/validate/checks.h"

namespace backhaul::validate {
namespace {

using nlohmann::json;

enum class Expect {
  kAuthExpired = 1,
  kRateLimitedUntilReset,  // retry_after_ms = x-ratelimit-reset - now (within a tolerance)
  kRateLimitedRetryAfter,  // retry_after_ms = retry-after * 1000 (within a tolerance)
  kRetryable,
  kFatal,
  kAnyError,  // any status but OK, with a message
  kNoCrash,   // OK or an error with a message; crashing or hanging fails
};

struct FaultCase {
  Fault fault;
  Expect expect;
};

// A wait may be a little longer than the provider asked (GitHub's connector adds a second of
// margin), never much shorter, and not a made-up default such as one minute.
constexpr int64_t kEarlyToleranceMs = 1'000;
constexpr int64_t kLateToleranceMs = 5'000;
constexpr int kConcurrentCallsPerThread = 10;

json call_json(const CallResult& r) {
  return {{"status", r.status},
          {"text", r.describe()},
          {"message", r.message},
          {"retry_after_ms", r.retry_after_ms}};
}

json observe_fetch(CheckContext& ctx, Fault fault) {
  const Target& t = ctx.target();
  return ctx.with_fault(fault, [&](const PluginDriver& driver, FaultTransport& transport) {
    InstanceHandle instance = driver.create_or_throw(t.config_json);
    FetchOutcome out = driver.fetch(instance.get(), t.first_page(t.entity_types.front()));
    json r = call_json(out.result);
    r["requests"] = transport.request_count();
    r["request_ms"] = transport.last_request_ms();
    if (auto reset = transport.last_reset_s()) r["reset_s"] = *reset;
    return r;
  });
}

std::string expected_name(Expect e) {
  switch (e) {
    case Expect::kAuthExpired:
      return "AUTH_EXPIRED";
    case Expect::kRateLimitedUntilReset:
    case Expect::kRateLimitedRetryAfter:
      return "RATE_LIMITED";
    case Expect::kRetryable:
      return "RETRYABLE";
    case Expect::kFatal:
      return "FATAL";
    case Expect::kAnyError:
      return "an error status";
    case Expect::kNoCrash:
      return "any status";
  }
  return "?";
}

backhaul_status_t expected_status(Expect e) {
  switch (e) {
    case Expect::kAuthExpired:
      return BACKHAUL_AUTH_EXPIRED;
    case Expect::kRateLimitedUntilReset:
    case Expect::kRateLimitedRetryAfter:
      return BACKHAUL_RATE_LIMITED;
    case Expect::kRetryable:
      return BACKHAUL_RETRYABLE;
    case Expect::kFatal:
      return BACKHAUL_FATAL;
    default:
      return -1;
  }
}

// Checks the wait a RATE_LIMITED result asks for against what the response said.
std::optional<std::string> wait_problem(Expect e, const json& r) {
  int64_t want = 0;
  std::string source;
  if (e == Expect::kRateLimitedUntilReset) {
    if (!r.contains("reset_s")) return std::nullopt;
    want = r["reset_s"].get<int64_t>() * 1000 - r["request_ms"].get<int64_t>();
    source = "x-ratelimit-reset minus host->now_ms()";
  } else if (e == Expect::kRateLimitedRetryAfter) {
    want = FaultTransport::kRetryAfterS * 1000;
    source = "retry-after: " + std::to_string(FaultTransport::kRetryAfterS) + " s";
  } else {
    return std::nullopt;
  }
  const int64_t got = r["retry_after_ms"].get<int64_t>();
  if (got >= want - kEarlyToleranceMs && got <= want + kLateToleranceMs) return std::nullopt;
  return "retry_after_ms is " + std::to_string(got) + ", expected about " + std::to_string(want) +
         " (" + source + ")";
}

// `call` is "fetch_page" or "validate_scopes". The fault must have been seen: a call that made
// no request proves nothing about how the plugin maps it.
Verdict judge(Expect e, const json& r, const std::string& call) {
  const backhaul_status_t status = r["status"].get<backhaul_status_t>();
  const std::string text = r["text"].get<std::string>();
  if (r.value("requests", size_t{1}) == 0) {
    std::string reason =
        call + " made no HTTP request, so the fault was never seen (it returned " + text + ")";
    if (status == BACKHAUL_INVALID_ARGUMENT)
      reason += "; give a unit it accepts with --resource, --resource-name, --entity and --config";
    return fail(reason);
  }
  // A status the ABI does not define is the plugin's bug whatever the fault (the host fails
  // such a call, plugin.cpp), not "an error" of the kind expected.
  if (status < BACKHAUL_OK || status > BACKHAUL_INVALID_ARGUMENT)
    return fail(call + " returned " + text + ", which is no status of the ABI (0-5)");
  if (e == Expect::kNoCrash && status == BACKHAUL_OK) return pass(call + " returned a page");
  if (status == BACKHAUL_OK) return fail(call + " returned OK; expected " + expected_name(e));
  if (r["message"].get<std::string>().empty())
    return fail(call + " returned " + status_text(status) + " without a message");
  const backhaul_status_t want = expected_status(e);
  if (want >= 0 && status != want)
    return fail(call + " returned " + text + "; expected " + expected_name(e));
  if (auto problem = wait_problem(e, r)) return fail(call + ": " + *problem);
  return pass(text);
}

const FaultCase kCases[] = {
    {Fault::kHttp401, Expect::kAuthExpired},
    {Fault::kRateLimit403, Expect::kRateLimitedUntilReset},
    {Fault::kRateLimit429, Expect::kRateLimitedRetryAfter},
    {Fault::kHttp500, Expect::kRetryable},
    {Fault::kHttp502, Expect::kRetryable},
    {Fault::kHttp404, Expect::kFatal},
    {Fault::kHttp422, Expect::kFatal},
    {Fault::kTruncatedBody, Expect::kAnyError},
    {Fault::kNonJsonBody, Expect::kAnyError},
    {Fault::kEmptyBody, Expect::kAnyError},
    {Fault::kHugeBody, Expect::kNoCrash},
    {Fault::kSlowResponse, Expect::kRetryable},
    {Fault::kConnectionError, Expect::kRetryable},
};

Expect expectation(Fault fault) {
  for (const FaultCase& c : kCases) {
    if (c.fault == fault) return c.expect;
  }
  return Expect::kAnyError;
}

template <Fault F>
Verdict fault_check(CheckContext& ctx) {
  return judge(expectation(F), observe_fetch(ctx, F), "fetch_page");
}

// The faults whose status does not depend on reading a body: validate_scopes must map them too.
const Fault kScopeFaults[] = {Fault::kHttp401, Fault::kRateLimit403, Fault::kRateLimit429,
                              Fault::kHttp500, Fault::kConnectionError};

Verdict faults_in_validate_scopes(CheckContext& ctx) {
  const Target& t = ctx.target();
  json results =
      ctx.with_fault(kScopeFaults[0], [&](const PluginDriver& driver, FaultTransport& transport) {
        InstanceHandle instance = driver.create_or_throw(t.config_json);
        json out = json::array();
        for (Fault fault : kScopeFaults) {
          transport.set_fault(fault);
          const size_t before = transport.request_count();
          json r = call_json(driver.validate_scopes(instance.get(), t.unit));
          r["requests"] = transport.request_count() - before;
          r["request_ms"] = transport.last_request_ms();
          if (auto reset = transport.last_reset_s()) r["reset_s"] = *reset;
          out.push_back(r);
        }
        return out;
      });
  for (size_t i = 0; i < std::size(kScopeFaults); ++i) {
    Verdict v = judge(expectation(kScopeFaults[i]), results[i], "validate_scopes");
    if (v.status != CheckStatus::kPass)
      return fail(std::string(fault_name(kScopeFaults[i])) + ": " + v.reason);
  }
  return pass("401, 403/429 rate limits, 500 and connection errors map as for fetch_page");
}

// G3's "any request": the checks above fault every request of the first entity type's first page,
// so they reach only the first request a plugin makes. Here each request of the first, second and
// last page of every entity type's walk over the fixtures is answered with each of these faults in
// turn, the requests before it replayed from the fixtures: a cursor's code path, another entity
// type's, and a page's second request (after an access check, say), must map them as the first
// request does. Each try gets an instance of its own, so that nothing one fault left in the plugin
// (a remembered rate limit) changes what the next one sees.
const Fault kAnyRequestFaults[] = {
    Fault::kHttp401,       Fault::kRateLimit403, Fault::kRateLimit429,   Fault::kHttp500,
    Fault::kTruncatedBody, Fault::kNonJsonBody,  Fault::kConnectionError};
constexpr size_t kMaxRequestsPerPage = 16;  // a page's requests past these are not faulted
constexpr size_t kReplayAll = SIZE_MAX;

struct PageProbe {
  std::string entity_type;
  size_t page = 0;                    // 0: the first
  std::optional<std::string> cursor;  // what the walk asked that page with
};

std::vector<PageProbe> pages_to_probe(const std::vector<Walk>& walks) {
  std::vector<PageProbe> probes;
  for (const Walk& walk : walks) {
    const size_t pages = walk.steps.size();
    for (size_t page : std::set<size_t>{0, 1, pages - 1}) {  // the last may be the first or second
      if (page < pages) probes.push_back({walk.entity_type, page, walk.steps[page].cursor});
    }
  }
  return probes;
}

Verdict faults_on_any_request(CheckContext& ctx) {
  const Target& t = ctx.target();
  const std::vector<Walk>& walks = ctx.baseline();
  const std::vector<PageProbe> probes = pages_to_probe(walks);
  if (probes.empty()) {
    std::string reason = "the walk over the fixtures fetched no page to fault";
    for (const Walk& w : walks) {
      if (w.end == WalkEnd::kError) return fail(reason + ": " + w.entity_type + " " + w.error);
    }
    return fail(reason);
  }
  json results = ctx.in_child([&] {
    FakeClock clock(kValidationEpochMs);
    FixtureTransport fixtures(ctx.fixtures()->exchanges);
    FaultTransport faults(Fault::kHttp401, clock);
    FaultAfterTransport transport(fixtures, faults);
    PluginDriver driver(t.plugin_path, transport, clock);
    // One fetch of the probe's page on a new instance, its first `replayed` requests answered
    // from the fixtures; how many requests it made.
    auto fetch = [&](const FetchSpec& spec, size_t replayed, CallResult* result) {
      InstanceHandle instance = driver.create_or_throw(t.config_json);
      transport.reset(replayed);
      CallResult r = driver.fetch(instance.get(), spec).result;
      if (result) *result = std::move(r);
      return transport.request_count();
    };
    json out = json::array();
    for (const PageProbe& probe : probes) {
      FetchSpec spec = t.first_page(probe.entity_type);
      spec.cursor = probe.cursor;
      const size_t requests = std::min(fetch(spec, kReplayAll, nullptr), kMaxRequestsPerPage);
      // The first entity type's first request has had every fault already (the checks above).
      const bool first = probe.page == 0 && probe.entity_type == t.entity_types.front();
      const std::string page =
          "page " + std::to_string(probe.page + 1) + " of " + probe.entity_type;
      for (Fault fault : kAnyRequestFaults) {
        faults.set_fault(fault);
        for (size_t replayed = first ? 1 : 0; replayed < requests; ++replayed) {
          CallResult result;
          const size_t made = fetch(spec, replayed, &result);
          json r = call_json(result);
          r["requests"] = made > replayed ? 1 : 0;  // 0: the faulted request was never made
          r["request_ms"] = faults.last_request_ms();
          if (auto reset = faults.last_reset_s()) r["reset_s"] = *reset;
          r["page"] = page;
          r["where"] = page + ", its request " + std::to_string(replayed + 1) + " of " +
                       std::to_string(requests);
          r["fault"] = static_cast<int>(fault);
          out.push_back(std::move(r));
        }
      }
    }
    return out;
  });
  std::set<std::string> pages;
  for (const json& r : results) {
    const auto fault = static_cast<Fault>(r["fault"].get<int>());
    Verdict v = judge(expectation(fault), r, "fetch_page");
    if (v.status != CheckStatus::kPass) {
      return fail(r["where"].get<std::string>() + ", " + std::string(fault_name(fault)) + ": " +
                  v.reason);
    }
    pages.insert(r["page"].get<std::string>());
  }
  if (results.empty())
    return pass("the walk makes no request but the first, which the checks above fault");
  return pass(std::to_string(results.size()) + " faults on " + std::to_string(pages.size()) +
              " pages map as on a first request");
}

// Every fault but the slow and the huge one (they only cost time), through fetch_page and
// validate_scopes, in one child that two checks judge: {"messages": the messages that carry the
// token, "logged": the first line the plugin logged with it, or null}.
const json& token_under_faults(CheckContext& ctx) {
  const Target& t = ctx.target();
  return ctx.shared("token_under_faults", [&] {
    return ctx.with_fault(
        Fault::kHttp401, [&](const PluginDriver& driver, FaultTransport& transport) {
          json leaks = json::array();
          {
            InstanceHandle instance = driver.create_or_throw(t.config_json);
            for (const FaultCase& c : kCases) {
              if (c.fault == Fault::kSlowResponse || c.fault == Fault::kHugeBody) continue;
              transport.set_fault(c.fault);
              const std::string fetched =
                  driver.fetch(instance.get(), t.first_page(t.entity_types.front())).result.message;
              const std::string scoped = driver.validate_scopes(instance.get(), t.unit).message;
              for (const std::string* message : {&fetched, &scoped}) {
                if (message->find(kAccessToken) != std::string::npos)
                  leaks.push_back(std::string(fault_name(c.fault)) + ": " + *message);
              }
            }
          }
          const std::optional<std::string> logged = driver.logged_secret();
          return json{{"messages", std::move(leaks)},
                      {"logged", logged ? json(*logged) : json(nullptr)}};
        });
  });
}

Verdict error_messages_hide_token(CheckContext& ctx) {
  const json& leaks = token_under_faults(ctx)["messages"];
  if (!leaks.empty())
    return fail("an error message contains the access token (" +
                leaks[0].get<std::string>().substr(0, 200) + ")");
  return pass("no error message contains the access token");
}

// What the plugin logs goes to the host's log, which the host redacts only of the token formats
// it knows: no line may hold the token, at any level. Judged over the faults above and, with
// fixtures, the baseline walk.
Verdict logs_hide_token(CheckContext& ctx) {
  std::optional<std::string> line;
  if (const json& logged = token_under_faults(ctx)["logged"]; logged.is_string())
    line = logged.get<std::string>();
  if (!line && ctx.fixtures()) line = ctx.baseline_logged_token();
  if (line)
    return fail("a line the plugin logged contains the access token (" + quote_text(*line, 200) +
                ")");
  return pass(ctx.fixtures()
                  ? "no line logged over the faults and the fixtures holds the access token"
                  : "no line logged over the faults holds the access token");
}

// Fetches from many threads at once while every request fails: exercises the error paths
// concurrently (the concurrent_fetch conformance check covers the success path with fixtures).
Verdict concurrent_faults(CheckContext& ctx) {
  const Target& t = ctx.target();
  const int threads = ctx.options().threads;
  json r = ctx.with_fault(Fault::kHttp500, [&](const PluginDriver& driver, FaultTransport&) {
    InstanceHandle shared = driver.create_or_throw(t.config_json);
    const std::string problem = on_threads(threads, [&](int k) -> std::string {
      for (int i = 0; i < kConcurrentCallsPerThread; ++i) {
        CallResult result = driver.fetch(shared.get(), t.first_page(t.entity_types.front())).result;
        if (result.status != BACKHAUL_RETRYABLE || result.message.empty()) {
          return "thread " + std::to_string(k) + " got " + result.describe() +
                 " for HTTP 500; expected RETRYABLE";
        }
      }
      return "";
    });
    if (!problem.empty()) return json{{"problem", problem}};
    return json::object();
  });
  if (r.contains("problem")) return fail(r["problem"].get<std::string>());
  return pass(std::to_string(threads) + " threads x " + std::to_string(kConcurrentCallsPerThread) +
              " failing calls on one instance");
}

}  // namespace

std::vector<Check> fault_checks() {
  return {
      {"fault_http_401", "faults", 1, Needs::kLoadedPlugin, "HTTP 401 is AUTH_EXPIRED",
       fault_check<Fault::kHttp401>},
      {"fault_rate_limit_403", "faults", 1, Needs::kLoadedPlugin,
       "403 with x-ratelimit-remaining: 0 is RATE_LIMITED with retry_after = reset - now",
       fault_check<Fault::kRateLimit403>},
      {"fault_rate_limit_429", "faults", 1, Needs::kLoadedPlugin,
       "429 with retry-after: N is RATE_LIMITED with retry_after = N s",
       fault_check<Fault::kRateLimit429>},
      {"fault_http_500", "faults", 1, Needs::kLoadedPlugin, "HTTP 500 is RETRYABLE",
       fault_check<Fault::kHttp500>},
      {"fault_truncated_body", "faults", 1, Needs::kLoadedPlugin,
       "a truncated JSON body is an error with a message, not a crash",
       fault_check<Fault::kTruncatedBody>},
      {"fault_non_json_body", "faults", 1, Needs::kLoadedPlugin,
       "an HTML body is an error with a message, not a crash", fault_check<Fault::kNonJsonBody>},
      {"fault_connection_error", "faults", 1, Needs::kLoadedPlugin,
       "a connection error is RETRYABLE", fault_check<Fault::kConnectionError>},
      {"fault_http_502", "faults", 2, Needs::kLoadedPlugin,
       "HTTP 502 with an HTML body is RETRYABLE", fault_check<Fault::kHttp502>},
      {"fault_empty_body", "faults", 2, Needs::kLoadedPlugin,
       "an empty 200 body is an error with a message", fault_check<Fault::kEmptyBody>},
      {"fault_slow_response", "faults", 2, Needs::kLoadedPlugin,
       "a response that does not come within the request timeout is RETRYABLE",
       fault_check<Fault::kSlowResponse>},
      {"faults_on_any_request", "faults", 2, Needs::kFixtures,
       "401, rate limits, 500, broken bodies and connection errors on any request of a page, "
       "not only the first page's first, map as on that one",
       faults_on_any_request},
      {"fault_http_404", "faults", 3, Needs::kLoadedPlugin, "HTTP 404 is FATAL",
       fault_check<Fault::kHttp404>},
      {"faults_in_validate_scopes", "faults", 3, Needs::kLoadedPlugin,
       "validate_scopes maps 401, rate limits, 500 and connection errors like fetch_page",
       faults_in_validate_scopes},
      {"concurrent_faults", "faults", 3, Needs::kLoadedPlugin,
       "N threads calling fetch_page on one instance while every request fails", concurrent_faults},
      {"fault_huge_body", "faults", 4, Needs::kLoadedPlugin,
       "a 50 MB body neither crashes nor exhausts the memory limit nor times out",
       fault_check<Fault::kHugeBody>},
      {"error_messages_hide_token", "faults", 4, Needs::kLoadedPlugin,
       "no error message contains the access token", error_messages_hide_token},
      {"logs_hide_token", "faults", 4, Needs::kLoadedPlugin,
       "no line the plugin logs, at any level, contains the access token", logs_hide_token},
      {"fault_http_422", "faults", 5, Needs::kLoadedPlugin, "HTTP 422 is FATAL",
       fault_check<Fault::kHttp422>},
  };
}

}  // namespace backhaul::validate
