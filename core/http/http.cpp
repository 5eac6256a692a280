#include "core/http/http.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <initializer_list>

#include "core/common/redact.h"

namespace backhaul::http {
namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return lower(x) == lower(y); });
}

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A URI reference split into its RFC 3986 components. Absent components are nullopt; a present
// but empty one ("http://h/?" has an empty query) is an empty view.
struct Reference {
  std::optional<std::string_view> scheme;
  std::optional<std::string_view> authority;
  std::string_view path;
  std::optional<std::string_view> query;
  std::optional<std::string_view> fragment;
};

// RFC 3986 appendix B, without the regex.
Reference split(std::string_view s) {
  Reference r;
  // scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) ":"
  if (!s.empty() && is_alpha(s[0])) {
    size_t i = 1;
    while (i < s.size() &&
           (is_alpha(s[i]) || is_digit(s[i]) || s[i] == '+' || s[i] == '-' || s[i] == '.')) {
      ++i;
    }
    if (i < s.size() && s[i] == ':') {
      r.scheme = s.substr(0, i);
      s.remove_prefix(i + 1);
    }
  }
  if (s.substr(0, 2) == "//") {
    s.remove_prefix(2);
    const size_t end = std::min(s.find_first_of("/?#"), s.size());
    r.authority = s.substr(0, end);
    s.remove_prefix(end);
  }
  if (const size_t hash = s.find('#'); hash != std::string_view::npos) {
    r.fragment = s.substr(hash + 1);
    s = s.substr(0, hash);
  }
  if (const size_t question = s.find('?'); question != std::string_view::npos) {
    r.query = s.substr(question + 1);
    s = s.substr(0, question);
  }
  r.path = s;
  return r;
}

// RFC 3986 section 5.2.4.
std::string remove_dot_segments(std::string_view path) {
  std::string input(path);
  std::string output;
  const auto pop_segment = [&output] {
    const size_t slash = output.rfind('/');
    output.erase(slash == std::string::npos ? 0 : slash);
  };
  size_t i = 0;
  while (i < input.size()) {
    const std::string_view in = std::string_view(input).substr(i);
    if (in.substr(0, 3) == "../") {
      i += 3;
    } else if (in.substr(0, 2) == "./") {
      i += 2;
    } else if (in.substr(0, 3) == "/./") {
      i += 2;  // leaves "/…"
    } else if (in == "/.") {
      input.replace(i, 2, "/");
    } else if (in.substr(0, 4) == "/../") {
      i += 3;  // leaves "/…"
      pop_segment();
    } else if (in == "/..") {
      input.replace(i, 3, "/");
      pop_segment();
    } else if (in == "." || in == "..") {
      i = input.size();
    } else {
      const size_t end = std::min(in.find('/', 1), in.size());
      output.append(in.substr(0, end));
      i += end;
    }
  }
  return output;
}

std::string compose(std::string_view scheme, std::optional<std::string_view> authority,
                    std::string_view path, std::optional<std::string_view> query,
                    std::optional<std::string_view> fragment) {
  std::string out;
  out.reserve(scheme.size() + path.size() + 64);
  if (!scheme.empty()) out.append(scheme).append(":");
  if (authority) out.append("//").append(*authority);
  out.append(path);
  if (query) out.append("?").append(*query);
  if (fragment) out.append("#").append(*fragment);
  return out;
}

// "scheme://host:port" in lower case with the port made explicit, or "" when `url` has no
// authority. Two URLs with the same origin may share credentials.
std::string origin_of(std::string_view url) {
  const Reference r = split(url);
  if (!r.scheme || !r.authority) return {};
  std::string_view host_port = *r.authority;
  if (const size_t at = host_port.rfind('@'); at != std::string_view::npos) {
    host_port.remove_prefix(at + 1);
  }
  const std::string scheme = to_lower(*r.scheme);
  std::string host = to_lower(host_port);
  // The port follows the last ':' unless that ':' is inside an IPv6 literal "[…]".
  const size_t colon = host.rfind(':');
  const size_t bracket = host.rfind(']');
  const bool has_port =
      colon != std::string::npos && (bracket == std::string::npos || colon > bracket);
  if (!has_port || colon + 1 == host.size()) {
    if (has_port) host.pop_back();  // "host:" means the default port
    if (scheme == "http") host += ":80";
    if (scheme == "https") host += ":443";
  }
  return scheme + "://" + host;
}

bool is_redirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

// 303, and 301/302 for anything but GET, continue as GET (RFC 9110 15.4 allows it, browsers and
// curl do it for POST). HEAD stays HEAD: it asks for no body and gets none either way.
bool becomes_get(int status, std::string_view method) {
  if (iequals(method, "GET") || iequals(method, "HEAD")) return false;
  return status == 303 || status == 301 || status == 302;
}

void erase_headers(Headers& headers, std::initializer_list<std::string_view> names) {
  std::erase_if(headers, [&](const auto& header) {
    return std::any_of(names.begin(), names.end(),
                       [&](std::string_view name) { return iequals(header.first, name); });
  });
}

// What a request may carry to another origin. A plugin names its own credential headers
// (PRIVATE-TOKEN, X-Auth-Token, ...), so rather than list the credentials, this lists the headers
// known to be none: the rest stays with the origin it was given for.
void keep_only_plain_headers(Headers& headers) {
  static constexpr std::string_view kPlain[] = {
      "accept",       "accept-encoding", "accept-language",   "cache-control",
      "content-type", "content-length",  "content-encoding",  "content-language",
      "if-match",     "if-none-match",   "if-modified-since", "if-unmodified-since",
      "pragma",       "range",           "user-agent"};
  std::erase_if(headers, [](const auto& header) {
    return std::none_of(std::begin(kPlain), std::end(kPlain),
                        [&](std::string_view name) { return iequals(header.first, name); });
  });
}

}  // namespace

std::optional<std::string_view> Response::header(std::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (iequals(key, name)) return std::string_view(value);
  }
  return std::nullopt;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = lower(c);
  return out;
}

// RFC 3986 section 5.2.2 ("strict": a reference with a scheme is taken as absolute).
std::string resolve_url(std::string_view base, std::string_view location) {
  const Reference ref = split(location);
  if (ref.scheme) {
    return compose(*ref.scheme, ref.authority, remove_dot_segments(ref.path), ref.query,
                   ref.fragment);
  }
  const Reference b = split(base);
  const std::string_view scheme = b.scheme.value_or("");
  if (ref.authority) {
    return compose(scheme, ref.authority, remove_dot_segments(ref.path), ref.query, ref.fragment);
  }
  if (ref.path.empty()) {
    return compose(scheme, b.authority, b.path, ref.query ? ref.query : b.query, ref.fragment);
  }
  if (ref.path.front() == '/') {
    return compose(scheme, b.authority, remove_dot_segments(ref.path), ref.query, ref.fragment);
  }
  // Relative path: replace the base path's last segment ("merge", 5.2.3).
  std::string merged;
  if (b.authority && b.path.empty()) {
    merged = "/";
  } else if (const size_t slash = b.path.rfind('/'); slash != std::string_view::npos) {
    merged = b.path.substr(0, slash + 1);
  }
  merged.append(ref.path);
  return compose(scheme, b.authority, remove_dot_segments(merged), ref.query, ref.fragment);
}

std::vector<BatchResult> Transport::perform_batch(const std::vector<Request>& requests) {
  std::vector<BatchResult> results(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    try {
      results[i].response = perform(requests[i]);
    } catch (const Error& e) {
      results[i].error = e.what();
    }
  }
  return results;
}

Response send(Transport& transport, Request request, int max_redirects) {
  // Credentials belong to the origin they were given for. Comparing the whole origin (scheme, host
  // and port) rather than the host alone also keeps a token off an https -> http downgrade and off
  // another service on the same machine, as curl does since CVE-2022-27776.
  const std::string original_origin = origin_of(request.url);
  // The timeout is the whole call's, redirects included: each hop gets what is left of it.
  const std::chrono::milliseconds timeout = request.timeout;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int followed = 0;; ++followed) {
    if (followed > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= std::chrono::milliseconds(0)) {
        throw TransportError(
            request.method + " " + redact(request.url) + ": timeout: " + std::to_string(followed) +
            " redirects took the whole " + std::to_string(timeout.count()) + " ms");
      }
      request.timeout = left;
    }
    Response response = transport.perform(request);
    if (!is_redirect(response.status) || followed >= max_redirects) return response;
    const std::optional<std::string_view> location = response.header("location");
    if (!location || location->empty()) return response;

    std::string next = resolve_url(request.url, *location);
    if (becomes_get(response.status, request.method)) {
      request.method = "GET";
      request.body.reset();
      erase_headers(request.headers, {"content-type", "content-length", "content-encoding",
                                      "content-language", "content-location", "transfer-encoding"});
    }
    if (origin_of(next) != original_origin) keep_only_plain_headers(request.headers);
    request.url = std::move(next);
  }
}

}  // namespace backhaul::http
