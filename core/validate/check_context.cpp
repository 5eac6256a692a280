// CheckContext (children, memoized observations, target resolution) and page walks.
#include <algorithm>
#include <cstddef>
#include <set>
#include <system_error>
#include <utility>

#include "core/common/utf8.h"
#include "core/validate/checks.h"
#include <dlfcn.h>
#include <sys/resource.h>

namespace backhaul::validate {
namespace {

using nlohmann::json;

json optional_json(const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); }
std::optional<std::string> optional_from(const json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<std::string>();
}

// --- entry facts, read in a child without init() ------------------------------------------------

json string_or_null(const char* s) { return s ? json(s) : json(nullptr); }

// Reads at most 1000 strings: a corrupt count is reported by the caller, not looped over.
json string_list(const char* const* items, size_t count) {
  if (count > 0 && !items) return nullptr;
  json out = json::array();
  for (size_t i = 0; i < count && i < 1000; ++i) out.push_back(string_or_null(items[i]));
  return out;
}

json descriptor_facts(const backhaul_descriptor_t& d) {
  json out = {{"struct_size", d.struct_size}};
  if (d.struct_size < sizeof(backhaul_descriptor_t)) return out;  // the loader reads no further
  out["id"] = string_or_null(d.id);
  out["version"] = string_or_null(d.version);
  out["display_name"] = string_or_null(d.display_name);
  out["description"] = string_or_null(d.description);
  out["entity_type_count"] = d.entity_type_count;
  out["entity_types"] = string_list(d.entity_types, d.entity_type_count);
  out["default_entity_type_count"] = d.default_entity_type_count;
  out["default_entity_types"] = string_list(d.default_entity_types, d.default_entity_type_count);
  out["config_schema_json"] = string_or_null(d.config_schema_json);
  return out;
}

// Only fields inside the declared struct_size are read, as the loader does.
json entry_facts_of(const backhaul_entry_t& e) {
  json out = {{"found", true}, {"struct_size", e.struct_size}};
  auto has = [&](size_t offset, size_t size) { return e.struct_size >= offset + size; };
  if (has(offsetof(backhaul_entry_t, abi_version), sizeof e.abi_version))
    out["abi"] = {{"major", e.abi_version.major}, {"minor", e.abi_version.minor}};
  if (has(offsetof(backhaul_entry_t, magic), sizeof e.magic)) {
    out["magic"] = {{"magic", e.magic.magic},
                    {"pointer_size", e.magic.pointer_size},
                    {"string_size", e.magic.string_size},
                    {"error_size", e.magic.error_size},
                    {"event_size", e.magic.event_size}};
  }
  json functions = json::object();
#define BACKHAUL_FN_FACT(name) \
  if (has(offsetof(backhaul_entry_t, name), sizeof(void*))) functions[#name] = e.name != nullptr;
  BACKHAUL_FN_FACT(init)
  BACKHAUL_FN_FACT(deinit)
  BACKHAUL_FN_FACT(validate_config)
  BACKHAUL_FN_FACT(create)
  BACKHAUL_FN_FACT(destroy)
  BACKHAUL_FN_FACT(validate_scopes)
  BACKHAUL_FN_FACT(fetch_page)
  BACKHAUL_FN_FACT(release_page)
  BACKHAUL_FN_FACT(get_extension)
#undef BACKHAUL_FN_FACT
  out["functions"] = functions;
  const bool magic_ok = out.contains("magic") && e.magic.magic == BACKHAUL_ABI_MAGIC;
  // Another major's descriptor may be laid out otherwise: read as this one's, it could crash the
  // child, and every check would report that instead of the versions.
  const bool same_major = magic_ok && e.abi_version.major == BACKHAUL_ABI_VERSION_MAJOR;
  if (same_major && has(offsetof(backhaul_entry_t, descriptor), sizeof(void*))) {
    out["descriptor"] = e.descriptor ? descriptor_facts(*e.descriptor) : json(nullptr);
  }
  return out;
}

json read_entry_facts(const std::filesystem::path& path) {
  // dlopen runs the library's constructors: plugin code, hence the child.
  note_activity("in dlopen() (library constructors)");
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  note_activity("while reading backhaul_entry and its descriptor");
  if (!handle) {
    const char* error = ::dlerror();
    return {{"dlopen_error", error ? error : "unknown error"}};
  }
  void* symbol = ::dlsym(handle, BACKHAUL_ENTRY_SYMBOL);
  if (!symbol) return {{"found", false}};
  return entry_facts_of(*static_cast<const backhaul_entry_t*>(symbol));
}

// --- target resolution --------------------------------------------------------------------------

std::vector<std::string> string_vector(const json& j) {
  std::vector<std::string> out;
  if (j.is_array()) {
    for (const json& s : j) {
      if (s.is_string()) out.push_back(s.get<std::string>());
    }
  }
  return out;
}

std::vector<std::string> default_entity_types(const json& info) {
  std::vector<std::string> defaults = string_vector(info.value("default_entity_types", json()));
  if (!defaults.empty()) return defaults;
  std::vector<std::string> all = string_vector(info.value("entity_types", json()));
  if (!all.empty()) return {all.front()};
  return {"item"};
}

}  // namespace

// --- walks --------------------------------------------------------------------------------------

Walk walk_entity(const PluginDriver& driver, backhaul_instance_t* instance, const Target& target,
                 const std::string& entity_type) {
  Walk walk;
  walk.entity_type = entity_type;
  std::set<std::string> seen;
  FetchSpec spec = target.first_page(entity_type);
  for (size_t page = 1;; ++page) {
    if (page > target.max_pages) {
      walk.end = WalkEnd::kPageLimit;
      return walk;
    }
    FetchOutcome out = driver.fetch(instance, spec);
    if (!out.result.ok()) {
      walk.end = WalkEnd::kError;
      walk.error =
          "page " + std::to_string(page) + ": fetch_page returned " + out.result.describe();
      return walk;
    }
    PageFacts facts = out.page->facts();
    out.page.reset();
    std::optional<std::string> next = facts.next_cursor;
    walk.steps.push_back({spec.cursor, std::move(facts)});
    if (!next) {
      walk.end = WalkEnd::kLastPage;
      return walk;
    }
    if (spec.cursor && *next == *spec.cursor) {
      walk.end = WalkEnd::kStuckCursor;
      return walk;
    }
    if (!seen.insert(*next).second) {
      walk.end = WalkEnd::kCursorCycle;
      return walk;
    }
    spec.cursor = std::move(next);
  }
}

Walk walk_entity(const PluginDriver& driver, backhaul_instance_t* instance, const Target& target,
                 const std::string& entity_type, const FixtureTransport& transport) {
  Walk walk = walk_entity(driver, instance, target, entity_type);
  if (walk.end == WalkEnd::kError) {
    if (auto missing = transport.first_unmatched())
      walk.error += " (the fixtures have no recording for " + *missing + ")";
  }
  return walk;
}

json page_to_json(const PageFacts& page) {
  json events = json::array();
  for (const EventFacts& e : page.events) {
    events.push_back({{"id", e.delivery_id},
                      {"type", e.event_type},
                      {"object", e.payload_is_object},
                      {"problem", e.payload_problem},
                      {"hash", e.payload_hash}});
  }
  return {{"struct_size", page.struct_size},
          {"raw_count", page.raw_count},
          {"next", optional_json(page.next_cursor)},
          {"events", std::move(events)},
          {"problems", page.problems}};
}

PageFacts page_from_json(const json& j) {
  PageFacts page;
  page.struct_size = j.at("struct_size").get<uint32_t>();
  page.raw_count = j.at("raw_count").get<uint64_t>();
  page.next_cursor = optional_from(j.at("next"));
  for (const json& e : j.at("events")) {
    page.events.push_back({e.at("id").get<std::string>(), e.at("type").get<std::string>(),
                           e.at("object").get<bool>(), e.at("problem").get<std::string>(),
                           e.at("hash").get<uint64_t>()});
  }
  page.problems = j.at("problems").get<std::vector<std::string>>();
  return page;
}

json walks_to_json(const std::vector<Walk>& walks) {
  json out = json::array();
  for (const Walk& w : walks) {
    json steps = json::array();
    for (const WalkStep& s : w.steps) {
      steps.push_back({{"cursor", optional_json(s.cursor)}, {"page", page_to_json(s.page)}});
    }
    out.push_back({{"entity_type", w.entity_type},
                   {"end", static_cast<int>(w.end)},
                   {"error", w.error},
                   {"steps", std::move(steps)}});
  }
  return out;
}

std::vector<Walk> walks_from_json(const json& j) {
  std::vector<Walk> walks;
  for (const json& w : j) {
    Walk walk;
    walk.entity_type = w.at("entity_type").get<std::string>();
    walk.end = static_cast<WalkEnd>(w.at("end").get<int>());
    walk.error = w.at("error").get<std::string>();
    for (const json& s : w.at("steps")) {
      walk.steps.push_back({optional_from(s.at("cursor")), page_from_json(s.at("page"))});
    }
    walks.push_back(std::move(walk));
  }
  return walks;
}

std::string quote_text(std::string_view text, size_t max) {
  std::string out = "\"" + escape_controls(text.substr(0, max));
  if (text.size() > max) out += "...";
  return out + "\"";
}

// --- CheckContext ------------------------------------------------------------------------------

CheckContext::CheckContext(const ValidateOptions& options, std::optional<Fixtures> fixtures)
    : options_(options), fixtures_(std::move(fixtures)) {}

json CheckContext::in_child(const ChildBody& body) const {
  const ChildLimits child_limits = limits();
  // Plugin strings (ids, cursors) may hold invalid UTF-8: replaced, so that dump() cannot throw.
  ChildOutcome outcome = run_in_child(
      [&] { return body().dump(-1, ' ', false, json::error_handler_t::replace); }, child_limits);
  if (!outcome.returned()) throw ChildFailure(outcome.describe(child_limits));
  json result = json::parse(outcome.payload, nullptr, false);
  if (result.is_discarded()) throw ChildFailure("the child returned an unreadable result");
  return result;
}

json CheckContext::with_fixtures(const FixtureBody& body) const {
  return in_child([&] {
    FakeClock clock(kValidationEpochMs);
    FixtureTransport transport(fixtures_->exchanges);
    PluginDriver driver(options_.plugin_path, transport, clock);
    driver.watch_logs_for(kAccessToken);
    return body(driver, transport);
  });
}

json CheckContext::with_fault(Fault fault, const FaultBody& body) const {
  return in_child([&] {
    FakeClock clock(kValidationEpochMs);
    FaultTransport transport(fault, clock);
    PluginDriver driver(options_.plugin_path, transport, clock);
    driver.watch_logs_for(kAccessToken);
    return body(driver, transport);
  });
}

const json& CheckContext::shared(const std::string& key, const std::function<json()>& compute) {
  if (auto it = shared_.find(key); it != shared_.end()) return it->second;
  if (auto it = shared_failures_.find(key); it != shared_failures_.end())
    throw ChildFailure(it->second);
  try {
    return shared_.emplace(key, compute()).first->second;
  } catch (const ChildFailure& e) {
    shared_failures_.emplace(key, e.what());
    throw;
  }
}

const ElfFacts& CheckContext::elf() {
  if (!elf_) elf_ = inspect_elf(options_.plugin_path, BACKHAUL_ENTRY_SYMBOL);
  return *elf_;
}

const json& CheckContext::entry_facts() {
  return shared("entry_facts",
                [&] { return in_child([&] { return read_entry_facts(options_.plugin_path); }); });
}

const Target& CheckContext::target() {
  if (target_) return *target_;
  const FixtureSettings empty;
  const FixtureSettings& s = fixtures_ ? fixtures_->settings : empty;
  Target t;
  t.plugin_path = options_.plugin_path;
  t.unit.installation_id = s.installation_id.value_or(kDefaultInstallationId);
  t.unit.resource_id = options_.resource_id.value_or(s.resource_id.value_or(kDefaultResourceId));
  t.unit.resource_name = options_.resource_name ? options_.resource_name : s.resource_name;
  if (!t.unit.resource_name && !options_.resource_id && !s.resource_id)
    t.unit.resource_name = kDefaultResourceName;
  t.unit.access_token = kAccessToken;
  t.entity_types = !options_.entity_types.empty() ? options_.entity_types : s.entity_types;
  if (t.entity_types.empty()) t.entity_types = default_entity_types(plugin_info_.value_or(json()));
  t.config_json = options_.config_json.value_or(s.config_json.value_or("{}"));
  t.since_unix_ms = s.since_unix_ms.value_or(0);
  t.max_pages = s.max_pages.value_or(kDefaultMaxPages);
  target_ = std::move(t);
  return *target_;
}

const std::vector<Walk>& CheckContext::baseline() {
  if (baseline_) return *baseline_;
  const Target& t = target();
  const json& result = shared("baseline", [&] {
    return with_fixtures([&](const PluginDriver& driver, FixtureTransport& transport) {
      std::vector<Walk> out;
      {
        InstanceHandle instance = driver.create_or_throw(t.config_json);
        for (const std::string& type : t.entity_types)
          out.push_back(walk_entity(driver, instance.get(), t, type, transport));
      }
      return json{{"walks", walks_to_json(out)},
                  {"logged_token", optional_json(driver.logged_secret())}};
    });
  });
  baseline_ = walks_from_json(result.at("walks"));
  baseline_logged_token_ = optional_from(result.at("logged_token"));
  return *baseline_;
}

size_t worker_stack_bytes(int threads) {
  // What glibc gives a thread: RLIMIT_STACK's soft limit, or 2 MiB when that is unlimited.
  rlimit stack{};
  size_t usual = size_t{8} << 20;
  if (::getrlimit(RLIMIT_STACK, &stack) == 0) {
    usual = stack.rlim_cur == RLIM_INFINITY ? size_t{2} << 20 : static_cast<size_t>(stack.rlim_cur);
  }
  rlimit space{};
  if (threads <= 0 || ::getrlimit(RLIMIT_AS, &space) != 0 || space.rlim_cur == RLIM_INFINITY) {
    return usual;
  }
  const size_t share = static_cast<size_t>(space.rlim_cur / 4 / static_cast<rlim_t>(threads));
  return std::clamp(share, std::min(usual, kMinWorkerStackBytes), usual);
}

WorkerThread::WorkerThread(std::function<void()> run, size_t stack_bytes)
    : run_(std::make_unique<std::function<void()>>(std::move(run))) {
  pthread_attr_t attr;
  int error = ::pthread_attr_init(&attr);
  if (error == 0) {
    error = ::pthread_attr_setstacksize(&attr, stack_bytes);
    if (error == 0) {
      error = ::pthread_create(
          &thread_, &attr,
          [](void* body) -> void* {
            (*static_cast<std::function<void()>*>(body))();
            return nullptr;
          },
          run_.get());
    }
    ::pthread_attr_destroy(&attr);
  }
  if (error != 0) throw std::system_error(error, std::generic_category(), "pthread_create");
  joinable_ = true;
}

WorkerThread::WorkerThread(WorkerThread&& other) noexcept
    : run_(std::move(other.run_)),
      thread_(other.thread_),
      joinable_(std::exchange(other.joinable_, false)) {}

WorkerThread::~WorkerThread() { join(); }

void WorkerThread::join() {
  if (joinable_) ::pthread_join(thread_, nullptr);
  joinable_ = false;
}

std::string on_threads(int threads, const std::function<std::string(int)>& body,
                       const ThreadStarter& start) {
  std::vector<std::string> problems(static_cast<size_t>(threads));
  const size_t stack_bytes = worker_stack_bytes(threads);
  std::vector<WorkerThread> pool;
  std::string not_started;
  for (int k = 0; k < threads; ++k) {
    try {
      std::function<void()> run = [&, k] {
        try {
          problems[static_cast<size_t>(k)] = body(k);
        } catch (const std::exception& e) {
          problems[static_cast<size_t>(k)] = "thread " + std::to_string(k) + ": " + e.what();
        }
      };
      pool.push_back(start ? start(std::move(run)) : WorkerThread(std::move(run), stack_bytes));
    } catch (const std::system_error& e) {
      not_started = "the validator could not start thread " + std::to_string(k + 1) + " of " +
                    std::to_string(threads) + " (" + e.what() +
                    "): ask for fewer --threads, or a larger --memory-limit-mb";
      break;
    }
  }
  for (WorkerThread& thread : pool) thread.join();
  if (!not_started.empty()) return not_started;
  for (const std::string& problem : problems) {
    if (!problem.empty()) return problem;
  }
  return "";
}

}  // namespace backhaul::validate
