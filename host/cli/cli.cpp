#include "host/cli/cli.h"

#include <cerrno>
#include <charconv>
#include <cstdio>
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

bool output_written() {
  errno = 0;
  std::cout.flush();  // through stdout, which std::cout is synced with, as printf's lines are
  const bool flushed = std::fflush(stdout) == 0;
  int error = errno;
  if (flushed && std::cout && std::ferror(stdout) == 0) return true;
  // A flush that failed before (std::endl's, a full buffer's) dropped its data and left no errno:
  // one line break, on output already cut short, asks the descriptor for the reason.
  if (error == 0 && ::write(STDOUT_FILENO, "\n", 1) < 0) error = errno;
  std::cerr << "error: writing the output: "
            << (error != 0 ? std::strerror(error) : "an earlier write failed") << "\n";
  return false;
}

namespace {

// CLI11 reads an integer as strtoll(text, 0) does: "010" is 8, "0x10" is 16, and a number too
// large for its type the largest one, so `run cancel 010` cancelled run 8. A number on this
// command line is plain decimal, as the admin API's ids are: digits, no sign, no leading zero.
std::string decimal_problem(const std::string& text) {
  const bool digits = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  if (!digits) return "'" + text + "' is not a number: digits only, with no sign";
  if (text.size() > 1 && text[0] == '0') return "'" + text + "': a number has no leading zero";
  int64_t value = 0;
  if (std::from_chars(text.data(), text.data() + text.size(), value).ec != std::errc())
    return "'" + text + "' is too large";
  return "";
}

// Every integer option and argument of `app` and its subcommands (CLI11's type names "INT" and
// "UINT", before any validator's ":..." part) is checked by decimal_problem.
void numbers_are_decimal(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    const std::string base = type.substr(0, type.find(':'));
    if (base == "INT" || base == "UINT")
      option->check(CLI::Validator(decimal_problem, "", "decimal"));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    numbers_are_decimal(*sub);
}

}  // namespace

int run(int argc, char** argv) {
  CLI::App app{"backhaul: backfill SaaS history through connector plugins"};
  app.set_version_flag("--version", BACKHAUL_VERSION);
  app.require_subcommand(1);
  std::string log_level = "warn";
  bool json_logs = false;
  app.add_option("--log-level", log_level,
                 "log level: trace, debug, info, warn, error, critical, off")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  app.add_flag("--json-logs", json_logs, "write logs as JSON lines");
  add_fetch_command(app);
  add_plugin_command(app);
  add_run_command(app);
  add_dlq_command(app);
  add_db_command(app);
  numbers_are_decimal(app);
  app.parse_complete_callback([&] {
    logging::configure(json_logs ? logging::Format::kJson : logging::Format::kText, log_level);
  });
  try {
    app.parse(argc, argv);
  } catch (const CLI::Error& e) {
    const int status = app.exit(e);  // --help and --version print, and exit 0
    // A command's own failure (a --json envelope printed, a wait that lost contact) keeps its
    // status, and still says when its output could not be written; usage errors (100 and up)
    // printed nothing there.
    if (status == 0) return output_written() ? 0 : 1;
    if (status < 100) output_written();
    return status;
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    output_written();
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    output_written();
    return 1;
  }
  return output_written() ? 0 : 1;
}

}  // namespace backhaul::cli
