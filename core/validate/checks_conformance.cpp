// G2: behaviour over the recorded exchanges of a fixtures directory. Most checks judge one
// baseline walk (every target entity type, first page to last, in one child); the checks about
// resuming, determinism, page lifetime, leaks and concurrency run their own children.
#include <map>
#include <set>
#include <thread>

#include "core/validate/checks.h"

namespace backhaul::validate {
namespace {

using nlohmann::json;

constexpr int kLeakWarmup = 3;
constexpr int kLeakCycles = 40;
constexpr int64_t kLeakBytesPerCycle = 32;
constexpr int64_t kLeakMinTotalBytes = 8 * 1024;
constexpr int kConcurrentRounds = 3;

std::string where(const Walk& walk, size_t step) {
  return walk.entity_type + " page " + std::to_string(step + 1);
}

size_t event_count(const std::vector<Walk>& walks) {
  size_t n = 0;
  for (const Walk& w : walks) {
    for (const WalkStep& s : w.steps) n += s.page.events.size();
  }
  return n;
}

size_t page_count(const std::vector<Walk>& walks) {
  size_t n = 0;
  for (const Walk& w : walks) n += w.steps.size();
  return n;
}

std::string totals(const std::vector<Walk>& walks) {
  return std::to_string(page_count(walks)) + " pages, " + std::to_string(event_count(walks)) +
         " events";
}

// The first walk that ended in an error, as a failure reason.
std::optional<std::string> walk_error(const std::vector<Walk>& walks) {
  for (const Walk& w : walks) {
    if (w.end == WalkEnd::kError) return w.entity_type + " " + w.error;
  }
  return std::nullopt;
}

// Runs `judge` over every event of the baseline; the first failure wins. Fails on walk errors
// only if there is nothing at all to judge.
template <class Judge>
Verdict judge_events(CheckContext& ctx, Judge&& judge) {
  const std::vector<Walk>& walks = ctx.baseline();
  for (const Walk& w : walks) {
    for (size_t i = 0; i < w.steps.size(); ++i) {
      const PageFacts& page = w.steps[i].page;
      for (size_t e = 0; e < page.events.size(); ++e) {
        if (auto problem = judge(page.events[e]))
          return fail(where(w, i) + " event " + std::to_string(e + 1) + ": " + *problem);
      }
    }
  }
  if (event_count(walks) == 0) {
    if (auto error = walk_error(walks)) return fail("no events to check: " + *error);
  }
  return pass(std::to_string(event_count(walks)) + " events");
}

// --- the baseline walk --------------------------------------------------------------------------

Verdict fixtures_produce_events(CheckContext& ctx) {
  const std::vector<Walk>& walks = ctx.baseline();
  if (event_count(walks) > 0) return pass(totals(walks));
  if (auto error = walk_error(walks)) return fail(*error);
  return fail(
      "the walk over the fixtures produced no events; the ID and payload checks have "
      "nothing to look at (record pages with items)");
}

Verdict pagination_terminates(CheckContext& ctx) {
  const std::vector<Walk>& walks = ctx.baseline();
  for (const Walk& w : walks) {
    const size_t n = w.steps.size();
    switch (w.end) {
      case WalkEnd::kLastPage:
        break;
      case WalkEnd::kPageLimit:
        return fail(w.entity_type + ": no last page after " + std::to_string(n) +
                    " pages (the page bound; every page had a next_cursor, last " +
                    quote_text(w.steps.back().page.next_cursor.value_or("")) + ")");
      case WalkEnd::kStuckCursor:
      case WalkEnd::kCursorCycle:
        return fail(w.entity_type + ": would never end: page " + std::to_string(n) +
                    " returned next_cursor " +
                    quote_text(w.steps.back().page.next_cursor.value_or("")) +
                    ", which was already used");
      case WalkEnd::kError:
        return fail(w.entity_type + " " + w.error);
    }
  }
  return pass(totals(walks));
}

Verdict cursor_advances(CheckContext& ctx) {
  for (const Walk& w : ctx.baseline()) {
    for (size_t i = 0; i < w.steps.size(); ++i) {
      const WalkStep& s = w.steps[i];
      if (s.cursor && s.page.next_cursor == s.cursor)
        return fail(where(w, i) +
                    " returned the cursor it was given as next_cursor: " + quote_text(*s.cursor));
    }
    if (w.end == WalkEnd::kError && w.steps.empty()) return fail(w.entity_type + " " + w.error);
  }
  return pass("every next_cursor differs from the cursor asked for");
}

// The daemon stores a cursor in the job's checkpoint, which its admin API shows, and so fails the
// job of a page whose next_cursor holds the unit's access token (pipeline.cpp).
Verdict cursors_hide_token(CheckContext& ctx) {
  for (const Walk& w : ctx.baseline()) {
    for (size_t i = 0; i < w.steps.size(); ++i) {
      const auto& next = w.steps[i].page.next_cursor;
      if (next && next->find(kAccessToken) != std::string::npos)
        return fail(where(w, i) + " returned a next_cursor that holds the access token (" +
                    quote_text(*next) +
                    "): the daemon would store it in the checkpoint, so it fails the job");
    }
    if (w.end == WalkEnd::kError && w.steps.empty()) return fail(w.entity_type + " " + w.error);
  }
  return pass("no next_cursor holds the access token");
}

Verdict cursor_never_repeats(CheckContext& ctx) {
  for (const Walk& w : ctx.baseline()) {
    std::map<std::string, size_t> first_seen;
    for (size_t i = 0; i < w.steps.size(); ++i) {
      const auto& next = w.steps[i].page.next_cursor;
      if (!next) continue;
      auto [it, fresh] = first_seen.emplace(*next, i);
      if (!fresh)
        return fail(where(w, i) + " returned next_cursor " + quote_text(*next) +
                    ", already returned by page " + std::to_string(it->second + 1) + " (a cycle)");
    }
  }
  return pass("no cursor is returned twice in a walk");
}

Verdict page_structure(CheckContext& ctx) {
  const std::vector<Walk>& walks = ctx.baseline();
  for (const Walk& w : walks) {
    for (size_t i = 0; i < w.steps.size(); ++i) {
      if (!w.steps[i].page.problems.empty())
        return fail(where(w, i) + ": " + w.steps[i].page.problems.front());
    }
  }
  if (page_count(walks) == 0) {
    if (auto error = walk_error(walks)) return fail("no page to check: " + *error);
  }
  return pass(std::to_string(page_count(walks)) + " pages well-formed");
}

Verdict payloads_are_json_objects(CheckContext& ctx) {
  return judge_events(ctx, [](const EventFacts& e) -> std::optional<std::string> {
    if (e.payload_is_object) return std::nullopt;
    return "payload " + e.payload_problem;
  });
}

Verdict event_types_non_empty(CheckContext& ctx) {
  return judge_events(ctx, [](const EventFacts& e) -> std::optional<std::string> {
    if (!e.event_type.empty()) return std::nullopt;
    return "event_type is empty (delivery id " + quote_text(e.delivery_id) + ")";
  });
}

Verdict raw_count_covers_events(CheckContext& ctx) {
  for (const Walk& w : ctx.baseline()) {
    for (size_t i = 0; i < w.steps.size(); ++i) {
      const PageFacts& p = w.steps[i].page;
      if (p.raw_count < p.events.size())
        return fail(where(w, i) + ": raw_count " + std::to_string(p.raw_count) + " < " +
                    std::to_string(p.events.size()) + " events");
    }
  }
  return pass("raw_count >= events on every page");
}

Verdict delivery_ids_unique(CheckContext& ctx) {
  std::set<std::string> seen;
  Verdict v = judge_events(ctx, [&](const EventFacts& e) -> std::optional<std::string> {
    if (e.delivery_id.empty()) return std::string("delivery_id is empty");
    if (!seen.insert(e.delivery_id).second)
      return "delivery_id " + quote_text(e.delivery_id) + " was already delivered";
    return std::nullopt;
  });
  if (v.status == CheckStatus::kPass) v.reason = std::to_string(seen.size()) + " distinct ids";
  return v;
}

Verdict delivery_ids_contain_resource_id(CheckContext& ctx) {
  const std::string& resource = ctx.target().unit.resource_id;
  return judge_events(ctx, [&](const EventFacts& e) -> std::optional<std::string> {
    if (e.delivery_id.find(resource) != std::string::npos) return std::nullopt;
    return "delivery_id " + quote_text(e.delivery_id) + " does not contain the resource id " +
           quote_text(resource);
  });
}

// --- further runs
// ---------------------------------------------------------------------------------

// Walks again in another process: two instances, one after the other. Returns both walks.
const json& reruns(CheckContext& ctx) {
  const Target& t = ctx.target();
  return ctx.shared("reruns", [&] {
    return ctx.with_fixtures([&](const PluginDriver& driver, FixtureTransport& transport) {
      json out = json::array();
      for (int run = 0; run < 2; ++run) {
        InstanceHandle instance = driver.create_or_throw(t.config_json);
        std::vector<Walk> walks;
        for (const std::string& type : t.entity_types)
          walks.push_back(walk_entity(driver, instance.get(), t, type, transport));
        out.push_back(walks_to_json(walks));
      }
      return out;
    });
  });
}

std::vector<std::string> ids_of(const std::vector<Walk>& walks) {
  std::vector<std::string> ids;
  for (const Walk& w : walks) {
    for (const WalkStep& s : w.steps) {
      for (const EventFacts& e : s.page.events) ids.push_back(e.delivery_id);
    }
  }
  return ids;
}

std::vector<uint64_t> hashes_of(const std::vector<Walk>& walks) {
  std::vector<uint64_t> hashes;
  for (const Walk& w : walks) {
    for (const WalkStep& s : w.steps) {
      for (const EventFacts& e : s.page.events) hashes.push_back(e.payload_hash);
    }
  }
  return hashes;
}

// Where two id sequences first differ, for the reason.
std::string first_difference(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i])
      return "event " + std::to_string(i + 1) + ": " + quote_text(a[i]) + " then " +
             quote_text(b[i]);
  }
  return std::to_string(a.size()) + " events, then " + std::to_string(b.size());
}

Verdict delivery_ids_deterministic(CheckContext& ctx) {
  const std::vector<std::string> baseline = ids_of(ctx.baseline());
  const json& again = reruns(ctx);
  const std::vector<std::string> same_process = ids_of(walks_from_json(again[0]));
  const std::vector<std::string> second_instance = ids_of(walks_from_json(again[1]));
  if (same_process != baseline)
    return fail("ids differ between two processes (" + first_difference(baseline, same_process) +
                ")");
  if (second_instance != same_process)
    return fail("ids differ between two instances in one process (" +
                first_difference(same_process, second_instance) + ")");
  return pass(std::to_string(baseline.size()) + " ids identical over 3 runs, 2 processes");
}

Verdict payloads_deterministic(CheckContext& ctx) {
  const std::vector<uint64_t> baseline = hashes_of(ctx.baseline());
  const json& again = reruns(ctx);
  for (const json& run : again) {
    const std::vector<Walk> walks = walks_from_json(run);
    const std::vector<uint64_t> hashes = hashes_of(walks);
    for (size_t i = 0; i < std::min(hashes.size(), baseline.size()); ++i) {
      if (hashes[i] != baseline[i])
        return fail("the payload of event " + std::to_string(i + 1) + " (" +
                    quote_text(ids_of(walks)[i]) +
                    ") differs between runs over the same responses");
    }
    if (hashes.size() != baseline.size()) return fail("runs produced different numbers of events");
  }
  return pass("payloads byte-identical over 3 runs");
}

Verdict cursor_resumes(CheckContext& ctx) {
  const Target& t = ctx.target();
  const std::vector<Walk>& walks = ctx.baseline();
  std::vector<std::pair<const Walk*, size_t>> resumable;
  for (const Walk& w : walks) {
    for (size_t i = 0; i < w.steps.size(); ++i) {
      if (w.steps[i].cursor) resumable.emplace_back(&w, i);
    }
  }
  if (resumable.empty()) {
    if (auto error = walk_error(walks)) return fail("nothing to resume: " + *error);
    return pass("single-page walks only: no cursor to resume from");
  }
  // A fresh instance per cursor, in a process that never walked: as after a host restart that
  // resumes from a checkpoint.
  json pages = ctx.with_fixtures([&](const PluginDriver& driver, FixtureTransport&) {
    json out = json::array();
    for (const auto& [walk, i] : resumable) {
      InstanceHandle instance = driver.create_or_throw(t.config_json);
      FetchSpec spec = t.first_page(walk->entity_type);
      spec.cursor = walk->steps[i].cursor;
      FetchOutcome got = driver.fetch(instance.get(), spec);
      out.push_back(got.result.ok() ? page_to_json(got.page->facts())
                                    : json{{"error", got.result.describe()}});
    }
    return out;
  });
  for (size_t k = 0; k < resumable.size(); ++k) {
    const auto& [walk, i] = resumable[k];
    const std::string at = where(*walk, i);
    if (pages[k].contains("error"))
      return fail(at + " resumed from " + quote_text(*walk->steps[i].cursor) +
                  " in a fresh instance: " + pages[k]["error"].get<std::string>());
    const PageFacts got = page_from_json(pages[k]);
    const PageFacts& want = walk->steps[i].page;
    std::vector<std::string> got_ids, want_ids;
    for (const auto& e : got.events) got_ids.push_back(e.delivery_id);
    for (const auto& e : want.events) want_ids.push_back(e.delivery_id);
    if (got_ids != want_ids)
      return fail(at + " resumed in a fresh instance returned other events (" +
                  first_difference(want_ids, got_ids) + ")");
    if (got.next_cursor != want.next_cursor)
      return fail(at + " resumed in a fresh instance returned next_cursor " +
                  quote_text(got.next_cursor.value_or("<none>")) + " instead of " +
                  quote_text(want.next_cursor.value_or("<none>")));
  }
  return pass(std::to_string(resumable.size()) + " cursors resumed in fresh instances");
}

// --- pages: lifetime and release
// ------------------------------------------------------------------

Verdict page_lifetime(CheckContext& ctx) {
  const Target& t = ctx.target();
  json r = ctx.with_fixtures([&](const PluginDriver& driver, FixtureTransport&) -> json {
    InstanceHandle instance = driver.create_or_throw(t.config_json);
    const FetchSpec spec = t.first_page(t.entity_types.front());
    FetchOutcome a = driver.fetch(instance.get(), spec);
    if (!a.result.ok())
      return {{"error", "first page: fetch_page returned " + a.result.describe()}};
    const json before = page_to_json(a.page->facts());
    FetchOutcome b = driver.fetch(instance.get(), spec);
    if (!b.result.ok())
      return {{"error", "first page again: fetch_page returned " + b.result.describe()}};
    if (a.page->get() == b.page->get())
      return {{"problem",
               "fetch_page returned the same page pointer for two pages that are both "
               "still held (a page must stay the host's until release_page)"}};
    if (page_to_json(a.page->facts()) != before)
      return {{"problem",
               "a page changed while the host held it (fetching another page "
               "overwrote it)"}};
    b.page.reset();  // released out of order on purpose
    if (page_to_json(a.page->facts()) != before)
      return {{"problem", "releasing one page changed another that is still held"}};
    return json::object();
  });
  if (r.contains("error")) return fail(r["error"].get<std::string>());
  if (r.contains("problem")) return fail(r["problem"].get<std::string>());
  return pass("two live pages are distinct and stay unchanged until released");
}

Verdict page_release_frees(CheckContext& ctx) {
  const Target& t = ctx.target();
  json r = ctx.with_fixtures([&](const PluginDriver& driver, FixtureTransport&) -> json {
    InstanceHandle instance = driver.create_or_throw(t.config_json);
    const FetchSpec spec = t.first_page(t.entity_types.front());
    auto cycle = [&] {
      FetchOutcome out = driver.fetch(instance.get(), spec);
      if (!out.result.ok()) throw Error("first page: fetch_page returned " + out.result.describe());
    };
    for (int i = 0; i < kLeakWarmup; ++i) cycle();
    const int64_t before = heap_in_use();
    for (int i = 0; i < kLeakCycles; ++i) cycle();
    return {{"growth", heap_in_use() - before}};
  });
  const int64_t growth = r["growth"].get<int64_t>();
  if (growth >= kLeakMinTotalBytes && growth >= kLeakBytesPerCycle * kLeakCycles)
    return fail("the heap grew by " + std::to_string(growth) + " bytes over " +
                std::to_string(kLeakCycles) + " fetch_page/release_page cycles (" +
                std::to_string(growth / kLeakCycles) +
                " per page): release_page does not free the page (or responses are not released)");
  return pass(std::to_string(kLeakCycles) + " cycles, heap change " + std::to_string(growth) +
              " bytes");
}

// --- concurrency
// ----------------------------------------------------------------------------------

// Each thread walks every entity type kConcurrentRounds times: half on the shared instance, half
// on instances of their own. Any difference from the sequential baseline is a failure.
json concurrent_walks(const PluginDriver& driver, FixtureTransport& transport, const Target& t,
                      int threads, const std::vector<std::string>& expected) {
  InstanceHandle shared = driver.create_or_throw(t.config_json);
  const std::string problem = on_threads(threads, [&](int k) -> std::string {
    std::optional<InstanceHandle> own;
    if (k % 2 == 1) own.emplace(driver.create_or_throw(t.config_json));
    backhaul_instance_t* instance = own ? own->get() : shared.get();
    for (int round = 0; round < kConcurrentRounds; ++round) {
      std::vector<Walk> walks;
      for (const std::string& type : t.entity_types)
        walks.push_back(walk_entity(driver, instance, t, type, transport));
      if (ids_of(walks) != expected) {
        return "thread " + std::to_string(k) + " got other events than the sequential walk (" +
               first_difference(expected, ids_of(walks)) + ")";
      }
    }
    return "";
  });
  if (!problem.empty()) return {{"problem", problem}};
  return json::object();
}

Verdict concurrent_fetch(CheckContext& ctx) {
  const Target& t = ctx.target();
  const std::vector<std::string> expected = ids_of(ctx.baseline());
  if (auto error = walk_error(ctx.baseline())) return fail("the sequential walk failed: " + *error);
  const int threads = ctx.options().threads;
  json r = ctx.with_fixtures([&](const PluginDriver& driver, FixtureTransport& transport) {
    return concurrent_walks(driver, transport, t, threads, expected);
  });
  if (r.contains("problem")) return fail(r["problem"].get<std::string>());
  return pass(std::to_string(threads) + " threads x " + std::to_string(kConcurrentRounds) +
              " walks matched the sequential walk");
}

Verdict scopes_accepted(CheckContext& ctx) {
  const Target& t = ctx.target();
  json r = ctx.with_fixtures([&](const PluginDriver& driver, FixtureTransport& transport) -> json {
    InstanceHandle instance = driver.create_or_throw(t.config_json);
    CallResult result = driver.validate_scopes(instance.get(), t.unit);
    json out = {{"ok", result.ok()}, {"text", result.describe()}};
    if (auto missing = transport.first_unmatched()) out["missing"] = *missing;
    return out;
  });
  if (r["ok"].get<bool>()) return pass("validate_scopes returned OK");
  std::string reason = "validate_scopes returned " + r["text"].get<std::string>();
  if (r.contains("missing"))
    reason += " (the fixtures have no recording for " + r["missing"].get<std::string>() + ")";
  return fail(reason);
}

}  // namespace

std::vector<Check> conformance_checks() {
  return {
      {"pagination_terminates", "conformance", 1, Needs::kFixtures,
       "walking from the first page reaches a page without next_cursor within the page bound",
       pagination_terminates},
      {"cursor_advances", "conformance", 1, Needs::kFixtures,
       "every next_cursor differs from the cursor that was asked for", cursor_advances},
      {"cursors_hide_token", "conformance", 1, Needs::kFixtures,
       "no next_cursor holds the access token (the daemon fails such a job)", cursors_hide_token},
      {"page_structure", "conformance", 1, Needs::kFixtures,
       "pages pass the host's page check: full struct_size, non-NULL events and strings, UTF-8 "
       "ids and types, payloads that are JSON objects",
       page_structure},
      {"delivery_ids_unique", "conformance", 1, Needs::kFixtures,
       "delivery ids are non-empty and unique within and across pages", delivery_ids_unique},
      {"delivery_ids_contain_resource_id", "conformance", 1, Needs::kFixtures,
       "every delivery id contains the resource id", delivery_ids_contain_resource_id},
      {"payloads_are_json_objects", "conformance", 1, Needs::kFixtures,
       "every payload is a JSON object", payloads_are_json_objects},
      {"event_types_non_empty", "conformance", 1, Needs::kFixtures, "every event type is non-empty",
       event_types_non_empty},
      {"fixtures_produce_events", "conformance", 2, Needs::kFixtures,
       "the walk over the fixtures yields events (so the checks above judge something)",
       fixtures_produce_events},
      {"raw_count_covers_events", "conformance", 2, Needs::kFixtures,
       "raw_count >= number of events on every page", raw_count_covers_events},
      {"cursor_resumes", "conformance", 2, Needs::kFixtures,
       "every cursor, given to a fresh instance in a process that never walked, returns the same "
       "page",
       cursor_resumes},
      {"delivery_ids_deterministic", "conformance", 2, Needs::kFixtures,
       "delivery ids are identical across runs, instances and processes",
       delivery_ids_deterministic},
      {"scopes_accepted", "conformance", 2, Needs::kFixtures,
       "validate_scopes returns OK for the fixtures' resource", scopes_accepted},
      {"page_lifetime", "conformance", 3, Needs::kFixtures,
       "two pages held at once are distinct and unchanged until released", page_lifetime},
      {"page_release_frees", "conformance", 3, Needs::kFixtures,
       "fetch_page/release_page cycles do not grow the heap (no leaked pages)", page_release_frees},
      {"concurrent_fetch", "conformance", 3, Needs::kFixtures,
       "N threads walking at once, on one shared instance and on their own, get the sequential "
       "results",
       concurrent_fetch},
      {"cursor_never_repeats", "conformance", 6, Needs::kFixtures,
       "no cursor is returned twice in one walk", cursor_never_repeats},
      {"payloads_deterministic", "conformance", 7, Needs::kFixtures,
       "payloads are byte-identical across runs over the same responses", payloads_deterministic},
  };
}

}  // namespace backhaul::validate
