// The four route groups the sandbox serves, as plain functions of a request. Each takes the path
// segments after its prefix ("/github/repos/o/r" -> {"repos", "o", "r"}). [thread-safe]
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "host/sandbox/data.h"
#include "host/sandbox/delivery_store.h"
#include "host/sandbox/http.h"
#include "host/sandbox/options.h"
#include "host/sandbox/provider_state.h"
#include "host/sandbox/report.h"

namespace backhaul::sandbox {

// Everything a handler may touch. `base_url` is fixed before the server accepts connections.
struct Context {
  const SandboxOptions& options;
  const DataModel& data;
  ProviderState& state;
  DeliveryStore& deliveries;
  std::string base_url;
};

using Route = std::span<const std::string_view>;

Response handle_github(const Context& context, const Request& request, Route route);
Response handle_vercel(const Context& context, const Request& request, Route route);
Response handle_gateway(const Context& context, const Request& request, Route route);
Response handle_control(const Context& context, const Request& request, Route route);

// The report for one installation (1-based) or all of them.
Report build_report(const Context& context, std::optional<int> installation);

// Adds latency outside any lock (the slow_ms knob).
void sleep_ms(int64_t ms);

}  // namespace backhaul::sandbox
