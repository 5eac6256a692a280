// The `backhaul` command line: parsing and dispatch to subcommands.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace backhaul::cli {

// Parses argv and runs the chosen subcommand. Returns the process exit status.
int run(int argc, char** argv);

// Subcommand registration; each adds itself to `app` and sets its callback.
void add_fetch_command(CLI::App& app);
void add_plugin_command(CLI::App& app);
// Talk to backhauld's admin API (admin_client.h).
void add_dlq_command(CLI::App& app);
void add_run_command(CLI::App& app);
// Applies store migrations directly.
void add_db_command(CLI::App& app);
// Adds `validate` under the `plugin` subcommand (validate_command.cpp).
void add_validate_command(CLI::App& plugin);

// True when standard output took everything written to it (flushed here). Else says so on stderr
// ("error: writing the output: No space left on device") and returns false: an answer that did
// not reach its reader (a full disk, a closed pipe) is no success, and a script would take the
// missing lines for an empty result.
bool output_written();

// Plugin lookup shared by subcommands: `spec` is a path to a .so, or a plugin id searched in
// `dirs`, then beside the executable: ../lib/backhaul/plugins (installed), ../plugins (a build).
std::filesystem::path resolve_plugin(const std::string& spec, const std::vector<std::string>& dirs);

}  // namespace backhaul::cli
