#include "core/plugins/plugin.h"

#include <algorithm>
#include <exception>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "core/common/json_check.h"
#include "core/common/logging.h"
#include "core/plugins/isolation.h"
#include "core/plugins/loaded_library.h"

namespace backhaul::plugins {

std::string_view status_name(backhaul_status_t status) {
  switch (status) {
    case BACKHAUL_OK:
      return "OK";
    case BACKHAUL_RETRYABLE:
      return "RETRYABLE";
    case BACKHAUL_RATE_LIMITED:
      return "RATE_LIMITED";
    case BACKHAUL_AUTH_EXPIRED:
      return "AUTH_EXPIRED";
    case BACKHAUL_FATAL:
      return "FATAL";
    case BACKHAUL_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    default:
      return "UNKNOWN_STATUS";
  }
}

namespace {

backhaul_string_t c_string(std::string_view s) { return {s.data(), s.size()}; }
backhaul_string_t c_optional(const std::optional<std::string>& s) {
  return s ? c_string(*s) : backhaul_string_t{nullptr, 0};
}

backhaul_unit_t c_unit(const Unit& unit) {
  backhaul_unit_t c{};
  c.struct_size = sizeof(c);
  c.installation_id = c_string(unit.installation_id);
  c.resource.id = c_string(unit.resource_id);
  c.resource.name = c_optional(unit.resource_name);
  c.access_token = c_string(unit.access_token);
  return c;
}

[[noreturn]] void throw_failure(const PluginInfo& info, std::string_view call,
                                backhaul_status_t status, const backhaul_error_t& error) {
  backhaul_error_t copy = error;
  copy.message[sizeof(copy.message) - 1] = '\0';
  throw plugin_failure("plugin '" + info.id + "' returned unknown status " +
                           std::to_string(status) + " from " + std::string(call),
                       status, copy.message, error.retry_after_ms);
}

// What the exception in flight says, for a message (inside a catch only).
std::string current_exception_text() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Runs one plugin call that returns a status. An exception must never cross the C ABI; one that
// does is the plugin's bug and becomes a FATAL failure naming the call, never the caller's
// exception (which might be anything, not even a std::exception).
template <class Fn>
backhaul_status_t guarded(const PluginInfo& info, const char* call, Fn&& fn) {
  try {
    return fn();
  } catch (...) {
    throw ConnectorFailure(BACKHAUL_FATAL,
                           "plugin '" + info.id + "' let a C++ exception cross the ABI in " + call +
                               ": " + current_exception_text(),
                           0);
  }
}

// The same for calls that return nothing and run where nothing may throw (destructors).
template <class Fn>
void guarded_noexcept(const PluginInfo& info, const char* call, Fn&& fn) noexcept {
  try {
    fn();
  } catch (...) {
    try {
      logging::get("plugins")->error("plugin '{}' let a C++ exception cross the ABI in {}: {}",
                                     info.id, call, current_exception_text());
    } catch (...) {
    }
  }
}

}  // namespace

ConnectorFailure plugin_failure(std::string_view who, backhaul_status_t status, std::string message,
                                int64_t retry_after_ms) {
  if (message.empty()) message = std::string(status_name(status)) + " without a message";
  if (status < BACKHAUL_RETRYABLE || status > BACKHAUL_INVALID_ARGUMENT) {
    message = std::string(who) + ": " + message;
    status = BACKHAUL_FATAL;
  }
  constexpr int64_t kMaxRetryAfterMs = 24LL * 60 * 60 * 1000;
  return ConnectorFailure(status, message,
                          std::clamp<int64_t>(retry_after_ms, 0, kMaxRetryAfterMs));
}

void check_page(std::string_view plugin_id, const backhaul_page_t& page) {
  std::vector<std::string> problems = page_problems(page);
  if (problems.empty()) {
    // Two different events under one delivery id: the gateway would keep one and drop the other
    // as a duplicate (the same event twice is harmless).
    std::unordered_map<std::string_view, std::string_view> payload_of;
    for (size_t i = 0; i < page.event_count && problems.empty(); ++i) {
      const backhaul_event_t& e = page.events[i];
      const std::string_view id(e.delivery_id.data, e.delivery_id.size);
      const std::string_view payload(e.payload_json.data, e.payload_json.size);
      auto [it, inserted] = payload_of.emplace(id, payload);
      if (!inserted && it->second != payload) {
        problems.push_back("event " + std::to_string(i) + ": delivery id \"" +
                           std::string(id.substr(0, 200)) +
                           "\" is also an earlier, different event's");
      }
    }
  }
  if (!problems.empty()) {
    throw ConnectorFailure(
        BACKHAUL_FATAL,
        "plugin '" + std::string(plugin_id) + "' returned a malformed page: " + problems.front(),
        0);
  }
}

std::vector<std::string> page_problems(const backhaul_page_t& page) {
  std::vector<std::string> problems;
  if (page.struct_size < sizeof(backhaul_page_t)) {
    // Nothing past struct_size is read: the plugin may have allocated only that much.
    problems.push_back("page struct_size is " + std::to_string(page.struct_size) +
                       ", expected at least " + std::to_string(sizeof(backhaul_page_t)));
    return problems;
  }
  auto text = [](backhaul_string_t s) { return std::string_view(s.data, s.size); };
  if (!page.next_cursor.data && page.next_cursor.size > 0) {
    problems.push_back("next_cursor has a size but no data");
  } else if (page.next_cursor.data && !is_utf8(text(page.next_cursor))) {
    problems.push_back("next_cursor is not valid UTF-8");
  }
  if (page.event_count > 0 && !page.events) {
    problems.push_back("event_count is " + std::to_string(page.event_count) +
                       " but events is NULL");
    return problems;
  }
  for (size_t i = 0; i < page.event_count; ++i) {
    const backhaul_event_t& e = page.events[i];
    const std::string where = "event " + std::to_string(i) + ": ";
    for (auto [field, value] :
         {std::pair{"delivery_id", e.delivery_id}, std::pair{"event_type", e.event_type}}) {
      if (!value.data) {
        problems.push_back(where + field + " is NULL");
      } else if (value.size == 0) {
        problems.push_back(where + field + " is empty");
      } else if (!is_utf8(text(value))) {
        problems.push_back(where + field + " is not valid UTF-8");
      }
    }
    if (!e.payload_json.data) {
      problems.push_back(where + "payload_json is NULL");
    } else if (const std::string_view payload = text(e.payload_json); !is_json(payload)) {
      problems.push_back(where + "payload_json is not valid JSON");
    } else if (payload.find_first_not_of(" \t\r\n") == std::string_view::npos ||
               payload[payload.find_first_not_of(" \t\r\n")] != '{') {
      // The gateway takes an object (the webhook's body), and refuses anything else with a 400
      // that would end the unit halfway through a page as the gateway's doing.
      problems.push_back(where + "payload_json is not a JSON object");
    }
  }
  return problems;
}

// --- Page ---------------------------------------------------------------------------------------

Page::Page(std::shared_ptr<const LoadedLibrary> library,
           std::shared_ptr<backhaul_instance_t> instance, backhaul_page_t* page) noexcept
    : library_(std::move(library)), instance_(std::move(instance)), page_(page) {}

Page::Page(std::shared_ptr<OwnedPage> owned) noexcept
    : owned_(std::move(owned)), page_(&owned_->page) {}

Page::Page(Page&& other) noexcept
    : library_(std::move(other.library_)),
      instance_(std::move(other.instance_)),
      owned_(std::move(other.owned_)),
      page_(std::exchange(other.page_, nullptr)) {}

Page& Page::operator=(Page&& other) noexcept {
  if (this != &other) {
    Page old(std::move(*this));
    library_ = std::move(other.library_);
    instance_ = std::move(other.instance_);
    owned_ = std::move(other.owned_);
    page_ = std::exchange(other.page_, nullptr);
  }
  return *this;
}

Page::~Page() {
  if (page_ && instance_) {
    guarded_noexcept(library_->info(), "release_page",
                     [&] { library_->entry().release_page(instance_.get(), page_); });
  }
}

EventView Page::event(size_t i) const noexcept {
  const backhaul_event_t& e = page_->events[i];
  auto v = [](backhaul_string_t s) {
    return s.data ? std::string_view(s.data, s.size) : std::string_view();
  };
  return {v(e.delivery_id), v(e.event_type), v(e.payload_json)};
}

std::optional<std::string_view> Page::next_cursor() const noexcept {
  if (!page_->next_cursor.data) return std::nullopt;
  return std::string_view(page_->next_cursor.data, page_->next_cursor.size);
}

std::optional<backhaul_rate_limit_t> Page::rate_limit() const noexcept {
  if (!page_->has_rate_limit) return std::nullopt;
  return page_->rate_limit;
}

// --- Connector ----------------------------------------------------------------------------------

Connector::Connector(std::shared_ptr<const LoadedLibrary> library,
                     std::shared_ptr<backhaul_instance_t> instance) noexcept
    : library_(std::move(library)), instance_(std::move(instance)) {}

Connector::Connector(std::shared_ptr<const LoadedLibrary> library,
                     std::shared_ptr<WorkerPool> workers) noexcept
    : library_(std::move(library)), workers_(std::move(workers)) {}

const PluginInfo& Connector::info() const noexcept {
  return workers_ ? workers_->info() : library_->info();
}

const char* loss_name(WorkerLoss loss) noexcept {
  switch (loss) {
    case WorkerLoss::kCrashed:
      return "crashed";
    case WorkerLoss::kTimedOut:
      return "timed_out";
    case WorkerLoss::kMemory:
      return "memory";
    case WorkerLoss::kStopped:
      return "stopped";
    case WorkerLoss::kMalformed:
      return "malformed";
    case WorkerLoss::kDiedIdle:
      return "died_idle";
  }
  return "unknown";
}

size_t Connector::interrupt_calls() const { return workers_ ? workers_->interrupt() : 0; }

std::optional<WorkerStats> Connector::worker_stats() const {
  if (!workers_) return std::nullopt;
  return workers_->stats();
}

Page Connector::fetch_page(const FetchParams& params) const {
  if (workers_) {
    // Checked in the worker too, but the plugin shares the worker's process and may have written
    // the answer itself.
    std::shared_ptr<OwnedPage> owned = workers_->fetch_page(params);
    check_page(info().id, owned->page);
    return Page(std::move(owned));
  }
  backhaul_fetch_request_t request{};
  request.struct_size = sizeof(request);
  request.unit = c_unit(params.unit);
  request.entity_type = c_string(params.entity_type);
  request.since_unix_ms = params.since_unix_ms;
  request.cursor = c_optional(params.cursor);
  backhaul_page_t* page = nullptr;
  backhaul_error_t error{};
  const PluginInfo& info = library_->info();
  backhaul_status_t status = guarded(info, "fetch_page", [&] {
    return library_->entry().fetch_page(instance_.get(), &request, &page, &error);
  });
  if (status != BACKHAUL_OK) {
    if (page) {  // a contract breach
      guarded_noexcept(info, "release_page",
                       [&] { library_->entry().release_page(instance_.get(), page); });
    }
    throw_failure(info, "fetch_page", status, error);
  }
  if (!page) {
    throw ConnectorFailure(BACKHAUL_FATAL, "plugin '" + info.id + "' returned OK without a page",
                           0);
  }
  // Owned from here: released whatever happens next.
  Page owned(library_, instance_, page);
  check_page(info.id, *page);
  return owned;
}

void Connector::validate_scopes(const Unit& unit) const {
  if (workers_) return workers_->validate_scopes(unit);
  backhaul_unit_t c = c_unit(unit);
  backhaul_error_t error{};
  backhaul_status_t status = guarded(library_->info(), "validate_scopes", [&] {
    return library_->entry().validate_scopes(instance_.get(), &c, &error);
  });
  if (status != BACKHAUL_OK) throw_failure(library_->info(), "validate_scopes", status, error);
}

// --- Plugin -------------------------------------------------------------------------------------

Plugin::Plugin(std::shared_ptr<const LoadedLibrary> library) noexcept
    : library_(std::move(library)) {}

Plugin::Plugin(std::shared_ptr<const IsolatedPlugin> isolated) noexcept
    : isolated_(std::move(isolated)) {}

const PluginInfo& Plugin::info() const noexcept {
  return isolated_ ? isolated_->info : library_->info();
}

void Plugin::validate_config(std::string_view config_json) const {
  if (isolated_) return validate_config_in_worker(*isolated_, config_json);
  backhaul_error_t error{};
  backhaul_status_t status = guarded(library_->info(), "validate_config", [&] {
    return library_->entry().validate_config(c_string(config_json), &error);
  });
  if (status != BACKHAUL_OK) throw_failure(library_->info(), "validate_config", status, error);
}

Connector Plugin::create(std::string_view config_json, FirstWorkerCrash on_crash) const {
  if (isolated_) return create_isolated(config_json, isolated_->options, on_crash);
  backhaul_instance_t* instance = nullptr;
  backhaul_error_t error{};
  backhaul_status_t status = guarded(library_->info(), "create", [&] {
    return library_->entry().create(c_string(config_json), &instance, &error);
  });
  if (status != BACKHAUL_OK) throw_failure(library_->info(), "create", status, error);
  if (!instance) {
    throw ConnectorFailure(
        BACKHAUL_FATAL, "plugin '" + library_->info().id + "' returned OK without an instance", 0);
  }
  // The deleter holds the library too, so the instance is destroyed before the code unmaps.
  std::shared_ptr<const LoadedLibrary> library = library_;
  std::shared_ptr<backhaul_instance_t> owned(instance, [library](backhaul_instance_t* p) {
    guarded_noexcept(library->info(), "destroy", [&] { library->entry().destroy(p); });
  });
  return Connector(library_, std::move(owned));
}

Connector Plugin::create_isolated(std::string_view config_json, const IsolationOptions& options,
                                  FirstWorkerCrash on_crash) const {
  return Connector(library_,
                   std::make_shared<WorkerPool>(info(), std::string(config_json), options,
                                                isolated_ ? isolated_->sealed : nullptr, on_crash));
}

const void* Plugin::extension(const char* id) const {
  if (isolated_) return nullptr;
  const backhaul_entry_t& entry = library_->entry();
  if (entry.abi_version.minor < 1 || !entry.get_extension) return nullptr;
  return entry.get_extension(id);
}

}  // namespace backhaul::plugins
