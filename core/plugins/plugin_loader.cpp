#include "core/plugins/plugin_loader.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>

#include <Poco/DigestStream.h>
#include <Poco/SHA2Engine.h>
#include <boost/dll/shared_library.hpp>
#include <nlohmann/json.hpp>

#include "core/common/json_check.h"
#include "core/common/logging.h"
#include "core/plugins/loaded_library.h"

namespace backhaul::plugins {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void refuse(const fs::path& path, const std::string& reason) {
  throw PluginLoadError(path.string() + ": " + reason);
}

std::string version_string(backhaul_version_t v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor);
}

std::string sha256_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) refuse(path, "cannot be read");
  Poco::SHA2Engine engine(Poco::SHA2Engine::SHA_256);
  char buffer[64 * 1024];
  while (in) {
    in.read(buffer, sizeof buffer);
    engine.update(buffer, static_cast<unsigned>(in.gcount()));
  }
  return Poco::DigestEngine::digestToHex(engine.digest());
}

// The ELF magic, so a stray file gets "not an ELF shared object" instead of a dlerror riddle.
bool looks_like_elf(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == 4 && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' &&
         magic[3] == 'F';
}

// Checks the entry's fixed prefix (size, version, magic) and its function table. Reads nothing
// beyond the size the plugin declared.
void check_entry(const fs::path& path, const backhaul_entry_t& entry) {
  constexpr size_t kPrefix = offsetof(backhaul_entry_t, descriptor);
  if (entry.struct_size < kPrefix) {
    refuse(path, "backhaul_entry is too small (" + std::to_string(entry.struct_size) +
                     " bytes) to hold a version and magic block");
  }
  const backhaul_magic_t& m = entry.magic;
  if (m.magic != BACKHAUL_ABI_MAGIC) refuse(path, "backhaul_entry has a wrong magic number");
  if (m.pointer_size != sizeof(void*) || m.string_size != sizeof(backhaul_string_t) ||
      m.error_size != sizeof(backhaul_error_t) || m.event_size != sizeof(backhaul_event_t)) {
    refuse(path, "backhaul_entry layout does not match this host (pointer " +
                     std::to_string(m.pointer_size) + ", string " + std::to_string(m.string_size) +
                     ", error " + std::to_string(m.error_size) + ", event " +
                     std::to_string(m.event_size) + " bytes)");
  }
  const backhaul_version_t ours = BACKHAUL_ABI_VERSION_INIT;
  const backhaul_version_t theirs = entry.abi_version;
  if (theirs.major != ours.major) {
    refuse(path, "plugin ABI " + version_string(theirs) + " is incompatible with host ABI " +
                     version_string(ours) + " (major versions differ)");
  }
  if (theirs.minor > ours.minor) {
    refuse(path, "plugin ABI " + version_string(theirs) + " is newer than host ABI " +
                     version_string(ours) + "; upgrade the host");
  }
  size_t needed = theirs.minor == 0 ? BACKHAUL_ENTRY_SIZE_V1_0 : sizeof(backhaul_entry_t);
  if (entry.struct_size < needed) {
    refuse(path, "backhaul_entry is " + std::to_string(entry.struct_size) + " bytes, ABI " +
                     version_string(theirs) + " needs " + std::to_string(needed));
  }
  if (!entry.descriptor) refuse(path, "backhaul_entry has no descriptor");
  if (!entry.init || !entry.deinit || !entry.validate_config || !entry.create || !entry.destroy ||
      !entry.validate_scopes || !entry.fetch_page || !entry.release_page) {
    refuse(path, "backhaul_entry lacks a required function");
  }
}

bool is_semver(std::string_view v) {
  static const std::regex re(
      R"(^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$)");
  return std::regex_match(v.begin(), v.end(), re);
}

bool is_valid_id(std::string_view id) {
  static const std::regex re(R"(^[a-z][a-z0-9_-]*$)");
  return std::regex_match(id.begin(), id.end(), re);
}

std::vector<std::string> string_list(const fs::path& path, const char* const* items, size_t count,
                                     const char* what) {
  if (count > 0 && !items) refuse(path, std::string(what) + " list is null");
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) {
    if (!items[i] || !*items[i]) refuse(path, std::string(what) + " has an empty entry");
    out.emplace_back(items[i]);
    if (!is_utf8(out.back())) refuse(path, std::string(what) + " has an entry that is not UTF-8");
  }
  return out;
}

PluginInfo read_descriptor(const fs::path& path, const backhaul_entry_t& entry) {
  const backhaul_descriptor_t& d = *entry.descriptor;
  if (d.struct_size < sizeof(backhaul_descriptor_t)) {
    refuse(path, "descriptor is too small (" + std::to_string(d.struct_size) + " bytes)");
  }
  PluginInfo info;
  auto text = [&](const char* s, const char* field) {
    if (!s) refuse(path, std::string("descriptor.") + field + " is null");
    // Every descriptor string ends up in JSON (the admin API, `plugin info --json`), which
    // cannot hold anything else.
    std::string out(s);
    if (!is_utf8(out)) refuse(path, std::string("descriptor.") + field + " is not valid UTF-8");
    return out;
  };
  info.id = text(d.id, "id");
  if (!is_valid_id(info.id)) {
    refuse(path, "plugin id '" + info.id + "' does not match [a-z][a-z0-9_-]*");
  }
  info.version = text(d.version, "version");
  if (!is_semver(info.version)) {
    refuse(path, "plugin '" + info.id + "' version '" + info.version + "' is not semantic");
  }
  info.display_name = text(d.display_name, "display_name");
  info.description = d.description ? text(d.description, "description") : "";
  info.entity_types = string_list(path, d.entity_types, d.entity_type_count, "entity types");
  if (info.entity_types.empty()) refuse(path, "plugin '" + info.id + "' has no entity types");
  std::set<std::string> unique(info.entity_types.begin(), info.entity_types.end());
  if (unique.size() != info.entity_types.size()) {
    refuse(path, "plugin '" + info.id + "' lists an entity type twice");
  }
  info.default_entity_types = string_list(path, d.default_entity_types, d.default_entity_type_count,
                                          "default entity types");
  for (const auto& t : info.default_entity_types) {
    if (!unique.count(t)) {
      refuse(path, "plugin '" + info.id + "' default entity type '" + t + "' is not supported");
    }
  }
  info.config_schema_json = text(d.config_schema_json, "config_schema_json");
  auto schema = nlohmann::json::parse(info.config_schema_json, nullptr, false);
  if (schema.is_discarded() || !schema.is_object()) {
    refuse(path, "plugin '" + info.id + "' config schema is not a JSON object");
  }
  info.abi_version = entry.abi_version;
  info.path = path;
  return info;
}

// Libraries alive in this process, by entry address. dlopen of a file that is already mapped
// returns the same mapping, and a second init() would replace the first host binding, so a
// second load of the same library returns the Plugin that already exists.
struct LiveLibraries {
  std::mutex mutex;
  std::map<const backhaul_entry_t*, std::weak_ptr<const LoadedLibrary>> by_entry;
};
LiveLibraries& live_libraries() {
  static LiveLibraries live;
  return live;
}

}  // namespace

LoadedLibrary::~LoadedLibrary() {
  if (!initialized_) return;
  try {
    entry_->deinit();
  } catch (...) {
    try {
      logging::get("plugins")->error("plugin '{}' let a C++ exception cross the ABI in deinit",
                                     info_.id);
    } catch (...) {
    }
  }
}

Plugin load_plugin(const fs::path& path, const HostServices& services, bool compute_sha256) {
  std::error_code ec;
  if (!fs::exists(path, ec)) refuse(path, "file does not exist");
  if (!fs::is_regular_file(path, ec)) refuse(path, "is not a regular file");
  std::string sha256 = compute_sha256 ? sha256_of(path) : std::string();
  if (!looks_like_elf(path)) refuse(path, "is not an ELF shared object");

  boost::dll::shared_library library;
  try {
    // RTLD_LOCAL: plugins never see each other's symbols. RTLD_NOW: missing symbols fail here.
    library.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    refuse(path, std::string("cannot be loaded: ") + e.what());
  }
  if (!library.has(BACKHAUL_ENTRY_SYMBOL)) {
    refuse(path, "does not export the entry symbol " BACKHAUL_ENTRY_SYMBOL);
  }
  const auto& entry = library.get<const backhaul_entry_t>(BACKHAUL_ENTRY_SYMBOL);
  LiveLibraries& live = live_libraries();
  std::lock_guard lock(live.mutex);
  if (auto it = live.by_entry.find(&entry); it != live.by_entry.end()) {
    if (auto existing = it->second.lock()) return Plugin(std::move(existing));
  }
  check_entry(path, entry);
  PluginInfo info = read_descriptor(path, entry);
  info.sha256 = std::move(sha256);

  auto host = std::make_unique<HostBinding>(services, info.id);
  const backhaul_host_t* c_host = host->c_host();
  auto loaded =
      std::make_shared<LoadedLibrary>(std::move(library), &entry, std::move(info), std::move(host));
  backhaul_error_t error{};
  int32_t initialized = 0;
  try {
    initialized = entry.init(c_host, &error);
  } catch (const std::exception& e) {
    refuse(path, "plugin '" + loaded->info().id +
                     "' init let a C++ exception cross the ABI: " + e.what());
  } catch (...) {
    refuse(path, "plugin '" + loaded->info().id +
                     "' init let a C++ exception cross the ABI (not a std::exception)");
  }
  if (!initialized) {
    error.message[sizeof(error.message) - 1] = '\0';
    refuse(path, "plugin '" + loaded->info().id + "' init failed: " + error.message);
  }
  loaded->mark_initialized();
  live.by_entry[&entry] = loaded;
  logging::get("plugins")->info("loaded plugin {} {} (abi {}) from {}", loaded->info().id,
                                loaded->info().version, version_string(entry.abi_version),
                                path.string());
  return Plugin(std::move(loaded));
}

std::vector<LoadProblem> PluginRegistry::load_directory(const fs::path& dir) {
  std::vector<LoadProblem> problems;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    problems.push_back({dir, fs::exists(dir, ec) ? "plugin directory is not a directory"
                                                 : "plugin directory does not exist"});
    logging::get("plugins")->warn("{}: {}", dir.string(), problems.back().reason);
    return problems;
  }
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".so") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    if (auto problem = load_file(file)) problems.push_back(std::move(*problem));
  }
  return problems;
}

std::optional<LoadProblem> PluginRegistry::load_file(const fs::path& path) {
  auto log = logging::get("plugins");
  try {
    if (!allowed_sha256_.empty()) {
      std::error_code ec;
      if (!fs::is_regular_file(path, ec)) refuse(path, "file does not exist");
      std::string hash = sha256_of(path);
      if (!allowed_sha256_.count(hash)) {
        refuse(path, "sha256 " + hash + " is not in the plugin allow-list");
      }
    }
    Plugin plugin = load_plugin(path, services_, !allowed_sha256_.empty());
    const std::string& id = plugin.info().id;
    if (auto it = by_id_.find(id); it != by_id_.end()) {
      refuse(path, "duplicate plugin id '" + id + "' (already loaded from " +
                       it->second.info().path.string() + ")");
    }
    by_id_.emplace(id, std::move(plugin));
    return std::nullopt;
  } catch (const std::exception& e) {
    log->error("skipping plugin: {}", e.what());
    std::string reason = e.what();
    std::string prefix = path.string() + ": ";
    if (reason.rfind(prefix, 0) == 0) reason.erase(0, prefix.size());
    return LoadProblem{path, reason};
  }
}

std::optional<Plugin> PluginRegistry::find(std::string_view id) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  return it->second;
}

std::vector<Plugin> PluginRegistry::plugins() const {
  std::vector<Plugin> out;
  for (const auto& [id, plugin] : by_id_) out.push_back(plugin);
  return out;
}

}  // namespace backhaul::plugins
