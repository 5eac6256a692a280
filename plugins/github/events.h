// Turns GitHub list items into webhook-shaped events with deterministic delivery ids.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "backhaul/connector.hpp"

namespace backhaul::github {

// A repository named "owner/repo".
struct RepositoryName {
  std::string owner;
  std::string repo;
};

// nullopt unless `full_name` is exactly two non-empty segments separated by one '/'.
std::optional<RepositoryName> parse_repository_name(std::string_view full_name);

// Builds the events of one page. Items are moved into the payloads, so each page is parsed once
// and never copied. Throws sdk::Error(FATAL) for an item without the integer its delivery id
// needs, naming the item by `index`, its place in the page: GitHub would send the same item
// again, so retrying cannot help.
class EventBuilder {
 public:
  // The payloads' "repository" object is {"id", "full_name", "name", "owner": {"login"}}, with the
  // resource id as a JSON number when it is a decimal integer (as in real webhooks), else a string.
  EventBuilder(std::string_view installation_id, std::string_view resource_id,
               const RepositoryName& name);

  // "pull_request" event {action: opened|closed, number, pull_request, repository};
  // delivery id backfill-{installation}-{resource}-pr-{number}.
  sdk::Event pull_request(nlohmann::json&& item, size_t index) const;
  // "issues" event {action: opened|closed, issue, repository}; ...-issue-{number}.
  sdk::Event issue(nlohmann::json&& item, size_t index) const;
  // "release" event {action: published (drafts: created), release, repository}; ...-release-{id}.
  sdk::Event release(nlohmann::json&& item, size_t index) const;

 private:
  std::string delivery_prefix_;  // "backfill-{installation}-{resource}-"
  nlohmann::json repository_;
};

}  // namespace backhaul::github
