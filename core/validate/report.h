// The outcome of `backhaul plugin validate`: one result per check, as text lines or as the JSON
// document described by schemas/validate-report.schema.json.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace backhaul::validate {

enum class CheckStatus { kPass = 1, kFail, kSkip };

// "PASS", "FAIL", "SKIP".
std::string_view status_name(CheckStatus status);

struct CheckResult {
  std::string name;   // snake_case, stable: tests and CI scripts match on it
  std::string group;  // "static", "lifecycle", "conformance", "faults"
  int level = 1;      // strictness level (1..10) from which the check runs
  CheckStatus status = CheckStatus::kPass;
  // FAIL: why. SKIP: why not run ("strictness 3 < level 5", "no fixtures"). PASS: a short note
  // of what was seen (may be empty).
  std::string reason;
  std::chrono::milliseconds duration{0};
};

struct PluginSummary {
  std::string path;
  std::optional<std::string> id;  // known once the descriptor could be read
  std::optional<std::string> version;
  std::optional<std::string> abi_version;  // "1.1"
};

struct Report {
  PluginSummary plugin;
  int strictness = 10;
  std::chrono::milliseconds timeout{0};
  std::optional<std::string> fixtures_dir;
  std::vector<CheckResult> checks;
  std::chrono::milliseconds duration{0};

  size_t count(CheckStatus status) const;
  // True when no check failed (skipped checks do not fail a run).
  bool passed() const { return count(CheckStatus::kFail) == 0; }
};

// "PASS  static       abi_version                     plugin ABI 1.1, host ABI 1.1"
std::string format_line(const CheckResult& result);
// "validate github 1.0.0: 40 passed, 0 failed, 2 skipped (strictness 10) in 1234 ms: PASS"
std::string format_summary(const Report& report);
// The whole report as a JSON document (pretty-printed, trailing newline).
std::string to_json(const Report& report);

}  // namespace backhaul::validate
