// The GitHub connector (SPEC C1): pull requests, issues and releases of one repository per work
// unit, paginated by the Link header, as webhook-shaped events.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "backhaul/connector.hpp"

#include "config.h"
#include "github_client.h"

namespace backhaul::github {

// Lists whose first page GitHub could not answer in time (a 502 or 504), by the list's path: how
// many times to halve per_page when a walk of the list begins, for a day from the last such
// failure (the next backfill's walk starts at the size that worked, rather than paying the
// timeouts again). All forgotten past kMaxLists, which costs those lists a try at full size again.
// Per instance: a worker process of its own (isolation) learns on its own. [thread-safe]
class HeavyLists {
 public:
  int halvings(const std::string& list_path, int64_t now_ms);
  void failed(const std::string& list_path, int halvings, int64_t now_ms);

 private:
  static constexpr size_t kMaxLists = 1024;
  static constexpr int64_t kRememberMs = 24LL * 3600 * 1000;
  struct Entry {
    int halvings = 0;
    int64_t until_ms = 0;
  };
  std::mutex mutex_;
  std::unordered_map<std::string, Entry> lists_;
};

// One instance per config. Holds immutable state and the locked HeavyLists, so validate_scopes()
// and fetch_page() may run concurrently on the same instance. [thread-safe]
//
// Work units: resource name "owner/repo" (required), resource id the numeric repository id (it
// goes into delivery ids; another id, a node id, is taken as is). Lists are asked for by the
// repository's number when the resource id is one ({base}/repositories/{id}/pulls), else by name.
// Cursors are GitHub's rel="next" URLs, used verbatim.
// Every method throws backhaul::sdk::Error; messages never contain the access token.
class GithubConnector final : public sdk::Connector {
 public:
  // Throws Error(INVALID_ARGUMENT) naming the bad key or field; see config.h.
  static void validate_config(std::string_view config_json);
  explicit GithubConnector(std::string_view config_json);

  GithubConnector(const GithubConnector&) = delete;
  GithubConnector& operator=(const GithubConnector&) = delete;

  // GET /repos/{owner}/{repo}: FATAL when the repository is missing or hidden from the token (404),
  // the token may not read it (permissions.pull false), or its id is not the unit's numeric
  // resource id (the name now belongs to another repository); otherwise the common status
  // mapping.
  void validate_scopes(const sdk::Unit& unit) override;

  // One page of `entity_type` ("pull_request", "issue" or "release"); see github_connector.cpp
  // for how `since` is honoured per type. INVALID_ARGUMENT for an unknown entity type, a unit
  // without "owner/repo" or resource id, or a cursor that is not an http(s) URL on base_url's host.
  sdk::Page fetch_page(const sdk::FetchRequest& request) override;

 private:
  const Config config_;
  const GithubClient client_{config_};  // refers to config_, declared before it
  HeavyLists heavy_;
};

}  // namespace backhaul::github
