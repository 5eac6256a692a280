#include "url.h"

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

}  // namespace backhaul::github
