#include "host/sandbox/http.h"

#include <chrono>
#include <cstdio>

namespace backhaul::sandbox {
namespace {

// Reads exactly `width` digits at `*pos`.
bool read_digits(std::string_view text, size_t* pos, size_t width, int* out) {
  if (*pos + width > text.size()) return false;
  int value = 0;
  for (size_t i = 0; i < width; ++i) {
    char c = text[*pos + i];
    if (c < '0' || c > '9') return false;
    value = value * 10 + (c - '0');
  }
  *pos += width;
  *out = value;
  return true;
}

bool expect(std::string_view text, size_t* pos, char c) {
  if (*pos >= text.size() || text[*pos] != c) return false;
  ++*pos;
  return true;
}

int64_t to_epoch_ms(int year, int month, int day, int hour, int minute, int second) {
  using namespace std::chrono;
  const sys_days date = year_month_day{std::chrono::year{year}, std::chrono::month{unsigned(month)},
                                       std::chrono::day{unsigned(day)}};
  const auto seconds_of_day = hours{hour} + minutes{minute} + std::chrono::seconds{second};
  return duration_cast<milliseconds>(date.time_since_epoch() + seconds_of_day).count();
}

// Parses "Z", "+hh:mm", "-hh:mm" or "+hhmm" into an offset east of UTC in minutes.
bool parse_zone(std::string_view text, size_t* pos, int* offset_minutes) {
  if (*pos >= text.size()) return false;
  char sign = text[*pos];
  if (sign == 'Z' || sign == 'z') {
    ++*pos;
    *offset_minutes = 0;
    return true;
  }
  if (sign != '+' && sign != '-') return false;
  ++*pos;
  int hours = 0;
  int minutes = 0;
  if (!read_digits(text, pos, 2, &hours)) return false;
  if (*pos < text.size() && text[*pos] == ':') ++*pos;
  if (!read_digits(text, pos, 2, &minutes)) return false;
  *offset_minutes = (sign == '+' ? 1 : -1) * (hours * 60 + minutes);
  return true;
}

}  // namespace

std::string format_iso8601(int64_t epoch_ms) {
  using namespace std::chrono;
  const sys_seconds instant{floor<seconds>(milliseconds{epoch_ms})};
  const sys_days day = floor<days>(instant);
  const year_month_day date{day};
  const hh_mm_ss time{instant - day};
  char buffer[64];  // room for any int year, so the compiler can prove no truncation
  std::snprintf(buffer, sizeof buffer, "%04d-%02u-%02uT%02ld:%02ld:%02lldZ", int(date.year()),
                unsigned(date.month()), unsigned(date.day()), long(time.hours().count()),
                long(time.minutes().count()), static_cast<long long>(time.seconds().count()));
  return buffer;
}

std::optional<int64_t> parse_iso8601(std::string_view text) {
  size_t pos = 0;
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (!read_digits(text, &pos, 4, &year) || !expect(text, &pos, '-') ||
      !read_digits(text, &pos, 2, &month) || !expect(text, &pos, '-') ||
      !read_digits(text, &pos, 2, &day)) {
    return std::nullopt;
  }
  if (month < 1 || month > 12 || day < 1 || day > 31) return std::nullopt;
  if (pos == text.size()) return to_epoch_ms(year, month, day, 0, 0, 0);
  if (!expect(text, &pos, 'T') && !expect(text, &pos, 't') && !expect(text, &pos, ' ')) {
    return std::nullopt;
  }
  if (!read_digits(text, &pos, 2, &hour) || !expect(text, &pos, ':') ||
      !read_digits(text, &pos, 2, &minute) || !expect(text, &pos, ':') ||
      !read_digits(text, &pos, 2, &second)) {
    return std::nullopt;
  }
  if (hour > 23 || minute > 59 || second > 60) return std::nullopt;
  int millis = 0;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int scale = 100;
    size_t digits = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      millis += (text[pos] - '0') * scale;
      scale /= 10;
      ++pos;
      ++digits;
    }
    if (digits == 0) return std::nullopt;
  }
  int offset_minutes = 0;
  if (!parse_zone(text, &pos, &offset_minutes) || pos != text.size()) return std::nullopt;
  return to_epoch_ms(year, month, day, hour, minute, second) + millis -
         int64_t{offset_minutes} * 60'000;
}

}  // namespace backhaul::sandbox
