#include "core/validate/report.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/common/utf8.h"

namespace backhaul::validate {
namespace {

std::string padded(std::string_view text, size_t width) {
  std::string out(text);
  if (out.size() < width) out.append(width - out.size(), ' ');
  return out;
}

// ordered_json: members come out in the order the schema lists them, which reads better.
using Json = nlohmann::ordered_json;

Json optional_string(const std::optional<std::string>& value) {
  return value ? Json(*value) : Json(nullptr);
}

}  // namespace

std::string_view status_name(CheckStatus status) {
  switch (status) {
    case CheckStatus::kPass:
      return "PASS";
    case CheckStatus::kFail:
      return "FAIL";
    case CheckStatus::kSkip:
      return "SKIP";
  }
  return "UNKNOWN";
}

size_t Report::count(CheckStatus status) const {
  return static_cast<size_t>(std::count_if(
      checks.begin(), checks.end(), [&](const CheckResult& r) { return r.status == status; }));
}

std::string format_line(const CheckResult& result) {
  std::string line =
      padded(status_name(result.status), 6) + padded(result.group, 13) + padded(result.name, 34);
  line += escape_controls(result.reason);
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line;
}

std::string format_summary(const Report& report) {
  std::string who = report.plugin.id.value_or(report.plugin.path);
  if (report.plugin.version) who += " " + *report.plugin.version;
  return "validate " + who + ": " + std::to_string(report.count(CheckStatus::kPass)) + " passed, " +
         std::to_string(report.count(CheckStatus::kFail)) + " failed, " +
         std::to_string(report.count(CheckStatus::kSkip)) + " skipped (strictness " +
         std::to_string(report.strictness) + ") in " + std::to_string(report.duration.count()) +
         " ms: " + (report.passed() ? "PASS" : "FAIL");
}

std::string to_json(const Report& report) {
  Json checks = Json::array();
  for (const CheckResult& r : report.checks) {
    checks.push_back({{"name", r.name},
                      {"group", r.group},
                      {"level", r.level},
                      {"status", status_name(r.status)},
                      {"reason", r.reason},
                      {"durationMs", r.duration.count()}});
  }
  Json doc = {
      {"schemaVersion", 1},
      {"plugin",
       {{"path", report.plugin.path},
        {"id", optional_string(report.plugin.id)},
        {"version", optional_string(report.plugin.version)},
        {"abiVersion", optional_string(report.plugin.abi_version)}}},
      {"strictness", report.strictness},
      {"timeoutMs", report.timeout.count()},
      {"fixtures", optional_string(report.fixtures_dir)},
      {"checks", std::move(checks)},
      {"summary",
       {{"total", report.checks.size()},
        {"passed", report.count(CheckStatus::kPass)},
        {"failed", report.count(CheckStatus::kFail)},
        {"skipped", report.count(CheckStatus::kSkip)},
        {"durationMs", report.duration.count()}}},
      {"result", report.passed() ? "PASS" : "FAIL"},
  };
  // Plugin text (messages, ids) is untrusted: replace invalid UTF-8 rather than throw.
  return doc.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace backhaul::validate
