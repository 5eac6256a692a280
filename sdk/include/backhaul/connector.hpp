// Header-only C++17 layer over the C ABI: derive from backhaul::sdk::Connector, describe it with a
// backhaul_descriptor_t (connector.h), and export both with BACKHAUL_DEFINE_CONNECTOR. Every
// trampoline is noexcept and translates exceptions into statuses in one place (call_guarded).
#ifndef BACKHAUL_CONNECTOR_HPP
#define BACKHAUL_CONNECTOR_HPP

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backhaul/backhaul.h"
#include "backhaul/host.hpp"

namespace backhaul::sdk {

// A failure with the status to report across the ABI. Throw it from connector code.
class Error : public std::runtime_error {
 public:
  Error(backhaul_status_t status, const std::string& message, int64_t retry_after_ms = 0)
      : std::runtime_error(message), status_(status), retry_after_ms_(retry_after_ms) {}
  backhaul_status_t status() const noexcept { return status_; }
  int64_t retry_after_ms() const noexcept { return retry_after_ms_; }

 private:
  backhaul_status_t status_;
  int64_t retry_after_ms_;
};

// `message` with `secret` (an access token) replaced by "[redacted]": for messages that quote a
// provider's error body or a host's error, which should never hold the token but might. A secret
// of 8 bytes or more is replaced wherever it occurs; a shorter one (a test value) only where it
// stands alone, not inside a longer run of letters, digits, '_' and '-', so that a token "a" does
// not turn every "a" of the message into "[redacted]". An empty secret changes nothing.
inline std::string redact_secret(std::string message, std::string_view secret) {
  static constexpr std::string_view kRedacted = "[redacted]";
  if (secret.empty()) return message;
  const auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  };
  const bool anywhere = secret.size() >= 8;
  for (size_t at = message.find(secret); at != std::string::npos;) {
    const size_t end = at + secret.size();
    if (anywhere ||
        ((at == 0 || !word(message[at - 1])) && (end == message.size() || !word(message[end])))) {
      message.replace(at, secret.size(), kRedacted);
      at = message.find(secret, at + kRedacted.size());
    } else {
      at = message.find(secret, at + 1);
    }
  }
  return message;
}

inline std::string_view view(backhaul_string_t s) noexcept {
  return s.data ? std::string_view(s.data, s.size) : std::string_view();
}
inline std::optional<std::string_view> optional_view(backhaul_string_t s) noexcept {
  if (!s.data) return std::nullopt;
  return std::string_view(s.data, s.size);
}
inline backhaul_string_t c_string(std::string_view s) noexcept { return {s.data(), s.size()}; }

// Writes `message` (truncated) and the retry hint into a caller-owned error.
inline void set_error(backhaul_error_t* error, std::string_view message,
                      int64_t retry_after_ms = 0) noexcept {
  if (!error) return;
  size_t n = std::min(message.size(), sizeof(error->message) - 1);
  std::memcpy(error->message, message.data(), n);
  error->message[n] = '\0';
  error->retry_after_ms = retry_after_ms;
}

// Runs `fn` and maps what it throws to a status; never lets an exception escape.
template <class Fn>
backhaul_status_t call_guarded(backhaul_error_t* error, Fn&& fn) noexcept {
  try {
    fn();
    return BACKHAUL_OK;
  } catch (const Error& e) {
    set_error(error, e.what(), e.retry_after_ms());
    return e.status();
  } catch (const HostError& e) {
    set_error(error, e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_error(error, "out of memory");
    return BACKHAUL_RETRYABLE;
  } catch (const std::exception& e) {
    set_error(error, std::string("connector error: ") + e.what());
    return BACKHAUL_FATAL;
  } catch (...) {
    set_error(error, "connector error: unknown exception");
    return BACKHAUL_FATAL;
  }
}

struct Unit {
  std::string_view installation_id;
  std::string_view resource_id;
  std::optional<std::string_view> resource_name;
  std::string_view access_token;

  static Unit from(const backhaul_unit_t& u) {
    return {view(u.installation_id), view(u.resource.id), optional_view(u.resource.name),
            view(u.access_token)};
  }
};

struct FetchRequest {
  Unit unit;
  std::string_view entity_type;
  int64_t since_unix_ms = 0;
  std::optional<std::string_view> cursor;  // nullopt: first page
};

struct Event {
  std::string delivery_id;
  std::string event_type;
  std::string payload_json;
};

struct RateLimit {
  int64_t remaining = 0;
  int64_t limit = 0;
  int64_t reset_at_unix_ms = 0;
};

struct Page {
  std::vector<Event> events;
  std::optional<std::string> next_cursor;  // nullopt: last page
  uint64_t raw_count = 0;
  std::optional<RateLimit> rate_limit;
};

// Base class of a connector instance. One instance serves many concurrent calls, so
// fetch_page and validate_scopes must be safe to run at once (keep per-call state on the stack).
// A connector class T also provides:
//   static void validate_config(std::string_view config_json);   // throws Error
//   explicit T(std::string_view config_json);                     // throws Error
class Connector {
 public:
  virtual ~Connector() = default;
  virtual void validate_scopes(const Unit& unit) = 0;
  virtual Page fetch_page(const FetchRequest& request) = 0;
};

namespace detail {

// A page as the C ABI sees it, with the storage its pointers point into.
struct OwnedPage {
  backhaul_page_t page{};
  std::vector<Event> events;
  std::vector<backhaul_event_t> views;
  std::string next_cursor;
};

inline backhaul_page_t* to_c_page(Page&& page) {
  auto owned = std::make_unique<OwnedPage>();
  owned->events = std::move(page.events);
  owned->views.reserve(owned->events.size());
  for (const Event& e : owned->events) {
    owned->views.push_back(
        {c_string(e.delivery_id), c_string(e.event_type), c_string(e.payload_json)});
  }
  backhaul_page_t& c = owned->page;
  c.struct_size = sizeof(backhaul_page_t);
  c.events = owned->views.data();
  c.event_count = owned->views.size();
  if (page.next_cursor) {
    owned->next_cursor = std::move(*page.next_cursor);
    c.next_cursor = c_string(owned->next_cursor);
  } else {
    c.next_cursor = {nullptr, 0};
  }
  c.raw_count = std::max<uint64_t>(page.raw_count, owned->views.size());
  if (page.rate_limit) {
    c.has_rate_limit = 1;
    c.rate_limit = {page.rate_limit->remaining, page.rate_limit->limit,
                    page.rate_limit->reset_at_unix_ms};
  }
  // `page` is the first member, so the C pointer is the OwnedPage's address.
  return &owned.release()->page;
}

template <class T>
struct Trampolines {
  static int32_t init(const backhaul_host_t* host, backhaul_error_t* error) noexcept {
    if (!host || host->struct_size < sizeof(backhaul_host_t)) {
      set_error(error, "host services struct is missing or too old");
      return 0;
    }
    detail::set_host(host);
    return 1;
  }
  static void deinit() noexcept { detail::set_host(nullptr); }

  static backhaul_status_t validate_config(backhaul_string_t config,
                                           backhaul_error_t* error) noexcept {
    return call_guarded(error, [&] { T::validate_config(view(config)); });
  }

  static backhaul_status_t create(backhaul_string_t config, backhaul_instance_t** instance,
                                  backhaul_error_t* error) noexcept {
    if (!instance) {
      set_error(error, "create: instance out-pointer is null");
      return BACKHAUL_INVALID_ARGUMENT;
    }
    *instance = nullptr;
    return call_guarded(error, [&] {
      Connector* object = new T(view(config));
      *instance = reinterpret_cast<backhaul_instance_t*>(object);
    });
  }

  static void destroy(backhaul_instance_t* instance) noexcept {
    delete reinterpret_cast<Connector*>(instance);
  }

  static backhaul_status_t validate_scopes(backhaul_instance_t* instance,
                                           const backhaul_unit_t* unit,
                                           backhaul_error_t* error) noexcept {
    if (!instance || !unit) {
      set_error(error, "validate_scopes: null instance or unit");
      return BACKHAUL_INVALID_ARGUMENT;
    }
    return call_guarded(
        error, [&] { reinterpret_cast<Connector*>(instance)->validate_scopes(Unit::from(*unit)); });
  }

  static backhaul_status_t fetch_page(backhaul_instance_t* instance,
                                      const backhaul_fetch_request_t* request,
                                      backhaul_page_t** page, backhaul_error_t* error) noexcept {
    if (!page) {
      set_error(error, "fetch_page: page out-pointer is null");
      return BACKHAUL_INVALID_ARGUMENT;
    }
    *page = nullptr;
    if (!instance || !request) {
      set_error(error, "fetch_page: null instance or request");
      return BACKHAUL_INVALID_ARGUMENT;
    }
    return call_guarded(error, [&] {
      FetchRequest r{Unit::from(request->unit), view(request->entity_type), request->since_unix_ms,
                     optional_view(request->cursor)};
      *page = to_c_page(reinterpret_cast<Connector*>(instance)->fetch_page(r));
    });
  }

  static void release_page(backhaul_instance_t*, backhaul_page_t* page) noexcept {
    delete reinterpret_cast<OwnedPage*>(page);
  }

  static const void* get_extension(const char*) noexcept { return nullptr; }
};

}  // namespace detail
}  // namespace backhaul::sdk

// Defines the exported entry for connector class T, described by `descriptor` (a
// `const backhaul_descriptor_t` with static storage, so the entry is a compile-time constant and
// no plugin code runs before the host has checked it). Use once per plugin, at global scope.
#define BACKHAUL_DEFINE_CONNECTOR(T, descriptor)                       \
  extern "C" BACKHAUL_EXPORT const backhaul_entry_t backhaul_entry = { \
      sizeof(backhaul_entry_t),                                        \
      BACKHAUL_ABI_VERSION_INIT,                                       \
      BACKHAUL_MAGIC_INIT,                                             \
      &(descriptor),                                                   \
      &::backhaul::sdk::detail::Trampolines<T>::init,                  \
      &::backhaul::sdk::detail::Trampolines<T>::deinit,                \
      &::backhaul::sdk::detail::Trampolines<T>::validate_config,       \
      &::backhaul::sdk::detail::Trampolines<T>::create,                \
      &::backhaul::sdk::detail::Trampolines<T>::destroy,               \
      &::backhaul::sdk::detail::Trampolines<T>::validate_scopes,       \
      &::backhaul::sdk::detail::Trampolines<T>::fetch_page,            \
      &::backhaul::sdk::detail::Trampolines<T>::release_page,          \
      &::backhaul::sdk::detail::Trampolines<T>::get_extension}

#endif  // BACKHAUL_CONNECTOR_HPP
