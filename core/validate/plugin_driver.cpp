#include "core/validate/plugin_driver.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/common/json_check.h"
#include "core/plugins/plugin.h"
#include "core/validate/isolation.h"
#include <cxxabi.h>
#include <dlfcn.h>
#include <malloc.h>

#if defined(__SANITIZE_ADDRESS__)
#define BACKHAUL_VALIDATE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BACKHAUL_VALIDATE_ASAN 1
#endif
#endif

#ifdef BACKHAUL_VALIDATE_ASAN
extern "C" size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace backhaul::validate {
namespace {

constexpr size_t kMaxEventsPerPage = 1'000'000;  // more is a corrupt page, not a big one
constexpr size_t kMaxMessageShown = 400;

backhaul_string_t c_string(std::string_view s) { return {s.data(), s.size()}; }
backhaul_string_t c_optional(const std::optional<std::string>& s) {
  return s ? c_string(*s) : backhaul_string_t{nullptr, 0};
}

backhaul_unit_t c_unit(const UnitSpec& unit) {
  backhaul_unit_t c{};
  c.struct_size = sizeof(c);
  c.installation_id = c_string(unit.installation_id);
  c.resource.id = c_string(unit.resource_id);
  c.resource.name = c_optional(unit.resource_name);
  c.access_token = c_string(unit.access_token);
  return c;
}

std::string current_exception_type() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  if (!type) return "unknown type";
  int status = 0;
  char* name = abi::__cxa_demangle(type->name(), nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : type->name();
  std::free(name);
  return out;
}

// Runs one raw ABI call. An exception must never come out of one; if it does, that is the
// finding (the process would std::terminate in a host built without exception support).
// Also leaves a note of the call for a crash report (note_activity).
template <class Fn>
auto guarded(const char* call, Fn&& fn) -> decltype(fn()) {
  const std::string activity = std::string("in ") + call + "()";
  note_activity(activity.c_str());
  try {
    auto result = fn();
    note_activity("");
    return result;
  } catch (const std::exception& e) {
    throw AbiViolation(std::string(call) + " let a C++ exception cross the ABI (" +
                       current_exception_type() + ": " + e.what() + ")");
  } catch (...) {
    throw AbiViolation(std::string(call) + " let a C++ exception cross the ABI (" +
                       current_exception_type() + ")");
  }
}

CallResult result_of(backhaul_status_t status, const backhaul_error_t& error) {
  CallResult r;
  r.status = status;
  if (status != BACKHAUL_OK) {
    r.message.assign(error.message, strnlen(error.message, sizeof error.message));
    r.retry_after_ms = error.retry_after_ms;
  }
  return r;
}

std::string json_kind(const nlohmann::json& j) { return j.type_name(); }

void inspect_payload(std::string_view payload, EventFacts& facts) {
  facts.payload_hash = fnv1a(payload);
  // The pipeline's own check first (every byte: nlohmann's reader stops at a NUL, and
  // "{}\0garbage" read as "{}"), then nlohmann for the value's kind.
  auto doc = is_json(payload)
                 ? nlohmann::json::parse(payload.begin(), payload.end(), nullptr, false)
                 : nlohmann::json(nlohmann::json::value_t::discarded);
  if (doc.is_discarded()) {
    facts.payload_problem = "is not valid JSON";
  } else if (!doc.is_object()) {
    facts.payload_problem = "is a JSON " + json_kind(doc) + ", not an object";
  } else {
    facts.payload_is_object = true;
  }
}

std::optional<std::string> copy_string(backhaul_string_t s) {
  if (!s.data) return std::nullopt;
  return std::string(s.data, s.size);
}

PageFacts facts_of(const backhaul_page_t& page) {
  PageFacts f;
  f.struct_size = page.struct_size;
  if (page.struct_size < sizeof(backhaul_page_t)) {
    // The problem is recorded, and nothing past struct_size is read: the plugin may have
    // allocated only that much.
    f.problems = plugins::page_problems(page);
    return f;
  }
  f.raw_count = page.raw_count;
  f.next_cursor = copy_string(page.next_cursor);
  if (page.events && page.event_count > kMaxEventsPerPage) {
    f.problems.push_back("event_count " + std::to_string(page.event_count) + " is implausible");
    return f;
  }
  // The daemon's own checks (it refuses such a page), so that validate fails what it would.
  f.problems = plugins::page_problems(page);
  if (!page.events) return f;
  f.events.reserve(page.event_count);
  for (size_t i = 0; i < page.event_count; ++i) {
    const backhaul_event_t& e = page.events[i];
    EventFacts ef;
    ef.delivery_id = copy_string(e.delivery_id).value_or("");
    ef.event_type = copy_string(e.event_type).value_or("");
    inspect_payload(e.payload_json.data ? std::string_view(e.payload_json.data, e.payload_json.size)
                                        : std::string_view(),
                    ef);
    f.events.push_back(std::move(ef));
  }
  return f;
}

}  // namespace

std::string status_text(backhaul_status_t status) {
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
      return "status " + std::to_string(status);
  }
}

std::string CallResult::describe() const {
  std::string text = status_text(status);
  if (!message.empty()) {
    text += ": " + message.substr(0, kMaxMessageShown);
    if (message.size() > kMaxMessageShown) text += "...";
  }
  return text;
}

int64_t heap_in_use() {
#ifdef BACKHAUL_VALIDATE_ASAN
  return static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
#else
  struct mallinfo2 info = ::mallinfo2();
  return static_cast<int64_t>(info.uordblks + info.hblkhd);
#endif
}

// --- handles ------------------------------------------------------------------------------------

PageHandle::PageHandle(PageHandle&& other) noexcept
    : driver_(other.driver_),
      instance_(other.instance_),
      page_(std::exchange(other.page_, nullptr)) {}

PageHandle::~PageHandle() {
  if (page_) driver_->release(instance_, page_);
}

PageFacts PageHandle::facts() const {
  note_activity("while reading a page returned by fetch_page()");
  PageFacts facts = facts_of(*page_);
  note_activity("");
  return facts;
}

InstanceHandle::InstanceHandle(InstanceHandle&& other) noexcept
    : driver_(other.driver_), instance_(std::exchange(other.instance_, nullptr)) {}

InstanceHandle::~InstanceHandle() {
  if (instance_) driver_->destroy(instance_);
}

// --- driver -------------------------------------------------------------------------------------

PluginDriver::PluginDriver(const std::filesystem::path& path, http::Transport& transport,
                           const Clock& clock)
    : services_{transport, clock}, handle_(nullptr, &::dlclose) {
  services_.on_plugin_log = [this](std::string_view line) { saw_log(line); };
  note_activity("while loading the plugin (library constructors or init())");
  handle_.reset(::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (!handle_) {
    const char* error = ::dlerror();
    throw PluginLoadError(path.string() +
                          ": cannot be loaded: " + (error ? error : "dlopen failed"));
  }
  entry_ = static_cast<const backhaul_entry_t*>(::dlsym(handle_.get(), BACKHAUL_ENTRY_SYMBOL));
  if (!entry_ || !entry_->descriptor || !entry_->descriptor->id)
    throw PluginLoadError(path.string() + ": no usable " BACKHAUL_ENTRY_SYMBOL);
  host_ = std::make_unique<plugins::HostBinding>(services_, entry_->descriptor->id);
  backhaul_error_t error{};
  if (!entry_->init(host_->c_host(), &error)) {
    entry_ = nullptr;  // no deinit after a failed init
    throw PluginLoadError(path.string() + ": init failed: " +
                          std::string(error.message, strnlen(error.message, sizeof error.message)));
  }
  note_activity("");
}

// deinit(), then (members) the host binding, then unmap. Every instance and page must be gone:
// checks declare their handles after the driver, so they are destroyed first.
PluginDriver::~PluginDriver() {
  note_activity("in deinit()");
  if (entry_) entry_->deinit();
  note_activity("");
}

CallResult PluginDriver::validate_config(std::string_view config_json) const {
  backhaul_error_t error{};
  backhaul_status_t status = guarded(
      "validate_config", [&] { return entry_->validate_config(c_string(config_json), &error); });
  return result_of(status, error);
}

std::optional<InstanceHandle> PluginDriver::create(std::string_view config_json,
                                                   CallResult& result) const {
  backhaul_instance_t* instance = nullptr;
  backhaul_error_t error{};
  backhaul_status_t status =
      guarded("create", [&] { return entry_->create(c_string(config_json), &instance, &error); });
  result = result_of(status, error);
  if (status == BACKHAUL_OK) {
    if (!instance) throw AbiViolation("create returned OK without an instance");
    return InstanceHandle(this, instance);
  }
  if (instance) {
    throw AbiViolation("create returned " + status_text(status) +
                       " but stored an instance (a failed create must leave *instance NULL)");
  }
  return std::nullopt;
}

InstanceHandle PluginDriver::create_or_throw(std::string_view config_json) const {
  CallResult result;
  std::optional<InstanceHandle> instance = create(config_json, result);
  if (!instance) throw Error("create(config) failed: " + result.describe());
  return std::move(*instance);
}

FetchOutcome PluginDriver::fetch(backhaul_instance_t* instance, const FetchSpec& spec) const {
  backhaul_fetch_request_t request{};
  request.struct_size = sizeof(request);
  request.unit = c_unit(spec.unit);
  request.entity_type = c_string(spec.entity_type);
  request.since_unix_ms = spec.since_unix_ms;
  request.cursor = c_optional(spec.cursor);
  backhaul_page_t* page = nullptr;
  backhaul_error_t error{};
  backhaul_status_t status =
      guarded("fetch_page", [&] { return entry_->fetch_page(instance, &request, &page, &error); });
  FetchOutcome out{result_of(status, error), std::nullopt};
  if (status == BACKHAUL_OK) {
    if (!page) throw AbiViolation("fetch_page returned OK without a page");
    out.page.emplace(this, instance, page);
    return out;
  }
  if (page) {
    release(instance, page);
    throw AbiViolation("fetch_page returned " + status_text(status) +
                       " and a page (a failed call must leave *page NULL)");
  }
  return out;
}

CallResult PluginDriver::validate_scopes(backhaul_instance_t* instance,
                                         const UnitSpec& unit) const {
  backhaul_unit_t c = c_unit(unit);
  backhaul_error_t error{};
  backhaul_status_t status =
      guarded("validate_scopes", [&] { return entry_->validate_scopes(instance, &c, &error); });
  return result_of(status, error);
}

void PluginDriver::watch_logs_for(std::string secret) {
  std::lock_guard lock(log_mutex_);
  secret_ = std::move(secret);
}

std::optional<std::string> PluginDriver::logged_secret() const {
  std::lock_guard lock(log_mutex_);
  return logged_secret_;
}

void PluginDriver::saw_log(std::string_view line) {
  std::lock_guard lock(log_mutex_);
  if (!logged_secret_ && !secret_.empty() && line.find(secret_) != std::string_view::npos)
    logged_secret_ = std::string(line);
}

void PluginDriver::release(backhaul_instance_t* instance, backhaul_page_t* page) const {
  note_activity("in release_page()");
  entry_->release_page(instance, page);
  note_activity("");
}

void PluginDriver::destroy(backhaul_instance_t* instance) const {
  note_activity("in destroy()");
  entry_->destroy(instance);
  note_activity("");
}

}  // namespace backhaul::validate
