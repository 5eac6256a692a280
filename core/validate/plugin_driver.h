// Child-side access to a plugin under validation: mapped and initialized with the host's own
// services (HostBinding: the validator's transport and fake clock), then driven through its raw
// backhaul_entry_t so that the checks see exactly what crosses the ABI (null pages, page
// pointers, struct sizes, exceptions that escape). Only ever used inside a child process started
// by run_in_child(): everything here runs plugin code.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backhaul/backhaul.h"

#include "core/common/clock.h"
#include "core/common/errors.h"
#include "core/common/fnv1a.h"
#include "core/http/http.h"
#include "core/plugins/host_services.h"
#include "core/plugins/plugin_loader.h"

namespace backhaul::validate {

// The plugin broke the ABI in a way no status can express: an exception escaped a call, OK came
// without a page or instance, a failure came with one. The check fails with what().
class AbiViolation : public Error {
 public:
  using Error::Error;
};

struct UnitSpec {
  std::string installation_id;
  std::string resource_id;
  std::optional<std::string> resource_name;
  std::string access_token;
};

struct FetchSpec {
  UnitSpec unit;
  std::string entity_type;
  int64_t since_unix_ms = 0;
  std::optional<std::string> cursor;  // nullopt: the first page
};

// What a call returned when it was not a page or an instance.
struct CallResult {
  backhaul_status_t status = BACKHAUL_OK;
  std::string message;
  int64_t retry_after_ms = 0;

  bool ok() const noexcept { return status == BACKHAUL_OK; }
  // "RETRYABLE: github: HTTP 500 for GET ..." (message clipped).
  std::string describe() const;
};

// The name of a status, including ones the ABI does not define ("status 42").
std::string status_text(backhaul_status_t status);

struct EventFacts {
  std::string delivery_id;
  std::string event_type;
  bool payload_is_object = false;
  std::string payload_problem;  // why it is not a JSON object (empty when it is)
  uint64_t payload_hash = 0;    // FNV-1a of the payload text
};

// Everything the checks need from one page, copied out before it is released.
struct PageFacts {
  uint32_t struct_size = 0;
  uint64_t raw_count = 0;
  std::optional<std::string> next_cursor;
  std::vector<EventFacts> events;
  std::vector<std::string> problems;  // structural: null pointers where strings must be
};

class PluginDriver;

// A page owned by the plugin; released back to it on destruction. Move-only.
class PageHandle {
 public:
  PageHandle(const PluginDriver* driver, backhaul_instance_t* instance, backhaul_page_t* page)
      : driver_(driver), instance_(instance), page_(page) {}
  PageHandle(PageHandle&& other) noexcept;
  PageHandle& operator=(PageHandle&&) = delete;
  PageHandle(const PageHandle&) = delete;
  ~PageHandle();

  const backhaul_page_t* get() const noexcept { return page_; }
  PageFacts facts() const;

 private:
  const PluginDriver* driver_;
  backhaul_instance_t* instance_;
  backhaul_page_t* page_;
};

// An instance; destroyed on destruction (its pages must be released first). Move-only.
class InstanceHandle {
 public:
  InstanceHandle(const PluginDriver* driver, backhaul_instance_t* instance)
      : driver_(driver), instance_(instance) {}
  InstanceHandle(InstanceHandle&& other) noexcept;
  InstanceHandle& operator=(InstanceHandle&&) = delete;
  InstanceHandle(const InstanceHandle&) = delete;
  ~InstanceHandle();

  backhaul_instance_t* get() const noexcept { return instance_; }

 private:
  const PluginDriver* driver_;
  backhaul_instance_t* instance_;
};

struct FetchOutcome {
  CallResult result;
  std::optional<PageHandle> page;  // set iff result.ok()
};

class PluginDriver {
 public:
  // Maps the plugin and calls init() with `transport` and `clock` as its host services (both
  // must outlive the driver). Throws PluginLoadError.
  //
  // Rationale: the host's load_plugin() is exercised once, by the loader_accepts check, and
  // every other check runs only after it passed. Re-running it in each of the ~45 children would
  // re-hash the file (SHA-256 of a multi-MB library) every time, most of a child's cost; this
  // performs the same steps that matter to the plugin: dlopen, the HostBinding, init().
  PluginDriver(const std::filesystem::path& path, http::Transport& transport, const Clock& clock);
  ~PluginDriver();
  PluginDriver(const PluginDriver&) = delete;
  PluginDriver& operator=(const PluginDriver&) = delete;

  const backhaul_entry_t& entry() const { return *entry_; }

  CallResult validate_config(std::string_view config_json) const;
  // Throws AbiViolation when OK comes without an instance or a failure with one.
  std::optional<InstanceHandle> create(std::string_view config_json, CallResult& result) const;
  // Creates or throws Error("create(config) failed: ...").
  InstanceHandle create_or_throw(std::string_view config_json) const;
  // [thread-safe] as the ABI promises. Throws AbiViolation like create().
  FetchOutcome fetch(backhaul_instance_t* instance, const FetchSpec& spec) const;
  CallResult validate_scopes(backhaul_instance_t* instance, const UnitSpec& unit) const;

  // From now on, keeps the first line the plugin logs (host->log, at any level) that contains
  // `secret`. Call before the plugin is given `secret`. Lines without it cost no allocation.
  void watch_logs_for(std::string secret);
  // That line, or nullopt. [thread-safe]
  std::optional<std::string> logged_secret() const;

 private:
  friend class PageHandle;
  friend class InstanceHandle;
  void release(backhaul_instance_t* instance, backhaul_page_t* page) const;
  void destroy(backhaul_instance_t* instance) const;

  void saw_log(std::string_view line);

  mutable std::mutex log_mutex_;
  std::string secret_;                        // guarded by log_mutex_
  std::optional<std::string> logged_secret_;  // guarded by log_mutex_
  plugins::HostServices services_;
  // Declared before host_ so that it is destroyed after it: the code stays mapped until the host
  // binding the plugin may still reference is gone.
  std::unique_ptr<void, int (*)(void*)> handle_;
  const backhaul_entry_t* entry_ = nullptr;
  std::unique_ptr<plugins::HostBinding> host_;
};

// Bytes the allocator has handed out and not taken back (glibc mallinfo2, or the ASan allocator's
// count in sanitizer builds, where malloc is ASan's).
int64_t heap_in_use();

}  // namespace backhaul::validate
