// backhaul-sandbox: runs the sandbox (see sandbox.h and docs/sandbox.md) until SIGINT or SIGTERM.
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <Poco/Exception.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/StreamCopier.h>
#include <Poco/URI.h>
#include <nlohmann/json.hpp>

#include "host/common/process.h"
#include "host/sandbox/sandbox.h"

namespace {

using backhaul::host::catch_termination_signals;
using backhaul::host::wait_for_termination;
using backhaul::host::write_port_file;
using backhaul::sandbox::Faults;
using backhaul::sandbox::Sandbox;
using backhaul::sandbox::SandboxOptions;

void add_data_flags(CLI::App& app, SandboxOptions& o) {
  app.add_option("--port", o.port, "TCP port on 127.0.0.1; 0 picks a free one")
      ->capture_default_str();
  app.add_option("--installations", o.installations,
                 "installations inst-1..inst-N, each with a GitHub and a Vercel connection")
      ->capture_default_str();
  app.add_option("--repos", o.repos, "GitHub repositories per installation")->capture_default_str();
  app.add_option("--first-installation-repos", o.first_installation_repos,
                 "GitHub repositories of inst-1 only (a huge tenant); -1 = --repos")
      ->capture_default_str();
  app.add_option("--projects", o.projects, "Vercel projects per installation")
      ->capture_default_str();
  app.add_option("--items", o.items,
                 "items per entity type per resource (pulls, issues, releases, deployments)")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of all generated data")->capture_default_str();
  app.add_option("--max-per-page", o.max_per_page,
                 "cap on per_page (GitHub) and limit (Vercel; never above 100)")
      ->capture_default_str();
  app.add_option_function<int64_t>(
      "--anchor-ms", [&o](int64_t anchor_ms) { o.anchor_ms = anchor_ms; },
      "generated timestamps lie in the 5 days before this epoch-ms instant "
      "(default: start time rounded down to the hour)");
  app.add_option("--threads", o.threads,
                 "HTTP worker threads; each serves one open connection at a time")
      ->capture_default_str();
  app.add_option("--token-lifetime-s", o.token_lifetime_s,
                 "expiresAt of gateway tokens; an expired token is rejected")
      ->capture_default_str();
  app.add_option("--gateway-api-key", o.gateway_api_key,
                 "require this X-Api-Key on /gateway requests (default: no check)");
}

void add_fault_flags(CLI::App& app, Faults& f) {
  app.add_option("--fail-rate", f.fail_rate,
                 "probability in [0,1] that a provider request gets a 502 or 503")
      ->capture_default_str();
  app.add_option("--gateway-fail-rate", f.gateway_fail_rate,
                 "probability in [0,1] that a webhook POST gets a 503")
      ->capture_default_str();
  app.add_option("--gateway-busy-every", f.gateway_busy_every,
                 "every Nth webhook POST starts a busy period in which webhook POSTs get 429 with "
                 "a retry-after (0 = off)")
      ->capture_default_str();
  app.add_option("--gateway-busy-ms", f.gateway_busy_ms, "length of a gateway busy period")
      ->capture_default_str();
  app.add_option("--burst-429-every", f.burst_429_every,
                 "every Nth provider request starts a burst of 429s (0 = off)")
      ->capture_default_str();
  app.add_option("--burst-len", f.burst_len, "provider requests per 429 burst")
      ->capture_default_str();
  app.add_option("--retry-after", f.retry_after_s, "retry-after seconds sent with burst 429s")
      ->capture_default_str();
  app.add_option("--token-ttl-requests", f.token_ttl_requests,
                 "a token answers N provider requests, then gets 401 Bad credentials (GitHub) or "
                 "403 invalidToken (Vercel) until a new one is fetched (0 = unlimited)")
      ->capture_default_str();
  app.add_option("--slow-ms", f.slow_ms, "latency added to every provider request")
      ->capture_default_str();
  app.add_option("--rate-limit", f.rate_limit,
                 "x-ratelimit-limit per installation per provider per window; when used up, "
                 "GitHub answers 403 and Vercel 429 until the window resets")
      ->capture_default_str();
  app.add_option("--rate-window-s", f.rate_window_s, "rate-limit window length in seconds")
      ->capture_default_str();
}

// `backhaul-sandbox report --url URL`: prints what a running sandbox's gateway received next to
// what it should have received. With --require-complete, exits 1 unless every expected delivery
// arrived as its installation's own and nothing unexpected did; with --require-exactly-once, unless
// also none arrived twice (what the demo checks).
int run_report(const std::string& url, bool require_complete, bool require_exactly_once) {
  Poco::URI uri(url);
  Poco::Net::HTTPClientSession session(uri.getHost(), uri.getPort());
  session.setTimeout(Poco::Timespan(10, 0));
  Poco::Net::HTTPRequest request(Poco::Net::HTTPRequest::HTTP_GET, "/_sandbox/report",
                                 Poco::Net::HTTPMessage::HTTP_1_1);
  session.sendRequest(request);
  Poco::Net::HTTPResponse response;
  std::istream& body_stream = session.receiveResponse(response);
  std::string body;
  Poco::StreamCopier::copyToString(body_stream, body);
  if (response.getStatus() != Poco::Net::HTTPResponse::HTTP_OK) {
    std::fprintf(stderr, "backhaul-sandbox report: %s answered %d\n", url.c_str(),
                 static_cast<int>(response.getStatus()));
    return 1;
  }
  nlohmann::json report = nlohmann::json::parse(body);
  const nlohmann::json& g = report.at("gateway");
  std::printf("gateway received %lld deliveries: %lld unique, %lld duplicates\n",
              g.at("received").get<long long>(), g.at("unique").get<long long>(),
              g.at("duplicates").get<long long>());
  std::printf("gateway expected %lld: %lld missing, %lld unexpected, %lld misdirected\n",
              g.at("expected").get<long long>(), g.at("missing").get<long long>(),
              g.at("unexpected").get<long long>(), g.at("misdirected").get<long long>());
  std::printf("%s\n", report.dump(2).c_str());
  if (!require_complete && !require_exactly_once) return 0;
  const bool complete = report.at("complete").get<bool>();
  std::printf("%s\n", complete ? "COMPLETE: every expected delivery arrived, nothing else did"
                               : "INCOMPLETE: the gateway did not receive what it should have");
  if (!complete) return 1;
  if (require_exactly_once && !report.at("exactly_once").get<bool>()) {
    std::printf("DUPLICATED: %lld deliveries arrived more than once\n",
                g.at("duplicates").get<long long>());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!backhaul::host::start_clean()) return 1;
  CLI::App app{
      "backhaul-sandbox: fake GitHub API (/github), Vercel API (/vercel) and ingest gateway "
      "(/gateway) on 127.0.0.1 with deterministic data, fault knobs and a delivery report "
      "(/_sandbox/report). See docs/sandbox.md."};
  SandboxOptions options;
  std::string port_file;
  add_data_flags(app, options);
  add_fault_flags(app, options.faults);
  app.add_option("--port-file", port_file, "write the chosen port to this file once listening");
  std::string report_url;
  bool require_complete = false;
  bool require_exactly_once = false;
  CLI::App* report = app.add_subcommand(
      "report", "Print a running sandbox's delivery report instead of starting one");
  report->add_option("--url", report_url, "base URL of the running sandbox")->required();
  report->add_flag("--require-complete", require_complete,
                   "exit 1 unless every expected delivery arrived and nothing else did");
  report->add_flag("--require-exactly-once", require_exactly_once,
                   "as --require-complete, and exit 1 if any delivery arrived twice");
  CLI11_PARSE(app, argc, argv);
  if (report->parsed()) {
    try {
      return run_report(report_url, require_complete, require_exactly_once);
    } catch (const Poco::Exception& error) {
      std::fprintf(stderr, "backhaul-sandbox report: %s\n", error.displayText().c_str());
      return 1;
    } catch (const std::exception& error) {
      std::fprintf(stderr, "backhaul-sandbox report: %s\n", error.what());
      return 1;
    }
  }

  const sigset_t signals = catch_termination_signals();
  try {
    Sandbox sandbox(options);
    sandbox.start();
    if (!port_file.empty()) write_port_file(port_file, sandbox.port());
    std::printf("backhaul-sandbox listening on %s\n", sandbox.base_url().c_str());
    std::fflush(stdout);
    const int signal_number = wait_for_termination(signals);
    std::fprintf(stderr, "backhaul-sandbox: signal %d, stopping\n", signal_number);
    sandbox.stop();
  } catch (const Poco::Exception& error) {
    std::fprintf(stderr, "backhaul-sandbox: %s\n", error.displayText().c_str());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "backhaul-sandbox: %s\n", error.what());
    return 1;
  }
  return 0;
}
