// Header-only C++17: an HTTP Date header's time, for measuring a provider's rate-limit resets and
// retry-after dates on the provider's clock rather than on a host clock that may be minutes off.
#ifndef BACKHAUL_HTTP_DATE_HPP
#define BACKHAUL_HTTP_DATE_HPP

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace backhaul::sdk {

// Days since 1970-01-01 of a proleptic Gregorian date (month 1-12, day 1-31; Howard Hinnant's
// days_from_civil), with no dependency on the C library's time zone state (timegm is not
// standard, mktime is local time). For connectors that read other timestamp forms too.
constexpr int64_t days_from_civil(int64_t y, int64_t m, int64_t d) noexcept {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146'097 + doe - 719'468;
}

namespace detail {

// The value of `width` digits at text[pos], or -1.
constexpr int64_t fixed_digits(std::string_view text, std::size_t pos, std::size_t width) noexcept {
  int64_t value = 0;
  for (std::size_t i = pos; i < pos + width; ++i) {
    if (text[i] < '0' || text[i] > '9') return -1;
    value = value * 10 + (text[i] - '0');
  }
  return value;
}

}  // namespace detail

// Milliseconds since the Unix epoch of an HTTP date in the IMF-fixdate form of RFC 9110 5.6.7,
// "Sun, 06 Nov 1994 08:49:37 GMT" (what providers send in Date and an HTTP-date Retry-After), and
// nothing else: case as shown, single spaces, a day name that is the date's, "GMT". The obsolete
// RFC 850 and asctime forms are nullopt, as is surrounding whitespace.
inline std::optional<int64_t> parse_imf_fixdate(std::string_view text) noexcept {
  // Day names in the order of (days since 1970-01-01) mod 7: that day was a Thursday.
  constexpr std::string_view kDayNames[] = {"Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"};
  constexpr std::string_view kMonthNames[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                              "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  constexpr int64_t kDaysInMonth[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  // Every field has a fixed width and place.
  if (text.size() != 29 || text.substr(3, 2) != ", " || text[7] != ' ' || text[11] != ' ' ||
      text[16] != ' ' || text[19] != ':' || text[22] != ':' || text.substr(25) != " GMT") {
    return std::nullopt;
  }
  int64_t weekday = -1, month = -1;
  for (int64_t i = 0; i < 7; ++i) {
    if (kDayNames[i] == text.substr(0, 3)) weekday = i;
  }
  for (int64_t i = 0; i < 12; ++i) {
    if (kMonthNames[i] == text.substr(8, 3)) month = i + 1;
  }
  const int64_t day = detail::fixed_digits(text, 5, 2);
  const int64_t year = detail::fixed_digits(text, 12, 4);
  const int64_t hour = detail::fixed_digits(text, 17, 2);
  const int64_t minute = detail::fixed_digits(text, 20, 2);
  const int64_t second = detail::fixed_digits(text, 23, 2);
  if (weekday < 0 || month < 0 || year < 0 || hour < 0 || minute < 0 || second < 0) {
    return std::nullopt;
  }
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  const int64_t month_days = month == 2 && leap ? 29 : kDaysInMonth[month - 1];
  // 60: a leap second, as RFC 9110 allows.
  if (day < 1 || day > month_days || hour > 23 || minute > 59 || second > 60) return std::nullopt;
  const int64_t days = days_from_civil(year, month, day);
  if (((days % 7) + 7) % 7 != weekday) return std::nullopt;
  return (days * 86'400 + hour * 3600 + minute * 60 + second) * 1000;
}

}  // namespace backhaul::sdk

#endif  // BACKHAUL_HTTP_DATE_HPP
