#include "core/validate/report.h"

#include <algorithm>

#include <nlohmann/json.hpp>

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

std::string escape_controls(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const auto byte = static_cast<unsigned char>(c);
    const auto next = [&](size_t k) {
      return i + k < text.size() ? static_cast<unsigned char>(text[i + k]) : 0;
    };
    // C1 controls (U+0080-U+009F: 0xC2 0x80-0x9F; U+009B is a CSI of its own) and the bidi
    // embeddings, overrides and isolates (U+202A-U+202E: 0xE2 0x80 0xAA-0xAE; U+2066-U+2069:
    // 0xE2 0x81 0xA6-0xA9), which reorder what follows them on the line.
    unsigned code = 0;
    size_t length = 0;
    if (byte == 0xC2 && next(1) >= 0x80 && next(1) <= 0x9F) {
      code = next(1), length = 2;
    } else if (byte == 0xE2 && next(1) == 0x80 &&
               ((next(2) >= 0xAA && next(2) <= 0xAE) || next(2) == 0x8E || next(2) == 0x8F ||
                next(2) == 0xA8 || next(2) == 0xA9)) {
      code = 0x2000 + (next(2) - 0x80), length = 3;  // and the marks LRM, RLM, LS, PS
    } else if (byte == 0xD8 && next(1) == 0x9C) {
      code = 0x061C, length = 2;  // ALM
    } else if (byte == 0xE2 && next(1) == 0x81 && next(2) >= 0xA6 && next(2) <= 0xA9) {
      code = 0x2040 + (next(2) - 0x80), length = 3;
    }
    if (length > 0) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(code >> shift) & 0xf];
      i += length - 1;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out;
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
