// Shared set-up of the vercel connector tests: the real built plugin, loaded through core's loader
// with a ReplayTransport and a FakeClock, plus helpers to record answers and read what was asked.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/common/clock.h"
#include "core/http/http.h"
#include "core/http/replay_transport.h"
#include "core/plugins/plugin.h"
#include "core/plugins/plugin_loader.h"

namespace backhaul::vercel::testing {

inline const std::filesystem::path kPluginPath = BACKHAUL_VERCEL_PLUGIN_PATH;
inline const std::filesystem::path kFixtureDir = BACKHAUL_VERCEL_FIXTURE_DIR;
inline const std::filesystem::path kSchemaPath = BACKHAUL_VERCEL_SCHEMA_PATH;

inline constexpr std::string_view kBaseUrl = "https://api.vercel.com";
inline constexpr std::string_view kInstallation = "inst_7Hq2";
// Token-shaped (vcp_ = a Vercel personal token) and long enough for the plugin to redact.
inline constexpr std::string_view kToken = "vcp_4xTestTokenDoNotUse9Jq2mZ8wR";
inline constexpr std::string_view kRecordedProject = "prj_ZeMhSoHzq7fr9dXB7sBCatTEPooL";
inline constexpr std::string_view kSyntheticProject = "prj_8rN2kQmX4tVbY7cW1sZfH3jLpD6e";
inline constexpr int64_t kNowMs = 1'784'470'000'000;     // the FakeClock's time
inline constexpr int64_t kResetSeconds = 1'784'470'060;  // one minute after kNowMs

std::string read_file(const std::filesystem::path& path);
nlohmann::json read_json(const std::filesystem::path& path);
// A fixture under tests/fixtures/vercel, e.g. "recorded/error-bodies.json".
std::string fixture(const std::string& relative_path);
// The body of entry `index` of recorded/error-bodies.json, as Vercel sends it.
std::string recorded_error_body(size_t index);

// x-ratelimit-* the way Vercel sends them on every response.
http::Headers rate_limit_headers(int64_t remaining, int64_t limit = 100,
                                 int64_t reset_seconds = kResetSeconds);

// "https://api.vercel.com/v6/deployments?projectId=<id>&limit=<limit>" + extra ("&until=1").
std::string list_url(std::string_view project_id, std::string_view extra_query = "",
                     int limit = 100);

// The query parameters of `url`, by name, values as sent (still percent-encoded).
std::map<std::string, std::string> query_of(std::string_view url);
// The value of header `name` (case-insensitive) of `request`, or nullopt.
std::optional<std::string> header_of(const http::Request& request, std::string_view name);

// One event of a page, copied out so it outlives the page.
struct Event {
  std::string delivery_id;
  std::string event_type;
  nlohmann::json payload;  // parsed payload_json
};
std::vector<Event> events_of(const plugins::Page& page);
std::vector<std::string> uids_of(const std::vector<Event>& events);  // payload.deployment.id

// Everything one walk from the first page to the last produced.
struct Walk {
  std::vector<Event> events;
  std::vector<std::string> cursors;  // next_cursor of every page but the last
  size_t pages = 0;
};
// Follows next_cursor until it is null; fails the test after `max_pages`.
Walk walk(const plugins::Connector& connector, plugins::FetchParams params, size_t max_pages = 50);

// Runs `fn`, which must throw plugins::ConnectorFailure, and returns what it threw.
template <class Fn>
plugins::ConnectorFailure failure_of(Fn&& fn) {
  try {
    fn();
  } catch (const plugins::ConnectorFailure& e) {
    return e;
  }
  ADD_FAILURE() << "expected a ConnectorFailure";
  return plugins::ConnectorFailure(BACKHAUL_OK, "(no failure)", 0);
}

// Loads the plugin fresh for each test, so each test has its own transport and clock.
class VercelTest : public ::testing::Test {
 protected:
  http::ReplayTransport transport_;
  FakeClock clock_{kNowMs};
  plugins::Plugin plugin_ =
      plugins::load_plugin(kPluginPath, plugins::HostServices{transport_, clock_});

  plugins::Connector connector(std::string_view config_json = "{}") const {
    return plugin_.create(config_json);
  }
  static plugins::Unit unit(std::string_view project_id = kRecordedProject);
  static plugins::FetchParams params(std::string_view project_id = kRecordedProject,
                                     std::optional<std::string> cursor = std::nullopt,
                                     int64_t since_unix_ms = 0);

  // Records the answer to GET `url`.
  void reply(const std::string& url, int status, std::string body,
             http::Headers headers = rate_limit_headers(99));
  std::vector<http::Request> requests() const { return transport_.requests(); }
};

}  // namespace backhaul::vercel::testing
