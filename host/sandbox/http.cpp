#include "host/sandbox/http.h"

#include <charconv>
#include <chrono>
#include <cstdio>

namespace backhaul::sandbox {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

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

Query Query::parse(std::string_view raw_query) {
  Query query;
  while (!raw_query.empty()) {
    size_t amp = raw_query.find('&');
    std::string_view pair = raw_query.substr(0, amp);
    raw_query = amp == std::string_view::npos ? std::string_view{} : raw_query.substr(amp + 1);
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string_view key = pair.substr(0, eq);
    std::string_view value =
        eq == std::string_view::npos ? std::string_view{} : pair.substr(eq + 1);
    query.params_.push_back(
        {percent_decode(key, true), percent_decode(value, true), std::string(pair)});
  }
  return query;
}

std::optional<std::string> Query::get(std::string_view key) const {
  for (const Param& param : params_) {
    if (param.key == key) return param.value;
  }
  return std::nullopt;
}

std::string Query::raw_without(std::string_view skip_key) const {
  std::string out;
  for (const Param& param : params_) {
    if (param.key == skip_key) continue;
    if (!out.empty()) out += '&';
    out += param.raw;
  }
  return out;
}

const std::string* Request::header(const std::string& lower_case_name) const {
  auto it = headers.find(lower_case_name);
  return it == headers.end() ? nullptr : &it->second;
}

const std::string* Response::find_header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return &value;
  }
  return nullptr;
}

Response json_response(int status, const nlohmann::json& body) {
  Response response;
  response.status = status;
  response.body = body.dump();
  return response;
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> segments;
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  if (path.empty()) return segments;
  while (true) {
    size_t slash = path.find('/');
    segments.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  return segments;
}

std::string percent_decode(std::string_view text, bool plus_is_space) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '%' && i + 2 < text.size()) {
      int hi = hex_value(text[i + 1]);
      int lo = hex_value(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out += static_cast<char>(hi * 16 + lo);
        i += 2;
        continue;
      }
    }
    out += (c == '+' && plus_is_space) ? ' ' : c;
  }
  return out;
}

std::optional<int64_t> parse_int(std::string_view text) {
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

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
