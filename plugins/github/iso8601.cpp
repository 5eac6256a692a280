#include "iso8601.h"

#include <cstdio>

#include "backhaul/http_date.hpp"

namespace backhaul::github {
namespace {

constexpr int64_t kMsPerSecond = 1000;
constexpr int64_t kSecondsPerDay = 86'400;

using sdk::days_from_civil;

struct Civil {
  int64_t year;
  int64_t month;
  int64_t day;
};

Civil civil_from_days(int64_t z) {
  z += 719'468;
  const int64_t era = (z >= 0 ? z : z - 146'096) / 146'097;
  const int64_t doe = z - era * 146'097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36'524 - doe / 146'096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t day = doy - (153 * mp + 2) / 5 + 1;
  const int64_t month = mp < 10 ? mp + 3 : mp - 9;
  return {yoe + era * 400 + (month <= 2 ? 1 : 0), month, day};
}

// Reads exactly `width` digits at text[pos]; advances pos.
std::optional<int64_t> digits(std::string_view text, size_t& pos, size_t width) {
  if (pos + width > text.size()) return std::nullopt;
  int64_t value = 0;
  for (size_t i = 0; i < width; ++i) {
    const char c = text[pos + i];
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  pos += width;
  return value;
}

bool expect(std::string_view text, size_t& pos, char c) {
  if (pos >= text.size() || text[pos] != c) return false;
  ++pos;
  return true;
}

bool is_leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

int64_t days_in_month(int64_t y, int64_t m) {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && is_leap(y) ? 29 : kDays[m - 1];
}

// Offset of the zone designator at text[pos] ("Z", "+HH:MM", "-HH:MM") in seconds, which must
// end the text.
std::optional<int64_t> zone_offset_seconds(std::string_view text, size_t pos) {
  if (pos + 1 == text.size() && (text[pos] == 'Z' || text[pos] == 'z')) return 0;
  if (pos >= text.size() || (text[pos] != '+' && text[pos] != '-')) return std::nullopt;
  const int64_t sign = text[pos] == '-' ? -1 : 1;
  ++pos;
  const auto hours = digits(text, pos, 2);
  if (!hours || !expect(text, pos, ':')) return std::nullopt;
  const auto minutes = digits(text, pos, 2);
  if (!minutes || pos != text.size() || *hours > 23 || *minutes > 59) return std::nullopt;
  return sign * (*hours * 3600 + *minutes * 60);
}

}  // namespace

std::string format_iso8601(int64_t unix_ms) {
  int64_t seconds = unix_ms / kMsPerSecond;
  if (unix_ms < 0 && unix_ms % kMsPerSecond != 0) --seconds;  // floor, not truncation
  int64_t days = seconds / kSecondsPerDay;
  int64_t rem = seconds % kSecondsPerDay;
  if (rem < 0) {
    rem += kSecondsPerDay;
    --days;
  }
  const Civil c = civil_from_days(days);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04lld-%02lld-%02lldT%02lld:%02lld:%02lldZ",
                static_cast<long long>(c.year), static_cast<long long>(c.month),
                static_cast<long long>(c.day), static_cast<long long>(rem / 3600),
                static_cast<long long>(rem / 60 % 60), static_cast<long long>(rem % 60));
  return buf;
}

std::optional<int64_t> parse_iso8601(std::string_view text) {
  size_t pos = 0;
  const auto year = digits(text, pos, 4);
  if (!year || !expect(text, pos, '-')) return std::nullopt;
  const auto month = digits(text, pos, 2);
  if (!month || !expect(text, pos, '-')) return std::nullopt;
  const auto day = digits(text, pos, 2);
  if (!day || pos >= text.size() || (text[pos] != 'T' && text[pos] != 't')) return std::nullopt;
  ++pos;
  const auto hour = digits(text, pos, 2);
  if (!hour || !expect(text, pos, ':')) return std::nullopt;
  const auto minute = digits(text, pos, 2);
  if (!minute || !expect(text, pos, ':')) return std::nullopt;
  const auto second = digits(text, pos, 2);
  if (!second) return std::nullopt;
  if (*month < 1 || *month > 12 || *day < 1 || *day > days_in_month(*year, *month) || *hour > 23 ||
      *minute > 59 || *second > 60) {
    return std::nullopt;
  }

  int64_t millis = 0;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int64_t scale = 100;
    const size_t start = pos;
    for (; pos < text.size() && text[pos] >= '0' && text[pos] <= '9'; ++pos) {
      millis += (text[pos] - '0') * scale;
      scale /= 10;
    }
    if (pos == start) return std::nullopt;
  }
  const auto offset = zone_offset_seconds(text, pos);
  if (!offset) return std::nullopt;

  const int64_t seconds = days_from_civil(*year, *month, *day) * kSecondsPerDay + *hour * 3600 +
                          *minute * 60 + *second - *offset;
  return seconds * kMsPerSecond + millis;
}

}  // namespace backhaul::github
