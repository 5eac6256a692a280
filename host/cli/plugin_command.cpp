// `backhaul plugin info`: load a plugin through the real loader and print what it declares.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/common/utf8.h"
#include "core/common/watchdog.h"
#include "core/http/replay_transport.h"
#include "core/plugins/plugin_loader.h"
#include "core/validate/report.h"
#include "host/cli/cli.h"
#include "host/cli/crash_report.h"

namespace backhaul::cli {
namespace {

struct InfoOptions {
  std::string plugin;
  std::vector<std::string> plugin_dirs;
  bool json = false;
  int timeout_ms = 10'000;
};

void print_info(const plugins::PluginInfo& info, bool json) {
  std::string abi =
      std::to_string(info.abi_version.major) + "." + std::to_string(info.abi_version.minor);
  if (json) {
    nlohmann::json j = {{"id", info.id},
                        {"version", info.version},
                        {"displayName", info.display_name},
                        {"description", info.description},
                        {"abiVersion", abi},
                        {"entityTypes", info.entity_types},
                        {"defaultEntityTypes", info.default_entity_types},
                        {"configSchema", nlohmann::json::parse(info.config_schema_json)},
                        {"path", info.path.string()},
                        {"sha256", info.sha256},
                        {"bundledLibraries", nlohmann::json::array()}};
    for (const plugins::BundledLibrary& library : info.bundled_libraries) {
      j["bundledLibraries"].push_back(
          {{"path", library.path.string()}, {"sha256", library.sha256}});
    }
    // A path need not be UTF-8 (a file name is bytes): replaced there, not an error of dump().
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  // The plugin's own text, which may hold anything: escaped, so that it cannot move the cursor,
  // clear a line or forge one ("\r" + "id: github", a newline and "sha256: ...").
  const auto shown = [](std::string_view text) { return escape_controls(text); };
  auto join = [&](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ", ") + shown(s);
    return out;
  };
  std::cout << "id:                   " << shown(info.id) << "\n"
            << "version:              " << shown(info.version) << "\n"
            << "name:                 " << shown(info.display_name) << "\n"
            << "description:          " << shown(info.description) << "\n"
            << "abi:                  " << abi << "\n"
            << "entity types:         " << join(info.entity_types) << "\n"
            << "default entity types: " << join(info.default_entity_types) << "\n"
            << "path:                 " << shown(info.path.string()) << "\n"
            << "sha256:               " << info.sha256 << "\n";
  for (const plugins::BundledLibrary& library : info.bundled_libraries) {
    std::cout << "bundled library:      " << shown(library.path.string()) << " (sha256 "
              << library.sha256 << ")\n";
  }
  // The schema as indented JSON, every non-ASCII character as \uXXXX: readable, and nothing in it
  // reaches the terminal raw.
  std::cout << "config schema:\n";
  const nlohmann::json schema = nlohmann::json::parse(info.config_schema_json, nullptr, false);
  std::istringstream lines(schema.is_discarded() ? info.config_schema_json
                                                 : schema.dump(2, ' ', true));
  for (std::string line; std::getline(lines, line);) std::cout << "  " << shown(line) << "\n";
}

void run_info(const InfoOptions& o) {
  // A plugin's init() or deinit() that never returns would hold the command forever.
  Watchdog watchdog(std::chrono::milliseconds(o.timeout_ms), [&] {
    std::cout.flush();
    std::cerr << "plugin info: " << o.plugin << " was not loaded and unloaded within "
              << o.timeout_ms << " ms (a plugin init() or deinit() that does not return?)"
              << std::endl;
    std::_Exit(1);
  });
  // Loading runs no network code, so a transport that answers nothing is enough.
  http::ReplayTransport offline;
  const std::filesystem::path path = resolve_plugin(o.plugin, o.plugin_dirs);
  CrashReport crash(
      "plugin info", path,
      "plugin info: " + path.string() + ": the plugin crashed while loading or unloading");
  plugins::Plugin plugin = plugins::load_plugin(path, {offline});
  print_info(plugin.info(), o.json);
  std::cout.flush();
}  // the plugin is unloaded here, before the crash report and the watchdog go

}  // namespace

void add_plugin_command(CLI::App& app) {
  CLI::App* plugin = app.add_subcommand("plugin", "Inspect connector plugins");
  plugin->require_subcommand(1);
  auto o = std::make_shared<InfoOptions>();
  CLI::App* info = plugin->add_subcommand(
      "info", "Load a plugin, check its ABI and metadata, and print its descriptor");
  info->add_option("plugin", o->plugin, "plugin file (.so) or plugin id")->required();
  info->add_option("--plugin-dir", o->plugin_dirs, "directory to search for a plugin id");
  info->add_flag("--json", o->json, "print as JSON");
  info->add_option("--timeout-ms", o->timeout_ms,
                   "time limit of loading and unloading the plugin (its init and deinit)")
      ->check(CLI::Range(1, 3'600'000));
  info->callback([o] { run_info(*o); });
  add_validate_command(*plugin);
}

}  // namespace backhaul::cli
