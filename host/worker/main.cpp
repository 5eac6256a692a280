// backhaul-plugin-worker: one worker process of a connector in isolation mode (SPEC B4). The
// daemon starts it with a UNIX socket on descriptor 3 and talks to it as core/plugins/isolation.h
// says; it is not meant to be run by hand.
//
//   backhaul-plugin-worker --plugin PATH --sha256 HEX[,HEX...] --wire N [--http-timeout-ms N]
//       [--ca-file PEM] [--proxy URL [--no-proxy HOST,...] [--proxy-credentials-env NAME]]
//       [--log-level LEVEL] [--log-format text|json] [--sealed PATH]...
//
// --proxy-credentials-env names the variable that holds the proxy's user:password.
//
// Each --sealed names a file of the plugin whose bytes are on a descriptor instead: the first on
// descriptor 4, the next on 5, and so on (the daemon's sealed copies, isolation.h).
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/common/logging.h"
#include "core/common/unique_fd.h"
#include "core/http/http_metrics.h"
#include "core/http/poco_transport.h"
#include "core/plugins/isolation.h"
#include "core/plugins/plugin_loader.h"
#include <unistd.h>

namespace {

int usage(const std::string& problem) {
  std::fprintf(stderr, "backhaul-plugin-worker: %s\n", problem.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> args = {
      {"--http-timeout-ms", "30000"}, {"--log-level", "info"}, {"--log-format", "text"}};
  std::map<std::filesystem::path, int> sealed;
  int next_sealed = backhaul::plugins::kWorkerFirstSealedFd;
  for (int i = 1; i < argc; i += 2) {
    const std::string name = argv[i];
    if (i + 1 >= argc) return usage(name + " needs a value");
    if (name == "--sealed") {
      sealed.emplace(argv[i + 1], next_sealed++);
      continue;
    }
    static const std::set<std::string> kOptional = {"--plugin",
                                                    "--sha256",
                                                    "--wire",
                                                    "--ca-file",
                                                    "--proxy",
                                                    "--no-proxy",
                                                    "--proxy-credentials-env"};
    if (!args.count(name) && !kOptional.count(name)) {
      return usage("unknown option " + name);
    }
    args[name] = argv[i + 1];
  }
  if (!args.count("--plugin") || !args.count("--sha256")) {
    return usage("--plugin and --sha256 are required");
  }
  // A daemon and a worker of different builds cannot talk: the executable was replaced under a
  // running daemon (an upgrade).
  if (args["--wire"] != std::to_string(backhaul::plugins::kWorkerWire)) {
    return usage("this worker speaks wire version " +
                 std::to_string(backhaul::plugins::kWorkerWire) + ", the daemon " +
                 (args["--wire"].empty() ? std::string("an older one") : args["--wire"]) +
                 ": restart the daemon after an upgrade");
  }
  char* end = nullptr;
  errno = 0;
  const long long http_timeout_ms = std::strtoll(args["--http-timeout-ms"].c_str(), &end, 10);
  // At most a day, so that a deadline of now plus the timeout never overflows.
  if (*end != '\0' || errno == ERANGE || http_timeout_ms <= 0 || http_timeout_ms > 86'400'000) {
    return usage("--http-timeout-ms must be a number in [1, 86400000]");
  }
  // Nothing of the daemon's but the socket and the sealed copies: descriptors it opened without
  // close-on-exec (a library's sockets, say) are not the plugin's to hold open.
  if (::close_range(static_cast<unsigned>(next_sealed), ~0U, 0) != 0) {
    // No close_range (a kernel before 5.9, a seccomp profile refusing it): one by one, from the
    // list of what is open.
    std::vector<int> open;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
      const int fd = std::atoi(entry.path().filename().c_str());
      if (fd >= next_sealed) open.push_back(fd);
    }
    if (ec)
      return usage("cannot list /proc/self/fd to close the daemon's descriptors: " + ec.message());
    for (int fd : open) ::close(fd);  // the iterator's own descriptor is closed by then
  }
  // Nor are these for a program the plugin runs: one that held the socket open would hide the
  // worker's end from the daemon's end-of-file (the daemon watches the worker's PID too).
  for (int fd = backhaul::plugins::kWorkerSocketFd; fd < next_sealed; ++fd) {
    backhaul::set_close_on_exec(fd);
  }
  std::signal(SIGPIPE, SIG_IGN);

  namespace logging = backhaul::logging;
  logging::configure(
      args["--log-format"] == "json" ? logging::Format::kJson : logging::Format::kText,
      args["--log-level"]);
  backhaul::http::PocoTransportOptions transport_options;
  if (args.count("--ca-file")) transport_options.ca_file = args["--ca-file"];
  if (args.count("--proxy")) {
    try {
      transport_options.proxy = backhaul::http::parse_proxy_url(args["--proxy"]);
      std::vector<std::string> hosts;
      std::stringstream list(args["--no-proxy"]);
      for (std::string host; std::getline(list, host, ',');) hosts.push_back(host);
      transport_options.proxy.no_proxy = backhaul::http::parse_no_proxy(hosts);
      if (args.count("--proxy-credentials-env")) {
        char* credentials = std::getenv(args["--proxy-credentials-env"].c_str());
        if (credentials == nullptr) {
          return usage("the variable " + args["--proxy-credentials-env"] + " is not set");
        }
        backhaul::http::set_proxy_credentials(transport_options.proxy, credentials);
        // Read once, for the transport (which keeps a copy): the plugin's code (and what it runs)
        // has no business reading the proxy's password, as it has none reading the daemon's other
        // secrets. Wiped where it was, too: unsetenv() alone leaves it in the block that
        // /proc/self/environ shows.
        ::explicit_bzero(credentials, std::strlen(credentials));
        ::unsetenv(args["--proxy-credentials-env"].c_str());
      }
    } catch (const std::invalid_argument& e) {
      return usage(e.what());
    }
  }
  backhaul::http::PocoTransport transport(transport_options);
  // Sent back with each answer (isolation.h): the daemon shows them in /metrics.
  backhaul::http::HttpMetrics http_metrics;
  const backhaul::plugins::HostServices services{transport, backhaul::SystemClock::instance(),
                                                 std::chrono::milliseconds(http_timeout_ms),
                                                 &http_metrics};
  std::set<std::string> sha256;
  std::stringstream list(args["--sha256"]);
  for (std::string hex; std::getline(list, hex, ',');) sha256.insert(hex);
  return backhaul::plugins::serve_plugin_worker(backhaul::plugins::kWorkerSocketFd,
                                                args["--plugin"], sha256, services, sealed);
}
