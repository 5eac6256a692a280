// Shared setup of the GitHub connector tests: the real built plugin, loaded through core's
// loader with a ReplayTransport and a FakeClock. Nothing of the plugin is mocked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/common/clock.h"
#include "core/http/replay_transport.h"
#include "core/plugins/plugin.h"
#include "core/plugins/plugin_loader.h"
#include "nock_fixture.h"

namespace backhaul::github_test {

inline constexpr const char* kPluginPath = BACKHAUL_GITHUB_PLUGIN_PATH;
inline constexpr const char* kApi = "https://api.github.com";
// The doc example installation token (API-FACTS A7); tokens are opaque to the connector.
inline constexpr const char* kToken = "ghs_16C7e42F292c6912E7710c838347Ae178B4a";
inline constexpr const char* kInstallation = "inst-42";
// The repository of the synthetic recordings and of the get-repository recording.
inline constexpr const char* kRepo = "octokit-fixture-org/hello-world";
inline constexpr const char* kRepoId = "1000";
// 2024-03-01T00:00:00Z
inline constexpr int64_t kSince20240301Ms = 1'709'251'200'000;

// "{kApi}/repositories/1000": the unit's repository by number, as first pages ask for it when the
// resource id is one.
inline std::string repo_by_id() { return std::string(kApi) + "/repositories/" + kRepoId; }

// "https://api.github.com/repositories/1000/pulls?state=all&...&per_page=N"
inline std::string pulls_url(int per_page = 100) {
  return repo_by_id() +
         "/pulls?state=all&sort=updated&direction=desc&per_page=" + std::to_string(per_page);
}

// Returns what `fn` throws as ConnectorFailure; records a test failure if it returns normally.
template <class Fn>
plugins::ConnectorFailure failure_of(Fn&& fn) {
  try {
    fn();
  } catch (const plugins::ConnectorFailure& failure) {
    return failure;
  }
  ADD_FAILURE() << "expected a ConnectorFailure";
  return plugins::ConnectorFailure(BACKHAUL_OK, "no failure", 0);
}

class GithubPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    plugin_.emplace(plugins::load_plugin(kPluginPath, plugins::HostServices{transport_, clock_}));
  }
  void TearDown() override { plugin_.reset(); }

  const plugins::Plugin& plugin() const { return *plugin_; }
  plugins::Connector connect(std::string_view config = "{}") const {
    return plugin_->create(config);
  }

  static plugins::Unit unit(std::string resource_id = kRepoId,
                            std::optional<std::string> resource_name = std::string(kRepo)) {
    return plugins::Unit{kInstallation, std::move(resource_id), std::move(resource_name), kToken};
  }

  static plugins::FetchParams params(std::string entity_type,
                                     std::optional<std::string> cursor = std::nullopt,
                                     int64_t since_unix_ms = 0, plugins::Unit u = unit()) {
    return plugins::FetchParams{std::move(u), std::move(entity_type), since_unix_ms,
                                std::move(cursor)};
  }

  void add(http::Exchange exchange) { transport_.add(std::move(exchange)); }
  void add_all(std::vector<http::Exchange> exchanges) {
    for (auto& e : exchanges) transport_.add(std::move(e));
  }
  // A GET answered with `status`, `body` and `headers` (lower-case names).
  void add_get(const std::string& url, int status, std::string body, http::Headers headers = {}) {
    http::Exchange e;
    e.method = "GET";
    e.url = url;
    e.response.status = status;
    e.response.headers = std::move(headers);
    e.response.body = std::move(body);
    e.response.url = url;
    transport_.add(std::move(e));
  }
  // The named scenario of synthetic/errors.json, answering GET `url`.
  void add_scenario(const std::string& name, const std::string& url) {
    static const nlohmann::json scenarios = read_json(fixture_path("synthetic/errors.json"));
    http::Exchange e = exchange_from_nock(scenarios.at(name));
    e.url = url;
    e.response.url = url;
    transport_.add(std::move(e));
  }

  std::vector<std::string> requested_urls() const {
    std::vector<std::string> urls;
    for (const auto& r : transport_.requests()) urls.push_back(r.url);
    return urls;
  }

  http::ReplayTransport transport_;
  FakeClock clock_;  // starts at 1'700'000'000'000 ms
  std::optional<plugins::Plugin> plugin_;
};

}  // namespace backhaul::github_test
