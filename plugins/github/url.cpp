#include "url.h"

#include <algorithm>
#include <cctype>

namespace backhaul::github {

std::string percent_encode(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0x0F]);
    }
  }
  return out;
}

std::optional<std::string> http_origin(std::string_view url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return std::nullopt;
  std::string origin(url.substr(0, scheme_end));
  for (char& c : origin) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (origin != "http" && origin != "https") return std::nullopt;

  const std::string_view rest = url.substr(scheme_end + 3);
  const std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
  if (authority.empty()) return std::nullopt;
  for (const char c : authority) {
    // Whitespace or control characters never appear in a usable URL.
    if (std::isspace(static_cast<unsigned char>(c)) || std::iscntrl(static_cast<unsigned char>(c)))
      return std::nullopt;
  }
  std::string host;
  host.reserve(authority.size());
  for (const char c : authority) {
    host.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  // The default port is the same origin as no port at all.
  const std::string_view default_port = origin == "https" ? ":443" : ":80";
  if (host.size() > default_port.size() &&
      host.compare(host.size() - default_port.size(), default_port.size(), default_port) == 0) {
    host.resize(host.size() - default_port.size());
  }
  return origin + "://" + host;
}

bool iequals(std::string_view a, std::string_view b) {
  const auto lower = [](char c) {
    return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  };
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string_view url_path(std::string_view url) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return {};
  const std::string_view rest = url.substr(scheme_end + 3);
  const size_t path = rest.find_first_of("/?#");
  if (path == std::string_view::npos || rest[path] != '/') return {};
  const std::string_view tail = rest.substr(path);
  return tail.substr(0, tail.find_first_of("?#"));
}

namespace {

// A query value that is a decimal number from 1 to `max`.
std::optional<int64_t> positive_number(std::string_view value, int64_t max) {
  if (value.empty() || value.size() > 12) return std::nullopt;
  int64_t n = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n < 1 || n > max) return std::nullopt;
  return n;
}

}  // namespace

std::optional<std::string> half_first_page(std::string_view url, int64_t min_per_page) {
  const size_t question = url.find('?');
  if (question == std::string_view::npos || url.find('#') != std::string_view::npos) {
    return std::nullopt;
  }
  std::string out(url.substr(0, question + 1));
  int per_pages = 0;
  for (std::string_view rest = url.substr(question + 1); !rest.empty();) {
    const size_t amp = rest.find('&');
    const std::string_view param = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
    const size_t eq = param.find('=');
    const std::string_view key = param.substr(0, eq);
    const std::string_view value =
        eq == std::string_view::npos ? std::string_view{} : param.substr(eq + 1);
    if (out.back() != '?') out += '&';
    if (key == "per_page") {
      const std::optional<int64_t> n = positive_number(value, 100);
      if (!n || *n / 2 < std::max<int64_t>(min_per_page, 1) || ++per_pages > 1) {
        return std::nullopt;
      }
      out += "per_page=" + std::to_string(*n / 2);
    } else if ((key == "page" && value != "1") || key == "after" || key == "before" ||
               key == "cursor") {
      return std::nullopt;  // not the first page
    } else {
      out += param;
    }
  }
  if (per_pages != 1) return std::nullopt;
  return out;
}

}  // namespace backhaul::github
