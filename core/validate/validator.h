// `backhaul plugin validate`: checks a connector plugin against the ABI contract (SPEC G1-G5).
// Static checks read the file; every check that runs plugin code runs it in a forked child with
// a deadline and a memory limit, so a misbehaving plugin fails checks instead of the validator.
// The checks, their strictness levels and the fixture layout are documented in
// docs/plugin-validate.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/validate/report.h"

namespace backhaul::validate {

inline constexpr int kMinStrictness = 1;
inline constexpr int kMaxStrictness = 10;

struct ValidateOptions {
  std::filesystem::path plugin_path;
  // Recorded exchanges plus validate.json; without it the conformance checks are skipped.
  std::optional<std::filesystem::path> fixtures_dir;
  // Override validate.json (and the built-in defaults).
  std::optional<std::string> resource_id;
  std::optional<std::string> resource_name;
  std::vector<std::string> entity_types;
  std::optional<std::string> config_json;
  // Checks whose level is above this are skipped. 1..10.
  int strictness = kMaxStrictness;
  // Budget of each child process (one check may use a few).
  std::chrono::milliseconds timeout{5000};
  // Memory limit of each child process; 0 disables it.
  uint64_t memory_limit_bytes = uint64_t{2} << 30;
  // Threads of the concurrency check.
  int threads = 8;
  // Called after each check, in order (the CLI prints lines as they come). [main-thread]
  std::function<void(const CheckResult&)> on_result;
};

// Runs every check. Throws ConfigError for unusable options (strictness out of range, a fixtures
// directory that cannot be read); a bad plugin is never an exception, only failed checks.
// [main-thread], and the process must be single-threaded (checks fork).
Report validate(const ValidateOptions& options);

// Name, group and level of every check, in run order (for docs and `--list`).
struct CheckInfo {
  std::string name;
  std::string group;
  int level = 1;
  std::string description;
};
std::vector<CheckInfo> list_checks();

}  // namespace backhaul::validate
