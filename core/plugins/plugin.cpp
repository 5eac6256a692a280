#include "core/plugins/plugin.h"

#include <utility>

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

// A status the ABI does not define is the plugin's bug: report it as FATAL, keep the message.
[[noreturn]] void throw_failure(const PluginInfo& info, std::string_view call,
                                backhaul_status_t status, const backhaul_error_t& error) {
  backhaul_error_t copy = error;
  copy.message[sizeof(copy.message) - 1] = '\0';
  std::string message(copy.message);
  if (message.empty()) message = std::string(status_name(status)) + " without a message";
  if (status < BACKHAUL_RETRYABLE || status > BACKHAUL_INVALID_ARGUMENT) {
    message = "plugin '" + info.id + "' returned unknown status " + std::to_string(status) +
              " from " + std::string(call) + ": " + message;
    status = BACKHAUL_FATAL;
  }
  throw ConnectorFailure(status, message, error.retry_after_ms > 0 ? error.retry_after_ms : 0);
}

}  // namespace

// --- Page ---------------------------------------------------------------------------------------

Page::Page(std::shared_ptr<const LoadedLibrary> library,
           std::shared_ptr<backhaul_instance_t> instance, backhaul_page_t* page) noexcept
    : library_(std::move(library)), instance_(std::move(instance)), page_(page) {}

Page::Page(Page&& other) noexcept
    : library_(std::move(other.library_)),
      instance_(std::move(other.instance_)),
      page_(std::exchange(other.page_, nullptr)) {}

Page& Page::operator=(Page&& other) noexcept {
  if (this != &other) {
    Page old(std::move(*this));
    library_ = std::move(other.library_);
    instance_ = std::move(other.instance_);
    page_ = std::exchange(other.page_, nullptr);
  }
  return *this;
}

Page::~Page() {
  if (page_) library_->entry().release_page(instance_.get(), page_);
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

const PluginInfo& Connector::info() const noexcept { return library_->info(); }

Page Connector::fetch_page(const FetchParams& params) const {
  backhaul_fetch_request_t request{};
  request.struct_size = sizeof(request);
  request.unit = c_unit(params.unit);
  request.entity_type = c_string(params.entity_type);
  request.since_unix_ms = params.since_unix_ms;
  request.cursor = c_optional(params.cursor);
  backhaul_page_t* page = nullptr;
  backhaul_error_t error{};
  backhaul_status_t status = library_->entry().fetch_page(instance_.get(), &request, &page, &error);
  if (status != BACKHAUL_OK) {
    if (page) library_->entry().release_page(instance_.get(), page);  // a contract breach
    throw_failure(library_->info(), "fetch_page", status, error);
  }
  if (!page) {
    throw ConnectorFailure(BACKHAUL_FATAL,
                           "plugin '" + library_->info().id + "' returned OK without a page", 0);
  }
  return Page(library_, instance_, page);
}

void Connector::validate_scopes(const Unit& unit) const {
  backhaul_unit_t c = c_unit(unit);
  backhaul_error_t error{};
  backhaul_status_t status = library_->entry().validate_scopes(instance_.get(), &c, &error);
  if (status != BACKHAUL_OK) throw_failure(library_->info(), "validate_scopes", status, error);
}

// --- Plugin -------------------------------------------------------------------------------------

Plugin::Plugin(std::shared_ptr<const LoadedLibrary> library) noexcept
    : library_(std::move(library)) {}

const PluginInfo& Plugin::info() const noexcept { return library_->info(); }

void Plugin::validate_config(std::string_view config_json) const {
  backhaul_error_t error{};
  backhaul_status_t status = library_->entry().validate_config(c_string(config_json), &error);
  if (status != BACKHAUL_OK) throw_failure(library_->info(), "validate_config", status, error);
}

Connector Plugin::create(std::string_view config_json) const {
  backhaul_instance_t* instance = nullptr;
  backhaul_error_t error{};
  backhaul_status_t status = library_->entry().create(c_string(config_json), &instance, &error);
  if (status != BACKHAUL_OK) throw_failure(library_->info(), "create", status, error);
  if (!instance) {
    throw ConnectorFailure(
        BACKHAUL_FATAL, "plugin '" + library_->info().id + "' returned OK without an instance", 0);
  }
  // The deleter holds the library too, so the instance is destroyed before the code unmaps.
  std::shared_ptr<const LoadedLibrary> library = library_;
  std::shared_ptr<backhaul_instance_t> owned(
      instance, [library](backhaul_instance_t* p) { library->entry().destroy(p); });
  return Connector(library_, std::move(owned));
}

const void* Plugin::extension(const char* id) const {
  const backhaul_entry_t& entry = library_->entry();
  if (entry.abi_version.minor < 1 || !entry.get_extension) return nullptr;
  return entry.get_extension(id);
}

}  // namespace backhaul::plugins
