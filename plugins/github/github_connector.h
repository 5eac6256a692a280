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

// Pages GitHub could not answer in time (a 502 or 504), by the URL asked for (a cursor, or a
// unit's first page): how many times to halve their per_page when they are asked for again.
// Forgotten once answered; all forgotten past kMaxPages, which costs those pages one more try at
// full size. [thread-safe]
class HeavyPages {
 public:
  int halvings(const std::string& url) const;
  void failed(const std::string& url, int halvings);
  void answered(const std::string& url);

 private:
  static constexpr size_t kMaxPages = 1024;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, int> halvings_;
};

// One instance per config. Holds immutable state and the locked HeavyPages, so validate_scopes()
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
  HeavyPages heavy_;
};

}  // namespace backhaul::github
