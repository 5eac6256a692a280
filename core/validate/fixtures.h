// A validator fixtures directory: recorded exchanges in the sdk/README.md format (every *.json
// file) plus validate.json, which says what to fetch with them (resource, entity types, config).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/http/replay_transport.h"

namespace backhaul::validate {

inline constexpr const char* kSettingsFileName = "validate.json";

// validate.json; every member is optional and command-line flags override it:
//   {"resource": {"id": "515435940", "name": "octo-org/hello"},
//    "entity_types": ["issue"]            (or "entity_type": "issue"),
//    "config": {"base_url": "https://api.github.com"},
//    "installation_id": "validate", "since_unix_ms": 0, "max_pages": 100}
struct FixtureSettings {
  std::optional<std::string> resource_id;
  std::optional<std::string> resource_name;
  std::vector<std::string> entity_types;
  std::optional<std::string> config_json;
  std::optional<std::string> installation_id;
  std::optional<int64_t> since_unix_ms;
  std::optional<size_t> max_pages;
};

struct Fixtures {
  std::filesystem::path dir;
  std::vector<http::Exchange> exchanges;
  FixtureSettings settings;
};

// Reads `dir`: validate.json (if present) and every other *.json file, in name order. Throws
// ConfigError naming the file and the problem.
Fixtures load_fixtures(const std::filesystem::path& dir);

// Answers like ReplayTransport (first exchange with the same method and URL, query parameters in
// any order; no recording is a TransportError naming the URL), but keeps no per-request state, so
// memory stays flat over thousands of requests (the page-leak check measures the heap).
// [thread-safe]
class FixtureTransport final : public http::Transport {
 public:
  // `exchanges` must outlive this object.
  explicit FixtureTransport(const std::vector<http::Exchange>& exchanges);

  http::Response perform(const http::Request& request) override;

  size_t request_count() const { return requests_.load(); }
  // "GET https://..." of the first request that had no recording.
  std::optional<std::string> first_unmatched() const;

 private:
  const std::vector<http::Exchange>& exchanges_;
  std::map<std::string, size_t> index_;  // "METHOD canonical-url" -> first matching exchange
  std::atomic<size_t> requests_{0};
  mutable std::mutex mutex_;
  std::optional<std::string> first_unmatched_;
};

}  // namespace backhaul::validate
