// `backhaul plugin validate`: run the conformance validator (core/validate) on a plugin and print
// one line per check and a summary, or the JSON report. Exit status: 0 when no check failed, 1
// when one did, 2 when the validator could not run (no such plugin file or id, fixtures it cannot
// read) or its report could not be written; a malformed command line gets CLI11's usage message and
// exit status (105, 106, 109...).
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>

#include "core/common/errors.h"
#include "core/validate/validator.h"
#include "host/cli/cli.h"

namespace backhaul::cli {
namespace {

constexpr int kExitChecksFailed = 1;
constexpr int kExitCannotValidate = 2;

struct ValidateCommandOptions {
  std::string plugin;
  std::vector<std::string> plugin_dirs;
  std::string fixtures;
  std::string resource_id;
  std::string resource_name;
  std::vector<std::string> entities;
  std::string config;
  bool json = false;
  int strictness = validate::kMaxStrictness;
  int timeout_ms = 5000;
  int memory_limit_mb = 2048;
  int threads = 8;
};

std::optional<std::string> non_empty(const std::string& s) {
  return s.empty() ? std::nullopt : std::optional<std::string>(s);
}

validate::ValidateOptions to_validate_options(const ValidateCommandOptions& o) {
  validate::ValidateOptions v;
  v.plugin_path = resolve_plugin(o.plugin, o.plugin_dirs);
  if (!o.fixtures.empty()) v.fixtures_dir = o.fixtures;
  v.resource_id = non_empty(o.resource_id);
  v.resource_name = non_empty(o.resource_name);
  v.entity_types = o.entities;
  v.config_json = non_empty(o.config);
  v.strictness = o.strictness;
  v.timeout = std::chrono::milliseconds(o.timeout_ms);
  v.memory_limit_bytes = static_cast<uint64_t>(o.memory_limit_mb) << 20;
  v.threads = o.threads;
  return v;
}

void run_validate(const ValidateCommandOptions& o) {
  validate::Report report;
  try {
    validate::ValidateOptions options = to_validate_options(o);
    if (!o.json) {
      std::cout << "validating " << options.plugin_path.string() << " (strictness "
                << options.strictness << ", timeout " << o.timeout_ms << " ms"
                << (o.fixtures.empty() ? ", no fixtures" : ", fixtures " + o.fixtures) << ")\n";
      options.on_result = [](const validate::CheckResult& r) {
        std::cout << validate::format_line(r) << std::endl;
      };
    }
    report = validate::validate(options);
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    throw CLI::RuntimeError(kExitCannotValidate);
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the validator could not look at (the plugin's, the fixtures'): names it.
    std::cerr << "error: " << e.what() << "\n";
    throw CLI::RuntimeError(kExitCannotValidate);
  }
  if (o.json) {
    std::cout << validate::to_json(report);
  } else {
    std::cout << "\n" << validate::format_summary(report) << "\n";
  }
  // A report that did not reach its reader (a full disk, a closed pipe) is no verdict a CI can
  // act on: the run could not validate, whatever the checks said.
  if (!output_written()) throw CLI::RuntimeError(kExitCannotValidate);
  if (!report.passed()) throw CLI::RuntimeError(kExitChecksFailed);
}

}  // namespace

void add_validate_command(CLI::App& plugin) {
  auto o = std::make_shared<ValidateCommandOptions>();
  CLI::App* cmd = plugin.add_subcommand(
      "validate",
      "Check a connector plugin against the ABI contract: static checks, conformance over "
      "recorded fixtures, fault injection; plugin code runs in child processes");
  cmd->add_option("plugin", o->plugin, "plugin file (.so) or plugin id")->required();
  cmd->add_option("--plugin-dir", o->plugin_dirs, "directory to search for a plugin id");
  // Not CLI::ExistingDirectory: its refusal exits 105, and a fixtures directory the validator
  // cannot read is an error of the run, exit 2, like an unreadable file in it.
  cmd->add_option("--fixtures", o->fixtures,
                  "directory of recorded exchanges (*.json) plus validate.json");
  cmd->add_option("--resource", o->resource_id, "resource id of the work unit");
  cmd->add_option("--resource-name", o->resource_name, "resource name of the work unit");
  cmd->add_option("--entity", o->entities, "entity type to fetch (repeatable)");
  cmd->add_option("--config", o->config, "connector config as JSON text");
  cmd->add_flag("--json", o->json,
                "print the report as JSON (schemas/validate-report.schema.json)");
  cmd->add_option("--strictness", o->strictness, "run checks up to this level")
      ->check(CLI::Range(validate::kMinStrictness, validate::kMaxStrictness))
      ->capture_default_str();
  cmd->add_option("--timeout-ms", o->timeout_ms, "time limit of each child process")
      ->check(CLI::Range(1, 3'600'000))
      ->capture_default_str();
  cmd->add_option("--memory-limit-mb", o->memory_limit_mb,
                  "memory limit of each child process (0: none)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads of the concurrency checks")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->callback([o] { run_validate(*o); });
}

}  // namespace backhaul::cli
