#include "host/cli/cli.h"

#include <cerrno>
#include <cstring>
#include <iostream>

#include <CLI/CLI.hpp>

#include "core/common/errors.h"
#include "core/common/logging.h"
#include <unistd.h>

namespace backhaul::cli {
namespace fs = std::filesystem;

fs::path resolve_plugin(const std::string& spec, const std::vector<std::string>& dirs) {
  std::error_code ec;
  if (spec.find('/') != std::string::npos || fs::path(spec).extension() == ".so") {
    // A file that is not there is a mistake in the command, as an id found nowhere is; one that
    // cannot be looked at (a directory without search permission) is not said to be missing.
    if (!fs::exists(spec, ec)) {
      throw ConfigError("plugin file '" + spec + "' " +
                        (ec ? "cannot be looked at: " + ec.message() : "does not exist"));
    }
    return spec;
  }
  // A --plugin-dir given must be readable: else the id would be found beside the executable
  // instead, a plugin other than the one asked for, without a word.
  // (Searched by name, so it needs search permission only.)
  for (const auto& d : dirs) {
    const fs::file_status status = fs::status(d, ec);
    if (ec || !fs::exists(status)) {
      throw ConfigError("--plugin-dir " + d + ": " +
                        (ec ? ec.message() : std::string("does not exist")));
    }
    if (!fs::is_directory(status)) throw ConfigError("--plugin-dir " + d + ": is not a directory");
    if (::access(d.c_str(), X_OK) != 0) {
      throw ConfigError("--plugin-dir " + d + ": " + std::strerror(errno));
    }
  }
  std::vector<fs::path> candidates;
  for (const auto& d : dirs) candidates.push_back(fs::path(d) / (spec + ".so"));
  // Beside the executable: an installation (bin/ and lib/backhaul/plugins/ of one prefix, wherever
  // a package or an archive put it), then a build directory (bin/ and plugins/).
  if (fs::path self = fs::read_symlink("/proc/self/exe", ec); !ec) {
    const fs::path prefix = self.parent_path().parent_path();
    candidates.push_back(prefix / BACKHAUL_INSTALL_PLUGINDIR / (spec + ".so"));
    candidates.push_back(prefix / "plugins" / (spec + ".so"));
  }
  for (const auto& c : candidates) {
    if (fs::exists(c, ec)) return c;
  }
  std::string searched;
  for (const auto& c : candidates) searched += "\n  " + c.string();
  throw ConfigError("plugin '" + spec + "' not found; searched:" + searched);
}

int run(int argc, char** argv) {
  CLI::App app{"backhaul: backfill SaaS history through connector plugins"};
  app.set_version_flag("--version", BACKHAUL_VERSION);
  app.require_subcommand(1);
  std::string log_level = "warn";
  bool json_logs = false;
  app.add_option("--log-level", log_level, "log level: trace, debug, info, warn, error, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.add_flag("--json-logs", json_logs, "write logs as JSON lines");
  add_fetch_command(app);
  add_plugin_command(app);
  add_run_command(app);
  add_dlq_command(app);
  add_db_command(app);
  app.parse_complete_callback([&] {
    logging::configure(json_logs ? logging::Format::kJson : logging::Format::kText, log_level);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::Error& e) {
    return app.exit(e);
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace backhaul::cli
