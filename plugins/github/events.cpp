#include "events.h"

#include <utility>

namespace backhaul::github {
namespace {

using nlohmann::json;

// Payloads carry provider data verbatim; invalid UTF-8 (possible only in the unit's own strings,
// since json::parse rejects it) is replaced rather than thrown on.
std::string dump(const json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
}

// The decimal text of an integer field ("number", "id"), as it appears in delivery ids. FATAL
// without one, naming the item by its place in the page (`index`) and showing what is there.
std::string integer_text(const json& item, const char* key, std::string_view kind, size_t index) {
  const auto it = item.find(key);
  if (it != item.end() && it->is_number_integer()) return it->dump();
  std::string problem = "has no \"" + std::string(key) + "\" field";
  if (it != item.end()) {
    std::string found = dump(*it);
    if (found.size() > 40) found = found.substr(0, 40) + "...";
    problem = "has a \"" + std::string(key) + "\" that is not an integer: " + found;
  }
  throw sdk::Error(BACKHAUL_FATAL, "github: item " + std::to_string(index) + " of the page (a " +
                                       std::string(kind) + ") " + problem);
}

// "closed" for closed issues and pull requests, "opened" for the rest: what a webhook receiver
// would have seen last for an item in that state.
const char* open_or_closed(const json& item) {
  const auto state = item.find("state");
  return state != item.end() && state->is_string() &&
                 state->get_ref<const std::string&>() == "closed"
             ? "closed"
             : "opened";
}

bool is_all_digits(std::string_view s) {
  if (s.empty() || s.size() > 19) return false;  // 19 digits always fit in uint64
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return !(s.size() > 1 && s.front() == '0');  // "007" stays a string: it would not round-trip
}

json resource_id_json(std::string_view resource_id) {
  if (is_all_digits(resource_id)) return std::stoull(std::string(resource_id));
  return std::string(resource_id);
}

// A webhook's `sender` is who acted; for an item of a list, its author (`key`), when it has one.
void add_sender(json& payload, const json& item, const char* key) {
  const auto author = item.find(key);
  if (author != item.end() && author->is_object()) payload["sender"] = *author;
}

}  // namespace

std::optional<RepositoryName> parse_repository_name(std::string_view full_name) {
  const size_t slash = full_name.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == full_name.size() ||
      full_name.find('/', slash + 1) != std::string_view::npos) {
    return std::nullopt;
  }
  return RepositoryName{std::string(full_name.substr(0, slash)),
                        std::string(full_name.substr(slash + 1))};
}

EventBuilder::EventBuilder(std::string_view installation_id, std::string_view resource_id,
                           const RepositoryName& name)
    : delivery_prefix_("backfill-" + std::string(installation_id) + "-" + std::string(resource_id) +
                       "-"),
      repository_({{"id", resource_id_json(resource_id)},
                   {"full_name", name.owner + "/" + name.repo},
                   {"name", name.repo},
                   {"owner", {{"login", name.owner}}}}) {}

sdk::Event EventBuilder::pull_request(json&& item, size_t index) const {
  std::string number = integer_text(item, "number", "pull request", index);
  json payload = {{"action", open_or_closed(item)}, {"number", item["number"]}};
  add_sender(payload, item, "user");
  // A list item lacks the webhook's `merged`, which a receiver of "closed" reads.
  if (!item.contains("merged")) {
    const auto merged_at = item.find("merged_at");
    item["merged"] = merged_at != item.end() && !merged_at->is_null();
  }
  payload["pull_request"] = std::move(item);
  payload["repository"] = repository_;
  return {delivery_prefix_ + "pr-" + number, "pull_request", dump(payload)};
}

sdk::Event EventBuilder::issue(json&& item, size_t index) const {
  std::string number = integer_text(item, "number", "issue", index);
  json payload = {{"action", open_or_closed(item)}};
  add_sender(payload, item, "user");
  payload["issue"] = std::move(item);
  payload["repository"] = repository_;
  return {delivery_prefix_ + "issue-" + number, "issues", dump(payload)};
}

sdk::Event EventBuilder::release(json&& item, size_t index) const {
  std::string id = integer_text(item, "id", "release", index);
  const auto draft = item.find("draft");
  const bool is_draft = draft != item.end() && draft->is_boolean() && draft->get<bool>();
  json payload = {{"action", is_draft ? "created" : "published"}};
  add_sender(payload, item, "author");
  payload["release"] = std::move(item);
  payload["repository"] = repository_;
  return {delivery_prefix_ + "release-" + id, "release", dump(payload)};
}

}  // namespace backhaul::github
