#include "url.h"

#include <algorithm>
#include <cctype>
#include <vector>

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

std::optional<std::string> half_page(std::string_view url, int64_t min_per_page) {
  const size_t question = url.find('?');
  if (question == std::string_view::npos || url.find('#') != std::string_view::npos) {
    return std::nullopt;
  }
  std::vector<std::string_view> params;
  for (std::string_view rest = url.substr(question + 1); !rest.empty();) {
    const size_t amp = rest.find('&');
    params.push_back(rest.substr(0, amp));
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
  }
  std::optional<int64_t> per_page;
  int64_t page = 1;
  int seen_per_page = 0;
  int seen_page = 0;
  for (const std::string_view param : params) {
    const size_t eq = param.find('=');
    const std::string_view key = param.substr(0, eq);
    const std::string_view value =
        eq == std::string_view::npos ? std::string_view{} : param.substr(eq + 1);
    if (key == "per_page") {
      ++seen_per_page;
      per_page = positive_number(value, 100);
      if (!per_page) return std::nullopt;
    } else if (key == "page") {
      ++seen_page;
      const std::optional<int64_t> n = positive_number(value, 1'000'000'000);
      if (!n) return std::nullopt;
      page = *n;
    } else if (key == "after" || key == "before" || key == "cursor") {
      return std::nullopt;
    }
  }
  if (!per_page || seen_per_page != 1 || seen_page > 1) return std::nullopt;
  const int64_t half = *per_page / 2;
  if (half < std::max<int64_t>(min_per_page, 1)) return std::nullopt;
  const int64_t new_page = (page - 1) * *per_page / half + 1;

  std::string out(url.substr(0, question + 1));
  bool first = true;
  auto add = [&](std::string_view param) {
    if (!first) out += '&';
    out += param;
    first = false;
  };
  for (const std::string_view param : params) {
    const std::string_view key = param.substr(0, param.find('='));
    if (key == "per_page") {
      add("per_page=" + std::to_string(half));
    } else if (key == "page") {
      add("page=" + std::to_string(new_page));
    } else {
      add(param);
    }
  }
  return out;
}

}  // namespace backhaul::github
