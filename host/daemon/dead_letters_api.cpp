// /v1/dead-letters (SPEC D5): list and filter, stats, get with the job's error history, retry
// one or in bulk, ignore, purge resolved ones older than N days.
#include <algorithm>
#include <initializer_list>

#include "host/daemon/api_support.h"

namespace backhaul::daemon {
namespace {

using host::Response;
using nlohmann::json;

constexpr int64_t kDayMs = 86'400'000;

std::optional<jobs::DeadLetterStatus> status_filter(const std::optional<std::string>& text,
                                                    const char* field) {
  if (!text) return std::nullopt;
  auto status = jobs::parse_dead_letter_status(*text);
  if (!status) {
    throw validation_error(
        field, "must be one of pending, retrying, resolved, ignored (got \"" + *text + "\")");
  }
  return status;
}

jobs::DeadLetter require_letter(Call& call, int64_t id) {
  std::optional<jobs::DeadLetter> letter = call.deps.store.get_dead_letter(id);
  if (!letter) {
    throw not_found("DEAD_LETTER_NOT_FOUND",
                    "dead letter " + std::to_string(id) + " does not exist");
  }
  return *letter;
}

Response list(Call& call) {
  require_known_parameters(call.request, {"status", "kind", "key", "before", "limit"});
  jobs::DeadLetterQuery query;
  query.status = status_filter(query_string(call.request, "status"), "status");
  query.kind = query_string(call.request, "kind");
  query.concurrency_key = query_key(call.request);
  query.before_id = query_int(call.request, "before", 1, INT64_MAX);
  query.limit = query_limit(call.request);
  const jobs::DeadLetterPage page = call.deps.store.list_dead_letters(query);
  json items = json::array();
  for (const jobs::DeadLetter& letter : page.items) items.push_back(dead_letter_json(letter));
  return call.ok(200, page_json(std::move(items), page.next_before));
}

Response stats(Call& call) {
  json items = json::array();
  json by_status = {{"pending", 0}, {"retrying", 0}, {"resolved", 0}, {"ignored", 0}};
  int64_t total = 0;
  for (const auto& [key, count] : call.deps.store.dead_letter_stats()) {
    const std::string status(jobs::to_string(key.second));
    items.push_back({{"kind", key.first}, {"status", status}, {"count", count}});
    by_status[status] = by_status[status].get<int64_t>() + count;
    total += count;
  }
  return call.ok(200, {{"items", std::move(items)}, {"byStatus", by_status}, {"total", total}});
}

Response get(Call& call, int64_t id) {
  const jobs::DeadLetter letter = require_letter(call, id);
  json body = dead_letter_json(letter);
  if (auto job = call.deps.store.get(letter.job_id)) body["job"] = job_json(*job);
  add_attempt_history(body, call.deps.store, letter.job_id);
  return call.ok(200, std::move(body));
}

Response retry_one(Call& call, int64_t id) {
  require_letter(call, id);
  try {
    call.deps.store.retry_dead_letter(id, call.now_ms());
  } catch (const jobs::JobNotFound& e) {
    // The letter is there (it outlives its pruned job); only a letter that went meanwhile is 404.
    require_letter(call, id);
    throw ApiError(409, "CONFLICT", e.what());
  }
  call.summary = "retry dead letter " + std::to_string(id);
  return call.ok(200, dead_letter_json(require_letter(call, id)));
}

Response retry_bulk(Call& call) {
  const json body = call.json_body();
  require_known_fields(body, {"status", "kind", "key", "limit"});
  jobs::DeadLetterQuery query;
  auto text = [&](const char* field) -> std::optional<std::string> {
    if (!body.contains(field) || body[field].is_null()) return std::nullopt;
    if (!body[field].is_string()) throw validation_error(field, "must be a string");
    return body[field].get<std::string>();
  };
  query.status = status_filter(text("status"), "status");
  // Only pending letters are retried in bulk (one at a time, an ignored one may be retried too):
  // another status would select nothing, and "retried 0" would read as "nothing to retry".
  if (query.status && *query.status != jobs::DeadLetterStatus::kPending) {
    throw validation_error("status", "a bulk retry takes pending letters only (got \"" +
                                         std::string(to_string(*query.status)) + "\")");
  }
  query.kind = text("kind");
  // As the list's filter: an empty kind would select nothing and read as "nothing to retry"; an
  // empty key selects the letters without a concurrency key.
  if (query.kind && query.kind->empty()) throw validation_error("kind", "must not be empty");
  query.concurrency_key = text("key");
  if (!body.contains("limit")) throw validation_error("limit", "is required");
  if (!body["limit"].is_number_integer() || body["limit"].get<int64_t>() < 1 ||
      body["limit"].get<int64_t>() > 10'000) {
    throw validation_error("limit", "must be an integer between 1 and 10000");
  }
  const size_t limit = body["limit"].get<size_t>();
  query.limit = limit;
  const int retried = call.deps.store.retry_dead_letters(query, limit, call.now_ms());
  call.summary = "retry " + std::to_string(retried) + " dead letters";
  return call.ok(200, {{"retried", retried}});
}

Response ignore(Call& call, int64_t id) {
  require_letter(call, id);
  call.deps.store.ignore_dead_letter(id, call.now_ms());
  call.summary = "ignore dead letter " + std::to_string(id);
  return call.ok(200, dead_letter_json(require_letter(call, id)));
}

Response purge(Call& call) {
  const json body = call.json_body();
  require_known_fields(body, {"olderThanDays"});
  if (!body.contains("olderThanDays")) throw validation_error("olderThanDays", "is required");
  if (!body["olderThanDays"].is_number_integer() || body["olderThanDays"].get<int64_t>() < 0 ||
      body["olderThanDays"].get<int64_t>() > 36'500) {
    throw validation_error("olderThanDays", "must be an integer between 0 and 36500");
  }
  const int64_t days = body["olderThanDays"].get<int64_t>();
  const int64_t purged = call.deps.store.purge_dead_letters(call.now_ms() - days * kDayMs);
  call.summary = "purge " + std::to_string(purged) + " dead letters older than " +
                 std::to_string(days) + " days";
  return call.ok(200, {{"purged", purged}, {"olderThanDays", days}});
}

}  // namespace

Response handle_dead_letters(Call& call, Route rest) {
  auto only = [&](std::string_view allowed) { allow_only(call, {allowed}); };
  if (rest.empty()) {
    only("GET");
    return list(call);
  }
  if (rest.size() == 1 && rest[0] == "stats") {
    only("GET");
    return stats(call);
  }
  if (rest.size() == 1 && rest[0] == "retry") {
    only("POST");
    return retry_bulk(call);
  }
  if (rest.size() == 1 && rest[0] == "purge") {
    only("POST");
    return purge(call);
  }
  const int64_t id = path_id(call, rest[0]);
  if (rest.size() == 1) {
    only("GET");
    return get(call, id);
  }
  if (rest.size() == 2 && rest[1] == "retry") {
    only("POST");
    return retry_one(call, id);
  }
  if (rest.size() == 2 && rest[1] == "ignore") {
    only("POST");
    return ignore(call, id);
  }
  throw not_found("NOT_FOUND", "no route for " + call.request.path);
}

}  // namespace backhaul::daemon
