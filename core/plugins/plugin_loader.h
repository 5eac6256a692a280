// Finds, checks and loads connector plugins (Boost.DLL), and keeps them by provider id.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/clock.h"
#include "core/http/http.h"
#include "core/http/http_metrics.h"
#include "core/plugins/isolation.h"
#include "core/plugins/plugin.h"

namespace backhaul::plugins {

// What the host gives every plugin. Both references must outlive every plugin loaded with them.
struct HostServices {
  http::Transport& transport;
  const Clock& clock = SystemClock::instance();
  std::chrono::milliseconds default_http_timeout{30'000};
  // Where each plugin's HTTP exchanges are counted, as "plugin:<id>" (a redirect and its target
  // are two); null: nowhere. Must outlive the plugins too.
  http::HttpMetrics* http_metrics = nullptr;
  // Called with every line a plugin logs (host->log), at any level, before the logging sink
  // redacts it; empty: nothing is. `plugin validate` looks for the access token in them.
  // [thread-safe] as host->log is: a plugin logs from any thread.
  std::function<void(std::string_view)> on_plugin_log = nullptr;
};

// How deeply a plugin's config schema may nest its objects and arrays. One nested hundreds of
// thousands deep parses, then overflows the stack where it is copied or dumped (GET /v1/plugins).
inline constexpr size_t kMaxConfigSchemaDepth = 64;

// Loads one library and checks, before running any of its code: the backhaul_entry symbol, the
// magic block, the ABI version (same major, minor <= ours), the entry's size, then the descriptor
// (id pattern, semantic version, entity types non-empty and unique, defaults a subset, schema is
// a JSON object nested at most kMaxConfigSchemaDepth deep), then `options.before_init`. Then calls
// init(). Throws PluginLoadError whose message names the file and the reason.
//
// The library is mapped from a sealed in-memory copy of the file, made and hashed (SHA-256, in
// PluginInfo::sha256) in one read: a non-empty `options.allowed_sha256` refuses a copy whose hash
// it does not list, and what it checked is what runs; a later write to the file (`cp` over it)
// does not reach the process. The copy lives as long as the library is loaded. Each call loads its
// own instance, bound to its own host services. [main-thread]
struct LoadOptions {
  std::set<std::string> allowed_sha256;  // lower-case hex; empty: every hash loads
  // Sees the checked descriptor before any plugin function runs; throws PluginLoadError to refuse
  // (PluginRegistry: a duplicate id).
  std::function<void(const PluginInfo&)> before_init;
  // Files whose bytes come from these descriptors (sealed copies another process made, for a
  // worker in isolation mode: seal_file) instead of from the files, by the path loaded from.
  std::map<std::filesystem::path, int> sealed_sources;
};
// The descriptor checks of load_plugin() (id pattern, semantic version, every string UTF-8, entity
// types non-empty and unique, defaults a subset, schema a JSON object nested at most
// kMaxConfigSchemaDepth deep) on `info`, its path naming the file. Throws PluginLoadError. For a
// description that comes from elsewhere: a worker process's answer in isolation mode, which the
// plugin (in that process) may have written itself.
void check_plugin_info(const PluginInfo& info);

Plugin load_plugin(const std::filesystem::path& path, const HostServices& services,
                   const LoadOptions& options = {});

// As load_plugin(), every check and init() included, but in a worker process of `isolation`
// (isolation.h) that answers what it loaded and exits: no code of the plugin runs in this process,
// so one that crashes or hangs while loading (in init() or a static constructor) is refused, not
// fatal; past isolation.call_timeout it is killed. `options.before_init` sees the descriptor
// afterwards. Then the files that worker loaded are sealed here (seal_file), refused should one
// have changed meanwhile; the Plugin's instances run in worker processes (create() is
// create_isolated()) that load those copies. Throws PluginLoadError naming the file and the reason.
Plugin load_isolated(const std::filesystem::path& path, const IsolationOptions& isolation,
                     const LoadOptions& options = {});

// The bytes of `path` copied into a sealed in-memory file (memfd), as load_plugin() copies a
// library before it maps it (SealedFile: isolation.h). Throws PluginLoadError.
SealedFile seal_file(const std::filesystem::path& path);

struct LoadProblem {
  std::filesystem::path path;
  std::string reason;
};

// Plugins by provider id. Loading never throws for a bad plugin: it is reported and skipped.
class PluginRegistry {
 public:
  explicit PluginRegistry(HostServices services) : services_(services) {}

  // Optional allow-list: file SHA-256 (lower-case hex) values; a plugin whose hash is not listed is
  // refused. Empty (the default) allows everything.
  void set_allowed_sha256(std::set<std::string> hashes) { allowed_sha256_ = std::move(hashes); }
  // From here on, plugins load in worker processes (load_isolated), not in this process.
  void set_isolation(IsolationOptions isolation) { isolation_ = std::move(isolation); }

  // Loads every *.so in `dir` (sorted by name). Returns the problems (a missing directory is one).
  // In isolation mode up to kParallelIsolatedLoads files load at once, each in a worker process;
  // problems and duplicates come out as a load of one file after the other would have them.
  std::vector<LoadProblem> load_directory(const std::filesystem::path& dir);
  // Loads one file; returns the problem, if any (duplicate ids included).
  std::optional<LoadProblem> load_file(const std::filesystem::path& path);

  std::optional<Plugin> find(std::string_view id) const;
  std::vector<Plugin> plugins() const;  // sorted by id

  static constexpr size_t kParallelIsolatedLoads = 8;

 private:
  LoadOptions load_options(const std::filesystem::path& path) const;
  // Throws PluginLoadError when a plugin of that id is registered already.
  void refuse_duplicate(const std::filesystem::path& path, const PluginInfo& info) const;
  // Registers what `load` returns; what it throws is the problem of `path`.
  std::optional<LoadProblem> add(const std::filesystem::path& path,
                                 const std::function<Plugin()>& load);

  HostServices services_;
  std::set<std::string> allowed_sha256_;
  std::optional<IsolationOptions> isolation_;
  std::map<std::string, Plugin, std::less<>> by_id_;
};

// Descriptor rules, shared with the validator. Each reads its text once, left to right: a
// plugin's string of any length is checked without recursion (std::regex's matcher recursed per
// character and overflowed the stack on a 50 000-character id, ending the process that loaded
// the plugin).
bool is_valid_plugin_id(std::string_view id);  // [a-z][a-z0-9_-]*
bool is_semver(std::string_view version);      // Semantic Versioning 2.0.0

}  // namespace backhaul::plugins
